//! An HTTP/2 server connection (RFC 9113) as a state machine fed bytes, origin replies and the
//! time, like [`crate::session`]: it never touches a socket or a clock. The I/O loops drive it
//! through [`crate::session::Session`], which holds one of these once a connection is known to
//! speak HTTP/2 (ALPN `h2` on TLS, the connection preface on the plain listener).
//!
//! Requests go through the same decision path as HTTP/1 ([`crate::session::respond`]); the
//! HTTP/1.1 answer it renders is transcoded into a HEADERS frame (and DATA for a page), so both
//! protocols send the same fields. A request that needs the origin parks its stream, not the
//! connection: the other streams keep being answered, and the reply (matched by code) finishes
//! the oldest stream waiting on that code. A RST_STREAM from the client drops its stream, and
//! with it its claim on a reply.
//!
//! What a client may make us do is bounded (each limit an engine flag, see [`H2Limits`]):
//! concurrent streams, the header list (in bytes as it is decoded, and in fields), the header
//! block being gathered (in bytes, in CONTINUATION frames and in time), resets received per
//! ten seconds (Rapid Reset, CVE-2023-44487), resets we send per connection (MadeYouReset,
//! CVE-2025-8671), control frames per ten seconds (PING, SETTINGS, WINDOW_UPDATE, PRIORITY and
//! empty DATA floods), and how long an answer waits for a flow-control window the client keeps
//! shut. A limit crossed ends the connection with GOAWAY `ENHANCE_YOUR_CALM` and reports which.

pub mod frame;
pub mod hpack;
pub mod huffman;

use std::collections::VecDeque;

use frame::{flag, kind, setting, ErrorCode, Header};

use crate::answer::Prefetcher;
use crate::origin_cache::OriginAnswer;
use crate::render;
use crate::session::{self, Effect, Effects, Env, How, Out, Parked, Reply};

/// The HTTP/2 limits (engine flags `--h2-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2Limits {
    /// `--h2-max-concurrent-streams`, sent as SETTINGS_MAX_CONCURRENT_STREAMS.
    pub max_concurrent_streams: u32,
    /// `--h2-max-header-list-size`, sent as SETTINGS_MAX_HEADER_LIST_SIZE and enforced while
    /// decoding (name + value + 32 per field). Also the most a header block may take encoded.
    pub max_header_list_size: u32,
    /// `--h2-max-header-fields`.
    pub max_header_fields: u32,
    /// `--h2-max-client-resets`: RST_STREAM frames a client may send in ten seconds.
    pub max_client_resets: u32,
    /// `--h2-max-local-resets`: RST_STREAM frames we may send on one connection.
    pub max_local_resets: u32,
    /// Control frames (PING, SETTINGS, WINDOW_UPDATE, PRIORITY, empty DATA) a client may send
    /// in ten seconds, beyond [`CONTROL_PER_STREAM`] for each stream it opened in them.
    pub max_control_frames: u32,
    /// How long an answer may wait for a flow-control window, in milliseconds.
    pub window_timeout_ms: i64,
    /// Serve a plain connection that opens with the HTTP/2 preface (h2c, RFC 9113 §3.3).
    pub h2c: bool,
}

impl Default for H2Limits {
    fn default() -> Self {
        H2Limits {
            max_concurrent_streams: 100,
            max_header_list_size: 16_384,
            max_header_fields: 100,
            max_client_resets: 200,
            max_local_resets: 1024,
            max_control_frames: 1000,
            window_timeout_ms: 10_000,
            h2c: true,
        }
    }
}

/// Control frames allowed per stream opened, on top of [`H2Limits::max_control_frames`]: a
/// browser acknowledges our DATA with WINDOW_UPDATEs.
pub const CONTROL_PER_STREAM: u32 = 4;

/// CONTINUATION frames one header block may take.
pub const MAX_CONTINUATIONS: u32 = 32;

/// The rate limits' window.
const RATE_WINDOW_MS: i64 = 10_000;

/// Stream ids we reset whose late frames are ignored rather than treated as errors, and
/// stream ids remembered as opened.
const RESET_MEMORY: usize = 256;

/// How long a connection that failed keeps reading (and dropping) before it closes.
pub const LINGER_MS: i64 = 1000;

/// Why a connection was refused for abuse (metrics label them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Flood {
    /// Too many RST_STREAM received (Rapid Reset).
    ClientResets,
    /// Too many RST_STREAM sent (MadeYouReset).
    LocalResets,
    Ping,
    Settings,
    WindowUpdate,
    Priority,
    EmptyData,
    /// A header block over the list size, the CONTINUATION count or the header timeout.
    Continuation,
    /// An answer waited past the window timeout for the client to open its window.
    ZeroWindow,
}

impl Flood {
    pub const ALL: [Flood; 9] = [
        Flood::ClientResets,
        Flood::LocalResets,
        Flood::Ping,
        Flood::Settings,
        Flood::WindowUpdate,
        Flood::Priority,
        Flood::EmptyData,
        Flood::Continuation,
        Flood::ZeroWindow,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Flood::ClientResets => "client_resets",
            Flood::LocalResets => "local_resets",
            Flood::Ping => "ping",
            Flood::Settings => "settings",
            Flood::WindowUpdate => "window_update",
            Flood::Priority => "priority",
            Flood::EmptyData => "empty_data",
            Flood::Continuation => "continuation",
            Flood::ZeroWindow => "zero_window",
        }
    }
}

/// What an HTTP/2 connection reports beside the shared effects (metrics). Exhaustive on
/// purpose, as [`crate::session::Effect`] is: a new event must be counted somewhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The connection started speaking HTTP/2.
    Connection,
    /// A request stream opened.
    Stream,
    /// A RST_STREAM received.
    ResetReceived,
    /// A RST_STREAM sent.
    ResetSent,
    /// A GOAWAY sent, with its code.
    GoAway(ErrorCode),
    /// A limit refused the client.
    Refused(Flood),
}

/// A count over a ten-second window.
#[derive(Debug, Clone, Copy, Default)]
struct Rate {
    since_ms: i64,
    count: u32,
}

impl Rate {
    fn hit(&mut self, now_ms: i64) -> u32 {
        if now_ms - self.since_ms >= RATE_WINDOW_MS {
            self.since_ms = now_ms;
            self.count = 0;
        }
        self.count = self.count.saturating_add(1);
        self.count
    }

    fn current(&self, now_ms: i64) -> u32 {
        if now_ms - self.since_ms >= RATE_WINDOW_MS {
            0
        } else {
            self.count
        }
    }
}

/// Where an answer is put together: the HTTP/1 rendering to transcode, the header block, and
/// what carries over between answers (the `Date` lines' block, a table size update due).
#[derive(Debug, Default)]
struct Compose {
    h1: Vec<u8>,
    block: Vec<u8>,
    /// `block` holds the whole answer (a redirect's, written directly).
    direct: bool,
    lines: hpack::Lines,
    /// A smaller table size the peer asked of our encoder, to signal in the next block.
    table_update: Option<u32>,
}

impl Compose {
    /// Starts the next answer: buffers cleared, a due table size update (RFC 7541 §6.3)
    /// first in the block.
    fn start(&mut self) -> Out<'_> {
        self.h1.clear();
        self.block.clear();
        self.direct = false;
        if let Some(size) = self.table_update.take() {
            hpack_size_update(&mut self.block, size as usize);
        }
        Out::H2 {
            h1: &mut self.h1,
            block: &mut self.block,
            direct: &mut self.direct,
            lines: &mut self.lines,
        }
    }
}

/// Where a stream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// The request is not complete: more DATA or trailers may come.
    Receiving,
    /// Waiting for the origin.
    Parked(Parked),
    /// The answer's body waits for a flow-control window.
    Sending,
    /// Answered while the client still sends a body we do not want: its DATA is read and
    /// dropped until END_STREAM (up to [`DISCARD_MAX`], then RST_STREAM NO_ERROR). Resetting
    /// at once is what RFC 9113 §8.1 allows, but clients mid-upload take it as a failure.
    Discarding,
}

/// The most body a stream answered early may still send before it is reset.
pub const DISCARD_MAX: u64 = 64 * 1024;

#[derive(Debug)]
struct Stream {
    id: u32,
    phase: Phase,
    /// The client may still send on it (no END_STREAM yet).
    remote_open: bool,
    fields: hpack::Fields,
    /// Body bytes received.
    received: u64,
    /// What the client lets us send on it.
    send_window: i64,
    /// What we let the client send on it.
    recv_window: i64,
    /// Answer bytes waiting for a window.
    pending: Vec<u8>,
    /// When it opened (a request unfinished past the header timeout) or started waiting for
    /// a window.
    since_ms: i64,
}

/// A header block being gathered across CONTINUATION frames.
#[derive(Debug)]
struct Gathering {
    stream: u32,
    end_stream: bool,
    self_dependent: bool,
    block: Vec<u8>,
    frames: u32,
    since_ms: i64,
}

/// One HTTP/2 connection's state.
#[derive(Debug)]
pub struct H2Conn {
    limits: H2Limits,
    inbuf: Vec<u8>,
    /// Bytes of the client preface still to check.
    preface_left: usize,
    /// The client's first frame (its SETTINGS) arrived.
    settled: bool,
    decoder: hpack::Decoder,
    scratch: hpack::Fields,
    compose: Compose,
    gathering: Option<Gathering>,
    streams: Vec<Stream>,
    /// The highest stream id the client opened.
    last_stream: u32,
    reset_ids: VecDeque<u32>,
    /// Stream ids the client opened lately: a frame on one of them once closed is a stream
    /// error (STREAM_CLOSED); on an id it skipped, a connection error (RFC 9113 §5.1.1).
    seen_ids: VecDeque<u32>,
    /// Stream ids the client reset lately: a frame on one is a stream error (§5.1, "closed").
    client_reset_ids: VecDeque<u32>,
    /// When a connection error was sent: input is read and dropped for [`LINGER_MS`] so the
    /// GOAWAY is not lost to a reset (a close with unread input sends RST), then it closes.
    failed_at_ms: i64,
    peer_initial_window: i64,
    peer_max_frame: usize,
    send_window: i64,
    recv_window: i64,
    /// DATA bytes received and not yet given back with a WINDOW_UPDATE.
    recv_unacked: u32,
    /// GOAWAY sent (drain or error): streams above `last_stream` are ignored.
    goaway_sent: bool,
    peer_goaway: bool,
    /// A connection error was sent: nothing more is read.
    failed: bool,
    client_resets: Rate,
    control: Rate,
    streams_opened: Rate,
    local_resets: u32,
    last_active_ms: i64,
    prefetcher: Prefetcher,
    /// The client's SNI, lower case (TLS only).
    pub(crate) sni: Option<Box<[u8]>>,
    /// The last `:authority` found misdirected or fine, so a connection asks the certificate
    /// once per name rather than per request.
    authority_seen: Option<(Box<[u8]>, bool)>,
}

/// What a frame handler decided about the connection.
type Step = Result<(), Fail>;

/// A connection error: GOAWAY with `code` and close (RFC 9113 §5.4.1).
#[derive(Debug, Clone, Copy)]
struct Fail {
    code: ErrorCode,
    flood: Option<Flood>,
}

fn fail(code: ErrorCode) -> Fail {
    Fail { code, flood: None }
}

fn calm(flood: Flood) -> Fail {
    Fail {
        code: ErrorCode::EnhanceYourCalm,
        flood: Some(flood),
    }
}

/// Whether `b` could be the start of an HTTP/2 client preface.
pub fn starts_like_preface(b: &[u8]) -> bool {
    let n = b.len().min(frame::PREFACE.len());
    b[..n] == frame::PREFACE[..n]
}

impl H2Conn {
    /// A connection whose first bytes from the client are the preface; our SETTINGS go out
    /// at once (RFC 9113 §3.4: the server's preface may be sent before the client's arrives).
    pub fn new(limits: H2Limits, now_ms: i64, out: &mut Vec<u8>, fx: &mut impl Effects) -> Self {
        frame::write_settings(
            out,
            &[
                (
                    setting::MAX_CONCURRENT_STREAMS,
                    limits.max_concurrent_streams,
                ),
                (setting::MAX_HEADER_LIST_SIZE, limits.max_header_list_size),
                (setting::ENABLE_PUSH, 0),
                (setting::NO_RFC7540_PRIORITIES, 1),
            ],
        );
        fx.effect(Effect::H2(Event::Connection));
        H2Conn {
            limits,
            inbuf: Vec::new(),
            preface_left: frame::PREFACE.len(),
            settled: false,
            decoder: hpack::Decoder::default(),
            scratch: hpack::Fields::default(),
            compose: Compose::default(),
            gathering: None,
            streams: Vec::new(),
            last_stream: 0,
            reset_ids: VecDeque::new(),
            seen_ids: VecDeque::new(),
            client_reset_ids: VecDeque::new(),
            failed_at_ms: 0,
            peer_initial_window: frame::DEFAULT_WINDOW,
            peer_max_frame: frame::DEFAULT_MAX_FRAME as usize,
            send_window: frame::DEFAULT_WINDOW,
            recv_window: frame::DEFAULT_WINDOW,
            recv_unacked: 0,
            goaway_sent: false,
            peer_goaway: false,
            failed: false,
            client_resets: Rate::default(),
            control: Rate::default(),
            streams_opened: Rate::default(),
            local_resets: 0,
            last_active_ms: now_ms,
            prefetcher: Prefetcher::default(),
            sni: None,
            authority_seen: None,
        }
    }

    /// Streams waiting for the origin.
    pub fn waiting_origin(&self) -> bool {
        self.streams
            .iter()
            .any(|s| matches!(s.phase, Phase::Parked(_)))
    }

    /// Open streams.
    pub fn open_streams(&self) -> usize {
        self.streams.len()
    }

    /// Nothing more will be answered: the connection closes once its output is sent.
    pub fn done(&self) -> bool {
        // The client's own GOAWAY leaves the closing to it (it may still PING).
        !self.failed && self.goaway_sent && self.streams.is_empty() && self.gathering.is_none()
    }

    /// A connection error was sent.
    pub fn failed(&self) -> bool {
        self.failed
    }

    /// `Some(None)`: idle; `Some(Some(flood))`: a limit in time.
    fn why_expired(&self, now_ms: i64, idle_ms: i64, header_ms: i64) -> Option<Option<Flood>> {
        if self.failed {
            return (now_ms - self.failed_at_ms >= LINGER_MS).then_some(None);
        }
        if self
            .gathering
            .as_ref()
            .is_some_and(|g| now_ms - g.since_ms > header_ms)
        {
            return Some(Some(Flood::Continuation));
        }
        for s in &self.streams {
            match s.phase {
                Phase::Receiving if now_ms - s.since_ms > header_ms => {
                    return Some(Some(Flood::Continuation))
                }
                Phase::Sending if now_ms - s.since_ms > self.limits.window_timeout_ms => {
                    return Some(Some(Flood::ZeroWindow))
                }
                _ => {}
            }
        }
        if self.streams.iter().all(|s| s.phase == Phase::Discarding)
            && self.gathering.is_none()
            && now_ms - self.last_active_ms > idle_ms
        {
            return Some(None);
        }
        None
    }

    /// Whether the connection has outstayed its welcome at `now_ms` (then the loop calls
    /// [`H2Conn::goodbye`] and closes it): idle with no stream for `idle_ms`, a request or a
    /// header block unfinished for `header_ms`, or an answer waiting for a window past the
    /// window timeout. Streams parked on the origin wait on us, not the other way round.
    pub fn is_expired(&self, now_ms: i64, idle_ms: i64, header_ms: i64) -> bool {
        self.why_expired(now_ms, idle_ms, header_ms).is_some()
    }

    /// Ends an expired connection: GOAWAY (NO_ERROR when idle, ENHANCE_YOUR_CALM when a time
    /// limit was crossed), every stream dropped.
    pub fn goodbye(
        &mut self,
        now_ms: i64,
        idle_ms: i64,
        header_ms: i64,
        out: &mut Vec<u8>,
        fx: &mut impl Effects,
    ) {
        let code = match self.why_expired(now_ms, idle_ms, header_ms) {
            Some(Some(flood)) => {
                fx.effect(Effect::H2(Event::Refused(flood)));
                ErrorCode::EnhanceYourCalm
            }
            _ => ErrorCode::NoError,
        };
        self.fail_with(out, fx, fail(code));
    }

    /// Drain (SIGTERM): GOAWAY with the last stream id; the open streams are finished, new
    /// ones ignored, and the connection closes once none is left.
    pub fn drain(&mut self, out: &mut Vec<u8>, fx: &mut impl Effects) {
        if self.goaway_sent || self.failed {
            return;
        }
        self.goaway_sent = true;
        frame::write_goaway(out, self.last_stream, ErrorCode::NoError);
        fx.effect(Effect::H2(Event::GoAway(ErrorCode::NoError)));
    }

    /// Feeds received bytes.
    pub fn on_input(
        &mut self,
        data: &[u8],
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) {
        self.last_active_ms = env.now_ms;
        if self.failed {
            return;
        }
        let mut buf = std::mem::take(&mut self.inbuf);
        let used;
        let result = if buf.is_empty() {
            let (r, n) = self.frames(data, how, env, fx, out);
            used = n;
            if r.is_ok() && n < data.len() {
                buf.extend_from_slice(&data[n..]);
            }
            r
        } else {
            buf.extend_from_slice(data);
            let (r, n) = self.frames(&buf, how, env, fx, out);
            used = n;
            buf.drain(..used.min(buf.len()));
            r
        };
        let _ = used;
        match result {
            Ok(()) => self.inbuf = buf,
            Err(f) => self.fail_with(out, fx, f),
        }
    }

    /// Handles every whole frame at the front of `b`; returns the bytes used.
    fn frames(
        &mut self,
        b: &[u8],
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> (Step, usize) {
        let mut at = 0;
        if self.preface_left > 0 {
            let done = frame::PREFACE.len() - self.preface_left;
            let n = self.preface_left.min(b.len());
            if b[..n] != frame::PREFACE[done..done + n] {
                return (Err(fail(ErrorCode::Protocol)), b.len());
            }
            self.preface_left -= n;
            at = n;
            if self.preface_left > 0 {
                return (Ok(()), at);
            }
        }
        while let Some(h) = b.get(at..).and_then(Header::read) {
            if h.len > frame::DEFAULT_MAX_FRAME {
                return (Err(fail(ErrorCode::FrameSize)), b.len());
            }
            let end = at + frame::HEADER_LEN + h.len as usize;
            let Some(payload) = b.get(at + frame::HEADER_LEN..end) else {
                break;
            };
            at = end;
            if let Err(f) = self.frame(h, payload, how, env, fx, out) {
                return (Err(f), b.len());
            }
            if self.failed {
                return (Ok(()), b.len());
            }
        }
        (Ok(()), at)
    }

    fn frame(
        &mut self,
        h: Header,
        p: &[u8],
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        if !self.settled {
            // The preface's SETTINGS comes first (RFC 9113 §3.4).
            if h.kind != kind::SETTINGS || h.has(flag::ACK) {
                return Err(fail(ErrorCode::Protocol));
            }
            self.settled = true;
        }
        if let Some(g) = &self.gathering {
            if h.kind != kind::CONTINUATION || h.stream != g.stream {
                return Err(fail(ErrorCode::Protocol));
            }
        }
        match h.kind {
            kind::DATA => self.data(h, p, how, env, fx, out),
            kind::HEADERS => self.headers(h, p, how, env, fx, out),
            kind::PRIORITY => {
                if h.stream == 0 {
                    return Err(fail(ErrorCode::Protocol));
                }
                self.control_frame(Flood::Priority, env.now_ms)?;
                if p.len() != 5 {
                    self.reset(h.stream, ErrorCode::FrameSize, out, fx)?;
                    return Ok(());
                }
                let dep = u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff;
                if dep == h.stream {
                    self.reset(h.stream, ErrorCode::Protocol, out, fx)?;
                }
                Ok(())
            }
            kind::RST_STREAM => {
                if h.stream == 0 {
                    return Err(fail(ErrorCode::Protocol));
                }
                if p.len() != 4 {
                    return Err(fail(ErrorCode::FrameSize));
                }
                if h.stream > self.last_stream {
                    return Err(fail(ErrorCode::Protocol)); // idle
                }
                fx.effect(Effect::H2(Event::ResetReceived));
                if self.client_resets.hit(env.now_ms) > self.limits.max_client_resets {
                    return Err(calm(Flood::ClientResets));
                }
                self.streams.retain(|s| s.id != h.stream);
                remember(&mut self.client_reset_ids, h.stream);
                Ok(())
            }
            kind::SETTINGS => self.settings(h, p, env, fx, out),
            kind::PUSH_PROMISE => Err(fail(ErrorCode::Protocol)),
            kind::PING => {
                if h.stream != 0 {
                    return Err(fail(ErrorCode::Protocol));
                }
                if p.len() != 8 {
                    return Err(fail(ErrorCode::FrameSize));
                }
                if !h.has(flag::ACK) {
                    self.control_frame(Flood::Ping, env.now_ms)?;
                    let mut opaque = [0u8; 8];
                    opaque.copy_from_slice(p);
                    frame::write_ping_ack(out, &opaque);
                }
                Ok(())
            }
            kind::GOAWAY => {
                if h.stream != 0 {
                    return Err(fail(ErrorCode::Protocol));
                }
                if p.len() < 8 {
                    return Err(fail(ErrorCode::FrameSize));
                }
                self.peer_goaway = true;
                Ok(())
            }
            kind::WINDOW_UPDATE => self.window_update(h, p, env, fx, out),
            kind::CONTINUATION => self.continuation(h, p, how, env, fx, out),
            // Unknown types are ignored (RFC 9113 §4.1; PRIORITY_UPDATE among them).
            _ => Ok(()),
        }
    }

    /// Counts a control frame against the budget.
    fn control_frame(&mut self, flood: Flood, now_ms: i64) -> Step {
        let opened = self.streams_opened.current(now_ms);
        let allowed = self
            .limits
            .max_control_frames
            .saturating_add(opened.saturating_mul(CONTROL_PER_STREAM));
        if self.control.hit(now_ms) > allowed {
            return Err(calm(flood));
        }
        Ok(())
    }

    fn settings(
        &mut self,
        h: Header,
        p: &[u8],
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        if h.stream != 0 {
            return Err(fail(ErrorCode::Protocol));
        }
        if h.has(flag::ACK) {
            return if p.is_empty() {
                Ok(())
            } else {
                Err(fail(ErrorCode::FrameSize))
            };
        }
        if p.len() % 6 != 0 {
            return Err(fail(ErrorCode::FrameSize));
        }
        self.control_frame(Flood::Settings, env.now_ms)?;
        for s in p.chunks_exact(6) {
            let id = u16::from_be_bytes([s[0], s[1]]);
            let value = u32::from_be_bytes([s[2], s[3], s[4], s[5]]);
            match id {
                // We never insert into our table; a smaller maximum is still signalled.
                setting::HEADER_TABLE_SIZE if (value as usize) < hpack::TABLE_SIZE => {
                    self.compose.table_update = Some(value);
                }
                setting::ENABLE_PUSH if value > 1 => return Err(fail(ErrorCode::Protocol)),
                setting::INITIAL_WINDOW_SIZE => {
                    let value = i64::from(value);
                    if value > frame::MAX_WINDOW {
                        return Err(fail(ErrorCode::FlowControl));
                    }
                    let delta = value - self.peer_initial_window;
                    self.peer_initial_window = value;
                    for st in &mut self.streams {
                        st.send_window += delta;
                        if st.send_window > frame::MAX_WINDOW {
                            return Err(fail(ErrorCode::FlowControl));
                        }
                    }
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..=(1 << 24) - 1).contains(&value) {
                        return Err(fail(ErrorCode::Protocol));
                    }
                    self.peer_max_frame = value as usize;
                }
                setting::NO_RFC7540_PRIORITIES if value > 1 => {
                    return Err(fail(ErrorCode::Protocol))
                }
                _ => {}
            }
        }
        frame::write_settings_ack(out);
        self.flush(env.now_ms, out, fx)
    }

    fn window_update(
        &mut self,
        h: Header,
        p: &[u8],
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        if p.len() != 4 {
            return Err(fail(ErrorCode::FrameSize));
        }
        self.control_frame(Flood::WindowUpdate, env.now_ms)?;
        let inc = i64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]) & 0x7fff_ffff);
        if h.stream == 0 {
            if inc == 0 {
                return Err(fail(ErrorCode::Protocol));
            }
            self.send_window += inc;
            if self.send_window > frame::MAX_WINDOW {
                return Err(fail(ErrorCode::FlowControl));
            }
        } else {
            if h.stream > self.last_stream {
                return Err(fail(ErrorCode::Protocol)); // idle
            }
            let Some(i) = self.find(h.stream) else {
                return Ok(()); // closed: late updates are expected
            };
            if inc == 0 {
                return self.reset(h.stream, ErrorCode::Protocol, out, fx);
            }
            self.streams[i].send_window += inc;
            if self.streams[i].send_window > frame::MAX_WINDOW {
                return self.reset(h.stream, ErrorCode::FlowControl, out, fx);
            }
        }
        self.flush(env.now_ms, out, fx)
    }

    fn data(
        &mut self,
        h: Header,
        p: &[u8],
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        if h.stream == 0 {
            return Err(fail(ErrorCode::Protocol));
        }
        let body = unpad(h, p)?;
        // The whole frame counts against the windows, padding included (§6.9.1).
        let len = p.len() as u32;
        self.recv_window -= i64::from(len);
        if self.recv_window < 0 {
            return Err(fail(ErrorCode::FlowControl));
        }
        self.recv_unacked += len;
        if self.recv_unacked >= (frame::DEFAULT_WINDOW as u32) / 2 {
            frame::write_window_update(out, 0, self.recv_unacked);
            self.recv_window += i64::from(self.recv_unacked);
            self.recv_unacked = 0;
        }
        if body.is_empty() && !h.has(flag::END_STREAM) {
            self.control_frame(Flood::EmptyData, env.now_ms)?;
        }
        if h.stream > self.last_stream {
            return Err(fail(ErrorCode::Protocol)); // idle
        }
        let Some(i) = self.find(h.stream) else {
            return self.on_closed(h.stream, out, fx);
        };
        if !self.streams[i].remote_open {
            return self.reset(h.stream, ErrorCode::StreamClosed, out, fx);
        }
        let st = &mut self.streams[i];
        st.recv_window -= i64::from(len);
        if st.recv_window < 0 {
            return self.reset(h.stream, ErrorCode::FlowControl, out, fx);
        }
        st.received += body.len() as u64;
        if st.fields.content_length.is_some_and(|cl| st.received > cl) {
            return self.reset(h.stream, ErrorCode::Protocol, out, fx);
        }
        if st.phase == Phase::Discarding {
            if h.has(flag::END_STREAM) {
                let st = self.streams.swap_remove(i);
                if st.fields.content_length.is_some_and(|cl| cl != st.received) {
                    return self.reset_stream(st, ErrorCode::Protocol, out, fx);
                }
                return Ok(());
            }
            if st.received > DISCARD_MAX {
                return self.reset(h.stream, ErrorCode::NoError, out, fx);
            }
            if st.recv_window < frame::DEFAULT_WINDOW / 2 {
                let give = (frame::DEFAULT_WINDOW - st.recv_window) as u32;
                st.recv_window = frame::DEFAULT_WINDOW;
                frame::write_window_update(out, h.stream, give);
            }
            return Ok(());
        }
        if st.fields.content_length.is_some_and(|cl| st.received > cl) {
            return self.reset(h.stream, ErrorCode::Protocol, out, fx);
        }
        if !body.is_empty() {
            // No method we serve takes a body: answered 400 (GET, HEAD; as HTTP/1) or 405.
            let st = self.streams.swap_remove(i);
            return self.refuse_body(st, h.has(flag::END_STREAM), how, env, fx, out);
        }
        if h.has(flag::END_STREAM) {
            let mut st = self.streams.swap_remove(i);
            st.remote_open = false;
            return self.complete(st, how, env, fx, out);
        }
        Ok(())
    }

    fn headers(
        &mut self,
        h: Header,
        p: &[u8],
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        if h.stream == 0 || h.stream % 2 == 0 {
            return Err(fail(ErrorCode::Protocol));
        }
        let mut frag = unpad(h, p)?;
        let mut self_dependent = false;
        if h.has(flag::PRIORITY) {
            let Some((dep, rest)) = frag.split_first_chunk::<5>() else {
                return Err(fail(ErrorCode::FrameSize));
            };
            self_dependent =
                u32::from_be_bytes([dep[0], dep[1], dep[2], dep[3]]) & 0x7fff_ffff == h.stream;
            frag = rest;
        }
        if h.has(flag::END_HEADERS) {
            return self.block_done(
                h.stream,
                h.has(flag::END_STREAM),
                self_dependent,
                frag,
                how,
                env,
                fx,
                out,
            );
        }
        self.gathering = Some(Gathering {
            stream: h.stream,
            end_stream: h.has(flag::END_STREAM),
            self_dependent,
            block: frag.to_vec(),
            frames: 1,
            since_ms: env.now_ms,
        });
        Ok(())
    }

    fn continuation(
        &mut self,
        h: Header,
        p: &[u8],
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        let Some(g) = self.gathering.as_mut() else {
            return Err(fail(ErrorCode::Protocol));
        };
        g.frames += 1;
        g.block.extend_from_slice(p);
        if g.block.len() > self.limits.max_header_list_size as usize || g.frames > MAX_CONTINUATIONS
        {
            // The block cannot be decoded within our limits, and without decoding it the
            // table is out of step: the connection ends.
            return Err(calm(Flood::Continuation));
        }
        if !h.has(flag::END_HEADERS) {
            return Ok(());
        }
        let Some(g) = self.gathering.take() else {
            return Ok(());
        };
        self.block_done(
            g.stream,
            g.end_stream,
            g.self_dependent,
            &g.block,
            how,
            env,
            fx,
            out,
        )
    }

    /// A whole header block arrived on `id`.
    #[allow(clippy::too_many_arguments)]
    fn block_done(
        &mut self,
        id: u32,
        end_stream: bool,
        self_dependent: bool,
        block: &[u8],
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        let lim = hpack::BlockLimits {
            max_list: self.limits.max_header_list_size as usize,
            max_fields: self.limits.max_header_fields as usize,
        };
        let existing = self.find(id);
        let trailers = existing.is_some_and(|i| self.streams[i].remote_open);
        // The snapshot's lines for the code start on their way as soon as `:path` is
        // decoded, as HTTP/1's do before its parse: the rest of the block, the stream's
        // bookkeeping and the request's fields run meanwhile.
        let (prefetcher, tables, fixed) = (&self.prefetcher, env.tables, env.fixed);
        let decoded = hpack::decode(
            &mut self.decoder,
            block,
            trailers,
            lim,
            env.limits,
            &mut self.scratch,
            |path| {
                if !fixed {
                    prefetcher.prefetch_path(path, tables);
                }
            },
        );
        if decoded == Err(hpack::Problem::Compression) {
            return Err(fail(ErrorCode::Compression));
        }
        if let Some(i) = existing {
            if !trailers {
                // Half-closed (remote): the request already ended.
                return self.reset(id, ErrorCode::StreamClosed, out, fx);
            }
            if decoded.is_err() || !end_stream || self_dependent {
                return self.reset(id, ErrorCode::Protocol, out, fx);
            }
            let mut st = self.streams.swap_remove(i);
            st.remote_open = false;
            if st.phase == Phase::Discarding {
                // Answered already: the trailers end the body we were dropping.
                if st.fields.content_length.is_some_and(|cl| cl != st.received) {
                    return self.reset_stream(st, ErrorCode::Protocol, out, fx);
                }
                return Ok(());
            }
            return self.complete(st, how, env, fx, out);
        }
        if id <= self.last_stream {
            if self.seen_ids.contains(&id) {
                return self.on_closed(id, out, fx);
            }
            // An id below one already used, never opened (§5.1.1).
            return Err(fail(ErrorCode::Protocol));
        }
        self.last_stream = id;
        remember(&mut self.seen_ids, id);
        if self.goaway_sent || self.peer_goaway {
            return Ok(()); // after GOAWAY: not processed (RFC 9113 §6.8)
        }
        if self_dependent {
            return self.reset(id, ErrorCode::Protocol, out, fx);
        }
        if decoded == Err(hpack::Problem::Malformed) {
            return self.reset(id, ErrorCode::Protocol, out, fx);
        }
        if self.streams.len() >= self.limits.max_concurrent_streams as usize {
            return self.reset(id, ErrorCode::RefusedStream, out, fx);
        }
        fx.effect(Effect::H2(Event::Stream));
        self.streams_opened.hit(env.now_ms);
        if end_stream
            && decoded.is_ok()
            && !misdirected(
                &self.sni,
                &mut self.authority_seen,
                self.scratch.authority(),
                env,
            )
        {
            // The common request (a GET whose HEADERS end the stream) answered from the
            // decode buffers, with no stream kept unless it must wait (the origin, a window).
            let req = self.scratch.request(env.limits);
            let reply = session::respond(
                &req,
                how,
                &mut self.prefetcher,
                env,
                fx,
                &mut self.compose.start(),
            );
            if self.compose.direct {
                let block = &self.compose.block;
                frame::write_headers(out, id, block, true, self.peer_max_frame);
                return Ok(());
            }
            let st = self.stream(id, false, env.now_ms);
            return self.answered(st, reply, env.now_ms, out, fx);
        }
        let st = self.stream(id, !end_stream, env.now_ms);
        if decoded == Err(hpack::Problem::TooLarge) {
            return self.answer_error(
                st,
                crate::http::HttpError::HeadersTooLarge,
                how,
                env,
                fx,
                out,
            );
        }
        if end_stream {
            return self.complete(st, how, env, fx, out);
        }
        if st.fields.method() == crate::http::Method::Other {
            // Not ours whatever its body: answered now, the rest of the request refused.
            return self.answer(st, how, env, fx, out);
        }
        self.streams.push(st);
        Ok(())
    }

    /// The request on `st` ended (END_STREAM): check its length and answer it.
    fn complete(
        &mut self,
        st: Stream,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        if st.fields.content_length.is_some_and(|cl| cl != st.received) {
            return self.reset_stream(st, ErrorCode::Protocol, out, fx);
        }
        self.answer(st, how, env, fx, out)
    }

    /// A GET or HEAD with a body: 400, as HTTP/1 answers it; another method: its 405.
    fn refuse_body(
        &mut self,
        mut st: Stream,
        end_stream: bool,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        st.remote_open = !end_stream;
        match st.fields.method() {
            crate::http::Method::Other => self.answer(st, how, env, fx, out),
            _ => self.answer_error(
                st,
                crate::http::HttpError::BodyNotAllowed,
                how,
                env,
                fx,
                out,
            ),
        }
    }

    fn answer_error(
        &mut self,
        st: Stream,
        e: crate::http::HttpError,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        render::render_error(e, env.headers.lines(how.https), self.compose.start().h1());
        fx.effect(Effect::Answered {
            status: e.status(),
            layer: Some(crate::answer::Layer::Invalid),
        });
        self.send_answer(st, env.now_ms, out, fx)
    }

    /// Answers the request on `st` through the shared decision path.
    fn answer(
        &mut self,
        st: Stream,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) -> Step {
        let authority = st.fields.authority();
        if misdirected(&self.sni, &mut self.authority_seen, authority, env) {
            render::render_misdirected(env.headers.lines(how.https), self.compose.start().h1());
            fx.effect(Effect::Answered {
                status: 421,
                layer: Some(crate::answer::Layer::Invalid),
            });
            return self.send_answer(st, env.now_ms, out, fx);
        }
        let req = st.fields.request(env.limits);
        let reply = session::respond(
            &req,
            how,
            &mut self.prefetcher,
            env,
            fx,
            &mut self.compose.start(),
        );
        self.answered(st, reply, env.now_ms, out, fx)
    }

    /// What [`session::respond`] made of the request on `st`: sent, or parked.
    fn answered(
        &mut self,
        mut st: Stream,
        reply: Reply,
        now_ms: i64,
        out: &mut Vec<u8>,
        fx: &mut impl Effects,
    ) -> Step {
        match reply {
            Reply::Parked(p) => {
                st.phase = Phase::Parked(p);
                self.streams.push(st);
                Ok(())
            }
            Reply::Done { .. } => self.send_answer(st, now_ms, out, fx),
        }
    }

    /// A stream for `id` holding the request in the decode buffers.
    fn stream(&mut self, id: u32, remote_open: bool, now_ms: i64) -> Stream {
        Stream {
            id,
            phase: Phase::Receiving,
            remote_open,
            fields: std::mem::take(&mut self.scratch),
            received: 0,
            send_window: self.peer_initial_window,
            recv_window: frame::DEFAULT_WINDOW,
            pending: Vec::new(),
            since_ms: now_ms,
        }
    }

    /// The origin replied for `code`: finishes the oldest stream parked on it.
    pub fn on_origin(
        &mut self,
        code: &[u8],
        reply: &OriginAnswer,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        out: &mut Vec<u8>,
    ) {
        if self.failed {
            return;
        }
        let found = self.streams.iter().position(|s| {
            matches!(s.phase, Phase::Parked(_))
                && session::asks_for(&s.fields.request(env.limits), env.tables, code)
        });
        let Some(i) = found else {
            return;
        };
        let st = self.streams.remove(i);
        let Phase::Parked(parked) = st.phase else {
            return;
        };
        let req = st.fields.request(env.limits);
        session::respond_origin(&req, parked, reply, how, env, fx, &mut self.compose.start());
        if let Err(f) = self.send_answer(st, env.now_ms, out, fx) {
            self.fail_with(out, fx, f);
        }
    }

    /// Sends the answer [`Compose`] holds on `st`: its header block whole (`direct`), or the
    /// HTTP/1 answer transcoded after what the block holds.
    fn send_answer(
        &mut self,
        mut st: Stream,
        now_ms: i64,
        out: &mut Vec<u8>,
        fx: &mut impl Effects,
    ) -> Step {
        let c = &mut self.compose;
        let body = if c.direct {
            0..0
        } else {
            match hpack::transcode(&c.h1, &mut c.block) {
                Some(body) => body,
                None => return self.reset_stream(st, ErrorCode::Internal, out, fx),
            }
        };
        let c = &self.compose;
        let body = &c.h1[body];
        frame::write_headers(out, st.id, &c.block, body.is_empty(), self.peer_max_frame);

        if !body.is_empty() {
            st.pending.clear();
            st.pending.extend_from_slice(body);
            st.phase = Phase::Sending;
            st.since_ms = now_ms;
            self.streams.push(st);
            return self.flush(now_ms, out, fx);
        }
        self.finished(st, out, fx)
    }

    /// Our side of `st` is done: a client still sending is told to stop (RST_STREAM
    /// NO_ERROR, RFC 9113 §8.1).
    fn finished(&mut self, mut st: Stream, out: &mut Vec<u8>, fx: &mut impl Effects) -> Step {
        if st.remote_open {
            if st.received > DISCARD_MAX {
                return self.reset_stream(st, ErrorCode::NoError, out, fx);
            }
            st.phase = Phase::Discarding;
            st.pending = Vec::new();
            self.streams.push(st);
        } else if self.scratch.is_unallocated() {
            // The decode buffers go back for the next request (no allocation per stream).
            self.scratch = st.fields;
        }
        Ok(())
    }

    /// Sends what the windows let through of every waiting answer.
    fn flush(&mut self, now_ms: i64, out: &mut Vec<u8>, fx: &mut impl Effects) -> Step {
        let mut i = 0;
        while i < self.streams.len() {
            if self.streams[i].phase != Phase::Sending {
                i += 1;
                continue;
            }
            let st = &mut self.streams[i];
            while !st.pending.is_empty() {
                let n = (st.pending.len() as i64)
                    .min(st.send_window)
                    .min(self.send_window)
                    .min(self.peer_max_frame as i64);
                if n <= 0 {
                    break;
                }
                let n = n as usize;
                let end = n == st.pending.len();
                frame::write_data(out, st.id, &st.pending[..n], end);
                st.pending.drain(..n);
                st.send_window -= n as i64;
                self.send_window -= n as i64;
                st.since_ms = now_ms;
            }
            if st.pending.is_empty() {
                let st = self.streams.swap_remove(i);
                self.finished(st, out, fx)?;
            } else {
                i += 1;
            }
        }
        Ok(())
    }

    /// A stream error on `id` (RFC 9113 §5.4.2).
    fn reset(
        &mut self,
        id: u32,
        code: ErrorCode,
        out: &mut Vec<u8>,
        fx: &mut impl Effects,
    ) -> Step {
        self.streams.retain(|s| s.id != id);
        self.send_rst(id, code, out, fx)
    }

    fn reset_stream(
        &mut self,
        st: Stream,
        code: ErrorCode,
        out: &mut Vec<u8>,
        fx: &mut impl Effects,
    ) -> Step {
        self.send_rst(st.id, code, out, fx)
    }

    fn send_rst(
        &mut self,
        id: u32,
        code: ErrorCode,
        out: &mut Vec<u8>,
        fx: &mut impl Effects,
    ) -> Step {
        frame::write_rst(out, id, code);
        fx.effect(Effect::H2(Event::ResetSent));
        remember(&mut self.reset_ids, id);
        self.local_resets += 1;
        if self.local_resets > self.limits.max_local_resets {
            return Err(calm(Flood::LocalResets));
        }
        Ok(())
    }

    /// A DATA or HEADERS frame on `id`, which is not open (§5.1, "closed"): ignored when we
    /// reset it (its frames may still be on the way), a stream error when the client reset
    /// it, a connection error when it ended with END_STREAM both ways.
    fn on_closed(&mut self, id: u32, out: &mut Vec<u8>, fx: &mut impl Effects) -> Step {
        if self.reset_ids.contains(&id) {
            return Ok(());
        }
        if self.client_reset_ids.contains(&id) {
            return self.send_rst(id, ErrorCode::StreamClosed, out, fx);
        }
        Err(fail(ErrorCode::StreamClosed))
    }

    fn find(&self, id: u32) -> Option<usize> {
        self.streams.iter().position(|s| s.id == id)
    }

    /// A connection error: GOAWAY, every stream dropped, nothing more read.
    fn fail_with(&mut self, out: &mut Vec<u8>, fx: &mut impl Effects, f: Fail) {
        if self.failed {
            return;
        }
        if let Some(flood) = f.flood {
            fx.effect(Effect::H2(Event::Refused(flood)));
        }
        frame::write_goaway(out, self.last_stream, f.code);
        fx.effect(Effect::H2(Event::GoAway(f.code)));
        self.failed = true;
        self.failed_at_ms = self.last_active_ms;
        self.goaway_sent = true;
        self.streams.clear();
        self.gathering = None;
        self.inbuf = Vec::new();
    }
}

/// Whether `authority` is a name this connection must not answer for: the client sent SNI,
/// and the request names neither that nor a name the certificate covers (browsers reuse a
/// connection for every name its certificate lists). The verdict for the last name asked is
/// kept in `seen`, so a connection asks the certificate once per name, not per request.
pub(crate) fn misdirected(
    sni: &Option<Box<[u8]>>,
    seen: &mut Option<(Box<[u8]>, bool)>,
    authority: &[u8],
    env: &Env<'_>,
) -> bool {
    let Some(sni) = sni else {
        return false;
    };
    if authority.is_empty() || authority.eq_ignore_ascii_case(sni) {
        return false;
    }
    if let Some((name, verdict)) = seen {
        if name[..].eq_ignore_ascii_case(authority) {
            return *verdict;
        }
    }
    let verdict = !env.coverage.is_some_and(|c| c.covers(authority));
    *seen = Some((authority.into(), verdict));
    verdict
}

/// Keeps `id` among the last [`RESET_MEMORY`] ids of a kind.
fn remember(ids: &mut VecDeque<u32>, id: u32) {
    if ids.len() == RESET_MEMORY {
        ids.pop_front();
    }
    ids.push_back(id);
}

/// A DATA or HEADERS payload without its padding (§6.1, §6.2).
fn unpad(h: Header, p: &[u8]) -> Result<&[u8], Fail> {
    if !h.has(flag::PADDED) {
        return Ok(p);
    }
    let Some((&pad, rest)) = p.split_first() else {
        return Err(fail(ErrorCode::FrameSize));
    };
    let pad = usize::from(pad);
    // Padding as long as the payload or longer (§6.1).
    if pad >= p.len() {
        return Err(fail(ErrorCode::Protocol));
    }
    Ok(&rest[..rest.len() - pad])
}

#[cfg(test)]
mod tests;

/// Appends a dynamic table size update.
fn hpack_size_update(out: &mut Vec<u8>, size: usize) {
    let max = 31usize;
    if size < max {
        out.push(0x20 | size as u8);
        return;
    }
    out.push(0x20 | max as u8);
    let mut v = size - max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}
