//! Tight loop of whole hits on the pure path (`http::parse`, `answer::decide`,
//! `render::render_with`, as `request/hit_hot_curl` serves them: 1,024 codes of the 1M-link
//! bench snapshot, a 10,000-code denylist), for instruction counts per request
//! (`valgrind --tool=callgrind`) that stay meaningful on a noisy machine.
//!
//! `cargo build --release -p lasthop-benches --example serve_loop && valgrind --tool=callgrind
//! target/release/examples/serve_loop 100000`; with `cold` after the count, 65,536 codes as
//! `request/hit_curl` serves them (each lookup a cache miss), for `perf record`. Then `map`,
//! `huge`, `paged` or `paged-huge` (the snapshot mapped or in huge pages, in the default
//! compact layout or the paged one),
//! then `hit` or `never` (codes above the mark), then optionally `page` (never count the
//! connection as scanning: every request fetches its whole page).

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
    // `huge`: the snapshot in huge pages; `paged`: mapped, in the paged layout.
    let tables = match std::env::args().nth(3).as_deref() {
        Some("huge") => {
            lasthop_benches::request_tables_in(&mut state, lasthop_snapshot::Snapshot::load)
        }
        Some("paged") => lasthop_benches::request_tables_with(
            &mut state,
            lasthop_snapshot::Snapshot::open,
            lasthop_snapshot::Layout::Paged,
        ),
        Some("paged-huge") => lasthop_benches::request_tables_with(
            &mut state,
            lasthop_snapshot::Snapshot::load,
            lasthop_snapshot::Layout::Paged,
        ),
        _ => request_tables(&mut state),
    };
    let distinct = if std::env::args().nth(2).as_deref() == Some("cold") {
        lasthop_benches::COLD_CODES
    } else {
        lasthop_benches::HOT_CODES
    };
    let requests: Vec<Vec<u8>> = (0..distinct)
        .map(|_| {
            // `never` after the mode: codes far above the mark (`request/never_issued`).
            let n = if std::env::args().nth(4).as_deref() == Some("never") {
                REQUEST_LINKS * 4 + rng(&mut state) % (1 << 30)
            } else {
                rng(&mut state) % REQUEST_LINKS
            };
            let code = scheme.encode(n).expect("in domain");
            let code = std::str::from_utf8(&code).expect("codes are ASCII");
            CURL.replace("{}", code).into_bytes()
        })
        .collect();
    let limits = Limits::default();
    let mut out = Vec::with_capacity(4096);
    let started = std::time::Instant::now();
    let mut acc = 0usize;
    // One connection's prefetch state; `page` after the others fetches whole pages even for
    // a scanner (what a scanner's first requests on a connection cost).
    let mut pf = lasthop_edge::answer::Prefetcher::default();
    let always_page = std::env::args().nth(5).as_deref() == Some("page");
    for i in 0..n {
        if always_page {
            pf = Default::default();
        }
        acc = acc.wrapping_add(serve(
            black_box(&requests[i & (distinct - 1)]),
            &limits,
            &tables,
            &mut out,
            &mut pf,
        ));
    }
    let elapsed = started.elapsed();
    println!(
        "{n} hits in {:?}: {:.1} ns/hit (checksum {acc})",
        elapsed,
        elapsed.as_nanos() as f64 / n as f64
    );
}
