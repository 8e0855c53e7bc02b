//! The engine's pure request path: `http::parse` + `answer::decide` + `render::render_with` (with
//! the `Date` line every answer carries) of one GET, against a 1M-link snapshot (the goal is under 300 ns per request).
//!
//! The snapshot is the same file `benches/snapshot.rs` uses (`Synth`, the same key and seeds,
//! in `$CARGO_TARGET_DIR/lasthop-bench/`), built once if missing (a few seconds) and memory
//! mapped, as the engine serves it. The denylist holds 10,000 codes (none of the ones asked),
//! so its check is a real hash probe, not the empty-list shortcut. Requests cycle through 64K
//! distinct codes, so each lookup lands on a cold cache line of a warm file, like real traffic;
//! each request is first copied into one hot input buffer, as recv would leave it (the copy,
//! ~10 ns, is timed too, and shown alone as `part_receive_copy`).
//!
//! - `hit_curl`, `hit_wrk`, `hit_browser`: a generated code in the snapshot → 302, with the
//!   headers each client really sends (the browser's are ~500 bytes);
//! - `hit_curl_domains`: `hit_curl` with 10,000 branded domains in the tables: the default
//!   domain's request also looks its `Host` up among them (issue 41's budget check);
//! - `hit_curl_huge`: `hit_curl` with the snapshot copied into transparent huge pages
//!   (`Snapshot::load`, the engine's `--snapshot-memory huge`);
//! - `hit_curl_paged`: `hit_curl` on the same links in the paged layout (each entry beside its
//!   index bucket: one miss per cold hit instead of two, for about 55 more bytes a link), the
//!   trade the control plane's `--snapshot-layout` makes;
//! - `hit_hot_curl`: the same over 1,024 codes, whose entries stay in cache (the head of real,
//!   skewed traffic);
//! - `never_issued`: random well-formed codes above the high-water mark → 404 by arithmetic
//!   (the scanner case);
//! - `alias`: an alias in the snapshot → 302;
//! - `fixed`: `render_fixed_with` (the 302 and the `Date` line) alone, the floor (the cost of emitting any response at all);
//! - `part_*`: the pieces of `hit_*` alone, to see where the time goes;
//! - `memory_floor`, `memory_floor_huge`: one dependent load that misses every cache (a
//!   pointer chase over 128 MiB, on small pages and on huge pages), the physical floor under a
//!   cold `part_lookup`; the pure path's budget for a hit is `part_decode` + the floor of its
//!   page size + 150 ns (`hit_curl` against `memory_floor`, `hit_curl_huge` against
//!   `memory_floor_huge`);
//! - `h2_hit_curl`: `hit_curl` over HTTP/2: a HEADERS frame with curl's fields (HPACK literals,
//!   as a client's first request on a connection sends them) fed to an open `H2Conn`, decoded,
//!   decided, and the answer's HEADERS frame encoded (the HTTP/1 answer transcoded); the goal is
//!   within 1.3x of `hit_curl`;
//! - `part_click_record`: the click event of a browser's request (visitor hash, referrer host,
//!   user agent, encode) appended to a buffer, cleared as the flusher would
//!   (`lasthop_edge::click`; the engine adds an uncontended lock on its core's buffer).
//!
//! `cargo bench -p lasthop-benches --bench request`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use lasthop_benches::{
    hit_codes, receive, request_tables, request_tables_in, request_tables_with, rng, scheme, serve,
    split, Chase, Codes, BROWSER, COLD_CODES, CURL, DATA_SEED, DATE, HOT_CODES, NOW_MS,
    REQUEST_LINKS as COUNT, WRK,
};
use lasthop_edge::answer::{decide, Answer, Layer, Prefetcher};
use lasthop_edge::http::{parse, Limits, Parse};
use lasthop_snapshot::{Layout, Snapshot, Synth};

fn request(c: &mut Criterion) {
    let (_, scheme) = scheme();
    let mut state = 11;
    let tables = request_tables(&mut state);
    // The same tables with the snapshot copied into huge pages (`--snapshot-memory huge`).
    let huge = request_tables_in(&mut 11, Snapshot::load);
    let paged = request_tables_with(&mut 11, Snapshot::open, Layout::Paged);

    let hits = hit_codes(&scheme, &mut state, COLD_CODES);
    // What a scanner sends: uniformly random codes, nearly all far above the mark.
    let never = Codes::new(
        std::iter::repeat_with(|| {
            let n = rng(&mut state) % lasthop_core::CODE_SPACE;
            scheme.encode(n).expect("in domain").to_vec()
        })
        .filter(|code| {
            scheme
                .decode(code)
                .is_some_and(|n| !tables.high_water.may_be_issued(n))
        })
        .take(COLD_CODES),
    );
    let mut synth = Synth::new(scheme.clone(), COUNT, DATA_SEED);
    let mut alias_list = Vec::new();
    while let Some(l) = synth.next_link() {
        if l.counter.is_none() {
            alias_list.push(l.key.to_vec());
        }
    }
    let aliases = Codes::new(alias_list);
    // A hot set: real traffic is skewed, and its head stays in cache.
    let hot = Codes::new((0..HOT_CODES).map(|i| hits.get(i).to_vec()));
    let limits = Limits::default();
    // The same tables with 10,000 branded domains: a default-domain request then pays one
    // lookup of its Host among them (a miss).
    let branded = tables.with_domains(std::sync::Arc::new(lasthop_edge::domains::Domains::new(
        (0..10_000).map(|i| lasthop_edge::domains::Domain::new(&format!("brand{i}.example"))),
    )));
    let tables_of = |name: &str| {
        if name.ends_with("_huge") {
            &huge
        } else if name.ends_with("_paged") {
            &paged
        } else if name.ends_with("_domains") {
            &branded
        } else {
            &tables
        }
    };
    // (name, request template split at the code, codes, expected layer, expected status)
    type Case<'a> = (&'a str, (&'a str, &'a str), &'a Codes, Layer, u16);
    let cases: [Case<'_>; 9] = [
        ("hit_curl", split(CURL), &hits, Layer::Snapshot, 302),
        ("hit_curl_domains", split(CURL), &hits, Layer::Snapshot, 302),
        ("hit_curl_huge", split(CURL), &hits, Layer::Snapshot, 302),
        ("hit_curl_paged", split(CURL), &hits, Layer::Snapshot, 302),
        ("hit_hot_curl", split(CURL), &hot, Layer::Snapshot, 302),
        ("hit_wrk", split(WRK), &hits, Layer::Snapshot, 302),
        ("hit_browser", split(BROWSER), &hits, Layer::Snapshot, 302),
        ("never_issued", split(CURL), &never, Layer::HighWater, 404),
        ("alias", split(CURL), &aliases, Layer::Snapshot, 302),
    ];
    // Every prepared request gets the answer its case is named for.
    let mut inbuf = Vec::with_capacity(4096);
    for (name, template, codes, layer, status) in &cases {
        let tables = tables_of(name);
        for i in 0..codes.len() {
            receive(&mut inbuf, *template, codes, i);
            let Parse::Complete { req, .. } = parse(&inbuf, &limits) else {
                panic!("{name}: incomplete request");
            };
            let (answer, got) = decide(&req, tables, NOW_MS);
            assert_eq!((answer.status(), got), (*status, *layer), "{name}");
        }
    }

    let mut group = c.benchmark_group("request");
    group
        .sample_size(50)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .throughput(Throughput::Elements(1));
    let mut out = Vec::with_capacity(4096);
    for (name, template, codes, _, _) in &cases {
        let tables = tables_of(name);
        let mut i = 0usize;
        let mut pf = Prefetcher::default();
        group.bench_function(*name, |b| {
            b.iter(|| {
                i += 1;
                if i == codes.len() {
                    i = 0;
                }
                receive(&mut inbuf, *template, codes, i);
                black_box(serve(black_box(&inbuf), &limits, tables, &mut out, &mut pf))
            })
        });
    }

    // The parts, to see where the time goes (same inputs as `hit_curl` / `hit_browser`).
    let snap = tables.snapshot.clone().expect("tables hold the snapshot");
    let mut i = 0usize;
    let mut next = move || {
        i += 1;
        if i == COLD_CODES {
            i = 0;
        }
        i
    };
    for (name, template) in [
        ("part_parse_curl", split(CURL)),
        ("part_parse_browser", split(BROWSER)),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                receive(&mut inbuf, template, &hits, next());
                matches!(parse(black_box(&inbuf), &limits), Parse::Complete { .. })
            })
        });
    }
    group.bench_function("part_receive_copy", |b| {
        b.iter(|| {
            receive(&mut inbuf, split(CURL), &hits, next());
            black_box(inbuf.len())
        })
    });
    group.bench_function("part_decode", |b| {
        b.iter(|| black_box(scheme.decode(black_box(hits.get(next())))))
    });
    group.bench_function("part_denylist", |b| {
        b.iter(|| black_box(tables.denylist.check(black_box(hits.get(next())))))
    });
    group.bench_function("part_lookup", |b| {
        b.iter(|| {
            black_box(
                snap.lookup(black_box(hits.get(next())))
                    .map(|e| e.url().len()),
            )
        })
    });
    // The physical floor of a cold lookup: one dependent load from memory no cache holds (a
    // pointer chase through a random cycle over 128 MiB, far past the last-level cache and the
    // TLB's reach), the miss `part_lookup` pays at best; on small pages as the mapped snapshot,
    // and on transparent huge pages as `--snapshot-memory huge` (`memory_floor_huge`).
    for (name, huge) in [("memory_floor", false), ("memory_floor_huge", true)] {
        let chase = Chase::new(32 << 20, huge);
        let mut at = 0u32;
        group.bench_function(name, |b| {
            b.iter(|| {
                at = chase.next(at);
                black_box(at)
            })
        });
    }
    let redirect = Answer::Redirect {
        url: b"https://www.example.org/spring/launch-webinar/abcdefghij0123456789?utm_source=x",
    };
    group.bench_function("part_render_redirect", |b| {
        b.iter(|| {
            out.clear();
            lasthop_edge::render::render(black_box(&redirect), false, true, false, &mut out);
            black_box(out.len())
        })
    });
    group.bench_function("fixed", |b| {
        b.iter(|| {
            out.clear();
            lasthop_edge::render::render_fixed_with(DATE, &mut out);
            black_box(out.len())
        })
    });
    let mut builder = lasthop_edge::click::ClickBuilder::new([7; 32], 42);
    let browser_req = BROWSER.replace("{}", "Ab3dE9x");
    let Parse::Complete { req, .. } = parse(browser_req.as_bytes(), &Limits::default()) else {
        panic!("the browser request parses")
    };
    let from = lasthop_edge::click::Origin {
        peer: Some("203.0.113.77".parse().expect("address")),
        country: None,
        https: true,
        protocol: lasthop_core::click::Protocol::H1,
        early: false,
    };
    let mut events = Vec::with_capacity(1 << 20);
    let mut n = 0i64;
    group.bench_function("part_click_record", |b| {
        b.iter(|| {
            n += 1;
            builder.encode(
                black_box(&req),
                b"Ab3dE9x",
                b"",
                "fra1",
                from,
                1_764_504_000_000 + n,
                &mut events,
            );
            if n % 2048 == 0 {
                events.clear();
            }
        })
    });
    h2_hit(&mut group, &tables, &hits, &limits);
    group.finish();
}

/// No effect is carried out (the HTTP/1 cases report none either).
struct NoEffects;

impl lasthop_edge::session::Effects for NoEffects {
    #[inline]
    fn effect(&mut self, e: lasthop_edge::session::Effect<'_>) {
        black_box(&e);
    }
}

/// A HEADERS frame with what curl sends, for `code` on `stream`: literal fields, no Huffman
/// (written in place, as recv would leave it: no allocation, like `receive`).
fn h2_headers(stream: u32, code: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let len = 4 + 10 + 3 + code.len() + 3 + 10 + 3 + 3;
    lasthop_edge::h2::frame::write_header(
        out,
        len,
        lasthop_edge::h2::frame::kind::HEADERS,
        lasthop_edge::h2::frame::flag::END_HEADERS | lasthop_edge::h2::frame::flag::END_STREAM,
        stream,
    );
    out.extend_from_slice(&[0x82, 0x87, 0x01, 10]); // GET, https, :authority
    out.extend_from_slice(b"lh.example");
    out.extend_from_slice(&[0x04, (code.len() + 1) as u8, b'/']); // :path
    out.extend_from_slice(code);
    out.extend_from_slice(&[0x0f, 58 - 15, 10]); // user-agent
    out.extend_from_slice(b"curl/8.5.0");
    out.extend_from_slice(&[0x0f, 19 - 15, 3]); // accept
    out.extend_from_slice(b"*/*");
}

fn h2_hit(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    tables: &lasthop_edge::tables::Tables,
    hits: &Codes,
    limits: &Limits,
) {
    use lasthop_edge::h2::H2Conn;
    use lasthop_edge::session::{Env, Headers, How, Proto};
    let mut headers = Headers::default();
    headers.refresh(NOW_MS, b"");
    let env = Env {
        tables,
        limits,
        pages: &lasthop_edge::render::NO_PAGES,
        headers: &headers,
        now_ms: NOW_MS,
        fixed: false,
        https_redirect: None,
        coverage: None,
    };
    let how = How {
        early: false,
        https: false,
        proto: Proto::H2,
    };
    let open = |out: &mut Vec<u8>| {
        let mut fx = NoEffects;
        let mut conn = H2Conn::new(limits.h2, NOW_MS, out, &mut fx);
        let mut preface = lasthop_edge::h2::frame::PREFACE.to_vec();
        lasthop_edge::h2::frame::write_settings(&mut preface, &[]);
        conn.on_input(&preface, how, &env, &mut fx, out);
        out.clear();
        conn
    };
    let mut out = Vec::with_capacity(4096);
    let mut inbuf = Vec::with_capacity(256);
    // Every prepared request gets its 302.
    let mut conn = open(&mut out);
    for i in 0..hits.len().min(1024) {
        h2_headers(2 * i as u32 + 1, hits.get(i), &mut inbuf);
        out.clear();
        conn.on_input(&inbuf, how, &env, &mut NoEffects, &mut out);
        assert_eq!(
            &out[9..14],
            &[0x08, 3, b'3', b'0', b'2'],
            "h2_hit_curl: a 302"
        );
    }
    let mut conn = open(&mut out);
    let mut stream = 1u32;
    let mut i = 0usize;
    group.bench_function("h2_hit_curl", |b| {
        b.iter(|| {
            i += 1;
            if i == hits.len() {
                i = 0;
            }
            stream += 2;
            if stream > 1 << 30 {
                conn = open(&mut out);
                stream = 1;
            }
            h2_headers(stream, hits.get(i), &mut inbuf);
            out.clear();
            conn.on_input(black_box(&inbuf), how, &env, &mut NoEffects, &mut out);
            black_box(out.len())
        })
    });
}

criterion_group!(benches, request);
criterion_main!(benches);
