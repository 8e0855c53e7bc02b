//! `lasthop-control`'s flags: every subcommand's arguments as clap reads them (and config
//! files under `serve`'s, `lasthop-cli`). What each command does is in `commands/` and, for
//! `serve`, `serve.rs`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use lasthop_clicks::cli::{ClicksCommand, ClicksTuning, Toggle};
use lasthop_control::snapshot::HotSet;

#[derive(Parser)]
#[command(name = "lasthop-control", version, about = "lasthop control plane")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Write a new permutation key file (secret; install it on control-plane and PoP hosts),
    /// or with `--signing` a snapshot signing key (Ed25519, PKCS#8 PEM; secret, control-plane
    /// hosts only), printing its public key for engines' `--snapshot-verify-key`.
    Keygen {
        #[arg(long)]
        out: PathBuf,
        /// Write a snapshot signing key instead of a permutation key.
        #[arg(long)]
        signing: bool,
        /// AES key size: 128 (default, fastest decode at the edge) or 256.
        #[arg(long, default_value_t = 128)]
        bits: usize,
        /// Replace an existing file (every code minted under the old key becomes unreadable).
        #[arg(long)]
        force: bool,
    },
    /// Manage API keys.
    Apikey {
        #[command(subcommand)]
        command: ApikeyCommand,
    },
    /// Serve the API.
    Serve(Box<ServeArgs>),
    /// Edge snapshots.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
    /// The click processor outside `serve`: measuring, recomputing, synthetic streams.
    Clicks {
        #[command(subcommand)]
        command: Box<ClicksCommand>,
    },
    /// Look into the record (the server stopped for the embedded store).
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// Write the whole record as NDJSON (store/src/transfer.rs has the format):
    /// every link and its state, aliases, audit records, reports, owners' flags and
    /// suspensions, lease high-water marks and API key hashes, streamed from one consistent
    /// read. A logical backup, and the way between the embedded store and PostgreSQL.
    Export {
        #[command(flatten)]
        store: StoreArgs,
        /// Write here instead of standard output (fsynced when done).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Read an export into an empty store (refusing one made under another permutation key,
    /// a truncated or malformed file, and a store that holds links already). All or nothing.
    Import {
        #[command(flatten)]
        store: StoreArgs,
        /// Read this file instead of standard input.
        #[arg(long = "in")]
        input: Option<PathBuf>,
    },
    /// Links: moving them in from another shortener.
    Links {
        #[command(subcommand)]
        command: LinksCommand,
    },
    /// Apply the PostgreSQL store's schema migrations (`serve` also runs them at start).
    Migrate {
        /// The PostgreSQL connection string.
        #[arg(long, env = "LASTHOP_STORE")]
        store: String,
    },
    /// Write the man pages, shell completions and `serve`'s example config into DIR
    /// (`scripts/package`).
    #[command(hide = true)]
    Generate { dir: PathBuf },
}

/// The click processor inside `serve`.
#[derive(Args)]
pub(crate) struct ServeClicks {
    /// Run the click processor (spool by default, Kafka with --clicks-kafka).
    #[arg(long, env = "LASTHOP_CLICKS", value_enum, default_value_t = Toggle::On)]
    pub(crate) clicks: Toggle,
    /// Spool directory engines on this host write to (default DATA_DIR/clicks/spool).
    #[arg(long, env = "LASTHOP_CLICKS_SPOOL")]
    pub(crate) clicks_spool: Option<PathBuf>,
    /// Consume clicks from this Kafka cluster instead of the spool.
    #[arg(long, env = "LASTHOP_CLICKS_KAFKA")]
    pub(crate) clicks_kafka: Option<String>,
    #[arg(long, env = "LASTHOP_CLICKS_TOPIC", default_value = "lasthop.clicks")]
    pub(crate) clicks_topic: String,
    #[arg(long, env = "LASTHOP_CLICKS_GROUP", default_value = "lasthop-clicks")]
    pub(crate) clicks_group: String,
    #[command(flatten)]
    pub(crate) tuning: ClicksTuning,
}

/// Where a command finds the store.
#[derive(Args, Clone)]
pub(crate) struct StoreArgs {
    /// The data directory (needed for the embedded store).
    #[arg(long, env = "LASTHOP_DATA_DIR")]
    pub(crate) data_dir: Option<PathBuf>,
    #[arg(long, env = "LASTHOP_KEY_FILE")]
    pub(crate) key_file: PathBuf,
    /// `embedded` (DATA_DIR/links.redb; stop `serve` first) or a PostgreSQL connection string.
    #[arg(long, env = "LASTHOP_STORE", default_value = "embedded")]
    pub(crate) store: String,
    #[arg(long, env = "LASTHOP_REGION", default_value_t = 0)]
    pub(crate) region: u32,
    #[arg(long, env = "LASTHOP_REGIONS", default_value_t = 1)]
    pub(crate) regions: u32,
}

#[derive(Subcommand)]
pub(crate) enum StoreCommand {
    /// Print every table (and its row count) where TEXT appears: an erasure audit, e.g. that a
    /// deleted link's URL is gone. Prints nothing when it is found nowhere.
    FindText {
        #[command(flatten)]
        store: StoreArgs,
        text: String,
    },
}

#[derive(Subcommand)]
pub(crate) enum SnapshotCommand {
    /// Build a snapshot of every link in the store, or with `--hot` the hot set `serve`
    /// publishes (for the embedded store, run while `serve` is stopped: the store file has one
    /// owner at a time; PostgreSQL is read while it serves).
    Build {
        #[command(flatten)]
        store: StoreArgs,
        #[arg(long)]
        out: PathBuf,
        /// Counters above a region's mark that an edge still treats as possibly issued.
        #[arg(long, default_value_t = lasthop_core::region::DEFAULT_RESERVE)]
        reserve: u64,
        /// The hot set within the budget below (popular links from the rollup store: by default
        /// DATA_DIR/clicks/rollups.redb when it exists), instead of every link.
        #[arg(long)]
        hot: bool,
        /// The rollup store the popular links come from (`embedded`,
        /// `clickhouse://HOST:8123/DB` or `clickhouses://HOST:8443/DB`, as `serve
        /// --clicks-store`).
        #[arg(long, env = "LASTHOP_CLICKS_STORE", default_value = "embedded")]
        clicks_store: lasthop_control::clicks::StoreLocation,
        /// The CA file a `clickhouses://` store's certificate must chain to (as `serve
        /// --clicks-store-ca`).
        #[arg(long, env = "LASTHOP_CLICKS_STORE_CA", value_name = "FILE")]
        clicks_store_ca: Option<std::path::PathBuf>,
        #[command(flatten)]
        budget: HotSetArgs,
    },
}

/// What a hot-set snapshot may hold (control-plane/src/snapshot.rs has the ranking).
#[derive(Args, Clone, Copy)]
pub(crate) struct HotSetArgs {
    /// Most links in a snapshot: links created in the last --snapshot-recent-days first, newest
    /// first, then the most clicked over 30 days; engines ask the origin for the rest.
    #[arg(long, env = "LASTHOP_SNAPSHOT_MAX_LINKS", default_value_t = HotSet::default().max_links)]
    pub(crate) snapshot_max_links: u64,
    /// Most bytes of links in a snapshot, each estimated as its layout costs it: key and URL
    /// plus 20 bytes when compact, (key + URL + 10) · 1.4 + 13 when paged.
    #[arg(long, env = "LASTHOP_SNAPSHOT_MAX_BYTES", default_value_t = HotSet::default().max_bytes)]
    pub(crate) snapshot_max_bytes: u64,
    /// The snapshot's layout: memory against an engine's cold-hit memory accesses (`paged` is
    /// faster on the pure request path, not yet on the whole system; see engine/DESIGN.md).
    /// Engines read either.
    #[arg(long, env = "LASTHOP_SNAPSHOT_LAYOUT", value_enum, default_value_t = lasthop_snapshot::Layout::Compact)]
    pub(crate) snapshot_layout: lasthop_snapshot::Layout,
    /// Links created within this many days are in the snapshot (within the budget).
    #[arg(long, env = "LASTHOP_SNAPSHOT_RECENT_DAYS", default_value_t = HotSet::default().recent_days)]
    pub(crate) snapshot_recent_days: u32,
}

impl HotSetArgs {
    pub(crate) fn hot_set(self) -> HotSet {
        HotSet {
            max_links: self.snapshot_max_links,
            max_bytes: self.snapshot_max_bytes,
            recent_days: self.snapshot_recent_days,
            layout: self.snapshot_layout,
        }
    }
}

/// Where `apikey` finds the keys.
#[derive(Args)]
pub(crate) struct KeysAt {
    /// The data directory of an embedded-store control plane (its `api-keys` file).
    #[arg(long, env = "LASTHOP_DATA_DIR", required_unless_present = "store")]
    pub(crate) data_dir: Option<PathBuf>,
    /// `embedded` (the file in --data-dir) or the PostgreSQL connection string the control
    /// planes share (the keys are in the store: every control plane sees a change at once).
    #[arg(long, env = "LASTHOP_STORE")]
    pub(crate) store: Option<String>,
}

#[derive(Subcommand)]
pub(crate) enum ApikeyCommand {
    /// Print a new API key for OWNER on stdout, its public id on stderr (stored hashed; a lost
    /// key is replaced, never recovered).
    Create {
        #[command(flatten)]
        at: KeysAt,
        #[arg(long)]
        owner: String,
        /// May take down and restore any link.
        #[arg(long)]
        admin: bool,
        /// Limit the key to this domain (repeatable; a branded domain, or the default
        /// domain's name): its creates and code routes elsewhere answer 403
        /// `domain_not_allowed`. Without it the key may act on every domain. Not with
        /// `--admin` (admin calls are fleet-wide).
        #[arg(long = "domain", value_name = "DOMAIN")]
        domains: Vec<String>,
        /// Print `{"key", "id", "owner", "admin", "domains"}` on stdout instead.
        #[arg(long)]
        json: bool,
    },
    /// List every key: id, owner, role, created, revoked (never a secret).
    List {
        #[command(flatten)]
        at: KeysAt,
        /// Only this owner's keys.
        #[arg(long)]
        owner: Option<String>,
        /// One JSON object a line.
        #[arg(long)]
        json: bool,
    },
    /// Revoke the key with this public id (works while the server runs: its next request
    /// answers 401 key_revoked).
    Revoke {
        #[command(flatten)]
        at: KeysAt,
        /// The key's public id, `lhk_…`.
        id: String,
    },
}

/// Trust and safety settings of `serve`.
#[derive(Args)]
pub(crate) struct ServeSafety {
    /// A reputation list file (repeatable): one host or URL a line, a hosts file, or a
    /// URLhaus, PhishTank or OpenPhish export (detected per file). Creates of a listed
    /// destination answer 403; a reload's new entries take down the links they match.
    #[arg(
        long = "reputation-list",
        env = "LASTHOP_REPUTATION_LISTS",
        value_delimiter = ','
    )]
    pub(crate) reputation_lists: Vec<PathBuf>,
    /// How often list files are checked for changes, seconds (SIGHUP re-reads them at once).
    #[arg(long, env = "LASTHOP_REPUTATION_POLL_SECS", default_value_t = 5)]
    pub(crate) reputation_poll_secs: u64,
    /// Accept destinations on other shorteners' domains and on our own short domain.
    #[arg(long, env = "LASTHOP_ALLOW_SHORTENER_CHAINS")]
    pub(crate) allow_shortener_chains: bool,
    /// More shortener domains, one a line, beside the shipped list.
    #[arg(long, env = "LASTHOP_SHORTENER_LIST")]
    pub(crate) shortener_list: Option<PathBuf>,
    /// Scan new links after their 201 and re-scan live ones (lists, heuristics, webhook).
    #[arg(long, env = "LASTHOP_SCANNER", value_enum, default_value_t = Toggle::On)]
    pub(crate) scanner: Toggle,
    /// A whole re-scan of every live link takes this long (`86400`, `90s`, `30m`, `24h`, `7d`).
    #[arg(long, env = "LASTHOP_RESCAN_INTERVAL", default_value = "24h", value_parser = parse_duration)]
    pub(crate) rescan_interval: Duration,
    /// Links re-scanned a second, at most.
    #[arg(long, env = "LASTHOP_RESCAN_MAX_RATE", default_value_t = 200.0)]
    pub(crate) rescan_max_rate: f64,
    /// An external verdict service: POST {"url"} → {"verdict": "clean"|"warn"|"block", "reason"}.
    #[arg(long, env = "LASTHOP_SCAN_WEBHOOK")]
    pub(crate) scan_webhook: Option<String>,
    /// Per attempt, milliseconds.
    #[arg(long, env = "LASTHOP_SCAN_WEBHOOK_TIMEOUT_MS", default_value_t = 2000)]
    pub(crate) scan_webhook_timeout_ms: u64,
    /// Attempts after the first failed one.
    #[arg(long, env = "LASTHOP_SCAN_WEBHOOK_RETRIES", default_value_t = 2)]
    pub(crate) scan_webhook_retries: u32,
    /// Webhook calls in flight at once.
    #[arg(long, env = "LASTHOP_SCAN_WEBHOOK_CONCURRENCY", default_value_t = 8)]
    pub(crate) scan_webhook_concurrency: usize,
    /// New links answer the interstitial at every edge until their first scan verdict.
    #[arg(long, env = "LASTHOP_HOLD_UNVERIFIED")]
    pub(crate) hold_unverified: bool,
    /// Refuse destination edits fleet-wide (`PATCH /v1/links/{code}` with `long_url` or `utm`
    /// answers 409 `edits_disabled`); the other settings stay editable.
    #[arg(long, env = "LASTHOP_NO_EDITS")]
    pub(crate) no_edits: bool,
    /// Distinct destination domains an owner may use in a sliding hour before its new links
    /// are created held and it is flagged (0: off).
    #[arg(long, env = "LASTHOP_VELOCITY_DOMAINS_PER_HOUR", default_value_t = 500)]
    pub(crate) velocity_domains_per_hour: usize,
    /// Anonymous reports a second per client network (/24, /48), and the burst.
    #[arg(long, env = "LASTHOP_REPORT_RATE", default_value_t = 0.1)]
    pub(crate) report_rate: f64,
    #[arg(long, env = "LASTHOP_REPORT_BURST", default_value_t = 10.0)]
    pub(crate) report_burst: f64,
    /// Anonymous reports a second from all networks together, and the burst.
    #[arg(long, env = "LASTHOP_REPORT_GLOBAL_RATE", default_value_t = 5.0)]
    pub(crate) report_global_rate: f64,
    #[arg(long, env = "LASTHOP_REPORT_GLOBAL_BURST", default_value_t = 100.0)]
    pub(crate) report_global_burst: f64,
}

/// `86400`, `90s`, `30m`, `24h` or `7d`.
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = number
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (e.g. 90s, 30m, 24h, 7d)"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        "d" => n * 86400.0,
        _ => return Err(format!("{s:?}: the unit must be ms, s, m, h or d")),
    };
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("{s:?} must be positive"));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} is too long"))
}

#[derive(Parser)]
pub(crate) struct ServeArgs {
    /// Directory of the store, the API keys file, the edge token (`edge.token`, written on first
    /// start) and published snapshots (`snapshots/`).
    #[arg(long, env = "LASTHOP_DATA_DIR")]
    pub(crate) data_dir: PathBuf,
    /// Permutation key file.
    #[arg(long, env = "LASTHOP_KEY_FILE")]
    pub(crate) key_file: PathBuf,
    /// Public API listener.
    #[arg(long, env = "LASTHOP_API_LISTEN", default_value = "127.0.0.1:8081")]
    pub(crate) api_listen: SocketAddr,
    /// The web console for link owners and operators (sign in with an API key). Off unless
    /// given; keep it on a private network or behind a TLS proxy (it marks its cookies Secure
    /// when the proxy says `X-Forwarded-Proto: https`).
    #[arg(long, env = "LASTHOP_DASHBOARD_LISTEN")]
    pub(crate) dashboard_listen: Option<SocketAddr>,
    /// Internal edge listener for engines: origin lookups, the feed, snapshot downloads, status
    /// reports. Requires the edge token; keep it off the public network all the same.
    #[arg(long, env = "LASTHOP_EDGE_LISTEN", default_value = "127.0.0.1:8082")]
    pub(crate) edge_listen: SocketAddr,
    /// Serve the edge listener over TLS with this certificate chain (PEM, leaf first); with
    /// `--edge-tls-key`. Without them it is plain HTTP, for loopback development.
    #[arg(long, env = "LASTHOP_EDGE_TLS_CERT", requires = "edge_tls_key")]
    pub(crate) edge_tls_cert: Option<PathBuf>,
    /// The private key of `--edge-tls-cert` (PEM).
    #[arg(long, env = "LASTHOP_EDGE_TLS_KEY", requires = "edge_tls_cert")]
    pub(crate) edge_tls_key: Option<PathBuf>,
    /// Require engines to present a client certificate signed by a CA in this PEM file (mutual
    /// TLS; it then stands in for the edge token). Needs `--edge-tls-cert`.
    #[arg(long, env = "LASTHOP_EDGE_CLIENT_CA", requires = "edge_tls_cert")]
    pub(crate) edge_client_ca: Option<PathBuf>,
    /// Send branded domains' certificates and private keys to engines over a plain-HTTP edge
    /// listener even when they are not on loopback (without it, only over TLS or to loopback).
    #[arg(long, env = "LASTHOP_ALLOW_PLAIN_CERTIFICATE_DISTRIBUTION")]
    pub(crate) allow_plain_certificate_distribution: bool,
    /// The default domain's old shortener (issue 44's lazy fallback), a URL template with
    /// `{code}` such as `https://old.example/{code}`: a code of an alias's or a legacy code's
    /// shape that the fleet does not know is asked of it (a GET, redirects not followed), and
    /// its `Location` imported as the link after the create-time checks. Branded domains set
    /// theirs with `PATCH /v1/domains/{domain}` `legacy_fallback`.
    #[arg(long, env = "LASTHOP_LEGACY_FALLBACK", value_parser = legacy_template)]
    pub(crate) legacy_fallback: Option<String>,
    /// Who owns the links the default domain's fallback imports.
    #[arg(long, env = "LASTHOP_LEGACY_FALLBACK_OWNER", default_value = "legacy")]
    pub(crate) legacy_fallback_owner: String,
    /// How long one ask of an old shortener may take, in milliseconds. Keep it under the
    /// engines' origin timeout (300 ms by default), so that a slow old provider answers the
    /// visitor 404 rather than trip the engines' breaker.
    #[arg(
        long,
        env = "LASTHOP_LEGACY_FALLBACK_TIMEOUT_MS",
        default_value_t = 250
    )]
    pub(crate) legacy_fallback_timeout_ms: u64,
    /// Asks of an old shortener a second, per domain (a burst of as many).
    #[arg(long, env = "LASTHOP_LEGACY_FALLBACK_RATE", default_value_t = 20.0)]
    pub(crate) legacy_fallback_rate: f64,
    /// How long an old shortener's "no such code" (404, 410) is remembered, in seconds.
    #[arg(long, env = "LASTHOP_LEGACY_FALLBACK_MISS_SECS", default_value_t = 60)]
    pub(crate) legacy_fallback_miss_secs: u64,
    /// Sign every snapshot announced with this Ed25519 key (`keygen --signing`); engines pin
    /// its public key with `--snapshot-verify-key`.
    #[arg(long, env = "LASTHOP_SNAPSHOT_SIGNING_KEY")]
    pub(crate) snapshot_signing_key: Option<PathBuf>,
    /// Base of every short_url.
    #[arg(
        long,
        env = "LASTHOP_SHORT_BASE",
        default_value = "http://127.0.0.1:8080"
    )]
    pub(crate) short_base: String,
    /// This writer's region and the number of regions.
    #[arg(long, env = "LASTHOP_REGION", default_value_t = 0)]
    pub(crate) region: u32,
    #[arg(long, env = "LASTHOP_REGIONS", default_value_t = 1)]
    pub(crate) regions: u32,
    /// Counters leased at a time.
    #[arg(long, env = "LASTHOP_BLOCK_SIZE", default_value_t = 10_000)]
    pub(crate) block_size: u64,
    /// Creates per second per owner (0: unlimited).
    #[arg(long, env = "LASTHOP_CREATE_RATE", default_value_t = 100.0)]
    pub(crate) create_rate: f64,
    /// Burst of creates per owner.
    #[arg(long, env = "LASTHOP_CREATE_BURST", default_value_t = 1000.0)]
    pub(crate) create_burst: f64,
    /// Creates per second this region accepts from everyone together (0: unbounded). Engines
    /// are told it, and while their feed is lost they widen every region's window by it, so
    /// links minted meanwhile are never rejected by arithmetic.
    #[arg(long, env = "LASTHOP_MAX_MINT_RATE", default_value_t = lasthop_control::api::DEFAULT_MAX_MINT_RATE)]
    pub(crate) max_mint_rate: u64,
    /// Longest destination URL in bytes.
    #[arg(long, env = "LASTHOP_MAX_URL_LEN", default_value_t = 4096)]
    pub(crate) max_url_len: usize,
    /// Accept loopback/private/link-local destinations (test set-ups only).
    #[arg(long, env = "LASTHOP_ALLOW_PRIVATE_HOSTS")]
    pub(crate) allow_private_hosts: bool,
    /// Feed heartbeat: the longest silence on an idle feed stream, in milliseconds.
    #[arg(long, env = "LASTHOP_FEED_HEARTBEAT_MS", default_value_t = 1000)]
    pub(crate) feed_heartbeat_ms: u64,
    /// Publish a snapshot at least this often (seconds) when there were changes.
    #[arg(long, env = "LASTHOP_SNAPSHOT_INTERVAL_SECS", default_value_t = 300)]
    pub(crate) snapshot_interval_secs: u64,
    /// Publish a snapshot as soon as more changes than this accumulated since the last one
    /// (the overlay every engine holds in memory until then).
    #[arg(long, env = "LASTHOP_SNAPSHOT_MAX_OVERLAY", default_value_t = 100_000)]
    pub(crate) snapshot_max_overlay: u64,
    #[command(flatten)]
    pub(crate) hot: HotSetArgs,
    /// Counters above a region's mark that snapshots tell edges may still be issued.
    #[arg(long, env = "LASTHOP_RESERVE", default_value_t = lasthop_core::region::DEFAULT_RESERVE)]
    pub(crate) reserve: u64,
    /// Raise `lasthop_edge_lag_alarm` while any engine is more than this many seconds behind.
    #[arg(long, env = "LASTHOP_EDGE_LAG_ALARM_SECS", default_value_t = 30.0)]
    pub(crate) edge_lag_alarm_secs: f64,
    /// Another region's edge listener, `REGION=URL` (repeatable): this region replicates that
    /// region's links and state changes into its store (docs/ARCHITECTURE.md, "Regions").
    #[arg(
        long = "peer",
        env = "LASTHOP_PEERS",
        value_delimiter = ',',
        requires = "peer_token_file"
    )]
    pub(crate) peers: Vec<lasthop_control::peers::PeerSpec>,
    /// The secret every region presents to the others (one file copied to every region, at
    /// least 32 characters); the `/peer/` endpoints of this region's edge listener need it.
    #[arg(long, env = "LASTHOP_PEER_TOKEN_FILE")]
    pub(crate) peer_token_file: Option<PathBuf>,
    /// Verify `https://` peers against the CAs in this PEM file.
    #[arg(long, env = "LASTHOP_PEER_CA")]
    pub(crate) peer_ca: Option<PathBuf>,
    /// Present this certificate (PEM, chain first) to peers whose edge listener asks for one
    /// (their `--edge-client-ca`), as engines do with `--control-client-cert`.
    #[arg(
        long,
        env = "LASTHOP_PEER_CLIENT_CERT",
        requires_all = ["peer_client_key", "peer_ca"]
    )]
    pub(crate) peer_client_cert: Option<PathBuf>,
    /// The private key of `--peer-client-cert` (PEM).
    #[arg(long, env = "LASTHOP_PEER_CLIENT_KEY", requires = "peer_client_cert")]
    pub(crate) peer_client_key: Option<PathBuf>,
    /// The region aliases belong to: their state is that region's to decide.
    #[arg(long, env = "LASTHOP_ALIAS_HOME_REGION", default_value_t = 0)]
    pub(crate) alias_home_region: u32,
    /// Raise `lasthop_region_peer_lag_alarm` while a peer region is more than this many
    /// seconds behind.
    #[arg(long, env = "LASTHOP_PEER_LAG_ALARM_SECS", default_value_t = 30.0)]
    pub(crate) peer_lag_alarm_secs: f64,
    /// Where the record lives: `embedded` (redb in DATA_DIR) or a PostgreSQL connection string
    /// (`postgres://user@host1,host2/db?target_session_attrs=read-write&sslrootcert=FILE`),
    /// shared by every control plane on it. TLS as libpq's `sslmode` (`disable`, `prefer`,
    /// `require`, `verify-ca`, `verify-full`), `sslrootcert`, `sslcert`, `sslkey`; without
    /// `sslmode`, `verify-full` for any host that is not loopback.
    #[arg(long, env = "LASTHOP_STORE", default_value = "embedded")]
    pub(crate) store: String,
    #[command(flatten)]
    pub(crate) clicks: ServeClicks,
    #[command(flatten)]
    pub(crate) safety: ServeSafety,
    #[command(flatten)]
    pub(crate) acme: ServeAcme,
    /// A config file (TOML) whose keys are these flags' long names (`api-listen =
    /// "0.0.0.0:8081"`, `peer = ["1=https://..."]`); flags and environment variables override
    /// it. SIGHUP re-reads it (and the lists) and logs what changed; a changed setting takes
    /// effect at the next restart.
    #[arg(long, env = "LASTHOP_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Check the configuration (flags, environment, config file, and the key, certificate,
    /// token and list files it names) and exit: 0 when `serve` would start with it.
    #[arg(long)]
    pub(crate) check_config: bool,
}

/// Automatic certificates for branded domains (README "Automatic certificates").
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct ServeAcme {
    /// An ACME CA's directory URL: branded domains without a certificate of their own get one
    /// from it, and it renews them (off unless set). Let's Encrypt:
    /// https://acme-v02.api.letsencrypt.org/directory (staging:
    /// https://acme-staging-v02.api.letsencrypt.org/directory).
    #[arg(long, env = "LASTHOP_ACME_DIRECTORY")]
    pub(crate) acme_directory: Option<String>,
    /// The ACME account's contact (`mailto:ops@example.com`; repeatable): the CA writes there
    /// about expiring certificates and policy changes.
    #[arg(
        long,
        env = "LASTHOP_ACME_CONTACT",
        value_delimiter = ',',
        requires = "acme_directory"
    )]
    pub(crate) acme_contact: Vec<String>,
    /// Trust this PEM CA certificate for the ACME directory's HTTPS (a private CA such as a
    /// test server's), instead of the system's.
    #[arg(long, env = "LASTHOP_ACME_CA_FILE", requires = "acme_directory")]
    pub(crate) acme_ca_file: Option<PathBuf>,
    /// The challenge types tried, in order, each with an order of its own.
    #[arg(
        long,
        env = "LASTHOP_ACME_CHALLENGES",
        value_delimiter = ',',
        default_value = "http-01,tls-alpn-01",
        value_parser = ["http-01", "tls-alpn-01"]
    )]
    pub(crate) acme_challenges: Vec<String>,
    /// How often the domains are looked over for certificates to order or renew.
    #[arg(long, env = "LASTHOP_ACME_INTERVAL_SECS", default_value_t = 60)]
    pub(crate) acme_interval_secs: u64,
    /// The first wait after a failed attempt, doubled with each failure in a row (at most a
    /// day, jittered).
    #[arg(long, env = "LASTHOP_ACME_RETRY_SECS", default_value_t = 600)]
    pub(crate) acme_retry_secs: u64,
    /// Orders per domain in any 24 hours (an attempt places one per challenge type tried; Let's
    /// Encrypt allows 5 failed validations per name per hour and 5 identical certificates a
    /// week).
    #[arg(long, env = "LASTHOP_ACME_DOMAIN_ORDERS_PER_DAY", default_value_t = 6)]
    pub(crate) acme_domain_orders_per_day: usize,
    /// Orders by the whole fleet in any hour (Let's Encrypt allows 300 new orders per account
    /// every 3 hours).
    #[arg(long, env = "LASTHOP_ACME_ORDERS_PER_HOUR", default_value_t = 90)]
    pub(crate) acme_orders_per_hour: usize,
    /// Longest wait for every engine to serve a challenge answer before the CA is told to
    /// validate.
    #[arg(long, env = "LASTHOP_ACME_PUBLISH_WAIT_SECS", default_value_t = 20)]
    pub(crate) acme_publish_wait_secs: u64,
    /// Longest wait for the CA to validate, and then to issue.
    #[arg(long, env = "LASTHOP_ACME_ORDER_TIMEOUT_SECS", default_value_t = 90)]
    pub(crate) acme_order_timeout_secs: u64,
}

impl ServeAcme {
    /// What can be known wrong at start: a directory that is no `https://` URL (`http://` only
    /// on loopback), a contact that is no `mailto:`, a CA file that holds no certificate.
    pub(crate) fn check(&self) -> anyhow::Result<()> {
        let Some(directory) = &self.acme_directory else {
            return Ok(());
        };
        let url = url::Url::parse(directory)
            .map_err(|e| anyhow::anyhow!("--acme-directory {directory}: {e}"))?;
        let loopback = match url.host() {
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            Some(url::Host::Domain(d)) => d == "localhost",
            None => false,
        };
        anyhow::ensure!(
            url.scheme() == "https" || (url.scheme() == "http" && loopback),
            "--acme-directory {directory}: an ACME directory is an https:// URL"
        );
        for c in &self.acme_contact {
            anyhow::ensure!(
                c.strip_prefix("mailto:").is_some_and(|m| m.contains('@')),
                "--acme-contact {c}: a contact is mailto:name@example.com"
            );
        }
        if let Some(ca) = &self.acme_ca_file {
            let pem = std::fs::read(ca)
                .map_err(|e| anyhow::anyhow!("--acme-ca-file {}: {e}", ca.display()))?;
            use rustls::pki_types::pem::PemObject;
            anyhow::ensure!(
                rustls::pki_types::CertificateDer::pem_slice_iter(&pem)
                    .next()
                    .is_some_and(|c| c.is_ok()),
                "--acme-ca-file {}: no PEM certificate in it",
                ca.display()
            );
        }
        Ok(())
    }

    /// The manager's settings, with the account key in `data_dir`; `None` when ACME is off.
    pub(crate) fn config(
        &self,
        data_dir: &std::path::Path,
    ) -> Option<lasthop_control::acme::AcmeConfig> {
        use lasthop_control::acme::{AcmeConfig, Challenge};
        use std::time::Duration;
        Some(AcmeConfig {
            directory: self.acme_directory.clone()?,
            contacts: self.acme_contact.clone(),
            ca_file: self.acme_ca_file.clone(),
            account_key: data_dir.join("acme-account.key"),
            challenges: self
                .acme_challenges
                .iter()
                .filter_map(|c| Challenge::parse(c))
                .collect(),
            interval: Duration::from_secs(self.acme_interval_secs.max(1)),
            retry: Duration::from_secs(self.acme_retry_secs.max(1)),
            domain_orders_per_day: self.acme_domain_orders_per_day.max(1),
            orders_per_hour: self.acme_orders_per_hour.max(1),
            publish_wait: Duration::from_secs(self.acme_publish_wait_secs),
            order_timeout: Duration::from_secs(self.acme_order_timeout_secs.max(1)),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        acme: super::ServeAcme,
    }

    fn check(args: &[&str]) -> Result<(), String> {
        let mut argv = vec!["serve"];
        argv.extend_from_slice(args);
        Flags::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .acme
            .check()
            .map_err(|e| e.to_string())
    }

    #[test]
    fn acme_flags_are_checked_at_start() {
        assert!(check(&[]).is_ok(), "off");
        let le = "https://acme-v02.api.letsencrypt.org/directory";
        assert!(check(&[
            "--acme-directory",
            le,
            "--acme-contact",
            "mailto:ops@example.com"
        ])
        .is_ok());
        assert!(check(&["--acme-directory", "http://127.0.0.1:14000/dir"]).is_ok());
        for (args, says) in [
            (
                &["--acme-directory", "http://acme.example/dir"][..],
                "https://",
            ),
            (&["--acme-directory", "not a url"][..], "--acme-directory"),
            (
                &["--acme-directory", le, "--acme-contact", "ops@example.com"][..],
                "mailto:",
            ),
            (
                &[
                    "--acme-directory",
                    le,
                    "--acme-ca-file",
                    "/nonexistent/ca.pem",
                ][..],
                "--acme-ca-file",
            ),
            (
                &["--acme-directory", le, "--acme-challenges", "dns-01"][..],
                "dns-01",
            ),
            (
                &["--acme-contact", "mailto:ops@example.com"][..],
                "--acme-directory",
            ),
        ] {
            let err = check(args).unwrap_err();
            assert!(err.contains(says), "{args:?}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "no certificate here").unwrap();
        let err = check(&[
            "--acme-directory",
            le,
            "--acme-ca-file",
            empty.to_str().unwrap(),
        ])
        .unwrap_err();
        assert!(err.contains("no PEM certificate"), "{err}");
    }
}

/// `lasthop-control links ...`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum LinksCommand {
    /// Import another shortener's export with every old code kept (issue 44): each row goes
    /// through the create-time checks at a serving control plane (`--api`), in batches of
    /// 1000; a re-run imports nothing (`0 imported`); every refused row is reported with why.
    Import {
        /// The export's format: bitly, yourls, kutt, shlink, dub or csv
        /// (`code,long_url[,created_at,tags,expires_at]`).
        #[arg(long = "from")]
        from: lasthop_control::import::Format,
        /// The export file (`-`: standard input).
        file: PathBuf,
        /// Whose links they become.
        #[arg(long)]
        owner: String,
        /// The branded domain they are made on (default: the default domain).
        #[arg(long)]
        domain: Option<String>,
        /// Import the old totals of clicks as historical counts.
        #[arg(long)]
        with_clicks: bool,
        /// Check every row and report what would happen; write nothing.
        #[arg(long)]
        dry_run: bool,
        /// The serving control plane's API (`http://127.0.0.1:8080`).
        #[arg(long, env = "LASTHOP_API")]
        api: Option<String>,
        /// An admin API key.
        #[arg(long, env = "LASTHOP_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// A stopped embedded store's data directory (instead of `--api`).
        #[arg(long)]
        data_dir: Option<PathBuf>,
        /// With `--data-dir`: the permutation key file the store was made under.
        #[arg(long, env = "LASTHOP_KEY_FILE")]
        key_file: Option<PathBuf>,
        /// With `--data-dir`: reputation lists to check destinations against (as `serve`'s
        /// `--reputation-list`, repeatable); through `--api` the server's own lists apply.
        #[arg(long = "reputation-list")]
        reputation_lists: Vec<PathBuf>,
    },
}

fn legacy_template(s: &str) -> Result<String, String> {
    lasthop_control::legacy::check_template(s)
}
