//! The engine's flags (each with its environment variable where operators set one), parsed by
//! clap into [`Args`].

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{ArgAction, Parser, ValueEnum};
use lasthop_core::feed::valid_name;
use lasthop_engine::control;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Io {
    /// io_uring where the kernel allows it, else epoll; with `--xdp-interface`, AF_XDP first.
    Auto,
    Uring,
    Epoll,
    /// AF_XDP kernel bypass on `--xdp-interface` (root, or CAP_NET_ADMIN and CAP_BPF): a
    /// userspace TCP serves `--listen`'s address (IPv4 or IPv6) and port, and `--tls-listen`'s
    /// port on the same address, as they arrive on the interface; connections from this host
    /// itself (which never cross it) are refused.
    Xdp,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum SnapshotMemory {
    /// Copied into transparent-huge-page memory.
    Huge,
    /// The file mapped in place.
    Map,
}

/// A switch given as `on` or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum SafeMode {
    Confirm,
    Off,
}

/// An `--alt-svc` value: printable ASCII (it goes on the wire as it is).
fn alt_svc_value(v: &str) -> Result<String, String> {
    if v.is_empty() || !v.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err("printable ASCII, e.g. h3=\":443\"; ma=86400, or off".into());
    }
    Ok(v.to_string())
}

/// The `Alt-Svc` line for answers over TLS: `value` as given (none for `off`), else, when QUIC
/// is served on `quic_port`, HTTP/3 there for a day.
pub(crate) fn alt_svc_header(value: Option<&str>, quic_port: Option<u16>) -> Vec<u8> {
    match (value, quic_port) {
        (Some("off"), _) | (None, None) => Vec::new(),
        (Some(v), _) => format!("Alt-Svc: {v}\r\n").into_bytes(),
        (None, Some(port)) => format!("Alt-Svc: h3=\":{port}\"; ma=86400\r\n").into_bytes(),
    }
}

/// The `Strict-Transport-Security` line for HTTPS answers (empty when `max_age` is 0).
pub(crate) fn hsts_header(max_age: u64, preload: bool) -> Vec<u8> {
    if max_age == 0 {
        return Vec::new();
    }
    let tail = if preload {
        "; includeSubDomains; preload"
    } else {
        ""
    };
    format!("Strict-Transport-Security: max-age={max_age}{tail}\r\n").into_bytes()
}

/// `hostname:port` of the redirect listener.
pub(crate) fn default_engine_id(listen: SocketAddr) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| valid_name(h))
        .unwrap_or_else(|| "engine".into());
    format!("{host}:{}", listen.port())
}

#[derive(Parser, Debug)]
#[command(
    name = "lasthop-engine",
    version,
    about = "lasthop edge redirect server"
)]
pub(crate) struct Args {
    /// Snapshot file to serve (SIGHUP re-opens this path and swaps it in). Optional with
    /// `--control`: the engine then starts from the newest verified snapshot in `--data-dir`,
    /// or downloads the control plane's newest.
    #[arg(long, env = "LASTHOP_SNAPSHOT")]
    pub(crate) snapshot: Option<PathBuf>,
    /// Permutation key file (the control plane's; never sent over the network).
    #[arg(long, env = "LASTHOP_KEY_FILE", required_unless_present = "generate")]
    pub(crate) key_file: Option<PathBuf>,
    /// Redirect listener.
    #[arg(long, env = "LASTHOP_LISTEN", default_value = "0.0.0.0:8080")]
    pub(crate) listen: SocketAddr,
    /// Admin listener: /metrics, /healthz, /readyz, /debug/top.
    #[arg(long, env = "LASTHOP_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    pub(crate) admin_listen: SocketAddr,
    /// A control plane's edge listener (`https://host:port`, or `http://` for loopback
    /// development): the feed (new links, state
    /// changes, snapshots), origin read-through on misses, and status reports. Repeat it (or
    /// give a comma-separated list) for control planes sharing one store: the engine uses the
    /// first that answers, stays on it while it works, and fails over to the next when it
    /// fails (round-robin, backing off after a full round).
    #[arg(
        long,
        env = "LASTHOP_CONTROL",
        action = ArgAction::Append,
        value_delimiter = ',',
        value_parser = parse_control_url
    )]
    pub(crate) control: Vec<String>,
    /// Most distinct codes the origin read-through queues or fetches at once; past it a warm
    /// code sheds the newest queued cold one and a cold one is answered 503 (`perf/herd.sh`
    /// sets it low to stand in for a slow origin).
    #[arg(long, env = "LASTHOP_ORIGIN_MAX_PENDING", default_value_t = lasthop_engine::origin::MAX_PENDING)]
    pub(crate) origin_max_pending: usize,
    /// File holding the control plane's edge token (its `DATA_DIR/edge.token`).
    #[arg(long, env = "LASTHOP_EDGE_TOKEN_FILE")]
    pub(crate) edge_token_file: Option<PathBuf>,
    /// Verify `https://` control planes against the CA certificates in this PEM file (and
    /// nothing else). Without it, `https://` is verified against the public web PKI.
    #[arg(long, env = "LASTHOP_CONTROL_CA")]
    pub(crate) control_ca: Option<PathBuf>,
    /// This engine's client certificate (PEM, leaf first) for control planes that require
    /// mutual TLS (`--edge-client-ca`); with `--control-client-key` and `--control-ca`.
    #[arg(
        long,
        env = "LASTHOP_CONTROL_CLIENT_CERT",
        requires_all = ["control_client_key", "control_ca"]
    )]
    pub(crate) control_client_cert: Option<PathBuf>,
    /// The private key of `--control-client-cert` (PEM).
    #[arg(
        long,
        env = "LASTHOP_CONTROL_CLIENT_KEY",
        requires = "control_client_cert"
    )]
    pub(crate) control_client_key: Option<PathBuf>,
    /// Accept only snapshots whose announcement is signed by this key (a file holding the 64
    /// hex digits `lasthop-control keygen --signing` prints). Repeat it to accept several while
    /// keys rotate. A snapshot that fails is refused, counted, and the one served is kept.
    #[arg(long, env = "LASTHOP_SNAPSHOT_VERIFY_KEY", action = ArgAction::Append, value_delimiter = ',')]
    pub(crate) snapshot_verify_key: Vec<PathBuf>,
    /// The engine's state: downloaded snapshots (`DIR/snapshots/`), the visitor key and the
    /// click spool. Default: systemd's `$STATE_DIRECTORY` when it sets one, else
    /// `/var/lib/lasthop/engine`.
    #[arg(long, env = "LASTHOP_ENGINE_DATA_DIR", default_value_os_t = default_data_dir())]
    pub(crate) data_dir: PathBuf,
    /// This engine's id in status reports (default: hostname:port).
    #[arg(long, env = "LASTHOP_ENGINE_ID")]
    pub(crate) engine_id: Option<String>,
    /// This engine's PoP name in status reports.
    #[arg(long, env = "LASTHOP_POP", default_value = "default")]
    pub(crate) pop: String,
    /// Silence on the feed after which it counts as lost (heartbeats come every second).
    #[arg(long, default_value_t = 3000)]
    pub(crate) feed_timeout_ms: u64,
    /// While the feed is lost or catching up: `confirm` each redirect's state at the origin
    /// first (served from local tables, and counted, when the origin is unreachable too), or
    /// `off` to serve local tables as they are.
    #[arg(long, value_enum, default_value = "confirm")]
    pub(crate) safe_mode: SafeMode,
    /// Serving cores (default: every CPU this process may run on).
    #[arg(long, env = "LASTHOP_CORES")]
    pub(crate) cores: Option<usize>,
    /// CPUs to pin the cores to, comma separated (default 0..cores).
    #[arg(long, env = "LASTHOP_CPUS", value_delimiter = ',')]
    pub(crate) cpus: Vec<usize>,
    /// Where the snapshot lives: `map` maps the file itself (zero-copy, page cache shared);
    /// `huge` reads it into anonymous memory backed by transparent huge pages (fewer TLB misses
    /// in principle; no gain measured on the development VM, see engine/DESIGN.md).
    #[arg(long, value_enum, default_value = "map")]
    pub(crate) snapshot_memory: SnapshotMemory,
    /// Socket backend.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) io: Io,
    /// The interface `--io xdp` serves on: the engine attaches its XDP program there and binds
    /// one AF_XDP socket per serving core to one of its RX queues.
    #[arg(long, env = "LASTHOP_XDP_INTERFACE")]
    pub(crate) xdp_interface: Option<String>,
    /// The interface's RX queues, one per serving core, comma separated (default 0..cores).
    #[arg(long, env = "LASTHOP_XDP_QUEUES", value_delimiter = ',')]
    // Parsed in every build (the CLI does not change with the features), read by AF_XDP only.
    #[cfg_attr(not(feature = "xdp"), allow(dead_code))]
    pub(crate) xdp_queues: Vec<u32>,
    /// Benchmark floor: answer every request with one fixed 302, no lookup.
    #[arg(long)]
    pub(crate) fixed_response: bool,
    /// Close connections idle this many seconds.
    #[arg(long, default_value_t = 60)]
    pub(crate) idle_timeout: u64,
    /// Close connections that take longer than this to send a request head (slowloris).
    #[arg(long, default_value_t = 10)]
    pub(crate) header_timeout: u64,
    /// Most connections per core.
    #[arg(long, default_value_t = 16_384)]
    pub(crate) max_conns_per_core: u32,
    /// Count one redirect in N in the `/debug/top` sketch (its counts are scaled back up). The
    /// sketch's update is the request path's dearest step after the lookup when traffic is
    /// spread thin; a hot code is hot in any sample.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub(crate) top_sample: u64,
    /// HTTPS listener (TLS 1.3 and 1.2, ALPN `--alpn`); needs `--cert` and `--key`. The plain
    /// listener stays up for health checks and the HTTP→HTTPS hop.
    #[arg(long, env = "LASTHOP_TLS_LISTEN", requires_all = ["cert", "key"])]
    pub(crate) tls_listen: Option<SocketAddr>,
    /// Certificate chain (PEM), leaf first. Re-read on SIGHUP.
    #[arg(long, env = "LASTHOP_TLS_CERT")]
    pub(crate) cert: Option<PathBuf>,
    /// Private key (PEM: ECDSA P-256, Ed25519 or RSA). Re-read on SIGHUP.
    #[arg(long, env = "LASTHOP_TLS_KEY")]
    pub(crate) key: Option<PathBuf>,
    /// 32+ random bytes (hex or raw) from which session-ticket keys derive, so every process
    /// holding the file resumes the others' sessions (default: keys of this process only).
    #[arg(long, env = "LASTHOP_TLS_TICKET_KEY_FILE")]
    pub(crate) tls_ticket_key_file: Option<PathBuf>,
    /// Ticket key rotation period in seconds (tickets of the previous period still resume).
    #[arg(long, default_value_t = 3600)]
    pub(crate) tls_ticket_lifetime_secs: u64,
    /// Most 0-RTT early-data bytes accepted per connection (0: no 0-RTT).
    #[arg(long, default_value_t = 16_384)]
    pub(crate) tls_max_early_data: u32,
    /// Answer GET and HEAD that arrive in 0-RTT early data at once, in the server's first
    /// flight (0.5-RTT data), so a returning visitor's redirect costs one round trip after the
    /// TCP handshake; `off` holds the answer until the client's Finished, a round trip later.
    /// Any other method in early data gets 425 Too Early either way.
    #[arg(long, value_enum, default_value = "on")]
    pub(crate) tls_early_answer: OnOff,
    /// HTTP/3 over QUIC v1 on this UDP address (default: `--tls-listen`'s address and port, over
    /// UDP). The same certificate and key; TLS 1.3 only, ALPN `h3`, 0-RTT as on TCP.
    #[arg(long, env = "LASTHOP_QUIC_LISTEN", requires_all = ["cert", "key"])]
    pub(crate) quic_listen: Option<SocketAddr>,
    /// Serve no QUIC (HTTP/3), not even on `--tls-listen`'s port.
    #[arg(long, conflicts_with = "quic_listen")]
    pub(crate) no_quic: bool,
    /// When a new QUIC connection must first prove its address with a Retry (RFC 9000 §8.1.2):
    /// `auto` once this core has more than `--quic-retry-threshold` handshakes in flight,
    /// `always`, or `never`.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) quic_retry: lasthop_engine::quic::RetryMode,
    /// Handshakes in flight on one core past which `--quic-retry auto` sends Retries.
    #[arg(long, default_value_t = 1000)]
    pub(crate) quic_retry_threshold: usize,
    /// Bytes one QUIC connection may send before the engine has read them: its flow-control
    /// window (initial_max_data, and per stream), which a resuming client remembers, so also
    /// the most it may send in 0-RTT.
    #[arg(long, default_value_t = 65_536, value_parser = clap::value_parser!(u64).range(1200..=(1 << 30)))]
    pub(crate) quic_max_early_buffer: u64,
    /// Bytes of 0-RTT one core holds for its handshakes in flight; past it, datagrams of
    /// 0-RTT packets alone are dropped (their data comes again in 1-RTT).
    #[arg(long, default_value_t = 16 << 20)]
    pub(crate) quic_max_early_buffer_total: u64,
    /// Most concurrent requests (bidirectional streams) per QUIC connection.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) quic_max_streams: u64,
    /// Close QUIC connections idle this many seconds (default: `--idle-timeout`).
    #[arg(long)]
    pub(crate) quic_idle_timeout: Option<u64>,
    /// The protocols offered in ALPN on `--tls-listen`, in order of preference: `h2` and
    /// `http/1.1` (`--alpn http/1.1` turns HTTP/2 off on TLS).
    #[arg(long, value_delimiter = ',', default_value = "h2,http/1.1", value_parser = ["h2", "http/1.1"])]
    pub(crate) alpn: Vec<String>,
    /// The key exchange groups offered on `--tls-listen`: `X25519MLKEM768` (the post-quantum
    /// hybrid), `X25519`, `secp256r1`, `secp384r1`. The client's preference picks among them.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "X25519MLKEM768,X25519,secp256r1,secp384r1"
    )]
    pub(crate) tls_groups: Vec<lasthop_engine::tls::config::KxGroup>,
    /// Send the certificate chain uncompressed even to clients that ask for RFC 8879
    /// compression (brotli or zlib, on by default).
    #[arg(long)]
    pub(crate) no_tls_cert_compression: bool,
    /// Refuse HTTP/2 with prior knowledge (h2c) on the plain listener: a connection that opens
    /// with the HTTP/2 preface is then read as HTTP/1 (and refused).
    #[arg(long)]
    pub(crate) no_h2c: bool,
    /// HTTP/2: most concurrent streams per connection (SETTINGS_MAX_CONCURRENT_STREAMS).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) h2_max_concurrent_streams: u32,
    /// HTTP/2: largest header list, name + value + 32 per field (SETTINGS_MAX_HEADER_LIST_SIZE),
    /// enforced while decoding; also the most a header block may take encoded.
    #[arg(long, default_value_t = 16_384, value_parser = clap::value_parser!(u32).range(1024..))]
    pub(crate) h2_max_header_list_size: u32,
    /// HTTP/2: most header fields in one request.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(8..))]
    pub(crate) h2_max_header_fields: u32,
    /// HTTP/2: RST_STREAM frames a client may send per connection in 10 s before GOAWAY
    /// ENHANCE_YOUR_CALM (Rapid Reset, CVE-2023-44487).
    #[arg(long, default_value_t = 200)]
    pub(crate) h2_max_client_resets: u32,
    /// HTTP/2: RST_STREAM frames we may send on one connection before GOAWAY ENHANCE_YOUR_CALM
    /// (MadeYouReset, CVE-2025-8671).
    #[arg(long, default_value_t = 1024)]
    pub(crate) h2_max_local_resets: u32,
    /// `Strict-Transport-Security` max-age on HTTPS answers (0: no header).
    #[arg(long, default_value_t = 31_536_000)]
    pub(crate) hsts_max_age: u64,
    /// Add `includeSubDomains; preload` to the HSTS header.
    #[arg(long)]
    pub(crate) hsts_preload: bool,
    /// The `Alt-Svc` field every answer over TLS carries, so a browser that came over TCP
    /// tries HTTP/3 next (RFC 7838). Default, when QUIC is served: `h3=":PORT"; ma=86400` with
    /// the QUIC port; `off` sends none.
    #[arg(long, value_parser = alt_svc_value)]
    pub(crate) alt_svc: Option<String>,
    /// Answer every request on the plain listener with a 301 to the same target on the HTTPS
    /// listener (`https://HOST[:port]/...`), as HSTS preload requires. Needs `--tls-listen`.
    #[arg(long, requires = "tls_listen")]
    pub(crate) redirect_http_to_https: bool,
    /// The control plane API's public address (or its `/v1/reports` URL): the preview and
    /// interstitial pages then carry a "report this link" form posting there. No form without.
    #[arg(long, env = "LASTHOP_REPORT_URL")]
    pub(crate) report_url: Option<String>,
    /// Drop TLS handshakes not finished in this many milliseconds.
    #[arg(long, default_value_t = 10_000)]
    pub(crate) tls_handshake_timeout_ms: u64,
    /// Serve TLS through userspace rustls even where the kernel offers kTLS.
    #[arg(long)]
    pub(crate) no_ktls: bool,
    /// Most TLS handshakes in flight per core; connections past it are closed at accept.
    #[arg(long, default_value_t = 1024)]
    pub(crate) tls_max_handshakes_per_core: usize,
    /// Seconds to wait for open connections on SIGTERM.
    #[arg(long, default_value_t = 5)]
    pub(crate) drain_timeout: u64,
    /// Where click events go: `spool` (segment files in `--click-spool`, read by the control
    /// plane's processor on the same host), `kafka` (`--click-kafka`), or `off`.
    #[arg(long, value_enum, env = "LASTHOP_CLICKS", default_value = "spool")]
    pub(crate) clicks: ClicksSink,
    /// The click spool directory (default `DATA_DIR/clicks/spool`).
    #[arg(long, env = "LASTHOP_CLICK_SPOOL")]
    pub(crate) click_spool: Option<PathBuf>,
    /// Stop writing (drop and count) while the spool holds more than this many MiB.
    #[arg(long, default_value_t = 2048)]
    pub(crate) click_spool_max_mib: u64,
    // The Kafka sink's flags, to `click_kafka_timeout_ms`: parsed in every build (the CLI does
    // not change with the features), read with the `kafka` feature only.
    /// Kafka bootstrap servers for `--clicks kafka`.
    #[arg(long, env = "LASTHOP_CLICK_KAFKA")]
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) click_kafka: Option<String>,
    /// The click topic (messages keyed by link key: the code, or `domain/code`).
    #[arg(long, env = "LASTHOP_CLICK_TOPIC", default_value = "lasthop.clicks")]
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) click_topic: String,
    /// Extra librdkafka producer property, `key=value` (repeatable: security, tuning).
    #[arg(long = "click-kafka-option", value_parser = parse_kv)]
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) click_kafka_options: Vec<(String, String)>,
    /// Clicks queued for Kafka (broker slow or down) before new ones are dropped.
    #[arg(long, default_value_t = 500_000)]
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) click_kafka_queue: u32,
    /// Clicks not delivered to Kafka within this many milliseconds are dropped (and counted).
    #[arg(long, default_value_t = 30_000)]
    #[cfg_attr(not(feature = "kafka"), allow(dead_code))]
    pub(crate) click_kafka_timeout_ms: u64,
    /// Bytes of click events each core may hold between flushes (KiB).
    #[arg(long, default_value_t = 4096)]
    pub(crate) click_buffer_kib: usize,
    /// How often the cores' click buffers go to the sink.
    #[arg(long, default_value_t = 100)]
    pub(crate) click_flush_ms: u64,
    /// Secret (32+ bytes, hex or raw) from which the daily visitor salt derives; give every
    /// engine of a fleet the same file, and keep it off the control-plane host (with it, an
    /// archived event's address can be recovered). Created, random, if missing. Default
    /// `DATA_DIR/visitor.key`.
    #[arg(long, env = "LASTHOP_VISITOR_KEY_FILE")]
    pub(crate) visitor_key_file: Option<PathBuf>,
    /// A MaxMind-format country (or city) database for click countries.
    #[arg(long, env = "LASTHOP_GEOIP_DB")]
    pub(crate) geoip_db: Option<PathBuf>,
    /// A request header a trusted upstream sets to the client's country (e.g. `CF-IPCountry`);
    /// it wins over `--geoip-db`. Only set this behind a proxy that overwrites the header.
    #[arg(long, env = "LASTHOP_COUNTRY_HEADER")]
    pub(crate) country_header: Option<String>,
    /// A config file (TOML) whose keys are these flags' long names (`listen = "0.0.0.0:80"`,
    /// `cpus = [0, 1]`); flags and environment variables override it. SIGHUP re-reads it,
    /// applies what can change live and logs what needs a restart.
    #[arg(long, env = "LASTHOP_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// Check the configuration (flags, environment, config file, and the key, certificate,
    /// snapshot and token files it names) and exit: 0 when the engine would start with it.
    #[arg(long)]
    pub(crate) check_config: bool,
    /// Write the man page, shell completions and example config into this directory and
    /// exit (`scripts/package`).
    #[arg(long, hide = true, value_name = "DIR")]
    pub(crate) generate: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum ClicksSink {
    Spool,
    Kafka,
    Off,
}

/// `--data-dir`'s default: never relative to wherever the engine was started.
fn default_data_dir() -> PathBuf {
    std::env::var_os("STATE_DIRECTORY")
        // systemd may list several, colon-separated: the first is the unit's own.
        .and_then(|dirs| {
            std::env::split_paths(&dirs)
                .next()
                .filter(|p| p.is_absolute())
        })
        .unwrap_or_else(|| PathBuf::from("/var/lib/lasthop/engine"))
}

pub(crate) fn parse_control_url(s: &str) -> Result<String, String> {
    control::parse_url(s).map_err(|e| e.to_string())
}

pub(crate) fn parse_kv(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("expected key=value, got {s:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(extra: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(["lasthop-engine", "--key-file", "k"].iter().chain(extra))
    }

    #[test]
    fn the_flags_hold_together() {
        Args::command().debug_assert();
    }

    #[test]
    fn control_may_be_repeated_and_may_be_a_list() {
        let a = parse(&[
            "--control",
            "http://a:1/",
            "--control",
            "http://b:2,http://c:3",
        ])
        .unwrap();
        assert_eq!(a.control, ["http://a:1", "http://b:2", "http://c:3"]);
        if std::env::var_os("LASTHOP_CONTROL").is_none() {
            assert!(parse(&[]).unwrap().control.is_empty());
        }
        // Each URL is checked, wherever it stands in the list.
        assert_eq!(
            parse(&["--control", "https://a:1/"]).unwrap().control,
            ["https://a:1"]
        );
        for bad in ["ftp://a:1", "http://a:1,b:2", "http://a:1,", "http://"] {
            assert!(parse(&["--control", bad]).is_err(), "{bad}");
        }
    }
}
