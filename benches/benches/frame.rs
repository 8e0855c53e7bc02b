//! The kernel-bypass path's per-frame work in userspace (`lasthop_edge::wire`): parsing an
//! Ethernet/IPv4/TCP frame with both checksums verified in software, and writing a reset.
//!
//! - `parse_syn`: a 74-byte SYN with Linux's options (MSS, SACK, timestamps, window scale);
//! - `parse_request`: a 134-byte segment carrying an 80-byte curl-style GET;
//! - `parse_1448`: a full-MSS data segment (the checksum over 1,448 bytes dominates);
//! - `reset`: the reset answering the SYN, written as a whole frame (both checksums).
//!
//! Run: `cargo bench -p lasthop-benches --bench frame`.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lasthop_edge::wire::{parse, write_frame, write_reset, TcpControl, TcpRepr, TcpSeqNumber};
use smoltcp::wire::TcpTimestampRepr;

fn frame(control: TcpControl, payload: &[u8]) -> Vec<u8> {
    let syn = control == TcpControl::Syn;
    let tcp = TcpRepr {
        src_port: 40312,
        dst_port: 80,
        control,
        seq_number: TcpSeqNumber(0x1234_5678),
        ack_number: (!syn).then_some(TcpSeqNumber(0x0abc_def0)),
        window_len: 502,
        window_scale: syn.then_some(7),
        max_seg_size: syn.then_some(1460),
        sack_permitted: syn,
        sack_ranges: [None; 3],
        timestamp: Some(TcpTimestampRepr::new(
            3_000_000,
            if syn { 0 } else { 2_000_000 },
        )),
        payload,
    };
    let mut out = vec![0u8; 1600];
    let (client, server) = (
        Ipv4Addr::new(198, 18, 0, 2).into(),
        Ipv4Addr::new(198, 18, 0, 1).into(),
    );
    let n = write_frame(
        [2, 0, 0, 0, 0, 2],
        [2, 0, 0, 0, 0, 1],
        client,
        server,
        &tcp,
        &mut out,
    )
    .expect("fits");
    out.truncate(n);
    out
}

fn bench(c: &mut Criterion) {
    let syn = frame(TcpControl::Syn, &[]);
    let get = b"GET /abcDEF1 HTTP/1.1\r\nHost: l.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n";
    let request = frame(TcpControl::Psh, &get[..]);
    let full = frame(TcpControl::None, &[0x5a; 1448]);
    let mut g = c.benchmark_group("frame");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse_syn", |b| b.iter(|| parse(black_box(&syn)).is_ok()));
    g.bench_function("parse_request", |b| {
        b.iter(|| parse(black_box(&request)).is_ok())
    });
    g.bench_function("parse_1448", |b| b.iter(|| parse(black_box(&full)).is_ok()));
    let seg = parse(&syn).expect("a SYN");
    let mut out = [0u8; 64];
    g.bench_function("reset", |b| {
        b.iter(|| write_reset(black_box(&seg), &mut out))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
