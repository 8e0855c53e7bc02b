//! Creation velocity: how many distinct destination domains (registrable domains, see
//! [`crate::CanonicalHost::velocity_key`]) each owner pointed new links at in the last hour.
//!
//! The seeds' signal: an account creating links to 50,000 different hostnames an hour is not
//! running a marketing campaign. One owner's window holds each domain once, with the last time
//! it was used; entries older than the window are dropped as new ones arrive, and an owner
//! far past the limit is tracked only up to twice the limit (the count is then a floor, which
//! is all the decision needs), so memory stays bounded by the limit, not by the creates.

use std::collections::{HashMap, VecDeque};

/// The sliding window's length.
pub const WINDOW_MS: i64 = 3_600_000;
/// A domain used again refreshes its time at most this often.
const REFRESH_MS: i64 = 60_000;

/// Distinct-domain windows of every owner that created links in the last hour.
#[derive(Debug)]
pub struct Velocity {
    limit: usize,
    owners: HashMap<String, Window>,
    /// Calls since the last sweep of idle owners.
    since_sweep: usize,
}

#[derive(Debug, Default)]
struct Window {
    /// Domain → the last time it was used.
    last: HashMap<String, i64>,
    /// (time, domain) in arrival order; an entry is stale once `last` holds a later time.
    order: VecDeque<(i64, String)>,
}

impl Window {
    fn expire(&mut self, now_ms: i64) {
        while let Some((at, _)) = self.order.front() {
            if now_ms - *at < WINDOW_MS {
                break;
            }
            if let Some((at, domain)) = self.order.pop_front() {
                if self.last.get(&domain) == Some(&at) {
                    self.last.remove(&domain);
                }
            }
        }
    }
}

impl Velocity {
    /// An owner is over the limit once more than `limit` distinct domains were used within an
    /// hour; `limit == 0` turns the check off.
    pub fn new(limit: usize) -> Velocity {
        Velocity {
            limit,
            owners: HashMap::new(),
            since_sweep: 0,
        }
    }

    /// The configured limit.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Records a create by `owner` to `domain` at `now_ms` and returns the distinct domains
    /// the owner used in the hour up to now, this one included.
    pub fn observe(&mut self, owner: &str, domain: &str, now_ms: i64) -> usize {
        if self.limit == 0 {
            return 0;
        }
        self.sweep(now_ms);
        let cap = self.limit.saturating_mul(2).max(16);
        if !self.owners.contains_key(owner) {
            self.owners.insert(owner.to_owned(), Window::default());
        }
        let Some(w) = self.owners.get_mut(owner) else {
            return 0;
        };
        w.expire(now_ms);
        let room = w.last.len() < cap;
        match w.last.get_mut(domain) {
            // A domain used again is refreshed at most once a minute, so an owner reusing a
            // few domains all hour keeps a short queue (it may leave the window up to a minute
            // early).
            Some(at) if now_ms - *at < REFRESH_MS => {}
            Some(at) => {
                *at = now_ms;
                w.order.push_back((now_ms, domain.to_owned()));
            }
            None if room => {
                w.last.insert(domain.to_owned(), now_ms);
                w.order.push_back((now_ms, domain.to_owned()));
            }
            None => {}
        }
        w.last.len()
    }

    /// Whether `count` (from [`Velocity::observe`]) is past the limit.
    pub fn exceeded(&self, count: usize) -> bool {
        self.limit > 0 && count > self.limit
    }

    /// The distinct domains `owner` used in the hour up to `now_ms`, without recording a create.
    pub fn current(&mut self, owner: &str, now_ms: i64) -> usize {
        match self.owners.get_mut(owner) {
            Some(w) => {
                w.expire(now_ms);
                w.last.len()
            }
            None => 0,
        }
    }

    /// Forgets `owner`'s window (an admin cleared its flag: it starts counting afresh).
    pub fn forget(&mut self, owner: &str) {
        self.owners.remove(owner);
    }

    /// Every so often, forget owners with nothing left in their window.
    fn sweep(&mut self, now_ms: i64) {
        self.since_sweep += 1;
        if self.since_sweep < 4096 {
            return;
        }
        self.since_sweep = 0;
        self.owners.retain(|_, w| {
            w.expire(now_ms);
            !w.last.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_distinct_domains_in_a_sliding_hour() {
        let mut v = Velocity::new(3);
        assert_eq!(v.observe("a", "one.example", 0), 1);
        assert_eq!(
            v.observe("a", "one.example", 10),
            1,
            "the same domain counts once"
        );
        assert_eq!(v.observe("a", "two.example", 20), 2);
        assert_eq!(v.observe("b", "one.example", 20), 1, "owners are apart");
        assert_eq!(v.observe("a", "three.example", 30), 3);
        assert!(!v.exceeded(3));
        assert_eq!(v.observe("a", "four.example", 40), 4);
        assert!(v.exceeded(4));
        // An hour after the first use it leaves the window (the reuse at t=10 was within the
        // refresh minute), then the others one by one.
        assert_eq!(v.current("a", WINDOW_MS - 1), 4);
        assert_eq!(v.current("a", WINDOW_MS), 3);
        assert_eq!(v.current("a", WINDOW_MS + 40), 0);
        // A reuse more than a minute later keeps the domain in for another hour.
        v.observe("c", "x.example", 0);
        v.observe("c", "x.example", 2 * REFRESH_MS);
        assert_eq!(v.current("c", WINDOW_MS + REFRESH_MS), 1);
        assert_eq!(v.current("nobody", 0), 0);
    }

    #[test]
    fn memory_is_bounded_past_the_limit() {
        let mut v = Velocity::new(10);
        for i in 0..10_000 {
            v.observe("spammer", &format!("d{i}.example"), i);
        }
        let w = &v.owners["spammer"];
        assert_eq!(w.last.len(), 20);
        assert!(w.order.len() <= 20);
        let now = v.current("spammer", 10_000);
        assert!(v.exceeded(now));
    }

    #[test]
    fn zero_turns_it_off() {
        let mut v = Velocity::new(0);
        assert_eq!(v.observe("a", "x.example", 0), 0);
        assert!(!v.exceeded(1_000_000));
    }
}
