//! Tight loop of request parses (a curl request, as `part_parse_curl` parses it, or with
//! `browser` a browser's, as `part_parse_browser`; `general` after either skips the fast
//! path), for instruction counts (`valgrind --tool=callgrind`) that stay meaningful on a noisy
//! machine.
//!
//! `cargo build --release -p lasthop-benches --example parse_loop && valgrind --tool=callgrind
//! target/release/examples/parse_loop 100000 [browser] [general]`

use std::hint::black_box;

use lasthop_edge::http::{parse, parse_general, Limits, Parse};

const CURL: &[u8] =
    b"GET /Ab3dE9x HTTP/1.1\r\nHost: lh.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n";

const BROWSER: &[u8] = b"GET /Ab3dE9x HTTP/1.1\r\nHost: lh.example\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n\
Accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8\r\n\
Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n\
Referer: https://news.example.com/article/12345\r\nConnection: keep-alive\r\n\
Upgrade-Insecure-Requests: 1\r\nSec-Fetch-Dest: document\r\nSec-Fetch-Mode: navigate\r\n\
Sec-Fetch-Site: cross-site\r\nSec-Fetch-User: ?1\r\nPriority: u=0, i\r\n\r\n";

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10_000_000);
    let args: Vec<String> = std::env::args().collect();
    let request = if args.iter().any(|a| a == "browser") {
        BROWSER
    } else {
        CURL
    };
    let parse = if args.iter().any(|a| a == "general") {
        parse_general
    } else {
        parse
    };
    let limits = Limits::default();
    let started = std::time::Instant::now();
    let mut acc = 0usize;
    for _ in 0..n {
        if let Parse::Complete { req, consumed } = parse(black_box(request), &limits) {
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
