//! The raw archive's encodings, per event, on the synthetic stream `perf/clicks.sh` uses
//! (`lasthop_clicks::synth`: ~200 browser agents, 10% bots, 1% duplicate deliveries, one day):
//!
//! - `archive/parquet_encode`: events into one Parquet object (`columnar.rs`, what the archive
//!   consumer writes), the footer's checksum included;
//! - `archive/ndjson_zstd`: the archive before it, JSON lines compressed by zstd level 1 in
//!   chunks of the same size (`archive.rs`' writer);
//! - `archive/parquet_read`: an object read back and every row checked as a binary event (what
//!   a recompute does per event, before counting).
//!
//! It prints each form's bytes per event once, before measuring.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lasthop_clicks::synth::{Synth, SynthConfig};
use lasthop_core::click::ClickEvent;

const EVENTS: u64 = 100_000;

fn stream() -> Vec<u8> {
    let mut synth = Synth::new(SynthConfig {
        events: EVENTS,
        codes: 10_000,
        fixed_codes: Vec::new(),
        visitors: 100_000,
        bot_share: 0.1,
        days: 1,
        seed: 7,
        now_ms: 1_764_590_400_000,
    });
    let mut raw = Vec::new();
    for _ in 0..EVENTS {
        synth.next_into(&mut raw);
    }
    raw
}

fn ndjson_zstd(events: &[ClickEvent<'_>]) -> Vec<u8> {
    // The old writer: chunks of ~2 MiB of binary events, each one zstd frame of their lines.
    let mut out = Vec::new();
    let mut lines = Vec::new();
    for chunk in events.chunks(16_000) {
        lines.clear();
        for e in chunk {
            lasthop_clicks::archive::write_line(&mut lines, e);
        }
        out.extend_from_slice(&zstd::bulk::compress(&lines, 1).expect("zstd"));
    }
    out
}

fn archive(c: &mut Criterion) {
    let raw = stream();
    let mut events = Vec::new();
    let mut rest = &raw[..];
    while !rest.is_empty() {
        let (e, n) = ClickEvent::decode(rest).expect("synth's events decode");
        events.push(e);
        rest = &rest[n..];
    }
    let parquet = lasthop_clicks::columnar::encode(&events).expect("encodes");
    let ndjson = ndjson_zstd(&events);
    let n = events.len() as f64;
    eprintln!(
        "archive bytes per event ({} events): parquet {:.1}, ndjson+zstd(1) {:.1}, binary (spool) {:.1}",
        events.len(),
        parquet.len() as f64 / n,
        ndjson.len() as f64 / n,
        raw.len() as f64 / n
    );
    let mut g = c.benchmark_group("archive");
    g.throughput(Throughput::Elements(events.len() as u64));
    g.sample_size(10);
    g.bench_function("parquet_encode", |b| {
        b.iter(|| lasthop_clicks::columnar::encode(&events).expect("encodes"))
    });
    g.bench_function("ndjson_zstd", |b| b.iter(|| ndjson_zstd(&events)));
    let object = bytes::Bytes::from(parquet);
    g.bench_function("parquet_read", |b| {
        b.iter(|| {
            let mut rows = 0u64;
            lasthop_clicks::columnar::read(object.clone(), |_| rows += 1).expect("reads");
            rows
        })
    });
    g.finish();
}

criterion_group!(benches, archive);
criterion_main!(benches);
