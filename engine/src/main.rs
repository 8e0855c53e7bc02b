//! `lasthop-engine`: the edge redirect server PoP operators run.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, ValueEnum};
use lasthop_core::{CodeScheme, PermutationKey};
use lasthop_engine::admin::{spawn_admin, AdminState};
use lasthop_engine::answer::Layer;
use lasthop_engine::http::Limits;
use lasthop_engine::metrics::EngineMetrics;
use lasthop_engine::origin::{Origin, OriginConfig};
use lasthop_engine::serve::{self, Backend, CoreConfig, CoreStart, Shared};
use lasthop_engine::signals::{self, Signal};
use lasthop_engine::tables::Tables;
use lasthop_engine::topk::TopK;
use lasthop_engine::uring::{self, UringConfig};
use lasthop_snapshot::Snapshot;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Io {
    /// io_uring where the kernel allows it, else epoll.
    Auto,
    Uring,
    Epoll,
}

#[derive(Parser, Debug)]
#[command(
    name = "lasthop-engine",
    version,
    about = "lasthop edge redirect server"
)]
struct Args {
    /// Snapshot file to serve (SIGHUP re-opens this path and swaps it in).
    #[arg(long, env = "LASTHOP_SNAPSHOT")]
    snapshot: PathBuf,
    /// Permutation key file (the control plane's; never sent over the network).
    #[arg(long, env = "LASTHOP_KEY_FILE")]
    key_file: PathBuf,
    /// Redirect listener.
    #[arg(long, env = "LASTHOP_LISTEN", default_value = "0.0.0.0:8080")]
    listen: SocketAddr,
    /// Admin listener: /metrics, /healthz, /readyz, /debug/top.
    #[arg(long, env = "LASTHOP_ADMIN_LISTEN", default_value = "127.0.0.1:9090")]
    admin_listen: SocketAddr,
    /// The control plane's edge listener, for read-through on misses.
    #[arg(long, env = "LASTHOP_CONTROL")]
    control: Option<String>,
    /// Serving cores (default: every CPU this process may run on).
    #[arg(long, env = "LASTHOP_CORES")]
    cores: Option<usize>,
    /// CPUs to pin the cores to, comma separated (default 0..cores).
    #[arg(long, env = "LASTHOP_CPUS", value_delimiter = ',')]
    cpus: Vec<usize>,
    /// Socket backend.
    #[arg(long, value_enum, default_value = "auto")]
    io: Io,
    /// Benchmark floor: answer every request with one fixed 302, no lookup.
    #[arg(long)]
    fixed_response: bool,
    /// Close connections idle this many seconds.
    #[arg(long, default_value_t = 60)]
    idle_timeout: u64,
    /// Close connections that take longer than this to send a request head (slowloris).
    #[arg(long, default_value_t = 10)]
    header_timeout: u64,
    /// Most connections per core.
    #[arg(long, default_value_t = 16_384)]
    max_conns_per_core: u32,
    /// Seconds to wait for open connections on SIGTERM.
    #[arg(long, default_value_t = 5)]
    drain_timeout: u64,
}

fn open_snapshot(path: &Path) -> anyhow::Result<Arc<Snapshot>> {
    let snapshot =
        Snapshot::open(path).with_context(|| format!("opening snapshot {}", path.display()))?;
    snapshot
        .verify()
        .with_context(|| format!("verifying snapshot {}", path.display()))?;
    Ok(Arc::new(snapshot))
}

fn main() -> anyhow::Result<()> {
    // Before any thread exists, so every thread inherits the mask and only the control thread
    // (this one) takes SIGHUP/SIGTERM.
    signals::block()?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let key = PermutationKey::load(&args.key_file)?;
    let scheme = CodeScheme::new(&key)?;
    let snapshot = open_snapshot(&args.snapshot)?;
    let tables = Tables::from_snapshot(
        scheme.clone(),
        Arc::clone(&snapshot),
        args.control.is_some(),
    )?;

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

    let backend = match args.io {
        Io::Epoll => Backend::Epoll,
        Io::Uring => {
            uring::probe().context("io_uring requested but unavailable")?;
            Backend::Uring
        }
        Io::Auto => match uring::probe() {
            Ok(()) => Backend::Uring,
            Err(e) => {
                tracing::warn!(error = %e, "io_uring unavailable (io_uring_disabled, seccomp or an old kernel): serving with epoll");
                Backend::Epoll
            }
        },
    };

    let layers: &'static [&'static str] = Box::leak(Box::new(Layer::ALL.map(Layer::as_str)));
    let mut metrics = EngineMetrics::new(cores, backend.as_str(), layers);

    let (origin, inboxes) = match &args.control {
        Some(url) => {
            let (origin, inboxes) = Origin::start(url, OriginConfig::default(), cores)?;
            metrics.origin = Some(origin.stats());
            (
                Some(Arc::new(origin)),
                inboxes.into_iter().map(Some).collect(),
            )
        }
        None => (None, (0..cores).map(|_| None).collect::<Vec<_>>()),
    };
    metrics
        .snapshot_sequence
        .store(snapshot.sequence(), Ordering::Relaxed);
    metrics
        .snapshot_links
        .store(snapshot.links(), Ordering::Relaxed);
    let metrics = Arc::new(metrics);
    let tops: Vec<Arc<TopK>> = (0..cores).map(|_| Arc::new(TopK::new())).collect();

    let (listeners, bound) =
        serve::listeners(args.listen, cores).with_context(|| format!("binding {}", args.listen))?;
    let admin_listener = TcpListener::bind(args.admin_listen)
        .with_context(|| format!("binding admin {}", args.admin_listen))?;
    let admin_addr = admin_listener.local_addr()?;
    let admin = Arc::new(AdminState {
        metrics: Arc::clone(&metrics),
        sketches: tops.clone(),
    });
    spawn_admin(admin_listener, Arc::clone(&admin))?;

    let shared = Shared::new(tables);
    let config = CoreConfig {
        backend,
        uring: UringConfig {
            max_conns: args.max_conns_per_core,
            idle_timeout_ms: (args.idle_timeout * 1000) as i64,
            header_timeout_ms: (args.header_timeout * 1000) as i64,
            ..UringConfig::default()
        },
        limits: Limits::default(),
        fixed: args.fixed_response,
        drain: Duration::from_secs(args.drain_timeout),
        glommio_io_memory: 256 << 10,
    };
    let mut handles = Vec::with_capacity(cores);
    for (index, (listener, inbox)) in listeners.into_iter().zip(inboxes).enumerate() {
        let start = CoreStart {
            index,
            cpu: cpus.get(index).copied().flatten(),
            listener,
            inbox,
            metrics: Arc::clone(&metrics.cores[index]),
            top: Arc::clone(&tops[index]),
        };
        handles.push(serve::spawn_core(
            start,
            config.clone(),
            Arc::clone(&shared),
            origin.clone(),
        )?);
    }
    admin.set_ready(true);
    tracing::info!(listen = %bound, admin = %admin_addr, cores, io = backend.as_str(),
        snapshot_links = snapshot.links(), sequence = snapshot.sequence(), "engine serving");
    // Machine-readable lines for scripts and tests (`--listen 127.0.0.1:0` works).
    println!(
        "engine listening on http://{bound} ({}, {cores} cores)",
        backend.as_str()
    );
    println!("admin listening on http://{admin_addr}");
    use std::io::Write as _;
    std::io::stdout().flush()?;

    loop {
        match signals::wait()? {
            Signal::Reload => match open_snapshot(&args.snapshot).and_then(|s| {
                let current = shared
                    .current()
                    .ok_or_else(|| anyhow::anyhow!("tables lock poisoned"))?;
                let next = current.with_snapshot(Arc::clone(&s))?;
                Ok((s, next))
            }) {
                Ok((s, next)) => {
                    shared.publish(next);
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
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), "SIGHUP: keeping the current snapshot")
                }
            },
            Signal::Stop => {
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
    tracing::info!("stopped");
    Ok(())
}
