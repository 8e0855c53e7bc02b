//! The reputation check on the create path: parse the destination (`Destination::parse`) and
//! look it up in a `ReputationIndex` of 1,000,000 entries, the size of the feeds loaded
//! together (URLhaus, PhishTank and OpenPhish URLs, hosts-file blocklists). The goal is under
//! 5 µs a create for both together, the lookup itself well under 1 µs. Also the build of that
//! index, which every list reload pays.
//!
//! The entries are synthetic but shaped like the feeds: 70% host entries (registrable names
//! under a few suffixes, some subdomains, some IPv4 addresses), 30% URL entries (a path and
//! often a query). Destinations are drawn from pools of 1,024 so the index is not walked in
//! one cache-friendly order.

use std::hint::black_box;
use std::net::Ipv4Addr;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lasthop_trust::{CanonicalHost, Destination, Entry, ReputationIndex};

const ENTRIES: usize = 1_000_000;
const POOL: usize = 1_024;
const SUFFIXES: &[&str] = &["com", "net", "example", "co.uk", "xyz", "top"];

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The `i`th listed registrable name.
fn listed_name(i: usize) -> String {
    format!("bad{i:x}-{}.{}", i % 97, SUFFIXES[i % SUFFIXES.len()])
}

/// The `i`th listed URL (a scheme, so `Destination::parse` takes it as is).
fn listed_url(i: usize) -> String {
    let host = format!("host{}.{}", i % 50_000, SUFFIXES[i % SUFFIXES.len()]);
    if i % 3 == 0 {
        format!("http://{host}/wp-content/uploads/{i}/login.php")
    } else {
        format!("https://{host}/secure/account/verify?session={i:x}&lang=en")
    }
}

/// Four lists of 1,000,000 entries in all: 700,000 hosts, 300,000 URLs.
fn lists() -> Vec<(&'static str, Vec<Entry>)> {
    let mut hosts = Vec::new();
    let mut ips = Vec::new();
    let mut urls = Vec::new();
    for i in 0..ENTRIES {
        match i % 10 {
            0..=2 => urls.push(Entry::Url(
                Destination::parse(&listed_url(i))
                    .expect("a synthetic URL parses")
                    .url_key,
            )),
            // Multiplying by an odd constant permutes u32: distinct, scattered addresses.
            3 => ips.push(Entry::Host(CanonicalHost::V4(Ipv4Addr::from(
                (i as u32).wrapping_mul(0x9e37_79b1),
            )))),
            4 => hosts.push(Entry::Host(CanonicalHost::Domain(format!(
                "cdn.{}",
                listed_name(i)
            )))),
            _ => hosts.push(Entry::Host(CanonicalHost::Domain(listed_name(i)))),
        }
    }
    let (phishtank, urlhaus) = urls.split_at(urls.len() / 2);
    vec![
        ("urlhaus", urlhaus.to_vec()),
        ("phishtank", phishtank.to_vec()),
        ("ip-blocklist", ips),
        ("hosts", hosts),
    ]
}

fn build(lists: &[(&'static str, Vec<Entry>)]) -> ReputationIndex {
    ReputationIndex::build(lists.iter().map(|(name, entries)| (*name, &entries[..])))
}

fn create_check(c: &mut Criterion) {
    let lists = lists();
    let index = build(&lists);
    assert_eq!(index.len(), ENTRIES);

    let mut rng = 7u64;
    let mut draw = || splitmix(&mut rng) as usize % ENTRIES;
    // Destinations nobody listed, shaped like real ones.
    let miss: Vec<String> = (0..POOL)
        .map(|i| {
            format!(
                "https://www.shop{}.example.com/products/item-{i}?utm_source=news&id={}",
                draw(),
                draw()
            )
        })
        .collect();
    // Pages on listed hosts, some on subdomains.
    let hit_host: Vec<String> = (0..POOL)
        .map(|_| {
            let i = (draw() / 10) * 10 + 5;
            format!(
                "https://login.{}/signin?next=%2Faccount&id={i}",
                listed_name(i)
            )
        })
        .collect();
    let hit_url: Vec<String> = (0..POOL).map(|_| listed_url((draw() / 10) * 10)).collect();
    for (pool, hits) in [(&miss, false), (&hit_host, true), (&hit_url, true)] {
        for url in pool {
            let dest = Destination::parse(url).expect("a bench URL parses");
            assert_eq!(index.check(&dest).is_some(), hits, "{url}");
        }
    }

    let mut group = c.benchmark_group("create_check");
    group.throughput(Throughput::Elements(1));
    for (name, pool) in [
        ("miss", &miss),
        ("hit_host", &hit_host),
        ("hit_url", &hit_url),
    ] {
        let mut i = 0usize;
        group.bench_function(name, |b| {
            b.iter(|| {
                i = (i + 1) % POOL;
                let dest = Destination::parse(black_box(&pool[i]));
                black_box(dest.as_ref().and_then(|d| index.check(d)).is_some())
            })
        });
    }
    group.finish();

    let mut group = c.benchmark_group("index_build");
    group.sample_size(10);
    group.throughput(Throughput::Elements(ENTRIES as u64));
    group.bench_function("1M", |b| b.iter_with_large_drop(|| build(&lists)));
    group.finish();
}

criterion_group!(benches, create_check);
criterion_main!(benches);
