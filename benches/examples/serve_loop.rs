//! Tight loop of whole hits on the pure path (`http::parse`, `answer::decide`,
//! `render::render_with`, as `request/hit_hot_curl` serves them: 1,024 codes of the 1M-link
//! bench snapshot, a 10,000-code denylist), for instruction counts per request
//! (`valgrind --tool=callgrind`) that stay meaningful on a noisy machine.
//!
//! `cargo build --release -p lasthop-benches --example serve_loop && valgrind --tool=callgrind
//! target/release/examples/serve_loop 100000`

use std::hint::black_box;

use lasthop_benches::{request_tables, rng, scheme, serve, CURL, REQUEST_LINKS};
use lasthop_edge::http::Limits;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let (_, scheme) = scheme();
    // The same draws, in the same order, as `request/hit_hot_curl`.
    let mut state = 11;
    let tables = request_tables(&mut state);
    let requests: Vec<Vec<u8>> = (0..1024)
        .map(|_| {
            let code = scheme
                .encode(rng(&mut state) % REQUEST_LINKS)
                .expect("in domain");
            let code = std::str::from_utf8(&code).expect("codes are ASCII");
            CURL.replace("{}", code).into_bytes()
        })
        .collect();
    let limits = Limits::default();
    let mut out = Vec::with_capacity(4096);
    let started = std::time::Instant::now();
    let mut acc = 0usize;
    for i in 0..n {
        acc = acc.wrapping_add(serve(
            black_box(&requests[i & 1023]),
            &limits,
            &tables,
            &mut out,
        ));
    }
    let elapsed = started.elapsed();
    println!(
        "{n} hits in {:?}: {:.1} ns/hit (checksum {acc})",
        elapsed,
        elapsed.as_nanos() as f64 / n as f64
    );
}
