//! Tight loop of whole hits on the pure path (`http::parse`, `answer::decide`,
//! `render::render_with`, as `request/hit_hot_curl` serves them: 1,024 codes of the 1M-link
//! bench snapshot, a 10,000-code denylist), for instruction counts per request
//! (`valgrind --tool=callgrind`) that stay meaningful on a noisy machine.
//!
//! `cargo build --release -p lasthop-benches --example serve_loop && valgrind --tool=callgrind
//! target/release/examples/serve_loop 100000`

use std::hint::black_box;
use std::sync::Arc;

use lasthop_benches::{rng, scheme, snapshot_file};
use lasthop_core::region::DEFAULT_RESERVE;
use lasthop_edge::answer::decide;
use lasthop_edge::denylist::{Deny, Denylist};
use lasthop_edge::http::{parse, Limits, Parse};
use lasthop_edge::tables::Tables;
use lasthop_snapshot::Snapshot;

const COUNT: u64 = 1_000_000;
const NOW_MS: i64 = 1_700_000_000_000;
const DATE: &[u8] = b"Date: Tue, 01 Dec 2026 14:00:00 GMT\r\n";

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let (_, scheme) = scheme();
    let snapshot = Arc::new(Snapshot::open(snapshot_file(COUNT, "1M")).expect("open"));
    let mut state = 11;
    let deny: Denylist = (0..10_000)
        .map(|_| {
            let n = COUNT + DEFAULT_RESERVE + rng(&mut state) % (1 << 30);
            (scheme.encode(n).expect("in domain"), Deny::Gone)
        })
        .collect();
    let tables = Tables::from_snapshot(scheme.clone(), snapshot, false)
        .expect("same key")
        .with_denylist(Arc::new(deny));
    let requests: Vec<Vec<u8>> = (0..1024)
        .map(|_| {
            let code = scheme.encode(rng(&mut state) % COUNT).expect("in domain");
            let mut r = b"GET /".to_vec();
            r.extend_from_slice(&code);
            r.extend_from_slice(
                b" HTTP/1.1\r\nHost: lh.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n",
            );
            r
        })
        .collect();
    let limits = Limits::default();
    let mut out = Vec::with_capacity(4096);
    let started = std::time::Instant::now();
    let mut acc = 0usize;
    for i in 0..n {
        out.clear();
        let Parse::Complete { req, .. } = parse(black_box(&requests[i & 1023]), &limits) else {
            panic!("bench requests are complete");
        };
        let (answer, _) = decide(&req, &tables, NOW_MS);
        lasthop_edge::render::render_with(
            &answer,
            &req,
            DATE,
            &lasthop_edge::render::NO_PAGES,
            &mut out,
        );
        acc = acc.wrapping_add(out.len());
    }
    let elapsed = started.elapsed();
    println!(
        "{n} hits in {:?}: {:.1} ns/hit (checksum {acc})",
        elapsed,
        elapsed.as_nanos() as f64 / n as f64
    );
}
