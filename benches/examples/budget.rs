//! The pure path's budget, paired: a cold hit against FF1 + one memory miss + 150 ns, with
//! every figure of a round measured within the same second.
//!
//! `cargo bench --bench request` times `hit_curl`, `part_decode` and `memory_floor` one after
//! another, seconds apart, and this VM drifts by a fifth within minutes (the same bench moved
//! 479 → 359 ns between two runs a minute apart), so a budget added up from three criterion
//! lines compares different machines. Here each round runs a block of every case in turn
//! (the order rotated each round) and the budget is checked per round:
//!
//! - `hit` (the default compact layout, mapped), `hit_paged` and `hit_huge` (the snapshot in
//!   huge pages, `--snapshot-memory huge`): whole hits as `request/hit_curl*` serves them (65,536
//!   codes of the 1M-link snapshot, the request copied into a buffer, prefetch, parse, decide,
//!   render with `Date`); `hit_paged_huge`, the paged layout in huge pages;
//! - `hot`: `request/hit_hot_curl` (1,024 codes, no miss at all);
//! - `decode`: `request/part_decode`, the FF1 decrypt alone;
//! - `floor`, `floor_huge`: `request/memory_floor*`, one dependent load through 128 MiB.
//!
//! Margin = hit − (decode + floor) (huge pages: − `floor_huge`); the budget holds in a round
//! whose margin is at most 150 ns. Prints every round, the medians, and the rounds within.
//!
//! `cargo run --release -p lasthop-benches --example budget [ROUNDS] [BLOCK]` (15 rounds of
//! 200,000 operations a case by default); pin it (`taskset -c 0`).

use std::hint::black_box;
use std::time::Instant;

use lasthop_benches::{
    hit_codes, receive, request_tables, request_tables_in, request_tables_with, scheme, serve,
    split, Chase, Codes, COLD_CODES, CURL, HOT_CODES,
};
use lasthop_edge::answer::Prefetcher;
use lasthop_edge::http::Limits;
use lasthop_edge::tables::Tables;
use lasthop_snapshot::{Layout, Snapshot};

/// What the budget allows beyond the decrypt and one miss.
const SLACK_NS: f64 = 150.0;

const CASES: [&str; 8] = [
    "hit",
    "hit_paged",
    "hit_huge",
    "hit_paged_huge",
    "hot",
    "decode",
    "floor",
    "floor_huge",
];

fn main() {
    let arg = |n: usize, default: usize| {
        std::env::args()
            .nth(n)
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let rounds = arg(1, 15);
    let block = arg(2, 200_000);
    let (_, scheme) = scheme();
    // The same draws, in the same order, as the `request` bench.
    let mut state = 11;
    let tables = request_tables(&mut state);
    let huge = request_tables_in(&mut 11, Snapshot::load);
    let paged = request_tables_with(&mut 11, Snapshot::open, Layout::Paged);
    let paged_huge = request_tables_with(&mut 11, Snapshot::load, Layout::Paged);
    let hits = hit_codes(&scheme, &mut state, COLD_CODES);
    let hot = Codes::new((0..HOT_CODES).map(|i| hits.get(i).to_vec()));
    let floor = Chase::new(32 << 20, false);
    let floor_huge = Chase::new(32 << 20, true);
    let limits = Limits::default();
    let template = split(CURL);
    let mut inbuf = Vec::with_capacity(4096);
    let mut out = Vec::with_capacity(4096);
    // One connection's prefetch state and one position per case, kept across rounds.
    let mut pfs = [Prefetcher::default(); CASES.len()];
    let mut at = [0usize; CASES.len()];
    let mut chase_at = [0u32; 2];

    let mut hit_case = |case: usize, t: &Tables, codes: &Codes, pf: &mut Prefetcher| {
        let mut acc = 0usize;
        for _ in 0..block {
            at[case] = (at[case] + 1) % codes.len();
            receive(&mut inbuf, template, codes, at[case]);
            acc = acc.wrapping_add(serve(black_box(&inbuf), &limits, t, &mut out, pf));
        }
        acc
    };
    let mut ns = vec![[0f64; CASES.len()]; rounds];
    for (r, row) in ns.iter_mut().enumerate() {
        for k in 0..CASES.len() {
            let case = (k + r) % CASES.len();
            let started = Instant::now();
            let check = match CASES[case] {
                "hit" => hit_case(case, &tables, &hits, &mut pfs[case]),
                "hit_paged" => hit_case(case, &paged, &hits, &mut pfs[case]),
                "hit_huge" => hit_case(case, &huge, &hits, &mut pfs[case]),
                "hit_paged_huge" => hit_case(case, &paged_huge, &hits, &mut pfs[case]),
                "hot" => hit_case(case, &tables, &hot, &mut pfs[case]),
                "decode" => {
                    let mut acc = 0u64;
                    let mut i = 0;
                    for _ in 0..block {
                        i = (i + 1) % hits.len();
                        acc = acc.wrapping_add(scheme.decode(black_box(hits.get(i))).unwrap_or(0));
                    }
                    acc as usize
                }
                name => {
                    let (chase, slot) = if name == "floor" {
                        (&floor, 0)
                    } else {
                        (&floor_huge, 1)
                    };
                    for _ in 0..block {
                        chase_at[slot] = chase.next(chase_at[slot]);
                    }
                    chase_at[slot] as usize
                }
            };
            black_box(check);
            row[case] = started.elapsed().as_nanos() as f64 / block as f64;
        }
    }

    let idx = |name: &str| CASES.iter().position(|c| *c == name).expect("a case");
    let margin = |row: &[f64; CASES.len()], hit: &str| {
        let floor = if hit.ends_with("_huge") {
            "floor_huge"
        } else {
            "floor"
        };
        row[idx(hit)] - row[idx("decode")] - row[idx(floor)]
    };
    println!(
        "round  {}  margin: hit hit_paged hit_huge hit_paged_huge (ns)",
        CASES.map(|c| format!("{c:>10}")).join(" ")
    );
    for (r, row) in ns.iter().enumerate() {
        println!(
            "{r:>5}  {}  {:>7.0} {:>7.0} {:>7.0} {:>7.0}",
            row.map(|v| format!("{v:>10.1}")).join(" "),
            margin(row, "hit"),
            margin(row, "hit_paged"),
            margin(row, "hit_huge"),
            margin(row, "hit_paged_huge")
        );
    }
    let medians: Vec<f64> = (0..CASES.len())
        .map(|c| median(ns.iter().map(|row| row[c]).collect()))
        .collect();
    println!(
        "median {}",
        medians
            .iter()
            .map(|v| format!("{v:>10.1}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    for hit in ["hit", "hit_paged", "hit_huge", "hit_paged_huge"] {
        let margins: Vec<f64> = ns.iter().map(|row| margin(row, hit)).collect();
        let within = margins.iter().filter(|m| **m <= SLACK_NS).count();
        println!(
            "{hit}: median margin {:.0} ns over decode + floor (budget {SLACK_NS:.0}); within the budget in {within} of {rounds} rounds",
            median(margins)
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
