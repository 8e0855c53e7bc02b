//! The fuzz targets: one function per parser of untrusted bytes, each taking any bytes and
//! asserting what must hold for every input (nothing panics, and the target's own checks).
//! `fuzz_targets/*.rs` hand them to libFuzzer (`scripts/fuzz`, cargo-fuzz on nightly); on
//! stable `tests/replay.rs` runs every checked-in corpus file (`fuzz/corpus/<target>/`) and every
//! regression input through them, so what a campaign found stays found. `docs/FUZZING.md` has
//! the campaign's table.

use std::ffi::OsString;
use std::io::Write as _;
use std::sync::{Arc, OnceLock};

use lasthop_core::{is_servable, CodeScheme, HighWater, PermutationKey};
use lasthop_edge::answer::{answer_from_origin, decide, Answer};
use lasthop_edge::denylist::{Deny, Denylist};
use lasthop_edge::http::{parse, parse_general, Limits, Method, Parse};
use lasthop_edge::overlay::{Overlay, OverlayLink};
use lasthop_edge::render::{render, render_for, Pages};
use lasthop_edge::session::{Effect, Effects, Env, Headers, How, Proto};
use lasthop_edge::tables::Tables;
use lasthop_snapshot::{Snapshot, SnapshotMeta, SnapshotWriter};

/// A target: any bytes in, its checks asserted.
pub type Target = fn(&[u8]);

/// Every target, by name (the names of `fuzz_targets/*.rs` and of the corpus directories).
pub const TARGETS: &[(&str, Target)] = &[
    ("http1", http1),
    ("h2", h2),
    ("hpack", hpack),
    ("h3", h3),
    ("qpack", qpack),
    ("feed", feed),
    ("snapshot", snapshot),
    ("click_event", click_event),
    ("spool", spool),
    ("reputation_list", reputation_list),
    ("config_toml", config_toml),
    ("url", url),
    ("alias", alias),
    ("peer_wire", peer_wire),
    ("origin_reply", origin_reply),
    ("tcp_segment", tcp_segment),
    ("quic_packets", quic_packets),
    ("archive_object", archive_object),
    ("import", import),
];

/// A small world: counters 0..8 in the snapshot (some expiring, two unservable), 8 and an
/// alias in the overlay, a denylist of both kinds.
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

/// One HTTP/1.1 response: it parses, its body is as long as it says, and a `Location` is
/// servable.
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
    assert_eq!(bytes.len() - n, if head { 0 } else { length });
}

/// HTTP/1 requests through the whole pure path: parse (held to the `httparse` path), decide,
/// render, pipelined; every response one well-framed message.
pub fn http1(data: &[u8]) {
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
            ..Limits::default()
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
        assert_eq!(parsed, parse_general(rest, &limits));
        match parsed {
            Parse::Complete { req, consumed } => {
                assert!(consumed > 0 && consumed <= rest.len());
                let (answer, _) = decide(&req, t, now_ms);
                let answer = match answer {
                    Answer::NeedOrigin { code, preview, .. } => {
                        answer_from_origin(code, preview, t, req.host, None, now_ms).0
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
}

/// Effects dropped (the targets check what is written, not what is counted).
struct NoEffects;

impl Effects for NoEffects {
    fn effect(&mut self, _: Effect<'_>) {}
}

fn env<'a>(limits: &'a Limits, pages: &'a Pages, headers: &'a Headers) -> Env<'a> {
    Env {
        tables: tables(),
        limits,
        pages,
        headers,
        now_ms: 1_000,
        fixed: false,
        https_redirect: None,
        coverage: None,
    }
}

fn settings() -> (Limits, Pages, Headers) {
    let mut headers = Headers::default();
    headers.refresh(1_000, b"Strict-Transport-Security: max-age=60\r\n");
    (Limits::default(), Pages::default(), headers)
}

/// HTTP/2 (h2c) connections: the preface, then the input cut into reads at the input's own
/// choosing; the connection answers, refuses or closes, and never panics or grows without bound.
pub fn h2(data: &[u8]) {
    let (limits, pages, headers) = settings();
    let env = env(&limits, &pages, &headers);
    let mut fx = NoEffects;
    let mut out = Vec::new();
    let mut conn = lasthop_edge::h2::H2Conn::new(limits.h2, 1_000, &mut out, &mut fx);
    let how = How {
        early: false,
        https: true,
        proto: Proto::H2,
    };
    // The first byte picks the read size (every split point is a real network's); the rest
    // follows the preface.
    let Some((&knob, frames)) = data.split_first() else {
        return;
    };
    let mut input = lasthop_edge::h2::frame::PREFACE.to_vec();
    input.extend_from_slice(frames);
    let step = usize::from(knob % 64) + 1;
    for chunk in input.chunks(step) {
        out.clear();
        conn.on_input(chunk, how, &env, &mut fx, &mut out);
        assert!(out.len() <= 4 << 20, "one read wrote {} bytes", out.len());
    }
}

/// HPACK blocks into one decoder (its dynamic table carries over between them).
pub fn hpack(data: &[u8]) {
    let mut decoder = lasthop_edge::h2::hpack::Decoder::default();
    for block in data.split(|&b| b == 0xff) {
        // Each field takes at least a byte of the block, and is at most a table entry (4096
        // bytes, the table's size) or a literal of the block's bytes (Huffman: at most 8 chars
        // from 5 bits). Decoded bytes in all are not bounded by the block: an indexed field is
        // one byte however long its entry (`indexed-fields-repeat-a-table-entry`); the engine
        // stops keeping fields past --h2-max-header-list-size (`hpack::collect`).
        let mut fields = 0usize;
        let _ = decoder.decode_with(block, |name, value| {
            fields += 1;
            let size = name.len() + value.len();
            assert!(
                size <= 4096 + 2 * block.len(),
                "a {size}-byte field from a {}-byte block",
                block.len()
            );
        });
        assert!(
            fields <= block.len(),
            "{fields} fields from a {}-byte block",
            block.len()
        );
    }
    let mut plain = Vec::new();
    let _ = lasthop_edge::h2::huffman::decode(data, &mut plain);
}

/// HTTP/3: the input split into stream writes (request and unidirectional streams, fin or
/// not), as the QUIC layer hands them over.
pub fn h3(data: &[u8]) {
    let (limits, pages, headers) = settings();
    let env = env(&limits, &pages, &headers);
    let mut fx = NoEffects;
    let (mut conn, _) =
        lasthop_edge::h3::H3Conn::new(lasthop_edge::h3::H3Limits::default(), Some("lh.example"));
    let how = How {
        early: false,
        https: true,
        proto: Proto::H3,
    };
    let mut acts = Vec::new();
    let mut rest = data;
    // Each write: a control byte (stream kind and id, fin), a length byte, the bytes.
    while let [control, len, tail @ ..] = rest {
        let n = usize::from(*len).min(tail.len());
        let (chunk, next) = tail.split_at(n);
        let fin = control & 0x80 != 0;
        let id = u64::from(control & 0x0f) * 4;
        acts.clear();
        if control & 0x40 == 0 {
            conn.on_request(id, chunk, fin, how, &env, &mut fx, &mut acts);
        } else {
            conn.on_uni(id + 2, chunk, fin, &mut acts);
        }
        rest = next;
    }
}

/// QPACK field sections (static table only).
pub fn qpack(data: &[u8]) {
    let mut n = 0usize;
    let _ = lasthop_edge::h3::qpack::decode(data, |name, value| n += name.len() + value.len());
    let _ = lasthop_edge::h3::frame::header(data);
    let _ = lasthop_edge::h3::frame::settings(data);
}

/// Feed frames (NDJSON lines from the control plane), applied to the edge's tables.
pub fn feed(data: &[u8]) {
    let mut view = lasthop_edge::feed_apply::FeedView::new(tables().clone());
    for line in data.split(|&b| b == b'\n') {
        if let Ok(frame) = lasthop_core::feed::parse_frame(line) {
            let _ = view.apply(frame);
        }
    }
    let t = view.tables(false);
    // The applied tables answer a request as any others do.
    let req = b"GET /Ab3dE9x HTTP/1.1\r\nHost: lh.example\r\n\r\n";
    if let Parse::Complete { req, .. } = parse(req, &Limits::default()) {
        let _ = decide(&req, &t, 1_000);
    }
}

/// Snapshot files (any format version): open, verify, audit, look keys up.
pub fn snapshot(data: &[u8]) {
    let keys = &data[data.len().saturating_sub(318)..];
    if let Ok(s) = Snapshot::from_bytes(data) {
        let _ = s.verify();
        let _ = s.audit();
        for len in [7usize, 8, 12, 64, 126, 127, 200, 318] {
            if let Some(k) = keys.get(..len) {
                s.prefetch_entry(s.prefetch(k));
                let _ = s.lookup_probe(k, s.probe(k));
                let _ = s
                    .lookup(k)
                    .map(|e| (e.url().len(), e.expires_at_ms(), e.options()));
            }
        }
        let _ = s.legacy_may_contain(b"old-code");
    }
    if let Ok(text) = std::str::from_utf8(data) {
        for line in text.lines() {
            let _ = lasthop_snapshot::parse_line(line);
        }
    }
}

/// Click events (binary) and their archive lines: what decodes re-encodes to the same bytes,
/// and reads back from its archive line.
pub fn click_event(data: &[u8]) {
    use lasthop_core::click::{ArchivedClick, ClickEvent};
    let mut rest = data;
    while let Ok((e, n)) = ClickEvent::decode(rest) {
        assert!(n > 0 && n <= rest.len());
        let mut again = Vec::new();
        e.encode(&mut again);
        assert_eq!(again, rest[..n], "an event re-encodes to its bytes");
        let line = serde_json::to_vec(&e.archived()).expect("serialises");
        let back: ArchivedClick = serde_json::from_slice(&line).expect("reads back");
        assert_eq!(back.event().expect("checks"), e);
        rest = &rest[n..];
    }
    if let Ok(a) = serde_json::from_slice::<ArchivedClick>(data) {
        let _ = a.event();
    }
}

/// Spool segments: the header, frames (checksummed) and the events in a frame's payload.
pub fn spool(data: &[u8]) {
    use lasthop_core::click::spool::{events, next_frame, segment_body, Next};
    let mut rest = segment_body(data).unwrap_or(data);
    while let Ok(Next::Frame { payload, len, .. }) = next_frame(rest) {
        assert!(len > 0 && len <= rest.len());
        for e in events(payload) {
            if e.is_err() {
                break;
            }
        }
        rest = &rest[len..];
    }
    for e in events(data) {
        if e.is_err() {
            break;
        }
    }
    if let Ok(name) = std::str::from_utf8(data) {
        let _ = lasthop_core::click::spool::SegmentName::parse(name);
        let _ = lasthop_core::click::spool::parse_stem(name);
    }
}

/// Reputation list files (hosts files, URL lists, CSV exports), indexed and asked.
pub fn reputation_list(data: &[u8]) {
    let parsed = lasthop_trust::parse_list(data);
    let index = lasthop_trust::ReputationIndex::build([("fuzz", &parsed.entries[..])]);
    for url in [
        "https://example.com/",
        "http://login.paypa1.example/x",
        "https://a.b.c.d.example.org/path?q",
    ] {
        if let Some(d) = lasthop_trust::Destination::parse(url) {
            let _ = index.check(&d);
        }
    }
}

/// A config file (TOML) under a small program's flags: read or refused, never a panic.
pub fn config_toml(data: &[u8]) {
    use clap::{Arg, ArgAction, Command};
    let cmd = Command::new("prog")
        .arg(
            Arg::new("listen")
                .long("listen")
                .default_value("127.0.0.1:8080"),
        )
        .arg(
            Arg::new("cpus")
                .long("cpus")
                .value_delimiter(',')
                .action(ArgAction::Append)
                .value_parser(clap::value_parser!(u32)),
        )
        .arg(
            Arg::new("fixed-response")
                .long("fixed-response")
                .action(ArgAction::SetTrue),
        )
        .arg(
            Arg::new("idle-timeout")
                .long("idle-timeout")
                .default_value("60")
                .value_parser(clap::value_parser!(u64)),
        )
        .arg(
            Arg::new("config")
                .long("config")
                .value_parser(clap::value_parser!(std::path::PathBuf)),
        );
    static PATH: OnceLock<std::path::PathBuf> = OnceLock::new();
    let path = PATH.get_or_init(|| {
        std::env::temp_dir().join(format!("lasthop-fuzz-config-{}.toml", std::process::id()))
    });
    let Ok(mut f) = std::fs::File::create(path) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    let argv: Vec<OsString> = vec!["prog".into(), "--config".into(), path.into()];
    let _ = lasthop_cli::matches(cmd, argv);
}

/// Destination URLs: normalised (what is accepted is servable and normalises to itself) and
/// matched as the trust rules match them.
pub fn url(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let policy = lasthop_core::UrlPolicy::default();
    if let Ok(n) = lasthop_core::normalize_destination(text, &policy) {
        assert!(is_servable(n.as_bytes()), "accepted but unservable: {n:?}");
        assert_eq!(
            lasthop_core::normalize_destination(&n, &policy).as_deref(),
            Ok(n.as_str()),
            "normalising is idempotent"
        );
    }
    let _ = lasthop_trust::Destination::parse(text);
    let _ = lasthop_trust::CanonicalHost::parse(text);
}

/// Custom aliases: the rules accept or refuse, and an accepted alias is servable as a path.
pub fn alias(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if lasthop_core::validate_alias(text).is_ok() {
        assert!(lasthop_core::visible_ascii(text.as_bytes()));
    }
    let _ = lasthop_core::alias::reserved_word(text);
}

/// What one region reads from another: replicated changes, stored links, forwarded creates
/// and their answers (JSON), each checked as the receiver checks it.
pub fn peer_wire(data: &[u8]) {
    let _ = serde_json::from_slice::<lasthop_store::OwnChange>(data);
    let _ = serde_json::from_slice::<lasthop_store::StoredLink>(data);
    let _ = serde_json::from_slice::<lasthop_control::peers::CreateAnswer>(data);
    if let Ok(f) = serde_json::from_slice::<lasthop_control::peers::ForwardedCreate>(data) {
        let _ = f.request();
    }
}

/// The control plane's answer to an engine's read-through (`EdgeLink` JSON), rendered as the
/// engine renders it: whatever the origin says, the response is well framed and its
/// `Location` servable.
pub fn origin_reply(data: &[u8]) {
    use lasthop_edge::origin_cache::OriginAnswer;
    let Ok(w) = serde_json::from_slice::<lasthop_core::feed::EdgeLink>(data) else {
        return;
    };
    let reply = OriginAnswer::Found {
        url: w.long_url.into_bytes().into_boxed_slice(),
        expires_at_ms: w.expires_at_ms,
        status: w.status,
        warn: w.warn,
        options: w.options,
    };
    let t = tables();
    let req_bytes = b"GET /zzzzzzz HTTP/1.1\r\nHost: lh.example\r\n\r\n";
    let Parse::Complete { req, .. } = parse(req_bytes, &Limits::default()) else {
        unreachable!("a fixed request parses");
    };
    for preview in [false, true] {
        let (answer, _) =
            answer_from_origin(b"zzzzzzz", preview, t, b"lh.example", reply.link(), 1_000);
        let mut out = Vec::new();
        render_for(&answer, &req, &mut out);
        check_response(&out, false);
    }
}

/// Frames off an AF_XDP socket: parsed, and for each accepted one the reset written back parses
/// as a reset to the sender; then through the userspace TCP.
pub fn tcp_segment(data: &[u8]) {
    use lasthop_edge::wire::{parse as parse_frame, write_reset, MAX_RESET};
    if let Ok(seg) = parse_frame(data) {
        let mut out = [0u8; MAX_RESET];
        if let Some(n) = write_reset(&seg, &mut out) {
            let reset = parse_frame(&out[..n]).expect("a reset we wrote parses");
            assert_eq!((reset.src, reset.dst), (seg.dst, seg.src));
            assert_eq!(
                (reset.tcp.src_port, reset.tcp.dst_port),
                (seg.tcp.dst_port, seg.tcp.src_port)
            );
        }
    }
    let _ = lasthop_edge::wire::dst_port(data);
    static TCP: OnceLock<std::sync::Mutex<lasthop_edge::tcp::Tcp>> = OnceLock::new();
    let tcp = TCP.get_or_init(|| {
        std::sync::Mutex::new(lasthop_edge::tcp::Tcp::new(
            lasthop_edge::tcp::TcpConfig::new(
                std::net::IpAddr::V4(std::net::Ipv4Addr::new(198, 18, 0, 1)),
                80,
                [2, 0, 0, 0, 0, 1],
                [7u8; 16],
            ),
        ))
    });
    let mut tcp = tcp.lock().unwrap_or_else(|e| e.into_inner());
    let _ = tcp.receive(data, 1_000, &mut |_| {}, &mut |_| {});
}

/// UDP payloads on the QUIC listener: the long-header walk beside quinn-proto.
pub fn quic_packets(data: &[u8]) {
    let p = lasthop_edge::quic::packets(data);
    assert!(p.zero_rtt <= data.len());
}

/// Objects of the click archive (Parquet): read or refused whole, without a panic; every row
/// handed over is a valid event.
pub fn archive_object(data: &[u8]) {
    // Unguarded: a panic the checks before decoding let through is a finding, not a contained
    // error (`read` adds a `catch_unwind` as the last guard).
    let _ = lasthop_clicks::columnar::read_unguarded(bytes::Bytes::copy_from_slice(data), |row| {
        assert!(lasthop_core::click::ClickEvent::decode(row).is_ok());
    });
}

/// Other shorteners' exports (Bitly, YOURLS, Kutt, Shlink, Dub, CSV), every format on the
/// same bytes.
pub fn import(data: &[u8]) {
    for format in lasthop_control::import::Format::ALL {
        let _ = lasthop_control::import::read(format, data, |_| Ok(()));
    }
}
