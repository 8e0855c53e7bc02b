//! Start, run and drain: what the engine does with its [`Args`], from loading the key and the
//! snapshot to the last core's drain. [`run`] is the sequence of phases, each a function below
//! in the same order that says what it establishes; `docs/ARCHITECTURE.md`, "The edge engine",
//! has the threads they start.

use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use lasthop_cli::bootstrap::{notify, NotifyState};
use lasthop_core::feed::valid_name;
use lasthop_core::HighWater;
use lasthop_core::{CodeScheme, PermutationKey};
use lasthop_engine::admin::{spawn_admin, AdminState};
use lasthop_engine::clicks::{self, spool};
use lasthop_engine::control::ControlPlanes;
use lasthop_engine::feed::{self, FeedConfig, FeedStats, LoadFn};
use lasthop_engine::http::Limits;
use lasthop_engine::io::signals::{self, Signal};
use lasthop_engine::io::uring::{self, TlsListen, UringConfig};
#[cfg(feature = "xdp")]
use lasthop_engine::io::xdp::{run::XdpCore, Attachment, Program, XskMap};
use lasthop_engine::metrics::EngineMetrics;
use lasthop_engine::origin::{Origin, OriginConfig, OriginInbox};
use lasthop_engine::serve::{self, Backend, CoreConfig, CoreStart, QuicStart, Shared};
use lasthop_engine::tables::Tables;
use lasthop_engine::tls::{self, TlsSettings};
use lasthop_engine::topk::TopK;
use lasthop_snapshot::Snapshot;

use crate::config::{
    alt_svc_header, default_engine_id, hsts_header, Args, ClicksSink, Io, OnOff, SafeMode,
    SnapshotMemory,
};

/// What `--engine-id` and `--pop` may be.
const NAMES_RULE: &str = "--engine-id and --pop must be 1-64 characters of [A-Za-z0-9._:-]";

/// The `--snapshot` file, loaded the configured way and verified.
fn open_snapshot(path: &Path, load: LoadFn) -> anyhow::Result<Arc<Snapshot>> {
    let snapshot =
        feed::open_verified(load, path).map_err(|e| anyhow::anyhow!("opening snapshot: {e}"))?;
    Ok(Arc::new(snapshot))
}

/// SIGHUP without the feed: the re-opened `--snapshot` becomes the next tables generation.
fn swap_in(shared: &Shared, metrics: &EngineMetrics, s: Arc<Snapshot>) -> anyhow::Result<()> {
    let current = shared
        .current()
        .ok_or_else(|| anyhow::anyhow!("tables lock poisoned"))?;
    shared.publish(current.with_snapshot(Arc::clone(&s))?);
    metrics
        .snapshot_sequence
        .store(s.sequence(), Ordering::Relaxed);
    metrics.snapshot_links.store(s.links(), Ordering::Relaxed);
    metrics.snapshot_swaps.fetch_add(1, Ordering::Relaxed);
    tracing::info!(
        links = s.links(),
        sequence = s.sequence(),
        "SIGHUP: snapshot swapped in"
    );
    Ok(())
}

/// What SIGHUP needs to read the configuration again: the command line the engine started
/// with and the config file as it was last applied.
#[derive(Debug)]
pub(crate) struct Reloads {
    pub(crate) argv: Vec<std::ffi::OsString>,
    pub(crate) file: Option<lasthop_cli::FileConfig>,
}

/// Config keys whose new values a SIGHUP applies: the files it re-reads anyway. Every other
/// changed key is logged as needing a restart (listeners, cores and buffers are set up once).
const LIVE_KEYS: &[&str] = &["cert", "key", "snapshot"];

impl Reloads {
    /// Re-reads the config file under the same command line: the new arguments when it
    /// changed and is valid, after logging which changes apply now and which need a
    /// restart. A bad file changes nothing (logged).
    fn reread(&mut self) -> Option<Args> {
        let running = self.file.as_ref()?;
        let (args, file) = match lasthop_cli::parse::<Args>(
            <Args as clap::CommandFactory>::command(),
            self.argv.clone(),
        ) {
            Ok((args, Some(file))) => (args, file),
            Ok((_, None)) => return None,
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: keeping the running configuration");
                return None;
            }
        };
        let changed = running.changed_keys(&file);
        if changed.is_empty() {
            return None;
        }
        let (live, restart): (Vec<&String>, Vec<&String>) = changed
            .iter()
            .partition(|k| LIVE_KEYS.contains(&k.as_str()));
        if !live.is_empty() {
            tracing::info!(keys = ?live, "SIGHUP: configuration changes applied");
        }
        if !restart.is_empty() {
            tracing::warn!(keys = ?restart, "SIGHUP: configuration changes that need a restart (running with the old values)");
        }
        self.file = Some(file);
        Some(args)
    }
}

/// `--check-config`: what `run` reads before it binds anything, read the same way: the flags
/// this build has the features for, the key file, the snapshot (verified), the TLS certificate
/// and key, the control plane's CA and client certificate, the edge token and the
/// snapshot-signing keys.
pub(crate) fn check(args: &Args) -> anyhow::Result<()> {
    check_features(args)?;
    let key = PermutationKey::load(key_file(args)?)?;
    CodeScheme::new(&key)?;
    if let Some(path) = &args.snapshot {
        let s = open_snapshot(path, snapshot_loader(args.snapshot_memory))?;
        anyhow::ensure!(
            s.key_id() == key.id(),
            "snapshot {} was built under key {:#x}, --key-file is {:#x}",
            path.display(),
            s.key_id(),
            key.id()
        );
    }
    if let Some(settings) = tls_settings(args, false) {
        tls::server_config(&settings)?;
    }
    control_planes(args)?;
    edge_token(args)?;
    feed::SnapshotKeys::load(&args.snapshot_verify_key)?;
    Ok(())
}

/// How `--snapshot-memory` loads a snapshot file.
fn snapshot_loader(memory: SnapshotMemory) -> LoadFn {
    match memory {
        SnapshotMemory::Map => |p| Snapshot::open(p),
        SnapshotMemory::Huge => |p| Snapshot::load(p),
    }
}

/// The TLS settings of the HTTPS listener and of HTTP/3, with `--tls-listen` or `--quic-listen`
/// (clap requires `--cert` and `--key` with the first; `start_quic` says so for the second).
fn tls_settings(args: &Args, ktls: bool) -> Option<TlsSettings> {
    let served = args.tls_listen.is_some() || args.quic_listen.is_some();
    match (served, &args.cert, &args.key) {
        (true, Some(cert), Some(key)) => Some(TlsSettings {
            cert: cert.clone(),
            key: key.clone(),
            ticket_key_file: args.tls_ticket_key_file.clone(),
            ticket_lifetime: Duration::from_secs(args.tls_ticket_lifetime_secs),
            max_early_data: args.tls_max_early_data,
            early_answer: args.tls_early_answer == OnOff::On,
            ktls,
            alpn: args.alpn.iter().map(|p| p.as_bytes().to_vec()).collect(),
            groups: args.tls_groups.clone(),
            cert_compression: !args.no_tls_cert_compression,
            branded: Arc::default(),
        }),
        _ => None,
    }
}

/// The control planes of `--control` (`https://` verified against `--control-ca`, else the
/// public web PKI), or `None` without any.
fn control_planes(args: &Args) -> anyhow::Result<Option<ControlPlanes>> {
    if args.control.is_empty() {
        return Ok(None);
    }
    let roots = match &args.control_ca {
        Some(ca) => lasthop_tls::Roots::CaFile(ca),
        None => lasthop_tls::Roots::WebPki,
    };
    // clap takes a client certificate only with --control-ca.
    let client = args
        .control_client_cert
        .as_deref()
        .zip(args.control_client_key.as_deref());
    let tls = lasthop_tls::client_config(roots, client)?;
    Ok(Some(ControlPlanes::new(&args.control)?.with_tls(tls)))
}

/// The token of `--edge-token-file`, if given.
fn edge_token(args: &Args) -> anyhow::Result<Option<String>> {
    args.edge_token_file
        .as_deref()
        .map(|path| {
            let bytes = lasthop_core::secret::read(path).context("--edge-token-file")?;
            Ok(String::from_utf8_lossy(&bytes).trim().to_string())
        })
        .transpose()
}

/// `--key-file` (clap requires it unless `--generate` is given).
fn key_file(args: &Args) -> anyhow::Result<&Path> {
    args.key_file
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("--key-file is required"))
}

/// Why a flag value is refused in this build (it parses the same in every build).
fn without_feature(feature: &str) -> String {
    format!("this engine was built without the `{feature}` feature")
}

/// Refuses the flag values that need a Cargo feature this build left out: `--io xdp` needs
/// `xdp`, `--clicks kafka` needs `kafka`. The flags themselves are the same in every build, so
/// `--help`, config files and the scripts that pass them do not change with the features.
fn check_features(args: &Args) -> anyhow::Result<()> {
    if matches!(args.io, Io::Xdp) && !cfg!(feature = "xdp") {
        anyhow::bail!("--io xdp: {}", without_feature("xdp"));
    }
    if args.clicks == ClicksSink::Kafka && !cfg!(feature = "kafka") {
        anyhow::bail!("--clicks kafka: {}", without_feature("kafka"));
    }
    Ok(())
}

/// Runs the engine until SIGTERM has drained it (or a core fails): the phases below, in order.
/// Each builds what the next ones are handed; none is filled in later.
pub(crate) fn run(mut args: Args, mut reloads: Reloads) -> anyhow::Result<()> {
    raise_open_file_limit();
    let inputs = read_inputs(&args)?;
    let start = open_tables(&args, &inputs)?;
    let mut cores = plan_cores(&args)?;
    let (services, inboxes) = start_services(&args, &inputs, start.snapshot.as_deref(), &cores)?;
    let (listeners, bound) = serve::listeners(args.listen, cores.count)
        .with_context(|| format!("binding {}", args.listen))?;
    let (mut https, tls_listeners) = start_tls(&args, &cores, &services)?;
    let QuicStarted {
        bound: quic_bound,
        cores: quic,
        group: quic_group,
        shared: quic_shared,
    } = start_quic(&args, &cores, &https, &services)?;
    https.quic = quic_shared;
    let admin = start_admin(&args, &services)?;
    let branded = https.settings.as_ref().map(|s| Arc::clone(&s.branded));
    let publishing = start_feed(
        &args,
        inputs.feed.map(|mut f| {
            f.certificates = branded;
            f
        }),
        start.tables,
        start.snapshot_id,
        bound,
        &services,
    )?;
    let config = core_config(&args, cores.backend, &https, quic_bound, &services)?;
    let sockets = CoreSockets {
        listeners,
        inboxes,
        tls: tls_listeners,
        quic,
    };
    let handles = start_cores(&cores, sockets, &config, &services, &publishing.shared)?;
    let flusher = start_clicks(&args, &services, &publishing.engine_id)?;
    let addrs = Addrs {
        listen: bound,
        tls: https.bound,
        quic: quic_bound,
        admin: admin.addr,
    };
    go_live(
        &mut cores,
        &publishing.shared,
        &admin.state,
        addrs,
        start.snapshot.as_deref(),
    )?;
    serve_until_stop(
        &mut args,
        &mut reloads,
        &mut https,
        inputs.load,
        &publishing,
        &services.metrics,
        &admin.state,
    )?;
    drain(&publishing.shared, handles, config.drain, flusher);
    // Closed once every core has finished (see start_quic).
    drop(quic_group);
    Ok(())
}

/// Lifts the open-file limit to its hard limit (every connection is a descriptor); a limit that
/// stays low is logged, not fatal.
fn raise_open_file_limit() {
    match lasthop_engine::io::socket::raise_nofile_limit() {
        Ok(n) => tracing::debug!(limit = n, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }
}

/// What [`read_inputs`] establishes: the files and flags read and checked, nothing bound or
/// started yet.
struct Inputs {
    scheme: CodeScheme,
    load: LoadFn,
    token: Option<String>,
    controls: Option<Arc<ControlPlanes>>,
    /// The feed's settings, with `--control` (its engine id is named once the port is known).
    feed: Option<FeedConfig>,
}

/// Reads and checks what the flags name, before anything is bound or started: the key (and
/// the code scheme under it), the edge token, the control planes, the snapshot-signing keys
/// and, with `--control`, the feed's settings and the names it reports. Refuses flag values
/// this build has no feature for.
fn read_inputs(args: &Args) -> anyhow::Result<Inputs> {
    check_features(args)?;
    let key = PermutationKey::load(key_file(args)?)?;
    let scheme = CodeScheme::new(&key)?;
    let load = snapshot_loader(args.snapshot_memory);
    let token = edge_token(args)?;
    let controls = control_planes(args)?.map(|c| {
        tracing::info!(control = ?args.control, using = c.url(0),
            "control planes: the first that answers is used, the next on failure");
        for url in c.plain() {
            tracing::warn!(control = url, "plain HTTP to a control plane: the edge token, every destination and every takedown travel in clear (loopback development only; use https:// with --control-ca)");
        }
        Arc::new(c)
    });
    let verify_keys = feed::SnapshotKeys::load(&args.snapshot_verify_key)?;
    if !verify_keys.is_empty() {
        tracing::info!(
            keys = verify_keys.len(),
            "snapshots must be signed by a pinned key"
        );
    }
    let feed = controls.as_ref().map(|control| FeedConfig {
        control: Arc::clone(control),
        token: token.clone(),
        // Named in `start_feed`, once the listener's port is known.
        engine_id: String::new(),
        pop: args.pop.clone(),
        data_dir: args.data_dir.clone(),
        timeout: Duration::from_millis(args.feed_timeout_ms),
        safe_mode: matches!(args.safe_mode, SafeMode::Confirm),
        load,
        verify_keys,
        // Given in `start_feed`, once the TLS settings are made.
        certificates: None,
        origin: None,
    });
    if let Some(cfg) = &feed {
        anyhow::ensure!(
            // A default id (host name and port) is checked once the port is known.
            args.engine_id.as_deref().is_none_or(valid_name) && valid_name(&cfg.pop),
            "{NAMES_RULE}"
        );
    }
    Ok(Inputs {
        scheme,
        load,
        token,
        controls,
        feed,
    })
}

/// What [`open_tables`] establishes: the first tables generation and the snapshot under it.
struct Start {
    snapshot: Option<Arc<Snapshot>>,
    /// Names `snapshot` when it came from the feed (downloaded before, or just now).
    snapshot_id: Option<String>,
    tables: Tables,
}

/// Opens the snapshot to start from (the file given, else the newest verified one downloaded
/// before, else the control plane's newest) and builds the first tables on it; with no
/// snapshot at all, every lookup reads through to the origin.
fn open_tables(args: &Args, inputs: &Inputs) -> anyhow::Result<Start> {
    let load = inputs.load;
    let (snapshot, snapshot_id) = match (&args.snapshot, &inputs.feed) {
        (Some(path), _) => (Some(open_snapshot(path, load)?), None),
        (None, Some(cfg)) => match feed::newest_local(&cfg.data_dir, load) {
            Some((s, id)) => {
                tracing::info!(id = %id, "starting from the newest local snapshot");
                (Some(s), Some(id))
            }
            None => match feed::fetch_latest(cfg) {
                Ok((s, id)) => (Some(s), Some(id)),
                Err(e) => {
                    tracing::warn!(error = %e, "no snapshot yet: serving through the origin until the feed brings one");
                    (None, None)
                }
            },
        },
        (None, None) => anyhow::bail!("--snapshot is required without --control"),
    };
    let scheme = inputs.scheme.clone();
    let tables = match &snapshot {
        Some(s) => Tables::from_snapshot(scheme, Arc::clone(s), inputs.controls.is_some())?,
        // No marks known: let every code through to the origin rather than reject a real one.
        None => Tables::new(scheme, HighWater::new(1, lasthop_core::CODE_SPACE)?, true),
    };
    Ok(Start {
        snapshot,
        snapshot_id,
        tables,
    })
}

/// What [`plan_cores`] establishes: how many serving cores, where, and which loop drives them.
struct Cores {
    count: usize,
    /// The CPU each core is pinned to, by core.
    cpus: Vec<Option<usize>>,
    backend: Backend,
    /// With the AF_XDP backend: its program, loaded here and attached in [`go_live`].
    xdp: Option<XdpSetup>,
}

/// Decides the serving cores (`--cores`, `--cpus`) and their loop: AF_XDP when asked for (or,
/// with `--io auto`, when `--xdp-interface` is given and it loads), else io_uring where the
/// kernel allows it, else epoll.
fn plan_cores(args: &Args) -> anyhow::Result<Cores> {
    let count = args
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let cpus: Vec<Option<usize>> = if args.cpus.is_empty() {
        (0..count).map(Some).collect()
    } else {
        anyhow::ensure!(
            args.cpus.len() >= count,
            "--cpus lists fewer CPUs than --cores"
        );
        args.cpus.iter().copied().map(Some).collect()
    };
    let kernel_backend = || match uring::probe() {
        Ok(()) => Backend::Uring,
        Err(e) => {
            tracing::warn!(error = %e, "io_uring unavailable (io_uring_disabled, seccomp or an old kernel): serving with epoll");
            Backend::Epoll
        }
    };
    let (backend, xdp) = match args.io {
        Io::Xdp => xdp_backend(args, count).context("--io xdp")?,
        Io::Auto if args.xdp_interface.is_some() => {
            xdp_backend(args, count).unwrap_or_else(|e| {
                tracing::warn!(error = %format!("{e:#}"), "AF_XDP unavailable on --xdp-interface: serving through the kernel");
                (kernel_backend(), None)
            })
        }
        Io::Epoll => (Backend::Epoll, None),
        Io::Uring => {
            uring::probe().context("io_uring requested but unavailable")?;
            (Backend::Uring, None)
        }
        Io::Auto => (kernel_backend(), None),
    };
    Ok(Cores {
        count,
        cpus,
        backend,
        xdp,
    })
}

/// What [`start_services`] establishes: what the cores share besides the tables.
struct Services {
    metrics: Arc<EngineMetrics>,
    origin: Option<Arc<Origin>>,
    /// One hot-code sketch per core.
    tops: Vec<Arc<TopK>>,
    /// With `--control`.
    feed_stats: Option<Arc<FeedStats>>,
    /// With `--tls-listen`.
    tls_stats: Option<Arc<tls::TlsStats>>,
    /// When HTTP/3 is served ([`quic_wanted`]).
    quic_stats: Option<Arc<lasthop_engine::quic::QuicStats>>,
    /// The cores' click buffers, unless `--clicks off`.
    clicks: Option<Arc<clicks::Clicks>>,
}

/// Builds the engine's metrics and what they count, starts the origin's fetching threads (with
/// `--control`) and sets up the click buffers (creating the visitor key file if missing).
/// Returns each core's origin inbox beside them, in core order.
fn start_services(
    args: &Args,
    inputs: &Inputs,
    snapshot: Option<&Snapshot>,
    cores: &Cores,
) -> anyhow::Result<(Services, Vec<Option<OriginInbox>>)> {
    let mut metrics = EngineMetrics::new(cores.count, cores.backend.as_str());
    metrics.control = inputs.controls.clone();
    let (origin, inboxes) = match &inputs.controls {
        Some(c) => {
            let cfg = OriginConfig {
                token: inputs.token.clone(),
                max_pending: args.origin_max_pending,
                ..OriginConfig::default()
            };
            let (origin, inboxes) = Origin::start(Arc::clone(c), cfg, cores.count)?;
            metrics.origin = Some(origin.stats());
            (
                Some(Arc::new(origin)),
                inboxes.into_iter().map(Some).collect(),
            )
        }
        None => (None, (0..cores.count).map(|_| None).collect::<Vec<_>>()),
    };
    if let Some(s) = snapshot {
        metrics
            .snapshot_sequence
            .store(s.sequence(), Ordering::Relaxed);
        metrics.snapshot_links.store(s.links(), Ordering::Relaxed);
    } else {
        metrics
            .health
            .snapshot_missing
            .store(true, Ordering::Relaxed);
    }
    let feed_stats = inputs.feed.as_ref().map(|_| Arc::new(FeedStats::default()));
    metrics.feed = feed_stats.clone();
    let tls_stats = args.tls_listen.map(|_| Arc::new(tls::TlsStats::default()));
    metrics.tls = tls_stats.clone();
    let quic_stats = quic_wanted(args, cores.backend)
        .is_ok()
        .then(|| Arc::new(lasthop_engine::quic::QuicStats::default()));
    metrics.quic = quic_stats.clone();
    let clicks = click_buffers(args, cores.count)?;
    metrics.clicks = clicks.clone();
    let services = Services {
        metrics: Arc::new(metrics),
        origin,
        tops: (0..cores.count).map(|_| Arc::new(TopK::new())).collect(),
        feed_stats,
        tls_stats,
        quic_stats,
        clicks,
    };
    Ok((services, inboxes))
}

/// The cores' click buffers, unless `--clicks off` (the sink starts in [`start_clicks`]).
fn click_buffers(args: &Args, cores: usize) -> anyhow::Result<Option<Arc<clicks::Clicks>>> {
    if args.clicks == ClicksSink::Off {
        return Ok(None);
    }
    anyhow::ensure!(
        valid_name(&args.pop),
        "--pop must be 1-64 characters of [A-Za-z0-9._:-] (it is carried in every click)"
    );
    let settings = clicks::ClickSettings {
        pop: args.pop.clone(),
        visitor_key: match &args.visitor_key_file {
            Some(file) => clicks::visitor_key(file)?,
            // The default file: if the data dir cannot hold it, count visitors under a
            // key of this process (clicks are never worth refusing to start over).
            // A file others can read is refused all the same: it is a secret.
            None => match clicks::visitor_key(&args.data_dir.join("visitor.key")) {
                Err(e @ clicks::ClickSetupError::Loose(_)) => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(error = %format!("{e:#}"), "no visitor key file: unique visitors are counted under a key of this process only");
                    clicks::random_visitor_key()?
                }
                Ok(key) => key,
            },
        },
        geo: match &args.geoip_db {
            Some(p) => Some(clicks::Geo::open(p)?),
            None => None,
        },
        // One batch is one spool frame, and readers refuse frames over 16 MiB.
        buffer_bytes: (args.click_buffer_kib.max(4) << 10)
            .min(lasthop_core::click::spool::MAX_FRAME_PAYLOAD),
    };
    Ok(Some(clicks::Clicks::new(cores, settings)))
}

/// What [`start_tls`] establishes, with `--tls-listen`: what SIGHUP reloads, and the port bound.
struct Https {
    /// The certificate and key files and the handshake's settings.
    settings: Option<TlsSettings>,
    /// The configuration new connections get, one for the whole process (so its ticket keys are
    /// shared by every core); SIGHUP swaps it.
    config: Option<Arc<Mutex<Arc<rustls::ServerConfig>>>>,
    /// The names the certificate covers (HTTP/2's 421).
    coverage: Option<Arc<tls::CertCoverage>>,
    bound: Option<SocketAddr>,
    /// HTTP/3's shared configuration, when served: SIGHUP gives it the new certificate too.
    quic: Option<lasthop_engine::quic::QuicShared>,
}

/// With `--tls-listen`: decides kTLS, loads the certificate and key, and binds one
/// SO_REUSEPORT HTTPS listener per core (returned in core order; all `None` without it).
fn start_tls(
    args: &Args,
    cores: &Cores,
    services: &Services,
) -> anyhow::Result<(Https, Vec<Option<TlsListen>>)> {
    let ktls = ktls(args, cores.backend);
    let mut https = Https {
        settings: tls_settings(args, ktls.is_some()),
        config: None,
        coverage: None,
        bound: None,
        quic: None,
    };
    let mut listeners: Vec<Option<TlsListen>> = (0..cores.count).map(|_| None).collect();
    if let (Some(settings), Some(addr), Some(stats)) =
        (&https.settings, args.tls_listen, &services.tls_stats)
    {
        anyhow::ensure!(
            cores.backend.serves_tls(),
            "--tls-listen needs the io_uring or AF_XDP backend (the epoll fallback serves plain HTTP only)"
        );
        let config = tls::server_config(settings).context("loading the TLS certificate and key")?;
        https.coverage = Some(Arc::new(
            tls::CertCoverage::load(&settings.cert).context("loading the TLS certificate")?,
        ));
        stats
            .ktls_available
            .store(ktls.is_some(), Ordering::Relaxed);
        let holder = Arc::new(Mutex::new(config));
        let (ls, b) =
            serve::listeners(addr, cores.count).with_context(|| format!("binding {addr}"))?;
        for (slot, listener) in listeners.iter_mut().zip(ls) {
            *slot = Some(TlsListen {
                listener,
                serve: tls::TlsServe {
                    config: Arc::clone(&holder),
                    stats: Arc::clone(stats),
                    max_handshakes: args.tls_max_handshakes_per_core,
                    handshake_timeout_ms: args.tls_handshake_timeout_ms as i64,
                    ktls,
                },
            });
        }
        https.bound = Some(b);
        https.config = Some(holder);
    }
    Ok((https, listeners))
}

/// Whether HTTP/3 is served: with `--quic-listen`, or `--tls-listen` without `--no-quic`, on
/// the io_uring and epoll backends (the epoll fallback serves no TLS over TCP: there, HTTP/3
/// needs `--quic-listen`). `Err` says why not (logged at start when a listener was asked for).
fn quic_wanted(args: &Args, backend: Backend) -> Result<(), &'static str> {
    if args.no_quic {
        return Err("--no-quic");
    }
    if args.quic_listen.is_none() && args.tls_listen.is_none() {
        return Err("no --tls-listen or --quic-listen");
    }
    if !matches!(backend, Backend::Uring | Backend::Epoll) {
        return Err("QUIC is served on the io_uring and epoll backends (AF_XDP serves none)");
    }
    Ok(())
}

/// What [`start_quic`] set up.
struct QuicStarted {
    /// The UDP address bound, when HTTP/3 is served.
    bound: Option<SocketAddr>,
    /// Each core's socket and the shared configuration.
    cores: Vec<Option<QuicStart>>,
    /// A duplicate of every socket, for the main thread to hold until all cores have finished:
    /// the kernel fills a closed socket's place in a reuseport group with the group's last
    /// socket, which would move the steering program's indexes while other cores still drain.
    group: Vec<OwnedFd>,
    /// What the cores share (SIGHUP's reload goes through it).
    shared: Option<lasthop_engine::quic::QuicShared>,
}

impl QuicStarted {
    fn none(cores: Vec<Option<QuicStart>>) -> QuicStarted {
        QuicStarted {
            bound: None,
            cores,
            group: Vec::new(),
            shared: None,
        }
    }
}

/// With HTTP/3 wanted: one SO_REUSEPORT UDP socket per core (bound in core order, the steering
/// program on the group) on `--quic-listen`, else `--tls-listen`'s address and port; the QUIC
/// configuration every core shares.
fn start_quic(
    args: &Args,
    cores: &Cores,
    https: &Https,
    services: &Services,
) -> anyhow::Result<QuicStarted> {
    let mut sockets: Vec<Option<QuicStart>> = (0..cores.count).map(|_| None).collect();
    if let Err(why) = quic_wanted(args, cores.backend) {
        if args.quic_listen.is_some() || (args.tls_listen.is_some() && !args.no_quic) {
            tracing::warn!(reason = why, "HTTP/3 is not served");
        }
        return Ok(QuicStarted::none(sockets));
    }
    let (Some(settings), Some(stats)) = (&https.settings, &services.quic_stats) else {
        anyhow::bail!("--quic-listen needs --cert and --key");
    };
    let Some(addr) = args.quic_listen.or(https.bound) else {
        return Ok(QuicStarted::none(sockets));
    };
    let tls = tls::config::quic_server_config(settings)
        .context("loading the TLS certificate and key for QUIC")?;
    let idle = args.quic_idle_timeout.unwrap_or(args.idle_timeout);
    let quic_settings = lasthop_engine::quic::QuicSettings {
        retry: args.quic_retry,
        retry_threshold: args.quic_retry_threshold,
        max_early_buffer: args.quic_max_early_buffer,
        max_early_total: args.quic_max_early_buffer_total,
        max_streams: args.quic_max_streams,
        idle_timeout: Duration::from_secs(idle),
        h3: lasthop_engine::h3::H3Limits {
            max_field_section_size: u64::from(args.h2_max_header_list_size),
            max_fields: args.h2_max_header_fields,
        },
    };
    let shared = lasthop_engine::quic::QuicShared::new(tls, quic_settings, Arc::clone(stats))?;
    let first = lasthop_engine::io::udp::reuseport_udp(addr)
        .with_context(|| format!("binding udp {addr}"))?;
    let bound = lasthop_engine::io::socket::local_addr(first.as_raw_fd())?;
    let mut all = vec![first];
    for _ in 1..cores.count {
        all.push(
            lasthop_engine::io::udp::reuseport_udp(bound)
                .with_context(|| format!("binding udp {bound}"))?,
        );
    }
    if let Err(e) = lasthop_engine::io::udp::steer_by_connection_id(all[0].as_raw_fd()) {
        // Without it the kernel's hash still keeps a connection on one core while the
        // client's address and port stay the same; a rebinding client loses its connection.
        tracing::warn!(error = %e, "QUIC packets are steered by the kernel's hash only");
    }
    let group = all
        .iter()
        .map(OwnedFd::try_clone)
        .collect::<std::io::Result<Vec<_>>>()
        .context("duplicating the QUIC sockets")?;
    for (slot, socket) in sockets.iter_mut().zip(all) {
        *slot = Some(QuicStart {
            socket,
            shared: shared.clone(),
        });
    }
    Ok(QuicStarted {
        bound: Some(bound),
        cores: sockets,
        group,
        shared: Some(shared),
    })
}

/// kTLS, probed once with `--tls-listen`: where the kernel takes the TLS ULP, connections are
/// handed to it after their handshake.
fn ktls(args: &Args, backend: Backend) -> Option<tls::KtlsSupport> {
    match (args.tls_listen, args.no_ktls) {
        (None, _) => None,
        (Some(_), _) if !backend.kernel_sockets() => {
            tracing::info!(
                "TLS over AF_XDP stays in userspace rustls (no kernel socket to hand kTLS)"
            );
            None
        }
        (Some(_), true) => {
            tracing::info!("kTLS disabled (--no-ktls): serving TLS through userspace rustls");
            None
        }
        (Some(_), false) => match tls::probe_ktls() {
            Ok(support) => {
                tracing::info!(
                    ?support,
                    "kTLS available: connections go to the kernel after their handshake"
                );
                Some(support)
            }
            Err(e) => {
                tracing::info!(error = %e, "kTLS unavailable (kernel without the TLS ULP): serving TLS through userspace rustls");
                None
            }
        },
    }
}

/// What [`start_admin`] establishes: the operator surface, up (and not ready yet).
struct Admin {
    state: Arc<AdminState>,
    addr: SocketAddr,
}

/// Binds `--admin-listen` and starts the admin thread: metrics, `/healthz`, `/readyz` (not
/// ready until [`go_live`]) and the hot codes.
fn start_admin(args: &Args, services: &Services) -> anyhow::Result<Admin> {
    let listener = TcpListener::bind(args.admin_listen)
        .with_context(|| format!("binding admin {}", args.admin_listen))?;
    let addr = listener.local_addr()?;
    let state = Arc::new(AdminState {
        metrics: Arc::clone(&services.metrics),
        sketches: services.tops.clone(),
        top_sample: args.top_sample,
    });
    spawn_admin(listener, Arc::clone(&state))?;
    Ok(Admin { state, addr })
}

/// What [`start_feed`] establishes: the tables published to the cores, the engine's name, and
/// with `--control` the feed that keeps the tables current.
struct Publishing {
    shared: Arc<Shared>,
    /// Names the engine in status reports and its click spool files.
    engine_id: String,
    feed: Option<feed::Feed>,
}

/// Publishes the first tables (the cores read them from [`Shared`]), names the engine by the
/// port actually bound (`--listen :0` included) unless `--engine-id` does, and with
/// `--control` starts the feed's reader, applier and reporter threads.
fn start_feed(
    args: &Args,
    feed_cfg: Option<FeedConfig>,
    tables: Tables,
    snapshot_id: Option<String>,
    bound: SocketAddr,
    services: &Services,
) -> anyhow::Result<Publishing> {
    let shared = Shared::new(tables.clone());
    let engine_id = args
        .engine_id
        .clone()
        .unwrap_or_else(|| default_engine_id(bound));
    let feed = match (feed_cfg, &services.feed_stats) {
        (Some(mut cfg), Some(stats)) => {
            anyhow::ensure!(valid_name(&engine_id), "{NAMES_RULE}");
            cfg.engine_id = engine_id.clone();
            cfg.origin = services.origin.clone();
            Some(
                feed::start(
                    cfg,
                    shared.published(),
                    tables,
                    snapshot_id,
                    Arc::clone(&services.metrics),
                    Arc::clone(stats),
                )
                .context("starting the feed threads")?,
            )
        }
        _ => None,
    };
    Ok(Publishing {
        shared,
        engine_id,
        feed,
    })
}

/// The serving cores' settings, the same for every core: timeouts and limits, the pages, HSTS,
/// and what the HTTPS listener decided (the redirect's port, the certificate's names).
fn core_config(
    args: &Args,
    backend: Backend,
    https: &Https,
    quic: Option<SocketAddr>,
    services: &Services,
) -> anyhow::Result<CoreConfig> {
    Ok(CoreConfig {
        backend,
        uring: UringConfig {
            max_conns: args.max_conns_per_core,
            idle_timeout_ms: (args.idle_timeout * 1000) as i64,
            header_timeout_ms: (args.header_timeout * 1000) as i64,
            ..UringConfig::default()
        },
        limits: Limits {
            country_header: args
                .country_header
                .as_deref()
                .map(lasthop_engine::http::HeaderName::new)
                .transpose()
                .context("--country-header")?,
            h2: lasthop_engine::h2::H2Limits {
                max_concurrent_streams: args.h2_max_concurrent_streams,
                max_header_list_size: args.h2_max_header_list_size,
                max_header_fields: args.h2_max_header_fields,
                max_client_resets: args.h2_max_client_resets,
                max_local_resets: args.h2_max_local_resets,
                h2c: !args.no_h2c,
                ..lasthop_engine::h2::H2Limits::default()
            },
            ..Limits::default()
        },
        fixed: args.fixed_response,
        top_sample: args.top_sample,
        // The lines every answer over TLS carries: HSTS, then Alt-Svc.
        hsts: [
            hsts_header(args.hsts_max_age, args.hsts_preload),
            alt_svc_header(args.alt_svc.as_deref(), quic.map(|q| q.port())),
        ]
        .concat()
        .into(),
        coverage: https.coverage.clone(),
        // The port bound (an ephemeral `:0` is known only now).
        https_redirect: https
            .bound
            .filter(|_| args.redirect_http_to_https)
            .map(|a: SocketAddr| a.port()),
        pages: Arc::new(match &args.report_url {
            Some(url) => lasthop_engine::render::Pages::with_report_url(url)?,
            None => lasthop_engine::render::Pages::default(),
        }),
        tls_stats: services.tls_stats.clone(),
        drain: Duration::from_secs(args.drain_timeout),
        glommio_io_memory: 256 << 10,
    })
}

/// What each serving core is handed of its own, in core order.
struct CoreSockets {
    listeners: Vec<OwnedFd>,
    inboxes: Vec<Option<OriginInbox>>,
    tls: Vec<Option<TlsListen>>,
    quic: Vec<Option<QuicStart>>,
}

/// A serving core's thread, which returns once the core has drained.
type CoreHandle = glommio::ExecutorJoinHandle<Result<(), serve::CoreError>>;

/// Starts one pinned executor per core, each handed its sockets, its counters and sketch, its
/// click recorder and (with AF_XDP) its queue.
fn start_cores(
    cores: &Cores,
    sockets: CoreSockets,
    config: &CoreConfig,
    services: &Services,
    shared: &Arc<Shared>,
) -> anyhow::Result<Vec<CoreHandle>> {
    let mut handles = Vec::with_capacity(cores.count);
    for (index, (((listener, inbox), tls), quic)) in sockets
        .listeners
        .into_iter()
        .zip(sockets.inboxes)
        .zip(sockets.tls)
        .zip(sockets.quic)
        .enumerate()
    {
        let start = CoreStart {
            index,
            cpu: cores.cpus.get(index).copied().flatten(),
            listener,
            inbox,
            metrics: Arc::clone(&services.metrics.cores[index]),
            top: Arc::clone(&services.tops[index]),
            feed: services.feed_stats.clone(),
            tls,
            quic,
            clicks: services.clicks.as_ref().and_then(|c| c.recorder(index)),
            #[cfg(feature = "xdp")]
            xdp: cores.xdp.as_ref().map(|x| x.core(index)),
        };
        handles.push(serve::spawn_core(
            start,
            config.clone(),
            Arc::clone(shared),
            services.origin.clone(),
        )?);
    }
    Ok(handles)
}

/// Starts the click flusher on the configured sink (`--clicks`), unless `--clicks off`.
fn start_clicks(
    args: &Args,
    services: &Services,
    engine_id: &str,
) -> anyhow::Result<Option<clicks::Flusher>> {
    let Some(clicks) = &services.clicks else {
        return Ok(None);
    };
    let sink: Box<dyn clicks::Sink> = match args.clicks {
        ClicksSink::Kafka => kafka_sink(args, clicks)?,
        // (`off` has no click buffers, so never gets here.)
        ClicksSink::Spool | ClicksSink::Off => {
            let dir = args
                .click_spool
                .clone()
                .unwrap_or_else(|| args.data_dir.join("clicks").join("spool"));
            let cfg = spool::SpoolConfig {
                dir: dir.clone(),
                max_segment_bytes: 64 << 20,
                max_segment_age: Duration::from_secs(30),
                max_dir_bytes: args.click_spool_max_mib << 20,
            };
            let writer = spool::SpoolWriter::new(cfg, engine_id)
                .with_context(|| format!("opening the click spool {}", dir.display()))?;
            tracing::info!(dir = %dir.display(), writer = writer.name(), "click events go to the spool");
            Box::new(writer)
        }
    };
    Ok(Some(clicks.start(
        sink,
        Duration::from_millis(args.click_flush_ms.max(1)),
    )))
}

/// `--clicks kafka`: a producer to `--click-kafka`, counting into the flusher's stats.
#[cfg(feature = "kafka")]
fn kafka_sink(args: &Args, clicks: &clicks::Clicks) -> anyhow::Result<Box<dyn clicks::Sink>> {
    use lasthop_engine::clicks::kafka;
    let brokers = args
        .click_kafka
        .clone()
        .context("--clicks kafka needs --click-kafka BROKERS")?;
    let cfg = kafka::KafkaConfig {
        brokers,
        topic: args.click_topic.clone(),
        queue_events: args.click_kafka_queue.max(1),
        delivery_timeout: Duration::from_millis(args.click_kafka_timeout_ms.max(1)),
        options: args.click_kafka_options.clone(),
    };
    Ok(Box::new(kafka::KafkaSink::new(
        &cfg,
        Arc::clone(&clicks.sink),
    )?))
}

/// `--clicks kafka` without the `kafka` feature (`check_features` refuses it before this).
#[cfg(not(feature = "kafka"))]
fn kafka_sink(_: &Args, _: &clicks::Clicks) -> anyhow::Result<Box<dyn clicks::Sink>> {
    anyhow::bail!("--clicks kafka: {}", without_feature("kafka"))
}

/// The addresses the engine serves on, as bound.
#[derive(Debug, Clone, Copy)]
struct Addrs {
    listen: SocketAddr,
    tls: Option<SocketAddr>,
    quic: Option<SocketAddr>,
    admin: SocketAddr,
}

/// Says the engine is serving, once it is: every core's listeners armed, the XDP program
/// attached (it redirects into the cores' sockets from now on), `/readyz` ready, the listening
/// lines on stdout and READY=1 to systemd.
fn go_live(
    cores: &mut Cores,
    shared: &Shared,
    admin: &AdminState,
    addrs: Addrs,
    snapshot: Option<&Snapshot>,
) -> anyhow::Result<()> {
    // Every core serving before the engine says so: a core that never arms its listeners
    // would leave its share of connections (the kernel hashes them to its socket) waiting.
    shared
        .wait_started(cores.count, Duration::from_secs(10))
        .context("starting the serving cores")?;
    // Every core's socket is in the map: now the program may redirect into them. The link
    // (kept in the setup) detaches it when the engine exits, however it exits.
    if let Some(x) = &mut cores.xdp {
        x.attach()?;
    }
    admin.set_ready(true);
    let (listen, backend, count) = (addrs.listen, cores.backend.as_str(), cores.count);
    tracing::info!(listen = %listen, admin = %addrs.admin, cores = count, io = backend,
        snapshot_links = snapshot.map_or(0, |s| s.links()),
        sequence = snapshot.map_or(0, |s| s.sequence()), "engine serving");
    // Machine-readable lines for scripts and tests (`--listen 127.0.0.1:0` works).
    println!("engine listening on http://{listen} ({backend}, {count} cores)");
    println!("admin listening on http://{}", addrs.admin);
    if let Some(b) = addrs.tls {
        println!("tls listening on https://{b}");
        match addrs.quic {
            Some(q) => println!("quic listening on udp://{q}"),
            None => println!("quic not served"),
        }
    } else if let Some(q) = addrs.quic {
        println!("quic listening on udp://{q}");
    }
    use std::io::Write as _;
    std::io::stdout().flush()?;
    notify(&[NotifyState::Ready]);
    Ok(())
}

/// Serves until SIGTERM, applying each SIGHUP ([`reload`]); on SIGTERM, says not ready and
/// tells the cores to drain.
fn serve_until_stop(
    args: &mut Args,
    reloads: &mut Reloads,
    https: &mut Https,
    load: LoadFn,
    publishing: &Publishing,
    metrics: &EngineMetrics,
    admin: &AdminState,
) -> anyhow::Result<()> {
    loop {
        match signals::wait()? {
            Signal::Reload => {
                notify(&[NotifyState::Reloading]);
                reload(args, reloads, https, load, publishing, metrics);
                notify(&[NotifyState::Ready]);
            }
            Signal::Stop => {
                notify(&[NotifyState::Stopping]);
                tracing::info!("SIGTERM: draining");
                admin.set_ready(false);
                publishing.shared.stop();
                return Ok(());
            }
        }
    }
}

/// SIGHUP: re-reads the config file (applying its live keys), the TLS certificate and key,
/// and the `--snapshot` file. Whatever fails to load is logged and the running one kept.
fn reload(
    args: &mut Args,
    reloads: &mut Reloads,
    https: &mut Https,
    load: LoadFn,
    publishing: &Publishing,
    metrics: &EngineMetrics,
) {
    if let Some(next) = reloads.reread() {
        // The live keys: the files SIGHUP re-reads below.
        if let Some(settings) = https.settings.as_mut() {
            if let (Some(cert), Some(key)) = (&next.cert, &next.key) {
                settings.cert = cert.clone();
                settings.key = key.clone();
            }
        }
        args.snapshot = next.snapshot;
    }
    if let (Some(settings), Some(holder)) = (&https.settings, &https.config) {
        // New connections get the new certificate; open ones keep theirs.
        match tls::server_config(settings) {
            Ok(config) => {
                if let Ok(mut c) = holder.lock() {
                    *c = config;
                }
                if let Some(c) = &https.coverage {
                    if let Err(e) = c.reload(&settings.cert) {
                        tracing::error!(error = %e, "SIGHUP: the certificate's names for 421 are the old ones");
                    }
                }
                tracing::info!("SIGHUP: TLS certificate and key reloaded");
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: keeping the current TLS certificate")
            }
        }
    }
    if let (Some(settings), Some(quic)) = (&https.settings, &https.quic) {
        let loaded = tls::config::quic_server_config(settings)
            .map_err(anyhow::Error::from)
            .and_then(|tls| quic.reload(tls).map_err(anyhow::Error::from));
        match loaded {
            Ok(()) => tracing::info!("SIGHUP: HTTP/3 certificate and key reloaded"),
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "SIGHUP: HTTP/3 keeps the current certificate")
            }
        }
    }
    let Some(path) = &args.snapshot else {
        tracing::info!("SIGHUP: no --snapshot file to reload (the feed manages snapshots)");
        return;
    };
    let swapped = open_snapshot(path, load).and_then(|s| match &publishing.feed {
        // The feed's applier owns the tables: it swaps the file in if not older.
        Some(f) => {
            f.reload(s);
            Ok(())
        }
        None => swap_in(&publishing.shared, metrics, s),
    });
    if let Err(e) = swapped {
        tracing::error!(error = %format!("{e:#}"), "SIGHUP: keeping the current snapshot");
    }
}

/// Waits for the cores to drain, but never past the drain timeout plus a grace (a stop must
/// always end the process: past it, exits 1), then joins them and stops the click flusher,
/// which sends what they recorded last.
fn drain(
    shared: &Shared,
    handles: Vec<CoreHandle>,
    drain: Duration,
    flusher: Option<clicks::Flusher>,
) {
    let deadline = std::time::Instant::now() + drain + Duration::from_secs(2);
    while shared.finished() < handles.len() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    if shared.finished() < handles.len() {
        tracing::error!(
            finished = shared.finished(),
            cores = handles.len(),
            "cores did not finish draining in time; exiting anyway"
        );
        std::process::exit(1);
    }
    for h in handles {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %format!("{e:#}"), "core failed"),
            Err(e) => tracing::error!(error = %e, "core panicked"),
        }
    }
    if let Some(f) = flusher {
        f.stop();
    }
    tracing::info!("stopped");
}

/// `--io xdp`: what the engine loads once and hands its cores, and the program's link once
/// attached (dropping the setup detaches the program, however the engine exits).
#[cfg(feature = "xdp")]
struct XdpSetup {
    /// First, so that it is dropped (the program detached) before the rest.
    link: Option<Attachment>,
    interface: String,
    ifindex: u32,
    map: Arc<XskMap>,
    program: Program,
    cores: Vec<XdpCore>,
}

#[cfg(feature = "xdp")]
impl XdpSetup {
    /// What core `index` serves: its queue, and the XSKMAP its socket goes in.
    fn core(&self, index: usize) -> (XdpCore, Arc<XskMap>) {
        (self.cores[index].clone(), Arc::clone(&self.map))
    }

    /// Attaches the program to the interface natively: from now on it redirects into the
    /// cores' sockets.
    fn attach(&mut self) -> anyhow::Result<()> {
        let link = self
            .program
            .attach(self.ifindex)
            .with_context(|| format!("attaching the XDP program to {} natively", self.interface))?;
        self.link = Some(link);
        Ok(())
    }
}

/// The AF_XDP backend, its program loaded.
#[cfg(feature = "xdp")]
fn xdp_backend(args: &Args, cores: usize) -> anyhow::Result<(Backend, Option<XdpSetup>)> {
    Ok((Backend::Xdp, Some(xdp_setup(args, cores)?)))
}

/// Without the `xdp` feature there is no AF_XDP path: nothing to set up, ever.
#[cfg(not(feature = "xdp"))]
#[derive(Debug)]
enum XdpSetup {}

#[cfg(not(feature = "xdp"))]
impl XdpSetup {
    fn attach(&mut self) -> anyhow::Result<()> {
        match *self {}
    }
}

/// The AF_XDP backend, which this build does not have (`--io auto` serves through the kernel
/// instead; `check_features` refuses `--io xdp` before this).
#[cfg(not(feature = "xdp"))]
fn xdp_backend(_: &Args, _: usize) -> anyhow::Result<(Backend, Option<XdpSetup>)> {
    anyhow::bail!("{}", without_feature("xdp"))
}

/// Checks `--io xdp`'s flags, creates the XSKMAP and loads the XDP program (not attached:
/// that waits for every core's socket).
#[cfg(feature = "xdp")]
fn xdp_setup(args: &Args, cores: usize) -> anyhow::Result<XdpSetup> {
    use lasthop_engine::io::xdp::{self, prog, Filter, XskConfig};
    let interface = args
        .xdp_interface
        .clone()
        .context("needs --xdp-interface (the interface whose queues it serves)")?;
    // One address of either family: the userspace TCP answers as that address, so a wildcard
    // (which the kernel resolves per route) has no meaning here.
    let addr = args.listen.ip();
    anyhow::ensure!(
        !addr.is_unspecified() && !addr.is_multicast() && args.listen.port() != 0,
        "serves one address and port: give --listen ADDR:PORT with an IPv4 or IPv6 address of {interface} (not {})",
        args.listen
    );
    let queues: Vec<u32> = if args.xdp_queues.is_empty() {
        (0..cores as u32).collect()
    } else {
        args.xdp_queues.clone()
    };
    anyhow::ensure!(
        queues.len() == cores,
        "--xdp-queues names {} queues for {cores} serving cores (one each)",
        queues.len()
    );
    let mut distinct = queues.clone();
    distinct.sort_unstable();
    distinct.dedup();
    anyhow::ensure!(
        distinct.len() == queues.len(),
        "--xdp-queues names a queue twice: {queues:?}"
    );
    let ifindex = xdp::ifindex(&interface)?;
    let mac = xdp::mac(&interface)?;
    // What would otherwise fail only after the cores started (too late for `--io auto` to
    // serve through the kernel instead): another program on the hook, a driver without
    // native XDP, a queue that takes no AF_XDP socket.
    let hook =
        prog::query(ifindex).with_context(|| format!("querying the XDP hook of {interface}"))?;
    anyhow::ensure!(
        hook.prog_id == 0,
        "{interface} already has an XDP program attached (id {}): detach it (`ip link set dev {interface} xdp off`) or serve another interface",
        hook.prog_id
    );
    anyhow::ensure!(
        hook.features == 0 || hook.features & prog::FEATURES_NEEDED == prog::FEATURES_NEEDED,
        "the driver of {interface} has no native XDP with redirect (XDP features {:#x})",
        hook.features
    );
    // (A probe socket cannot stand in for the bind: the kernel releases a closed socket's
    // queue later, on a work queue, and the core's own bind would find it busy.)
    let rx_queues = xdp::rx_queues(&interface)?;
    for &queue in &queues {
        anyhow::ensure!(
            queue < rx_queues,
            "{interface} has no RX queue {queue} (it has {rx_queues}): give --xdp-queues queues it has, one per serving core"
        );
    }
    let map = XskMap::new(queues.iter().max().map_or(1, |q| q + 1))
        .context("creating the XSKMAP (needs CAP_BPF, or root)")?;
    let port = args.listen.port();
    // HTTPS on the same address, at a port of its own: the program redirects both.
    let tls_port = match args.tls_listen {
        None => None,
        Some(tls) => {
            anyhow::ensure!(
                tls.ip() == args.listen.ip() && tls.port() != 0 && tls.port() != port,
                "serves HTTPS on --listen's address: give --tls-listen {addr}:PORT with a port of its own (not {tls})"
            );
            Some(tls.port())
        }
    };
    let program = prog::load(
        &Filter {
            addr: Some(addr),
            port,
            tls_port,
        },
        &map,
        0,
    )
    .context("loading the XDP program (needs CAP_BPF and CAP_NET_ADMIN, or root)")?;
    let mut cookie_key = [0u8; 16];
    getrandom::getrandom(&mut cookie_key)
        .map_err(|e| anyhow::anyhow!("the SYN cookie key: {e}"))?;
    let cores = queues
        .iter()
        .map(|&queue| xdp::run::XdpCore {
            ifindex,
            queue,
            mac,
            addr,
            port,
            tls_port,
            cookie_key,
            socket: XskConfig::default(),
        })
        .collect();
    Ok(XdpSetup {
        link: None,
        interface,
        ifindex,
        map: Arc::new(map),
        program,
        cores,
    })
}
