//! The event-id dedup window.
//!
//! Kafka and the spool deliver at least once, so a redelivered batch must not count twice. Ids
//! are edge-assigned and unique, so a set of them is enough; what needs a policy is forgetting.
//!
//! The sets hold a 64-bit fingerprint of each 128-bit id, not the id: at hundreds of thousands
//! of events a second a ten-minute window holds hundreds of millions of ids, and half the bytes
//! matter more than the chance (n / 2^64, about 10^-11 per event at 2 × 10^8 ids) that two
//! different events share a fingerprint and one is dropped as a duplicate. Ids from one engine
//! instance (same nonce, different counters) never share one: the fingerprint is a bijection of
//! the counter for a given nonce.
//!
//! Two generations of fingerprints (hashbrown sets of `u64`) rotate: new ids go into the current one, a
//! lookup checks both, and when the current generation has spanned `window_ms` of arrival time
//! it becomes the previous one and the old previous is dropped (its allocation reused). So every
//! id is remembered for **between W and 2W** of arrival time (W = `window_ms`), and memory is
//! bounded by the ids that arrive in 2W, however long the processor runs. No clock is read:
//! the caller passes arrival time, and time that goes backwards only delays rotation.
//!
//! **Early-data replays.** A request in TLS or QUIC 0-RTT early data can be replayed by whoever
//! captured it; each replay the edge answers is a new event with a new id. So an early event
//! also has an [`early_key`]: its visitor, code and UTC minute, and the processor counts one
//! early event per key (a second [`Dedup`] of keys, through [`Dedup::first_key`]). A person
//! clicking the same link twice within a minute from a resumed session loses one click;
//! a click not in early data is never dropped by this rule.

use hashbrown::HashSet;
use lasthop_core::click::{ClickEvent, EventId};

use crate::uniques::mix;

/// The id's 64-bit fingerprint: for a fixed nonce (high half) a bijection of the counter.
fn fingerprint(id: EventId) -> u64 {
    let (nonce, seq) = ((id.0 >> 64) as u64, id.0 as u64);
    mix(seq.wrapping_add(mix(nonce)))
}

/// The length of the span in which an early-data event of one visitor and code counts once.
pub const EARLY_SPAN_MS: u64 = 60_000;

/// The key an early-data event is deduplicated on (`None` for an event not in early data): a
/// 64-bit hash of its visitor, code and UTC minute ([`EARLY_SPAN_MS`]).
pub fn early_key(e: &ClickEvent<'_>) -> Option<u64> {
    if !e.early {
        return None;
    }
    // FNV-1a over the code, then mixed with the visitor and the minute.
    let code = e.code.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let minute = e.at_ms / EARLY_SPAN_MS;
    Some(mix(e.visitor ^ mix(code ^ mix(minute))))
}

/// Remembers event ids for at least `window_ms` of arrival time; a second sighting is a duplicate.
#[derive(Debug)]
pub struct Dedup {
    window_ms: u64,
    /// Fingerprints of ids first seen since `started_ms`.
    current: HashSet<u64>,
    /// Fingerprints of ids first seen in the generation before.
    previous: HashSet<u64>,
    /// When the current generation began (`None` before the first event).
    started_ms: Option<u64>,
}

impl Dedup {
    /// A window of `window_ms` (the processor uses ≥ 10 minutes).
    pub fn new(window_ms: u64) -> Dedup {
        Dedup {
            window_ms,
            current: HashSet::new(),
            previous: HashSet::new(),
            started_ms: None,
        }
    }

    /// True the first time `id` is seen within the window; `now_ms` is arrival time.
    pub fn first(&mut self, id: EventId, now_ms: u64) -> bool {
        self.first_key(fingerprint(id), now_ms)
    }

    /// True the first time the 64-bit `key` is seen within the window (an [`early_key`]).
    pub fn first_key(&mut self, fp: u64, now_ms: u64) -> bool {
        self.rotate(now_ms);
        if self.previous.contains(&fp) {
            return false;
        }
        self.current.insert(fp)
    }

    /// Forgets `id`, so its next sighting counts: for an event whose counting was undone (a
    /// processor dropped it unflushed when its partition moved to another processor).
    pub fn forget(&mut self, id: EventId) {
        self.forget_key(fingerprint(id));
    }

    /// Forgets `key` (see [`Dedup::forget`]).
    pub fn forget_key(&mut self, fp: u64) {
        self.current.remove(&fp);
        self.previous.remove(&fp);
    }

    fn rotate(&mut self, now_ms: u64) {
        let started = *self.started_ms.get_or_insert(now_ms);
        let age = now_ms.saturating_sub(started);
        if age < self.window_ms {
            return;
        }
        // Every id in `current` arrived before started + W (an arrival after that would have
        // rotated), so after 2W of silence both generations are past the window.
        if age >= self.window_ms.saturating_mul(2) {
            self.current.clear();
            self.previous.clear();
            self.started_ms = Some(now_ms);
        } else {
            std::mem::swap(&mut self.current, &mut self.previous);
            self.current.clear();
            // Generations are W long from their start, not from the arrival that rotates them,
            // so a quiet spell cannot stretch one and keep ids past 2W.
            self.started_ms = Some(started + self.window_ms);
        }
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// Whether no ids are remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The window this dedup was made with.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const W: u64 = 600_000;

    #[test]
    fn drops_duplicates_inside_the_window() {
        let mut d = Dedup::new(W);
        let id = EventId::new(1, 1);
        assert!(d.first(id, 1_000));
        assert!(!d.first(id, 1_001));
        assert!(d.first(EventId::new(1, 2), 1_002));
        // Still remembered just under W later, across a rotation.
        assert!(!d.first(id, 1_000 + W - 1));
        assert!(!d.first(id, 1_000 + W + 5));
        assert_eq!(d.len(), 2);
    }

    fn early(visitor: u64, code: &'static str, at_ms: u64, early: bool) -> ClickEvent<'static> {
        ClickEvent {
            id: EventId::new(1, at_ms),
            at_ms,
            code,
            pop: "",
            country: None,
            method: lasthop_core::click::Method::Get,
            tls: true,
            prefetch: false,
            protocol: Default::default(),
            early,
            visitor,
            net: None,
            user_agent: "",
            referrer_host: "",
        }
    }

    #[test]
    fn early_keys_are_visitor_code_and_minute() {
        let t = 1_764_504_000_000; // a whole minute
        let k = early_key(&early(7, "Ab3dE9x", t, true)).unwrap();
        assert_eq!(early_key(&early(7, "Ab3dE9x", t + 59_999, true)), Some(k));
        assert_ne!(early_key(&early(7, "Ab3dE9x", t + 60_000, true)), Some(k));
        assert_ne!(early_key(&early(8, "Ab3dE9x", t, true)), Some(k));
        assert_ne!(early_key(&early(7, "Ab3dE9y", t, true)), Some(k));
        assert_eq!(early_key(&early(7, "Ab3dE9x", t, false)), None);
        let mut d = Dedup::new(W);
        assert!(d.first_key(k, t));
        assert!(!d.first_key(k, t + 5), "a replay");
        d.forget_key(k);
        assert!(d.first_key(k, t + 6));
    }

    #[test]
    fn a_forgotten_id_counts_again() {
        let mut d = Dedup::new(W);
        let (a, b) = (EventId::new(1, 1), EventId::new(1, 2));
        assert!(d.first(a, 1_000));
        // In the previous generation too.
        assert!(d.first(b, 1_000 + W));
        d.forget(a);
        d.forget(b);
        assert!(d.first(a, 1_000 + W + 1));
        assert!(d.first(b, 1_000 + W + 2));
        assert!(!d.first(b, 1_000 + W + 3));
    }

    #[test]
    fn forgets_after_two_windows() {
        let mut d = Dedup::new(W);
        let id = EventId::new(7, 7);
        assert!(d.first(id, 0));
        for t in (0..=2 * W).step_by(10_000) {
            d.first(EventId::new(8, t), t);
        }
        assert!(d.first(id, 2 * W + 1));
    }

    #[test]
    fn memory_is_bounded_by_two_windows() {
        let mut d = Dedup::new(W);
        let per_ms = 2;
        for t in 0..10 * W / 1_000 {
            let now = t * 1_000;
            for i in 0..per_ms {
                assert!(d.first(EventId::new(3, t * per_ms + i), now));
            }
            assert!(
                d.len() as u64 <= 2 * (W / 1_000 + 1) * per_ms,
                "{} at {now}",
                d.len()
            );
        }
        // A long silence forgets everything.
        d.first(EventId::new(4, 0), 100 * W);
        assert_eq!(d.len(), 1);
    }

    proptest! {
        /// Against a model: an id sighted again within W of its first sighting is a duplicate,
        /// and an id whose last acceptance is 2W or more ago is accepted.
        #[test]
        fn remembers_between_w_and_2w(steps in proptest::collection::vec((0u64..20, 0u64..400), 1..300)) {
            let w = 1_000;
            let mut d = Dedup::new(w);
            let mut accepted_at: std::collections::HashMap<u64, u64> = Default::default();
            let mut now = 0;
            for (id, dt) in steps {
                now += dt;
                let first = d.first(EventId::new(0, id), now);
                match accepted_at.get(&id) {
                    Some(&t) if now - t < w => prop_assert!(!first),
                    Some(&t) if now - t >= 2 * w => prop_assert!(first),
                    None => prop_assert!(first),
                    _ => {}
                }
                if first {
                    accepted_at.insert(id, now);
                }
            }
        }
    }
}
