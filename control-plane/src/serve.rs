//! `lasthop-control serve`: the composition root. [`run`] builds every service once, in the
//! order their dependencies allow (each is handed what it needs when it is made: no setter
//! fills a part in later), gives them to the listeners, and stops them in reverse once the
//! listeners have drained. `--check-config` reads the same files and stops there.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::CommandFactory;
use lasthop_cli::bootstrap::{notify, shutdown_signal, NotifyState};
use lasthop_clicks::cli::{open_clicks, source, Toggle};
use lasthop_control::clicks::archiver::{ArchiveHandle, ArchiveSummary, Archiver};
use lasthop_control::clicks::{ClicksHandle, Processor};
use lasthop_control::edge::{EdgeParts, EdgeState, Peering};
use lasthop_control::edge_tls::EdgeTls;
use lasthop_control::edge_token::EdgeToken;
use lasthop_control::feed::{Feed, FeedParts, Windows};
use lasthop_control::fleet::Fleet;
use lasthop_control::metrics::Metrics;
use lasthop_control::peers::{Peers, PeersConfig};
use lasthop_control::publish::{PublishConfig, Publisher};
use lasthop_control::store::CommitObserver;
use lasthop_control::{router, ApiConfig, ApiKeys, ApiParts, AppState, Store};
use lasthop_core::{CodeScheme, PermutationKey, UrlPolicy};

use crate::cli::{Cli, ServeArgs};
use crate::commands::open_store;

/// `serve`: every service built once, in the order their dependencies allow, handed whole to
/// the listeners, then stopped in the reverse order once the listeners have drained.
///
/// 1. files: certificates, keys and tokens ([`ServeFiles`]), before anything is opened;
/// 2. the record: metrics, the store (its lock keeps a second `serve` off this data dir), the
///    edge token, the fleet;
/// 3. the click processor and archive consumer opened (not yet running), whose rollups the
///    publisher ranks by;
/// 4. the publisher, trust and safety (lists, watcher, scanner), the shared-store follower;
/// 5. API keys; then, with nothing left to fail at start but replication, the click threads
///    and peer regions;
/// 6. the listeners ([`listen`]) until the shutdown signal;
/// 7. draining ([`Running::stop`]).
pub(crate) fn run(args: ServeArgs, config: ConfigReload) -> anyhow::Result<()> {
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
    let files = ServeFiles::read(&args)?;
    if let Some(key) = &files.signing {
        tracing::info!(public_key = %key.public_hex(), "signing snapshots");
    }
    let metrics = Metrics::new()?;
    let store = open_store(
        &args.store,
        &args.data_dir,
        files.scheme.clone(),
        args.region,
        args.regions,
        args.block_size,
        Some(commit_observer(&metrics)),
    )?;
    let token = edge_token(&store, &args)?;
    let shared = Arc::clone(&store).shared();
    let fleet = Arc::new(match &shared {
        Some(_) => Fleet::with_shared(shared.clone()),
        // The embedded store's fleet survives restarts in a file beside it.
        None => Fleet::with_file(args.data_dir.join("fleet.json")),
    });
    let clicks = open_processor(&args, &metrics)?;
    let rollups = clicks.as_ref().map(|c| Arc::clone(c.handle.store()));
    let publisher = Publisher::new(
        Arc::clone(&store),
        Arc::clone(&fleet),
        PublishConfig {
            dir: args.data_dir.join("snapshots"),
            key_id: files.scheme.key_id(),
            regions: args.regions,
            reserve: args.reserve,
            interval: Duration::from_secs(args.snapshot_interval_secs.max(1)),
            max_overlay: args.snapshot_max_overlay,
            signing: files.signing.map(Arc::new),
            hot: args.hot.hot_set(),
        },
        rollups.clone(),
    )?;
    let safety = start_safety(&args, Arc::clone(&store), &metrics)?;
    let follower = shared
        .clone()
        .map(|shared| follow_shared(shared, Arc::clone(&safety.safety), Arc::clone(&fleet)))
        .transpose()?;
    let keys = open_keys(&args, &store, true)?;
    // With regions, the keys peer regions read and copy into: one view, for replication and
    // the edge listener.
    let peer_keys = match &files.peer_token {
        Some(_) => Some(Arc::new(open_keys(&args, &store, false)?)),
        None => None,
    };
    // Clicks are consumed only once every part that can refuse the configuration has accepted
    // it: a start that fails never joins a consumer group or reads a segment.
    let clicks = clicks.map(OpenClicks::spawn).transpose()?;
    let peers = match (&files.peer_token, args.peers.is_empty()) {
        (Some(token), false) => Some(Peers::start(
            PeersConfig {
                region: args.region,
                regions: args.regions,
                alias_home: args.alias_home_region,
                peers: args.peers.clone(),
                token: token.clone(),
                lag_alarm_secs: args.peer_lag_alarm_secs,
                keys: peer_keys.clone(),
            },
            Arc::clone(&store),
            files.scheme.clone(),
            files.peer_agent.clone(),
            Some(Arc::clone(&safety.safety)),
        )?),
        _ => None,
    };
    let acme = args.acme.config(&args.data_dir).map(|cfg| {
        lasthop_control::acme::Acme::new(
            cfg,
            Arc::clone(&store),
            Arc::clone(&fleet),
            metrics.clone(),
        )
    });
    let api = AppState::from_parts(ApiParts {
        store: Arc::clone(&store),
        keys,
        config: api_config(&args),
        acme: acme.clone(),
        metrics,
        fleet: Arc::clone(&fleet),
        snapshots: Some(Arc::clone(&publisher)),
        safety: Arc::clone(&safety.safety),
        clicks: clicks.as_ref().map(|c| c.handle.clone()),
        peers: peers.clone(),
    });
    let peering = match (&files.peer_token, peer_keys) {
        (Some(t), Some(keys)) => Some(Peering {
            region: args.region,
            token: EdgeToken::new(t),
            peers: peers.clone(),
            mint_rate: args.max_mint_rate,
            keys,
            rollups,
        }),
        _ => None,
    };
    let listening = Listening {
        key_id: files.scheme.key_id(),
        api,
        store: Arc::clone(&store),
        token,
        fleet,
        publisher,
        peering,
        peers: peers.clone(),
        edge_tls: files.edge_tls,
        reload: safety.reload.clone(),
        acme,
    };
    runtime.block_on(listen(&args, listening, hup, config))?;
    Running {
        peers,
        follower,
        safety,
        clicks,
    }
    .stop();
    // Hand the unused counter block back.
    store.shutdown()?;
    tracing::info!("stopped cleanly");
    Ok(())
}

/// The store's group commits in the metrics (batch sizes, commit times).
fn commit_observer(metrics: &Metrics) -> CommitObserver {
    let m = metrics.clone();
    Arc::new(move |ops, secs| {
        m.commit_batch.observe(ops as f64);
        m.commit_seconds.observe(secs);
    })
}

/// The edge token engines present. A shared store holds the one every control plane on it
/// answers to (and each writes it to its DATA_DIR/edge.token for the engines on its host).
fn edge_token(store: &Arc<dyn Store>, args: &ServeArgs) -> anyhow::Result<EdgeToken> {
    let shared = store.shared_secret(
        lasthop_control::edge_token::SECRET_NAME,
        &lasthop_control::edge_token::generate_text,
    )?;
    Ok(match shared {
        Some(shared) => EdgeToken::from_shared(&args.data_dir, &shared)?,
        None => EdgeToken::load_or_create(&args.data_dir)?,
    })
}

/// The public API's settings from `serve`'s flags.
fn api_config(args: &ServeArgs) -> ApiConfig {
    ApiConfig {
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
    }
}

/// The click processor and its archive consumer, running.
struct RunningClicks {
    handle: ClicksHandle,
    thread: std::thread::JoinHandle<()>,
    archiving: Option<(ArchiveHandle, std::thread::JoinHandle<ArchiveSummary>)>,
}

/// The click processor and its archive consumer, opened: their stores and sources are ready,
/// nothing is read yet.
struct OpenClicks {
    handle: ClicksHandle,
    processor: Processor,
    archiver: Option<Archiver>,
}

impl OpenClicks {
    /// Starts the archive consumer's thread, then the processor's.
    fn spawn(self) -> anyhow::Result<RunningClicks> {
        let archiving = self
            .archiver
            .map(|a| anyhow::Ok((a.handle(), a.spawn()?)))
            .transpose()?;
        Ok(RunningClicks {
            handle: self.handle,
            thread: self.processor.spawn()?,
            archiving,
        })
    }
}

/// Opens the click processor (and the archive consumer) unless `--clicks off`.
fn open_processor(args: &ServeArgs, metrics: &Metrics) -> anyhow::Result<Option<OpenClicks>> {
    let c = &args.clicks;
    if c.clicks == Toggle::Off {
        return Ok(None);
    }
    let source = source(
        &args.data_dir,
        c.clicks_spool.clone(),
        c.clicks_kafka.clone(),
        &c.clicks_topic,
        &c.clicks_group,
    );
    let config = c.tuning.config(&args.data_dir, source)?;
    let (processor, archiver) = open_clicks(config, metrics.clicks.clone())?;
    Ok(Some(OpenClicks {
        handle: processor.handle(),
        processor,
        archiver,
    }))
}

/// What the listeners are handed: the services built in [`run`].
struct Listening {
    /// The permutation key's id, logged.
    key_id: u32,
    api: AppState,
    store: Arc<dyn Store>,
    token: EdgeToken,
    fleet: Arc<Fleet>,
    publisher: Arc<Publisher>,
    peering: Option<Peering>,
    peers: Option<Arc<Peers>>,
    edge_tls: Option<EdgeTls>,
    /// SIGHUP's way to the list watcher.
    reload: std::sync::mpsc::Sender<()>,
    /// The ACME certificate manager, with `--acme-directory`.
    acme: Option<Arc<lasthop_control::acme::Acme>>,
}

/// Binds the API, edge and console listeners, says where they are, and serves until the
/// shutdown signal has drained them all.
async fn listen(
    args: &ServeArgs,
    services: Listening,
    hup: tokio::signal::unix::Signal,
    config: ConfigReload,
) -> anyhow::Result<()> {
    let Listening {
        key_id,
        api: state,
        store,
        token,
        fleet,
        publisher,
        peering,
        peers,
        edge_tls,
        reload,
        acme,
    } = services;
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
    tracing::info!(api = %addr, edge = %edge_addr, key_id = format_args!("{key_id:08x}"), "control plane serving");
    // Machine-readable lines on stdout, so scripts and tests can use --api-listen :0 and
    // --edge-listen :0. The api line stays first; both go in one write, so a reader that
    // takes only the first line and closes the pipe cannot fail the second.
    {
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let mut lines = format!(
            "api listening on http://{addr}\nedge listening on {edge_scheme}://{edge_addr}\n"
        );
        if let Some(d) = &dashboard_listener {
            lines.push_str(&format!(
                "dashboard listening on http://{}\n",
                d.local_addr()?
            ));
        }
        out.write_all(lines.as_bytes())?;
        out.flush()?;
    }
    notify(&[NotifyState::Ready]);
    // One shutdown signal drains every listener, ends feed streams (they never end by
    // themselves, and draining waits for open responses) and stops the publisher.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    tokio::spawn(reload_on_sighup(hup, reload, config));
    let feed = Feed::from_parts(FeedParts {
        mint_rate: Some(args.max_mint_rate),
        snapshots: Some(publisher.subscribe()),
        stop: Some(stop_rx.clone()),
        windows: peers.map(|p| -> Windows { Arc::new(move |now| p.windows(now)) }),
        ..FeedParts::new(
            Arc::clone(&store),
            Duration::from_millis(args.feed_heartbeat_ms.max(1)),
        )
    });
    let legacy = Arc::new(lasthop_control::legacy::LegacyFallback::new(
        state.clone(),
        lasthop_control::legacy::FallbackConfig {
            default_template: args.legacy_fallback.clone(),
            default_owner: args.legacy_fallback_owner.clone(),
            timeout: Duration::from_millis(args.legacy_fallback_timeout_ms.max(1)),
            rate: args.legacy_fallback_rate,
            miss_ttl: Duration::from_secs(args.legacy_fallback_miss_secs),
        },
        state.metrics().clone(),
    ));
    let edge_state = EdgeState::from_parts(EdgeParts {
        store,
        token,
        feed,
        fleet,
        snapshots: Some(Arc::clone(&publisher)),
        client_certs: edge_tls.as_ref().is_some_and(|t| t.client_auth()),
        peering,
        certificates: lasthop_control::edge::CertificatePolicy {
            over_tls: edge_tls.is_some(),
            allow_plain: args.allow_plain_certificate_distribution,
        },
        legacy: Some(legacy),
    });
    tokio::spawn(Arc::clone(&publisher).start(stop_rx.clone()));
    if let Some(acme) = acme {
        tokio::spawn(acme.run(stop_rx.clone()));
    }
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        // An Err means the sender is gone, which only happens after the signal.
        let _ = rx.wait_for(|stop| *stop).await;
    };
    let dashboard = dashboard_listener.map(|l| {
        console(
            l,
            state.clone(),
            args.short_base.trim_end_matches('/').to_string(),
            stopped(stop_rx.clone()),
        )
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
            // The peer address decides whether certificates may go out in clear (loopback only).
            None => {
                axum::serve(
                    edge_listener,
                    edge_router.into_make_service_with_connect_info::<SocketAddr>(),
                )
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
    Ok(())
}

/// Serves the web console on `listener` until `shutdown`.
#[cfg(feature = "console")]
async fn console(
    listener: tokio::net::TcpListener,
    api: AppState,
    short_base: String,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = lasthop_control::dashboard::router(api, short_base);
    axum::serve(
        listener,
        app.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(shutdown)
    .await
}

/// Without the `console` feature no console listener is bound ([`ServeFiles::read`] refuses
/// `--dashboard-listen`).
#[cfg(not(feature = "console"))]
async fn console(
    _: tokio::net::TcpListener,
    _: AppState,
    _: String,
    _: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    Err(std::io::Error::other(
        "this lasthop-control was built without the `console` feature",
    ))
}

/// The threads that outlive the listeners, stopped once requests are drained.
struct Running {
    peers: Option<Arc<Peers>>,
    follower: Option<(
        Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<()>,
    )>,
    safety: RunningSafety,
    clicks: Option<RunningClicks>,
}

impl Running {
    /// Replication, the shared-store follower, the scanner and the list watcher stop; the
    /// click processor flushes what it read and stops, then the archive consumer.
    fn stop(self) {
        if let Some(p) = &self.peers {
            p.stop();
        }
        if let Some((stop, thread)) = self.follower {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            if thread.join().is_err() {
                tracing::error!("the shared-state follower panicked");
            }
        }
        self.safety.stop();
        if let Some(RunningClicks {
            handle,
            thread,
            archiving,
        }) = self.clicks
        {
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
    }
}

/// What SIGHUP needs to read `serve`'s configuration again.
pub(crate) struct ConfigReload {
    pub(crate) argv: Vec<std::ffi::OsString>,
    pub(crate) file: Option<lasthop_cli::FileConfig>,
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
    edge_tls: Option<EdgeTls>,
    signing: Option<lasthop_control::signing::SigningKey>,
    scheme: CodeScheme,
    peer_token: Option<String>,
    peer_agent: ureq::Agent,
}

impl ServeFiles {
    fn read(args: &ServeArgs) -> anyhow::Result<ServeFiles> {
        anyhow::ensure!(
            cfg!(feature = "console") || args.dashboard_listen.is_none(),
            "--dashboard-listen: this lasthop-control was built without the `console` feature"
        );
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
        args.acme.check()?;
        let key = PermutationKey::load(&args.key_file)?;
        let scheme = CodeScheme::new(&key)?;
        let peer_token = args
            .peer_token_file
            .as_deref()
            .map(lasthop_control::peers::read_token)
            .transpose()?;
        // Peers are verified against --peer-ca, or the web PKI's roots (`https://` peers with
        // public certificates), under the versions and suites both programs use.
        let roots = match &args.peer_ca {
            Some(ca) => lasthop_tls::Roots::CaFile(ca),
            None => lasthop_tls::Roots::WebPki,
        };
        let identity = args
            .peer_client_cert
            .as_deref()
            .zip(args.peer_client_key.as_deref());
        let peer_agent = ureq::AgentBuilder::new()
            .redirects(0)
            .tls_config(lasthop_tls::client_config(roots, identity)?)
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
pub(crate) fn check(args: &ServeArgs) -> anyhow::Result<()> {
    ServeFiles::read(args)?;
    // A shared store: reached as `serve` would reach it (its TLS verified, the login taken).
    if crate::commands::is_postgres(&args.store) {
        #[cfg(feature = "postgres")]
        lasthop_control::store::postgres::check_connection(&args.store)?;
        #[cfg(not(feature = "postgres"))]
        return Err(lasthop_control::StoreError::NotBuilt("--store").into());
    }
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

/// Trust and safety's running parts.
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
        no_edits: a.no_edits,
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
        notify(&[NotifyState::Reloading]);
        config.reread();
        if lists {
            tracing::info!("SIGHUP: re-reading the reputation lists");
            // The list watcher has stopped (the server is stopping): the config is still read.
            lists = reload.send(()).is_ok();
        }
        notify(&[NotifyState::Ready]);
    }
}
