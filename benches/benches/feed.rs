//! What a burst of feed frames costs the engine's applier (`lasthop_edge::feed_apply`): apply
//! the frames, then make the next generation of the denylist and overlay
//! (`FeedView::tables`), against a standing denylist of 10,000 and of 1,000,000 codes. The goal
//! (issue 15) is a cost proportional to the burst, not to the standing list.
//!
//! - `patch/<burst>/<standing>`: the published generation is dropped before the next burst, as
//!   the serving cores do within a tick, so the spare copy is patched in place
//!   (`lasthop_edge::generations`);
//! - `copy/1/<standing>`: a core still holds the generation before last at every burst, so each
//!   generation is a copy of the whole table: the cost of every burst before the left-right
//!   tables, and the fallback now.
//!
//! Each burst takes down (or restores) codes drawn from 1,024 generated codes (so the overlay
//! stays under 1,024 links) that are not in the standing list.
//!
//! `cargo bench -p lasthop-benches --bench feed`

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode};
use lasthop_benches::{rng, scheme};
use lasthop_core::feed::{DenyEntry, DenyKind, Frame, LinkFrame};
use lasthop_core::HighWater;
use lasthop_edge::feed_apply::FeedView;
use lasthop_edge::tables::Tables;

const TOUCHED: u64 = 1_024;

/// A connected view holding a standing list of `standing` codes.
fn view(standing: u64) -> FeedView {
    let (_, scheme) = scheme();
    let entries = (TOUCHED..TOUCHED + standing)
        .map(|n| DenyEntry {
            code: code(n),
            deny: if n % 8 == 0 {
                DenyKind::Warn
            } else {
                DenyKind::Gone
            },
        })
        .collect();
    let mut hw = HighWater::new(1, 1_000).expect("one region");
    hw.raise(0, TOUCHED + standing).expect("region 0 exists");
    let mut v = FeedView::new(Tables::new(scheme, hw, true));
    v.connected();
    v.apply(Frame::Denylist {
        seq: 0,
        entries,
        part: 0,
        last: true,
    });
    v
}

fn code(n: u64) -> String {
    let (_, scheme) = scheme();
    let code = scheme.encode(n).expect("in domain");
    String::from_utf8(code.to_vec()).expect("codes are ASCII")
}

/// State change `seq`: takes the code down, or restores it (every other time).
fn change(seq: u64, code: &str) -> Frame {
    Frame::StateChanged(LinkFrame {
        seq,
        code: code.into(),
        long_url: "https://www.example.org/spring/launch-webinar?utm_source=x".into(),
        expires_at_ms: None,
        created_at_ms: Some(1),
        deleted: false,
        disabled: false,
        takedown_reason: (seq % 2 == 0).then(|| "phishing".into()),
        warn: false,
        options: Default::default(),
    })
}

fn feed(c: &mut Criterion) {
    let touched: Vec<String> = (0..TOUCHED).map(code).collect();
    let mut state = 7;
    let mut group = c.benchmark_group("feed_publish");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for standing in [10_000u64, 1_000_000] {
        let mut v = view(standing);
        let mut seq = 0u64;
        for burst in [1usize, 100] {
            group.bench_function(BenchmarkId::new(format!("patch/{burst}"), standing), |b| {
                b.iter(|| {
                    for _ in 0..burst {
                        seq += 1;
                        let i = (rng(&mut state) % TOUCHED) as usize;
                        v.apply(change(seq, &touched[i]));
                    }
                    let t = v.tables(true);
                    black_box(t.denylist.len())
                })
            });
        }
        let before = v.publish_stats();
        // The cores: each holds the generation it was given until two more are published.
        let mut held: VecDeque<Tables> = VecDeque::new();
        group.sampling_mode(SamplingMode::Flat);
        if standing > 100_000 {
            group.sample_size(10);
        }
        group.bench_function(BenchmarkId::new("copy/1", standing), |b| {
            b.iter(|| {
                seq += 1;
                let i = (rng(&mut state) % TOUCHED) as usize;
                v.apply(change(seq, &touched[i]));
                held.push_back(v.tables(true));
                if held.len() > 2 {
                    held.pop_front();
                }
                black_box(held.len())
            })
        });
        group.sampling_mode(SamplingMode::Auto).sample_size(20);
        let after = v.publish_stats();
        assert!(
            after.copied > before.copied,
            "the held generations forced copies"
        );
        assert!(after.in_place > 0, "the patch cases patched in place");
    }
    group.finish();
}

criterion_group!(benches, feed);
criterion_main!(benches);
