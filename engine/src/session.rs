//! One connection's protocol state, shared by both I/O backends.
//!
//! The backend hands a session the bytes it received and later sends what the session rendered
//! into `out`; the session never touches a socket. Requests are answered in order (pipelining):
//! a request that needs the origin parks the connection, with its bytes still in `inbuf`, until
//! the origin's reply comes back through the core's inbox.

use std::sync::Arc;

use lasthop_core::{classify, CodeKind, LinkState, LinkStatus};

use crate::answer::{self, Answer, Layer};
use crate::http::{self, Limits, Parse};
use crate::metrics::{CoreMetrics, StatusClass};
use crate::origin::{Origin, OriginAnswer};
use crate::render;
use crate::tables::Tables;
use crate::topk::TopK;

/// Largest response backlog before a connection stops reading (a pipelining client that never
/// reads its answers must not grow our memory).
pub const MAX_PENDING_OUT: usize = 256 * 1024;

/// Everything a core reads or updates while answering.
#[derive(Debug)]
pub struct CoreCtx {
    pub core: usize,
    pub tables: Arc<Tables>,
    pub limits: Limits,
    pub metrics: Arc<CoreMetrics>,
    pub origin: Option<Arc<Origin>>,
    pub top: Arc<TopK>,
    /// The feed's counters, with `--control`.
    pub feed: Option<Arc<crate::feed::FeedStats>>,
    /// Header lines added to every HTTPS answer (`Strict-Transport-Security`), CRLF-terminated.
    pub hsts: Arc<[u8]>,
    /// The preview and interstitial pages' extras (the report form).
    pub pages: Arc<crate::render::Pages>,
    /// TLS counters, with `--tls-listen`.
    pub tls: Option<Arc<crate::tls::TlsStats>>,
    /// Wall clock, refreshed once per loop turn.
    pub now_ms: i64,
    /// Floor mode (`--fixed-response`): every request gets the same 302, nothing is looked up.
    pub fixed: bool,
    /// One redirect in this many is counted in the hot-code sketch (`--top-sample`).
    pub top_sample: u64,
    /// When this turn's completions were harvested; latency is measured from here.
    pub turn_start: std::time::Instant,
    /// Requests answered, for sampling the latency clock (a `Cell` so the request path can
    /// borrow the tables and the context together, without touching the shared `Arc`).
    pub answered: std::cell::Cell<u64>,
    /// This core's click recorder (`--clicks`), fed by every answered redirect.
    pub clicks: Option<crate::clicks::Recorder>,
    /// The header lines every answer carries (`Date`, and HSTS on HTTPS), rebuilt once a
    /// second by [`CoreCtx::refresh_clock`].
    pub headers: Headers,
    /// `--redirect-http-to-https`: the HTTPS port plain-listener requests are sent to.
    pub https_redirect: Option<u16>,
}

/// The header lines of every answer: `Date` (RFC 9110 §6.6.1: a server with a clock sends it),
/// formatted once per second per core rather than per request, and on HTTPS the
/// `Strict-Transport-Security` line after it.
#[derive(Debug, Default)]
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

impl CoreCtx {
    /// Reads the clocks once for the whole turn.
    pub fn refresh_clock(&mut self) {
        self.turn_start = std::time::Instant::now();
        self.now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0);
        self.headers.refresh(self.now_ms, &self.hsts);
    }
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
    /// Parked on an origin lookup.
    pub waiting_origin: bool,
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
}

/// Without the peer address: a debug print must not put a client's address in a log.
impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("inbuf", &self.inbuf.len())
            .field("out", &self.out.len())
            .field("close_after_send", &self.close_after_send)
            .field("waiting_origin", &self.waiting_origin)
            .field("https", &self.https)
            .field("early", &self.early)
            .field("peer_known", &self.peer.is_some())
            .finish_non_exhaustive()
    }
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

    /// True while the connection should not read more (parked, closing, or backlogged).
    pub fn paused(&self) -> bool {
        self.waiting_origin || self.close_after_send || self.out.len() >= MAX_PENDING_OUT
    }

    /// Feeds bytes just received and answers every complete request in them.
    pub fn on_input(&mut self, data: &[u8], ctx: &CoreCtx, token: u64) {
        self.last_active_ms = ctx.now_ms;
        if self.close_after_send {
            return; // answering nothing more on a closing connection
        }
        if self.inbuf.is_empty() && !self.waiting_origin {
            // Fast path: parse straight from the receive buffer, copy only a leftover tail.
            let used = self.process(data, ctx, token);
            if used < data.len() && !self.close_after_send {
                self.inbuf.extend_from_slice(&data[used..]);
            }
        } else {
            self.inbuf.extend_from_slice(data);
            self.drive(ctx, token);
        }
        self.partial_since_ms = if self.inbuf.is_empty() || self.waiting_origin {
            None
        } else {
            self.partial_since_ms.or(Some(ctx.now_ms))
        };
    }

    /// Answers whatever is buffered in `inbuf`.
    fn drive(&mut self, ctx: &CoreCtx, token: u64) {
        if self.waiting_origin {
            return;
        }
        let buf = std::mem::take(&mut self.inbuf);
        let used = self.process(&buf, ctx, token);
        let mut buf = buf;
        if self.close_after_send {
            buf.clear();
        } else {
            buf.drain(..used);
        }
        // Keep the allocation: a keep-alive connection reuses it.
        self.inbuf = buf;
    }

    /// Answers complete requests at the front of `buf`; returns the bytes consumed.
    fn process(&mut self, buf: &[u8], ctx: &CoreCtx, token: u64) -> usize {
        let mut at = 0;
        while at < buf.len() && self.out.len() < MAX_PENDING_OUT {
            match self.one(&buf[at..], ctx, token) {
                Step::Answered(n) => at += n,
                Step::Partial | Step::Parked => break,
                Step::Closed => return buf.len(),
            }
        }
        at
    }

    fn one(&mut self, buf: &[u8], ctx: &CoreCtx, token: u64) -> Step {
        match http::parse(buf, &ctx.limits) {
            Parse::Partial => Step::Partial,
            Parse::Error(e) => {
                let answer = Answer::BadRequest(e);
                render::render_error(e, ctx.headers.lines(self.https), &mut self.out);
                record(ctx, &answer, Layer::Invalid);
                self.close_after_send = true;
                Step::Closed
            }
            Parse::Complete { req, consumed } => {
                if ctx.fixed {
                    render::render_fixed_with(ctx.headers.lines(self.https), &mut self.out);
                    ctx.metrics.request(StatusClass::of(302));
                    return Step::Answered(consumed);
                }
                if self.early && req.method == http::Method::Other {
                    if let Some(tls) = &ctx.tls {
                        tls.too_early();
                    }
                    self.finish(&req, &Answer::TooEarly, Layer::Invalid, ctx);
                    return Step::Answered(consumed);
                }
                if let (false, Some(port)) = (self.https, ctx.https_redirect) {
                    let (close, status) = render::render_https_redirect(
                        &req,
                        port,
                        ctx.headers.lines(false),
                        &mut self.out,
                    );
                    ctx.metrics.request(StatusClass::of(status));
                    if close {
                        self.close_after_send = true;
                        return Step::Closed;
                    }
                    return Step::Answered(consumed);
                }
                let tables = &*ctx.tables;
                let (answer, layer) = answer::decide(&req, tables, ctx.now_ms);
                if let Answer::NeedOrigin { code, .. } = answer {
                    if let Some(origin) = &ctx.origin {
                        origin.submit(ctx.core, code, token, may_cache_negative(tables, code));
                        self.waiting_origin = true;
                        return Step::Parked;
                    }
                }
                self.finish(&req, &answer, layer, ctx);
                if self.close_after_send {
                    return Step::Closed;
                }
                Step::Answered(consumed)
            }
        }
    }

    fn finish(
        &mut self,
        req: &http::Request<'_>,
        answer: &Answer<'_>,
        layer: Layer,
        ctx: &CoreCtx,
    ) {
        let extra = ctx.headers.lines(self.https);
        let close = render::render_with(answer, req, extra, &ctx.pages, &mut self.out);
        if let (Answer::Redirect { .. }, Layer::Overlay, Some(feed)) = (answer, layer, &ctx.feed) {
            // Creation-to-first-redirect: only links the feed brought carry a creation time.
            if let Some(link) = ctx.tables.overlay.get(code_of(req.path)) {
                if let Some(created) = link.created_at_ms {
                    if link.first_served.claim() {
                        feed.observe_first_redirect(ctx.now_ms - created);
                    }
                }
            }
        }
        if let Answer::Redirect { .. } = answer {
            // The click hook: count the code in the hot-code sketch (one request in
            // `top_sample`) and record the event into this core's buffer.
            let code = code_of(req.path);
            if ctx.answered.get() % ctx.top_sample == 0 {
                ctx.top.record(code);
            }
            if let Some(clicks) = &ctx.clicks {
                clicks.record(req, code, self.peer, self.https, ctx.now_ms);
            }
        }
        record(ctx, answer, layer);
        if close {
            self.close_after_send = true;
        }
    }

    /// The origin answered the request this session is parked on.
    pub fn on_origin(&mut self, reply: &OriginAnswer, ctx: &CoreCtx, token: u64) {
        if !self.waiting_origin {
            return;
        }
        self.waiting_origin = false;
        let buf = std::mem::take(&mut self.inbuf);
        let mut consumed = buf.len();
        if let Parse::Complete { req, consumed: n } = http::parse(&buf, &ctx.limits) {
            consumed = n;
            let tables = &*ctx.tables;
            // Decide again: the tables may have learnt the code while we waited.
            let (answer, layer) = match answer::decide(&req, tables, ctx.now_ms) {
                (Answer::NeedOrigin { code, preview }, _) => match reply {
                    OriginAnswer::Found {
                        url,
                        expires_at_ms,
                        status,
                        warn,
                    } => {
                        let state = state_of(*status, *expires_at_ms, *warn);
                        answer::answer_from_origin(
                            code,
                            preview,
                            tables,
                            Some((url, &state)),
                            ctx.now_ms,
                        )
                    }
                    OriginAnswer::NotFound => {
                        answer::answer_from_origin(code, preview, tables, None, ctx.now_ms)
                    }
                    // Safe mode could not confirm: redirect availability comes first, so answer
                    // from the local tables (if they know the code) and count it.
                    OriginAnswer::Unavailable if tables.safe_mode => {
                        match answer::decide_local(&req, tables, ctx.now_ms) {
                            (Answer::NeedOrigin { .. }, _) => (Answer::Unavailable, Layer::Origin),
                            local => {
                                if let Some(feed) = &ctx.feed {
                                    feed.count_unconfirmed();
                                }
                                local
                            }
                        }
                    }
                    OriginAnswer::Unavailable => (Answer::Unavailable, Layer::Origin),
                },
                other => other,
            };
            self.finish(&req, &answer, layer, ctx);
        } else {
            // Cannot happen (the bytes parsed before we parked); answer nothing and close.
            self.close_after_send = true;
        }
        let mut buf = buf;
        buf.drain(..consumed.min(buf.len()));
        self.inbuf = buf;
        if !self.close_after_send {
            self.drive(ctx, token);
        }
    }
}

/// A link state equivalent to what the origin reported, for the shared answer rules.
fn state_of(status: LinkStatus, expires_at_ms: Option<i64>, warn: bool) -> LinkState {
    LinkState {
        deleted: status == LinkStatus::Deleted,
        disabled: status == LinkStatus::Disabled,
        takedown_reason: (status == LinkStatus::TakenDown).then(String::new),
        // The origin computed "expired" with its clock; keep the answer even if ours differs.
        expires_at_ms: if status == LinkStatus::Expired {
            Some(i64::MIN)
        } else {
            expires_at_ms
        },
        warn,
        ..LinkState::default()
    }
}

/// Whether the origin may remember "not found" for `code`: aliases yes, generated codes only
/// below their region's published mark (never in the reserve window, where a new link may
/// appear at any moment).
fn may_cache_negative(t: &Tables, code: &[u8]) -> bool {
    match classify(code) {
        CodeKind::Generated => t
            .scheme
            .decode(code)
            .is_some_and(|n| t.high_water.below_mark(n)),
        CodeKind::Alias => true,
        CodeKind::Invalid => false,
    }
}

/// Latency is sampled: one request in this many reads the clock (from the moment its bytes
/// were harvested to its answer rendered), which keeps the histogram honest at a fraction of a
/// clock read per request.
const LATENCY_SAMPLE: u64 = 16;

fn record(ctx: &CoreCtx, answer: &Answer<'_>, layer: Layer) {
    ctx.metrics.request(StatusClass::of(answer.status()));
    ctx.metrics.answer(layer as usize);
    let answered = ctx.answered.get().wrapping_add(1);
    ctx.answered.set(answered);
    if answered % LATENCY_SAMPLE == 0 {
        ctx.metrics.latency(ctx.turn_start.elapsed());
    }
}

/// The code part of a request path (`/abc1234+` → `abc1234`).
fn code_of(path: &[u8]) -> &[u8] {
    let p = path.strip_prefix(b"/").unwrap_or(path);
    p.strip_suffix(b"+").unwrap_or(p)
}

#[cfg(test)]
mod tests {
    use super::Headers;

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
