//! Tight loop of request parses (a curl request, as `part_parse_curl` parses it, or with
//! `browser` a browser's, as `part_parse_browser`; `general` after either skips the fast
//! path), for instruction counts (`valgrind --tool=callgrind`) that stay meaningful on a noisy
//! machine.
//!
//! `cargo build --release -p lasthop-benches --example parse_loop && valgrind --tool=callgrind
//! target/release/examples/parse_loop 100000 [browser] [general]`

use std::hint::black_box;

use lasthop_benches::{BROWSER, CURL};
use lasthop_edge::http::{parse, parse_general, Limits, Parse};

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let args: Vec<String> = std::env::args().collect();
    let template = if args.iter().any(|a| a == "browser") {
        BROWSER
    } else {
        CURL
    };
    let request = template.replace("{}", "Ab3dE9x").into_bytes();
    let parse = if args.iter().any(|a| a == "general") {
        parse_general
    } else {
        parse
    };
    let limits = Limits::default();
    let started = std::time::Instant::now();
    let mut acc = 0usize;
    for _ in 0..n {
        if let Parse::Complete { req, consumed } = parse(black_box(&request), &limits) {
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
