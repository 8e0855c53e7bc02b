//! HyperLogLog unique-visitor sketch.
//!
//! Owners ask "how many people clicked", per code and day and over ranges of days, so the count
//! must merge across partials and days without keeping visitors. HyperLogLog does that in a fixed
//! 16 KiB per code-day at precision 14 (m = 16,384 registers, standard error 1.04/√m ≈ 0.81%, so
//! the 2% promise is about 2.5 standard errors).
//!
//! Why our own and not the `hyperloglogplus` crate: the sketch is stored (in rollups, for years),
//! so its bytes are a format we must keep reading; the crate's serde form is its internal layout,
//! which it does not promise to keep. The algorithm itself is small.
//!
//! Two representations:
//! - **sparse** while small: the exact set of (mixed) visitor hashes, so the long tail of codes
//!   with a handful of visitors costs bytes, not 16 KiB, and small counts are exact;
//! - **dense** past [`SPARSE_MAX`] hashes: 2^14 one-byte registers.
//!
//! The estimate on dense registers is Ertl's "improved raw estimator" (O. Ertl, *New cardinality
//! estimation algorithms for HyperLogLog sketches*, 2017): it is unbiased from empty to far past
//! 10^9 without HLL++'s empirical bias tables or the linear-counting switch-over.
//!
//! Inputs are already keyed hashes, so they are uniform; each is still mixed once with the
//! SplitMix64 finalizer ([`mix`]) so a weak upstream hash cannot skew the registers. `mix` is part
//! of the format: a stored sketch and a new insert must agree on it.
//!
//! Encoding (little-endian), version 1:
//! `version: u8 = 1`, `precision: u8 = 14`, `kind: u8`, then for kind 0 (sparse)
//! `count: u32` and `count` mixed hashes as `u64`, strictly ascending (one encoding per set), at
//! most [`SPARSE_MAX`]; for kind 1 (dense) 2^14 register bytes, each ≤ 51 (64 − 14 + 1).
//! Nothing may follow.

use hashbrown::HashSet;

use crate::codec::{finish, Reader};

/// Register-index bits.
const PRECISION: u8 = 14;
/// Registers.
const M: usize = 1 << PRECISION;
/// The largest register value: leading zeros of the 50 remaining bits, plus one.
const MAX_RANK: u8 = 64 - PRECISION + 1;
/// The most hashes a sketch keeps exactly before it switches to registers. 1,024 hashes are 8 KiB
/// encoded, half a dense sketch; in memory the set is then about the size of the registers.
pub const SPARSE_MAX: usize = 1024;
/// The encoding version [`Uniques::to_bytes`] writes.
pub const SKETCH_VERSION: u8 = 1;

const KIND_SPARSE: u8 = 0;
const KIND_DENSE: u8 = 1;

/// A mergeable distinct-count sketch of 64-bit visitor hashes; error ≤ 2% at 100k and 1M.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uniques {
    repr: Repr,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Repr {
    /// The exact set of mixed hashes, at most [`SPARSE_MAX`].
    Sparse(HashSet<u64>),
    /// [`M`] registers.
    Dense(Box<[u8]>),
}

impl Default for Uniques {
    fn default() -> Uniques {
        Uniques::new()
    }
}

/// Why sketch (or rollup) bytes were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SketchError {
    /// Fewer bytes than the encoding needs.
    #[error("sketch truncated")]
    Truncated,
    /// An encoding version this build does not read.
    #[error("sketch version {0} not supported")]
    Version(u8),
    /// Anything else out of the encoding's rules.
    #[error("sketch malformed: {0}")]
    Malformed(&'static str),
}

/// The SplitMix64 finalizer (Stafford's variant 13): a bijection on u64 with full avalanche.
/// Part of the stored format; never change it.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The register a mixed hash lands in, and the value it offers it.
fn slot(h: u64) -> (usize, u8) {
    let index = (h >> (64 - PRECISION)) as usize;
    let rest = h << PRECISION;
    // `rest` has 50 significant bits; all zero gives 64 leading zeros, capped to MAX_RANK.
    let rank = (rest.leading_zeros() as u8 + 1).min(MAX_RANK);
    (index, rank)
}

fn dense_of(hashes: &HashSet<u64>) -> Box<[u8]> {
    let mut regs = vec![0u8; M].into_boxed_slice();
    for &h in hashes {
        let (i, r) = slot(h);
        if regs[i] < r {
            regs[i] = r;
        }
    }
    regs
}

impl Uniques {
    /// An empty sketch.
    pub fn new() -> Uniques {
        Uniques {
            repr: Repr::Sparse(HashSet::new()),
        }
    }

    /// Adds one visitor hash.
    pub fn insert(&mut self, visitor: u64) {
        let h = mix(visitor);
        match &mut self.repr {
            Repr::Sparse(set) => {
                if set.insert(h) && set.len() > SPARSE_MAX {
                    self.repr = Repr::Dense(dense_of(set));
                }
            }
            Repr::Dense(regs) => {
                let (i, r) = slot(h);
                // `i` < M by construction (the top PRECISION bits) and `regs` has M entries.
                if regs[i] < r {
                    regs[i] = r;
                }
            }
        }
    }

    /// Adds every visitor of `other`.
    pub fn merge(&mut self, other: &Uniques) {
        match (&mut self.repr, &other.repr) {
            (Repr::Sparse(mine), Repr::Sparse(theirs)) => {
                mine.extend(theirs.iter().copied());
                if mine.len() > SPARSE_MAX {
                    self.repr = Repr::Dense(dense_of(mine));
                }
            }
            (Repr::Dense(regs), Repr::Sparse(theirs)) => {
                for &h in theirs {
                    let (i, r) = slot(h);
                    if regs[i] < r {
                        regs[i] = r;
                    }
                }
            }
            (Repr::Sparse(mine), Repr::Dense(theirs)) => {
                let mut regs = dense_of(mine);
                for (a, &b) in regs.iter_mut().zip(theirs.iter()) {
                    *a = (*a).max(b);
                }
                self.repr = Repr::Dense(regs);
            }
            (Repr::Dense(regs), Repr::Dense(theirs)) => {
                for (a, &b) in regs.iter_mut().zip(theirs.iter()) {
                    *a = (*a).max(b);
                }
            }
        }
    }

    /// The estimated number of distinct visitors (exact while the sketch is sparse).
    pub fn estimate(&self) -> u64 {
        match &self.repr {
            Repr::Sparse(set) => set.len() as u64,
            Repr::Dense(regs) => ertl_estimate(regs).round() as u64,
        }
    }

    /// Heap bytes the sketch holds: a sparse set's table (its capacity, a control byte a
    /// slot), or the registers.
    pub fn heap_bytes(&self) -> usize {
        match &self.repr {
            Repr::Sparse(set) if set.capacity() == 0 => 0,
            Repr::Sparse(set) => set.capacity() * (std::mem::size_of::<u64>() + 1),
            Repr::Dense(regs) => regs.len(),
        }
    }

    /// Whether the sketch still holds exact hashes (small, and its estimate is exact).
    pub fn is_sparse(&self) -> bool {
        matches!(self.repr, Repr::Sparse(_))
    }

    /// Versioned binary form (see the module docs).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write(&mut out);
        out
    }

    /// Appends [`to_bytes`](Self::to_bytes)'s form to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        out.push(SKETCH_VERSION);
        out.push(PRECISION);
        match &self.repr {
            Repr::Sparse(set) => {
                let mut hashes: Vec<u64> = set.iter().copied().collect();
                hashes.sort_unstable();
                out.reserve(1 + 4 + 8 * hashes.len());
                out.push(KIND_SPARSE);
                // At most SPARSE_MAX hashes, far below u32::MAX.
                out.extend_from_slice(&(hashes.len() as u32).to_le_bytes());
                for h in hashes {
                    out.extend_from_slice(&h.to_le_bytes());
                }
            }
            Repr::Dense(regs) => {
                out.push(KIND_DENSE);
                out.extend_from_slice(regs);
            }
        }
    }

    /// Parses [`to_bytes`](Self::to_bytes)'s form (untrusted: never panics).
    pub fn from_bytes(bytes: &[u8]) -> Result<Uniques, SketchError> {
        let mut r = Reader::new(bytes);
        let sketch = Uniques::read(&mut r)?;
        finish(&r)?;
        Ok(sketch)
    }

    /// Reads one sketch from `r`, leaving what follows it.
    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Uniques, SketchError> {
        let version = r.u8()?;
        if version != SKETCH_VERSION {
            return Err(SketchError::Version(version));
        }
        if r.u8()? != PRECISION {
            return Err(SketchError::Malformed("precision"));
        }
        match r.u8()? {
            KIND_SPARSE => {
                let count = r.u32()? as usize;
                if count > SPARSE_MAX {
                    return Err(SketchError::Malformed("sparse sketch too large"));
                }
                let mut set = HashSet::with_capacity(count);
                let mut last = None;
                for _ in 0..count {
                    let h = r.u64()?;
                    if last.is_some_and(|l| h <= l) {
                        return Err(SketchError::Malformed("sparse hashes not ascending"));
                    }
                    last = Some(h);
                    set.insert(h);
                }
                Ok(Uniques {
                    repr: Repr::Sparse(set),
                })
            }
            KIND_DENSE => {
                let regs = r.take(M)?;
                if regs.iter().any(|&v| v > MAX_RANK) {
                    return Err(SketchError::Malformed("register out of range"));
                }
                Ok(Uniques {
                    repr: Repr::Dense(regs.into()),
                })
            }
            _ => Err(SketchError::Malformed("sketch kind")),
        }
    }
}

/// Ertl's improved raw estimator over the register histogram (paper, Algorithm 6).
fn ertl_estimate(regs: &[u8]) -> f64 {
    let q = usize::from(MAX_RANK) - 1;
    let mut hist = [0u32; MAX_RANK as usize + 1];
    for &v in regs {
        // Registers never exceed MAX_RANK: insert caps them and from_bytes refuses more.
        hist[usize::from(v.min(MAX_RANK))] += 1;
    }
    let m = regs.len() as f64;
    let mut z = m * tau(1.0 - f64::from(hist[q + 1]) / m);
    for k in (1..=q).rev() {
        z = 0.5 * (z + f64::from(hist[k]));
    }
    z += m * sigma(f64::from(hist[0]) / m);
    let alpha_inf = 1.0 / (2.0 * std::f64::consts::LN_2);
    alpha_inf * m * m / z
}

/// σ(x) = x + Σ_{k≥1} x^(2^k) 2^(k−1); the contribution of empty registers.
fn sigma(mut x: f64) -> f64 {
    if x == 1.0 {
        return f64::INFINITY;
    }
    let mut y = 1.0;
    let mut z = x;
    loop {
        x *= x;
        let before = z;
        z += x * y;
        y += y;
        if z == before {
            return z;
        }
    }
}

/// τ(x) = (1 − x − Σ_{k≥1} (1 − x^(2^−k))² 2^−k) / 3; the contribution of saturated registers.
fn tau(mut x: f64) -> f64 {
    if x == 0.0 || x == 1.0 {
        return 0.0;
    }
    let mut y = 1.0;
    let mut z = 1.0 - x;
    loop {
        x = x.sqrt();
        let before = z;
        y *= 0.5;
        z -= (1.0 - x) * (1.0 - x) * y;
        if z == before {
            return z / 3.0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a sketch reports holding follows its form: nothing empty, a slot per hash (and a
    /// control byte) while sparse, the registers once dense.
    #[test]
    fn heap_bytes_follow_the_form() {
        let mut u = Uniques::new();
        assert_eq!(u.heap_bytes(), 0);
        for v in 0..100u64 {
            u.insert(v);
        }
        assert!(u.is_sparse());
        assert!(
            (100 * 9..=256 * 9).contains(&u.heap_bytes()),
            "{}",
            u.heap_bytes()
        );
        for v in 100..5000u64 {
            u.insert(v);
        }
        assert!(!u.is_sparse());
        assert_eq!(u.heap_bytes(), M);
    }
    use proptest::prelude::*;

    /// Deterministic, distinct inputs (splitmix64 is a bijection of its counter).
    fn splitmix(i: u64) -> u64 {
        mix(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn sketch_of(range: std::ops::Range<u64>) -> Uniques {
        let mut u = Uniques::new();
        for i in range {
            u.insert(splitmix(i));
        }
        u
    }

    fn assert_within(u: &Uniques, exact: u64, tolerance: f64) {
        let est = u.estimate() as f64;
        let err = (est - exact as f64).abs() / exact as f64;
        assert!(
            err <= tolerance,
            "estimate {est} for {exact} distinct: error {err:.4}"
        );
    }

    #[test]
    fn small_counts_are_exact_and_small() {
        let mut u = Uniques::new();
        assert_eq!(u.estimate(), 0);
        for v in [7, 8, 9, 7, 8] {
            u.insert(v);
        }
        assert_eq!(u.estimate(), 3);
        assert!(u.is_sparse());
        assert_eq!(u.to_bytes().len(), 3 + 4 + 3 * 8);
        let full = sketch_of(0..SPARSE_MAX as u64);
        assert_eq!(full.estimate(), SPARSE_MAX as u64);
        assert!(full.is_sparse());
    }

    #[test]
    fn switches_to_registers_without_a_jump() {
        let u = sketch_of(0..SPARSE_MAX as u64 + 1);
        assert!(!u.is_sparse());
        assert_within(&u, SPARSE_MAX as u64 + 1, 0.01);
        assert_eq!(u.to_bytes().len(), 3 + M);
        for n in [2_000u64, 5_000, 20_000, 50_000] {
            assert_within(&sketch_of(0..n), n, 0.02);
        }
    }

    #[test]
    fn within_two_percent_at_100k() {
        for seed in 0..3u64 {
            let start = seed << 40;
            assert_within(&sketch_of(start..start + 100_000), 100_000, 0.02);
        }
    }

    #[test]
    fn within_two_percent_at_1m() {
        let mut u = sketch_of(0..1_000_000);
        assert_within(&u, 1_000_000, 0.02);
        // Repeats change nothing.
        let before = u.clone();
        for i in 0..10_000 {
            u.insert(splitmix(i));
        }
        assert_eq!(u, before);
    }

    #[test]
    fn merge_of_halves_is_the_whole() {
        for n in [10u64, 1_500, 60_000] {
            let whole = sketch_of(0..n);
            let mut a = sketch_of(0..n / 3);
            let b = sketch_of(n / 3..n);
            a.merge(&b);
            assert_eq!(a, whole, "n = {n}");
        }
    }

    #[test]
    fn round_trips_and_refuses_bad_bytes() {
        for n in [0u64, 3, 2_000] {
            let u = sketch_of(0..n);
            assert_eq!(Uniques::from_bytes(&u.to_bytes()).unwrap(), u);
        }
        let good = sketch_of(0..3).to_bytes();
        assert_eq!(Uniques::from_bytes(&[]), Err(SketchError::Truncated));
        let mut bad = good.clone();
        bad[0] = 9;
        assert_eq!(Uniques::from_bytes(&bad), Err(SketchError::Version(9)));
        let mut bad = good.clone();
        bad.push(0);
        assert_eq!(
            Uniques::from_bytes(&bad),
            Err(SketchError::Malformed("trailing bytes"))
        );
        let mut bad = good.clone();
        bad.truncate(good.len() - 1);
        assert_eq!(Uniques::from_bytes(&bad), Err(SketchError::Truncated));
        // Swap the first two hashes: not ascending.
        let mut bad = good.clone();
        let (a, b) = (good[7..15].to_vec(), good[15..23].to_vec());
        bad[7..15].copy_from_slice(&b);
        bad[15..23].copy_from_slice(&a);
        assert_eq!(
            Uniques::from_bytes(&bad),
            Err(SketchError::Malformed("sparse hashes not ascending"))
        );
        let mut dense = sketch_of(0..2_000).to_bytes();
        dense[100] = MAX_RANK + 1;
        assert_eq!(
            Uniques::from_bytes(&dense),
            Err(SketchError::Malformed("register out of range"))
        );
    }

    proptest! {
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = Uniques::from_bytes(&bytes);
            let mut prefixed = vec![SKETCH_VERSION, PRECISION];
            prefixed.extend_from_slice(&bytes);
            if let Ok(u) = Uniques::from_bytes(&prefixed) {
                prop_assert_eq!(u.to_bytes(), prefixed);
            }
        }

        #[test]
        fn merge_of_splits_is_the_single_sketch(
            visitors in proptest::collection::vec(any::<u64>(), 0..3_000),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
        ) {
            let mut single = Uniques::new();
            for &v in &visitors {
                single.insert(v);
            }
            let mut bounds: Vec<usize> = cuts.iter().map(|c| c.index(visitors.len() + 1)).collect();
            bounds.push(0);
            bounds.push(visitors.len());
            bounds.sort_unstable();
            let parts: Vec<Uniques> = bounds.windows(2).map(|w| {
                let mut u = Uniques::new();
                for &v in &visitors[w[0]..w[1]] {
                    u.insert(v);
                }
                u
            }).collect();
            // Left to right and right to left: merge is commutative and associative.
            let mut forward = Uniques::new();
            for p in &parts {
                forward.merge(p);
            }
            let mut backward = Uniques::new();
            for p in parts.iter().rev() {
                backward.merge(p);
            }
            prop_assert_eq!(&forward, &single);
            prop_assert_eq!(&backward, &single);
            prop_assert_eq!(Uniques::from_bytes(&single.to_bytes()).unwrap(), single);
        }
    }
}
