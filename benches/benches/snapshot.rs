//! Snapshot lookups (hit and miss at 1M and 10M links; hits also from a huge-page copy), open
//! time and build rate.
//!
//! The snapshot files are synthesised once (`lasthop_snapshot::Synth`, fixed key and seeds)
//! into `$CARGO_TARGET_DIR/lasthop-bench/` (default `target/lasthop-bench/`) and reused by
//! later runs; the 10M file is about 1.2 GB. Lookups cycle through 64K keys drawn at random
//! from the whole file, so each one lands on a cold cache line of a warm (page-cached) file.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use lasthop_core::region::DEFAULT_RESERVE;
use lasthop_core::HighWater;
use lasthop_snapshot::{Snapshot, SnapshotMeta, SnapshotWriter, Synth};

const SIZES: [(u64, &str); 2] = [(1_000_000, "1M"), (10_000_000, "10M")];
const KEYS: usize = 1 << 16;

use lasthop_benches::{bench_dir, rng, scheme, DATA_SEED, HASH_SEED};

fn meta(count: u64, key_id: u32) -> SnapshotMeta {
    let mut hw = HighWater::new(1, DEFAULT_RESERVE).expect("one region");
    hw.raise(0, count).expect("region 0 exists");
    SnapshotMeta::new(1, key_id, hw).with_hash_seed(HASH_SEED)
}

/// The shared bench snapshot of `count` links, with its size figures printed.
fn snapshot_file(count: u64, label: &str) -> PathBuf {
    let path = lasthop_benches::snapshot_file(count, label);
    let s = Snapshot::open(&path).expect("open");
    eprintln!(
        "{label}: {} links, {} bytes, {:.2} bytes/link beyond URL bytes (mean URL {:.1})",
        s.links(),
        s.file_len(),
        (s.file_len() - s.url_bytes()) as f64 / s.links() as f64,
        s.url_bytes() as f64 / s.links() as f64,
    );
    path
}

fn lookups(c: &mut Criterion) {
    let (_, scheme) = scheme();
    let mut group = c.benchmark_group("snapshot");
    group
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    for (count, label) in SIZES {
        let path = snapshot_file(count, label);
        let snap = Snapshot::open(&path).expect("open");
        let mut state = 7;
        // Hits: codes of random counters below `count`. Misses: well-formed codes of
        // counters never issued (what a scanner sends), plus a few absent aliases.
        let hits: Vec<[u8; 7]> = (0..KEYS)
            .map(|_| scheme.encode(rng(&mut state) % count).expect("in domain"))
            .collect();
        let misses: Vec<Vec<u8>> = (0..KEYS)
            .map(|i| {
                if i % 64 == 0 {
                    format!("absent-alias-{i}").into_bytes()
                } else {
                    let n = count + rng(&mut state) % (1 << 30);
                    scheme.encode(n).expect("in domain").to_vec()
                }
            })
            .collect();
        assert!(hits.iter().all(|k| snap.lookup(k).is_some()));
        assert!(misses.iter().all(|k| snap.lookup(k).is_none()));
        let mut i = 0usize;
        group.bench_function(BenchmarkId::new("lookup_hit", label), |b| {
            b.iter(|| {
                i = (i + 1) & (KEYS - 1);
                black_box(snap.lookup(black_box(&hits[i])))
            })
        });
        // The engine's default: the file copied into transparent huge pages (`Snapshot::load`,
        // `--snapshot-memory huge`), against the in-place mapping above.
        let huge = Snapshot::load(&path).expect("load");
        let mut h = 0usize;
        group.bench_function(BenchmarkId::new("lookup_hit_huge", label), |b| {
            b.iter(|| {
                h = (h + 1) & (KEYS - 1);
                black_box(huge.lookup(black_box(&hits[h])))
            })
        });
        drop(huge);
        let mut j = 0usize;
        group.bench_function(BenchmarkId::new("lookup_miss", label), |b| {
            b.iter(|| {
                j = (j + 1) & (KEYS - 1);
                black_box(snap.lookup(black_box(&misses[j])))
            })
        });
        group.bench_function(BenchmarkId::new("open", label), |b| {
            b.iter(|| black_box(Snapshot::open(&path).expect("open")))
        });
        // The peer figure: one dependent random read in memory the size of this file (a
        // pointer chase through a single random cycle). A hit costs about two of these (index
        // line, then entry), a miss about one; on a machine with slow DRAM/TLB walks this floor,
        // not the format, bounds the lookup medians above.
        let len = std::fs::metadata(&path).expect("stat").len() as usize / 4;
        let mut next: Vec<u32> = (0..len as u32).collect();
        for k in (1..len).rev() {
            // Sattolo's shuffle: one cycle through every slot.
            let r = (rng(&mut state) % k as u64) as usize;
            next.swap(k, r);
        }
        let mut at = 0u32;
        group.bench_function(BenchmarkId::new("memory_floor", label), |b| {
            b.iter(|| {
                at = next[at as usize];
                black_box(at)
            })
        });
    }
    group.finish();
}

fn build(c: &mut Criterion) {
    let (key, scheme) = scheme();
    let count = 1_000_000u64;
    // Pre-generate the links so the bench times the writer, not FF1 and the URL generator.
    let mut synth = Synth::new(scheme, count, DATA_SEED);
    let mut links = Vec::with_capacity(synth.total() as usize);
    while let Some(l) = synth.next_link() {
        links.push((l.key.to_vec(), l.url.to_vec(), l.expires_at_ms));
    }
    let dir = bench_dir();
    let mut group = c.benchmark_group("snapshot");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10))
        .throughput(Throughput::Elements(links.len() as u64));
    // To a real file: temp name, write, fsync, rename, fsync dir.
    group.bench_function(BenchmarkId::new("build_file", "1M"), |b| {
        b.iter_custom(|iters| {
            let mut spent = Duration::ZERO;
            for _ in 0..iters {
                let path = dir.join("build-bench.snap");
                let start = Instant::now();
                let mut w = SnapshotWriter::create(&path, meta(count, key.id())).expect("create");
                for (k, u, e) in &links {
                    w.add(k, u, *e).expect("valid");
                }
                black_box(w.seal().expect("seal"));
                spent += start.elapsed();
                let _ = std::fs::remove_file(&path);
            }
            spent
        })
    });
    group.finish();
}

criterion_group!(benches, lookups, build);
criterion_main!(benches);
