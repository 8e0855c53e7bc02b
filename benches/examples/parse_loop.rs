//! Tight loop of request parses (a curl request, as `part_parse_curl` parses it), for
//! instruction counts (`valgrind --tool=callgrind`) that stay meaningful on a noisy machine.
//!
//! `cargo build --release -p lasthop-benches --example parse_loop && valgrind --tool=callgrind
//! target/release/examples/parse_loop 100000`

use std::hint::black_box;

use lasthop_edge::http::{parse, Limits, Parse};

const CURL: &[u8] =
    b"GET /Ab3dE9x HTTP/1.1\r\nHost: lh.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n";

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let limits = Limits::default();
    let started = std::time::Instant::now();
    let mut acc = 0usize;
    for _ in 0..n {
        if let Parse::Complete { req, consumed } = parse(black_box(CURL), &limits) {
            acc = acc.wrapping_add(consumed + req.path.len());
        }
    }
    let elapsed = started.elapsed();
    println!(
        "{n} parses in {:?}: {:.1} ns/parse (checksum {acc})",
        elapsed,
        elapsed.as_nanos() as f64 / n as f64
    );
}
