//! Code encode/decode: the first thing every generated-code redirect does.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lasthop_core::{CodeScheme, PermutationKey, CODE_SPACE};

fn code(c: &mut Criterion) {
    let mut group = c.benchmark_group("code");
    group.throughput(Throughput::Elements(1));
    for bits in [128usize, 256] {
        let key = PermutationKey::from_bytes(&vec![7u8; bits / 8]).expect("valid key length");
        let scheme = CodeScheme::new(&key).expect("scheme");
        let codes: Vec<[u8; 7]> = (0..1024u64)
            .map(|i| scheme.encode(i * 7_919 % CODE_SPACE).expect("in domain"))
            .collect();
        let mut i = 0u64;
        group.bench_function(format!("encode/aes{bits}"), |b| {
            b.iter(|| {
                i = (i + 1) % 1_000_000;
                black_box(scheme.encode(black_box(i)))
            })
        });
        let mut j = 0usize;
        group.bench_function(format!("decode/aes{bits}"), |b| {
            b.iter(|| {
                j = (j + 1) & 1023;
                black_box(scheme.decode(black_box(&codes[j])))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, code);
criterion_main!(benches);
