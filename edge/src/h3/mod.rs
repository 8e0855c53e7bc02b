//! HTTP/3 (RFC 9114) over any QUIC connection, sans I/O: the engine's QUIC driver hands each
//! stream's bytes in ([`H3Conn::on_request`], [`H3Conn::on_uni`]) and carries out the
//! [`Act`]s that come back. Requests go through the one decision path every protocol shares
//! ([`crate::session::respond`]): the same answers, clicks, read-through and denylist as HTTP/1
//! and HTTP/2, rendered once as HTTP/1 and transcoded into a QPACK field section
//! ([`qpack::transcode`]).
//!
//! - Control stream: the server's opens with SETTINGS ([`frame::control_preamble`]); the
//!   client's must open with SETTINGS, may not close, and may not carry request frames.
//! - QPACK static table only (`QPACK_MAX_TABLE_CAPACITY` left at 0): a field section that
//!   references a dynamic table closes the connection (QPACK_DECOMPRESSION_FAILED); the
//!   encoder and decoder streams are accepted and their bytes (which can only set the
//!   capacity to 0) dropped.
//! - Unknown frame, stream and setting types (GREASE) are skipped; HTTP/2's reserved frame
//!   types and settings are connection errors.
//! - A request section larger than `max_field_section_size` (`--h2-max-header-list-size`,
//!   which this server also announces) is answered 431 and the rest of the stream refused.
//! - Drain: GOAWAY naming the first request stream not served; later streams get
//!   H3_REQUEST_REJECTED.

pub mod frame;
pub mod qpack;

use crate::h2::hpack::{self, BlockLimits, Fields, Problem};
use crate::http::{HttpError, Method};
use crate::origin_cache::OriginAnswer;
use crate::render;
use crate::session::{self, Effect, Effects, Env, How, Out, Parked, Reply};

/// HTTP/3 error codes (RFC 9114 §8.1, RFC 9204 §6).
pub mod code {
    pub const NO_ERROR: u64 = 0x100;
    pub const GENERAL_PROTOCOL_ERROR: u64 = 0x101;
    pub const INTERNAL_ERROR: u64 = 0x102;
    pub const STREAM_CREATION_ERROR: u64 = 0x103;
    pub const CLOSED_CRITICAL_STREAM: u64 = 0x104;
    pub const FRAME_UNEXPECTED: u64 = 0x105;
    pub const FRAME_ERROR: u64 = 0x106;
    pub const EXCESSIVE_LOAD: u64 = 0x107;
    pub const ID_ERROR: u64 = 0x108;
    pub const SETTINGS_ERROR: u64 = 0x109;
    pub const MISSING_SETTINGS: u64 = 0x10a;
    pub const REQUEST_REJECTED: u64 = 0x10b;
    pub const REQUEST_CANCELLED: u64 = 0x10c;
    pub const REQUEST_INCOMPLETE: u64 = 0x10d;
    pub const MESSAGE_ERROR: u64 = 0x10e;
    pub const QPACK_DECOMPRESSION_FAILED: u64 = 0x200;
}

/// What a connection accepts.
#[derive(Debug, Clone, Copy)]
pub struct H3Limits {
    /// The largest request field section (name + value + 32 per field, RFC 9114 §4.2.2),
    /// announced as SETTINGS_MAX_FIELD_SECTION_SIZE.
    pub max_field_section_size: u64,
    /// The most fields in one section.
    pub max_fields: u32,
}

impl Default for H3Limits {
    fn default() -> Self {
        H3Limits {
            max_field_section_size: 16_384,
            max_fields: 100,
        }
    }
}

/// What the HTTP/3 layer asks of the QUIC connection under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Act {
    /// Write `data` on our control stream.
    Control(Vec<u8>),
    /// Write `data` on request stream `stream`, then finish it.
    Answer { stream: u64, data: Vec<u8> },
    /// Ask the peer to stop sending on `stream` (its request's rest is not wanted).
    StopSending { stream: u64, code: u64 },
    /// Abandon `stream`: RESET_STREAM, and STOP_SENDING for what is still coming.
    Reset { stream: u64, code: u64 },
    /// Close the connection with an application error.
    Close { code: u64, reason: &'static str },
}

/// A request stream being received.
#[derive(Debug)]
struct ReqStream {
    id: u64,
    buf: Vec<u8>,
    /// The request's fields, once its HEADERS frame is in.
    fields: Option<Fields>,
}

/// A request waiting for the origin.
#[derive(Debug)]
struct ParkedRequest {
    id: u64,
    fields: Fields,
    parked: Parked,
    how: How,
}

/// A unidirectional stream of the peer's.
#[derive(Debug)]
struct Uni {
    id: u64,
    /// Its type, once the first varint is in.
    kind: Option<u64>,
    buf: Vec<u8>,
    /// The control stream's SETTINGS came.
    settings: bool,
}

/// One HTTP/3 connection's state.
#[derive(Debug)]
pub struct H3Conn {
    limits: H3Limits,
    prefetcher: crate::answer::Prefetcher,
    requests: Vec<ReqStream>,
    parked: Vec<ParkedRequest>,
    uni: Vec<Uni>,
    peer_settings: Option<frame::Settings>,
    /// GOAWAY sent naming this stream id: it and later ones are not served.
    goaway: Option<u64>,
    /// The highest client-initiated bidirectional stream id seen (what GOAWAY names). Streams
    /// may arrive out of order: a lower id first seen later is a new request, not a late one
    /// (the transport delivers nothing on a stream after its end or after STOP_SENDING).
    last_request: Option<u64>,
    /// The SNI the client named (421 for another host the certificate does not cover).
    sni: Option<Box<[u8]>>,
    authority_seen: Option<(Box<[u8]>, bool)>,
    h1: Vec<u8>,
    /// Scratch, kept between requests: a field section being encoded, a frame's payload, and
    /// the fields of the last request answered (their buffers reused by the next).
    block: Vec<u8>,
    payload: Vec<u8>,
    spare: Fields,
    closed: bool,
}

/// The client's unidirectional streams HTTP/3 knows: one of each, never closed or reset
/// (RFC 9114 §6.2.1).
const CRITICAL: [u64; 3] = [
    frame::stream::CONTROL,
    frame::stream::QPACK_ENCODER,
    frame::stream::QPACK_DECODER,
];

/// A frame that no stream of the peer's may carry to a server: a connection error.
fn forbidden_anywhere(kind: u64) -> bool {
    frame::kind::reserved_h2(kind) || kind == frame::kind::PUSH_PROMISE
}

impl H3Conn {
    /// A connection, and the opening of its control stream (to be written first).
    pub fn new(limits: H3Limits, sni: Option<&str>) -> (H3Conn, Vec<u8>) {
        let mut control = Vec::with_capacity(32);
        frame::control_preamble(limits.max_field_section_size, &mut control);
        let conn = H3Conn {
            limits,
            prefetcher: Default::default(),
            requests: Vec::new(),
            parked: Vec::new(),
            uni: Vec::new(),
            peer_settings: None,
            goaway: None,
            last_request: None,
            sni: sni.map(|s| s.as_bytes().to_ascii_lowercase().into_boxed_slice()),
            authority_seen: None,
            h1: Vec::with_capacity(512),
            block: Vec::with_capacity(512),
            payload: Vec::new(),
            spare: Fields::default(),
            closed: false,
        };
        (conn, control)
    }

    /// What the peer's SETTINGS said, once they came.
    pub fn peer_settings(&self) -> Option<frame::Settings> {
        self.peer_settings
    }

    /// Requests waiting for the origin.
    pub fn waiting_origin(&self) -> bool {
        !self.parked.is_empty()
    }

    /// Requests received but not answered yet.
    pub fn open_requests(&self) -> usize {
        self.requests.len() + self.parked.len()
    }

    /// GOAWAY went out and every request before it is answered: the connection can close.
    pub fn done(&self) -> bool {
        self.closed || (self.goaway.is_some() && self.open_requests() == 0)
    }

    fn close(&mut self, acts: &mut Vec<Act>, code: u64, reason: &'static str) {
        if !self.closed {
            self.closed = true;
            acts.push(Act::Close { code, reason });
        }
    }

    /// SIGTERM: GOAWAY naming the first request stream that will not be served.
    pub fn drain(&mut self, acts: &mut Vec<Act>) {
        if self.goaway.is_some() || self.closed {
            return;
        }
        let id = self.last_request.map_or(0, |id| id + 4);
        self.goaway = Some(id);
        let mut out = Vec::with_capacity(8);
        frame::goaway(id, &mut out);
        acts.push(Act::Control(out));
    }

    /// Bytes on the client's bidirectional stream `id` (`fin`: the stream ended with them).
    #[allow(clippy::too_many_arguments)]
    pub fn on_request(
        &mut self,
        id: u64,
        data: &[u8],
        fin: bool,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        acts: &mut Vec<Act>,
    ) {
        if self.closed {
            return;
        }
        let i = match self.requests.iter().position(|r| r.id == id) {
            Some(i) => i,
            None => {
                if self.parked.iter().any(|p| p.id == id) {
                    // More after the request ended: answered when the origin replies.
                    return;
                }
                self.last_request = Some(self.last_request.map_or(id, |last| last.max(id)));
                if self.goaway.is_some_and(|g| id >= g) {
                    acts.push(Act::Reset {
                        stream: id,
                        code: code::REQUEST_REJECTED,
                    });
                    return;
                }
                self.requests.push(ReqStream {
                    id,
                    buf: Vec::new(),
                    fields: None,
                });
                self.requests.len() - 1
            }
        };
        self.requests[i].buf.extend_from_slice(data);
        if let Err((code, reason)) = self.parse_request(i, fin, how, env, fx, acts) {
            self.close(acts, code, reason);
        }
    }

    /// Works through request `i`'s buffered frames. `Err`: a connection error.
    fn parse_request(
        &mut self,
        i: usize,
        fin: bool,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        acts: &mut Vec<Act>,
    ) -> Result<(), (u64, &'static str)> {
        let max_section = self.limits.max_field_section_size;
        loop {
            let r = &mut self.requests[i];
            let Some(h) = frame::header(&r.buf) else {
                if r.buf.len() > 16 {
                    return Err((code::FRAME_ERROR, "frame header"));
                }
                break;
            };
            if forbidden_anywhere(h.kind)
                || matches!(
                    h.kind,
                    frame::kind::SETTINGS
                        | frame::kind::GOAWAY
                        | frame::kind::MAX_PUSH_ID
                        | frame::kind::CANCEL_PUSH
                )
            {
                return Err((code::FRAME_UNEXPECTED, "control frame on a request stream"));
            }
            let whole = h.header_len as u64 + h.len;
            if h.kind == frame::kind::DATA {
                if r.fields.is_none() {
                    return Err((code::FRAME_UNEXPECTED, "DATA before HEADERS"));
                }
                if h.len > 0 {
                    // Only GET and HEAD get this far (any other method is answered on its
                    // HEADERS), and they take no body: 400, the rest of the stream refused.
                    self.body_refused(i, how, env, fx, acts);
                    self.requests.swap_remove(i);
                    return Ok(());
                }
                r.buf.drain(..h.header_len);
                continue;
            }
            if h.kind == frame::kind::HEADERS && h.len > max_section {
                if r.fields.is_some() {
                    return Err((code::EXCESSIVE_LOAD, "trailers too large"));
                }
                // Answered 431 without reading it; the rest of the stream is refused.
                let id = r.id;
                self.error_answer(id, HttpError::HeadersTooLarge, how, env, fx, acts);
                acts.push(Act::StopSending {
                    stream: id,
                    code: code::NO_ERROR,
                });
                self.requests.swap_remove(i);
                return Ok(());
            }
            if h.kind != frame::kind::HEADERS && whole > max_section + 64 {
                // An unknown frame this large is not skipped by buffering it whole.
                return Err((code::EXCESSIVE_LOAD, "unknown frame too large"));
            }
            if (r.buf.len() as u64) < whole {
                break;
            }
            let mut payload = std::mem::take(&mut self.payload);
            payload.clear();
            payload.extend_from_slice(&r.buf[h.header_len..whole as usize]);
            r.buf.drain(..whole as usize);
            if h.kind != frame::kind::HEADERS {
                self.payload = payload;
                continue; // unknown (GREASE): skipped
            }
            if r.fields.is_some() {
                // Trailers: checked as a section, then dropped; nothing may follow them.
                let mut t = Fields::default();
                if let Err(Problem::Compression) = self.section(&payload, true, env, &mut t) {
                    return Err((code::QPACK_DECOMPRESSION_FAILED, "field section"));
                }
                self.payload = payload;
                continue;
            }
            // The last answered request's buffers, reused (a return on the way below only
            // loses their capacity, as it does the payload's).
            let mut f = std::mem::take(&mut self.spare);
            let decoded = self.section(&payload, false, env, &mut f);
            self.payload = payload;
            match decoded {
                Err(Problem::Compression) => {
                    return Err((code::QPACK_DECOMPRESSION_FAILED, "field section"));
                }
                Err(Problem::Malformed) => {
                    let id = self.requests.swap_remove(i).id;
                    acts.push(Act::Reset {
                        stream: id,
                        code: code::MESSAGE_ERROR,
                    });
                    return Ok(());
                }
                Err(Problem::TooLarge) => {
                    let id = self.requests[i].id;
                    self.error_answer(id, HttpError::HeadersTooLarge, how, env, fx, acts);
                    acts.push(Act::StopSending {
                        stream: id,
                        code: code::NO_ERROR,
                    });
                    self.requests.swap_remove(i);
                    return Ok(());
                }
                Ok(()) => {}
            }
            let method = f.method();
            self.requests[i].fields = Some(f);
            if method == Method::Other {
                // Not ours whatever its body: answered now, the rest refused.
                let r = self.requests.swap_remove(i);
                acts.push(Act::StopSending {
                    stream: r.id,
                    code: code::NO_ERROR,
                });
                self.answer(r.id, r.fields.unwrap_or_default(), how, env, fx, acts);
                return Ok(());
            }
        }
        if fin {
            let r = self.requests.swap_remove(i);
            match r.fields {
                None => acts.push(Act::Reset {
                    stream: r.id,
                    code: code::REQUEST_INCOMPLETE,
                }),
                Some(f) => {
                    if f.content_length.is_some_and(|cl| cl != 0) {
                        acts.push(Act::Reset {
                            stream: r.id,
                            code: code::MESSAGE_ERROR,
                        });
                    } else {
                        self.answer(r.id, f, how, env, fx, acts);
                    }
                }
            }
        }
        Ok(())
    }

    /// A GET or HEAD with a body: 400, as HTTP/1 and HTTP/2 answer it.
    fn body_refused(
        &mut self,
        i: usize,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        acts: &mut Vec<Act>,
    ) {
        let id = self.requests[i].id;
        self.error_answer(id, HttpError::BodyNotAllowed, how, env, fx, acts);
        acts.push(Act::StopSending {
            stream: id,
            code: code::NO_ERROR,
        });
    }

    fn section(
        &self,
        block: &[u8],
        trailers: bool,
        env: &Env<'_>,
        f: &mut Fields,
    ) -> Result<(), Problem> {
        let lim = BlockLimits {
            max_list: self.limits.max_field_section_size as usize,
            max_fields: self.limits.max_fields as usize,
        };
        let (prefetcher, tables, fixed) = (&self.prefetcher, env.tables, env.fixed);
        hpack::collect(
            |field| qpack::decode(block, field).is_ok(),
            trailers,
            lim,
            env.limits,
            f,
            |path| {
                if !fixed {
                    prefetcher.prefetch_path(path, tables);
                }
            },
        )
    }

    fn error_answer(
        &mut self,
        id: u64,
        e: HttpError,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        acts: &mut Vec<Act>,
    ) {
        self.h1.clear();
        render::render_error(e, env.headers.lines(how.https), &mut self.h1);
        fx.effect(Effect::Answered {
            status: e.status(),
            layer: Some(crate::answer::Layer::Invalid),
        });
        self.send(id, acts);
    }

    /// Answers a whole request through the shared decision path.
    fn answer(
        &mut self,
        id: u64,
        f: Fields,
        how: How,
        env: &Env<'_>,
        fx: &mut impl Effects,
        acts: &mut Vec<Act>,
    ) {
        self.h1.clear();
        if h2_misdirected(&self.sni, &mut self.authority_seen, f.authority(), env) {
            render::render_misdirected(env.headers.lines(how.https), &mut self.h1);
            fx.effect(Effect::Answered {
                status: 421,
                layer: Some(crate::answer::Layer::Invalid),
            });
            return self.send(id, acts);
        }
        let req = f.request(env.limits);
        let reply = session::respond(
            &req,
            how,
            &mut self.prefetcher,
            env,
            fx,
            &mut Out::H1(&mut self.h1),
        );
        match reply {
            Reply::Done { .. } => {
                self.send(id, acts);
                self.spare = f;
            }
            Reply::Parked(parked) => self.parked.push(ParkedRequest {
                id,
                fields: f,
                parked,
                how,
            }),
        }
    }

    /// The origin replied for `code`: answers the oldest request parked on it.
    pub fn on_origin(
        &mut self,
        code: &[u8],
        reply: &OriginAnswer,
        env: &Env<'_>,
        fx: &mut impl Effects,
        acts: &mut Vec<Act>,
    ) {
        let found = self
            .parked
            .iter()
            .position(|p| session::asks_for(&p.fields.request(env.limits), env.tables, code));
        let Some(i) = found else {
            return;
        };
        let p = self.parked.remove(i);
        let req = p.fields.request(env.limits);
        self.h1.clear();
        session::respond_origin(
            &req,
            p.parked,
            reply,
            p.how,
            env,
            fx,
            &mut Out::H1(&mut self.h1),
        );
        self.send(p.id, acts);
    }

    /// Sends the HTTP/1 rendering in `self.h1` on `id` as HEADERS (and DATA for a body).
    fn send(&mut self, id: u64, acts: &mut Vec<Act>) {
        let mut block = std::mem::take(&mut self.block);
        block.clear();
        let Some(body) = qpack::transcode(&self.h1, &mut block) else {
            acts.push(Act::Reset {
                stream: id,
                code: code::INTERNAL_ERROR,
            });
            return;
        };
        let mut data = Vec::with_capacity(block.len() + body.len() + 16);
        frame::put_frame(&mut data, frame::kind::HEADERS, &block);
        if !body.is_empty() {
            frame::put_frame(&mut data, frame::kind::DATA, &self.h1[body]);
        }
        self.block = block;
        acts.push(Act::Answer { stream: id, data });
    }

    /// The client reset its stream `id` (RESET_STREAM): a request on it is forgotten, unanswered;
    /// a critical stream's reset is a connection error (RFC 9114 §6.2.1).
    pub fn on_reset(&mut self, id: u64, acts: &mut Vec<Act>) {
        if self.closed {
            return;
        }
        self.requests.retain(|r| r.id != id);
        self.parked.retain(|p| p.id != id);
        if let Some(i) = self.uni.iter().position(|u| u.id == id) {
            if self.uni[i].kind.is_some_and(|k| CRITICAL.contains(&k)) {
                self.close(acts, code::CLOSED_CRITICAL_STREAM, "critical stream reset");
            } else {
                self.uni.swap_remove(i);
            }
        }
    }

    /// Bytes on the client's unidirectional stream `id`.
    pub fn on_uni(&mut self, id: u64, data: &[u8], fin: bool, acts: &mut Vec<Act>) {
        if self.closed {
            return;
        }
        let i = match self.uni.iter().position(|u| u.id == id) {
            Some(i) => i,
            None => {
                if self.uni.len() >= 16 {
                    // Far more than HTTP/3 needs (control and two QPACK streams).
                    acts.push(Act::StopSending {
                        stream: id,
                        code: code::STREAM_CREATION_ERROR,
                    });
                    return;
                }
                self.uni.push(Uni {
                    id,
                    kind: None,
                    buf: Vec::new(),
                    settings: false,
                });
                self.uni.len() - 1
            }
        };
        if let Err((code, reason)) = self.parse_uni(i, data, fin, acts) {
            self.close(acts, code, reason);
        }
    }

    fn parse_uni(
        &mut self,
        i: usize,
        data: &[u8],
        fin: bool,
        acts: &mut Vec<Act>,
    ) -> Result<(), (u64, &'static str)> {
        let u = &mut self.uni[i];
        if u.kind.is_none() {
            u.buf.extend_from_slice(data);
            let Some((kind, n)) = frame::varint(&u.buf) else {
                return Ok(());
            };
            u.buf.drain(..n);
            if CRITICAL.contains(&kind) && self.uni.iter().any(|o| o.kind == Some(kind)) {
                return Err((code::STREAM_CREATION_ERROR, "a second critical stream"));
            }
            let u = &mut self.uni[i];
            u.kind = Some(kind);
            if kind == frame::stream::PUSH {
                return Err((code::STREAM_CREATION_ERROR, "a push stream from the client"));
            }
            if !CRITICAL.contains(&kind) {
                // Unknown (GREASE among them): not read.
                u.buf = Vec::new();
                acts.push(Act::StopSending {
                    stream: u.id,
                    code: code::STREAM_CREATION_ERROR,
                });
                return Ok(());
            }
        } else {
            u.buf.extend_from_slice(data);
        }
        let u = &mut self.uni[i];
        match u.kind {
            Some(frame::stream::CONTROL) => {
                self.control_frames(i)?;
                if fin {
                    return Err((code::CLOSED_CRITICAL_STREAM, "control stream closed"));
                }
            }
            Some(frame::stream::QPACK_ENCODER | frame::stream::QPACK_DECODER) => {
                // With no dynamic table there is nothing to act on (RFC 9204 §4.2).
                u.buf.clear();
                if fin {
                    return Err((code::CLOSED_CRITICAL_STREAM, "QPACK stream closed"));
                }
            }
            _ => u.buf.clear(),
        }
        Ok(())
    }

    fn control_frames(&mut self, i: usize) -> Result<(), (u64, &'static str)> {
        loop {
            let u = &mut self.uni[i];
            let Some(h) = frame::header(&u.buf) else {
                if u.buf.len() > 16 {
                    return Err((code::FRAME_ERROR, "frame header"));
                }
                return Ok(());
            };
            let whole = h.header_len as u64 + h.len;
            if whole > 4096 + 16 {
                return Err((code::EXCESSIVE_LOAD, "control frame too large"));
            }
            if !u.settings && h.kind != frame::kind::SETTINGS {
                return Err((code::MISSING_SETTINGS, "control stream without SETTINGS"));
            }
            if forbidden_anywhere(h.kind)
                || matches!(h.kind, frame::kind::DATA | frame::kind::HEADERS)
                || (u.settings && h.kind == frame::kind::SETTINGS)
            {
                return Err((code::FRAME_UNEXPECTED, "frame not allowed on control"));
            }
            if (u.buf.len() as u64) < whole {
                return Ok(());
            }
            let payload: Vec<u8> = u.buf[h.header_len..whole as usize].to_vec();
            u.buf.drain(..whole as usize);
            match h.kind {
                frame::kind::SETTINGS => {
                    u.settings = true;
                    match frame::settings(&payload) {
                        Ok(s) => self.peer_settings = Some(s),
                        Err(frame::SettingsError::Frame) => {
                            return Err((code::FRAME_ERROR, "SETTINGS"))
                        }
                        Err(frame::SettingsError::Settings) => {
                            return Err((code::SETTINGS_ERROR, "SETTINGS"))
                        }
                    }
                }
                // A client's GOAWAY names push ids, and this server never pushes: each of these
                // is one varint, checked and dropped.
                frame::kind::GOAWAY | frame::kind::MAX_PUSH_ID | frame::kind::CANCEL_PUSH
                    if frame::varint(&payload).map(|(_, n)| n) != Some(payload.len()) =>
                {
                    return Err((code::FRAME_ERROR, "control frame"));
                }
                _ => {} // unknown: skipped
            }
        }
    }
}

fn h2_misdirected(
    sni: &Option<Box<[u8]>>,
    seen: &mut Option<(Box<[u8]>, bool)>,
    authority: &[u8],
    env: &Env<'_>,
) -> bool {
    crate::h2::misdirected(sni, seen, authority, env)
}

#[cfg(test)]
mod tests;
