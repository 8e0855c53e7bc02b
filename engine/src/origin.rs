//! Origin read-through: what a serving core does when a code is in neither the snapshot nor the
//! overlay (DESIGN.md, "The edge engine", step 6). Only the origin may say 404 for a code below
//! the high-water mark.
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
//!   control planes cost a redirect nothing instead of a timeout.
//! - The edge token, when configured, travels as `Authorization: Bearer`.
//!
//! Both caches hold at most `max_entries` codes each; when full, expired entries go first, then
//! an arbitrary eighth. The number of codes being fetched at once is bounded too
//! ([`MAX_PENDING`]); past it a miss is answered from the stale cache or as `Unavailable`, so a
//! scanner cannot grow the queue without bound while the control plane is slow.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lasthop_core::LinkStatus;
use serde::Deserialize;

use crate::control::ControlPlanes;
use crate::metrics::{family, sample};

/// Most distinct codes queued or being fetched at once.
pub const MAX_PENDING: usize = 4096;
/// Largest answer body read from the origin.
const MAX_BODY: u64 = 64 * 1024;

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
        }
    }
}

/// What the origin says about a code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginAnswer {
    /// The link exists (in any state; deleted ones have an empty `url`).
    Found {
        url: Box<[u8]>,
        expires_at_ms: Option<i64>,
        /// The status at the control plane's clock when it answered.
        status: LinkStatus,
        warn: bool,
    },
    /// The code never existed.
    NotFound,
    /// No answer (timeout, error) and nothing good enough cached.
    Unavailable,
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

/// A Linux eventfd: the worker adds one after pushing a reply, the core's loop polls it.
#[derive(Debug)]
struct EventFd(File);

impl EventFd {
    #[allow(unsafe_code)]
    fn new() -> std::io::Result<EventFd> {
        // SAFETY: eventfd(2) takes no pointers; it returns a new descriptor or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd(2), is valid, and nothing else owns it.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd(File::from(owned)))
    }

    /// Adds one to the counter (wakes a poller). The only failure, EAGAIN at a counter of
    /// 2^64 - 2, means a wakeup is already pending.
    fn notify(&self) {
        let _ = (&self.0).write(&1u64.to_ne_bytes());
    }

    /// Reads and zeroes the counter; `None` if it was zero.
    fn reset(&self) -> Option<u64> {
        let mut buf = [0u8; 8];
        match (&self.0).read(&mut buf) {
            Ok(8) => Some(u64::from_ne_bytes(buf)),
            _ => None,
        }
    }
}

/// A serving core's end of the read-through: replies to its submits, and an eventfd that
/// becomes readable when there are some.
#[derive(Debug)]
pub struct OriginInbox {
    rx: Receiver<OriginReply>,
    efd: Arc<EventFd>,
}

impl OriginInbox {
    /// The descriptor to watch for readability (io_uring poll or read, epoll). It is
    /// non-blocking and close-on-exec; [`OriginInbox::drain`] resets it.
    pub fn eventfd(&self) -> RawFd {
        self.efd.0.as_raw_fd()
    }

    /// Moves every waiting reply into `out` and resets the eventfd; never blocks. Returns how
    /// many were moved. The counter is reset before the queue is read, so a reply pushed during
    /// the drain either is taken now or leaves the eventfd readable: no wakeup is lost.
    pub fn drain(&self, out: &mut Vec<OriginReply>) -> usize {
        self.efd.reset();
        let before = out.len();
        out.extend(self.rx.try_iter());
        out.len() - before
    }

    /// One waiting reply, if any; does not touch the eventfd (use [`OriginInbox::drain`] when
    /// woken by it).
    pub fn try_recv(&self) -> Option<OriginReply> {
        self.rx.try_recv().ok()
    }
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
    }
}

/// A fetch under way and who waits for it.
struct Flight {
    waiters: Vec<(usize, u64)>,
    /// False as soon as one waiter forbids caching a 404.
    may_cache_negative: bool,
}

#[derive(Default)]
struct State {
    queue: VecDeque<Box<[u8]>>,
    inflight: HashMap<Box<[u8]>, Flight>,
    /// Last good answer and when it was fetched.
    positive: HashMap<Box<[u8]>, (OriginAnswer, Instant)>,
    /// 404s and when they stop counting.
    negative: HashMap<Box<[u8]>, Instant>,
    /// Per control plane (by index): until when it is not tried (its last fetch failed).
    /// Lookups skip the fetch while every one is.
    down_until: Vec<Option<Instant>>,
    shutdown: bool,
}

/// A core's outbox: the sending half of its inbox.
struct Outbox {
    tx: Sender<OriginReply>,
    efd: Arc<EventFd>,
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
    /// The state, even if a worker panicked while holding it (its maps stay consistent: every
    /// update is a single insert or remove).
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn deliver(&self, core: usize, token: u64, code: Box<[u8]>, answer: OriginAnswer) {
        if let Some(out) = self.outboxes.get(core) {
            // A send fails only when the core dropped its inbox (shutting down).
            if out
                .tx
                .send(OriginReply {
                    token,
                    code,
                    answer,
                })
                .is_ok()
            {
                out.efd.notify();
            }
        }
    }

    /// One HTTP fetch of `code` from control plane `control`, counted by outcome.
    fn fetch(&self, agent: &ureq::Agent, control: usize, code: &[u8]) -> Fetched {
        let fetched = fetch(
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

    /// The stale answer for `code`, if one is young enough.
    fn stale(&self, st: &State, code: &[u8], now: Instant) -> Option<OriginAnswer> {
        st.positive
            .get(code)
            .filter(|(_, at)| now.saturating_duration_since(*at) < self.cfg.stale_ttl)
            .map(|(a, _)| a.clone())
    }
}

impl State {
    fn is_down(&self, control: usize, now: Instant) -> bool {
        self.down_until
            .get(control)
            .copied()
            .flatten()
            .is_some_and(|until| now < until)
    }

    /// Every control plane failed within the breaker window.
    fn all_down(&self, now: Instant) -> bool {
        (0..self.down_until.len()).all(|i| self.is_down(i, now))
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
            let efd = Arc::new(EventFd::new().map_err(OriginError::Eventfd)?);
            let (tx, rx) = mpsc::channel();
            outboxes.push(Outbox {
                tx,
                efd: Arc::clone(&efd),
            });
            inboxes.push(OriginInbox { rx, efd });
        }
        let agent = ureq::AgentBuilder::new()
            .timeout(cfg.timeout)
            .timeout_connect(cfg.timeout)
            .redirects(0)
            .build();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                down_until: vec![None; controls.len()],
                ..State::default()
            }),
            work: Condvar::new(),
            controls,
            outboxes,
            stats: Arc::new(OriginStats::default()),
            cfg,
        });
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
        let mut st = shared.lock();
        if may_cache_negative {
            if let Some(&until) = st.negative.get(code) {
                if Instant::now() < until {
                    drop(st);
                    stats.negative_hits.fetch_add(1, Ordering::Relaxed);
                    shared.deliver(core, token, code.into(), OriginAnswer::NotFound);
                    return;
                }
                st.negative.remove(code);
            }
        }
        let now = Instant::now();
        let fresh = st
            .positive
            .get(code)
            .filter(|(_, at)| now.saturating_duration_since(*at) < shared.cfg.fresh_ttl)
            .map(|(a, _)| a.clone());
        if let Some(answer) = fresh {
            drop(st);
            stats.fresh_hits.fetch_add(1, Ordering::Relaxed);
            shared.deliver(core, token, code.into(), answer);
            return;
        }
        if st.all_down(now) {
            let answer = shared.stale(&st, code, now);
            drop(st);
            stats.breaker_open.fetch_add(1, Ordering::Relaxed);
            if answer.is_some() {
                stats.stale_served.fetch_add(1, Ordering::Relaxed);
            }
            let answer = answer.unwrap_or(OriginAnswer::Unavailable);
            shared.deliver(core, token, code.into(), answer);
            return;
        }
        if let Some(flight) = st.inflight.get_mut(code) {
            flight.waiters.push((core, token));
            flight.may_cache_negative &= may_cache_negative;
            stats.coalesced.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if st.inflight.len() >= MAX_PENDING {
            let answer = shared
                .stale(&st, code, Instant::now())
                .unwrap_or(OriginAnswer::Unavailable);
            drop(st);
            stats.overflow.fetch_add(1, Ordering::Relaxed);
            shared.deliver(core, token, code.into(), answer);
            return;
        }
        let key: Box<[u8]> = code.into();
        st.inflight.insert(
            key.clone(),
            Flight {
                waiters: vec![(core, token)],
                may_cache_negative,
            },
        );
        st.queue.push_back(key);
        drop(st);
        shared.work.notify_one();
    }

    /// The fetch and cache counters (for [`crate::metrics::EngineMetrics::origin`]).
    pub fn stats(&self) -> Arc<OriginStats> {
        Arc::clone(&self.shared.stats)
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

/// What one HTTP fetch gave.
enum Fetched {
    Found(OriginAnswer),
    NotFound,
    Failed {
        timed_out: bool,
        /// The control plane is unreachable, timed out or answered 5xx: try the next. (A 401, a
        /// stray 404 or a garbled body would be the same anywhere.)
        fail_over: bool,
    },
}

fn worker(shared: &Shared, agent: &ureq::Agent) {
    loop {
        let code = {
            let mut st = shared.lock();
            loop {
                if st.shutdown {
                    return;
                }
                if let Some(code) = st.queue.pop_front() {
                    break code;
                }
                st = shared.work.wait(st).unwrap_or_else(|p| p.into_inner());
            }
        };
        let (fetched, answered_by, failed_before) = fetch_failing_over(shared, agent, &code);
        let stats = &shared.stats;
        let now = Instant::now();
        let cfg = &shared.cfg;
        let (waiters, answer) = {
            let mut st = shared.lock();
            let flight = st.inflight.remove(&code);
            let may_cache_negative = flight.as_ref().is_some_and(|f| f.may_cache_negative);
            let down = (!cfg.breaker.is_zero()).then(|| now + cfg.breaker);
            let failed = matches!(fetched, Fetched::Failed { .. });
            for (control, failed) in [(failed_before, true), (Some(answered_by), failed)] {
                if let Some(slot) = control.and_then(|c| st.down_until.get_mut(c)) {
                    *slot = if failed { down } else { None };
                }
            }
            let answer = match fetched {
                Fetched::Found(answer) => {
                    st.negative.remove(&code);
                    bounded_insert(
                        &mut st.positive,
                        code.clone(),
                        (answer.clone(), now),
                        cfg.max_entries,
                        |(_, at)| now.saturating_duration_since(*at) < cfg.stale_ttl,
                    );
                    answer
                }
                Fetched::NotFound => {
                    st.positive.remove(&code);
                    if may_cache_negative && !cfg.negative_ttl.is_zero() {
                        bounded_insert(
                            &mut st.negative,
                            code.clone(),
                            now + cfg.negative_ttl,
                            cfg.max_entries,
                            |until| now < *until,
                        );
                    }
                    OriginAnswer::NotFound
                }
                Fetched::Failed { .. } => match shared.stale(&st, &code, now) {
                    Some(stale) => {
                        stats.stale_served.fetch_add(1, Ordering::Relaxed);
                        stale
                    }
                    None => OriginAnswer::Unavailable,
                },
            };
            (flight.map(|f| f.waiters).unwrap_or_default(), answer)
        };
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
    if next == first || shared.lock().is_down(next, Instant::now()) {
        return (fetched, first, None);
    }
    (shared.fetch(agent, next, code), next, Some(first))
}

/// Inserts, keeping `map` at most `max` long: when full, drops the entries `live` rejects, then
/// an arbitrary eighth (amortised O(1) per insert).
fn bounded_insert<V>(
    map: &mut HashMap<Box<[u8]>, V>,
    key: Box<[u8]>,
    value: V,
    max: usize,
    live: impl Fn(&V) -> bool,
) {
    if max == 0 {
        return;
    }
    if map.len() >= max && !map.contains_key(&key) {
        map.retain(|_, v| live(v));
        if map.len() >= max {
            let excess = map.len() - max * 7 / 8;
            let victims: Vec<Box<[u8]>> = map.keys().take(excess).cloned().collect();
            for k in victims {
                map.remove(&k);
            }
        }
    }
    map.insert(key, value);
}

/// The edge listener's answer (control-plane `edge::EdgeLink`); unknown fields are ignored so
/// the control plane can add some.
#[derive(Deserialize)]
struct WireLink {
    long_url: String,
    #[serde(default)]
    expires_at_ms: Option<i64>,
    status: LinkStatus,
    #[serde(default)]
    warn: bool,
}

#[derive(Deserialize)]
struct WireError {
    error: WireErrorBody,
}

#[derive(Deserialize)]
struct WireErrorBody {
    code: String,
}

/// Appends `code` to `url`, percent-encoding everything but unreserved characters (codes are
/// `[A-Za-z0-9_-]`, but the caller may hand over any bytes).
fn push_encoded(url: &mut String, code: &[u8]) {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    for &b in code {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            url.push(char::from(b));
        } else {
            url.push('%');
            url.push(char::from(HEX[usize::from(b >> 4)]));
            url.push(char::from(HEX[usize::from(b & 15)]));
        }
    }
}

fn fetch(agent: &ureq::Agent, base: &str, token: Option<&str>, code: &[u8]) -> Fetched {
    let mut url = String::with_capacity(base.len() + 16 + code.len() * 3);
    url.push_str(base);
    url.push_str("/edge/v1/links/");
    push_encoded(&mut url, code);
    let mut req = agent.get(&url);
    if let Some(token) = token {
        req = req.set("Authorization", &format!("Bearer {token}"));
    }
    match req.call() {
        Ok(resp) if resp.status() == 200 => {
            match serde_json::from_reader::<_, WireLink>(resp.into_reader().take(MAX_BODY)) {
                Ok(w) => Fetched::Found(OriginAnswer::Found {
                    url: w.long_url.into_bytes().into_boxed_slice(),
                    expires_at_ms: w.expires_at_ms,
                    status: w.status,
                    warn: w.warn,
                }),
                Err(e) => {
                    tracing::warn!(error = %e, "origin: unreadable answer");
                    let timed_out = is_timeout(&e);
                    Fetched::Failed {
                        timed_out,
                        fail_over: timed_out,
                    }
                }
            }
        }
        Ok(resp) => {
            tracing::warn!(status = resp.status(), "origin: unexpected status");
            Fetched::Failed {
                timed_out: false,
                fail_over: false,
            }
        }
        Err(ureq::Error::Status(404, resp)) => {
            match serde_json::from_reader::<_, WireError>(resp.into_reader().take(MAX_BODY)) {
                Ok(w) if w.error.code == "not_found" => Fetched::NotFound,
                _ => {
                    tracing::warn!("origin: a 404 that is not the edge listener's not_found");
                    Fetched::Failed {
                        timed_out: false,
                        fail_over: false,
                    }
                }
            }
        }
        Err(ureq::Error::Status(status, _)) => {
            tracing::warn!(status, "origin: error status");
            Fetched::Failed {
                timed_out: false,
                fail_over: status >= 500,
            }
        }
        Err(e) => {
            let timed_out = is_timeout(&e);
            tracing::warn!(error = %e, timed_out, "origin: fetch failed");
            Fetched::Failed {
                timed_out,
                fail_over: true,
            }
        }
    }
}

/// Whether an error chain bottoms out in an I/O timeout.
fn is_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if matches!(
                io.kind(),
                std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
            ) {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{BufRead as _, BufReader};
    use std::net::{TcpListener, TcpStream};
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicBool, AtomicUsize};

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

    #[test]
    fn caches_are_bounded() {
        let mut map = HashMap::new();
        for i in 0..1000u32 {
            bounded_insert(&mut map, i.to_le_bytes().into(), i, 64, |_| true);
            assert!(map.len() <= 64);
        }
        assert!(map.contains_key(&999u32.to_le_bytes()[..]));
        // Dead entries go first.
        let mut map = HashMap::new();
        for i in 0..64u32 {
            bounded_insert(&mut map, i.to_le_bytes().into(), i, 64, |_| true);
        }
        bounded_insert(&mut map, 1000u32.to_le_bytes().into(), 1000, 64, |v| {
            v % 2 == 0
        });
        assert_eq!(map.len(), 33);
        bounded_insert(&mut map, b"x"[..].into(), 0, 0, |_| true);
        assert!(!map.contains_key(&b"x"[..]));
    }

    /// The `lasthop-control` binary in this test's target directory (a workspace test run
    /// builds it), built through cargo only when it is missing, or `LASTHOP_CONTROL_BIN`.
    /// Building it unconditionally would resolve `-p lasthop-control`'s own feature set and
    /// rebuild half the dependency tree on every run.
    fn control_binary() -> std::path::PathBuf {
        if let Ok(p) = std::env::var("LASTHOP_CONTROL_BIN") {
            return p.into();
        }
        // .../target/debug/deps/lasthop_engine-HASH → .../target/debug
        let exe = std::env::current_exe().unwrap();
        let profile_dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
        if profile_dir.join("lasthop-control").exists() {
            return profile_dir.join("lasthop-control");
        }
        if let Ok(cargo) = std::env::var("CARGO") {
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "--quiet", "-p", "lasthop-control", "--target-dir"])
                .arg(profile_dir.parent().unwrap())
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            match profile_dir.file_name().and_then(|n| n.to_str()) {
                Some("debug") => {}
                Some(profile) => {
                    cmd.args(["--profile", profile]);
                }
                None => {}
            }
            assert!(cmd.status().unwrap().success(), "building lasthop-control");
        }
        profile_dir.join("lasthop-control")
    }

    struct Control {
        child: Child,
        api: String,
        edge: String,
        key: String,
        token: String,
        _dir: tempfile::TempDir,
    }

    impl Drop for Control {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    fn start_control() -> Control {
        let bin = control_binary();
        let dir = tempfile::tempdir().unwrap();
        let run = |args: &[&str]| {
            let out = Command::new(&bin).args(args).output().unwrap();
            assert!(out.status.success(), "{args:?}: {out:?}");
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        };
        let data = dir.path().join("data");
        let keyfile = dir.path().join("key");
        run(&["keygen", "--out", keyfile.to_str().unwrap()]);
        let key = run(&[
            "apikey",
            "create",
            "--data-dir",
            data.to_str().unwrap(),
            "--owner",
            "alice",
        ]);
        let mut child = Command::new(&bin)
            .args(["serve", "--data-dir", data.to_str().unwrap()])
            .args(["--key-file", keyfile.to_str().unwrap()])
            .args([
                "--api-listen",
                "127.0.0.1:0",
                "--edge-listen",
                "127.0.0.1:0",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap());
        let mut line = |prefix: &str| {
            let mut l = String::new();
            lines.read_line(&mut l).unwrap();
            l.trim()
                .strip_prefix(prefix)
                .unwrap_or_else(|| panic!("{l:?}"))
                .to_string()
        };
        let api = line("api listening on ");
        let edge = line("edge listening on ");
        let token = std::fs::read_to_string(data.join("edge.token"))
            .unwrap()
            .trim()
            .to_string();
        Control {
            child,
            api,
            edge,
            key,
            token,
            _dir: dir,
        }
    }

    fn create(control: &Control, body: &str) -> String {
        let resp: serde_json::Value = ureq::post(&format!("{}/v1/links", control.api))
            .set("Authorization", &format!("Bearer {}", control.key))
            .set("Content-Type", "application/json")
            .send_string(body)
            .unwrap()
            .into_json()
            .unwrap();
        resp["code"].as_str().unwrap().to_string()
    }

    /// Against the real control plane: found, deleted, never existed.
    #[test]
    fn reads_through_to_a_real_control_plane() {
        let control = start_control();
        let code = create(&control, r#"{"long_url":"https://example.com/real"}"#);
        let gone = create(
            &control,
            r#"{"long_url":"https://example.com/gone","alias":"gone-alias"}"#,
        );
        ureq::delete(&format!("{}/v1/links/{gone}", control.api))
            .set("Authorization", &format!("Bearer {}", control.key))
            .call()
            .unwrap();
        // Without the edge token the control plane answers 401: a failure, never "not found".
        let (anonymous, inboxes) = Origin::start(controls(&control.edge), cfg(), 1).unwrap();
        assert_eq!(
            one(&anonymous, &inboxes[0], code.as_bytes(), true),
            OriginAnswer::Unavailable
        );
        let with_token = OriginConfig {
            token: Some(control.token.clone()),
            ..cfg()
        };
        let (origin, inboxes) = Origin::start(controls(&control.edge), with_token, 1).unwrap();
        let inbox = &inboxes[0];
        assert_eq!(
            one(&origin, inbox, code.as_bytes(), true),
            OriginAnswer::Found {
                url: (*b"https://example.com/real").into(),
                expires_at_ms: None,
                status: LinkStatus::Active,
                warn: false,
            }
        );
        assert_eq!(
            one(&origin, inbox, b"gone-alias", true),
            OriginAnswer::Found {
                url: Box::new([]),
                expires_at_ms: None,
                status: LinkStatus::Deleted,
                warn: false,
            }
        );
        assert_eq!(
            one(&origin, inbox, b"never-existed", true),
            OriginAnswer::NotFound
        );
        assert_eq!(
            one(&origin, inbox, b"never-existed", true),
            OriginAnswer::NotFound
        );
        assert_eq!(origin.stats().fetches(), 3);
        assert_eq!(origin.stats().negative_hits(), 1);
    }
}
