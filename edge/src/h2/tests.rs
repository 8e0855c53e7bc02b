//! The HTTP/2 connection driven by a test client: frames written by hand, header blocks by the
//! `hpack` crate (an independent codec), answers read back with it.

use super::frame::{self, flag, kind, setting, ErrorCode, Header};
use super::*;
use crate::answer::tests::NOW;
use crate::session::tests::Core;
use crate::session::{Proto, Session};

#[derive(Default)]
struct Fx {
    origin: Vec<String>,
    clicks: Vec<(String, Proto)>,
    events: Vec<Event>,
}

impl Effects for Fx {
    fn effect(&mut self, e: Effect<'_>) {
        match e {
            Effect::NeedOrigin { code, .. } => {
                self.origin.push(String::from_utf8_lossy(code).into())
            }
            Effect::Click { code, how, .. } => self
                .clicks
                .push((String::from_utf8_lossy(code).into(), how.proto)),
            Effect::H2(ev) => self.events.push(ev),
            _ => {}
        }
    }
}

impl Fx {
    fn refused(&self) -> Vec<Flood> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Refused(f) => Some(*f),
                _ => None,
            })
            .collect()
    }
}

/// The session tests' core, with a certificate covering lh.example and its subdomains.
fn core_with_cert(has_origin: bool) -> Core {
    Core {
        coverage: Some(&COVERS),
        ..Core::new(has_origin)
    }
}

/// A certificate for lh.example and *.lh.example.
#[derive(Debug)]
struct Covers;

impl crate::session::Coverage for Covers {
    fn covers(&self, host: &[u8]) -> bool {
        host == b"lh.example" || host.ends_with(b".lh.example")
    }
}

static COVERS: Covers = Covers;

/// A client's side: frames to send, frames received.
struct Client {
    enc: ::hpack::Encoder<'static>,
    dec: ::hpack::Decoder<'static>,
}

/// One frame as received.
#[derive(Debug, Clone)]
struct Got {
    h: Header,
    payload: Vec<u8>,
}

impl Client {
    fn new() -> Client {
        Client {
            enc: ::hpack::Encoder::new(),
            dec: ::hpack::Decoder::new(),
        }
    }

    fn preface(settings: &[(u16, u32)]) -> Vec<u8> {
        let mut b = frame::PREFACE.to_vec();
        frame::write_settings(&mut b, settings);
        b
    }

    fn block(&mut self, fields: &[(&str, &str)]) -> Vec<u8> {
        self.enc
            .encode(fields.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())))
    }

    fn get(&mut self, stream: u32, path: &str) -> Vec<u8> {
        let block = self.block(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", "lh.example"),
            (":path", path),
            ("user-agent", "h2-test"),
        ]);
        let mut b = Vec::new();
        frame::write_headers(&mut b, stream, &block, true, 16_384);
        b
    }

    /// Splits `out` into frames.
    fn frames(out: &[u8]) -> Vec<Got> {
        let mut at = 0;
        let mut v = Vec::new();
        while let Some(h) = Header::read(&out[at..]) {
            let end = at + 9 + h.len as usize;
            v.push(Got {
                h,
                payload: out[at + 9..end].to_vec(),
            });
            at = end;
        }
        assert_eq!(at, out.len(), "whole frames only");
        v
    }

    /// The response fields on each HEADERS frame of `out`, by stream.
    fn answers(&mut self, out: &[u8]) -> Vec<(u32, Vec<(String, String)>)> {
        Self::frames(out)
            .into_iter()
            .filter(|g| g.h.kind == kind::HEADERS)
            .map(|g| {
                let fields = self
                    .dec
                    .decode(&g.payload)
                    .unwrap()
                    .into_iter()
                    .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
                    .collect();
                (g.h.stream, fields)
            })
            .collect()
    }
}

fn status(fields: &[(String, String)]) -> &str {
    &fields.iter().find(|(n, _)| n == ":status").unwrap().1
}

fn field<'a>(fields: &'a [(String, String)], name: &str) -> Option<&'a str> {
    fields
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

fn goaway(out: &[u8]) -> Option<(u32, ErrorCode)> {
    Client::frames(out)
        .into_iter()
        .find(|g| g.h.kind == kind::GOAWAY)
        .map(|g| {
            let p = &g.payload;
            (
                u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
                ErrorCode::from_u32(u32::from_be_bytes([p[4], p[5], p[6], p[7]])),
            )
        })
}

fn resets(out: &[u8]) -> Vec<(u32, ErrorCode)> {
    Client::frames(out)
        .into_iter()
        .filter(|g| g.h.kind == kind::RST_STREAM)
        .map(|g| {
            let p = &g.payload;
            (
                g.h.stream,
                ErrorCode::from_u32(u32::from_be_bytes([p[0], p[1], p[2], p[3]])),
            )
        })
        .collect()
}

const HOW: How = How {
    early: false,
    https: true,
    proto: Proto::H2,
};

/// A connection past its preface, with its SETTINGS answered.
fn open(core: &Core, fx: &mut Fx, settings: &[(u16, u32)]) -> (H2Conn, Vec<u8>) {
    let mut out = Vec::new();
    let mut c = H2Conn::new(core.limits.h2, core.now_ms, &mut out, fx);
    c.on_input(&Client::preface(settings), HOW, &core.env(), fx, &mut out);
    let frames = Client::frames(&out);
    assert_eq!(frames[0].h.kind, kind::SETTINGS);
    assert!(frames
        .iter()
        .any(|g| g.h.kind == kind::SETTINGS && g.h.has(flag::ACK)));
    out.clear();
    (c, out)
}

#[test]
fn a_redirect_carries_the_same_fields_as_over_http1() {
    let core = core_with_cert(false);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let code = core.f.code(0);
    c.on_input(
        &cl.get(1, &format!("/{code}")),
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    let frames = Client::frames(&out);
    assert_eq!(frames.len(), 1);
    assert!(frames[0].h.has(flag::END_STREAM | flag::END_HEADERS));
    let answers = cl.answers(&out);
    let (id, fields) = &answers[0];
    assert_eq!(*id, 1);
    assert_eq!(status(fields), "302");
    assert_eq!(field(fields, "location"), Some("https://example.com/zero"));
    assert_eq!(field(fields, "cache-control"), Some("private, max-age=300"));
    assert_eq!(field(fields, "content-length"), Some("0"));
    assert_eq!(field(fields, "date"), Some("Tue, 14 Nov 2023 22:13:20 GMT"));
    assert_eq!(
        field(fields, "strict-transport-security"),
        Some("max-age=60")
    );
    assert!(field(fields, "connection").is_none());
    assert_eq!(fx.clicks, [(code, Proto::H2)]);
    assert!(c.open_streams() == 0 && !c.done());
}

#[test]
fn streams_are_multiplexed_and_a_parked_one_holds_up_no_other() {
    let core = core_with_cert(true);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let unknown = core.f.code(20);
    let mut input = cl.get(1, &format!("/{unknown}"));
    input.extend(cl.get(3, &format!("/{}", core.f.code(0))));
    input.extend(cl.get(5, &format!("/{}", core.f.code(3))));
    input.extend(cl.get(7, "/nothing-here-at-all"));
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    // The alias is not in the tables either: it waits for the origin too.
    assert_eq!(
        fx.origin,
        [unknown.clone(), "nothing-here-at-all".to_string()]
    );
    let got: Vec<(u32, String)> = cl
        .answers(&out)
        .iter()
        .map(|(id, f)| (*id, status(f).to_string()))
        .collect();
    assert_eq!(got, [(3, "302".into()), (5, "410".into())]);
    assert!(c.waiting_origin());
    out.clear();
    let found = OriginAnswer::Found {
        url: (*b"https://example.com/twenty").into(),
        expires_at_ms: None,
        status: lasthop_core::LinkStatus::Active,
        warn: false,
        options: Default::default(),
    };
    c.on_origin(
        unknown.as_bytes(),
        &found,
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    let answers = cl.answers(&out);
    assert_eq!(answers[0].0, 1);
    assert_eq!(
        field(&answers[0].1, "location"),
        Some("https://example.com/twenty")
    );
    assert!(c.waiting_origin(), "stream 7 still waits");
    out.clear();
    c.on_origin(
        b"nothing-here-at-all",
        &OriginAnswer::NotFound,
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    assert_eq!(cl.answers(&out)[0].0, 7);
    assert!(!c.waiting_origin());
}

#[test]
fn the_7th_stream_waits_in_the_origin_and_a_reset_cancels_its_waiter() {
    let core = core_with_cert(true);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let unknown = core.f.code(21);
    c.on_input(
        &cl.get(1, &format!("/{unknown}")),
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    assert!(c.waiting_origin());
    let mut rst = Vec::new();
    frame::write_rst(&mut rst, 1, ErrorCode::Cancel);
    c.on_input(&rst, HOW, &core.env(), &mut fx, &mut out);
    assert!(!c.waiting_origin());
    c.on_origin(
        unknown.as_bytes(),
        &OriginAnswer::NotFound,
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    assert!(
        cl.answers(&out).is_empty(),
        "nothing answered on a reset stream"
    );
}

#[test]
fn rapid_reset_ends_in_enhance_your_calm() {
    let core = core_with_cert(true);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let mut input = Vec::new();
    for i in 0..=core.limits.h2.max_client_resets {
        let id = 2 * i + 1;
        input.extend(cl.get(id, &format!("/{}", core.f.code(30 + u64::from(i)))));
        frame::write_rst(&mut input, id, ErrorCode::Cancel);
    }
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert_eq!(goaway(&out).map(|g| g.1), Some(ErrorCode::EnhanceYourCalm));
    assert_eq!(fx.refused(), [Flood::ClientResets]);
    assert!(c.failed() && !c.waiting_origin());
    // The same count spread over more than ten seconds is fine.
    let mut core = core_with_cert(true);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    for i in 0..2 * core.limits.h2.max_client_resets {
        let id = 2 * i + 1;
        let mut input = cl.get(id, "/spring-sale");
        frame::write_rst(&mut input, id, ErrorCode::Cancel);
        c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
        core.now_ms += 100;
    }
    assert_eq!(goaway(&out), None);
}

#[test]
fn resets_we_send_are_bounded_too() {
    let mut core = core_with_cert(false);
    core.limits.h2.max_local_resets = 10;
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let mut input = Vec::new();
    for i in 0..11u32 {
        // Malformed: no :path. Each is a stream error we send.
        let block = cl.block(&[(":method", "GET"), (":scheme", "https")]);
        frame::write_headers(&mut input, 2 * i + 1, &block, true, 16_384);
    }
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert_eq!(resets(&out).len(), 11);
    assert!(resets(&out).iter().all(|r| r.1 == ErrorCode::Protocol));
    assert_eq!(goaway(&out).map(|g| g.1), Some(ErrorCode::EnhanceYourCalm));
    assert_eq!(fx.refused(), [Flood::LocalResets]);
}

#[test]
fn control_frame_floods_are_capped() {
    type Write = fn(&mut Vec<u8>);
    let kinds: [(Flood, Write); 4] = [
        (Flood::Ping, |b| frame::write_header(b, 8, kind::PING, 0, 0)),
        (Flood::Settings, |b| frame::write_settings(b, &[])),
        (Flood::WindowUpdate, |b| frame::write_window_update(b, 0, 1)),
        (Flood::EmptyData, |b| frame::write_data(b, 1, &[], false)),
    ];
    for (flood, write) in kinds {
        let core = core_with_cert(false);
        let mut fx = Fx::default();
        let (mut c, mut out) = open(&core, &mut fx, &[]);
        let mut input = Vec::new();
        if flood == Flood::EmptyData {
            // An open stream to send empty DATA on: a GET whose END_STREAM never comes.
            let mut cl = Client::new();
            let block = cl.block(&[(":method", "GET"), (":scheme", "https"), (":path", "/x")]);
            frame::write_headers(&mut input, 1, &block, false, 16_384);
        }
        for _ in 0..=core.limits.h2.max_control_frames + CONTROL_PER_STREAM {
            write(&mut input);
            if flood == Flood::Ping {
                input.extend_from_slice(&[0; 8]);
            }
        }
        c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
        assert_eq!(
            goaway(&out).map(|g| g.1),
            Some(ErrorCode::EnhanceYourCalm),
            "{flood:?}"
        );
        assert_eq!(fx.refused(), [flood]);
        assert!(
            out.len() < 64 * 1024,
            "{flood:?}: {} bytes queued",
            out.len()
        );
    }
}

#[test]
fn a_zero_window_is_honoured_and_waits_no_longer_than_the_timeout() {
    let mut core = core_with_cert(false);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[(setting::INITIAL_WINDOW_SIZE, 0)]);
    let mut cl = Client::new();
    // The preview page has a body.
    c.on_input(
        &cl.get(1, &format!("/{}+", core.f.code(0))),
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    let frames = Client::frames(&out);
    assert_eq!(frames.len(), 1, "headers only");
    assert!(!frames[0].h.has(flag::END_STREAM));
    out.clear();
    // More input changes nothing, and nothing spins.
    let mut ping = Vec::new();
    frame::write_header(&mut ping, 8, kind::PING, 0, 0);
    ping.extend_from_slice(&[1; 8]);
    c.on_input(&ping, HOW, &core.env(), &mut fx, &mut out);
    assert!(Client::frames(&out).iter().all(|g| g.h.kind == kind::PING));
    out.clear();
    // A window of 100 lets 100 bytes out (the connection's own window is 65,535).
    let mut wu = Vec::new();
    frame::write_window_update(&mut wu, 1, 100);
    c.on_input(&wu, HOW, &core.env(), &mut fx, &mut out);
    let data: Vec<Got> = Client::frames(&out);
    assert_eq!(data.len(), 1);
    assert_eq!((data[0].h.kind, data[0].h.len), (kind::DATA, 100));
    assert!(!c.is_expired(core.now_ms + 9_000, 60_000, 10_000));
    core.now_ms += 10_001;
    assert!(c.is_expired(core.now_ms, 60_000, 10_000));
    out.clear();
    c.goodbye(core.now_ms, 60_000, 10_000, &mut out, &mut fx);
    assert_eq!(goaway(&out).map(|g| g.1), Some(ErrorCode::EnhanceYourCalm));
    assert_eq!(fx.refused(), [Flood::ZeroWindow]);
}

#[test]
fn header_blocks_are_bounded_in_bytes_frames_and_time() {
    // In bytes: CONTINUATION frames past the header list size.
    let core = core_with_cert(false);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut input = Vec::new();
    frame::write_header(&mut input, 1, kind::HEADERS, 0, 1);
    input.push(0x82);
    for _ in 0..40 {
        frame::write_header(&mut input, 1000, kind::CONTINUATION, 0, 1);
        input.extend(std::iter::repeat_n(0x82, 1000));
    }
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert_eq!(goaway(&out).map(|g| g.1), Some(ErrorCode::EnhanceYourCalm));
    assert_eq!(fx.refused(), [Flood::Continuation]);
    // In frames: empty CONTINUATIONs.
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut input = Vec::new();
    frame::write_header(&mut input, 0, kind::HEADERS, 0, 1);
    for _ in 0..MAX_CONTINUATIONS {
        frame::write_header(&mut input, 0, kind::CONTINUATION, 0, 1);
    }
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert_eq!(goaway(&out).map(|g| g.1), Some(ErrorCode::EnhanceYourCalm));
    // In time: a block left unfinished.
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut input = Vec::new();
    frame::write_header(&mut input, 1, kind::HEADERS, 0, 1);
    input.push(0x82);
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert!(!c.is_expired(NOW + 10_000, 60_000, 10_000));
    assert!(c.is_expired(NOW + 10_001, 60_000, 10_000));
}

#[test]
fn the_hpack_bomb_gets_431_and_the_connection_goes_on() {
    let core = core_with_cert(false);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let big = "x".repeat(4000);
    let mut block = cl.block(&[
        (":method", "GET"),
        (":scheme", "https"),
        (":path", "/spring-sale"),
    ]);
    block.push(0x40);
    block.push(0x04);
    block.extend_from_slice(b"bomb");
    // A 4,000-byte value: 127 in the prefix, then 3,873 = 0x21 + 30 * 128.
    block.extend_from_slice(&[0x7f, 0xa1, 0x1e]);
    block.extend_from_slice(big.as_bytes());
    block.extend(std::iter::repeat_n(0xbe, 3000));
    // 3000 references of a 4 KiB field: 12 MB decoded, from a block under 16 KiB.
    let mut input = Vec::new();
    frame::write_headers(&mut input, 1, &block, true, 16_384);
    input.extend(cl.get(3, "/spring-sale"));
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    let answers = cl.answers(&out);
    let got: Vec<(u32, &str)> = answers.iter().map(|(id, f)| (*id, status(f))).collect();
    assert_eq!(got, [(1, "431"), (3, "302")]);
    assert_eq!(goaway(&out), None);
}

#[test]
fn protocol_errors_end_the_connection_with_the_rfc_codes() {
    let cases: Vec<(&str, Vec<u8>, ErrorCode)> = vec![
        (
            "DATA on stream 0",
            {
                let mut b = Vec::new();
                frame::write_data(&mut b, 0, b"x", true);
                b
            },
            ErrorCode::Protocol,
        ),
        (
            "even stream",
            {
                let mut b = Vec::new();
                frame::write_headers(&mut b, 2, &[0x82], true, 16_384);
                b
            },
            ErrorCode::Protocol,
        ),
        (
            "oversized frame",
            {
                let mut b = Vec::new();
                frame::write_header(&mut b, 16_385, kind::DATA, 0, 1);
                b.extend(std::iter::repeat_n(0, 16_385));
                b
            },
            ErrorCode::FrameSize,
        ),
        (
            "PING of 7 bytes",
            {
                let mut b = Vec::new();
                frame::write_header(&mut b, 7, kind::PING, 0, 0);
                b.extend([0; 7]);
                b
            },
            ErrorCode::FrameSize,
        ),
        (
            "window overflow",
            {
                let mut b = Vec::new();
                frame::write_window_update(&mut b, 0, 0x7fff_ffff);
                b
            },
            ErrorCode::FlowControl,
        ),
        (
            "CONTINUATION alone",
            {
                let mut b = Vec::new();
                frame::write_header(&mut b, 1, kind::CONTINUATION, flag::END_HEADERS, 1);
                b.push(0x82);
                b
            },
            ErrorCode::Protocol,
        ),
        (
            "bad HPACK",
            {
                let mut b = Vec::new();
                frame::write_headers(&mut b, 1, &[0x80], true, 16_384);
                b
            },
            ErrorCode::Compression,
        ),
        (
            "PUSH_PROMISE",
            {
                let mut b = Vec::new();
                frame::write_header(&mut b, 4, kind::PUSH_PROMISE, 0, 1);
                b.extend([0, 0, 0, 2]);
                b
            },
            ErrorCode::Protocol,
        ),
        (
            "RST_STREAM on an idle stream",
            {
                let mut b = Vec::new();
                frame::write_rst(&mut b, 9, ErrorCode::Cancel);
                b
            },
            ErrorCode::Protocol,
        ),
        (
            "SETTINGS_MAX_FRAME_SIZE too small",
            {
                let mut b = Vec::new();
                frame::write_settings(&mut b, &[(setting::MAX_FRAME_SIZE, 100)]);
                b
            },
            ErrorCode::Protocol,
        ),
    ];
    for (what, input, code) in cases {
        let core = core_with_cert(false);
        let mut fx = Fx::default();
        let (mut c, mut out) = open(&core, &mut fx, &[]);
        c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
        assert_eq!(goaway(&out).map(|g| g.1), Some(code), "{what}");
        assert!(c.failed() && !c.done(), "{what}: lingers before it closes");
        assert!(!c.is_expired(NOW + LINGER_MS - 1, 60_000, 10_000));
        assert!(c.is_expired(NOW + LINGER_MS, 60_000, 10_000), "{what}");
    }
    // The first frame must be SETTINGS.
    let core = core_with_cert(false);
    let mut fx = Fx::default();
    let mut out = Vec::new();
    let mut c = H2Conn::new(core.limits.h2, NOW, &mut out, &mut fx);
    let mut input = frame::PREFACE.to_vec();
    frame::write_ping_ack(&mut input, &[0; 8]);
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert_eq!(goaway(&out).map(|g| g.1), Some(ErrorCode::Protocol));
}

#[test]
fn a_post_is_answered_405_and_its_body_refused_without_error() {
    let core = core_with_cert(false);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let block = cl.block(&[
        (":method", "POST"),
        (":scheme", "https"),
        (":path", "/spring-sale"),
    ]);
    let mut input = Vec::new();
    frame::write_headers(&mut input, 1, &block, false, 16_384);
    frame::write_data(&mut input, 1, b"late body", true);
    input.extend(cl.get(3, "/spring-sale"));
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    let answers = cl.answers(&out);
    assert_eq!(status(&answers[0].1), "405");
    assert_eq!(field(&answers[0].1, "allow"), Some("GET, HEAD"));
    assert!(
        resets(&out).is_empty(),
        "the body is read and dropped, not reset"
    );
    assert_eq!(status(&answers[1].1), "302", "the late DATA was ignored");
    assert_eq!(goaway(&out), None);
    assert_eq!(c.open_streams(), 0, "its END_STREAM ended it");
    // A body past the discard limit is reset (NO_ERROR) rather than read on.
    out.clear();
    let block = cl.block(&[(":method", "PUT"), (":scheme", "https"), (":path", "/x")]);
    let mut input = Vec::new();
    frame::write_headers(&mut input, 5, &block, false, 16_384);
    for _ in 0..5 {
        frame::write_data(&mut input, 5, &[0; 16_000], false);
        c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
        input.clear();
    }
    // The client's window on the stream was given back as it was read.
    assert!(Client::frames(&out)
        .iter()
        .any(|g| g.h.kind == kind::WINDOW_UPDATE && g.h.stream == 5));
    assert_eq!(resets(&out), [(5, ErrorCode::NoError)]);
}

#[test]
fn drain_says_goaway_with_the_last_stream_and_finishes_the_open_ones() {
    let core = core_with_cert(true);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let unknown = core.f.code(22);
    c.on_input(
        &cl.get(5, &format!("/{unknown}")),
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    c.drain(&mut out, &mut fx);
    assert_eq!(goaway(&out), Some((5, ErrorCode::NoError)));
    assert!(!c.done(), "stream 5 is still open");
    // A new stream after GOAWAY is not processed.
    out.clear();
    c.on_input(
        &cl.get(7, "/spring-sale"),
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    assert!(cl.answers(&out).is_empty());
    c.on_origin(
        unknown.as_bytes(),
        &OriginAnswer::NotFound,
        HOW,
        &core.env(),
        &mut fx,
        &mut out,
    );
    assert_eq!(status(&cl.answers(&out)[0].1), "404");
    assert!(c.done());
}

#[test]
fn idle_connections_expire_with_goaway_no_error() {
    let core = core_with_cert(false);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    assert!(!c.is_expired(NOW + 60_000, 60_000, 10_000));
    assert!(c.is_expired(NOW + 60_001, 60_000, 10_000));
    c.goodbye(NOW + 60_001, 60_000, 10_000, &mut out, &mut fx);
    assert_eq!(goaway(&out), Some((0, ErrorCode::NoError)));
}

#[test]
fn the_plain_listener_tells_h2c_from_http1_by_the_preface() {
    let core = core_with_cert(false);
    let mut fx = Fx::default();
    let mut cl = Client::new();
    // The preface in three pieces, the first too short to tell.
    let mut s = Session::new(NOW);
    let mut input = Client::preface(&[]);
    input.extend(cl.get(1, "/spring-sale"));
    s.on_input(&input[..2], &core.env(), &mut fx);
    assert!(!s.is_h2() && s.out.is_empty());
    s.on_input(&input[2..10], &core.env(), &mut fx);
    assert!(s.is_h2());
    s.on_input(&input[10..], &core.env(), &mut fx);
    let answers = cl.answers(&s.out);
    assert_eq!(status(&answers[0].1), "302");
    // "P" then "OST": HTTP/1.
    let mut s = Session::new(NOW);
    s.on_input(b"P", &core.env(), &mut fx);
    s.on_input(b"OST /x HTTP/1.1\r\nHost: a\r\n\r\n", &core.env(), &mut fx);
    assert!(!s.is_h2());
    assert!(s.out.starts_with(b"HTTP/1.1 405"));
    // With h2c off the preface is an HTTP/1 request line we refuse.
    let mut core = core_with_cert(false);
    core.limits.h2.h2c = false;
    let mut s = Session::new(NOW);
    s.on_input(&Client::preface(&[]), &core.env(), &mut fx);
    assert!(!s.is_h2());
    assert!(
        s.out.starts_with(b"HTTP/1.1 "),
        "{:?}",
        String::from_utf8_lossy(&s.out)
    );
    assert!(s.close_after_send);
}

#[test]
fn a_name_neither_sni_nor_the_certificate_covers_gets_421() {
    let core = core_with_cert(false);
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    c.sni = Some((*b"go.lh.example").into());
    let mut cl = Client::new();
    let mut input = Vec::new();
    for (id, authority) in [
        (1, "go.lh.example"),
        (3, "other.lh.example:443"),
        (5, "evil.example"),
        (7, "EVIL.example"),
    ] {
        let block = cl.block(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":authority", authority),
            (":path", "/spring-sale"),
        ]);
        frame::write_headers(&mut input, id, &block, true, 16_384);
    }
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    let got: Vec<(u32, String)> = cl
        .answers(&out)
        .iter()
        .map(|(id, f)| (*id, status(f).to_string()))
        .collect();
    assert_eq!(
        got,
        [
            (1, "302".into()),
            (3, "302".into()),
            (5, "421".into()),
            (7, "421".into())
        ]
    );
    // Without SNI (h2c, or a client that sent none), no 421.
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let block = cl.block(&[
        (":method", "GET"),
        (":scheme", "http"),
        (":authority", "evil.example"),
        (":path", "/spring-sale"),
    ]);
    let mut input = Vec::new();
    frame::write_headers(&mut input, 1, &block, true, 16_384);
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert_eq!(status(&cl.answers(&out)[0].1), "302");
}

#[test]
fn many_streams_at_once_stay_under_the_concurrency_limit() {
    let mut core = core_with_cert(false);
    core.limits.h2.max_concurrent_streams = 2;
    let mut fx = Fx::default();
    let (mut c, mut out) = open(&core, &mut fx, &[]);
    let mut cl = Client::new();
    let mut input = Vec::new();
    for id in [1u32, 3, 5] {
        // Requests whose END_STREAM has not come: they stay open.
        let block = cl.block(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/spring-sale"),
        ]);
        frame::write_headers(&mut input, id, &block, false, 16_384);
    }
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert_eq!(resets(&out), [(5, ErrorCode::RefusedStream)]);
    out.clear();
    // Their END_STREAM answers them.
    let mut input = Vec::new();
    frame::write_data(&mut input, 1, &[], true);
    frame::write_data(&mut input, 3, &[], true);
    c.on_input(&input, HOW, &core.env(), &mut fx, &mut out);
    assert_eq!(cl.answers(&out).len(), 2);
}

proptest::proptest! {
    #[test]
    fn garbage_after_the_preface_never_panics(
        frames in proptest::collection::vec(
            (0u8..12, proptest::num::u8::ANY, 0u32..12, proptest::collection::vec(proptest::num::u8::ANY, 0..40)),
            0..30),
        split in 0usize..2000,
    ) {
        let core = core_with_cert(true);
        let mut fx = Fx::default();
        let (mut c, mut out) = open(&core, &mut fx, &[]);
        let mut input = Vec::new();
        for (k, flags, stream, payload) in frames {
            frame::write_header(&mut input, payload.len(), k, flags, stream);
            input.extend_from_slice(&payload);
        }
        let split = split.min(input.len());
        c.on_input(&input[..split], HOW, &core.env(), &mut fx, &mut out);
        c.on_input(&input[split..], HOW, &core.env(), &mut fx, &mut out);
        let _ = c.is_expired(NOW + 100_000, 60_000, 10_000);
        let code = core.f.code(20);
        c.on_origin(code.as_bytes(), &OriginAnswer::NotFound, HOW, &core.env(), &mut fx, &mut out);
        // Whatever came in, what goes out is whole frames.
        let _ = Client::frames(&out);
    }

    #[test]
    fn raw_garbage_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..600)) {
        let core = core_with_cert(true);
        let mut fx = Fx::default();
        let mut s = Session::new(NOW);
        let mut input = frame::PREFACE.to_vec();
        input.extend_from_slice(&bytes);
        s.on_input(&input, &core.env(), &mut fx);
        let _ = Client::frames(&s.out);
    }
}
