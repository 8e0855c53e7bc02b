//! The HTTP/3 layer driven by a test client: frames written by hand, field sections with
//! QPACK literals (RFC 9204's wire forms; aioquic's pylsqpack is the independent encoder in
//! the engine's tests), answers decoded back.

use super::frame::{self, kind, put_frame, put_varint};
use super::*;
use crate::answer::tests::NOW;
use crate::session::tests::Core;
use crate::session::Proto;

#[derive(Default)]
struct Fx {
    origin: Vec<String>,
    clicks: Vec<(String, How)>,
    answered: Vec<u16>,
}

impl Effects for Fx {
    fn effect(&mut self, e: Effect<'_>) {
        match e {
            Effect::NeedOrigin { code, .. } => {
                self.origin.push(String::from_utf8_lossy(code).into())
            }
            Effect::Click { code, how, .. } => self
                .clicks
                .push((String::from_utf8_lossy(code).into(), how)),
            Effect::Answered { status, .. } => self.answered.push(status),
            _ => {}
        }
    }
}

const HOW: How = How {
    early: false,
    https: true,
    proto: Proto::H3,
};

/// A literal field line with a literal name (never Huffman): `001N H len(3)`.
fn literal(out: &mut Vec<u8>, name: &str, value: &str) {
    crate::h2::hpack::integer(out, 0x20, 3, name.len());
    out.extend_from_slice(name.as_bytes());
    crate::h2::hpack::integer(out, 0, 7, value.len());
    out.extend_from_slice(value.as_bytes());
}

fn section(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut b = vec![0, 0];
    for (n, v) in fields {
        literal(&mut b, n, v);
    }
    b
}

fn headers_frame(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    put_frame(&mut out, kind::HEADERS, &section(fields));
    out
}

fn get(path: &str) -> Vec<u8> {
    headers_frame(&[
        (":method", "GET"),
        (":scheme", "https"),
        (":authority", "lh.example"),
        (":path", path),
        ("user-agent", "h3-test"),
    ])
}

/// An answer as read back: status, fields, body.
type Answered = (u16, Vec<(String, String)>, Vec<u8>);

/// The answer on a stream.
fn answer(data: &[u8]) -> Answered {
    let h = frame::header(data).unwrap();
    assert_eq!(h.kind, kind::HEADERS);
    let block = &data[h.header_len..h.header_len + h.len as usize];
    let mut fields = Vec::new();
    qpack::decode(block, |n, v| {
        fields.push((
            String::from_utf8_lossy(n).into_owned(),
            String::from_utf8_lossy(v).into_owned(),
        ))
    })
    .unwrap();
    let rest = &data[h.header_len + h.len as usize..];
    let body = match frame::header(rest) {
        Some(d) => {
            assert_eq!(d.kind, kind::DATA);
            rest[d.header_len..].to_vec()
        }
        None => Vec::new(),
    };
    let status = fields[0].1.parse().unwrap();
    assert_eq!(fields[0].0, ":status");
    (status, fields[1..].to_vec(), body)
}

fn only_answer(acts: &[Act]) -> (u64, Answered) {
    let answers: Vec<_> = acts
        .iter()
        .filter_map(|a| match a {
            Act::Answer { stream, data } => Some((*stream, answer(data))),
            _ => None,
        })
        .collect();
    assert_eq!(answers.len(), 1, "{acts:?}");
    answers.into_iter().next().unwrap()
}

fn client_control() -> Vec<u8> {
    let mut b = Vec::new();
    put_varint(&mut b, frame::stream::CONTROL);
    let mut s = Vec::new();
    put_varint(&mut s, 0x06);
    put_varint(&mut s, 8192);
    put_frame(&mut b, kind::SETTINGS, &s);
    b
}

#[test]
fn a_get_is_answered_with_the_redirect_and_a_click() {
    let core = Core::new(false);
    let (mut c, control) = H3Conn::new(H3Limits::default(), Some("lh.example"));
    // Our control stream: its type, then SETTINGS with the section limit and a GREASE id.
    assert_eq!(control[0], 0x00);
    assert_eq!(frame::header(&control[1..]).unwrap().kind, kind::SETTINGS);
    let mut fx = Fx::default();
    let mut acts = Vec::new();
    c.on_uni(2, &client_control(), false, &mut acts);
    assert_eq!(
        c.peer_settings().unwrap().max_field_section_size,
        Some(8192)
    );
    let code = core.f.code(0);
    let req = get(&format!("/{code}"));
    // In two pieces, the stream's end with the second.
    c.on_request(0, &req[..5], false, HOW, &core.env(), &mut fx, &mut acts);
    assert!(acts.is_empty(), "{acts:?}");
    c.on_request(0, &req[5..], true, HOW, &core.env(), &mut fx, &mut acts);
    let (stream, (status, fields, body)) = only_answer(&acts);
    assert_eq!((stream, status), (0, 302));
    assert!(fields.contains(&("location".into(), "https://example.com/zero".into())));
    assert!(fields.iter().any(|(n, _)| n == "strict-transport-security"));
    assert!(!fields.iter().any(|(n, _)| n == "connection"));
    assert!(body.is_empty());
    assert_eq!(fx.clicks.len(), 1);
    assert_eq!(fx.clicks[0].1.proto, Proto::H3);
    assert_eq!(c.open_requests(), 0);
}

#[test]
fn head_404_410_preview_and_the_early_data_rule() {
    let core = Core::new(false);
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut fx = Fx::default();
    let cases = [
        ("HEAD", format!("/{}", core.f.code(0)), 302),
        ("GET", format!("/{}", core.f.code(20)), 404),
        ("GET", format!("/{}", core.f.code(3)), 410),
        ("GET", format!("/{}+", core.f.code(0)), 200),
    ];
    for (i, (method, path, want)) in cases.iter().enumerate() {
        let mut acts = Vec::new();
        let req = headers_frame(&[
            (":method", method),
            (":scheme", "https"),
            (":authority", "lh.example"),
            (":path", path),
        ]);
        let id = i as u64 * 4;
        c.on_request(id, &req, true, HOW, &core.env(), &mut fx, &mut acts);
        let (_, (status, _, body)) = only_answer(&acts);
        assert_eq!(status, *want, "{method} {path}");
        if *method == "HEAD" || status == 302 {
            assert!(body.is_empty());
        }
        if status == 200 {
            assert!(String::from_utf8_lossy(&body).contains("example.com/zero"));
        }
    }
    // In 0-RTT early data: a GET is answered, a POST gets 425.
    let early = How { early: true, ..HOW };
    let mut acts = Vec::new();
    let post = headers_frame(&[
        (":method", "POST"),
        (":scheme", "https"),
        (":authority", "lh.example"),
        (":path", &format!("/{}", core.f.code(0))),
    ]);
    c.on_request(16, &post, false, early, &core.env(), &mut fx, &mut acts);
    let (_, (status, _, _)) = only_answer(&acts);
    assert_eq!(status, 425);
    assert!(acts.contains(&Act::StopSending {
        stream: 16,
        code: code::NO_ERROR
    }));
    let mut acts = Vec::new();
    c.on_request(
        20,
        &get(&format!("/{}", core.f.code(0))),
        true,
        early,
        &core.env(),
        &mut fx,
        &mut acts,
    );
    assert_eq!(only_answer(&acts).1 .0, 302);
    assert!(fx.clicks.last().unwrap().1.early, "the click says early");
}

#[test]
fn read_through_parks_until_the_origin_replies() {
    let core = Core::new(true);
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut fx = Fx::default();
    let mut acts = Vec::new();
    let unknown = core.f.code(20);
    c.on_request(
        0,
        &get(&format!("/{unknown}")),
        true,
        HOW,
        &core.env(),
        &mut fx,
        &mut acts,
    );
    assert!(acts.is_empty() && c.waiting_origin());
    assert_eq!(fx.origin, [unknown.to_string()]);
    let found = OriginAnswer::Found {
        url: (*b"https://example.com/twenty").into(),
        expires_at_ms: None,
        status: lasthop_core::LinkStatus::Active,
        warn: false,
        options: Default::default(),
    };
    c.on_origin(unknown.as_bytes(), &found, &core.env(), &mut fx, &mut acts);
    let (_, (status, fields, _)) = only_answer(&acts);
    assert_eq!(status, 302);
    assert!(fields.contains(&("location".into(), "https://example.com/twenty".into())));
    assert!(!c.waiting_origin());
}

#[test]
fn malformed_requests_and_protocol_errors() {
    let core = Core::new(false);
    let env = core.env();
    let mut fx = Fx::default();
    // A request without :scheme: the stream is reset with H3_MESSAGE_ERROR.
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    let bad = headers_frame(&[(":method", "GET"), (":path", "/x")]);
    c.on_request(0, &bad, true, HOW, &env, &mut fx, &mut acts);
    assert_eq!(
        acts,
        [Act::Reset {
            stream: 0,
            code: code::MESSAGE_ERROR
        }]
    );
    // A dynamic-table reference: the connection closes.
    let mut acts = Vec::new();
    let mut dynamic = Vec::new();
    put_frame(&mut dynamic, kind::HEADERS, &[0x02, 0x00, 0x80]);
    c.on_request(4, &dynamic, true, HOW, &env, &mut fx, &mut acts);
    assert!(
        matches!(
            acts[..],
            [Act::Close {
                code: code::QPACK_DECOMPRESSION_FAILED,
                ..
            }]
        ),
        "{acts:?}"
    );
    // DATA before HEADERS; SETTINGS on a request stream; HTTP/2's PRIORITY type (0x2).
    for first in [kind::DATA, kind::SETTINGS, 0x2] {
        let (mut c, _) = H3Conn::new(H3Limits::default(), None);
        let mut acts = Vec::new();
        let mut b = Vec::new();
        put_frame(&mut b, first, &[0]);
        c.on_request(0, &b, false, HOW, &env, &mut fx, &mut acts);
        assert!(
            matches!(
                acts[..],
                [Act::Close {
                    code: code::FRAME_UNEXPECTED,
                    ..
                }]
            ),
            "{first}: {acts:?}"
        );
    }
    // A stream that ends before its HEADERS.
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    c.on_request(0, &get("/x")[..3], true, HOW, &env, &mut fx, &mut acts);
    assert_eq!(
        acts,
        [Act::Reset {
            stream: 0,
            code: code::REQUEST_INCOMPLETE
        }]
    );
    // A GET with a body: 400.
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    let mut b = get(&format!("/{}", core.f.code(0)));
    put_frame(&mut b, kind::DATA, b"body");
    c.on_request(0, &b, true, HOW, &env, &mut fx, &mut acts);
    assert_eq!(only_answer(&acts).1 .0, 400);
}

#[test]
fn grease_is_skipped_and_a_large_section_gets_431() {
    let core = Core::new(false);
    let env = core.env();
    let mut fx = Fx::default();
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    // A reserved frame type (0x21) before HEADERS, and a GREASE unidirectional stream.
    let mut b = Vec::new();
    put_frame(&mut b, 0x1f * 3 + 0x21, b"grease");
    b.extend(get(&format!("/{}", core.f.code(0))));
    c.on_request(0, &b, true, HOW, &env, &mut fx, &mut acts);
    assert_eq!(only_answer(&acts).1 .0, 302);
    let mut acts = Vec::new();
    let mut uni = Vec::new();
    put_varint(&mut uni, 0x1f * 5 + 0x21);
    uni.extend_from_slice(b"whatever");
    c.on_uni(6, &uni, false, &mut acts);
    assert_eq!(
        acts,
        [Act::StopSending {
            stream: 6,
            code: code::STREAM_CREATION_ERROR
        }]
    );
    // Over the limit: 431 and the rest refused.
    let limits = H3Limits {
        max_field_section_size: 256,
        ..H3Limits::default()
    };
    let (mut c, _) = H3Conn::new(limits, None);
    let mut acts = Vec::new();
    let long = "x".repeat(400);
    let req = headers_frame(&[
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/a"),
        ("cookie", &long),
    ]);
    c.on_request(0, &req, false, HOW, &env, &mut fx, &mut acts);
    assert_eq!(only_answer(&acts).1 .0, 431);
}

#[test]
fn control_stream_rules() {
    let mut acts = Vec::new();
    // The first frame must be SETTINGS.
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut b = Vec::new();
    put_varint(&mut b, 0);
    frame::goaway(0, &mut b);
    c.on_uni(2, &b, false, &mut acts);
    assert!(
        matches!(
            acts[..],
            [Act::Close {
                code: code::MISSING_SETTINGS,
                ..
            }]
        ),
        "{acts:?}"
    );
    // Closing it, or a second control stream, ends the connection.
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    c.on_uni(2, &client_control(), true, &mut acts);
    assert!(
        matches!(
            acts[..],
            [Act::Close {
                code: code::CLOSED_CRITICAL_STREAM,
                ..
            }]
        ),
        "{acts:?}"
    );
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    c.on_uni(2, &client_control(), false, &mut acts);
    c.on_uni(6, &client_control(), false, &mut acts);
    assert!(
        matches!(
            acts[..],
            [Act::Close {
                code: code::STREAM_CREATION_ERROR,
                ..
            }]
        ),
        "{acts:?}"
    );
}

#[test]
fn drain_says_goaway_and_refuses_later_streams() {
    let core = Core::new(false);
    let env = core.env();
    let mut fx = Fx::default();
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    let req = get(&format!("/{}", core.f.code(0)));
    c.on_request(0, &req[..4], false, HOW, &env, &mut fx, &mut acts);
    c.drain(&mut acts);
    let mut want = Vec::new();
    frame::goaway(4, &mut want);
    assert_eq!(acts, [Act::Control(want)]);
    assert!(!c.done(), "stream 0 is still open");
    let mut acts = Vec::new();
    c.on_request(4, &req, true, HOW, &env, &mut fx, &mut acts);
    assert_eq!(
        acts,
        [Act::Reset {
            stream: 4,
            code: code::REQUEST_REJECTED
        }]
    );
    let mut acts = Vec::new();
    c.on_request(0, &req[4..], true, HOW, &env, &mut fx, &mut acts);
    assert_eq!(only_answer(&acts).1 .0, 302);
    assert!(c.done());
    let _ = NOW;
}

#[test]
fn streams_arriving_out_of_order_are_each_answered() {
    let core = Core::new(false);
    let env = core.env();
    let mut fx = Fx::default();
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    // Stream 8's packet overtook those of streams 0 and 4: all three are new requests.
    for id in [8, 0, 4] {
        let mut acts = Vec::new();
        let req = get(&format!("/{}", core.f.code(0)));
        c.on_request(id, &req, true, HOW, &env, &mut fx, &mut acts);
        let (stream, (status, _, _)) = only_answer(&acts);
        assert_eq!((stream, status), (id, 302));
    }
    assert_eq!(fx.clicks.len(), 3);
    // GOAWAY names the stream after the highest one seen.
    let mut acts = Vec::new();
    c.drain(&mut acts);
    let mut want = Vec::new();
    frame::goaway(12, &mut want);
    assert_eq!(acts, [Act::Control(want)]);
    assert!(c.done());
}

#[test]
fn a_reset_stream_is_forgotten_and_a_reset_control_stream_ends_the_connection() {
    let core = Core::new(true);
    let env = core.env();
    let mut fx = Fx::default();
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    c.on_uni(2, &client_control(), false, &mut acts);
    // One request half received, one parked on the origin: both reset by the client.
    let req = get(&format!("/{}", core.f.code(0)));
    c.on_request(0, &req[..5], false, HOW, &env, &mut fx, &mut acts);
    c.on_request(
        4,
        &get(&format!("/{}", core.f.code(20))),
        true,
        HOW,
        &env,
        &mut fx,
        &mut acts,
    );
    assert!(acts.is_empty() && c.waiting_origin(), "{acts:?}");
    assert_eq!(c.open_requests(), 2);
    c.on_reset(0, &mut acts);
    c.on_reset(4, &mut acts);
    assert_eq!(c.open_requests(), 0);
    assert!(!c.waiting_origin());
    c.drain(&mut acts);
    assert!(c.done(), "nothing left to answer once drained");
    // The origin's late reply answers nothing.
    let mut acts = Vec::new();
    let gone = OriginAnswer::Found {
        url: (*b"https://example.com/x").into(),
        expires_at_ms: None,
        status: lasthop_core::LinkStatus::Active,
        warn: false,
        options: Default::default(),
    };
    c.on_origin(core.f.code(20).as_bytes(), &gone, &env, &mut fx, &mut acts);
    assert!(
        acts.iter().all(|a| !matches!(a, Act::Answer { .. })),
        "{acts:?}"
    );
    // The control stream is critical.
    c.on_reset(2, &mut acts);
    assert_eq!(
        acts,
        [Act::Close {
            code: code::CLOSED_CRITICAL_STREAM,
            reason: "critical stream reset"
        }]
    );
}

#[test]
fn a_get_with_a_body_is_answered_400_and_forgotten() {
    let core = Core::new(false);
    let env = core.env();
    let mut fx = Fx::default();
    let (mut c, _) = H3Conn::new(H3Limits::default(), None);
    let mut acts = Vec::new();
    let mut req = get(&format!("/{}", core.f.code(0)));
    put_frame(&mut req, kind::DATA, b"body");
    c.on_request(0, &req, false, HOW, &env, &mut fx, &mut acts);
    let (_, (status, _, _)) = only_answer(&acts);
    assert_eq!(status, 400);
    assert!(acts.contains(&Act::StopSending {
        stream: 0,
        code: code::NO_ERROR
    }));
    assert_eq!(
        c.open_requests(),
        0,
        "nothing kept for a stream that was refused"
    );
    // An empty DATA frame is no body.
    let mut acts = Vec::new();
    let mut req = get(&format!("/{}", core.f.code(2)));
    put_frame(&mut req, kind::DATA, b"");
    c.on_request(4, &req, true, HOW, &env, &mut fx, &mut acts);
    assert_eq!(only_answer(&acts).1 .0, 302);
}

proptest::proptest! {
    #[test]
    fn garbage_on_any_stream_never_panics(
        chunks in proptest::collection::vec(proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40), 1..8),
        uni in proptest::prelude::any::<bool>(),
    ) {
        let core = Core::new(true);
        let env = core.env();
        let mut fx = Fx::default();
        let (mut c, _) = H3Conn::new(H3Limits::default(), None);
        let mut acts = Vec::new();
        let n = chunks.len();
        for (i, chunk) in chunks.iter().enumerate() {
            if uni {
                c.on_uni(2, chunk, i + 1 == n, &mut acts);
            } else {
                c.on_request(0, chunk, i + 1 == n, HOW, &env, &mut fx, &mut acts);
            }
        }
        for a in &acts {
            if let Act::Answer { data, .. } = a {
                let _ = answer(data);
            }
        }
    }
}
