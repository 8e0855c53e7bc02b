//! On stable, every checked-in corpus input (`corpus/<target>/`, the seeds and what campaigns
//! kept) and every regression input (`regressions/<target>/`, each a crash or hang a campaign
//! found, fixed since) through its target: what a campaign covered stays covered, in CI.

use std::path::Path;

fn inputs(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            (name, std::fs::read(e.path()).expect("a corpus file reads"))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_corpus_and_regression_input_passes_its_target() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut total = 0;
    for (name, target) in lasthop_fuzz::TARGETS {
        let corpus = inputs(&root.join("corpus").join(name));
        assert!(!corpus.is_empty(), "{name} has no seed corpus");
        let regressions = inputs(&root.join("regressions").join(name));
        for (file, bytes) in corpus.iter().chain(&regressions) {
            let result = std::panic::catch_unwind(|| target(bytes));
            assert!(result.is_ok(), "{name}: {file} fails its target");
            total += 1;
        }
    }
    println!(
        "replayed {total} inputs through {} targets",
        lasthop_fuzz::TARGETS.len()
    );
}

#[test]
fn every_target_has_a_libfuzzer_binary() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).unwrap();
    for (name, _) in lasthop_fuzz::TARGETS {
        assert!(
            root.join("fuzz_targets")
                .join(format!("{name}.rs"))
                .is_file()
                && manifest.contains(&format!("name = \"{name}\"")),
            "{name} has no fuzz_targets/{name}.rs [[bin]]"
        );
    }
}

/// A small deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// One to four edits of `input`: a bit flipped, a byte set to an interesting value, bytes
/// inserted or deleted, a run repeated, or a splice from `other`.
fn mutate(input: &mut Vec<u8>, other: &[u8], rng: &mut Rng) {
    const INTERESTING: [u8; 10] = [0, 1, 0x7f, 0x80, 0xff, b'\r', b'\n', b'"', b'%', b'/'];
    for _ in 0..=rng.below(4) {
        let len = input.len();
        match rng.below(7) {
            0 if len > 0 => {
                let at = rng.below(len);
                input[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                input[at] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
                input.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let end = (at + 1 + rng.below(16)).min(len);
                input.drain(at..end);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let end = (at + 1 + rng.below(32)).min(len);
                let run = input[at..end].to_vec();
                input.splice(at..at, run);
            }
            5 if !other.is_empty() => {
                let at = rng.below(len + 1);
                let from = rng.below(other.len());
                let end = (from + 1 + rng.below(64)).min(other.len());
                input.truncate(at);
                input.extend_from_slice(&other[from..end]);
            }
            _ => {
                let at = rng.below(len + 1);
                input.truncate(at);
            }
        }
    }
}

/// A stable, dumb fuzzer: each target runs for `LASTHOP_FUZZ_SECS` (default 1) on mutations of
/// its corpus, seeded by its name (and `LASTHOP_FUZZ_SEED`). What libFuzzer does with coverage on
/// nightly (`scripts/fuzz`), this does blind, so CI runs every target for seconds without
/// nightly. A failing input is written under the target directory to reproduce.
#[test]
fn every_target_survives_mutations_of_its_corpus() {
    let secs: f64 = std::env::var("LASTHOP_FUZZ_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1.0);
    // `LASTHOP_FUZZ_TARGETS`: a space-separated subset (all when unset or empty).
    let only = std::env::var("LASTHOP_FUZZ_TARGETS").unwrap_or_default();
    let only: Vec<&str> = only.split_whitespace().collect();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (name, target) in lasthop_fuzz::TARGETS {
        if !only.is_empty() && !only.contains(name) {
            continue;
        }
        let corpus = inputs(&root.join("corpus").join(name));
        let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        // `LASTHOP_FUZZ_SEED` varies a campaign's seed (CI keeps the name's, so a run repeats).
        let campaign: u64 = std::env::var("LASTHOP_FUZZ_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let mut rng = Rng((seed ^ campaign.wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs_f64(secs);
        let mut runs = 0u64;
        while std::time::Instant::now() < deadline {
            let mut input = corpus[rng.below(corpus.len())].1.clone();
            let other = &corpus[rng.below(corpus.len())].1;
            mutate(&mut input, other, &mut rng);
            if std::panic::catch_unwind(|| target(&input)).is_err() {
                let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-failures");
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join(format!("{name}-{runs}"));
                std::fs::write(&path, &input).unwrap();
                panic!(
                    "{name}: a mutated input fails its target (saved to {})",
                    path.display()
                );
            }
            runs += 1;
        }
        println!("{name}: {runs} mutated inputs in {secs} s");
    }
}
