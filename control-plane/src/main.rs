//! `lasthop-control`: the operator's entry point to the control plane.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, CommandFactory, Parser, Subcommand};
use lasthop_cli::bootstrap::{notify, shutdown_signal};
use lasthop_clicks::cli::{open_clicks, source, ClicksCommand, ClicksTuning, Toggle};
use lasthop_control::edge::EdgeState;
use lasthop_control::edge_token::EdgeToken;
use lasthop_control::feed::Feed;
use lasthop_control::fleet::Fleet;
use lasthop_control::publish::{PublishConfig, Publisher};
use lasthop_control::snapshot::HotSet;
use lasthop_control::store::CommitObserver;
use lasthop_control::{
    metrics::Metrics, router, ApiConfig, ApiKeys, AppState, EmbeddedStore, EmbeddedStoreConfig,
    Store,
};
use lasthop_core::{CodeScheme, PermutationKey, UrlPolicy};

#[derive(Parser)]
#[command(name = "lasthop-control", version, about = "lasthop control plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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
        command: ClicksCommand,
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
struct ServeClicks {
    /// Run the click processor (spool by default, Kafka with --clicks-kafka).
    #[arg(long, env = "LASTHOP_CLICKS", value_enum, default_value_t = Toggle::On)]
    clicks: Toggle,
    /// Spool directory engines on this host write to (default DATA_DIR/clicks/spool).
    #[arg(long, env = "LASTHOP_CLICKS_SPOOL")]
    clicks_spool: Option<PathBuf>,
    /// Consume clicks from this Kafka cluster instead of the spool.
    #[arg(long, env = "LASTHOP_CLICKS_KAFKA")]
    clicks_kafka: Option<String>,
    #[arg(long, env = "LASTHOP_CLICKS_TOPIC", default_value = "lasthop.clicks")]
    clicks_topic: String,
    #[arg(long, env = "LASTHOP_CLICKS_GROUP", default_value = "lasthop-clicks")]
    clicks_group: String,
    #[command(flatten)]
    tuning: ClicksTuning,
}

/// Where a command finds the store.
#[derive(Args, Clone)]
struct StoreArgs {
    /// The data directory (needed for the embedded store).
    #[arg(long, env = "LASTHOP_DATA_DIR")]
    data_dir: Option<PathBuf>,
    #[arg(long, env = "LASTHOP_KEY_FILE")]
    key_file: PathBuf,
    /// `embedded` (DATA_DIR/links.redb; stop `serve` first) or a PostgreSQL connection string.
    #[arg(long, env = "LASTHOP_STORE", default_value = "embedded")]
    store: String,
    #[arg(long, env = "LASTHOP_REGION", default_value_t = 0)]
    region: u32,
    #[arg(long, env = "LASTHOP_REGIONS", default_value_t = 1)]
    regions: u32,
}

impl StoreArgs {
    fn data_dir(&self) -> anyhow::Result<&std::path::Path> {
        self.data_dir
            .as_deref()
            .context("--data-dir is needed with the embedded store")
    }

    fn open(&self) -> anyhow::Result<(PermutationKey, Arc<dyn Store>)> {
        let key = PermutationKey::load(&self.key_file)?;
        let dir = match is_postgres(&self.store) {
            true => std::path::Path::new("."),
            false => self.data_dir()?,
        };
        let store = open_store(
            &self.store,
            dir,
            CodeScheme::new(&key)?,
            self.region,
            self.regions,
            10_000,
            None,
        )?;
        Ok((key, store))
    }
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Print every table (and its row count) where TEXT appears: an erasure audit, e.g. that a
    /// deleted link's URL is gone. Prints nothing when it is found nowhere.
    FindText {
        #[command(flatten)]
        store: StoreArgs,
        text: String,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
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
        /// The rollup store the popular links come from (`embedded` or
        /// `clickhouse://HOST:8123/DB`, as `serve --clicks-store`).
        #[arg(long, env = "LASTHOP_CLICKS_STORE", default_value = "embedded")]
        clicks_store: lasthop_control::clicks::StoreLocation,
        #[command(flatten)]
        budget: HotSetArgs,
    },
}

/// What a hot-set snapshot may hold (control-plane/src/snapshot.rs has the ranking).
#[derive(Args, Clone, Copy)]
struct HotSetArgs {
    /// Most links in a snapshot: links created in the last --snapshot-recent-days first, newest
    /// first, then the most clicked over 30 days; engines ask the origin for the rest.
    #[arg(long, env = "LASTHOP_SNAPSHOT_MAX_LINKS", default_value_t = HotSet::default().max_links)]
    snapshot_max_links: u64,
    /// Most bytes of links in a snapshot, each estimated as its layout costs it: key and URL
    /// plus 20 bytes when compact, (key + URL + 10) · 1.4 + 13 when paged.
    #[arg(long, env = "LASTHOP_SNAPSHOT_MAX_BYTES", default_value_t = HotSet::default().max_bytes)]
    snapshot_max_bytes: u64,
    /// The snapshot's layout: memory against an engine's cold-hit memory accesses (`paged` is
    /// faster on the pure request path, not yet on the whole system; see engine/DESIGN.md).
    /// Engines read either.
    #[arg(long, env = "LASTHOP_SNAPSHOT_LAYOUT", value_enum, default_value_t = lasthop_snapshot::Layout::Compact)]
    snapshot_layout: lasthop_snapshot::Layout,
    /// Links created within this many days are in the snapshot (within the budget).
    #[arg(long, env = "LASTHOP_SNAPSHOT_RECENT_DAYS", default_value_t = HotSet::default().recent_days)]
    snapshot_recent_days: u32,
}

impl HotSetArgs {
    fn hot_set(self) -> HotSet {
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
struct KeysAt {
    /// The data directory of an embedded-store control plane (its `api-keys` file).
    #[arg(long, env = "LASTHOP_DATA_DIR", required_unless_present = "store")]
    data_dir: Option<PathBuf>,
    /// `embedded` (the file in --data-dir) or the PostgreSQL connection string the control
    /// planes share (the keys are in the store: every control plane sees a change at once).
    #[arg(long, env = "LASTHOP_STORE")]
    store: Option<String>,
}

impl KeysAt {
    fn open(&self) -> anyhow::Result<ApiKeys> {
        match self.store.as_deref() {
            Some(url) if is_postgres(url) => {
                let keys = lasthop_control::store::postgres::keys::PgKeys::connect(url)
                    .context("connecting to the store")?;
                Ok(ApiKeys::from_key_store(Arc::new(keys))?)
            }
            Some("embedded") | None => {
                let dir = self
                    .data_dir
                    .as_deref()
                    .context("--data-dir is needed with the embedded store")?;
                Ok(ApiKeys::open(dir))
            }
            Some(other) => anyhow::bail!(
                "--store must be `embedded` or a PostgreSQL connection string, not {other:?}"
            ),
        }
    }
}

#[derive(Subcommand)]
enum ApikeyCommand {
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
        /// Print `{"key", "id", "owner", "admin"}` on stdout instead.
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
struct ServeSafety {
    /// A reputation list file (repeatable): one host or URL a line, a hosts file, or a
    /// URLhaus, PhishTank or OpenPhish export (detected per file). Creates of a listed
    /// destination answer 403; a reload's new entries take down the links they match.
    #[arg(
        long = "reputation-list",
        env = "LASTHOP_REPUTATION_LISTS",
        value_delimiter = ','
    )]
    reputation_lists: Vec<PathBuf>,
    /// How often list files are checked for changes, seconds (SIGHUP re-reads them at once).
    #[arg(long, env = "LASTHOP_REPUTATION_POLL_SECS", default_value_t = 5)]
    reputation_poll_secs: u64,
    /// Accept destinations on other shorteners' domains and on our own short domain.
    #[arg(long, env = "LASTHOP_ALLOW_SHORTENER_CHAINS")]
    allow_shortener_chains: bool,
    /// More shortener domains, one a line, beside the shipped list.
    #[arg(long, env = "LASTHOP_SHORTENER_LIST")]
    shortener_list: Option<PathBuf>,
    /// Scan new links after their 201 and re-scan live ones (lists, heuristics, webhook).
    #[arg(long, env = "LASTHOP_SCANNER", value_enum, default_value_t = Toggle::On)]
    scanner: Toggle,
    /// A whole re-scan of every live link takes this long (`86400`, `90s`, `30m`, `24h`, `7d`).
    #[arg(long, env = "LASTHOP_RESCAN_INTERVAL", default_value = "24h", value_parser = parse_duration)]
    rescan_interval: Duration,
    /// Links re-scanned a second, at most.
    #[arg(long, env = "LASTHOP_RESCAN_MAX_RATE", default_value_t = 200.0)]
    rescan_max_rate: f64,
    /// An external verdict service: POST {"url"} → {"verdict": "clean"|"warn"|"block", "reason"}.
    #[arg(long, env = "LASTHOP_SCAN_WEBHOOK")]
    scan_webhook: Option<String>,
    /// Per attempt, milliseconds.
    #[arg(long, env = "LASTHOP_SCAN_WEBHOOK_TIMEOUT_MS", default_value_t = 2000)]
    scan_webhook_timeout_ms: u64,
    /// Attempts after the first failed one.
    #[arg(long, env = "LASTHOP_SCAN_WEBHOOK_RETRIES", default_value_t = 2)]
    scan_webhook_retries: u32,
    /// Webhook calls in flight at once.
    #[arg(long, env = "LASTHOP_SCAN_WEBHOOK_CONCURRENCY", default_value_t = 8)]
    scan_webhook_concurrency: usize,
    /// New links answer the interstitial at every edge until their first scan verdict.
    #[arg(long, env = "LASTHOP_HOLD_UNVERIFIED")]
    hold_unverified: bool,
    /// Distinct destination domains an owner may use in a sliding hour before its new links
    /// are created held and it is flagged (0: off).
    #[arg(long, env = "LASTHOP_VELOCITY_DOMAINS_PER_HOUR", default_value_t = 500)]
    velocity_domains_per_hour: usize,
    /// Anonymous reports a second per client network (/24, /48), and the burst.
    #[arg(long, env = "LASTHOP_REPORT_RATE", default_value_t = 0.1)]
    report_rate: f64,
    #[arg(long, env = "LASTHOP_REPORT_BURST", default_value_t = 10.0)]
    report_burst: f64,
    /// Anonymous reports a second from all networks together, and the burst.
    #[arg(long, env = "LASTHOP_REPORT_GLOBAL_RATE", default_value_t = 5.0)]
    report_global_rate: f64,
    #[arg(long, env = "LASTHOP_REPORT_GLOBAL_BURST", default_value_t = 100.0)]
    report_global_burst: f64,
}

/// `86400`, `90s`, `30m`, `24h` or `7d`.
fn parse_duration(s: &str) -> Result<Duration, String> {
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
struct ServeArgs {
    /// Directory of the store, the API keys file, the edge token (`edge.token`, written on first
    /// start) and published snapshots (`snapshots/`).
    #[arg(long, env = "LASTHOP_DATA_DIR")]
    data_dir: PathBuf,
    /// Permutation key file.
    #[arg(long, env = "LASTHOP_KEY_FILE")]
    key_file: PathBuf,
    /// Public API listener.
    #[arg(long, env = "LASTHOP_API_LISTEN", default_value = "127.0.0.1:8081")]
    api_listen: SocketAddr,
    /// The web console for link owners and operators (sign in with an API key). Off unless
    /// given; keep it on a private network or behind a TLS proxy (it marks its cookies Secure
    /// when the proxy says `X-Forwarded-Proto: https`).
    #[arg(long, env = "LASTHOP_DASHBOARD_LISTEN")]
    dashboard_listen: Option<SocketAddr>,
    /// Internal edge listener for engines: origin lookups, the feed, snapshot downloads, status
    /// reports. Requires the edge token; keep it off the public network all the same.
    #[arg(long, env = "LASTHOP_EDGE_LISTEN", default_value = "127.0.0.1:8082")]
    edge_listen: SocketAddr,
    /// Serve the edge listener over TLS with this certificate chain (PEM, leaf first); with
    /// `--edge-tls-key`. Without them it is plain HTTP, for loopback development.
    #[arg(long, env = "LASTHOP_EDGE_TLS_CERT", requires = "edge_tls_key")]
    edge_tls_cert: Option<PathBuf>,
    /// The private key of `--edge-tls-cert` (PEM).
    #[arg(long, env = "LASTHOP_EDGE_TLS_KEY", requires = "edge_tls_cert")]
    edge_tls_key: Option<PathBuf>,
    /// Require engines to present a client certificate signed by a CA in this PEM file (mutual
    /// TLS; it then stands in for the edge token). Needs `--edge-tls-cert`.
    #[arg(long, env = "LASTHOP_EDGE_CLIENT_CA", requires = "edge_tls_cert")]
    edge_client_ca: Option<PathBuf>,
    /// Sign every snapshot announced with this Ed25519 key (`keygen --signing`); engines pin
    /// its public key with `--snapshot-verify-key`.
    #[arg(long, env = "LASTHOP_SNAPSHOT_SIGNING_KEY")]
    snapshot_signing_key: Option<PathBuf>,
    /// Base of every short_url.
    #[arg(
        long,
        env = "LASTHOP_SHORT_BASE",
        default_value = "http://127.0.0.1:8080"
    )]
    short_base: String,
    /// This writer's region and the number of regions.
    #[arg(long, env = "LASTHOP_REGION", default_value_t = 0)]
    region: u32,
    #[arg(long, env = "LASTHOP_REGIONS", default_value_t = 1)]
    regions: u32,
    /// Counters leased at a time.
    #[arg(long, env = "LASTHOP_BLOCK_SIZE", default_value_t = 10_000)]
    block_size: u64,
    /// Creates per second per owner (0: unlimited).
    #[arg(long, env = "LASTHOP_CREATE_RATE", default_value_t = 100.0)]
    create_rate: f64,
    /// Burst of creates per owner.
    #[arg(long, env = "LASTHOP_CREATE_BURST", default_value_t = 1000.0)]
    create_burst: f64,
    /// Creates per second this region accepts from everyone together (0: unbounded). Engines
    /// are told it, and while their feed is lost they widen every region's window by it, so
    /// links minted meanwhile are never rejected by arithmetic.
    #[arg(long, env = "LASTHOP_MAX_MINT_RATE", default_value_t = lasthop_control::api::DEFAULT_MAX_MINT_RATE)]
    max_mint_rate: u64,
    /// Longest destination URL in bytes.
    #[arg(long, env = "LASTHOP_MAX_URL_LEN", default_value_t = 4096)]
    max_url_len: usize,
    /// Accept loopback/private/link-local destinations (test set-ups only).
    #[arg(long, env = "LASTHOP_ALLOW_PRIVATE_HOSTS")]
    allow_private_hosts: bool,
    /// Feed heartbeat: the longest silence on an idle feed stream, in milliseconds.
    #[arg(long, env = "LASTHOP_FEED_HEARTBEAT_MS", default_value_t = 1000)]
    feed_heartbeat_ms: u64,
    /// Publish a snapshot at least this often (seconds) when there were changes.
    #[arg(long, env = "LASTHOP_SNAPSHOT_INTERVAL_SECS", default_value_t = 300)]
    snapshot_interval_secs: u64,
    /// Publish a snapshot as soon as more changes than this accumulated since the last one
    /// (the overlay every engine holds in memory until then).
    #[arg(long, env = "LASTHOP_SNAPSHOT_MAX_OVERLAY", default_value_t = 100_000)]
    snapshot_max_overlay: u64,
    #[command(flatten)]
    hot: HotSetArgs,
    /// Counters above a region's mark that snapshots tell edges may still be issued.
    #[arg(long, env = "LASTHOP_RESERVE", default_value_t = lasthop_core::region::DEFAULT_RESERVE)]
    reserve: u64,
    /// Raise `lasthop_edge_lag_alarm` while any engine is more than this many seconds behind.
    #[arg(long, env = "LASTHOP_EDGE_LAG_ALARM_SECS", default_value_t = 30.0)]
    edge_lag_alarm_secs: f64,
    /// Another region's edge listener, `REGION=URL` (repeatable): this region replicates that
    /// region's links and state changes into its store (docs/ARCHITECTURE.md, "Regions").
    #[arg(
        long = "peer",
        env = "LASTHOP_PEERS",
        value_delimiter = ',',
        requires = "peer_token_file"
    )]
    peers: Vec<lasthop_control::peers::PeerSpec>,
    /// The secret every region presents to the others (one file copied to every region, at
    /// least 32 characters); the `/peer/` endpoints of this region's edge listener need it.
    #[arg(long, env = "LASTHOP_PEER_TOKEN_FILE")]
    peer_token_file: Option<PathBuf>,
    /// Verify `https://` peers against the CAs in this PEM file.
    #[arg(long, env = "LASTHOP_PEER_CA")]
    peer_ca: Option<PathBuf>,
    /// Present this certificate (PEM, chain first) to peers whose edge listener asks for one
    /// (their `--edge-client-ca`), as engines do with `--control-client-cert`.
    #[arg(
        long,
        env = "LASTHOP_PEER_CLIENT_CERT",
        requires_all = ["peer_client_key", "peer_ca"]
    )]
    peer_client_cert: Option<PathBuf>,
    /// The private key of `--peer-client-cert` (PEM).
    #[arg(long, env = "LASTHOP_PEER_CLIENT_KEY", requires = "peer_client_cert")]
    peer_client_key: Option<PathBuf>,
    /// The region aliases belong to: their state is that region's to decide.
    #[arg(long, env = "LASTHOP_ALIAS_HOME_REGION", default_value_t = 0)]
    alias_home_region: u32,
    /// Raise `lasthop_region_peer_lag_alarm` while a peer region is more than this many
    /// seconds behind.
    #[arg(long, env = "LASTHOP_PEER_LAG_ALARM_SECS", default_value_t = 30.0)]
    peer_lag_alarm_secs: f64,
    /// Where the record lives: `embedded` (redb in DATA_DIR) or a PostgreSQL connection string
    /// (`postgres://user@host1,host2/db?target_session_attrs=read-write`), shared by every
    /// control plane on it.
    #[arg(long, env = "LASTHOP_STORE", default_value = "embedded")]
    store: String,
    #[command(flatten)]
    clicks: ServeClicks,
    #[command(flatten)]
    safety: ServeSafety,
    /// A config file (TOML) whose keys are these flags' long names (`api-listen =
    /// "0.0.0.0:8081"`, `peer = ["1=https://..."]`); flags and environment variables override
    /// it. SIGHUP re-reads it (and the lists) and logs what changed; a changed setting takes
    /// effect at the next restart.
    #[arg(long, env = "LASTHOP_CONFIG")]
    config: Option<PathBuf>,
    /// Check the configuration (flags, environment, config file, and the key, certificate,
    /// token and list files it names) and exit: 0 when `serve` would start with it.
    #[arg(long)]
    check_config: bool,
}

fn main() -> anyhow::Result<()> {
    lasthop_cli::bootstrap::init_tracing();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cli, file) =
        lasthop_cli::parse::<Cli>(Cli::command(), argv.clone()).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Generate { dir } => {
            let cmd = Cli::command();
            let serve = cmd
                .find_subcommand("serve")
                .cloned()
                .context("the serve subcommand")?;
            for path in lasthop_cli::generate(cmd, &serve, &dir)? {
                println!("{}", path.display());
            }
            Ok(())
        }
        Command::Serve(args) if args.check_config => match check_serve(&args) {
            Ok(()) => {
                println!("lasthop-control: configuration OK");
                Ok(())
            }
            Err(e) => {
                eprintln!("lasthop-control: configuration invalid: {e:#}");
                std::process::exit(1);
            }
        },
        Command::Keygen {
            out,
            force,
            signing: true,
            ..
        } => {
            let key = lasthop_control::signing::SigningKey::generate(&out, force)?;
            let public = key.public_hex();
            let pub_path = PathBuf::from(format!("{}.pub", out.display()));
            std::fs::write(&pub_path, format!("{public}\n"))
                .with_context(|| format!("writing {}", pub_path.display()))?;
            println!(
                "wrote {} (public key in {}; give it to engines as --snapshot-verify-key)\npublic key: {public}",
                out.display(),
                pub_path.display()
            );
            Ok(())
        }
        Command::Keygen {
            out, bits, force, ..
        } => {
            anyhow::ensure!(
                force || !out.exists(),
                "{} exists; pass --force to replace it (codes minted under it become unreadable)",
                out.display()
            );
            anyhow::ensure!(
                matches!(bits, 128 | 192 | 256),
                "--bits must be 128, 192 or 256"
            );
            let key = PermutationKey::generate(bits / 8)?;
            std::fs::write(&out, key.to_file_text())
                .with_context(|| format!("writing {}", out.display()))?;
            restrict_permissions(&out)?;
            println!("wrote {} (key id {:08x})", out.display(), key.id());
            Ok(())
        }
        Command::Apikey { command } => apikey(command),
        Command::Serve(args) => serve(*args, ConfigReload { argv, file }),
        Command::Snapshot {
            command:
                SnapshotCommand::Build {
                    store,
                    out,
                    reserve,
                    hot,
                    clicks_store,
                    budget,
                },
        } => {
            let (key, opened) = store.open()?;
            let started = std::time::Instant::now();
            let hot_set = budget.hot_set();
            let (seq, info) = if hot {
                let popular = offline_popular(&store, &clicks_store, &hot_set);
                let (seq, info, stats) = lasthop_control::snapshot::build_hot_snapshot(
                    &*opened,
                    key.id(),
                    store.regions,
                    reserve,
                    &out,
                    &hot_set,
                    &popular,
                    lasthop_control::clock::now_ms(),
                )?;
                eprintln!("hot set: {stats:?}");
                (seq, info)
            } else {
                lasthop_control::snapshot::build_snapshot(
                    &*opened,
                    key.id(),
                    store.regions,
                    reserve,
                    &out,
                    hot_set.layout,
                )?
            };
            eprintln!("built in {:.3} s", started.elapsed().as_secs_f64());
            let store = opened;
            store.shutdown()?;
            println!("wrote {} (seq {seq}, {info:?})", out.display());
            Ok(())
        }
        Command::Clicks { command } => lasthop_clicks::cli::run(command),
        Command::Store {
            command: StoreCommand::FindText { store, text },
        } => {
            let (_, store) = store.open()?;
            for (table, rows) in store.find_text(&text)? {
                println!("{table}\t{rows}");
            }
            store.shutdown()?;
            Ok(())
        }
        Command::Export { store, out } => {
            let (key, opened) = store.open()?;
            let scheme = CodeScheme::new(&key)?;
            let source = if is_postgres(&store.store) {
                "postgres"
            } else {
                "embedded"
            };
            let keys_dir = (source == "embedded")
                .then(|| store.data_dir())
                .transpose()?;
            // A file gets every URL and key hash of the record: readable by its owner only,
            // fsynced once written.
            let (sink, file): (Box<dyn std::io::Write>, _) = match &out {
                Some(path) => {
                    use std::os::unix::fs::OpenOptionsExt as _;
                    let file = std::fs::OpenOptions::new()
                        .write(true)
                        .create(true)
                        .truncate(true)
                        .mode(0o600)
                        .open(path)
                        .with_context(|| format!("creating {}", path.display()))?;
                    (Box::new(file.try_clone()?), Some(file))
                }
                None => (Box::new(std::io::stdout().lock()), None),
            };
            let end = lasthop_control::backup::export_all(
                &*opened,
                source,
                scheme.key_id(),
                store.regions,
                keys_dir,
                std::io::BufWriter::with_capacity(1 << 20, sink),
            )?;
            if let Some(file) = file {
                file.sync_all()?;
            }
            opened.shutdown()?;
            eprintln!(
                "exported {} links and {} other records, change log at {}",
                end.links,
                end.records - end.links,
                end.last_seq
            );
            Ok(())
        }
        Command::Import { store, input } => {
            let key = PermutationKey::load(&store.key_file)?;
            let data_dir = if is_postgres(&store.store) {
                None
            } else {
                Some(store.data_dir()?)
            };
            let run = |r: &mut dyn std::io::BufRead| {
                lasthop_control::backup::import_all(
                    &store.store,
                    data_dir,
                    CodeScheme::new(&key)?,
                    store.region,
                    store.regions,
                    r,
                )
                .map_err(anyhow::Error::from)
            };
            let done = match &input {
                Some(path) => {
                    let file = std::fs::File::open(path)
                        .with_context(|| format!("opening {}", path.display()))?;
                    run(&mut std::io::BufReader::with_capacity(1 << 20, file))?
                }
                None => run(&mut std::io::stdin().lock())?,
            };
            eprintln!(
                "imported {} links, {} audit records, {} other records and {} API keys; \
                 change log at {}",
                done.links, done.audit, done.other, done.api_keys, done.last_seq
            );
            Ok(())
        }
        Command::Migrate { store } => {
            anyhow::ensure!(
                is_postgres(&store),
                "--store must be a PostgreSQL connection string"
            );
            let ran = lasthop_control::store::postgres::migrate_only(&store)?;
            println!(
                "{ran} migration(s) applied; schema version {}",
                lasthop_control::store::postgres::MIGRATIONS.len()
            );
            Ok(())
        }
    }
}

fn apikey(command: ApikeyCommand) -> anyhow::Result<()> {
    match command {
        ApikeyCommand::Create {
            at,
            owner,
            admin,
            json,
        } => {
            let key = at.open()?.create(&owner, admin)?;
            if json {
                println!(
                    "{}",
                    serde_json::json!({"key": key.key, "id": key.id, "owner": owner, "admin": admin})
                );
            } else {
                // The secret alone on stdout (scripts capture it), the id beside it on stderr.
                println!("{}", key.key);
                eprintln!(
                    "key id {} (owner {owner}{})",
                    key.id,
                    if admin { ", admin" } else { "" }
                );
            }
            Ok(())
        }
        ApikeyCommand::List { at, owner, json } => {
            let keys = at.open()?.list(owner.as_deref());
            for k in keys {
                if json {
                    println!("{}", serde_json::to_string(&k)?);
                } else {
                    println!(
                        "{}\t{}\t{}\t{}\t{}",
                        k.id,
                        k.owner,
                        if k.admin { "admin" } else { "user" },
                        k.created_at,
                        match &k.revoked_at {
                            Some(at) => format!("revoked {at}"),
                            None => "active".to_string(),
                        }
                    );
                }
            }
            Ok(())
        }
        ApikeyCommand::Revoke { at, id } => {
            let keys = at.open()?;
            let known = keys.list(None).into_iter().find(|k| k.id == id);
            match known {
                None => anyhow::bail!("no key has the id {id}"),
                Some(k) if k.revoked => {
                    println!("{id} was already revoked");
                    Ok(())
                }
                Some(_) => {
                    keys.revoke(&id)?;
                    println!("revoked {id}");
                    Ok(())
                }
            }
        }
    }
}

/// Opens the store `spec` names: `embedded` (redb in `DATA_DIR/links.redb`) or a PostgreSQL
/// connection string (`postgres://…`, `postgresql://…` or libpq `key=value` words).
fn open_store(
    spec: &str,
    data_dir: &std::path::Path,
    scheme: CodeScheme,
    region: u32,
    regions: u32,
    block_size: u64,
    observer: Option<CommitObserver>,
) -> anyhow::Result<Arc<dyn Store>> {
    if spec == "embedded" {
        let mut config = EmbeddedStoreConfig::new(data_dir.join("links.redb"), scheme);
        config.region = region;
        config.regions = regions;
        config.block_size = block_size;
        let store = EmbeddedStore::open(config, observer)
            .with_context(|| format!("opening the store in {}", data_dir.display()))?;
        return Ok(Arc::new(store));
    }
    anyhow::ensure!(
        is_postgres(spec),
        "--store must be `embedded` or a PostgreSQL connection string (postgres://...)"
    );
    let mut config = lasthop_control::store::postgres::PgStoreConfig::new(spec, scheme);
    config.region = region;
    config.regions = regions;
    config.block_size = block_size;
    config.observer = observer;
    let store = lasthop_control::store::postgres::PgStore::open(config)
        .context("opening the PostgreSQL store")?;
    Ok(Arc::new(store))
}

fn is_postgres(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://") || spec.contains('=')
}

fn restrict_permissions(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

/// What SIGHUP needs to read `serve`'s configuration again.
struct ConfigReload {
    argv: Vec<std::ffi::OsString>,
    file: Option<lasthop_cli::FileConfig>,
}

impl ConfigReload {
    /// Re-reads the config file under the same command line and logs what changed (every
    /// setting of `serve` is read at start, so changes wait for a restart) or why the file is
    /// refused; the running configuration is never touched.
    fn reread(&mut self) {
        let Some(running) = &self.file else {
            return;
        };
        match lasthop_cli::parse::<Cli>(Cli::command(), self.argv.clone()) {
            Ok((_, Some(next))) => {
                let changed = running.changed_keys(&next);
                if changed.is_empty() {
                    tracing::info!(file = %next.path.display(), "SIGHUP: configuration unchanged");
                } else {
                    tracing::warn!(keys = ?changed, "SIGHUP: configuration changes that need a restart (running with the old values)");
                }
                self.file = Some(next);
            }
            Ok((_, None)) => {}
            Err(e) => tracing::error!(error = %e, "SIGHUP: keeping the running configuration"),
        }
    }
}

/// What `serve` reads before it opens the store or binds a listener: certificates and keys
/// first, so a bad file stops the start with its name. `--check-config` reads the same.
struct ServeFiles {
    edge_tls: Option<lasthop_control::edge_tls::EdgeTls>,
    signing: Option<lasthop_control::signing::SigningKey>,
    scheme: CodeScheme,
    peer_token: Option<String>,
    peer_agent: ureq::Agent,
}

impl ServeFiles {
    fn read(args: &ServeArgs) -> anyhow::Result<ServeFiles> {
        // clap requires --edge-tls-cert and --edge-tls-key together.
        let edge_tls = match (&args.edge_tls_cert, &args.edge_tls_key) {
            (Some(cert), Some(key)) => Some(lasthop_control::edge_tls::EdgeTls::load(
                cert,
                key,
                args.edge_client_ca.as_deref(),
            )?),
            _ => None,
        };
        let signing = args
            .snapshot_signing_key
            .as_deref()
            .map(lasthop_control::signing::SigningKey::load)
            .transpose()?;
        let key = PermutationKey::load(&args.key_file)?;
        let scheme = CodeScheme::new(&key)?;
        let peer_token = args
            .peer_token_file
            .as_deref()
            .map(lasthop_control::peers::read_token)
            .transpose()?;
        let builder = ureq::AgentBuilder::new().redirects(0);
        let peer_agent = match &args.peer_ca {
            Some(ca) => {
                let identity = args
                    .peer_client_cert
                    .as_deref()
                    .zip(args.peer_client_key.as_deref());
                builder.tls_config(lasthop_control::edge_tls::client_config_with(ca, identity)?)
            }
            None => builder,
        }
        .build();
        Ok(ServeFiles {
            edge_tls,
            signing,
            scheme,
            peer_token,
            peer_agent,
        })
    }
}

/// `serve --check-config`: the files [`ServeFiles`] reads, and the lists' files there (read
/// in full only at start: big lists take seconds).
fn check_serve(args: &ServeArgs) -> anyhow::Result<()> {
    ServeFiles::read(args)?;
    let lists = args
        .safety
        .shortener_list
        .iter()
        .map(|p| ("--shortener-list", p))
        .chain(
            args.safety
                .reputation_lists
                .iter()
                .map(|p| ("--reputation-list", p)),
        );
    for (flag, path) in lists {
        std::fs::metadata(path).with_context(|| format!("{flag} {}", path.display()))?;
    }
    Ok(())
}

fn serve(args: ServeArgs, config: ConfigReload) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("api")
        .build()?;
    // SIGHUP's handler first of all: loading big lists takes seconds, and until a handler is
    // installed a SIGHUP (a log rotation, an operator) would end the process. Signals that
    // arrive before the listener task runs wait for it.
    let hup = {
        let _in_runtime = runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .context("listening for SIGHUP")?
    };
    let ServeFiles {
        edge_tls,
        signing,
        scheme,
        peer_token,
        peer_agent,
    } = ServeFiles::read(&args)?;
    if let Some(key) = &signing {
        tracing::info!(public_key = %key.public_hex(), "signing snapshots");
    }
    let key_id = scheme.key_id();
    let metrics = Metrics::new()?;
    let observer: CommitObserver = {
        let m = metrics.clone();
        Arc::new(move |ops, secs| {
            m.commit_batch.observe(ops as f64);
            m.commit_seconds.observe(secs);
        })
    };
    let store = open_store(
        &args.store,
        &args.data_dir,
        scheme.clone(),
        args.region,
        args.regions,
        args.block_size,
        Some(observer),
    )?;
    let api = ApiConfig {
        short_base: args.short_base.trim_end_matches('/').to_string(),
        url_policy: UrlPolicy {
            max_len: args.max_url_len,
            allow_private_hosts: args.allow_private_hosts,
        },
        create_rate: args.create_rate,
        create_burst: args.create_burst,
        max_mint_rate: args.max_mint_rate,
        edge_lag_alarm_secs: args.edge_lag_alarm_secs,
        report_rate: args.safety.report_rate,
        report_burst: args.safety.report_burst,
        report_global_rate: args.safety.report_global_rate,
        report_global_burst: args.safety.report_global_burst,
    };
    // After the store is open: its lock keeps a second `serve` on this data dir from racing us.
    // A shared store holds the token every control plane on it answers to (and each writes it
    // to its DATA_DIR/edge.token for the engines on its host).
    let token = match store.shared_secret(
        lasthop_control::edge_token::SECRET_NAME,
        &lasthop_control::edge_token::generate_text,
    )? {
        Some(shared) => EdgeToken::from_shared(&args.data_dir, &shared)?,
        None => EdgeToken::load_or_create(&args.data_dir)?,
    };
    let dyn_store = Arc::clone(&store);
    let shared = Arc::clone(&store).shared();
    let fleet = Arc::new(match &shared {
        Some(_) => Fleet::with_shared(shared.clone()),
        // The embedded store's fleet survives restarts in a file beside it.
        None => Fleet::with_file(args.data_dir.join("fleet.json")),
    });
    let publisher = Publisher::new(
        Arc::clone(&dyn_store),
        Arc::clone(&fleet),
        PublishConfig {
            dir: args.data_dir.join("snapshots"),
            key_id,
            regions: args.regions,
            reserve: args.reserve,
            interval: Duration::from_secs(args.snapshot_interval_secs.max(1)),
            max_overlay: args.snapshot_max_overlay,
            signing: signing.map(Arc::new),
            hot: args.hot.hot_set(),
        },
    )?;
    let processor = match args.clicks.clicks {
        Toggle::Off => None,
        Toggle::On => {
            let c = &args.clicks;
            let source = source(
                &args.data_dir,
                c.clicks_spool.clone(),
                c.clicks_kafka.clone(),
                &c.clicks_topic,
                &c.clicks_group,
            );
            let config = c.tuning.config(&args.data_dir, source)?;
            Some(open_clicks(config, metrics.clicks.clone())?)
        }
    };
    let safety = start_safety(&args, Arc::clone(&dyn_store), &metrics)?;
    let follower = shared
        .clone()
        .map(|shared| follow_shared(shared, Arc::clone(&safety.safety), Arc::clone(&fleet)))
        .transpose()?;
    let keys = open_keys(&args, &dyn_store, true)?;
    // With regions, the keys peer regions read and copy into: one view, for replication and
    // the edge listener.
    let peer_keys = match &peer_token {
        Some(_) => Some(Arc::new(open_keys(&args, &dyn_store, false)?)),
        None => None,
    };
    let state = AppState::with_safety(
        Arc::clone(&dyn_store),
        keys,
        api,
        metrics,
        Arc::clone(&fleet),
        Some(Arc::clone(&publisher)),
        Arc::clone(&safety.safety),
    );
    let clicks = match processor {
        Some((p, archiver)) => {
            let handle = p.handle();
            state.set_clicks(handle.clone());
            publisher.set_rollups(Arc::clone(handle.store()));
            let archiving = archiver
                .map(|a| anyhow::Ok((a.handle(), a.spawn()?)))
                .transpose()?;
            Some((handle, p.spawn()?, archiving))
        }
        None => None,
    };
    let peers = match (&peer_token, args.peers.is_empty()) {
        (Some(token), false) => {
            let peers = lasthop_control::peers::Peers::start(
                lasthop_control::peers::PeersConfig {
                    region: args.region,
                    regions: args.regions,
                    alias_home: args.alias_home_region,
                    peers: args.peers.clone(),
                    token: token.clone(),
                    lag_alarm_secs: args.peer_lag_alarm_secs,
                    keys: peer_keys.clone(),
                },
                Arc::clone(&dyn_store),
                scheme,
                peer_agent,
                Some(Arc::clone(&safety.safety)),
            )?;
            state.set_peers(Arc::clone(&peers));
            Some(peers)
        }
        _ => None,
    };
    let edge_peers = peers.clone();
    let heartbeat = Duration::from_millis(args.feed_heartbeat_ms.max(1));
    let reload = safety.reload.clone();
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.api_listen)
            .await
            .with_context(|| format!("binding {}", args.api_listen))?;
        let edge_listener = tokio::net::TcpListener::bind(args.edge_listen)
            .await
            .with_context(|| format!("binding {}", args.edge_listen))?;
        let dashboard_listener = match args.dashboard_listen {
            Some(a) => Some(
                tokio::net::TcpListener::bind(a)
                    .await
                    .with_context(|| format!("binding {a}"))?,
            ),
            None => None,
        };
        let addr = listener.local_addr()?;
        let edge_addr = edge_listener.local_addr()?;
        let edge_scheme = if edge_tls.is_some() { "https" } else { "http" };
        match &edge_tls {
            Some(tls) => tracing::info!(client_certificates = tls.client_auth(), "edge listener serves TLS"),
            None => tracing::warn!("edge listener is plain HTTP: the edge token, every destination and every takedown travel in clear (loopback development only; --edge-tls-cert and --edge-tls-key serve TLS)"),
        }
        tracing::info!(api = %addr, edge = %edge_addr, key_id = format_args!("{:08x}", key_id), "control plane serving");
        // Machine-readable lines on stdout, so scripts and tests can use --api-listen :0 and
        // --edge-listen :0. The api line stays first; both go in one write, so a reader that
        // takes only the first line and closes the pipe cannot fail the second.
        {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            let mut lines =
                format!("api listening on http://{addr}\nedge listening on {edge_scheme}://{edge_addr}\n");
            if let Some(d) = &dashboard_listener {
                lines.push_str(&format!("dashboard listening on http://{}\n", d.local_addr()?));
            }
            out.write_all(lines.as_bytes())?;
            out.flush()?;
        }
        notify(&[sd_notify::NotifyState::Ready]);
        // One shutdown signal drains both listeners, ends feed streams (they never end by
        // themselves, and draining waits for open responses) and stops the publisher.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop_tx.send(true);
        });
        tokio::spawn(reload_on_sighup(hup, reload, config));
        let feed = Feed::new(Arc::clone(&dyn_store), heartbeat)
            .with_mint_rate(Some(args.max_mint_rate))
            .with_peers(edge_peers.clone())
            .with_snapshots(publisher.subscribe())
            .with_stop(stop_rx.clone());
        let mut edge_state = EdgeState::new(dyn_store, token, feed, fleet, Some(Arc::clone(&publisher)));
        if let (Some(t), Some(keys)) = (&peer_token, &peer_keys) {
            edge_state = edge_state
                .with_peer_keys(Arc::clone(keys))
                .with_peer_stats(state.clone())
                .with_peers(args.region, lasthop_control::edge_token::EdgeToken::new(t), edge_peers, args.max_mint_rate);
        }
        if edge_tls.as_ref().is_some_and(|t| t.client_auth()) {
            edge_state = edge_state.with_client_certificates();
        }
        tokio::spawn(Arc::clone(&publisher).start(stop_rx.clone()));
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            // An Err means the sender is gone, which only happens after the signal.
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let dashboard = dashboard_listener.map(|l| {
            let app = lasthop_control::dashboard::router(
                state.clone(),
                args.short_base.trim_end_matches('/').to_string(),
            );
            axum::serve(l, app.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(stopped(stop_rx.clone()))
        });
        // The peer address reaches handlers (reports are rate-limited per client network).
        let api = axum::serve(
            listener,
            router(state).into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(stopped(stop_rx.clone()));
        let edge_router = lasthop_control::edge::router(edge_state);
        let edge = async {
            match edge_tls {
                Some(tls) => {
                    axum::serve(tls.listen(edge_listener)?, edge_router)
                        .with_graceful_shutdown(stopped(stop_rx))
                        .await
                }
                None => {
                    axum::serve(edge_listener, edge_router)
                        .with_graceful_shutdown(stopped(stop_rx))
                        .await
                }
            }
        };
        let dashboard = async {
            match dashboard {
                Some(d) => d.await,
                None => Ok(()),
            }
        };
        tokio::try_join!(async { api.await }, edge, dashboard)?;
        anyhow::Ok(())
    })?;
    // Requests are drained: replication, the scanner and the list watcher stop, the click
    // processor flushes what it read and stops.
    if let Some(p) = &peers {
        p.stop();
    }
    if let Some((stop, thread)) = follower {
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if thread.join().is_err() {
            tracing::error!("the shared-state follower panicked");
        }
    }
    safety.stop();
    if let Some((handle, thread, archiving)) = clicks {
        handle.stop();
        if thread.join().is_err() {
            tracing::error!("the click processor panicked");
        }
        if let Some((archive, thread)) = archiving {
            archive.stop();
            if thread.join().is_err() {
                tracing::error!("the archive consumer panicked");
            }
        }
    }
    // Hand the unused counter block back.
    store.shutdown()?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// Popular links for an offline hot-set build: from ClickHouse, or the rollups in
/// `DATA_DIR/clicks/rollups.redb` when there is one and no server holds it; none otherwise
/// (said on stderr).
fn offline_popular(
    store: &StoreArgs,
    rollups: &lasthop_control::clicks::StoreLocation,
    hot: &HotSet,
) -> Vec<(String, u64)> {
    use lasthop_control::clicks::{day::Day, store::RollupStore, StoreLocation};
    let clicks_dir = store.data_dir.as_ref().map(|d| d.join("clicks"));
    let clicks_dir = match (rollups, clicks_dir) {
        (StoreLocation::ClickHouse(_), dir) => dir.unwrap_or_default(),
        (StoreLocation::Embedded, Some(dir)) if dir.join("rollups.redb").exists() => dir,
        (StoreLocation::Embedded, _) => return Vec::new(),
    };
    let today = Day::today();
    let n = usize::try_from(hot.max_links).unwrap_or(usize::MAX);
    match RollupStore::open_at(rollups, &clicks_dir).and_then(|r| {
        r.top_codes(
            today.minus(lasthop_control::snapshot::POPULAR_DAYS - 1),
            today,
            n,
        )
    }) {
        Ok(top) => top,
        Err(e) => {
            eprintln!("no popular links ({e}); the recent ones alone");
            Vec::new()
        }
    }
}

/// On a shared store, keeps this control plane's caches of what the others change: owners'
/// records (suspensions and flags, reloaded as soon as their `NOTIFY` is heard) and the engines
/// that report elsewhere (every two seconds).
fn follow_shared(
    shared: Arc<dyn lasthop_control::store::Shared>,
    safety: Arc<lasthop_control::safety::Safety>,
    fleet: Arc<Fleet>,
) -> anyhow::Result<(
    Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<()>,
)> {
    use lasthop_control::store::News;
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("shared".into())
            .spawn(move || {
                let mut owners = shared.generation(News::Owners);
                let mut fleet_at = std::time::Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    let now = shared.generation(News::Owners);
                    if now != owners {
                        match safety.reload_owners() {
                            Ok(()) => owners = now,
                            Err(e) => tracing::warn!(error = %e, "reloading owners' records"),
                        }
                    }
                    if fleet_at.elapsed() >= Duration::from_secs(2) {
                        fleet_at = std::time::Instant::now();
                        if let Err(e) = fleet.refresh(lasthop_control::clock::now_ms()) {
                            tracing::warn!(error = %e, "reading the shared fleet");
                        }
                    }
                }
            })?
    };
    Ok((stop, thread))
}

/// Trust and safety's running parts.
/// The API keys: the shared store keeps them (every control plane sees a change at once);
/// beside the embedded store they are the data directory's file. `warn`: say so when a keys
/// file is left beside a shared store.
fn open_keys(
    args: &ServeArgs,
    store: &Arc<dyn lasthop_control::store::Store>,
    warn: bool,
) -> anyhow::Result<ApiKeys> {
    Ok(match Arc::clone(store).key_store() {
        Some(shared) => {
            let file = args.data_dir.join(lasthop_control::auth::KEYS_FILE);
            if warn && file.exists() {
                tracing::warn!(
                    "{} is not read with a shared store: its keys live in the store \
                     (`lasthop-control import` moves them, or create new ones with --store)",
                    file.display()
                );
            }
            ApiKeys::from_key_store(shared)?
        }
        None => ApiKeys::open(&args.data_dir),
    })
}

struct RunningSafety {
    safety: Arc<lasthop_control::safety::Safety>,
    /// SIGHUP sends here: the list watcher re-reads every list.
    reload: std::sync::mpsc::Sender<()>,
    watcher: std::thread::JoinHandle<()>,
    scanner: Option<RunningScanner>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// The scanner: this process's, or on a shared store the one the leader lock elects.
enum RunningScanner {
    Local(lasthop_control::safety::scanner::ScannerThreads),
    Leading(lasthop_control::safety::scanner::LeadingScanner),
}

impl RunningSafety {
    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.reload.send(());
        if self.watcher.join().is_err() {
            tracing::error!("the list watcher panicked");
        }
        match self.scanner {
            Some(RunningScanner::Local(s)) => s.stop(),
            Some(RunningScanner::Leading(s)) => s.stop(),
            None => {}
        }
    }
}

/// Loads the reputation lists, starts the list watcher (polls, SIGHUP, time-bomb takedowns)
/// and the scanner.
fn start_safety(
    args: &ServeArgs,
    store: Arc<dyn Store>,
    metrics: &Metrics,
) -> anyhow::Result<RunningSafety> {
    use lasthop_control::safety::scanner::{LeadingScanner, Scanner, ScannerConfig, WebhookConfig};
    use lasthop_control::safety::{enforce, ListSet, Safety, SafetyConfig};
    let a = &args.safety;
    let lists = ListSet::load(&a.reputation_lists, metrics.clone())?;
    let extra_shorteners = a
        .shortener_list
        .as_ref()
        .map(|p| std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display())))
        .transpose()?;
    if let Some(url) = &a.scan_webhook {
        let parsed = url::Url::parse(url).with_context(|| format!("--scan-webhook {url:?}"))?;
        anyhow::ensure!(
            matches!(parsed.scheme(), "http" | "https"),
            "--scan-webhook must be an http or https URL"
        );
    }
    let config = SafetyConfig {
        allow_shortener_chains: a.allow_shortener_chains,
        extra_shorteners,
        short_base: args.short_base.clone(),
        hold_unverified: a.hold_unverified,
        velocity_domains_per_hour: a.velocity_domains_per_hour,
        scan: a.scanner == Toggle::On,
    };
    anyhow::ensure!(
        !(a.hold_unverified && a.scanner == Toggle::Off),
        "--hold-unverified needs the scanner (--scanner on): nothing would ever release the holds"
    );
    let safety = Arc::new(
        Safety::new(Arc::clone(&store), lists, config, metrics.clone())
            .context("reading owners' trust records")?,
    );
    let scanner = match a.scanner {
        Toggle::Off => None,
        Toggle::On => {
            let config = ScannerConfig {
                webhook: a.scan_webhook.clone().map(|url| WebhookConfig {
                    url,
                    timeout: Duration::from_millis(a.scan_webhook_timeout_ms.max(1)),
                    retries: a.scan_webhook_retries,
                    concurrency: a.scan_webhook_concurrency.max(1),
                }),
                rescan_interval: a.rescan_interval,
                rescan_max_rate: a.rescan_max_rate,
            };
            // One scanner per store: on a shared one the leader lock picks the control plane.
            Some(match Arc::clone(&store).shared() {
                Some(shared) => RunningScanner::Leading(LeadingScanner::spawn(
                    Arc::clone(&safety),
                    config,
                    shared,
                )?),
                None => RunningScanner::Local(Scanner::spawn(Arc::clone(&safety), config)?),
            })
        }
    };
    let (reload, reloads) = std::sync::mpsc::channel::<()>();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let poll = Duration::from_secs(a.reputation_poll_secs.clamp(1, 10));
    let watcher = {
        let (safety, stop) = (Arc::clone(&safety), Arc::clone(&stop));
        std::thread::Builder::new()
            .name("lists".into())
            .spawn(move || enforce::watch_lists(&safety, &reloads, poll, &stop))?
    };
    Ok(RunningSafety {
        safety,
        reload,
        watcher,
        scanner,
        stop,
    })
}

/// SIGHUP: re-read the config file and the reputation lists now.
async fn reload_on_sighup(
    mut hup: tokio::signal::unix::Signal,
    reload: std::sync::mpsc::Sender<()>,
    mut config: ConfigReload,
) {
    let mut lists = true;
    while hup.recv().await.is_some() {
        notify(&[sd_notify::NotifyState::Reloading]);
        config.reread();
        if lists {
            tracing::info!("SIGHUP: re-reading the reputation lists");
            // The list watcher has stopped (the server is stopping): the config is still read.
            lists = reload.send(()).is_ok();
        }
        notify(&[sd_notify::NotifyState::Ready]);
    }
}
