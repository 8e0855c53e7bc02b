//! The read-through's decisions, without threads or sockets: which lookups are answered at once
//! (a cached 404, a fresh answer, the breaker open), which join a fetch already under way
//! (singleflight), which start one, and what a fetch's outcome does to the caches and to the
//! control planes' breakers. Time is an argument (`now`), so every rule is tested with a fake
//! clock; the engine's `origin` module holds one of these behind a mutex and does the fetching.
//!
//! - **Negative cache**: a 404 is remembered for `negative_ttl`, but only when every waiter said
//!   so (`may_cache_negative`): generated codes inside the high-water reserve window may be
//!   minted any second, so the engine passes `false` for them.
//! - **Fresh reuse**: a good answer younger than `fresh_ttl` is reused without a fetch.
//! - **Stale-if-error**: a good answer younger than `stale_ttl` is served when a fetch fails, or
//!   when every control plane's breaker is open.
//! - **Breaker**: a control plane whose fetch failed is skipped for `breaker`; once every one
//!   is, lookups are answered (stale or `Unavailable`) without a fetch, except one **trial**
//!   every tenth of `breaker` (half-open): a miss with nothing stale to serve may fetch, so a
//!   control plane that came back (a restart takes about a second) answers the links the
//!   engine has not heard of yet within 100 ms of its return, not after the rest of the window;
//!   a failed trial holds the breaker open for another `breaker`.
//! - Both caches hold at most `max_entries` codes; at most `max_pending` codes are queued or
//!   being fetched, past which a miss is answered from the stale cache or as `Unavailable`.
//! - **Cold codes are shed first** (seeds, S2: a code nobody asked for recently is more likely a
//!   scanner's): when the queue is full, a lookup of a *warm* code (one answered before, queued
//!   for a fetch within [`WARM_WINDOW`], or already wanted by a second waiter) takes the place of the newest
//!   queued fetch of a cold code, whose waiters are answered `Unavailable` (503, ask again),
//!   instead of being refused itself. Codes in the engine's local tables never come here
//!   (safe mode's confirmations fall back to the local answer when the origin cannot say).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use lasthop_core::LinkStatus;

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
        /// How the redirect is served.
        options: lasthop_core::LinkOptions,
    },
    /// The code never existed.
    NotFound,
    /// No answer (timeout, error) and nothing good enough cached.
    Unavailable,
}

impl OriginAnswer {
    /// The link a [`OriginAnswer::Found`] carries, as the decision takes it.
    pub fn link(&self) -> Option<crate::answer::OriginLink<'_>> {
        match self {
            OriginAnswer::Found {
                url,
                expires_at_ms,
                status,
                warn,
                options,
            } => Some(crate::answer::OriginLink {
                url,
                expires_at_ms: *expires_at_ms,
                status: *status,
                warn: *warn,
                options: *options,
            }),
            OriginAnswer::NotFound | OriginAnswer::Unavailable => None,
        }
    }
}

/// The cache's settings (the engine's `OriginConfig` carries them).
#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub fresh_ttl: Duration,
    pub stale_ttl: Duration,
    pub negative_ttl: Duration,
    pub breaker: Duration,
    pub max_entries: usize,
    pub max_pending: usize,
}

/// What one fetch from one control plane gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fetched {
    /// The link (an [`OriginAnswer::Found`]).
    Found(OriginAnswer),
    NotFound,
    Failed {
        timed_out: bool,
        /// The control plane is unreachable, timed out or answered 5xx: try the next. (A 401,
        /// a stray 404 or a garbled body would be the same anywhere.)
        fail_over: bool,
    },
}

/// Why a lookup was answered without a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortcut {
    /// A remembered 404.
    Negative,
    /// A good answer younger than `fresh_ttl`.
    Fresh,
    /// Every control plane's breaker is open; `stale` says whether a stale answer was served.
    Breaker { stale: bool },
    /// Too many codes are pending; `stale` as above.
    Overflow { stale: bool },
}

/// What [`OriginCache::lookup`] decided.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<W> {
    /// Answered now: hand `answer` to `waiter`.
    Answered {
        waiter: W,
        answer: OriginAnswer,
        via: Shortcut,
    },
    /// Joined the fetch of this code already under way.
    Joined,
    /// A fetch was queued; [`OriginCache::next_fetch`] hands it out. `shed`: a cold code's
    /// fetch dropped to make room (answer its waiters `Unavailable`).
    Queued { shed: Option<Shed<W>> },
}

/// A queued fetch dropped for a warmer one.
#[derive(Debug, PartialEq, Eq)]
pub struct Shed<W> {
    pub code: Box<[u8]>,
    pub waiters: Vec<W>,
}

/// How long a code counts as warm after it was asked for.
pub const WARM_WINDOW: Duration = Duration::from_secs(60);

/// What a fetch's outcome settles: every waiter gets `answer`.
#[derive(Debug, PartialEq, Eq)]
pub struct Settled<W> {
    pub waiters: Vec<W>,
    pub answer: OriginAnswer,
    /// The fetch failed and a stale answer was served instead.
    pub stale_served: bool,
}

/// A fetch under way and who waits for it.
#[derive(Debug)]
struct Flight<W> {
    waiters: Vec<W>,
    /// False as soon as one waiter forbids caching a 404.
    may_cache_negative: bool,
    /// Known or asked for recently, or wanted by several waiters: not shed for another.
    warm: bool,
    /// A change to the code arrived over the feed while this fetch was under way: its answer
    /// may predate the change, so it goes to its waiters but into no cache.
    outdated: bool,
}

/// The read-through's state: queued and in-flight fetches with their waiters (of type `W`,
/// whatever the caller needs to deliver an answer), both caches, and one breaker per control
/// plane.
#[derive(Debug)]
pub struct OriginCache<W> {
    cfg: CacheConfig,
    queue: VecDeque<Box<[u8]>>,
    inflight: HashMap<Box<[u8]>, Flight<W>>,
    /// Last good answer and when it was fetched.
    positive: HashMap<Box<[u8]>, (OriginAnswer, Instant)>,
    /// 404s and when they stop counting.
    negative: HashMap<Box<[u8]>, Instant>,
    /// Codes asked for, and when (what makes a code warm).
    asked: HashMap<Box<[u8]>, Instant>,
    /// Per control plane (by index): until when it is not tried.
    down_until: Vec<Option<Instant>>,
    /// The last failed fetch or trial: the next trial is due a tenth of `breaker` after it.
    last_try: Option<Instant>,
}

impl<W> OriginCache<W> {
    /// A cache in front of `controls` control planes (at least one).
    pub fn new(cfg: CacheConfig, controls: usize) -> Self {
        OriginCache {
            cfg,
            queue: VecDeque::new(),
            inflight: HashMap::new(),
            positive: HashMap::new(),
            negative: HashMap::new(),
            asked: HashMap::new(),
            down_until: vec![None; controls.max(1)],
            last_try: None,
        }
    }

    /// Heap bytes the read-through holds: each map's table (its capacity, a control byte a
    /// slot), the codes, the cached URLs, the waiters and the queue. A walk of every entry
    /// (at most `max_entries` a cache): for a scrape, not a request.
    pub fn held_bytes(&self) -> usize {
        use std::mem::size_of;
        fn table<K, V>(m: &HashMap<K, V>) -> usize {
            m.capacity() * (size_of::<(K, V)>() + 1)
        }
        let keys = |m: &HashMap<Box<[u8]>, Instant>| m.keys().map(|k| k.len()).sum::<usize>();
        let positive: usize = self
            .positive
            .iter()
            .map(|(k, (a, _))| {
                k.len()
                    + match a {
                        OriginAnswer::Found { url, .. } => url.len(),
                        _ => 0,
                    }
            })
            .sum();
        let inflight: usize = self
            .inflight
            .iter()
            .map(|(k, f)| k.len() + f.waiters.capacity() * size_of::<W>())
            .sum();
        table(&self.positive)
            + table(&self.negative)
            + table(&self.asked)
            + table(&self.inflight)
            + positive
            + inflight
            + keys(&self.negative)
            + keys(&self.asked)
            + self.queue.capacity() * size_of::<Box<[u8]>>()
            + self.queue.iter().map(|k| k.len()).sum::<usize>()
    }

    /// A lookup of `code` for `waiter`. `may_cache_negative`: whether a 404 for this code may be
    /// remembered (and a remembered one used).
    pub fn lookup(
        &mut self,
        code: &[u8],
        waiter: W,
        may_cache_negative: bool,
        now: Instant,
    ) -> Lookup<W> {
        if may_cache_negative {
            if let Some(&until) = self.negative.get(code) {
                if now < until {
                    return Lookup::Answered {
                        waiter,
                        answer: OriginAnswer::NotFound,
                        via: Shortcut::Negative,
                    };
                }
                self.negative.remove(code);
            }
        }
        let fresh = self
            .positive
            .get(code)
            .filter(|(_, at)| now.saturating_duration_since(*at) < self.cfg.fresh_ttl)
            .map(|(a, _)| a.clone());
        if let Some(answer) = fresh {
            return Lookup::Answered {
                waiter,
                answer,
                via: Shortcut::Fresh,
            };
        }
        if self.all_down(now) {
            let stale = self.stale(code, now);
            let trial = stale.is_none()
                && !self.inflight.contains_key(code)
                && self
                    .last_try
                    .is_none_or(|at| now.saturating_duration_since(at) >= self.cfg.breaker / 10);
            if !trial {
                let via = Shortcut::Breaker {
                    stale: stale.is_some(),
                };
                return Lookup::Answered {
                    waiter,
                    answer: stale.unwrap_or(OriginAnswer::Unavailable),
                    via,
                };
            }
            // Half-open: this miss fetches (below); its outcome opens or closes the breaker.
            self.last_try = Some(now);
        }
        if let Some(flight) = self.inflight.get_mut(code) {
            flight.waiters.push(waiter);
            flight.may_cache_negative &= may_cache_negative;
            flight.warm = true;
            return Lookup::Joined;
        }
        let warm = self.positive.contains_key(code)
            || self
                .asked
                .get(code)
                .is_some_and(|at| now.saturating_duration_since(*at) < WARM_WINDOW);
        let mut shed = None;
        if self.inflight.len() >= self.cfg.max_pending {
            let room = if warm { self.shed_cold() } else { None };
            match room {
                Some(dropped) => shed = Some(dropped),
                None => {
                    let stale = self.stale(code, now);
                    let via = Shortcut::Overflow {
                        stale: stale.is_some(),
                    };
                    return Lookup::Answered {
                        waiter,
                        answer: stale.unwrap_or(OriginAnswer::Unavailable),
                        via,
                    };
                }
            }
        }
        let key: Box<[u8]> = code.into();
        // Only a lookup that got a fetch counts as asked: a refused one retried at once must
        // not make itself warm (a scanner would shed everyone's fetches by asking twice).
        bounded_insert(
            &mut self.asked,
            key.clone(),
            now,
            self.cfg.max_entries,
            |at| now.saturating_duration_since(*at) < WARM_WINDOW,
        );
        self.inflight.insert(
            key.clone(),
            Flight {
                waiters: vec![waiter],
                may_cache_negative,
                warm,
                outdated: false,
            },
        );
        self.queue.push_back(key);
        Lookup::Queued { shed }
    }

    /// Drops the newest queued (not yet fetching) fetch of a cold code. Looks at the queue
    /// only when it is full, so this linear scan is bounded by `max_pending`.
    fn shed_cold(&mut self) -> Option<Shed<W>> {
        let at = self
            .queue
            .iter()
            .rposition(|k| self.inflight.get(k).is_some_and(|f| !f.warm))?;
        let code = self.queue.remove(at)?;
        let waiters = self.inflight.remove(&code)?.waiters;
        Some(Shed { code, waiters })
    }

    /// The next code to fetch, oldest first.
    pub fn next_fetch(&mut self) -> Option<Box<[u8]>> {
        self.queue.pop_front()
    }

    /// Whether control plane `control` failed within the breaker window.
    pub fn is_down(&self, control: usize, now: Instant) -> bool {
        self.down_until
            .get(control)
            .copied()
            .flatten()
            .is_some_and(|until| now < until)
    }

    /// Every control plane failed within the breaker window.
    pub fn all_down(&self, now: Instant) -> bool {
        (0..self.down_until.len()).all(|i| self.is_down(i, now))
    }

    /// The fetch of `code` ended with `fetched`, from control plane `answered_by`, after
    /// `failed_before` failed (when the fetch was retried on another). Updates the breakers
    /// and the caches and hands back the waiters with their answer.
    pub fn settle(
        &mut self,
        code: &[u8],
        fetched: Fetched,
        answered_by: usize,
        failed_before: Option<usize>,
        now: Instant,
    ) -> Settled<W> {
        let flight = self.inflight.remove(code);
        let may_cache_negative = flight.as_ref().is_some_and(|f| f.may_cache_negative);
        let outdated = flight.as_ref().is_some_and(|f| f.outdated);
        let down = (!self.cfg.breaker.is_zero()).then(|| now + self.cfg.breaker);
        let failed = matches!(fetched, Fetched::Failed { .. });
        if failed || failed_before.is_some() {
            self.last_try = Some(now);
        }
        for (control, failed) in [(failed_before, true), (Some(answered_by), failed)] {
            if let Some(slot) = control.and_then(|c| self.down_until.get_mut(c)) {
                *slot = if failed { down } else { None };
            }
        }
        let (max, stale_ttl) = (self.cfg.max_entries, self.cfg.stale_ttl);
        let mut stale_served = false;
        let answer = match fetched {
            Fetched::Found(answer) if outdated => answer,
            Fetched::Found(answer) => {
                self.negative.remove(code);
                bounded_insert(
                    &mut self.positive,
                    code.into(),
                    (answer.clone(), now),
                    max,
                    |(_, at)| now.saturating_duration_since(*at) < stale_ttl,
                );
                answer
            }
            Fetched::NotFound => {
                self.positive.remove(code);
                if may_cache_negative && !outdated && !self.cfg.negative_ttl.is_zero() {
                    bounded_insert(
                        &mut self.negative,
                        code.into(),
                        now + self.cfg.negative_ttl,
                        max,
                        |until| now < *until,
                    );
                }
                OriginAnswer::NotFound
            }
            Fetched::Failed { .. } => match self.stale(code, now) {
                Some(stale) => {
                    stale_served = true;
                    stale
                }
                None => OriginAnswer::Unavailable,
            },
        };
        Settled {
            waiters: flight.map(|f| f.waiters).unwrap_or_default(),
            answer,
            stale_served,
        }
    }

    /// A change to `code` arrived over the feed (an edit, a takedown, a restore): every answer
    /// cached for it (fresh, stale-if-error, 404) is dropped, and a fetch under way caches
    /// nothing when it lands, so no answer from before the change is served again from here.
    pub fn forget(&mut self, code: &[u8]) {
        self.positive.remove(code);
        self.negative.remove(code);
        if let Some(flight) = self.inflight.get_mut(code) {
            flight.outdated = true;
        }
    }

    /// The stale answer for `code`, if one is young enough.
    fn stale(&self, code: &[u8], now: Instant) -> Option<OriginAnswer> {
        self.positive
            .get(code)
            .filter(|(_, at)| now.saturating_duration_since(*at) < self.cfg.stale_ttl)
            .map(|(a, _)| a.clone())
    }

    /// Codes in the good-answer and 404 caches.
    pub fn cached(&self) -> (usize, usize) {
        (self.positive.len(), self.negative.len())
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    fn cfg() -> CacheConfig {
        CacheConfig {
            fresh_ttl: S,
            stale_ttl: 600 * S,
            negative_ttl: 5 * S,
            breaker: S,
            max_entries: 100,
            max_pending: 4,
        }
    }

    fn found(url: &str) -> OriginAnswer {
        OriginAnswer::Found {
            url: url.as_bytes().into(),
            expires_at_ms: None,
            status: LinkStatus::Active,
            warn: false,
            options: Default::default(),
        }
    }

    const FAILED: Fetched = Fetched::Failed {
        timed_out: true,
        fail_over: true,
    };

    /// Looks `code` up for waiter `w` and expects a queued fetch, which it takes.
    fn fetch_needed(c: &mut OriginCache<u32>, code: &[u8], w: u32, neg: bool, now: Instant) {
        assert_eq!(c.lookup(code, w, neg, now), Lookup::Queued { shed: None });
        assert_eq!(c.next_fetch().as_deref(), Some(code));
    }

    #[test]
    fn lookups_of_one_code_share_one_fetch() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(cfg(), 1);
        fetch_needed(&mut c, b"abc1234", 1, true, t0);
        assert_eq!(c.lookup(b"abc1234", 2, true, t0), Lookup::Joined);
        assert_eq!(c.lookup(b"abc1234", 3, true, t0), Lookup::Joined);
        assert_eq!(c.next_fetch(), None, "one fetch for three waiters");
        let s = c.settle(b"abc1234", Fetched::Found(found("https://a/")), 0, None, t0);
        assert_eq!(s.waiters, vec![1, 2, 3]);
        assert_eq!(s.answer, found("https://a/"));
        assert!(!s.stale_served);
    }

    /// What the cache reports holding grows with what it caches (its URLs among it) and
    /// stays within its bound however many codes pass through.
    #[test]
    fn held_bytes_follow_what_is_cached() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(cfg(), 1);
        assert_eq!(c.held_bytes(), 0);
        let long = format!("https://example.com/{}", "a".repeat(1000));
        fetch_needed(&mut c, b"abc1234", 1, true, t0);
        c.settle(b"abc1234", Fetched::Found(found(&long)), 0, None, t0);
        let one = c.held_bytes();
        assert!(one > 1000 + 7, "{one}");
        let mut most = 0;
        for i in 0..1000u32 {
            let code = format!("c{i:06}");
            let t = t0 + Duration::from_millis(u64::from(i));
            fetch_needed(&mut c, code.as_bytes(), i, true, t);
            c.settle(code.as_bytes(), Fetched::Found(found(&long)), 0, None, t);
            most = most.max(c.held_bytes());
        }
        // At most max_entries (100) URLs of ~1 KB each, and tables for about as many.
        assert!(most < 100 * 2000 + 64 * 1024, "{most}");
        assert!(most > 50 * 1000, "{most}");
    }

    #[test]
    fn a_fresh_answer_is_reused_until_fresh_ttl() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(cfg(), 1);
        fetch_needed(&mut c, b"abc1234", 1, true, t0);
        c.settle(b"abc1234", Fetched::Found(found("https://a/")), 0, None, t0);
        assert_eq!(
            c.lookup(b"abc1234", 2, true, t0 + S / 2),
            Lookup::Answered {
                waiter: 2,
                answer: found("https://a/"),
                via: Shortcut::Fresh
            }
        );
        fetch_needed(&mut c, b"abc1234", 3, true, t0 + S);
    }

    #[test]
    fn a_failed_fetch_serves_the_stale_answer_until_stale_ttl() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(
            CacheConfig {
                breaker: Duration::ZERO,
                ..cfg()
            },
            1,
        );
        fetch_needed(&mut c, b"abc1234", 1, true, t0);
        c.settle(b"abc1234", Fetched::Found(found("https://a/")), 0, None, t0);
        let t1 = t0 + 10 * S;
        fetch_needed(&mut c, b"abc1234", 2, true, t1);
        let s = c.settle(b"abc1234", FAILED, 0, None, t1);
        assert_eq!((s.answer, s.stale_served), (found("https://a/"), true));
        // Past stale_ttl the answer is gone: unavailable, never a 404.
        let t2 = t0 + 601 * S;
        fetch_needed(&mut c, b"abc1234", 3, true, t2);
        let s = c.settle(b"abc1234", FAILED, 0, None, t2);
        assert_eq!(
            (s.answer, s.stale_served),
            (OriginAnswer::Unavailable, false)
        );
        // A failure for a code never seen is unavailable too.
        fetch_needed(&mut c, b"zzz9999", 4, true, t2);
        let s = c.settle(b"zzz9999", FAILED, 0, None, t2);
        assert_eq!(s.answer, OriginAnswer::Unavailable);
    }

    /// An edit (any change) arriving over the feed: nothing cached before it is served again,
    /// neither fresh nor stale-if-error nor a 404, and a fetch under way when it arrived
    /// caches nothing.
    #[test]
    fn a_change_from_the_feed_drops_what_was_cached_before_it() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(
            CacheConfig {
                breaker: Duration::ZERO,
                ..cfg()
            },
            1,
        );
        fetch_needed(&mut c, b"abc1234", 1, true, t0);
        c.settle(
            b"abc1234",
            Fetched::Found(found("https://old/")),
            0,
            None,
            t0,
        );
        c.forget(b"abc1234");
        // Not fresh any more: fetched again; and a failure has no stale answer to give.
        fetch_needed(&mut c, b"abc1234", 2, true, t0);
        let s = c.settle(b"abc1234", FAILED, 0, None, t0);
        assert_eq!(
            (s.answer, s.stale_served),
            (OriginAnswer::Unavailable, false)
        );
        // A 404 is forgotten too.
        fetch_needed(&mut c, b"some-alias", 3, true, t0);
        c.settle(b"some-alias", Fetched::NotFound, 0, None, t0);
        c.forget(b"some-alias");
        fetch_needed(&mut c, b"some-alias", 4, true, t0);
        // A fetch under way when the change arrives: its answer reaches its waiters (the
        // engine then prefers its tables) but no cache.
        c.forget(b"some-alias");
        let s = c.settle(b"some-alias", Fetched::NotFound, 0, None, t0);
        assert_eq!((s.waiters, s.answer), (vec![4], OriginAnswer::NotFound));
        fetch_needed(&mut c, b"some-alias", 5, true, t0);
        c.forget(b"some-alias");
        let s = c.settle(
            b"some-alias",
            Fetched::Found(found("https://old/")),
            0,
            None,
            t0,
        );
        assert_eq!(s.answer, found("https://old/"));
        fetch_needed(&mut c, b"some-alias", 6, true, t0);
        let s = c.settle(b"some-alias", FAILED, 0, None, t0);
        assert_eq!(
            s.answer,
            OriginAnswer::Unavailable,
            "nothing stale to serve"
        );
    }

    #[test]
    fn a_404_is_remembered_only_where_every_waiter_allows_it() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(cfg(), 1);
        // An alias (may cache): remembered for negative_ttl.
        fetch_needed(&mut c, b"some-alias", 1, true, t0);
        c.settle(b"some-alias", Fetched::NotFound, 0, None, t0);
        assert_eq!(
            c.lookup(b"some-alias", 2, true, t0 + 4 * S),
            Lookup::Answered {
                waiter: 2,
                answer: OriginAnswer::NotFound,
                via: Shortcut::Negative
            }
        );
        // A lookup that may not use the negative cache (inside the reserve window) fetches.
        fetch_needed(&mut c, b"some-alias", 3, false, t0 + 4 * S);
        c.settle(b"some-alias", Fetched::NotFound, 0, None, t0 + 4 * S);
        fetch_needed(&mut c, b"other-alias", 4, true, t0 + 6 * S);
        // Expired: fetched again.
        fetch_needed(&mut c, b"some-alias", 5, true, t0 + 10 * S);
        // A joined waiter in the reserve window forbids caching the fetch's 404.
        fetch_needed(&mut c, b"abc1234", 6, true, t0);
        assert_eq!(c.lookup(b"abc1234", 7, false, t0), Lookup::Joined);
        let s = c.settle(b"abc1234", Fetched::NotFound, 0, None, t0);
        assert_eq!(s.waiters, vec![6, 7]);
        fetch_needed(&mut c, b"abc1234", 8, true, t0 + S / 10);
    }

    #[test]
    fn a_404_drops_the_good_answer_and_a_find_drops_the_404() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(
            CacheConfig {
                fresh_ttl: Duration::ZERO,
                ..cfg()
            },
            1,
        );
        fetch_needed(&mut c, b"abc1234", 1, true, t0);
        c.settle(b"abc1234", Fetched::Found(found("https://a/")), 0, None, t0);
        fetch_needed(&mut c, b"abc1234", 2, true, t0);
        c.settle(b"abc1234", Fetched::NotFound, 0, None, t0);
        // The link was deleted for good: a failure now has nothing stale to serve.
        fetch_needed(&mut c, b"abc1234", 3, false, t0);
        let s = c.settle(b"abc1234", FAILED, 0, None, t0);
        assert_eq!(s.answer, OriginAnswer::Unavailable);
        assert_eq!(c.cached(), (0, 1));
    }

    #[test]
    fn the_breaker_opens_when_every_control_plane_failed() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(
            CacheConfig {
                fresh_ttl: Duration::ZERO,
                ..cfg()
            },
            2,
        );
        fetch_needed(&mut c, b"abc1234", 1, true, t0);
        c.settle(b"abc1234", Fetched::Found(found("https://a/")), 0, None, t0);
        // Control plane 0 fails and 1 answers: only 0 is down.
        fetch_needed(&mut c, b"abc1234", 2, true, t0);
        c.settle(
            b"abc1234",
            Fetched::Found(found("https://a/")),
            1,
            Some(0),
            t0,
        );
        assert!(c.is_down(0, t0) && !c.is_down(1, t0) && !c.all_down(t0));
        // Both fail: lookups are answered without a fetch, stale where there is something.
        fetch_needed(&mut c, b"abc1234", 3, true, t0);
        c.settle(b"abc1234", FAILED, 1, Some(0), t0);
        assert!(c.all_down(t0));
        assert_eq!(
            c.lookup(b"abc1234", 4, true, t0 + S / 2),
            Lookup::Answered {
                waiter: 4,
                answer: found("https://a/"),
                via: Shortcut::Breaker { stale: true }
            }
        );
        let breaker = |w| Lookup::Answered {
            waiter: w,
            answer: OriginAnswer::Unavailable,
            via: Shortcut::Breaker { stale: false },
        };
        // A miss with nothing stale: no fetch within a tenth of the window of the failure...
        assert_eq!(c.lookup(b"new7777", 5, true, t0 + S / 20), breaker(5));
        // ... then one trial (half-open), and no other fetch until a tenth after it.
        fetch_needed(&mut c, b"new7777", 6, true, t0 + S / 2);
        assert_eq!(c.lookup(b"new8888", 7, true, t0 + S / 2), breaker(7));
        assert_eq!(
            c.lookup(b"new8888", 8, true, t0 + S / 2 + S / 20),
            breaker(8)
        );
        // The trial fails: the breaker stays open a whole window from then, and the next trial
        // is a tenth of the window later.
        let s = c.settle(b"new7777", FAILED, 1, None, t0 + S / 2);
        assert_eq!(s.answer, OriginAnswer::Unavailable);
        assert!(c.is_down(1, t0 + S / 2 + S * 9 / 10));
        assert_eq!(
            c.lookup(b"new8888", 9, true, t0 + S / 2 + S / 20),
            breaker(9)
        );
        // The next trial gets an answer: the breaker closes at once.
        fetch_needed(&mut c, b"new8888", 10, true, t0 + S / 2 + S / 10);
        c.settle(b"new8888", Fetched::NotFound, 1, None, t0 + S / 2 + S / 10);
        assert!(!c.is_down(1, t0 + S / 2 + S / 10));
        assert!(!c.all_down(t0 + S / 2 + S / 10));
        // After the window, a fetch is tried again; a success closes that breaker.
        fetch_needed(&mut c, b"new9999", 11, true, t0 + 2 * S);
        c.settle(b"new9999", Fetched::NotFound, 1, None, t0 + 2 * S);
        assert!(!c.is_down(1, t0 + 2 * S));
    }

    #[test]
    fn a_zero_breaker_never_opens() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(
            CacheConfig {
                breaker: Duration::ZERO,
                ..cfg()
            },
            1,
        );
        fetch_needed(&mut c, b"abc1234", 1, true, t0);
        c.settle(b"abc1234", FAILED, 0, None, t0);
        assert!(!c.all_down(t0));
    }

    #[test]
    fn pending_fetches_are_bounded() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(cfg(), 1);
        for (i, code) in [b"aaa0001", b"aaa0002", b"aaa0003", b"aaa0004"]
            .iter()
            .enumerate()
        {
            assert_eq!(
                c.lookup(*code, i as u32, true, t0),
                Lookup::Queued { shed: None }
            );
        }
        assert_eq!(
            c.lookup(b"aaa0005", 9, true, t0),
            Lookup::Answered {
                waiter: 9,
                answer: OriginAnswer::Unavailable,
                via: Shortcut::Overflow { stale: false }
            }
        );
        // Joining a pending fetch is still allowed.
        assert_eq!(c.lookup(b"aaa0001", 10, true, t0), Lookup::Joined);
        let code = c.next_fetch().unwrap();
        c.settle(&code, Fetched::NotFound, 0, None, t0);
        assert_eq!(
            c.lookup(b"aaa0005", 11, true, t0),
            Lookup::Queued { shed: None }
        );
    }

    #[test]
    fn a_full_queue_sheds_cold_codes_for_warm_ones() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(cfg(), 1);
        // A known link, answered a while ago (stale for reuse, but warm).
        fetch_needed(&mut c, b"known01", 1, true, t0);
        c.settle(b"known01", Fetched::Found(found("https://k/")), 0, None, t0);
        let t1 = t0 + Duration::from_secs(5);
        // A scanner burst fills the queue with codes nobody asked for before.
        for (i, code) in [b"scan001", b"scan002", b"scan003", b"scan004"]
            .iter()
            .enumerate()
        {
            assert_eq!(
                c.lookup(*code, 10 + i as u32, true, t1),
                Lookup::Queued { shed: None }
            );
        }
        // Another cold code is refused, as before.
        assert!(matches!(
            c.lookup(b"scan005", 20, true, t1),
            Lookup::Answered {
                via: Shortcut::Overflow { .. },
                ..
            }
        ));
        // The known link takes the newest cold fetch's place; its waiter is answered.
        assert_eq!(
            c.lookup(b"known01", 2, true, t1),
            Lookup::Queued {
                shed: Some(Shed {
                    code: b"scan004"[..].into(),
                    waiters: vec![13]
                })
            }
        );
        // A refused code retried at once is still cold: refused again.
        assert!(matches!(
            c.lookup(b"scan005", 21, true, t1),
            Lookup::Answered {
                via: Shortcut::Overflow { .. },
                ..
            }
        ));
        // A code whose fetch was queued a moment ago (then shed) is warm when asked again.
        assert_eq!(
            c.lookup(b"scan004", 22, true, t1),
            Lookup::Queued {
                shed: Some(Shed {
                    code: b"scan003"[..].into(),
                    waiters: vec![12]
                })
            }
        );
        // A cold fetch wanted by a second client is warm: not shed.
        assert_eq!(c.lookup(b"scan001", 23, true, t1), Lookup::Joined);
        assert_eq!(c.lookup(b"scan002", 24, true, t1), Lookup::Joined);
        // Nothing cold left queued: a warm newcomer (scan003, queued before) is refused like
        // anyone.
        assert!(matches!(
            c.lookup(b"scan003", 25, true, t1),
            Lookup::Answered {
                via: Shortcut::Overflow { .. },
                ..
            }
        ));
    }

    #[test]
    fn caches_stay_bounded() {
        let t0 = Instant::now();
        let mut c = OriginCache::new(
            CacheConfig {
                max_entries: 16,
                max_pending: 1000,
                ..cfg()
            },
            1,
        );
        for i in 0..200u32 {
            let code = format!("c{i:06}");
            fetch_needed(&mut c, code.as_bytes(), i, true, t0);
            c.settle(
                code.as_bytes(),
                Fetched::Found(found("https://a/")),
                0,
                None,
                t0,
            );
            let code = format!("n{i:06}");
            fetch_needed(&mut c, code.as_bytes(), i, true, t0);
            c.settle(code.as_bytes(), Fetched::NotFound, 0, None, t0);
        }
        let (pos, neg) = c.cached();
        assert!(pos <= 16 && neg <= 16, "{pos} {neg}");
    }
}
