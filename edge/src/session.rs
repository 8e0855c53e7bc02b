//! One connection's HTTP protocol state, as a state machine fed bytes, origin replies and the
//! time (docs/ARCHITECTURE.md, "Code"; the models are smoltcp's sockets and quinn's `Connection`).
//! It never touches a socket, a thread or a clock: the I/O loop (io_uring, epoll, the kernel-bypass
//! one to come, and the TLS layer above any of them) hands it what it received with [`Env`] (the
//! tables, the limits and `now`), sends what it rendered into [`Session::out`], and carries out the
//! [`Effect`]s it reports: ask the origin for a code, record a click, count an answer.
//!
//! Requests are answered in order (pipelining): a request that needs the origin parks the
//! connection with its bytes still in [`Session::inbuf`], and the requests behind it wait; the
//! origin's reply, handed to [`Session::on_origin`], finishes the parked decision (the decode
//! and the table walk are not done again) and the rest are answered.
//!
//! Effects go through a sink ([`Effects`]) rather than a returned list: a request costs no
//! allocation, and an effect can borrow the request's bytes (a click record reads its headers).

use crate::answer::{self, Answer, Layer};
use crate::h2::H2Conn;
use crate::http::{self, Limits, Method, Parse, Request};
use crate::origin_cache::OriginAnswer;
use crate::render::{self, Pages};
use crate::tables::Tables;

/// Largest response backlog before a connection stops reading (a pipelining client that never
/// reads its answers must not grow our memory).
pub const MAX_PENDING_OUT: usize = 256 * 1024;

/// What a session reads for one call: the core's current tables and settings, and `now`.
#[derive(Debug, Clone, Copy)]
pub struct Env<'a> {
    pub tables: &'a Tables,
    pub limits: &'a Limits,
    pub pages: &'a Pages,
    /// The header lines every answer carries (`Date`, and HSTS on HTTPS).
    pub headers: &'a Headers,
    /// Wall clock, Unix milliseconds.
    pub now_ms: i64,
    /// Floor mode (`--fixed-response`): every request gets the same 302, nothing is looked up.
    pub fixed: bool,
    /// `--redirect-http-to-https`: the HTTPS port plain-listener requests are sent to.
    pub https_redirect: Option<u16>,
    /// The names the HTTPS listener's certificate covers (HTTP/2's 421 for a coalesced
    /// connection, RFC 9113 §9.1.2); `None` on a plain-only engine.
    pub coverage: Option<&'a dyn Coverage>,
}

/// Whether a host name is one the served certificate is valid for (the engine asks the
/// certificate; the pure crate only asks).
pub trait Coverage: std::fmt::Debug + Sync {
    fn covers(&self, host: &[u8]) -> bool;
}

/// What a session asks of the loop that drives it, in the order it happens. Exhaustive on
/// purpose: the engine matches every variant, so a new one is a compile error there, not an
/// effect silently dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect<'a> {
    /// Look `code` up at the origin and hand the answer to [`Session::on_origin`]; the
    /// connection is parked until then.
    NeedOrigin {
        code: &'a [u8],
        /// The origin may remember a 404 for it (see [`Answer::NeedOrigin`]).
        cache_negative: bool,
    },
    /// A redirect was served for `code`: the click hook (the hot-code sketch, the click record).
    Click {
        req: &'a Request<'a>,
        code: &'a [u8],
        /// The branded domain it was on; empty for the default domain.
        domain: &'a [u8],
        /// How it arrived: over TLS, in early data, the HTTP version.
        how: How,
    },
    /// An answer was rendered: its status, and the layer that settled it (`None` for answers
    /// no table was asked about: the fixed response, the HTTPS redirect).
    Answered { status: u16, layer: Option<Layer> },
    /// A request in TLS early data that is not GET/HEAD got 425.
    TooEarly,
    /// The first redirect of a link the feed brought, `after_ms` after its creation.
    FirstRedirect { after_ms: i64 },
    /// Safe mode could not confirm a locally found link at the origin: it was served from the
    /// local tables.
    Unconfirmed,
    /// What an HTTP/2 connection did (metrics).
    H2(crate::h2::Event),
}

/// Where a session's effects go.
pub trait Effects {
    fn effect(&mut self, effect: Effect<'_>);
}

/// The header lines of every answer: `Date` (RFC 9110 §6.6.1: a server with a clock sends it),
/// formatted once per second per core rather than per request, and on HTTPS the
/// `Strict-Transport-Security` line after it.
#[derive(Debug, Default, Clone)]
pub struct Headers {
    second: Option<i64>,
    plain: Vec<u8>,
    https: Vec<u8>,
}

impl Headers {
    /// Rebuilds the lines when `now_ms` is in another second than the last call.
    pub fn refresh(&mut self, now_ms: i64, hsts: &[u8]) {
        let second = now_ms.div_euclid(1000);
        if self.second == Some(second) {
            return;
        }
        self.second = Some(second);
        let when = std::time::UNIX_EPOCH
            + std::time::Duration::from_secs(u64::try_from(second).unwrap_or(0));
        self.plain.clear();
        self.plain.extend_from_slice(b"Date: ");
        self.plain
            .extend_from_slice(httpdate::fmt_http_date(when).as_bytes());
        self.plain.extend_from_slice(b"\r\n");
        self.https.clear();
        self.https.extend_from_slice(&self.plain);
        self.https.extend_from_slice(hsts);
    }

    /// The lines for a plain or an HTTPS connection.
    pub fn lines(&self, https: bool) -> &[u8] {
        if https {
            &self.https
        } else {
            &self.plain
        }
    }
}

/// What a parked request already learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Parked {
    preview: bool,
    /// Found locally, sent to be confirmed (safe mode).
    confirming: bool,
}

/// Per-connection protocol state.
#[derive(Default)]
pub struct Session {
    /// Received bytes not yet answered (partial request, or requests behind an origin wait).
    pub inbuf: Vec<u8>,
    /// Rendered answers not yet handed to the kernel.
    pub out: Vec<u8>,
    /// Close once `out` is sent.
    pub close_after_send: bool,
    /// Last time bytes arrived (idle timeout).
    pub last_active_ms: i64,
    /// When the oldest unanswered partial request started (header-read timeout).
    pub partial_since_ms: Option<i64>,
    /// Arrived over TLS: answers carry the `Strict-Transport-Security` header.
    pub https: bool,
    /// The bytes being fed are TLS 0-RTT early data: only GET and HEAD are answered (a replay
    /// of them changes nothing); anything else gets 425 Too Early.
    pub early: bool,
    /// The client's address, once known (click events hash it; it is never stored).
    pub peer: Option<std::net::IpAddr>,
    /// Parked on an origin lookup for the request at the front of `inbuf`.
    parked: Option<Parked>,
    /// How much of the snapshot this connection's requests fetch as they arrive.
    prefetcher: answer::Prefetcher,
    /// The connection speaks HTTP/2 (ALPN `h2`, or the preface on the plain listener).
    h2: Option<Box<H2Conn>>,
    /// The protocol is settled (the first bytes were looked at, or ALPN chose).
    decided: bool,
}

/// Without the peer address: a debug print must not put a client's address in a log.
impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("inbuf", &self.inbuf.len())
            .field("out", &self.out.len())
            .field("close_after_send", &self.close_after_send)
            .field("parked", &self.parked)
            .field("https", &self.https)
            .field("early", &self.early)
            .field("peer_known", &self.peer.is_some())
            .field("h2", &self.h2.is_some())
            .finish_non_exhaustive()
    }
}

/// What a plain connection's first bytes say it speaks.
enum Decision {
    /// Too few bytes to tell; they wait in `inbuf`.
    Wait,
    H1,
    /// HTTP/2, with the bytes seen so far.
    H2(Vec<u8>),
}

/// Result of handling one request.
enum Step {
    /// Answered; continue with the next request.
    Answered(usize),
    /// Needs more bytes.
    Partial,
    /// Parked on the origin.
    Parked,
    /// Protocol error answered; close.
    Closed,
}

impl Session {
    /// A fresh session at `now_ms`.
    pub fn new(now_ms: i64) -> Self {
        Session {
            last_active_ms: now_ms,
            ..Session::default()
        }
    }

    /// Parked on an origin lookup (HTTP/2: any stream is).
    pub fn waiting_origin(&self) -> bool {
        match &self.h2 {
            Some(h2) => h2.waiting_origin(),
            None => self.parked.is_some(),
        }
    }

    /// True while the connection should not read more (parked, closing, or backlogged). An
    /// HTTP/2 connection parks streams, not itself.
    pub fn paused(&self) -> bool {
        let parked = self.h2.is_none() && self.parked.is_some();
        parked || self.close_after_send || self.out.len() >= MAX_PENDING_OUT
    }

    /// Whether the connection speaks HTTP/2.
    pub fn is_h2(&self) -> bool {
        self.h2.is_some()
    }

    /// ALPN chose `h2`: the connection speaks HTTP/2 from its first byte. `sni` is the name
    /// the client asked for in its ClientHello, when it sent one: a request for a name neither
    /// it nor the certificate covers gets 421 (RFC 9113 §9.1.2).
    pub fn start_h2(&mut self, sni: Option<&str>, env: &Env<'_>, fx: &mut impl Effects) {
        if self.decided {
            return;
        }
        self.decided = true;
        let mut h2 = H2Conn::new(env.limits.h2, env.now_ms, &mut self.out, fx);
        h2.sni = sni.map(|s| s.as_bytes().to_ascii_lowercase().into_boxed_slice());
        self.h2 = Some(Box::new(h2));
    }

    /// The connection preface arrived on the plain listener (h2c): no SNI.
    fn start_h2c(&mut self, env: &Env<'_>, fx: &mut impl Effects) {
        self.start_h2(None, env, fx);
    }

    /// SIGTERM: an HTTP/2 connection sends GOAWAY with its last stream and closes once its
    /// open streams are answered. HTTP/1 connections finish as they are.
    pub fn drain(&mut self, fx: &mut impl Effects) {
        if let Some(h2) = &mut self.h2 {
            h2.drain(&mut self.out, fx);
            self.close_after_send |= h2.done();
        }
    }

    /// Ends a connection [`Session::expired`] found stale: an HTTP/2 one says GOAWAY first.
    /// The loop sends what is in `out` and closes.
    pub fn goodbye(&mut self, now_ms: i64, idle_ms: i64, header_ms: i64, fx: &mut impl Effects) {
        if let Some(h2) = &mut self.h2 {
            h2.goodbye(now_ms, idle_ms, header_ms, &mut self.out, fx);
        }
        self.close_after_send = true;
    }

    fn how(&self) -> How {
        How {
            early: self.early,
            https: self.https,
            proto: if self.h2.is_some() {
                Proto::H2
            } else {
                Proto::H1
            },
        }
    }

    /// Whether the connection has outstayed its welcome at `now_ms`: idle for longer than
    /// `idle_ms`, or a request head unfinished for longer than `header_ms`. A connection parked
    /// on the origin is waiting on us, not the other way round.
    pub fn expired(&self, now_ms: i64, idle_ms: i64, header_ms: i64) -> bool {
        if let Some(h2) = &self.h2 {
            return h2.is_expired(now_ms, idle_ms, header_ms);
        }
        self.parked.is_none()
            && (now_ms - self.last_active_ms > idle_ms
                || self
                    .partial_since_ms
                    .is_some_and(|t| now_ms - t > header_ms))
    }

    /// Feeds bytes just received and answers every complete request in them.
    pub fn on_input(&mut self, data: &[u8], env: &Env<'_>, fx: &mut impl Effects) {
        self.last_active_ms = env.now_ms;
        if self.close_after_send {
            return; // answering nothing more on a closing connection
        }
        if !self.decided {
            match self.decide(data, env, fx) {
                Decision::Wait => {
                    self.note_partial(env.now_ms);
                    return;
                }
                Decision::H2(bytes) => {
                    self.h2_input(&bytes, env, fx);
                    return;
                }
                Decision::H1 => {}
            }
        }
        if self.h2.is_some() {
            self.h2_input(data, env, fx);
            return;
        }
        if self.inbuf.is_empty() && self.parked.is_none() {
            // Fast path: parse straight from the receive buffer, copy only a leftover tail.
            let used = self.process(data, env, fx);
            if used < data.len() && !self.close_after_send {
                self.inbuf.extend_from_slice(&data[used..]);
            }
        } else {
            self.inbuf.extend_from_slice(data);
            self.drive(env, fx);
        }
        self.note_partial(env.now_ms);
    }

    /// The first bytes of a plain connection: the HTTP/2 preface (h2c with prior knowledge,
    /// RFC 9113 §3.3) when h2c is on, else HTTP/1.
    fn decide(&mut self, data: &[u8], env: &Env<'_>, fx: &mut impl Effects) -> Decision {
        if self.https || !env.limits.h2.h2c {
            self.decided = true;
            return Decision::H1;
        }
        // "PRI " tells: no HTTP/1 request we answer starts so.
        if self.inbuf.is_empty() && data.len() >= 4 {
            if !crate::h2::starts_like_preface(data) {
                self.decided = true;
                return Decision::H1;
            }
            self.start_h2c(env, fx);
            return Decision::H2(data.to_vec());
        }
        let mut seen = self.inbuf.clone();
        seen.extend_from_slice(data);
        let like = crate::h2::starts_like_preface(&seen);
        if seen.len() < 4 && like {
            self.inbuf = seen;
            return Decision::Wait;
        }
        if like {
            self.inbuf.clear();
            self.start_h2c(env, fx);
            return Decision::H2(seen);
        }
        self.decided = true;
        Decision::H1
    }

    fn h2_input(&mut self, data: &[u8], env: &Env<'_>, fx: &mut impl Effects) {
        let how = self.how();
        if let Some(h2) = &mut self.h2 {
            h2.on_input(data, how, env, fx, &mut self.out);
            self.close_after_send |= h2.done();
        }
    }

    /// The origin answered `code` for this connection: HTTP/1 finishes its parked request,
    /// HTTP/2 the oldest stream parked on that code.
    pub fn on_origin_for(
        &mut self,
        code: &[u8],
        reply: &OriginAnswer,
        env: &Env<'_>,
        fx: &mut impl Effects,
    ) {
        let how = self.how();
        match &mut self.h2 {
            Some(h2) => {
                h2.on_origin(code, reply, how, env, fx, &mut self.out);
                self.close_after_send |= h2.done();
            }
            None => self.on_origin(reply, env, fx),
        }
    }

    /// The origin answered the request this session is parked on: finish it, then answer what
    /// is queued behind it.
    pub fn on_origin(&mut self, reply: &OriginAnswer, env: &Env<'_>, fx: &mut impl Effects) {
        let Some(parked) = self.parked.take() else {
            return;
        };
        let buf = std::mem::take(&mut self.inbuf);
        let mut consumed = buf.len();
        // The request's bytes are parsed again for its headers (the click record reads them);
        // what the decision learnt (the code's validity, its mark, where it was found) is kept.
        if let Parse::Complete { req, consumed: n } = http::parse(&buf, env.limits) {
            consumed = n;
            let how = self.how();
            if respond_origin(
                &req,
                parked,
                reply,
                how,
                env,
                fx,
                &mut Out::H1(&mut self.out),
            ) {
                self.close_after_send = true;
            }
        } else {
            // Cannot happen (the bytes parsed before we parked); answer nothing and close.
            self.close_after_send = true;
        }
        let mut buf = buf;
        buf.drain(..consumed.min(buf.len()));
        self.inbuf = buf;
        if !self.close_after_send {
            self.drive(env, fx);
        }
        self.note_partial(env.now_ms);
    }

    fn note_partial(&mut self, now_ms: i64) {
        self.partial_since_ms = if self.inbuf.is_empty() || self.parked.is_some() {
            None
        } else {
            self.partial_since_ms.or(Some(now_ms))
        };
    }

    /// Answers whatever is buffered in `inbuf`.
    fn drive(&mut self, env: &Env<'_>, fx: &mut impl Effects) {
        if self.parked.is_some() {
            return;
        }
        let mut buf = std::mem::take(&mut self.inbuf);
        let used = self.process(&buf, env, fx);
        if self.close_after_send {
            buf.clear();
        } else {
            buf.drain(..used);
        }
        // Keep the allocation: a keep-alive connection reuses it.
        self.inbuf = buf;
    }

    /// Answers complete requests at the front of `buf`; returns the bytes consumed.
    fn process(&mut self, buf: &[u8], env: &Env<'_>, fx: &mut impl Effects) -> usize {
        let mut at = 0;
        while at < buf.len() && self.out.len() < MAX_PENDING_OUT {
            match self.one(&buf[at..], env, fx) {
                Step::Answered(n) => at += n,
                Step::Partial | Step::Parked => break,
                Step::Closed => return buf.len(),
            }
        }
        at
    }

    fn one(&mut self, buf: &[u8], env: &Env<'_>, fx: &mut impl Effects) -> Step {
        // The snapshot page's fetch first, so the parse and the decrypt hide its memory miss.
        self.prefetcher.prefetch(buf, env.tables);
        match http::parse(buf, env.limits) {
            Parse::Partial => Step::Partial,
            Parse::Error(e) => {
                let extra = env.headers.lines(self.https);
                render::render_error(e, extra, &mut self.out);
                fx.effect(Effect::Answered {
                    status: e.status(),
                    layer: Some(Layer::Invalid),
                });
                self.close_after_send = true;
                Step::Closed
            }
            Parse::Complete { req, consumed } => {
                let how = self.how();
                let mut out = Out::H1(&mut self.out);
                match respond(&req, how, &mut self.prefetcher, env, fx, &mut out) {
                    Reply::Parked(p) => {
                        self.parked = Some(p);
                        Step::Parked
                    }
                    Reply::Done { close: true } => {
                        self.close_after_send = true;
                        Step::Closed
                    }
                    Reply::Done { close: false } => Step::Answered(consumed),
                }
            }
        }
    }
}

/// The HTTP version a request arrived over (click events record it).
pub use lasthop_core::click::Protocol as Proto;

/// How the connection a request came on shapes its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct How {
    /// TLS 0-RTT early data: only GET and HEAD are answered.
    pub early: bool,
    /// Over TLS: answers carry HSTS, and the HTTPS redirect does not apply.
    pub https: bool,
    pub proto: Proto,
}

/// Where an answer is written.
pub(crate) enum Out<'a> {
    /// HTTP/1: the answer's bytes as they go on the wire.
    H1(&'a mut Vec<u8>),
    /// HTTP/2: the HTTP/1 rendering, transcoded afterwards; or, for a redirect (the common
    /// answer), its HPACK block written at once into `block` (`direct` set), the same fields
    /// as the transcode gives (a property test holds the two together).
    H2 {
        h1: &'a mut Vec<u8>,
        block: &'a mut Vec<u8>,
        direct: &'a mut bool,
        /// The connection's `Date` (and HSTS) lines, transcoded once a second.
        lines: &'a mut crate::h2::hpack::Lines,
    },
}

impl Out<'_> {
    /// Where an HTTP/1 rendering goes.
    pub(crate) fn h1(&mut self) -> &mut Vec<u8> {
        match self {
            Out::H1(out) => out,
            Out::H2 { h1, .. } => h1,
        }
    }
}

/// What answering one request came to.
pub(crate) enum Reply {
    /// Rendered into the output; `close` when the connection must close after it.
    Done { close: bool },
    /// Handed to the origin ([`Effect::NeedOrigin`] was reported); finish it with
    /// [`respond_origin`] when the reply comes.
    Parked(Parked),
}

/// Answers one parsed request, by the one decision path every protocol shares: the floor,
/// early data, the HTTPS redirect, then [`answer::decide`]. HTTP/1 answers land in `out` as
/// they go on the wire; HTTP/2 transcodes them into frames.
pub(crate) fn respond(
    req: &Request<'_>,
    how: How,
    prefetcher: &mut answer::Prefetcher,
    env: &Env<'_>,
    fx: &mut impl Effects,
    out: &mut Out<'_>,
) -> Reply {
    let extra = env.headers.lines(how.https);
    if env.fixed {
        render::render_fixed_with(extra, out.h1());
        fx.effect(Effect::Answered {
            status: 302,
            layer: None,
        });
        return Reply::Done { close: false };
    }
    if how.early && req.method == Method::Other {
        fx.effect(Effect::TooEarly);
        let close = finish(req, &Answer::TooEarly, Layer::Invalid, how, env, fx, out);
        return Reply::Done { close };
    }
    if let (false, Some(port)) = (how.https, env.https_redirect) {
        // A CA validates HTTP-01 over plain HTTP: its path goes on to the decision.
        if !answer::is_acme_challenge(req.path) {
            let (close, status) = render::render_https_redirect(req, port, extra, out.h1());
            fx.effect(Effect::Answered {
                status,
                layer: None,
            });
            return Reply::Done { close };
        }
    }
    let (answer, layer) = answer::decide(req, env.tables, env.now_ms);
    prefetcher.answered(layer);
    if let Answer::NeedOrigin {
        code,
        domain,
        preview,
        cache_negative,
        confirming,
    } = answer
    {
        // The origin is asked for the link's key: `domain/code` on a branded domain.
        let mut slot = None;
        let branded = domain.and_then(|_| env.tables.domains.find(req.host));
        let key = crate::domains::link_key(&mut slot, branded, code);
        fx.effect(Effect::NeedOrigin {
            code: key,
            cache_negative,
        });
        return Reply::Parked(Parked {
            preview,
            confirming,
        });
    }
    let close = finish(req, &answer, layer, how, env, fx, out);
    Reply::Done { close }
}

/// Finishes a request parked on the origin with its reply; returns whether the connection
/// closes after the answer.
pub(crate) fn respond_origin(
    req: &Request<'_>,
    parked: Parked,
    reply: &OriginAnswer,
    how: How,
    env: &Env<'_>,
    fx: &mut impl Effects,
    out: &mut Out<'_>,
) -> bool {
    let code = code_of(req.path);
    let t = env.tables;
    let (answer, layer) = match reply {
        // The feed may have brought the link while the request waited (an edit, a takedown):
        // what the tables know now is newer than a fetch that may have left before it.
        OriginAnswer::Found { .. } | OriginAnswer::NotFound if !parked.confirming => {
            match answer::decide_unconfirmed(req, t, env.now_ms) {
                (Answer::NeedOrigin { .. }, _) => answer::answer_from_origin(
                    code,
                    parked.preview,
                    t,
                    req.host,
                    reply.link(),
                    env.now_ms,
                ),
                local => local,
            }
        }
        OriginAnswer::Found { .. } | OriginAnswer::NotFound => {
            answer::answer_from_origin(code, parked.preview, t, req.host, reply.link(), env.now_ms)
        }
        // Safe mode could not confirm: redirect availability comes first, so answer
        // from the local tables (if they still know the code) and count it.
        OriginAnswer::Unavailable if parked.confirming => {
            match answer::decide_unconfirmed(req, t, env.now_ms) {
                (Answer::NeedOrigin { .. }, _) => (Answer::Unavailable, Layer::Origin),
                local => {
                    fx.effect(Effect::Unconfirmed);
                    local
                }
            }
        }
        OriginAnswer::Unavailable => (Answer::Unavailable, Layer::Origin),
    };
    finish(req, &answer, layer, how, env, fx, out)
}

/// Renders `answer` and reports its effects; returns whether the connection closes after it.
fn finish(
    req: &Request<'_>,
    answer: &Answer<'_>,
    layer: Layer,
    how: How,
    env: &Env<'_>,
    fx: &mut impl Effects,
    out: &mut Out<'_>,
) -> bool {
    // A branded domain's own HSTS replaces the listener's on its HTTPS answers.
    let domain = env.tables.domains.find(req.host);
    let branded_lines;
    let extra = match domain.and_then(|d| d.hsts.as_deref()) {
        Some(hsts) if how.https => {
            branded_lines = [env.headers.lines(false), hsts].concat();
            &branded_lines[..]
        }
        _ => env.headers.lines(how.https),
    };
    let close = match (out, answer) {
        (
            Out::H2 {
                block,
                direct,
                lines,
                ..
            },
            Answer::Redirect { url },
        ) if lasthop_core::is_servable(url) => {
            crate::h2::hpack::redirect(url, lines.of(extra), block);
            **direct = true;
            false
        }
        (out, _) => render::render_with(answer, req, extra, env.pages, out.h1()),
    };
    if let Answer::Redirect { .. } | Answer::RedirectWith { .. } = answer {
        let code = code_of(req.path);
        if layer == Layer::Overlay {
            // Creation-to-first-redirect: only links the feed brought carry a creation time.
            let mut slot = None;
            if let Some(link) = env
                .tables
                .overlay
                .get(crate::domains::link_key(&mut slot, domain, code))
            {
                if let Some(created) = link.created_at_ms {
                    if link.first_served.claim() {
                        fx.effect(Effect::FirstRedirect {
                            after_ms: env.now_ms - created,
                        });
                    }
                }
            }
        }
        let domain = domain.map_or(&b""[..], |d| &d.name);
        fx.effect(Effect::Click {
            req,
            code,
            domain,
            how,
        });
    }
    fx.effect(Effect::Answered {
        status: answer.status(),
        layer: Some(layer),
    });
    close
}

/// Whether `req` asks for the link whose key is `key` (its code, or `domain/code` when its
/// `Host` is a branded domain): how a multiplexed connection finds the request an origin reply
/// (sent for that key) belongs to.
pub(crate) fn asks_for(req: &Request<'_>, tables: &Tables, key: &[u8]) -> bool {
    let Some((code, _)) = answer::code_of(req.path) else {
        return false;
    };
    let mut slot = None;
    crate::domains::link_key(&mut slot, tables.domains.find(req.host), code) == key
}

/// The code part of a request path (`/abc1234+` → `abc1234`), by the decision's own rule.
fn code_of(path: &[u8]) -> &[u8] {
    answer::code_of(path).map_or(path, |(code, _)| code)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::answer::tests::{fixture, Fixture, ISSUED, NOW};

    /// The effects, owned, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Seen {
        NeedOrigin(String, bool),
        Click(String, String),
        Answered(u16, Option<Layer>),
        TooEarly,
        FirstRedirect(i64),
        Unconfirmed,
    }

    #[derive(Default)]
    struct Recorder(Vec<Seen>);

    impl Effects for Recorder {
        fn effect(&mut self, e: Effect<'_>) {
            let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
            self.0.push(match e {
                Effect::NeedOrigin {
                    code,
                    cache_negative,
                } => Seen::NeedOrigin(s(code), cache_negative),
                // A branded click is recorded by its key.
                Effect::Click {
                    req, code, domain, ..
                } if !domain.is_empty() => {
                    Seen::Click(format!("{}/{}", s(domain), s(code)), s(req.user_agent))
                }
                Effect::Click { req, code, .. } => Seen::Click(s(code), s(req.user_agent)),
                Effect::Answered { status, layer } => Seen::Answered(status, layer),
                Effect::TooEarly => Seen::TooEarly,
                Effect::FirstRedirect { after_ms } => Seen::FirstRedirect(after_ms),
                Effect::Unconfirmed => Seen::Unconfirmed,
                Effect::H2(_) => return,
            });
        }
    }

    impl Recorder {
        fn take(&mut self) -> Vec<Seen> {
            std::mem::take(&mut self.0)
        }
    }

    /// A core's surroundings with a fake clock (the HTTP/2 tests' too).
    pub(crate) struct Core {
        pub f: Fixture,
        pub limits: Limits,
        pub pages: Pages,
        pub headers: Headers,
        pub now_ms: i64,
        pub fixed: bool,
        pub https_redirect: Option<u16>,
        pub coverage: Option<&'static dyn Coverage>,
    }

    impl Core {
        pub fn new(has_origin: bool) -> Core {
            let mut headers = Headers::default();
            headers.refresh(NOW, b"Strict-Transport-Security: max-age=60\r\n");
            Core {
                f: fixture(has_origin),
                limits: Limits::default(),
                pages: Pages::default(),
                headers,
                now_ms: NOW,
                fixed: false,
                https_redirect: None,
                coverage: None,
            }
        }

        pub fn env(&self) -> Env<'_> {
            Env {
                tables: &self.f.tables,
                limits: &self.limits,
                pages: &self.pages,
                headers: &self.headers,
                now_ms: self.now_ms,
                fixed: self.fixed,
                https_redirect: self.https_redirect,
                coverage: self.coverage,
            }
        }
    }

    fn get(path: &str) -> String {
        format!("GET {path} HTTP/1.1\r\nHost: lh.example\r\nUser-Agent: t\r\n\r\n")
    }

    /// The statuses of the responses in `out`, in order.
    fn statuses(out: &[u8]) -> Vec<u16> {
        let text = String::from_utf8_lossy(out);
        text.match_indices("HTTP/1.1 ")
            .filter(|(i, _)| *i == 0 || text[..*i].ends_with('\n'))
            .map(|(i, _)| text[i + 9..i + 12].parse().unwrap())
            .collect()
    }

    fn feed(s: &mut Session, core: &Core, fx: &mut Recorder, bytes: &str) {
        s.on_input(bytes.as_bytes(), &core.env(), fx);
    }

    #[test]
    fn a_branded_domain_answers_with_its_own_hsts_and_clicks_name_it() {
        use crate::domains::{Domain, Domains};
        let mut core = Core::new(false);
        let mut go = Domain::new("go.example.com");
        go.hsts = Some(Domain::hsts_line(600, false, false));
        let overlay = crate::overlay::Overlay::empty().with_all([(
            b"go.example.com/spring-sale".to_vec(),
            crate::overlay::OverlayLink::new(b"https://go.example/spring", None, false),
        )]);
        core.f.tables = core
            .f
            .tables
            .with_overlay(std::sync::Arc::new(overlay))
            .with_domains(std::sync::Arc::new(Domains::new([go])));
        let mut s = Session::new(NOW);
        s.https = true;
        let mut fx = Recorder::default();
        feed(
            &mut s,
            &core,
            &mut fx,
            "GET /spring-sale HTTP/1.1\r\nHost: go.example.com\r\nUser-Agent: t\r\n\r\n",
        );
        let out = String::from_utf8_lossy(&s.out).into_owned();
        assert!(out.starts_with("HTTP/1.1 302"), "{out}");
        assert!(
            out.contains("Location: https://go.example/spring\r\n"),
            "{out}"
        );
        assert!(
            out.contains("Strict-Transport-Security: max-age=600\r\n"),
            "{out}"
        );
        assert_eq!(out.matches("Strict-Transport-Security").count(), 1, "{out}");
        assert!(fx.take().contains(&Seen::Click(
            "go.example.com/spring-sale".into(),
            "t".into()
        )));
        // The default domain keeps the listener's HSTS and its own link of that name.
        s.out.clear();
        feed(&mut s, &core, &mut fx, &get("/spring-sale"));
        let out = String::from_utf8_lossy(&s.out).into_owned();
        assert!(
            out.contains("Location: https://shop.example/spring\r\n"),
            "{out}"
        );
        assert!(
            out.contains("Strict-Transport-Security: max-age=60\r\n"),
            "{out}"
        );
        assert!(fx
            .take()
            .contains(&Seen::Click("spring-sale".into(), "t".into())));
    }

    #[test]
    fn pipelined_requests_are_answered_in_order() {
        let core = Core::new(false);
        let (c0, c3) = (core.f.code(0), core.f.code(3));
        let mut s = Session::new(NOW);
        let mut fx = Recorder::default();
        let reqs = format!(
            "{}{}{}",
            get(&format!("/{c0}")),
            get(&format!("/{c3}")),
            get("/x")
        );
        feed(&mut s, &core, &mut fx, &reqs);
        assert_eq!(statuses(&s.out), [302, 410, 404]);
        assert_eq!(
            fx.take(),
            [
                Seen::Click(c0, "t".into()),
                Seen::Answered(302, Some(Layer::Snapshot)),
                Seen::Answered(410, Some(Layer::Denylist)),
                Seen::Answered(404, Some(Layer::Invalid)),
            ]
        );
        assert!(s.inbuf.is_empty() && !s.close_after_send);
    }

    #[test]
    fn a_request_split_across_reads_waits_for_its_end() {
        let mut core = Core::new(false);
        let c0 = core.f.code(0);
        let req = get(&format!("/{c0}"));
        let (a, b) = req.split_at(10);
        let mut s = Session::new(NOW);
        let mut fx = Recorder::default();
        feed(&mut s, &core, &mut fx, a);
        assert!(s.out.is_empty() && fx.take().is_empty());
        assert_eq!(s.partial_since_ms, Some(NOW));
        core.now_ms += 500;
        feed(&mut s, &core, &mut fx, b);
        assert_eq!(statuses(&s.out), [302]);
        assert_eq!(s.partial_since_ms, None);
        assert_eq!(s.last_active_ms, NOW + 500);
    }

    #[test]
    fn a_miss_parks_until_the_origin_answers_and_the_queue_behind_it_waits() {
        let core = Core::new(true);
        let unknown = core.f.code(20);
        let c0 = core.f.code(0);
        let mut s = Session::new(NOW);
        let mut fx = Recorder::default();
        let reqs = format!("{}{}", get(&format!("/{unknown}")), get(&format!("/{c0}")));
        feed(&mut s, &core, &mut fx, &reqs);
        assert!(s.out.is_empty(), "nothing answered out of order");
        assert!(s.waiting_origin() && s.paused());
        assert_eq!(fx.take(), [Seen::NeedOrigin(unknown.clone(), true)]);
        // More bytes while parked are queued, not answered.
        feed(&mut s, &core, &mut fx, &get("/spring-sale"));
        assert!(s.out.is_empty() && fx.take().is_empty());
        assert_eq!(s.partial_since_ms, None, "parked is not slow");
        let found = OriginAnswer::Found {
            url: (*b"https://example.com/twenty").into(),
            expires_at_ms: None,
            status: lasthop_core::LinkStatus::Active,
            warn: false,
            options: Default::default(),
        };
        s.on_origin(&found, &core.env(), &mut fx);
        assert_eq!(statuses(&s.out), [302, 302, 302]);
        let out = String::from_utf8_lossy(&s.out);
        assert!(out.find("/twenty").unwrap() < out.find("/zero").unwrap());
        assert!(out.contains("https://shop.example/spring"));
        assert_eq!(
            fx.take()[..2],
            [
                Seen::Click(unknown, "t".into()),
                Seen::Answered(302, Some(Layer::Origin)),
            ]
        );
        assert!(!s.waiting_origin() && s.inbuf.is_empty());
        // A reply nobody waits for is ignored.
        s.on_origin(&OriginAnswer::NotFound, &core.env(), &mut fx);
        assert!(fx.take().is_empty());
    }

    #[test]
    fn origin_replies_finish_the_parked_decision() {
        let core = Core::new(true);
        // Inside the reserve window: a 404 may not be cached.
        let fresh = core.f.code(ISSUED + 5);
        for (reply, status) in [
            (OriginAnswer::NotFound, 404),
            (OriginAnswer::Unavailable, 503),
            (
                OriginAnswer::Found {
                    url: Box::new([]),
                    expires_at_ms: None,
                    status: lasthop_core::LinkStatus::Deleted,
                    warn: false,
                    options: Default::default(),
                },
                410,
            ),
            (
                OriginAnswer::Found {
                    url: (*b"https://example.com/w").into(),
                    expires_at_ms: None,
                    status: lasthop_core::LinkStatus::Active,
                    warn: true,
                    options: Default::default(),
                },
                200,
            ),
        ] {
            let mut s = Session::new(NOW);
            let mut fx = Recorder::default();
            feed(&mut s, &core, &mut fx, &get(&format!("/{fresh}")));
            assert_eq!(fx.take(), [Seen::NeedOrigin(fresh.clone(), false)]);
            s.on_origin(&reply, &core.env(), &mut fx);
            assert_eq!(statuses(&s.out), [status], "{reply:?}");
            assert_eq!(
                fx.take().last(),
                Some(&Seen::Answered(status, Some(Layer::Origin)))
            );
        }
    }

    #[test]
    fn safe_mode_confirms_at_the_origin_and_falls_back_to_the_local_answer() {
        let mut core = Core::new(true);
        core.f.tables.safe_mode = true;
        let c0 = core.f.code(0);
        let mut s = Session::new(NOW);
        let mut fx = Recorder::default();
        feed(&mut s, &core, &mut fx, &get(&format!("/{c0}")));
        assert_eq!(fx.take(), [Seen::NeedOrigin(c0.clone(), true)]);
        // The origin cannot answer: the local snapshot's answer, counted.
        s.on_origin(&OriginAnswer::Unavailable, &core.env(), &mut fx);
        assert_eq!(statuses(&s.out), [302]);
        assert_eq!(
            fx.take(),
            [
                Seen::Unconfirmed,
                Seen::Click(c0.clone(), "t".into()),
                Seen::Answered(302, Some(Layer::Snapshot)),
            ]
        );
        // The origin says it was taken down meanwhile: 410, whatever the snapshot says.
        s.out.clear();
        feed(&mut s, &core, &mut fx, &get(&format!("/{c0}")));
        fx.take();
        let taken = OriginAnswer::Found {
            url: (*b"https://example.com/zero").into(),
            expires_at_ms: None,
            status: lasthop_core::LinkStatus::TakenDown,
            warn: false,
            options: Default::default(),
        };
        s.on_origin(&taken, &core.env(), &mut fx);
        assert_eq!(statuses(&s.out), [410]);
        // A miss that is not a confirmation gets 503 when the origin cannot answer.
        s.out.clear();
        let unknown = core.f.code(30);
        feed(&mut s, &core, &mut fx, &get(&format!("/{unknown}")));
        s.on_origin(&OriginAnswer::Unavailable, &core.env(), &mut fx);
        assert_eq!(statuses(&s.out), [503]);
    }

    #[test]
    fn a_bad_request_is_answered_and_closes() {
        let mut core = Core::new(false);
        core.limits.max_header_bytes = 64;
        let mut s = Session::new(NOW);
        let mut fx = Recorder::default();
        let big = format!(
            "GET /x HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n{}",
            "y".repeat(100),
            get("/spring-sale")
        );
        feed(&mut s, &core, &mut fx, &big);
        assert_eq!(statuses(&s.out), [431]);
        assert!(s.close_after_send && s.paused() && s.inbuf.is_empty());
        // Nothing more is answered on a closing connection.
        feed(&mut s, &core, &mut fx, &get("/spring-sale"));
        assert_eq!(statuses(&s.out), [431]);
        // An unfinished head over the limit is refused without waiting for its end.
        let mut s = Session::new(NOW);
        feed(
            &mut s,
            &core,
            &mut fx,
            &format!("GET /x HTTP/1.1\r\nX: {}", "z".repeat(100)),
        );
        assert_eq!(statuses(&s.out), [431]);
        // Two Host headers: 400 (RFC 9112 §3.2).
        let mut s = Session::new(NOW);
        feed(
            &mut s,
            &core,
            &mut fx,
            "GET /x HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
        );
        assert_eq!(statuses(&s.out), [400]);
    }

    #[test]
    fn idle_and_slow_heads_expire_on_the_clock_given() {
        let core = Core::new(true);
        let mut s = Session::new(NOW);
        let mut fx = Recorder::default();
        assert!(!s.expired(NOW + 60_000, 60_000, 10_000));
        assert!(s.expired(NOW + 60_001, 60_000, 10_000), "idle");
        feed(&mut s, &core, &mut fx, "GET /spring-sale HTT");
        assert!(!s.expired(NOW + 10_000, 60_000, 10_000));
        assert!(s.expired(NOW + 10_001, 60_000, 10_000), "slow head");
        // Parked on the origin: never expired by us.
        let mut s = Session::new(NOW);
        feed(
            &mut s,
            &core,
            &mut fx,
            &get(&format!("/{}", core.f.code(40))),
        );
        assert!(s.waiting_origin());
        assert!(!s.expired(NOW + 3_600_000, 60_000, 10_000));
    }

    #[test]
    fn early_data_answers_only_get_and_head() {
        let core = Core::new(false);
        let mut s = Session::new(NOW);
        s.https = true;
        s.early = true;
        let mut fx = Recorder::default();
        let post = "POST /spring-sale HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n";
        feed(
            &mut s,
            &core,
            &mut fx,
            &format!("{post}{}", get("/spring-sale")),
        );
        assert_eq!(statuses(&s.out), [425, 302]);
        assert_eq!(fx.take()[0], Seen::TooEarly);
        // HSTS on every HTTPS answer, the 425 included.
        let out = String::from_utf8_lossy(&s.out);
        assert_eq!(
            out.matches("Strict-Transport-Security: max-age=60").count(),
            2
        );
        assert_eq!(out.matches("Date: ").count(), 2);
    }

    #[test]
    fn the_plain_listener_can_send_everyone_to_https_and_the_floor_answers_all() {
        let mut core = Core::new(false);
        core.https_redirect = Some(8443);
        let mut s = Session::new(NOW);
        let mut fx = Recorder::default();
        feed(&mut s, &core, &mut fx, &get("/spring-sale"));
        assert_eq!(statuses(&s.out), [301]);
        assert!(String::from_utf8_lossy(&s.out).contains("https://lh.example:8443/spring-sale"));
        assert_eq!(fx.take(), [Seen::Answered(301, None)]);
        // Except an ACME HTTP-01 answer: a CA validates over plain HTTP.
        let mut s = Session::new(NOW);
        feed(
            &mut s,
            &core,
            &mut fx,
            &get("/.well-known/acme-challenge/tok"),
        );
        assert_eq!(statuses(&s.out), [404], "decided, not redirected");
        fx.take();
        core.https_redirect = None;
        core.fixed = true;
        let mut s = Session::new(NOW);
        feed(
            &mut s,
            &core,
            &mut fx,
            &format!("{}{}", get("/a"), get("/b")),
        );
        assert_eq!(statuses(&s.out), [302, 302]);
        assert_eq!(
            fx.take(),
            [Seen::Answered(302, None), Seen::Answered(302, None)]
        );
    }

    #[test]
    fn the_first_redirect_of_a_fed_link_is_reported_once() {
        let mut core = Core::new(false);
        let mut link = crate::overlay::OverlayLink::new(b"https://example.com/new", None, false);
        link.created_at_ms = Some(NOW - 250);
        let overlay = core
            .f
            .tables
            .overlay
            .with_inserted(b"brand-new-alias", link);
        core.f.tables = core.f.tables.with_overlay(std::sync::Arc::new(overlay));
        let mut s = Session::new(NOW);
        let mut fx = Recorder::default();
        feed(&mut s, &core, &mut fx, &get("/brand-new-alias"));
        assert_eq!(fx.take()[0], Seen::FirstRedirect(250));
        feed(&mut s, &core, &mut fx, &get("/brand-new-alias"));
        assert!(!fx.take().contains(&Seen::FirstRedirect(250)));
    }

    /// A link's own options (issue 43): its status and cache lifetime, the request's query
    /// forwarded, a click for each; a preview shows the destination as it is.
    #[test]
    fn a_link_with_options_answers_with_its_status_cache_and_query() {
        use lasthop_core::LinkOptions;
        let mut core = Core::new(false);
        let with = |url: &str, options: LinkOptions| {
            let mut link = crate::overlay::OverlayLink::new(url.as_bytes(), None, false);
            link.options = options;
            link
        };
        let permanent = LinkOptions {
            redirect_status: 301,
            cache_seconds: 86_400,
            ..LinkOptions::default()
        };
        let uncached = LinkOptions {
            redirect_status: 307,
            cache_seconds: 0,
            ..LinkOptions::default()
        };
        let forwarding = LinkOptions {
            forward_query: true,
            ..LinkOptions::default()
        };
        let request_first = LinkOptions {
            forward_query: true,
            request_precedence: true,
            redirect_status: 308,
            ..LinkOptions::default()
        };
        let overlay = core.f.tables.overlay.with_all([
            (
                b"permanent-link".to_vec(),
                with("https://example.com/p", permanent),
            ),
            (
                b"uncached-link".to_vec(),
                with("https://example.com/u", uncached),
            ),
            (
                b"forwarding-link".to_vec(),
                with("https://example.com/f?a=1#top", forwarding),
            ),
            (
                b"request-first".to_vec(),
                with("https://example.com/r?a=1", request_first),
            ),
        ]);
        core.f.tables = core.f.tables.with_overlay(std::sync::Arc::new(overlay));
        let answer = |path: &str, method: &str| {
            let mut s = Session::new(NOW);
            let mut fx = Recorder::default();
            let req =
                format!("{method} {path} HTTP/1.1\r\nHost: lh.example\r\nUser-Agent: t\r\n\r\n");
            feed(&mut s, &core, &mut fx, &req);
            let clicks = fx
                .take()
                .iter()
                .filter(|e| matches!(e, Seen::Click(..)))
                .count();
            (String::from_utf8_lossy(&s.out).into_owned(), clicks)
        };
        let (out, clicks) = answer("/permanent-link?x=1", "GET");
        assert!(
            out.starts_with("HTTP/1.1 301 Moved Permanently\r\n"),
            "{out}"
        );
        assert!(
            out.contains("Location: https://example.com/p\r\n"),
            "the query dropped: {out}"
        );
        assert!(
            out.contains("Cache-Control: private, max-age=86400\r\n"),
            "{out}"
        );
        assert_eq!(clicks, 1);
        let (out, _) = answer("/uncached-link", "HEAD");
        assert!(
            out.starts_with("HTTP/1.1 307 Temporary Redirect\r\n"),
            "{out}"
        );
        assert!(out.contains("Cache-Control: no-store\r\n"), "{out}");
        let (out, _) = answer("/forwarding-link?utm_source=tw&a=9", "GET");
        assert!(
            out.contains("Location: https://example.com/f?a=1&utm_source=tw#top\r\n"),
            "{out}"
        );
        assert!(
            out.contains("Cache-Control: private, max-age=300\r\n"),
            "{out}"
        );
        let (out, _) = answer("/request-first?a=9&b=2", "GET");
        assert!(
            out.starts_with("HTTP/1.1 308 Permanent Redirect\r\n"),
            "{out}"
        );
        assert!(
            out.contains("Location: https://example.com/r?a=9&b=2\r\n"),
            "{out}"
        );
        // The preview shows the destination a visitor would get without a query.
        let (out, clicks) = answer("/forwarding-link+", "GET");
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        assert_eq!(clicks, 0);
    }

    #[test]
    fn the_date_line_is_rebuilt_once_a_second() {
        let mut h = Headers::default();
        h.refresh(
            1_700_000_000_123,
            b"Strict-Transport-Security: max-age=1\r\n",
        );
        assert_eq!(h.lines(false), b"Date: Tue, 14 Nov 2023 22:13:20 GMT\r\n");
        assert_eq!(h.lines(false).len(), 37);
        assert_eq!(
            h.lines(true),
            &b"Date: Tue, 14 Nov 2023 22:13:20 GMT\r\nStrict-Transport-Security: max-age=1\r\n"[..]
        );
        h.refresh(1_700_000_000_999, b"");
        assert!(
            h.lines(true).ends_with(b"max-age=1\r\n"),
            "same second: kept"
        );
        h.refresh(1_700_000_001_000, b"");
        assert_eq!(h.lines(false), b"Date: Tue, 14 Nov 2023 22:13:21 GMT\r\n");
    }
}
