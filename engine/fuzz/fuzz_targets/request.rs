//! Untrusted request bytes through the whole pure path: `http::parse`, then `decide` and
//! `render_for` for every pipelined request, `render` for every parse error; the parse is held
//! to the `httparse` path (`parse_general`) on every input. Nothing may
//! panic, and every response must be one well-framed HTTP/1.1 message whose `Location`, if
//! any, is a servable URL.
#![no_main]

use std::sync::{Arc, OnceLock};

use lasthop_core::{is_servable, CodeScheme, HighWater, PermutationKey};
use lasthop_edge::answer::{decide, Answer};
use lasthop_edge::denylist::{Deny, Denylist};
use lasthop_edge::http::{parse, parse_general, Limits, Method, Parse};
use lasthop_edge::overlay::{Overlay, OverlayLink};
use lasthop_edge::render::{render, render_for};
use lasthop_edge::tables::Tables;
use lasthop_snapshot::{Snapshot, SnapshotMeta, SnapshotWriter};
use libfuzzer_sys::fuzz_target;

/// A small world: counters 0..8 in the snapshot (some expiring, one unservable), 8 and an
/// alias in the overlay, a denylist of both kinds. The seed corpus names `abcDEF1`-style
/// codes; the fuzzer finds the real ones through the decode/high-water branches.
fn tables() -> &'static Tables {
    static TABLES: OnceLock<Tables> = OnceLock::new();
    TABLES.get_or_init(|| {
        let key = PermutationKey::from_bytes(&[3u8; 16]).expect("AES-128 key");
        let scheme = CodeScheme::new(&key).expect("valid domain");
        let mut hw = HighWater::new(1, 64).expect("one region");
        hw.raise(0, 16).expect("region 0");
        let mut w = SnapshotWriter::in_memory(SnapshotMeta::new(1, key.id(), hw)).expect("writer");
        let code = |n| scheme.encode(n).expect("in domain");
        for n in 0..8u64 {
            let url: &[u8] = match n {
                5 => b"javascript:alert(1)",
                6 => b"https://example.com/\r\nX: y",
                _ => b"https://example.com/<a>&\"'",
            };
            let expires = (n % 3 == 0).then_some(128);
            w.add(&code(n), url, expires).expect("add");
        }
        w.add(b"fuzz-alias", b"https://example.org/alias", None)
            .expect("add");
        let (_, bytes) = w.seal().expect("seal");
        let snapshot = Arc::new(Snapshot::from_vec(bytes).expect("open"));
        let tables = Tables::from_snapshot(scheme.clone(), snapshot, true).expect("same key");
        let deny = Denylist::new([
            (code(1).to_vec(), Deny::Gone),
            (code(2).to_vec(), Deny::Warn),
            (b"denied-alias".to_vec(), Deny::Gone),
        ]);
        let overlay = Overlay::empty().with_all([
            (
                code(8).to_vec(),
                OverlayLink::new(b"http://o.example/", None, true),
            ),
            (
                b"overlay-alias".to_vec(),
                OverlayLink::new(b"https://o.example/a", Some(200), false),
            ),
        ]);
        tables
            .with_denylist(Arc::new(deny))
            .with_overlay(Arc::new(overlay))
    })
}

fn check_response(bytes: &[u8], head: bool) {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let n = match resp.parse(bytes) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!("response does not parse: {other:?}"),
    };
    let mut length = None;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.parse::<usize>().ok());
        }
        if h.name.eq_ignore_ascii_case("location") {
            assert!(is_servable(h.value), "unservable Location {:?}", h.value);
        }
    }
    let length = length.expect("Content-Length");
    let body = bytes.len() - n;
    assert_eq!(body, if head { 0 } else { length });
}

fuzz_target!(|data: &[u8]| {
    let Some((&knob, buf)) = data.split_first() else {
        return;
    };
    // Small limits half the time, so the limit branches are reachable at short lengths.
    let limits = if knob & 1 == 0 {
        Limits::default()
    } else {
        Limits {
            max_request_line: 40,
            max_headers: 4,
            max_header_bytes: 128,
            country_header: lasthop_edge::http::HeaderName::new("cf-ipcountry").ok(),
        }
    };
    let now_ms = i64::from(knob >> 1) * 2;
    let t = tables();
    let mut out = Vec::new();
    let mut at = 0;
    while at < buf.len() {
        let rest = &buf[at..];
        out.clear();
        let parsed = parse(rest, &limits);
        // The fast path answers only as `httparse`'s path would.
        assert_eq!(parsed, parse_general(rest, &limits));
        match parsed {
            Parse::Complete { req, consumed } => {
                assert!(consumed > 0 && consumed <= rest.len());
                let start = (req.path.as_ptr() as usize).wrapping_sub(rest.as_ptr() as usize);
                assert!(req.path.is_empty() || start + req.path.len() <= consumed);
                let (answer, _) = decide(&req, t, now_ms);
                let answer = match answer {
                    Answer::NeedOrigin { code, preview, .. } => {
                        lasthop_edge::answer::answer_from_origin(code, preview, t, None, now_ms).0
                    }
                    other => other,
                };
                let close = render_for(&answer, &req, &mut out);
                check_response(&out, req.method == Method::Head);
                at += consumed;
                if close {
                    break;
                }
            }
            Parse::Partial => break,
            Parse::Error(e) => {
                assert!(render(&Answer::BadRequest(e), false, true, false, &mut out));
                check_response(&out, false);
                break;
            }
        }
    }
});
