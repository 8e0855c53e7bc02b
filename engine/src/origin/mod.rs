//! Origin read-through: what a serving core does when a code is in neither the snapshot nor the
//! overlay (docs/ARCHITECTURE.md, "The request path", step 6). Only the origin may say 404 for a
//! code below the high-water mark.
//!
//! The fetch runs on a few worker threads, never on a serving core: a core calls
//! [`Origin::submit`] (a short mutex hold, no I/O besides the eventfd write on a negative-cache
//! hit) and gets the answer later through its own [`OriginInbox`], whose eventfd its event loop
//! watches. Each worker does a blocking `ureq` GET of `GET /edge/v1/links/{code}` on the control
//! plane in use ([`ControlPlanes`]; its internal edge listener) with a bounded overall timeout.
//!
//! - **Singleflight per code**: submits for a code that is already being fetched join that fetch;
//!   every waiter, on any core, gets its answer.
//! - **Negative cache**: a 404 is remembered for `negative_ttl`, but only when every waiter said
//!   so (`may_cache_negative`): the engine passes `false` for generated codes inside the
//!   high-water reserve window, which may be minted any second.
//! - **Stale-if-error**: every good answer is kept; when a fetch fails or times out, the last good
//!   answer younger than `stale_ttl` is served instead of `Unavailable`. A mapping never changes,
//!   so the only staleness is in the state (a takedown, an expiry) and is bounded by `stale_ttl`.
//! - Only a 404 whose body carries the error code `not_found` counts as "no such link"; any other
//!   answer (a wrong path, a proxy's 404 page, a 5xx) is a failure. The caller re-checks the URL
//!   with [`lasthop_core::is_servable`] before it reaches a `Location` header.
//!
//! - **Fresh reuse**: a good answer younger than `fresh_ttl` (1 s) is reused without a fetch, so
//!   safe mode (which confirms every locally found redirect here) costs one fetch per hot code
//!   per second, not one per request.
//! - **Failover**: a fetch that cannot connect, times out or gets a 5xx moves the engine to the
//!   next control plane ([`ControlPlanes::failed`]) and is retried once there (unless that one
//!   failed within `breaker` too) before it counts as a failure.
//! - **Breaker**: a control plane that failed a fetch is skipped for `breaker` (1 s); once every
//!   one has, lookups get the stale answer or `Unavailable` at once, without a fetch: dead
//!   control planes cost a redirect nothing instead of a timeout. One miss with nothing stale
//!   may fetch every 100 ms meanwhile (a half-open trial), so a restarted control plane serves
//!   the links this engine has not heard of yet as soon as it is back.
//! - The edge token, when configured, travels as `Authorization: Bearer`.
//!
//! Those rules are [`lasthop_edge::origin_cache`]'s, a pure state machine tested with a fake
//! clock; this module holds it behind a mutex, fetches ([`client`]) and delivers ([`inbox`]).
//!
//! Both caches hold at most `max_entries` codes each; when full, expired entries go first, then
//! an arbitrary eighth. The number of codes being fetched at once is bounded too
//! ([`MAX_PENDING`]); past it a miss is answered from the stale cache or as `Unavailable`, so a
//! scanner cannot grow the queue without bound while the control plane is slow.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lasthop_edge::origin_cache::{CacheConfig, Lookup, OriginCache, Settled, Shortcut};

use crate::control::ControlPlanes;
use crate::metrics::prom::{family, sample};

mod client;
mod inbox;

pub use inbox::OriginInbox;
use inbox::Outbox;
pub use lasthop_edge::origin_cache::{Fetched, OriginAnswer};

/// Default of [`OriginConfig::max_pending`]: most distinct codes queued or being fetched at once.
pub const MAX_PENDING: usize = 4096;

/// Read-through settings.
#[derive(Debug, Clone)]
pub struct OriginConfig {
    /// Whole-request timeout (connect, send, read) of one fetch.
    pub timeout: Duration,
    /// How long a 404 is remembered.
    pub negative_ttl: Duration,
    /// How old a good answer may be and still be served when the origin fails.
    pub stale_ttl: Duration,
    /// Most codes in each cache.
    pub max_entries: usize,
    /// Fetching threads.
    pub workers: usize,
    /// A good answer younger than this is reused without a fetch (safe mode confirms every
    /// redirect at the origin; this keeps a hot code to one fetch per interval).
    pub fresh_ttl: Duration,
    /// A control plane that failed a fetch is not retried on for this long; once every one has
    /// failed, lookups are answered from the stale cache (or `Unavailable`) without trying: dead
    /// control planes cost a redirect nothing, instead of a timeout each.
    pub breaker: Duration,
    /// The edge token (`Authorization: Bearer`), when the control plane wants one.
    pub token: Option<String>,
    /// Most distinct codes queued or being fetched at once (`--origin-max-pending`).
    pub max_pending: usize,
}

impl Default for OriginConfig {
    fn default() -> Self {
        OriginConfig {
            timeout: Duration::from_millis(300),
            negative_ttl: Duration::from_secs(5),
            stale_ttl: Duration::from_secs(600),
            max_entries: 100_000,
            workers: 2,
            fresh_ttl: Duration::from_secs(1),
            breaker: Duration::from_secs(1),
            token: None,
            max_pending: MAX_PENDING,
        }
    }
}

/// One answer delivered to a core's inbox, for the `token` it submitted with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginReply {
    pub token: u64,
    pub code: Box<[u8]>,
    pub answer: OriginAnswer,
}

/// Why the read-through could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OriginError {
    #[error("creating an eventfd: {0}")]
    Eventfd(std::io::Error),
    #[error("starting an origin worker thread: {0}")]
    Spawn(std::io::Error),
}

/// Fetch and cache counters of the read-through, shown in `/metrics`.
#[derive(Debug, Default)]
pub struct OriginStats {
    /// HTTP fetches by outcome: found, not found, failed, timed out.
    fetches: [AtomicU64; 4],
    /// Submits that joined a fetch already under way.
    coalesced: AtomicU64,
    /// Submits answered from the negative cache.
    negative_hits: AtomicU64,
    /// Failures answered from the stale cache.
    stale_served: AtomicU64,
    /// Submits refused because [`MAX_PENDING`] codes were already pending.
    overflow: AtomicU64,
    /// Submits answered from a good answer younger than `fresh_ttl`.
    fresh_hits: AtomicU64,
    /// Submits answered without a fetch because every control plane's last fetch failed.
    breaker_open: AtomicU64,
    /// Queued fetches of cold codes dropped for warm ones when the queue was full.
    shed: AtomicU64,
    /// The read-through's state, to report what its caches hold at a scrape (weak: the
    /// state holds these stats).
    held: std::sync::OnceLock<std::sync::Weak<Shared>>,
}

const FETCH_OUTCOMES: [&str; 4] = ["found", "not_found", "error", "timeout"];

impl OriginStats {
    /// HTTP requests made to the origin so far.
    pub fn fetches(&self) -> u64 {
        self.fetches.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// Submits that joined a fetch under way.
    pub fn coalesced(&self) -> u64 {
        self.coalesced.load(Ordering::Relaxed)
    }

    /// Submits answered from the negative cache.
    pub fn negative_hits(&self) -> u64 {
        self.negative_hits.load(Ordering::Relaxed)
    }

    /// Failures answered with a stale good answer.
    pub fn stale_served(&self) -> u64 {
        self.stale_served.load(Ordering::Relaxed)
    }

    /// Appends these counters in Prometheus text format.
    pub(crate) fn render(&self, o: &mut String) {
        let f = "lasthop_engine_origin_fetches_total";
        family(
            o,
            f,
            "counter",
            "HTTP fetches from the control plane, by outcome.",
        );
        for (i, name) in FETCH_OUTCOMES.iter().enumerate() {
            let n = self.fetches[i].load(Ordering::Relaxed);
            sample(o, f, &format!("outcome=\"{name}\""), n);
        }
        for (name, help, c) in [
            (
                "lasthop_engine_origin_coalesced_total",
                "Origin lookups that joined a fetch already under way.",
                &self.coalesced,
            ),
            (
                "lasthop_engine_origin_negative_hits_total",
                "Origin lookups answered 404 from the negative cache.",
                &self.negative_hits,
            ),
            (
                "lasthop_engine_origin_stale_served_total",
                "Failed fetches answered with a stale good answer.",
                &self.stale_served,
            ),
            (
                "lasthop_engine_origin_overflow_total",
                "Origin lookups refused because too many codes were pending.",
                &self.overflow,
            ),
            (
                "lasthop_engine_origin_shed_total",
                "Waiting requests answered 503 because their cold code's queued fetch made room for a warm one (queue full).",
                &self.shed,
            ),
            (
                "lasthop_engine_origin_fresh_hits_total",
                "Origin lookups answered from a good answer under a second old.",
                &self.fresh_hits,
            ),
            (
                "lasthop_engine_origin_breaker_open_total",
                "Origin lookups answered without a fetch because every control plane just failed one.",
                &self.breaker_open,
            ),
        ] {
            family(o, name, "counter", help);
            sample(o, name, "", c.load(Ordering::Relaxed));
        }
        if let Some(shared) = self.held.get().and_then(std::sync::Weak::upgrade) {
            // A walk of the caches under their lock (at most max_entries each): a scrape's
            // cost, never a request's.
            let bytes = shared.lock().cache.held_bytes();
            let name = "lasthop_engine_origin_cache_bytes";
            family(
                o,
                name,
                "gauge",
                "Heap bytes the origin read-through's caches hold (codes, URLs, tables, waiters).",
            );
            sample(o, name, "", bytes as u64);
        }
    }
}

/// The cache and the workers' stop flag, under one lock. Waiters are (core, token).
struct State {
    cache: OriginCache<(usize, u64)>,
    shutdown: bool,
}

struct Shared {
    state: Mutex<State>,
    work: Condvar,
    cfg: OriginConfig,
    controls: Arc<ControlPlanes>,
    outboxes: Vec<Outbox>,
    stats: Arc<OriginStats>,
}

impl Shared {
    /// The state, even if a worker panicked while holding it (the cache's maps stay
    /// consistent: every update is a single insert or remove).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, core: usize, token: u64, code: Box<[u8]>, answer: OriginAnswer) {
        if let Some(out) = self.outboxes.get(core) {
            out.deliver(OriginReply {
                token,
                code,
                answer,
            });
        }
    }

    /// One HTTP fetch of `code` from control plane `control`, counted by outcome.
    fn fetch(&self, agent: &ureq::Agent, control: usize, code: &[u8]) -> Fetched {
        let fetched = client::fetch(
            agent,
            self.controls.url(control),
            self.cfg.token.as_deref(),
            code,
        );
        let outcome = match &fetched {
            Fetched::Found(_) => 0,
            Fetched::NotFound => 1,
            Fetched::Failed {
                timed_out: false, ..
            } => 2,
            Fetched::Failed {
                timed_out: true, ..
            } => 3,
        };
        self.stats.fetches[outcome].fetch_add(1, Ordering::Relaxed);
        fetched
    }
}

/// The read-through: worker threads and the shared caches. Dropping it stops the workers (each
/// finishes its current fetch, at most one timeout).
pub struct Origin {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Origin")
            .field("controls", &self.shared.controls)
            .field("workers", &self.workers.len())
            .finish_non_exhaustive()
    }
}

impl Origin {
    /// Starts `cfg.workers` fetching threads against `controls` (the control planes' edge
    /// listeners; the one in use is asked) and returns one inbox per serving core, in core order.
    pub fn start(
        controls: Arc<ControlPlanes>,
        cfg: OriginConfig,
        cores: usize,
    ) -> Result<(Origin, Vec<OriginInbox>), OriginError> {
        let mut outboxes = Vec::with_capacity(cores);
        let mut inboxes = Vec::with_capacity(cores);
        for _ in 0..cores {
            let (inbox, outbox) = inbox::pair().map_err(OriginError::Eventfd)?;
            outboxes.push(outbox);
            inboxes.push(inbox);
        }
        let agent = controls
            .agent()
            .timeout(cfg.timeout)
            .timeout_connect(cfg.timeout)
            .build();
        let cache = OriginCache::new(
            CacheConfig {
                fresh_ttl: cfg.fresh_ttl,
                stale_ttl: cfg.stale_ttl,
                negative_ttl: cfg.negative_ttl,
                breaker: cfg.breaker,
                max_entries: cfg.max_entries,
                max_pending: cfg.max_pending.max(1),
            },
            controls.len(),
        );
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                cache,
                shutdown: false,
            }),
            work: Condvar::new(),
            controls,
            outboxes,
            stats: Arc::new(OriginStats::default()),
            cfg,
        });
        let _ = shared.stats.held.set(Arc::downgrade(&shared));
        let mut origin = Origin {
            shared: Arc::clone(&shared),
            workers: Vec::new(),
        };
        for i in 0..shared.cfg.workers.max(1) {
            let shared = Arc::clone(&shared);
            let agent = agent.clone();
            let handle = std::thread::Builder::new()
                .name(format!("origin-{i}"))
                .spawn(move || worker(&shared, &agent))
                // On error `origin` drops here and stops the workers already started.
                .map_err(OriginError::Spawn)?;
            origin.workers.push(handle);
        }
        Ok((origin, inboxes))
    }

    /// Asks for `code` on behalf of serving core `core`; the answer arrives in that core's inbox
    /// with `token`. Never blocks on the network. `may_cache_negative`: whether a 404 for this
    /// code may be cached (false for generated codes inside the high-water reserve window).
    pub fn submit(&self, core: usize, code: &[u8], token: u64, may_cache_negative: bool) {
        let shared = &*self.shared;
        let stats = &shared.stats;
        let looked_up =
            shared
                .lock()
                .cache
                .lookup(code, (core, token), may_cache_negative, Instant::now());
        match looked_up {
            Lookup::Answered {
                waiter: (core, token),
                answer,
                via,
            } => {
                let counter = match via {
                    Shortcut::Negative => &stats.negative_hits,
                    Shortcut::Fresh => &stats.fresh_hits,
                    Shortcut::Breaker { .. } => &stats.breaker_open,
                    Shortcut::Overflow { .. } => &stats.overflow,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                if via == (Shortcut::Breaker { stale: true }) {
                    stats.stale_served.fetch_add(1, Ordering::Relaxed);
                }
                shared.deliver(core, token, code.into(), answer);
            }
            Lookup::Joined => {
                stats.coalesced.fetch_add(1, Ordering::Relaxed);
            }
            Lookup::Queued { shed } => {
                // A cold code's fetch dropped for this warm one: its waiters get a 503 (ask
                // again).
                if let Some(shed) = shed {
                    for (core, token) in shed.waiters {
                        stats.shed.fetch_add(1, Ordering::Relaxed);
                        shared.deliver(core, token, shed.code.clone(), OriginAnswer::Unavailable);
                    }
                }
                shared.work.notify_one()
            }
        }
    }

    /// The fetch and cache counters (for [`crate::metrics::EngineMetrics::origin`]).
    pub fn stats(&self) -> Arc<OriginStats> {
        Arc::clone(&self.shared.stats)
    }

    /// The feed brought a change to the links `keys`: their cached answers are dropped
    /// ([`OriginCache::forget`]).
    pub fn forget<'a>(&self, keys: impl IntoIterator<Item = &'a [u8]>) {
        let mut state = self.shared.lock();
        for key in keys {
            state.cache.forget(key);
        }
    }
}

impl Drop for Origin {
    fn drop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.work.notify_all();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

fn worker(shared: &Shared, agent: &ureq::Agent) {
    loop {
        let code = {
            let mut st = shared.lock();
            loop {
                if st.shutdown {
                    return;
                }
                if let Some(code) = st.cache.next_fetch() {
                    break code;
                }
                st = shared.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let (fetched, answered_by, failed_before) = fetch_failing_over(shared, agent, &code);
        let Settled {
            waiters,
            answer,
            stale_served,
        } = shared
            .lock()
            .cache
            .settle(&code, fetched, answered_by, failed_before, Instant::now());
        if stale_served {
            shared.stats.stale_served.fetch_add(1, Ordering::Relaxed);
        }
        for (core, token) in waiters {
            shared.deliver(core, token, code.clone(), answer.clone());
        }
    }
}

/// Fetches `code` from the control plane in use; when that one cannot be reached, times out or
/// answers 5xx, fails over and tries the next once (unless it failed within the breaker window
/// too). Returns the last fetch's outcome, the control plane that gave it, and the one that
/// failed before it, if the fetch was retried.
fn fetch_failing_over(
    shared: &Shared,
    agent: &ureq::Agent,
    code: &[u8],
) -> (Fetched, usize, Option<usize>) {
    let first = shared.controls.current();
    let fetched = shared.fetch(agent, first, code);
    if !matches!(
        fetched,
        Fetched::Failed {
            fail_over: true,
            ..
        }
    ) {
        return (fetched, first, None);
    }
    let next = shared.controls.failed(first, "an origin fetch failed");
    if next == first || shared.lock().cache.is_down(next, Instant::now()) {
        return (fetched, first, None);
    }
    (shared.fetch(agent, next, code), next, Some(first))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead as _, BufReader, Write as _};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, AtomicUsize};

    use lasthop_core::LinkStatus;

    type Handler = dyn Fn(&str) -> (u16, String, Duration) + Send + Sync;

    /// A tiny HTTP/1.1 origin on a real socket: counts requests, answers with `handler(path)`
    /// after its delay, closes every connection.
    struct TestOrigin {
        base: String,
        requests: Arc<AtomicUsize>,
        stop: Arc<AtomicBool>,
        accept: Option<JoinHandle<()>>,
    }

    impl TestOrigin {
        fn start(
            handler: impl Fn(&str) -> (u16, String, Duration) + Send + Sync + 'static,
        ) -> Self {
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let base = format!("http://{}", listener.local_addr().unwrap());
            let requests = Arc::new(AtomicUsize::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let handler: Arc<Handler> = Arc::new(handler);
            let accept = {
                let (requests, stop) = (Arc::clone(&requests), Arc::clone(&stop));
                std::thread::spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            return; // drops the listener: connections are refused from now on
                        }
                        let Ok(conn) = conn else { continue };
                        let (requests, handler) = (Arc::clone(&requests), Arc::clone(&handler));
                        std::thread::spawn(move || answer(conn, &requests, &*handler));
                    }
                })
            };
            TestOrigin {
                base,
                requests,
                stop,
                accept: Some(accept),
            }
        }

        fn requests(&self) -> usize {
            self.requests.load(Ordering::SeqCst)
        }

        /// Stops accepting and closes the listening socket.
        fn kill(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect(self.base.trim_start_matches("http://"));
            if let Some(a) = self.accept.take() {
                a.join().unwrap();
            }
        }
    }

    impl Drop for TestOrigin {
        fn drop(&mut self) {
            self.kill();
        }
    }

    fn answer(conn: TcpStream, requests: &AtomicUsize, handler: &Handler) {
        let mut reader = BufReader::new(conn.try_clone().unwrap());
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).is_err() {
            return;
        }
        loop {
            let mut line = String::new();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => {}
            }
        }
        requests.fetch_add(1, Ordering::SeqCst);
        let path = request_line.split(' ').nth(1).unwrap_or("").to_string();
        let (status, body, delay) = handler(&path);
        std::thread::sleep(delay);
        let mut conn = conn;
        let _ = write!(
            conn,
            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }

    fn link_json(code: &str, url: &str) -> String {
        format!(
            r#"{{"code":"{code}","long_url":"{url}","expires_at_ms":1893456000000,"status":"active","warn":true,"future_field":1}}"#
        )
    }

    fn not_found() -> String {
        r#"{"error":{"code":"not_found","message":"no link has this code"}}"#.to_string()
    }

    fn fast(status: u16, body: String) -> (u16, String, Duration) {
        (status, body, Duration::ZERO)
    }

    /// Every lookup fetches (no fresh reuse, no breaker), unless a test turns them on.
    fn cfg() -> OriginConfig {
        OriginConfig {
            timeout: Duration::from_secs(2),
            fresh_ttl: Duration::ZERO,
            breaker: Duration::ZERO,
            ..OriginConfig::default()
        }
    }

    /// One control plane at `url`.
    fn controls(url: &str) -> Arc<ControlPlanes> {
        Arc::new(ControlPlanes::new([url]).unwrap())
    }

    /// Collects `n` replies (waiting on the eventfd's counter, as a core's loop would).
    fn recv(inbox: &OriginInbox, n: usize) -> Vec<OriginReply> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.len() < n {
            assert!(
                Instant::now() < deadline,
                "only {} of {n} replies",
                out.len()
            );
            inbox.drain(&mut out);
            std::thread::sleep(Duration::from_millis(1));
        }
        out
    }

    fn one(
        origin: &Origin,
        inbox: &OriginInbox,
        code: &[u8],
        cache_negative: bool,
    ) -> OriginAnswer {
        origin.submit(0, code, 1, cache_negative);
        let mut r = recv(inbox, 1);
        assert_eq!(r.len(), 1);
        let r = r.pop().unwrap();
        assert_eq!((r.token, &*r.code), (1, code));
        r.answer
    }

    #[test]
    fn found_wakes_the_eventfd() {
        let server = TestOrigin::start(|path| match path {
            "/edge/v1/links/abcDEF1" => fast(200, link_json("abcDEF1", "https://example.com/a")),
            _ => fast(404, not_found()),
        });
        let (origin, inboxes) =
            Origin::start(controls(&format!("{}/", server.base)), cfg(), 2).unwrap();
        assert_ne!(inboxes[0].eventfd(), inboxes[1].eventfd());
        origin.submit(1, b"abcDEF1", 99, true);
        let deadline = Instant::now() + Duration::from_secs(5);
        // The reply is queued before the eventfd is written: once readable, it is there.
        let wakeups = loop {
            if let Some(n) = inboxes[1].efd.reset() {
                break n;
            }
            assert!(Instant::now() < deadline, "eventfd never readable");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(wakeups, 1);
        let reply = inboxes[1].try_recv().expect("reply after the wakeup");
        assert_eq!(reply.token, 99);
        assert_eq!(&*reply.code, b"abcDEF1");
        assert_eq!(
            reply.answer,
            OriginAnswer::Found {
                url: (*b"https://example.com/a").into(),
                expires_at_ms: Some(1_893_456_000_000),
                status: LinkStatus::Active,
                warn: true,
                options: Default::default(),
            }
        );
        assert!(
            inboxes[0].try_recv().is_none(),
            "only the submitting core hears"
        );
        assert_eq!(inboxes[1].efd.reset(), None, "drained counter");
        assert_eq!(origin.stats().fetches(), 1);
    }

    #[test]
    fn not_found_is_cached_only_where_allowed() {
        let server = TestOrigin::start(|_| fast(404, not_found()));
        let (origin, inboxes) = Origin::start(
            controls(&server.base),
            OriginConfig {
                negative_ttl: Duration::from_millis(300),
                ..cfg()
            },
            1,
        )
        .unwrap();
        let inbox = &inboxes[0];
        assert_eq!(
            one(&origin, inbox, b"no-such-alias", true),
            OriginAnswer::NotFound
        );
        assert_eq!(server.requests(), 1);
        assert_eq!(
            one(&origin, inbox, b"no-such-alias", true),
            OriginAnswer::NotFound
        );
        assert_eq!(
            server.requests(),
            1,
            "second answer from the negative cache"
        );
        assert_eq!(origin.stats().negative_hits(), 1);
        // A code inside the reserve window: never cached, never answered from the cache.
        assert_eq!(
            one(&origin, inbox, b"zzzzzz1", false),
            OriginAnswer::NotFound
        );
        assert_eq!(
            one(&origin, inbox, b"zzzzzz1", false),
            OriginAnswer::NotFound
        );
        assert_eq!(server.requests(), 3);
        assert_eq!(
            one(&origin, inbox, b"no-such-alias", false),
            OriginAnswer::NotFound
        );
        assert_eq!(
            server.requests(),
            4,
            "a caller that forbids the cache asks the origin"
        );
        // After negative_ttl the origin is asked again.
        std::thread::sleep(Duration::from_millis(350));
        assert_eq!(
            one(&origin, inbox, b"no-such-alias", true),
            OriginAnswer::NotFound
        );
        assert_eq!(server.requests(), 5);
    }

    #[test]
    fn singleflight_one_fetch_for_many_waiters() {
        let server = TestOrigin::start(|_| {
            (
                200,
                link_json("hotcode", "https://example.com/hot"),
                Duration::from_millis(300),
            )
        });
        let (origin, inboxes) = Origin::start(controls(&server.base), cfg(), 4).unwrap();
        let origin = Arc::new(origin);
        let threads: Vec<_> = (0..4)
            .map(|core| {
                let origin = Arc::clone(&origin);
                std::thread::spawn(move || {
                    for t in 0..25 {
                        origin.submit(core, b"hotcode", (core * 100 + t) as u64, true);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for (core, inbox) in inboxes.iter().enumerate() {
            let replies = recv(inbox, 25);
            let mut tokens: Vec<u64> = replies.iter().map(|r| r.token).collect();
            tokens.sort_unstable();
            let want: Vec<u64> = (0..25).map(|t| (core * 100 + t) as u64).collect();
            assert_eq!(tokens, want);
            assert!(replies
                .iter()
                .all(|r| matches!(&r.answer, OriginAnswer::Found { url, .. } if &**url == b"https://example.com/hot")));
        }
        assert_eq!(server.requests(), 1, "100 submits, one fetch");
        assert_eq!(origin.stats().coalesced(), 99);
    }

    #[test]
    fn timeout_is_unavailable() {
        let server = TestOrigin::start(|_| {
            (
                200,
                link_json("slowone", "https://example.com/s"),
                Duration::from_secs(2),
            )
        });
        let (origin, inboxes) = Origin::start(
            controls(&server.base),
            OriginConfig {
                timeout: Duration::from_millis(100),
                ..OriginConfig::default()
            },
            1,
        )
        .unwrap();
        let started = Instant::now();
        assert_eq!(
            one(&origin, &inboxes[0], b"slowone", true),
            OriginAnswer::Unavailable
        );
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "bounded by the timeout"
        );
        let mut text = String::new();
        origin.stats().render(&mut text);
        assert!(
            text.contains("lasthop_engine_origin_fetches_total{outcome=\"timeout\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn fresh_answers_are_reused_and_a_dead_origin_trips_the_breaker() {
        let mut server = TestOrigin::start(|path| match path {
            "/edge/v1/links/abcDEF1" => fast(200, link_json("abcDEF1", "https://example.com/a")),
            _ => fast(404, not_found()),
        });
        let (origin, inboxes) = Origin::start(
            controls(&server.base),
            OriginConfig {
                fresh_ttl: Duration::from_secs(60),
                breaker: Duration::from_secs(60),
                ..cfg()
            },
            1,
        )
        .unwrap();
        let inbox = &inboxes[0];
        let found = one(&origin, inbox, b"abcDEF1", true);
        assert_eq!(one(&origin, inbox, b"abcDEF1", true), found);
        assert_eq!(origin.stats().fetches(), 1, "the second answer was reused");
        server.kill();
        assert_eq!(
            one(&origin, inbox, b"otherco", true),
            OriginAnswer::Unavailable
        );
        assert_eq!(origin.stats().fetches(), 2);
        let started = Instant::now();
        assert_eq!(
            one(&origin, inbox, b"third01", true),
            OriginAnswer::Unavailable
        );
        assert_eq!(
            origin.stats().fetches(),
            2,
            "the open breaker skipped the fetch"
        );
        assert!(started.elapsed() < Duration::from_secs(1));
        let mut text = String::new();
        origin.stats().render(&mut text);
        assert!(
            text.contains("lasthop_engine_origin_breaker_open_total 1"),
            "{text}"
        );
    }

    #[test]
    fn stale_if_error_after_the_origin_dies() {
        let mut server = TestOrigin::start(|path| match path {
            "/edge/v1/links/abcDEF1" => fast(200, link_json("abcDEF1", "https://example.com/a")),
            _ => fast(404, not_found()),
        });
        let (origin, inboxes) = Origin::start(controls(&server.base), cfg(), 1).unwrap();
        let inbox = &inboxes[0];
        let found = one(&origin, inbox, b"abcDEF1", true);
        assert!(matches!(found, OriginAnswer::Found { .. }));
        server.kill();
        assert_eq!(
            one(&origin, inbox, b"abcDEF1", true),
            found,
            "stale answer served"
        );
        assert_eq!(origin.stats().stale_served(), 1);
        assert_eq!(
            one(&origin, inbox, b"otherco", true),
            OriginAnswer::Unavailable
        );
        drop(origin);

        // With no stale window, a failure is Unavailable even for a code seen before.
        let server =
            TestOrigin::start(|_| fast(200, link_json("abcDEF1", "https://example.com/a")));
        let (origin, inboxes) = Origin::start(
            controls(&server.base),
            OriginConfig {
                stale_ttl: Duration::ZERO,
                ..cfg()
            },
            1,
        )
        .unwrap();
        assert!(matches!(
            one(&origin, &inboxes[0], b"abcDEF1", true),
            OriginAnswer::Found { .. }
        ));
        let mut server = server;
        server.kill();
        assert_eq!(
            one(&origin, &inboxes[0], b"abcDEF1", true),
            OriginAnswer::Unavailable
        );
    }

    #[test]
    fn a_dead_control_plane_is_skipped_and_the_breaker_waits_for_every_one() {
        let mut dead = TestOrigin::start(|_| fast(500, String::new()));
        dead.kill(); // its port refuses connections from now on
        let mut live = TestOrigin::start(|path| match path {
            "/edge/v1/links/abcDEF1" => fast(200, link_json("abcDEF1", "https://example.com/a")),
            _ => fast(404, not_found()),
        });
        let controls = Arc::new(ControlPlanes::new([&dead.base, &live.base]).unwrap());
        let (origin, inboxes) = Origin::start(
            Arc::clone(&controls),
            OriginConfig {
                breaker: Duration::from_secs(60),
                ..cfg()
            },
            1,
        )
        .unwrap();
        let inbox = &inboxes[0];
        assert!(
            matches!(
                one(&origin, inbox, b"abcDEF1", true),
                OriginAnswer::Found { .. }
            ),
            "retried on the next control plane"
        );
        assert_eq!((controls.current(), controls.failovers()), (1, 1));
        assert_eq!(origin.stats().fetches(), 2);
        // It stays on the one that works.
        assert_eq!(
            one(&origin, inbox, b"never01", true),
            OriginAnswer::NotFound
        );
        assert_eq!((live.requests(), origin.stats().fetches()), (2, 3));

        // The second dies too: it fails over back to the first, which failed within the breaker
        // window, so there is no retry; now every control plane has failed and the breaker opens.
        live.kill();
        assert_eq!(
            one(&origin, inbox, b"otherco", true),
            OriginAnswer::Unavailable
        );
        assert_eq!((controls.current(), origin.stats().fetches()), (0, 4));
        assert_eq!(
            one(&origin, inbox, b"third01", true),
            OriginAnswer::Unavailable
        );
        assert_eq!(
            origin.stats().fetches(),
            4,
            "the open breaker skipped the fetch"
        );
        let mut text = String::new();
        origin.stats().render(&mut text);
        assert!(
            text.contains("lasthop_engine_origin_breaker_open_total 1"),
            "{text}"
        );
    }

    #[test]
    fn a_5xx_fails_over_and_a_not_found_does_not() {
        let handler = |status: u16, body: fn() -> String| {
            move |path: &str| match path {
                "/edge/v1/links/abcDEF1" => fast(status, body()),
                _ => fast(404, not_found()),
            }
        };
        let sick = TestOrigin::start(handler(503, || {
            r#"{"error":{"code":"storage_unavailable"}}"#.into()
        }));
        let good = TestOrigin::start(handler(200, || {
            link_json("abcDEF1", "https://example.com/a")
        }));
        let controls = Arc::new(ControlPlanes::new([&sick.base, &good.base]).unwrap());
        let (origin, inboxes) = Origin::start(Arc::clone(&controls), cfg(), 1).unwrap();
        // A 404 from the control plane in use is an answer: no one else is asked.
        assert_eq!(
            one(&origin, &inboxes[0], b"never01", false),
            OriginAnswer::NotFound
        );
        assert_eq!(
            (sick.requests(), good.requests(), controls.current()),
            (1, 0, 0)
        );
        // A 503 is its failure: the lookup is retried on the next, which answers.
        assert!(matches!(
            one(&origin, &inboxes[0], b"abcDEF1", true),
            OriginAnswer::Found { .. }
        ));
        assert_eq!(
            (sick.requests(), good.requests(), controls.current()),
            (2, 1, 1)
        );
        assert_eq!(controls.failovers(), 1);
    }

    #[test]
    fn only_the_edge_listeners_not_found_means_not_found() {
        let server = TestOrigin::start(|path| match path {
            "/edge/v1/links/wrongroute" => fast(404, r#"{"error":{"code":"no_route"}}"#.into()),
            "/edge/v1/links/htmlpage" => fast(404, "<html>not found</html>".into()),
            "/edge/v1/links/garbled" => fast(200, "{not json".into()),
            _ => fast(503, r#"{"error":{"code":"storage_unavailable"}}"#.into()),
        });
        let (origin, inboxes) = Origin::start(controls(&server.base), cfg(), 1).unwrap();
        for code in [&b"wrongroute"[..], b"htmlpage", b"garbled", b"abcDEF1"] {
            assert_eq!(
                one(&origin, &inboxes[0], code, true),
                OriginAnswer::Unavailable
            );
        }
        // Failures are never negatively cached.
        assert_eq!(
            one(&origin, &inboxes[0], b"wrongroute", true),
            OriginAnswer::Unavailable
        );
        assert_eq!(server.requests(), 5);
    }

    #[test]
    fn codes_are_percent_encoded() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let server = {
            let seen = Arc::clone(&seen);
            TestOrigin::start(move |path| {
                seen.lock().unwrap().push(path.to_string());
                fast(404, not_found())
            })
        };
        let (origin, inboxes) = Origin::start(controls(&server.base), cfg(), 1).unwrap();
        one(&origin, &inboxes[0], b"a b/c?\xff", true);
        assert_eq!(
            *seen.lock().unwrap(),
            vec!["/edge/v1/links/a%20b%2Fc%3F%FF".to_string()]
        );
    }
}
