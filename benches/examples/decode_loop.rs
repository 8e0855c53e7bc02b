//! Tight loop of code decodes, for instruction counts (`valgrind --tool=callgrind`, `perf stat`)
//! that stay meaningful on a noisy machine.

use std::hint::black_box;

use lasthop_core::{CodeScheme, PermutationKey};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let key = PermutationKey::from_bytes(&[7u8; 16]).expect("valid key length");
    let scheme = CodeScheme::new(&key).expect("scheme");
    let codes: Vec<[u8; 7]> = (0..1024u64)
        .map(|i| scheme.encode(i * 7_919).expect("in domain"))
        .collect();
    let started = std::time::Instant::now();
    let mut acc = 0u64;
    for i in 0..n {
        acc = acc.wrapping_add(
            scheme
                .decode(black_box(&codes[(i & 1023) as usize]))
                .unwrap_or(0),
        );
    }
    let elapsed = started.elapsed();
    println!(
        "{n} decodes in {:?}: {:.1} ns/decode (checksum {acc})",
        elapsed,
        elapsed.as_nanos() as f64 / n as f64
    );
}
