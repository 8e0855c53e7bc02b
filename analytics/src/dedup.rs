//! The event-id dedup window.
//!
//! Kafka and the spool deliver at least once, so a redelivered batch must not count twice. Ids
//! are edge-assigned and unique, so a set of them is enough; what needs a policy is forgetting,
//! and, at hundreds of thousands of events a second over a ten-minute window, what each id costs.
//!
//! **Generations.** Two generations rotate: new ids go into the current one, a lookup checks
//! both, and when the current generation has spanned `window_ms` of arrival time it becomes the
//! previous one and the old previous is dropped. So every id is remembered for **between W and
//! 2W** of arrival time (W = `window_ms`), and memory is bounded by the ids that arrive in 2W,
//! however long the processor runs. No clock is read: the caller passes arrival time, and time
//! that goes backwards only delays rotation.
//!
//! **A bit per event.** An id is `nonce << 64 | seq` (`core/EVENTS.md`): a random nonce per
//! engine core and start, then that core's counter, so one writer's ids are a dense run of
//! sequence numbers. A generation keeps, per writer (nonce), the sequence numbers it has seen in
//! chunks of [`CHUNK`] slots keyed by `seq / CHUNK` (a gap between two ranges, a restart's new
//! nonce or a stray old event allocates nothing in between), each chunk in the smallest of three
//! forms: a sorted array of 16-bit offsets while it holds few ids (a writer seen once costs a few
//! bytes, not a bitmap), a bitmap of one bit a slot once the array would be as large, and
//! nothing at all once every slot is seen (the spool's common case: a writer's whole run). The
//! spool's dense runs cost about a bit per event or less; one Kafka partition's share of a writer
//! (keyed by code, a random 1/P of its sequence) costs a bit per *slot*, P bits per event: an
//! exact set of a random subset of density 1/16 cannot be held in less than its entropy,
//! 16 × H(1/16) ≈ 5.4 bits per event ([`entropy_bits_per_id`]).
//!
//! **Writers are capped** ([`MAX_WRITERS`] per generation): ids of writers past the cap go to a
//! set of 64-bit fingerprints beside the chunks, and are counted
//! ([`Dedup::overflow_ids`]): exact semantics kept, at 8 bytes and more an id, for a stream of
//! random nonces that no fleet of engines makes. The fingerprint is a bijection of the counter
//! for a given nonce, so one writer's ids never collide; two writers' may, with a chance of
//! n / 2^64 per event.
//!
//! **Early-data replays.** A request in TLS or QUIC 0-RTT early data can be replayed by whoever
//! captured it; each replay the edge answers is a new event with a new id. So an early event
//! also has an [`early_key`]: its visitor, link (its code, or `domain/code` on a branded
//! domain) and UTC minute, and the processor counts one
//! early event per key (a [`KeyDedup`], a window of 64-bit keys in hash sets, through
//! [`KeyDedup::first`]). A person clicking the same link twice within a minute from a resumed
//! session loses one click; a click not in early data is never dropped by this rule.

use hashbrown::{HashMap, HashSet};
use lasthop_core::click::{ClickEvent, EventId};

use crate::uniques::mix;

/// Sequence slots a chunk covers.
pub const CHUNK: u64 = 4096;
const WORDS: usize = (CHUNK / 64) as usize;
/// Past this many ids a chunk's sorted array is as large as its bitmap (2 bytes an id).
const ARRAY_MAX: usize = (CHUNK / 16) as usize;
/// Writers (engine nonces) a generation keeps chunks for; the rest go to fingerprints.
pub const MAX_WRITERS: usize = 1 << 16;

/// The id's 64-bit fingerprint: for a fixed nonce (high half) a bijection of the counter.
fn fingerprint(id: EventId) -> u64 {
    let (nonce, seq) = ((id.0 >> 64) as u64, id.0 as u64);
    mix(seq.wrapping_add(mix(nonce)))
}

/// The fewest bits an id that an exact set of a random `1/p` share of a writer's sequence can
/// cost on average: the entropy of the share, `p × H(1/p)`.
pub fn entropy_bits_per_id(p: f64) -> f64 {
    if p <= 1.0 {
        return 0.0;
    }
    let q = 1.0 / p;
    p * -(q * q.log2() + (1.0 - q) * (1.0 - q).log2())
}

/// The length of the span in which an early-data event of one visitor and code counts once.
pub const EARLY_SPAN_MS: u64 = 60_000;

/// The key an early-data event is deduplicated on (`None` for an event not in early data): a
/// 64-bit hash of its visitor, link and UTC minute ([`EARLY_SPAN_MS`]). The link is its key
/// ([`ClickEvent::link_key`]): the code on the default domain (so those keys are what they were
/// before branded domains), `domain/code` on a branded one, so the same alias on two domains is
/// two links here too.
pub fn early_key(e: &ClickEvent<'_>) -> Option<u64> {
    if !e.early {
        return None;
    }
    // FNV-1a over the link key, then mixed with the visitor and the minute.
    let code = e
        .link_key_parts()
        .iter()
        .flat_map(|part| part.iter())
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    let minute = e.at_ms / EARLY_SPAN_MS;
    Some(mix(e.visitor ^ mix(code ^ mix(minute))))
}

/// What a generation holds: a set that can also say what it costs.
pub trait Set: Default {
    type Key: Copy;
    /// True when `k` was not in the set (it is now).
    fn insert(&mut self, k: Self::Key) -> bool;
    fn contains(&self, k: Self::Key) -> bool;
    fn remove(&mut self, k: Self::Key);
    fn clear(&mut self);
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Heap bytes held (tables at their capacity, chunks, arrays).
    fn bytes(&self) -> usize;
}

/// Bytes a hashbrown table of `capacity` entries of `entry` bytes holds (buckets are the next
/// power of two past capacity × 8/7, each with a control byte).
fn table_bytes(capacity: usize, entry: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    let buckets = (capacity * 8 / 7).next_power_of_two();
    buckets * (entry + 1)
}

impl Set for HashSet<u64> {
    type Key = u64;
    fn insert(&mut self, k: u64) -> bool {
        HashSet::insert(self, k)
    }
    fn contains(&self, k: u64) -> bool {
        HashSet::contains(self, &k)
    }
    fn remove(&mut self, k: u64) {
        HashSet::remove(self, &k);
    }
    fn clear(&mut self) {
        HashSet::clear(self)
    }
    fn len(&self) -> usize {
        HashSet::len(self)
    }
    fn bytes(&self) -> usize {
        table_bytes(self.capacity(), 8)
    }
}

/// One writer's sequence numbers in `CHUNK` slots.
#[derive(Debug)]
enum Chunk {
    /// Sorted offsets, while they are at most [`ARRAY_MAX`].
    Array(Vec<u16>),
    /// One bit a slot, and how many are set.
    Bits(Box<[u64; WORDS]>, u16),
    /// Every slot seen.
    Full,
}

impl Chunk {
    fn contains(&self, off: u16) -> bool {
        match self {
            Chunk::Array(v) => v.binary_search(&off).is_ok(),
            Chunk::Bits(b, _) => b[usize::from(off / 64)] & (1 << (off % 64)) != 0,
            Chunk::Full => true,
        }
    }

    fn insert(&mut self, off: u16) -> bool {
        match self {
            Chunk::Array(v) => {
                let Err(at) = v.binary_search(&off) else {
                    return false;
                };
                if v.len() < ARRAY_MAX {
                    v.insert(at, off);
                    return true;
                }
                let mut bits = Box::new([0u64; WORDS]);
                for &o in v.iter().chain([&off]) {
                    bits[usize::from(o / 64)] |= 1 << (o % 64);
                }
                *self = Chunk::Bits(bits, (ARRAY_MAX + 1) as u16);
                true
            }
            Chunk::Bits(b, n) => {
                let (w, bit) = (usize::from(off / 64), 1u64 << (off % 64));
                if b[w] & bit != 0 {
                    return false;
                }
                b[w] |= bit;
                *n += 1;
                if u64::from(*n) == CHUNK {
                    *self = Chunk::Full;
                }
                true
            }
            Chunk::Full => false,
        }
    }

    /// Removes `off`: whether it was there, and whether the chunk is then empty.
    fn remove(&mut self, off: u16) -> (bool, bool) {
        match self {
            Chunk::Array(v) => {
                let was = v.binary_search(&off).map(|at| v.remove(at)).is_ok();
                (was, v.is_empty())
            }
            Chunk::Bits(b, n) => {
                let (w, bit) = (usize::from(off / 64), 1u64 << (off % 64));
                let was = b[w] & bit != 0;
                if was {
                    b[w] &= !bit;
                    *n -= 1;
                }
                (was, *n == 0)
            }
            Chunk::Full => {
                let mut bits = Box::new([u64::MAX; WORDS]);
                bits[usize::from(off / 64)] &= !(1 << (off % 64));
                *self = Chunk::Bits(bits, (CHUNK - 1) as u16);
                (true, false)
            }
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Chunk::Array(v) => v.capacity() * 2,
            Chunk::Bits(..) => WORDS * 8,
            Chunk::Full => 0,
        }
    }
}

/// Event ids as per-writer chunks (see the module's doc).
#[derive(Debug, Default)]
pub struct IdSet {
    /// Per nonce, its chunks by `seq / CHUNK`.
    writers: HashMap<u64, HashMap<u64, Chunk>>,
    /// Fingerprints of the ids of writers past [`MAX_WRITERS`].
    overflow: HashSet<u64>,
    len: usize,
}

fn split(id: EventId) -> (u64, u64, u16) {
    let (nonce, seq) = ((id.0 >> 64) as u64, id.0 as u64);
    (nonce, seq / CHUNK, (seq % CHUNK) as u16)
}

impl IdSet {
    /// Ids of writers past the cap, held as fingerprints.
    pub fn overflow_ids(&self) -> usize {
        self.overflow.len()
    }
}

impl Set for IdSet {
    type Key = EventId;

    fn insert(&mut self, id: EventId) -> bool {
        let (nonce, at, off) = split(id);
        if self.writers.len() >= MAX_WRITERS && !self.writers.contains_key(&nonce) {
            let new = self.overflow.insert(fingerprint(id));
            self.len += usize::from(new);
            return new;
        }
        let chunks = self.writers.entry(nonce).or_default();
        let new = chunks
            .entry(at)
            .or_insert_with(|| Chunk::Array(Vec::new()))
            .insert(off);
        self.len += usize::from(new);
        new
    }

    fn contains(&self, id: EventId) -> bool {
        let (nonce, at, off) = split(id);
        match self.writers.get(&nonce) {
            Some(chunks) => chunks.get(&at).is_some_and(|c| c.contains(off)),
            None => !self.overflow.is_empty() && self.overflow.contains(&fingerprint(id)),
        }
    }

    fn remove(&mut self, id: EventId) {
        let (nonce, at, off) = split(id);
        let was = match self.writers.get_mut(&nonce) {
            Some(chunks) => match chunks.get_mut(&at).map(|c| c.remove(off)) {
                Some((was, true)) => {
                    chunks.remove(&at);
                    was
                }
                Some((was, false)) => was,
                None => false,
            },
            None => self.overflow.remove(&fingerprint(id)),
        };
        self.len -= usize::from(was);
    }

    fn clear(&mut self) {
        self.writers.clear();
        self.overflow.clear();
        self.len = 0;
    }

    fn len(&self) -> usize {
        self.len
    }

    fn bytes(&self) -> usize {
        let chunk_entry = std::mem::size_of::<(u64, Chunk)>();
        let writer_entry = std::mem::size_of::<(u64, HashMap<u64, Chunk>)>();
        let chunks: usize = self
            .writers
            .values()
            .map(|c| {
                table_bytes(c.capacity(), chunk_entry) + c.values().map(Chunk::bytes).sum::<usize>()
            })
            .sum();
        table_bytes(self.writers.capacity(), writer_entry)
            + chunks
            + table_bytes(self.overflow.capacity(), 8)
    }
}

/// Two generations of a [`Set`], rotated by arrival time (see the module's doc).
#[derive(Debug)]
pub struct Window<S> {
    window_ms: u64,
    /// What was first seen since `started_ms`.
    current: S,
    /// What was first seen in the generation before.
    previous: S,
    /// When the current generation began (`None` before the first event).
    started_ms: Option<u64>,
}

impl<S: Set> Window<S> {
    /// A window of `window_ms` (the processor uses ≥ 10 minutes).
    pub fn new(window_ms: u64) -> Window<S> {
        Window {
            window_ms,
            current: S::default(),
            previous: S::default(),
            started_ms: None,
        }
    }

    /// True the first time `k` is seen within the window; `now_ms` is arrival time.
    pub fn first(&mut self, k: S::Key, now_ms: u64) -> bool {
        self.rotate(now_ms);
        if self.previous.contains(k) {
            return false;
        }
        self.current.insert(k)
    }

    /// Forgets `k`, so its next sighting counts: for an event whose counting was undone (a
    /// processor dropped it unflushed when its partition moved to another processor).
    pub fn forget(&mut self, k: S::Key) {
        self.current.remove(k);
        self.previous.remove(k);
    }

    fn rotate(&mut self, now_ms: u64) {
        let started = *self.started_ms.get_or_insert(now_ms);
        let age = now_ms.saturating_sub(started);
        if age < self.window_ms {
            return;
        }
        // Everything in `current` arrived before started + W (an arrival after that would have
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

    /// What is remembered now.
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Heap bytes both generations hold.
    pub fn bytes(&self) -> usize {
        self.current.bytes() + self.previous.bytes()
    }

    /// The window this was made with.
    pub fn window_ms(&self) -> u64 {
        self.window_ms
    }
}

/// Event ids seen within the window (the processor's duplicate drop).
pub type Dedup = Window<IdSet>;

/// 64-bit keys seen within the window (an [`early_key`] a replay repeats).
pub type KeyDedup = Window<HashSet<u64>>;

impl Window<IdSet> {
    /// Ids of writers past [`MAX_WRITERS`] held as fingerprints, in both generations.
    pub fn overflow_ids(&self) -> usize {
        self.current.overflow_ids() + self.previous.overflow_ids()
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
            domain: "",
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
        // The default domain's keys are what they were before branded domains (FNV-1a of the
        // code alone), so a processor upgraded mid-minute still knows its replays.
        let fnv = "Ab3dE9x".bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        assert_eq!(k, mix(7 ^ mix(fnv ^ mix(t / EARLY_SPAN_MS))));
        // The same code on a branded domain is another link; two domains are two links.
        let on = |domain| ClickEvent {
            domain,
            ..early(7, "Ab3dE9x", t, true)
        };
        let branded = early_key(&on("go.example.com")).unwrap();
        assert_ne!(branded, k);
        assert_ne!(early_key(&on("lh.example")), Some(branded));
        assert_eq!(early_key(&on("go.example.com")), Some(branded));
        let mut d = KeyDedup::new(W);
        assert!(d.first(k, t));
        assert!(!d.first(k, t + 5), "a replay");
        d.forget(k);
        assert!(d.first(k, t + 6));
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

    /// Today's structure, the oracle: the same generations over a hash set of fingerprints.
    fn oracle(w: u64) -> KeyDedup {
        KeyDedup::new(w)
    }

    #[test]
    fn a_dense_run_costs_under_two_bits_an_id() {
        // The spool: every event of four writers, interleaved, a window of them.
        let mut d = Dedup::new(W);
        let n = 1_000_000u64;
        for i in 0..n {
            assert!(d.first(EventId::new(0xa0 + i % 4, i / 4), 1_000 + i / 1_000));
        }
        let bits = d.bytes() as f64 * 8.0 / d.len() as f64;
        assert_eq!(d.len() as u64, n);
        assert!(bits <= 2.0, "{bits} bits an id");
        // With a hole in every chunk (events lost on the way), still a bit a slot.
        let mut d = Dedup::new(W);
        for i in (0..n).filter(|i| i % 4096 != 7) {
            d.first(EventId::new(0xb0, i), 1_000);
        }
        let bits = d.bytes() as f64 * 8.0 / d.len() as f64;
        assert!(bits <= 2.0, "{bits} bits an id");
    }

    #[test]
    fn a_partitions_share_costs_a_bit_a_slot() {
        // One Kafka partition of 16: a random sixteenth of each writer's sequence.
        let mut d = Dedup::new(W);
        let mut x = 7u64;
        let mut held = 0u64;
        for i in 0..1_600_000u64 {
            x = mix(x.wrapping_add(i));
            if x % 16 == 0 {
                held += 1;
                assert!(d.first(EventId::new(0xc0 + i % 2, i / 2), 1_000));
            }
        }
        assert_eq!(d.len() as u64, held);
        let bits = d.bytes() as f64 * 8.0 / d.len() as f64;
        // A bit a slot (16 an id) and the tables around the chunks; the floor is the entropy.
        assert!(bits <= 18.0, "{bits} bits an id");
        assert!(entropy_bits_per_id(16.0) > 5.3 && entropy_bits_per_id(16.0) < 5.5);
    }

    #[test]
    fn random_nonces_cost_a_bounded_amount_and_past_the_cap_are_fingerprints() {
        let mut d = Dedup::new(W);
        let n = MAX_WRITERS as u64 + 1_000;
        for i in 0..n {
            assert!(d.first(EventId::new(mix(i + 1), mix(i)), 1_000));
            assert!(!d.first(EventId::new(mix(i + 1), mix(i)), 1_001));
        }
        assert_eq!(d.len() as u64, n);
        assert_eq!(d.overflow_ids(), 1_000);
        // A writer seen once: its table entry, one chunk's entry, a small array.
        let per = d.bytes() / d.len();
        assert!(per <= 256, "{per} bytes a writer");
        // Past the cap, still exact: the overflow's ids are remembered and forgotten.
        let last = EventId::new(mix(n), mix(n - 1));
        assert!(!d.first(last, 1_002));
        d.forget(last);
        assert!(d.first(last, 1_003));
    }

    #[test]
    fn chunks_change_form_and_back() {
        let mut d = Dedup::new(W);
        for s in 0..CHUNK {
            assert!(d.first(EventId::new(1, s), 1));
        }
        // The tables' entries only: no bitmap (512 bytes) and no array.
        assert!(d.bytes() < 512, "a full chunk holds nothing: {}", d.bytes());
        d.forget(EventId::new(1, 5));
        assert!(d.first(EventId::new(1, 5), 2));
        assert!(!d.first(EventId::new(1, 6), 2));
        for s in 0..CHUNK {
            d.forget(EventId::new(1, s));
        }
        assert!(d.is_empty());
        assert!(d.first(EventId::new(1, CHUNK - 1), 3));
    }

    proptest! {
        /// The chunks against the oracle over random streams: interleaved writers, sparse
        /// shares, reordering, duplicates, forgets, clock jumps backwards and forwards, ids far
        /// apart; every answer and every count the same. Writer 2 lives on 300 slots, so its
        /// array turns into a bitmap within a generation; writer 4 starts with a chunk two slots
        /// short of full, and the stream fills it (nothing held) and forgets out of it (a bitmap).
        #[test]
        fn the_same_answers_as_the_hash_set(
            steps in proptest::collection::vec(
                (
                    prop_oneof![1 => 0u64..2, 3 => Just(2u64), 1 => Just(3u64), 2 => Just(4u64)],
                    0u64..6_000,
                    prop_oneof![
                        300 => 0u64..3,
                        30 => 0u64..50,
                        1 => 0u64..30_000,
                        1 => Just(u64::MAX)
                    ],
                    0u8..10,
                ),
                1..2_000),
        ) {
            let w = 10_000;
            let mut d = Dedup::new(w);
            let mut o = oracle(w);
            let mut now = 100_000u64;
            for s in 0..4_094 {
                let id = EventId::new(0x5eed + 4, s);
                prop_assert_eq!(d.first(id, now), o.first(fingerprint(id), now));
            }
            for (writer, seq, dt, op) in steps {
                now = if dt == u64::MAX { now.saturating_sub(7_000) } else { now + dt };
                // Writers 0 and 1 over two chunks, writer 3 far out in its sequence.
                let seq = match writer {
                    2 => seq % 300,
                    3 => seq.wrapping_mul(1 << 40),
                    4 => 4_000 + seq % 100,
                    _ => seq,
                };
                let id = EventId::new(0x5eed + writer, seq);
                if op == 0 {
                    d.forget(id);
                    o.forget(fingerprint(id));
                } else {
                    prop_assert_eq!(d.first(id, now), o.first(fingerprint(id), now));
                }
                prop_assert_eq!(d.len(), o.len());
            }
        }

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
