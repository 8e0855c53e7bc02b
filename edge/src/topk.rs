//! The hot-codes sketch behind `/debug/top`: Space-Saving (Metwally, Agrawal, El Abbadi 2005)
//! with a fixed number of counters, one sketch per serving core.
//!
//! Space-Saving keeps `CAPACITY` (key, count, error) counters. A key already counted is
//! incremented; a new key takes a free counter, or else evicts the smallest counter and inherits
//! its count plus one (the inherited part is the entry's `error`). Every key whose true frequency
//! exceeds `total / CAPACITY` is guaranteed to be present, and a count never undercounts by more
//! than its `error`, so the top of the list is exact for skewed traffic (which is what a hot code
//! is) and approximate in the tail.
//!
//! Storage is fixed at construction: `CAPACITY` entries with inline 64-byte keys (the longest
//! alias), kept as a binary min-heap on count so the eviction victim is the root, plus an
//! open-addressing index from key hash to heap position. A record is one hash, one probe sequence
//! and a short sift; it never allocates.
//!
//! ## Sharing between the core and the admin thread
//!
//! The serving core records, the admin thread reads. The sketch sits in a `Mutex` and the core
//! uses `try_lock`: uncontended, that is one compare-and-swap on a line the core already owns;
//! contended (the admin thread is copying the 128 entries out, a microsecond or so, and only
//! when someone asks for `/debug/top`) the core skips that one record and counts the skip. A
//! double buffer would avoid the skip but needs a swap protocol and twice the memory for no
//! measurable gain in a sketch that is approximate anyway. Recording therefore never blocks a
//! serving core.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, TryLockError};

/// Counters per sketch.
pub const CAPACITY: usize = 128;
/// Longest key kept; longer keys (no code is longer) are not recorded.
pub const MAX_KEY: usize = 64;
/// Index slots: a power of two at least twice `CAPACITY`, so probe chains stay short.
const SLOTS: usize = CAPACITY * 4;
const EMPTY: u16 = u16::MAX;

#[derive(Clone, Copy)]
struct Entry {
    key: [u8; MAX_KEY],
    len: u8,
    hash: u32,
    /// Index slot pointing at this entry.
    slot: u16,
    count: u64,
    /// Overestimation bound inherited on eviction.
    error: u64,
}

impl Entry {
    const ZERO: Entry = Entry {
        key: [0; MAX_KEY],
        len: 0,
        hash: 0,
        slot: EMPTY,
        count: 0,
        error: 0,
    };

    fn key(&self) -> &[u8] {
        &self.key[..usize::from(self.len)]
    }
}

/// The single-threaded Space-Saving structure.
struct Sketch {
    /// A min-heap on `count`; `heap[..len]` is live.
    heap: Box<[Entry; CAPACITY]>,
    len: usize,
    /// Hash slot → heap position, `EMPTY` when free; linear probing, backward-shift deletion.
    index: Box<[u16; SLOTS]>,
    total: u64,
}

/// FNV-1a: keys are at most 64 bytes and mostly 7, where it beats anything fancier.
fn hash(key: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in key {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// `SLOTS` is a power of two, and `u32 → usize` is lossless on every platform this runs on.
fn home(h: u32) -> usize {
    (h as usize) & (SLOTS - 1)
}

impl Sketch {
    fn new() -> Sketch {
        Sketch {
            heap: Box::new([Entry::ZERO; CAPACITY]),
            len: 0,
            index: Box::new([EMPTY; SLOTS]),
            total: 0,
        }
    }

    /// The index slot holding `key`, or the empty slot where it would go.
    fn find(&self, key: &[u8], h: u32) -> (usize, Option<usize>) {
        let mut slot = home(h);
        loop {
            let pos = self.index[slot];
            if pos == EMPTY {
                return (slot, None);
            }
            let e = &self.heap[usize::from(pos)];
            if e.hash == h && e.key() == key {
                return (slot, Some(usize::from(pos)));
            }
            slot = (slot + 1) & (SLOTS - 1);
        }
    }

    fn record(&mut self, key: &[u8]) {
        if key.is_empty() || key.len() > MAX_KEY {
            return;
        }
        self.total += 1;
        let h = hash(key);
        let (slot, found) = self.find(key, h);
        if let Some(pos) = found {
            self.heap[pos].count += 1;
            self.sift_down(pos);
            return;
        }
        if self.len < CAPACITY {
            let pos = self.len;
            self.len += 1;
            self.put(pos, key, h, slot, 1, 0);
            self.sift_up(pos);
            return;
        }
        // Full: the smallest counter (the root) gives its place to the new key.
        let min = self.heap[0].count;
        self.unindex(usize::from(self.heap[0].slot));
        // The deletion may have shifted the free slot we found; look again.
        let (slot, _) = self.find(key, h);
        self.put(0, key, h, slot, min + 1, min);
        self.sift_down(0);
    }

    fn put(&mut self, pos: usize, key: &[u8], h: u32, slot: usize, count: u64, error: u64) {
        let e = &mut self.heap[pos];
        e.key[..key.len()].copy_from_slice(key);
        // `key.len() <= MAX_KEY` (64) was checked by the caller: it fits a u8.
        e.len = key.len() as u8;
        e.hash = h;
        // Slots and positions are below SLOTS (512) and CAPACITY (128): they fit a u16.
        e.slot = slot as u16;
        e.count = count;
        e.error = error;
        self.index[slot] = pos as u16;
    }

    /// Frees an index slot, shifting later members of its probe chain back (no tombstones).
    fn unindex(&mut self, mut hole: usize) {
        self.index[hole] = EMPTY;
        let mut next = (hole + 1) & (SLOTS - 1);
        while self.index[next] != EMPTY {
            let pos = usize::from(self.index[next]);
            let want = home(self.heap[pos].hash);
            // Move the entry back if the hole lies on its probe path (cyclically from `want`).
            let dist_next = next.wrapping_sub(want) & (SLOTS - 1);
            let dist_hole = hole.wrapping_sub(want) & (SLOTS - 1);
            if dist_hole < dist_next {
                self.index[hole] = self.index[next];
                self.index[next] = EMPTY;
                // Below SLOTS: fits a u16.
                self.heap[pos].slot = hole as u16;
                hole = next;
            }
            next = (next + 1) & (SLOTS - 1);
        }
    }

    fn swap(&mut self, a: usize, b: usize) {
        self.heap.swap(a, b);
        // Positions are below CAPACITY: they fit a u16.
        self.index[usize::from(self.heap[a].slot)] = a as u16;
        self.index[usize::from(self.heap[b].slot)] = b as u16;
    }

    fn sift_up(&mut self, mut pos: usize) {
        while pos > 0 {
            let parent = (pos - 1) / 2;
            if self.heap[parent].count <= self.heap[pos].count {
                break;
            }
            self.swap(parent, pos);
            pos = parent;
        }
    }

    fn sift_down(&mut self, mut pos: usize) {
        loop {
            let l = 2 * pos + 1;
            if l >= self.len {
                break;
            }
            let r = l + 1;
            let child = if r < self.len && self.heap[r].count < self.heap[l].count {
                r
            } else {
                l
            };
            if self.heap[pos].count <= self.heap[child].count {
                break;
            }
            self.swap(pos, child);
            pos = child;
        }
    }
}

/// One entry read out of a sketch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub key: Vec<u8>,
    /// Space-Saving's estimate: never below the true count.
    pub count: u64,
    /// `count - error` is never above the true count.
    pub error: u64,
}

/// A serving core's hot-codes sketch. See the module docs for the locking choice.
pub struct TopK {
    sketch: Mutex<Sketch>,
    /// Records dropped because the admin thread held the lock.
    skipped: AtomicU64,
}

impl std::fmt::Debug for TopK {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopK")
            .field("skipped", &self.skipped())
            .finish_non_exhaustive()
    }
}

impl Default for TopK {
    fn default() -> Self {
        TopK::new()
    }
}

impl TopK {
    /// An empty sketch; all of its memory (about 11 KiB) is allocated here.
    pub fn new() -> TopK {
        TopK {
            sketch: Mutex::new(Sketch::new()),
            skipped: AtomicU64::new(0),
        }
    }

    /// Counts one request for `code`. Never blocks and never allocates: if the admin thread is
    /// reading the sketch, this record is skipped (and counted in [`TopK::skipped`]).
    pub fn record(&self, code: &[u8]) {
        match self.sketch.try_lock() {
            Ok(mut s) => s.record(code),
            Err(TryLockError::WouldBlock) => {
                self.skipped.fetch_add(1, Ordering::Relaxed);
            }
            // A panic while recording cannot leave the heap in a state that breaks memory
            // safety, only an approximate count: keep going.
            Err(TryLockError::Poisoned(p)) => p.into_inner().record(code),
        }
    }

    /// Records skipped because the sketch was being read.
    pub fn skipped(&self) -> u64 {
        self.skipped.load(Ordering::Relaxed)
    }

    /// A copy of the counters and the number of records counted (admin thread; may wait for the
    /// core's current record, never longer).
    pub fn snapshot(&self) -> (Vec<Counted>, u64) {
        let s = self.sketch.lock().unwrap_or_else(|p| p.into_inner());
        let entries = s.heap[..s.len]
            .iter()
            .map(|e| Counted {
                key: e.key().to_vec(),
                count: e.count,
                error: e.error,
            })
            .collect();
        (entries, s.total)
    }
}

/// The `n` hottest codes over all cores' sketches, hottest first (ties by code), with summed
/// estimated counts. A code absent from one core's sketch adds nothing from that core, so a sum
/// may undercount a code that is warm everywhere but hot nowhere; the hot ones are exact enough.
pub fn merge_top<'a>(sketches: impl IntoIterator<Item = &'a TopK>, n: usize) -> Vec<(String, u64)> {
    let mut sums: HashMap<Vec<u8>, u64> = HashMap::new();
    for sketch in sketches {
        for c in sketch.snapshot().0 {
            *sums.entry(c.key).or_insert(0) += c.count;
        }
    }
    let mut top: Vec<(String, u64)> = sums
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
        .collect();
    top.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    top.truncate(n);
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Checks the heap order and that the index and the heap agree.
    fn check(s: &Sketch) {
        for pos in 1..s.len {
            assert!(
                s.heap[(pos - 1) / 2].count <= s.heap[pos].count,
                "heap order"
            );
        }
        let mut indexed = 0;
        for (slot, &pos) in s.index.iter().enumerate() {
            if pos != EMPTY {
                indexed += 1;
                assert!(usize::from(pos) < s.len);
                assert_eq!(usize::from(s.heap[usize::from(pos)].slot), slot);
            }
        }
        assert_eq!(indexed, s.len);
        for pos in 0..s.len {
            let e = &s.heap[pos];
            assert_eq!(s.find(e.key(), e.hash).1, Some(pos), "findable");
        }
    }

    #[test]
    fn exact_below_capacity() {
        let t = TopK::new();
        for i in 0..100u64 {
            for _ in 0..=i {
                t.record(format!("code{i:03}").as_bytes());
            }
        }
        let top = merge_top([&t], 3);
        assert_eq!(
            top,
            vec![
                ("code099".to_string(), 100),
                ("code098".to_string(), 99),
                ("code097".to_string(), 98)
            ]
        );
        let (entries, total) = t.snapshot();
        assert_eq!(entries.len(), 100);
        assert_eq!(total, (1..=100).sum::<u64>());
        assert!(entries.iter().all(|e| e.error == 0));
    }

    #[test]
    fn heavy_hitters_survive_a_long_tail() {
        let mut s = Sketch::new();
        // 5 hot codes at 5% each among 100k distinct cold codes (xorshift, deterministic).
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut hot = [0u64; 5];
        for i in 0..400_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 4 == 0 {
                let h = (x % 5) as usize;
                hot[h] += 1;
                s.record(format!("hot{h}").as_bytes());
            } else {
                s.record(format!("c{}", x % 100_000).as_bytes());
            }
            if i % 50_000 == 0 {
                check(&s);
            }
        }
        check(&s);
        assert_eq!(s.len, CAPACITY);
        assert_eq!(s.total, 400_000);
        let mut entries: Vec<&Entry> = s.heap[..s.len].iter().collect();
        entries.sort_by_key(|e| std::cmp::Reverse(e.count));
        let top5: Vec<&[u8]> = entries[..5].iter().map(|e| e.key()).collect();
        for (h, &true_count) in hot.iter().enumerate() {
            let name = format!("hot{h}");
            assert!(top5.contains(&name.as_bytes()), "{name} in the top 5");
            let e = entries.iter().find(|e| e.key() == name.as_bytes()).unwrap();
            // Space-Saving's guarantees: count - error <= true <= count.
            assert!(e.count >= true_count && e.count - e.error <= true_count);
        }
    }

    #[test]
    fn rejects_empty_and_overlong_keys() {
        let t = TopK::new();
        t.record(b"");
        t.record(&[b'a'; MAX_KEY + 1]);
        t.record(&[b'a'; MAX_KEY]);
        let (entries, total) = t.snapshot();
        assert_eq!(total, 1);
        assert_eq!(entries[0].key.len(), MAX_KEY);
    }

    #[test]
    fn merges_cores_and_skips_when_contended() {
        let a = TopK::new();
        let b = TopK::new();
        for _ in 0..3 {
            a.record(b"abcdefg");
        }
        for _ in 0..4 {
            b.record(b"abcdefg");
            b.record(b"other-alias");
        }
        assert_eq!(
            merge_top([&a, &b], 10),
            vec![("abcdefg".to_string(), 7), ("other-alias".to_string(), 4)]
        );
        assert_eq!(merge_top([&a, &b], 1).len(), 1);
        let held = a.sketch.lock().unwrap();
        a.record(b"abcdefg");
        drop(held);
        assert_eq!(a.skipped(), 1);
        assert_eq!(a.snapshot().1, 3);
    }

    #[test]
    fn heavy_index_churn_keeps_invariants() {
        // Keys chosen so many share index home slots; evictions exercise backward shifting.
        let mut s = Sketch::new();
        for round in 0..20u32 {
            for i in 0..1_000u32 {
                s.record(&(i * 7 + round).to_le_bytes());
            }
            check(&s);
        }
    }
}
