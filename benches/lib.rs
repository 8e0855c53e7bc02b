//! What the criterion suites in `benches/` share: the key, the synthetic snapshot files they
//! build once and reuse (the `snapshot` and `request` suites read the same file), and the
//! generator that picks codes.

use std::path::PathBuf;

use lasthop_core::region::DEFAULT_RESERVE;
use lasthop_core::{CodeScheme, HighWater, PermutationKey};
use lasthop_snapshot::{Snapshot, SnapshotMeta, SnapshotWriter, Synth};

/// Hash seed of every bench snapshot (fixed, so files are reproducible and reusable).
pub const HASH_SEED: u64 = 0x5eed;
/// Seed of the synthetic links.
pub const DATA_SEED: u64 = 1;

/// The benches' permutation key and scheme.
pub fn scheme() -> (PermutationKey, CodeScheme) {
    let key = PermutationKey::from_bytes(&[0x5a; 16]).expect("16 bytes is an AES-128 key");
    let scheme = CodeScheme::new(&key).expect("radix 62, length 7 is a valid FF1 domain");
    (key, scheme)
}

/// `$CARGO_TARGET_DIR/lasthop-bench` (or `target/lasthop-bench`), created if missing.
pub fn bench_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("lasthop-bench");
    std::fs::create_dir_all(&dir).expect("create the bench data directory");
    dir
}

/// The snapshot of `count` synthetic codes (plus count/100 aliases) under [`scheme`], region 0
/// marked issued up to `count`; built once, reused while its link count and key match.
pub fn snapshot_file(count: u64, label: &str) -> PathBuf {
    let path = bench_dir().join(format!(
        "synth-{label}-v{}.snap",
        lasthop_snapshot::FORMAT_VERSION
    ));
    let (key, scheme) = scheme();
    let mut synth = Synth::new(scheme, count, DATA_SEED);
    let reusable = Snapshot::open(&path)
        .map(|s| s.links() == synth.total() && s.key_id() == key.id())
        .unwrap_or(false);
    if !reusable {
        eprintln!("building {} ({label} links, once)", path.display());
        let mut hw = HighWater::new(1, DEFAULT_RESERVE).expect("one region");
        hw.raise(0, count).expect("region 0 exists");
        let meta = SnapshotMeta::new(1, key.id(), hw).with_hash_seed(HASH_SEED);
        let mut w = SnapshotWriter::create(&path, meta).expect("create");
        w.reserve(synth.total() as usize);
        while let Some(l) = synth.next_link() {
            w.add(l.key, l.url, l.expires_at_ms)
                .expect("synthetic links are valid");
        }
        w.seal().expect("seal");
    }
    path
}

/// SplitMix64, for picking codes.
pub fn rng(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
