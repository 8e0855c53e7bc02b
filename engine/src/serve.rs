//! The serving cores: one glommio executor pinned per core, each running one loop (io_uring or
//! epoll) inside one glommio task that keeps the thread (it never yields back to glommio:
//! `run_core` says why).

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glommio::{LocalExecutorBuilder, Placement};

use crate::http::Limits;
use crate::io::epoll::EpollLoop;
use crate::io::uring::{UringConfig, UringLoop};
#[cfg(feature = "xdp")]
use crate::io::xdp::run::XdpLoop;
use crate::metrics::CoreMetrics;
use crate::origin::{Origin, OriginInbox};
use crate::session::CoreCtx;
use crate::tables::{Published, Tables};
use crate::topk::TopK;

/// Which loop drives the sockets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Uring,
    Epoll,
    /// AF_XDP on one interface, a userspace TCP (`--io xdp`; the `xdp` feature).
    #[cfg(feature = "xdp")]
    Xdp,
}

impl Backend {
    /// Name for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Uring => "io_uring",
            Backend::Epoll => "epoll",
            #[cfg(feature = "xdp")]
            Backend::Xdp => "af_xdp",
        }
    }

    /// Whether connections are kernel sockets, which kTLS can take over after the handshake.
    pub fn kernel_sockets(self) -> bool {
        match self {
            Backend::Uring | Backend::Epoll => true,
            #[cfg(feature = "xdp")]
            Backend::Xdp => false,
        }
    }

    /// Whether the loop serves `--tls-listen` (the epoll fallback serves plain HTTP only).
    pub fn serves_tls(self) -> bool {
        match self {
            Backend::Uring => true,
            Backend::Epoll => false,
            #[cfg(feature = "xdp")]
            Backend::Xdp => true,
        }
    }
}

/// What the control thread shares with every core: the published tables ([`Published`], the
/// generation swap) and the stop flag.
#[derive(Debug)]
pub struct Shared {
    tables: Arc<Published>,
    stop: AtomicBool,
    /// Cores whose loop has returned (drained or failed).
    finished: std::sync::atomic::AtomicUsize,
    /// Cores whose listeners are armed in their ring (or epoll set).
    started: std::sync::atomic::AtomicUsize,
}

impl Shared {
    /// Shared state serving `tables`.
    pub fn new(tables: Tables) -> Arc<Self> {
        Arc::new(Shared {
            tables: Arc::new(Published::new(tables)),
            stop: AtomicBool::new(false),
            finished: std::sync::atomic::AtomicUsize::new(0),
            started: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// Publishes new tables; every core picks them up at its next turn.
    pub fn publish(&self, tables: Tables) {
        self.tables.publish(tables);
    }

    /// The published tables, for a writer of its own (the feed's applier).
    pub fn published(&self) -> Arc<Published> {
        Arc::clone(&self.tables)
    }

    /// The tables now being served.
    pub fn current(&self) -> Option<Arc<Tables>> {
        self.tables.current()
    }

    /// Asks every core to stop accepting and drain.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Cores whose loop has returned.
    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::Acquire)
    }

    /// Cores serving: their listeners are armed, so connections the kernel hashes to them are
    /// accepted. The engine says it is listening only once every core is.
    pub fn started(&self) -> usize {
        self.started.load(Ordering::Acquire)
    }

    /// Waits until `cores` cores serve, or fails naming how many did within `limit`.
    pub fn wait_started(&self, cores: usize, limit: Duration) -> Result<(), CoreError> {
        let deadline = std::time::Instant::now() + limit;
        while self.started() < cores {
            if self.finished() > 0 || std::time::Instant::now() > deadline {
                return Err(CoreError::NotStarted {
                    started: self.started(),
                    cores,
                    waited: limit,
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}

/// Per-core settings.
#[derive(Debug, Clone)]
pub struct CoreConfig {
    pub backend: Backend,
    pub uring: UringConfig,
    pub limits: Limits,
    pub fixed: bool,
    /// One redirect in this many is counted in the hot-code sketch.
    pub top_sample: u64,
    /// Header lines for every answer over TLS: `Strict-Transport-Security`, then `Alt-Svc`.
    pub hsts: Arc<[u8]>,
    /// `--redirect-http-to-https`: the HTTPS port plain-listener requests are redirected to.
    pub https_redirect: Option<u16>,
    /// The names the HTTPS certificate covers (HTTP/2's 421), with `--tls-listen`.
    pub coverage: Option<Arc<crate::tls::CertCoverage>>,
    /// The preview and interstitial pages' extras (`--report-url`).
    pub pages: Arc<crate::render::Pages>,
    /// TLS counters, with `--tls-listen`.
    pub tls_stats: Option<Arc<crate::tls::TlsStats>>,
    /// How long a draining core waits for its connections to finish.
    pub drain: Duration,
    /// glommio's own registered I/O memory per executor; kept small so the engine starts under
    /// an 8 MiB memlock limit as a non-root user (our sockets do not use it).
    pub glommio_io_memory: usize,
}

/// Binds one SO_REUSEPORT listener per core on `addr` (all on the port the first one got, so
/// `:0` works) and returns them with the bound address. Refuses an address another process
/// already listens on, rather than sharing its connections with it.
pub fn listeners(addr: SocketAddr, cores: usize) -> std::io::Result<(Vec<OwnedFd>, SocketAddr)> {
    crate::io::socket::check_free(addr)?;
    let first = crate::io::socket::reuseport_listener(addr, 4096)?;
    let bound = crate::io::socket::local_addr(first.as_raw_fd())?;
    let mut all = vec![first];
    for _ in 1..cores {
        all.push(crate::io::socket::reuseport_listener(bound, 4096)?);
    }
    Ok((all, bound))
}

/// A core's QUIC socket (its place in the reuseport group is the core's index) and the
/// configuration shared by every core's endpoint.
#[derive(Debug)]
pub struct QuicStart {
    pub socket: OwnedFd,
    pub shared: crate::quic::QuicShared,
}

/// Everything one core needs to start.
#[derive(Debug)]
pub struct CoreStart {
    pub index: usize,
    pub cpu: Option<usize>,
    pub listener: OwnedFd,
    pub inbox: Option<OriginInbox>,
    pub metrics: Arc<CoreMetrics>,
    pub top: Arc<TopK>,
    /// The feed's counters (safe-mode fallbacks, creation-to-first-redirect), with `--control`.
    pub feed: Option<Arc<crate::feed::FeedStats>>,
    /// The core's HTTPS listener, with `--tls-listen` (io_uring and AF_XDP backends).
    pub tls: Option<crate::io::uring::TlsListen>,
    /// The core's QUIC socket and what every core's endpoint shares, when HTTP/3 is served.
    pub quic: Option<QuicStart>,
    /// The core's click recorder, unless `--clicks off`.
    pub clicks: Option<crate::clicks::Recorder>,
    /// With `--io xdp`: the queue this core serves and the XSKMAP its socket goes in.
    #[cfg(feature = "xdp")]
    pub xdp: Option<(crate::io::xdp::run::XdpCore, Arc<crate::io::xdp::XskMap>)>,
}

enum Loop {
    Uring(Box<UringLoop>),
    Epoll(Box<EpollLoop>),
    #[cfg(feature = "xdp")]
    Xdp(Box<XdpLoop>),
}

impl Loop {
    fn turn(&mut self, ctx: &mut CoreCtx) -> std::io::Result<()> {
        match self {
            Loop::Uring(l) => l.turn(ctx),
            Loop::Epoll(l) => l.turn(ctx),
            #[cfg(feature = "xdp")]
            Loop::Xdp(l) => l.turn(ctx),
        }
    }
    fn stop_accepting(&mut self, ctx: &mut CoreCtx) -> std::io::Result<()> {
        match self {
            Loop::Uring(l) => l.stop_accepting(ctx),
            Loop::Epoll(l) => l.stop_accepting(ctx),
            #[cfg(feature = "xdp")]
            Loop::Xdp(l) => l.stop_accepting(ctx),
        }
    }
    fn open_conns(&self) -> usize {
        match self {
            Loop::Uring(l) => l.open_conns(),
            Loop::Epoll(l) => l.open_conns(),
            #[cfg(feature = "xdp")]
            Loop::Xdp(l) => l.open_conns(),
        }
    }
}

/// Why a serving core could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoreError {
    #[error("starting the executor of core {core}: {source}")]
    Executor { core: usize, source: std::io::Error },
    #[error("the published tables are unreadable (a writer panicked)")]
    TablesPoisoned,
    #[error("{started} of {cores} serving cores started within {waited:?}")]
    NotStarted {
        started: usize,
        cores: usize,
        waited: Duration,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

/// glommio's preemption timer for the serving executors (see `spawn_core`).
const PREEMPT_NEVER: Duration = Duration::from_secs(86_400);

/// Starts one pinned glommio executor for this core; returns when the core has drained.
pub fn spawn_core(
    start: CoreStart,
    config: CoreConfig,
    shared: Arc<Shared>,
    origin: Option<Arc<Origin>>,
) -> Result<glommio::ExecutorJoinHandle<Result<(), CoreError>>, CoreError> {
    let placement = match start.cpu {
        Some(cpu) => Placement::Fixed(cpu),
        None => Placement::Unbound,
    };
    let start_index = start.index;
    let handle = LocalExecutorBuilder::new(placement)
        .name(&format!("core-{}", start.index))
        .io_memory(config.glommio_io_memory)
        // The core's one task never yields (see `run_core`), so glommio's preemption timer has
        // nothing to preempt; it must only never fire before that task's first poll. A timer
        // that expires while the thread waits for a CPU between glommio's installing it and
        // running its queues makes glommio skip the queues and park with the task unrun, for
        // good: a core that never accepts (with 1 ms, about 1 engine start in 50 on a loaded
        // 2-CPU host; with 1 ns, every start). A day leaves no such window.
        .preempt_timer(PREEMPT_NEVER)
        .spawn(move || async move {
            let index = start.index;
            let done = Arc::clone(&shared);
            let result = run_core(start, config, shared, origin).await;
            done.finished.fetch_add(1, Ordering::AcqRel);
            if let Err(e) = &result {
                // A core that cannot serve leaves its share of connections unanswered: exit so
                // the supervisor restarts the whole engine rather than limp on.
                tracing::error!(core = index, error = %e, "serving core failed; exiting");
                std::process::exit(1);
            }
            result
        })
        .map_err(|e| CoreError::Executor {
            core: start_index,
            source: e.into(),
        })?;
    Ok(handle)
}

async fn run_core(
    start: CoreStart,
    config: CoreConfig,
    shared: Arc<Shared>,
    origin: Option<Arc<Origin>>,
) -> Result<(), CoreError> {
    // The generation before the tables: a publish between the two reads then leaves this core
    // with newer tables under an older number (taken again next turn), never the reverse.
    let mut generation = shared.tables.generation();
    let tables = shared.current().ok_or(CoreError::TablesPoisoned)?;
    let mut ctx = CoreCtx {
        core: start.index,
        tables,
        limits: config.limits,
        metrics: start.metrics,
        origin,
        top: start.top,
        feed: start.feed,
        hsts: Arc::clone(&config.hsts),
        pages: Arc::clone(&config.pages),
        tls: config.tls_stats.clone(),
        now_ms: 0,
        fixed: config.fixed,
        top_sample: config.top_sample.max(1),
        turn_start: std::time::Instant::now(),
        answered: std::cell::Cell::new(0),
        clicks: start.clicks,
        headers: crate::session::Headers::default(),
        https_redirect: config.https_redirect,
        coverage: config.coverage.clone(),
    };
    ctx.refresh_clock();
    let mut lp = match config.backend {
        Backend::Uring => Loop::Uring(Box::new(UringLoop::new(
            start.listener,
            start.inbox,
            config.uring.clone(),
            start.tls,
            start
                .quic
                .map(|q| crate::quic::QuicCore::new(start.index, q.socket, q.shared)),
        )?)),
        Backend::Epoll => Loop::Epoll(Box::new(EpollLoop::new(
            start.listener,
            start.inbox,
            config.uring.tick,
            config.uring.idle_timeout_ms,
            config.uring.header_timeout_ms,
            start
                .quic
                .map(|q| crate::quic::QuicCore::new(start.index, q.socket, q.shared)),
        )?)),
        #[cfg(feature = "xdp")]
        Backend::Xdp => {
            let (core, map) = start.xdp.ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "the AF_XDP backend without its queue",
                )
            })?;
            // Connections reach this core through its socket only; the kernel listener is
            // closed so that connections from this host (which never cross the interface)
            // are refused rather than left in an accept queue nobody reads.
            drop(start.listener);
            Loop::Xdp(Box::new(XdpLoop::new(
                &core,
                &map,
                config.uring.max_conns as usize,
                start.inbox,
                config.uring.tick,
                config.uring.idle_timeout_ms,
                config.uring.header_timeout_ms,
                start.tls,
            )?))
        }
    };
    shared.started.fetch_add(1, Ordering::AcqRel);
    let mut draining_since: Option<i64> = None;
    loop {
        shared.tables.refresh(&mut generation, &mut ctx.tables);
        if shared.stop.load(Ordering::Acquire) && draining_since.is_none() {
            lp.stop_accepting(&mut ctx)?;
            draining_since = Some(ctx.now_ms);
        }
        if let Some(since) = draining_since {
            if lp.open_conns() == 0 || ctx.now_ms - since > config.drain.as_millis() as i64 {
                return Ok(());
            }
        }
        // No yield back to glommio between turns. Both `yield_if_needed()` and a plain yield on
        // `need_preempt()` let the executor park for good with this task never re-run (idle
        // engines failed to drain 1 in 4; a loaded one stopped answering mid-test). Nothing else
        // runs on these executors and the loop's own multishot tick bounds every wait, so the
        // task simply keeps the thread; glommio keeps the pinning and the executor around it.
        lp.turn(&mut ctx)?;
    }
}
