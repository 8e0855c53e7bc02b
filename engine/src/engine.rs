//! Start, run and drain: what the engine does with its [`Args`], from loading the key and the
//! snapshot to the last core's drain (the steps are in order below; `docs/ARCHITECTURE.md`,
//! "The edge engine", has the threads they start).

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use lasthop_core::feed::valid_name;
use lasthop_core::HighWater;
use lasthop_core::{CodeScheme, PermutationKey};
use lasthop_engine::admin::{spawn_admin, AdminState};
use lasthop_engine::clicks::{self, kafka, spool};
use lasthop_engine::control::ControlPlanes;
use lasthop_engine::feed::{self, FeedConfig, FeedStats, LoadFn};
use lasthop_engine::http::Limits;
use lasthop_engine::io::signals::{self, Signal};
use lasthop_engine::io::uring::{self, UringConfig};
use lasthop_engine::metrics::EngineMetrics;
use lasthop_engine::origin::{Origin, OriginConfig};
use lasthop_engine::serve::{self, Backend, CoreConfig, CoreStart, Shared};
use lasthop_engine::tables::Tables;
use lasthop_engine::tls::{self, TlsSettings};
use lasthop_engine::topk::TopK;
use lasthop_snapshot::Snapshot;

use crate::config::{
    default_engine_id, hsts_header, Args, ClicksSink, Io, SafeMode, SnapshotMemory,
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

/// `--check-config`: what `run` reads before it binds anything, read the same way: the key
/// file, the snapshot (verified), the TLS certificate and key, the control plane's CA and
/// client certificate, the edge token and the snapshot-signing keys.
pub(crate) fn check(args: &Args) -> anyhow::Result<()> {
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

/// The HTTPS listener's settings, with `--tls-listen` (clap requires `--cert` and `--key`
/// with it).
fn tls_settings(args: &Args, ktls: bool) -> Option<TlsSettings> {
    match (&args.tls_listen, &args.cert, &args.key) {
        (Some(_), Some(cert), Some(key)) => Some(TlsSettings {
            cert: cert.clone(),
            key: key.clone(),
            ticket_key_file: args.tls_ticket_key_file.clone(),
            ticket_lifetime: Duration::from_secs(args.tls_ticket_lifetime_secs),
            max_early_data: args.tls_max_early_data,
            ktls,
            alpn: args.alpn.iter().map(|p| p.as_bytes().to_vec()).collect(),
            groups: args.tls_groups.clone(),
            cert_compression: !args.no_tls_cert_compression,
        }),
        _ => None,
    }
}

/// The control planes of `--control` (TLS with `--control-ca`), or `None` without any.
fn control_planes(args: &Args) -> anyhow::Result<Option<ControlPlanes>> {
    if args.control.is_empty() {
        return Ok(None);
    }
    let mut c = ControlPlanes::new(&args.control)?;
    if let Some(ca) = &args.control_ca {
        let client = args
            .control_client_cert
            .as_deref()
            .zip(args.control_client_key.as_deref());
        c = c.with_tls(lasthop_engine::tls::config::control_client_config(
            ca, client,
        )?);
    }
    Ok(Some(c))
}

/// The token of `--edge-token-file`, if given.
fn edge_token(args: &Args) -> anyhow::Result<Option<String>> {
    args.edge_token_file
        .as_deref()
        .map(|path| {
            Ok(std::fs::read_to_string(path)
                .with_context(|| format!("reading the edge token {}", path.display()))?
                .trim()
                .to_string())
        })
        .transpose()
}

/// `--key-file` (clap requires it unless `--generate` is given).
fn key_file(args: &Args) -> anyhow::Result<&Path> {
    args.key_file
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("--key-file is required"))
}

/// Tells systemd (`Type=notify`) where the engine stands; a no-op when not run by it.
fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::debug!(error = %e, "sd_notify");
    }
}

/// Runs the engine until SIGTERM has drained it (or a core fails).
pub(crate) fn run(mut args: Args, mut reloads: Reloads) -> anyhow::Result<()> {
    match lasthop_engine::io::socket::raise_nofile_limit() {
        Ok(n) => tracing::debug!(limit = n, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "could not raise the open-file limit"),
    }

    let key = PermutationKey::load(key_file(&args)?)?;
    let scheme = CodeScheme::new(&key)?;
    let load = snapshot_loader(args.snapshot_memory);
    let token = edge_token(&args)?;
    let controls = control_planes(&args)?.map(|c| {
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
    let mut feed_cfg = controls.as_ref().map(|control| FeedConfig {
        control: Arc::clone(control),
        token: token.clone(),
        // Named below, once the listener's port is known.
        engine_id: String::new(),
        pop: args.pop.clone(),
        data_dir: args.data_dir.clone(),
        timeout: Duration::from_millis(args.feed_timeout_ms),
        safe_mode: matches!(args.safe_mode, SafeMode::Confirm),
        load,
        verify_keys: verify_keys.clone(),
    });
    if let Some(cfg) = &feed_cfg {
        anyhow::ensure!(
            // A default id (host name and port) is checked once the port is known, below.
            args.engine_id.as_deref().is_none_or(valid_name) && valid_name(&cfg.pop),
            "{NAMES_RULE}"
        );
    }
    // The snapshot to start from: the file given, else the newest verified one downloaded
    // before, else the control plane's newest; with none at all, every lookup reads through.
    let (snapshot, snapshot_id) = match (&args.snapshot, &feed_cfg) {
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
    let tables = match &snapshot {
        Some(s) => Tables::from_snapshot(scheme.clone(), Arc::clone(s), controls.is_some())?,
        // No marks known: let every code through to the origin rather than reject a real one.
        None => Tables::new(
            scheme.clone(),
            HighWater::new(1, lasthop_core::CODE_SPACE)?,
            true,
        ),
    };

    let cores = args
        .cores
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let cpus: Vec<Option<usize>> = if args.cpus.is_empty() {
        (0..cores).map(Some).collect()
    } else {
        anyhow::ensure!(
            args.cpus.len() >= cores,
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
    let mut xdp = None;
    let backend = match args.io {
        Io::Xdp => {
            xdp = Some(xdp_setup(&args, cores).context("--io xdp")?);
            Backend::Xdp
        }
        Io::Auto if args.xdp_interface.is_some() => match xdp_setup(&args, cores) {
            Ok(setup) => {
                xdp = Some(setup);
                Backend::Xdp
            }
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "AF_XDP unavailable on --xdp-interface: serving through the kernel");
                kernel_backend()
            }
        },
        Io::Epoll => Backend::Epoll,
        Io::Uring => {
            uring::probe().context("io_uring requested but unavailable")?;
            Backend::Uring
        }
        Io::Auto => kernel_backend(),
    };

    let mut metrics = EngineMetrics::new(cores, backend.as_str());

    metrics.control = controls.clone();
    let (origin, inboxes) = match &controls {
        Some(c) => {
            let cfg = OriginConfig {
                token: token.clone(),
                max_pending: args.origin_max_pending,
                ..OriginConfig::default()
            };
            let (origin, inboxes) = Origin::start(Arc::clone(c), cfg, cores)?;
            metrics.origin = Some(origin.stats());
            (
                Some(Arc::new(origin)),
                inboxes.into_iter().map(Some).collect(),
            )
        }
        None => (None, (0..cores).map(|_| None).collect::<Vec<_>>()),
    };
    if let Some(s) = &snapshot {
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
    let feed_stats = feed_cfg.as_ref().map(|_| Arc::new(FeedStats::default()));
    metrics.feed = feed_stats.clone();
    let tls_stats = args.tls_listen.map(|_| Arc::new(tls::TlsStats::default()));
    metrics.tls = tls_stats.clone();
    if args.clicks != ClicksSink::Off {
        anyhow::ensure!(
            valid_name(&args.pop),
            "--pop must be 1-64 characters of [A-Za-z0-9._:-] (it is carried in every click)"
        );
    }
    let clicks = match args.clicks {
        ClicksSink::Off => None,
        _ => Some(clicks::Clicks::new(
            cores,
            clicks::ClickSettings {
                pop: args.pop.clone(),
                visitor_key: match &args.visitor_key_file {
                    Some(file) => clicks::visitor_key(file)?,
                    // The default file: if the data dir cannot hold it, count visitors under a
                    // key of this process (clicks are never worth refusing to start over).
                    None => clicks::visitor_key(&args.data_dir.join("visitor.key"))
                        .or_else(|e| {
                            tracing::warn!(error = %format!("{e:#}"), "no visitor key file: unique visitors are counted under a key of this process only");
                            clicks::random_visitor_key()
                        })?,
                },
                geo: match &args.geoip_db {
                    Some(p) => Some(clicks::Geo::open(p)?),
                    None => None,
                },
                // One batch is one spool frame, and readers refuse frames over 16 MiB.
                buffer_bytes: (args.click_buffer_kib.max(4) << 10)
                    .min(lasthop_core::click::spool::MAX_FRAME_PAYLOAD),
            },
        )),
    };
    metrics.clicks = clicks.clone();
    let metrics = Arc::new(metrics);
    let tops: Vec<Arc<TopK>> = (0..cores).map(|_| Arc::new(TopK::new())).collect();

    let (listeners, bound) =
        serve::listeners(args.listen, cores).with_context(|| format!("binding {}", args.listen))?;
    // HTTPS: one config for the whole process (so its ticket keys are shared by every core),
    // swapped on SIGHUP; one SO_REUSEPORT listener per core.
    // kTLS: probed once; where the kernel takes the TLS ULP, connections are handed to it after
    // their handshake.
    let ktls = match (args.tls_listen, args.no_ktls) {
        (None, _) => None,
        (Some(_), _) if backend == Backend::Xdp => {
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
    };
    let mut tls_settings = tls_settings(&args, ktls.is_some());
    let mut tls_listeners: Vec<Option<lasthop_engine::io::uring::TlsListen>> =
        (0..cores).map(|_| None).collect();
    let mut tls_bound = None;
    let mut tls_config_holder = None;
    let mut coverage = None;
    if let (Some(settings), Some(addr), Some(stats)) = (&tls_settings, args.tls_listen, &tls_stats)
    {
        anyhow::ensure!(
            matches!(backend, Backend::Uring | Backend::Xdp),
            "--tls-listen needs the io_uring or AF_XDP backend (the epoll fallback serves plain HTTP only)"
        );
        let config = tls::server_config(settings).context("loading the TLS certificate and key")?;
        coverage = Some(Arc::new(
            tls::CertCoverage::load(&settings.cert).context("loading the TLS certificate")?,
        ));
        stats
            .ktls_available
            .store(ktls.is_some(), Ordering::Relaxed);
        let holder = Arc::new(std::sync::Mutex::new(config));
        let (ls, b) = serve::listeners(addr, cores).with_context(|| format!("binding {addr}"))?;
        for (slot, listener) in tls_listeners.iter_mut().zip(ls) {
            *slot = Some(lasthop_engine::io::uring::TlsListen {
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
        tls_bound = Some(b);
        tls_config_holder = Some(holder);
    }
    let admin_listener = TcpListener::bind(args.admin_listen)
        .with_context(|| format!("binding admin {}", args.admin_listen))?;
    let admin_addr = admin_listener.local_addr()?;
    let admin = Arc::new(AdminState {
        metrics: Arc::clone(&metrics),
        sketches: tops.clone(),
        top_sample: args.top_sample,
    });
    spawn_admin(admin_listener, Arc::clone(&admin))?;

    let shared = Shared::new(tables.clone());
    // The port actually bound (`--listen :0` included) names the engine in status reports and
    // its click spool files.
    let engine_id = args
        .engine_id
        .clone()
        .unwrap_or_else(|| default_engine_id(bound));
    if let Some(cfg) = &mut feed_cfg {
        anyhow::ensure!(valid_name(&engine_id), "{NAMES_RULE}");
        cfg.engine_id = engine_id.clone();
    }
    let feed = match (feed_cfg, &feed_stats) {
        (Some(cfg), Some(stats)) => Some(
            feed::start(
                cfg,
                shared.published(),
                tables,
                snapshot_id,
                Arc::clone(&metrics),
                Arc::clone(stats),
            )
            .context("starting the feed threads")?,
        ),
        _ => None,
    };
    let config = CoreConfig {
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
        hsts: hsts_header(args.hsts_max_age, args.hsts_preload).into(),
        // The port bound (an ephemeral `:0` is known only now).
        coverage: coverage.clone(),
        https_redirect: tls_bound
            .filter(|_| args.redirect_http_to_https)
            .map(|a: SocketAddr| a.port()),
        pages: Arc::new(match &args.report_url {
            Some(url) => lasthop_engine::render::Pages::with_report_url(url)?,
            None => lasthop_engine::render::Pages::default(),
        }),
        tls_stats: tls_stats.clone(),
        drain: Duration::from_secs(args.drain_timeout),
        glommio_io_memory: 256 << 10,
    };
    let mut handles = Vec::with_capacity(cores);
    for (index, ((listener, inbox), tls)) in listeners
        .into_iter()
        .zip(inboxes)
        .zip(tls_listeners)
        .enumerate()
    {
        let start = CoreStart {
            index,
            cpu: cpus.get(index).copied().flatten(),
            listener,
            inbox,
            metrics: Arc::clone(&metrics.cores[index]),
            top: Arc::clone(&tops[index]),
            feed: feed_stats.clone(),
            tls,
            clicks: clicks.as_ref().and_then(|c| c.recorder(index)),
            xdp: xdp
                .as_ref()
                .map(|x: &XdpSetup| (x.cores[index].clone(), Arc::clone(&x.map))),
        };
        handles.push(serve::spawn_core(
            start,
            config.clone(),
            Arc::clone(&shared),
            origin.clone(),
        )?);
    }
    let flusher = match &clicks {
        Some(c) => Some(start_click_sink(&args, c, &engine_id)?),
        None => None,
    };
    // Every core serving before the engine says so: a core that never arms its listeners
    // would leave its share of connections (the kernel hashes them to its socket) waiting.
    shared
        .wait_started(cores, Duration::from_secs(10))
        .context("starting the serving cores")?;
    // Every core's socket is in the map: now the program may redirect into them. The link
    // detaches it when the engine exits, however it exits.
    let _xdp_link =
        match &xdp {
            Some(x) => Some(x.program.attach(x.ifindex).with_context(|| {
                format!("attaching the XDP program to {} natively", x.interface)
            })?),
            None => None,
        };
    admin.set_ready(true);
    tracing::info!(listen = %bound, admin = %admin_addr, cores, io = backend.as_str(),
        snapshot_links = snapshot.as_ref().map_or(0, |s| s.links()),
        sequence = snapshot.as_ref().map_or(0, |s| s.sequence()), "engine serving");
    // Machine-readable lines for scripts and tests (`--listen 127.0.0.1:0` works).
    println!(
        "engine listening on http://{bound} ({}, {cores} cores)",
        backend.as_str()
    );
    println!("admin listening on http://{admin_addr}");
    if let Some(b) = tls_bound {
        println!("tls listening on https://{b}");
    }
    use std::io::Write as _;
    std::io::stdout().flush()?;
    notify(&[sd_notify::NotifyState::Ready]);

    loop {
        match signals::wait()? {
            Signal::Reload => {
                notify(&[sd_notify::NotifyState::Reloading]);
                if let Some(next) = reloads.reread() {
                    // The live keys: the files SIGHUP re-reads below.
                    if let Some(settings) = tls_settings.as_mut() {
                        if let (Some(cert), Some(key)) = (&next.cert, &next.key) {
                            settings.cert = cert.clone();
                            settings.key = key.clone();
                        }
                    }
                    args.snapshot = next.snapshot;
                }
                if let (Some(settings), Some(holder)) = (&tls_settings, &tls_config_holder) {
                    // New connections get the new certificate; open ones keep theirs.
                    match tls::server_config(settings) {
                        Ok(config) => {
                            if let Ok(mut c) = holder.lock() {
                                *c = config;
                            }
                            if let Some(c) = &coverage {
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
                let Some(path) = &args.snapshot else {
                    tracing::info!(
                        "SIGHUP: no --snapshot file to reload (the feed manages snapshots)"
                    );
                    notify(&[sd_notify::NotifyState::Ready]);
                    continue;
                };
                let swapped = open_snapshot(path, load).and_then(|s| match &feed {
                    // The feed's applier owns the tables: it swaps the file in if not older.
                    Some(f) => {
                        f.reload(s);
                        Ok(())
                    }
                    None => swap_in(&shared, &metrics, s),
                });
                if let Err(e) = swapped {
                    tracing::error!(error = %format!("{e:#}"), "SIGHUP: keeping the current snapshot");
                }
                notify(&[sd_notify::NotifyState::Ready]);
            }
            Signal::Stop => {
                notify(&[sd_notify::NotifyState::Stopping]);
                tracing::info!("SIGTERM: draining");
                admin.set_ready(false);
                shared.stop();
                break;
            }
        }
    }
    // Wait for the cores to drain, but never past the drain timeout plus a grace: a stop must
    // always end the process.
    let deadline = std::time::Instant::now() + config.drain + Duration::from_secs(2);
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
    Ok(())
}

/// Starts the click flusher on the configured sink.
fn start_click_sink(
    args: &Args,
    clicks: &Arc<clicks::Clicks>,
    engine_id: &str,
) -> anyhow::Result<clicks::Flusher> {
    let sink: Box<dyn clicks::Sink> = match args.clicks {
        ClicksSink::Kafka => {
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
            Box::new(kafka::KafkaSink::new(&cfg, Arc::clone(&clicks.sink))?)
        }
        _ => {
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
    Ok(clicks.start(sink, Duration::from_millis(args.click_flush_ms.max(1))))
}

/// `--io xdp`: what the engine loads once and hands its cores.
struct XdpSetup {
    interface: String,
    ifindex: u32,
    map: Arc<lasthop_engine::io::xdp::XskMap>,
    program: lasthop_engine::io::xdp::Program,
    cores: Vec<lasthop_engine::io::xdp::run::XdpCore>,
}

/// Checks `--io xdp`'s flags, creates the XSKMAP and loads the XDP program (not attached:
/// that waits for every core's socket).
fn xdp_setup(args: &Args, cores: usize) -> anyhow::Result<XdpSetup> {
    use lasthop_engine::io::xdp::{self, prog, Filter, XskConfig, XskMap};
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
        interface,
        ifindex,
        map: Arc::new(map),
        program,
        cores,
    })
}
