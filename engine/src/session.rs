//! A core's side of a connection's protocol: the pure state machine is
//! [`lasthop_edge::session`]; this module gives it what the core holds ([`CoreCtx`]) and carries
//! out its effects (asking the origin, recording clicks, counting answers). Both I/O loops call
//! a [`Session`] through [`Drive`].

use std::sync::Arc;

use lasthop_edge::session::{Effect, Effects, Env};

use crate::answer::Layer;
use crate::http::Limits;
use crate::metrics::{CoreMetrics, StatusClass};
use crate::origin::{Origin, OriginAnswer};
use crate::render::Pages;
use crate::tables::Tables;
use crate::topk::TopK;

pub use lasthop_edge::session::{Headers, Session};

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
    /// Header lines added to every answer over TLS (`Strict-Transport-Security`, `Alt-Svc`),
    /// CRLF-terminated.
    pub hsts: Arc<[u8]>,
    /// The preview and interstitial pages' extras (the report form).
    pub pages: Arc<Pages>,
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
    /// The names the HTTPS certificate covers (HTTP/2's 421), with `--tls-listen`.
    pub coverage: Option<Arc<crate::tls::CertCoverage>>,
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

    /// What a session reads this turn.
    pub fn env(&self) -> Env<'_> {
        Env {
            tables: &self.tables,
            limits: &self.limits,
            pages: &self.pages,
            headers: &self.headers,
            now_ms: self.now_ms,
            fixed: self.fixed,
            https_redirect: self.https_redirect,
            coverage: self
                .coverage
                .as_deref()
                .map(|c| c as &dyn lasthop_edge::session::Coverage),
        }
    }
}

/// Latency is sampled: one request in this many reads the clock (from the moment its bytes
/// were harvested to its answer rendered), which keeps the histogram honest at a fraction of a
/// clock read per request.
const LATENCY_SAMPLE: u64 = 16;

/// A session's effects, carried out on this core for the connection `token` names.
pub(crate) struct CoreEffects<'a> {
    ctx: &'a CoreCtx,
    token: u64,
    peer: Option<std::net::IpAddr>,
}

impl Effects for CoreEffects<'_> {
    #[inline]
    fn effect(&mut self, effect: Effect<'_>) {
        let ctx = self.ctx;
        match effect {
            Effect::NeedOrigin {
                code,
                cache_negative,
            } => {
                // `decide` answers NeedOrigin only when the tables say an origin exists, which
                // they do exactly when the core was given one.
                if let Some(origin) = &ctx.origin {
                    origin.submit(ctx.core, code, self.token, cache_negative);
                }
            }
            Effect::Click {
                req,
                code,
                domain,
                how,
            } => {
                // The click hook: count the link in the hot-code sketch (one request in
                // `top_sample`; a branded link by its key) and record the event into this
                // core's buffer.
                if ctx.answered.get() % ctx.top_sample == 0 {
                    if domain.is_empty() {
                        ctx.top.record(code);
                    } else {
                        ctx.top.record(&[domain, b"/", code].concat());
                    }
                }
                if let Some(clicks) = &ctx.clicks {
                    clicks.record(req, code, domain, self.peer, how, ctx.now_ms);
                }
            }
            Effect::Answered { status, layer } => {
                ctx.metrics.request(StatusClass::of(status));
                if let Some(layer) = layer {
                    record(ctx, layer);
                }
            }
            Effect::TooEarly => {
                if let Some(tls) = &ctx.tls {
                    tls.too_early();
                }
            }
            Effect::FirstRedirect { after_ms } => {
                if let Some(feed) = &ctx.feed {
                    feed.observe_first_redirect(after_ms);
                }
            }
            Effect::Unconfirmed => {
                if let Some(feed) = &ctx.feed {
                    feed.count_unconfirmed();
                }
            }
            Effect::H2(event) => ctx.metrics.h2(event),
        }
    }
}

fn record(ctx: &CoreCtx, layer: Layer) {
    ctx.metrics.answer(layer as usize);
    let answered = ctx.answered.get().wrapping_add(1);
    ctx.answered.set(answered);
    if answered % LATENCY_SAMPLE == 0 {
        ctx.metrics.latency(ctx.turn_start.elapsed());
    }
}

/// How an I/O loop drives a [`Session`] on a core: bytes in, origin replies in, effects out.
pub trait Drive {
    /// Feeds bytes just received on the connection `token` names.
    fn receive(&mut self, data: &[u8], ctx: &CoreCtx, token: u64);
    /// Hands over the origin's reply for `code`, which this connection asked for.
    fn origin_replied(&mut self, code: &[u8], reply: &OriginAnswer, ctx: &CoreCtx, token: u64);
    /// ALPN chose `h2`: the connection speaks HTTP/2 from its first byte.
    fn alpn_h2(&mut self, sni: Option<&str>, ctx: &CoreCtx, token: u64);
    /// SIGTERM: HTTP/2 connections say GOAWAY and close once their streams are answered.
    fn drain_h2(&mut self, ctx: &CoreCtx, token: u64);
    /// The connection expired ([`Session::expired`]): what it says before the loop closes it
    /// (HTTP/2's GOAWAY) goes into its output.
    fn expire(&mut self, ctx: &CoreCtx, token: u64, idle_ms: i64, header_ms: i64);
}

impl<'a> CoreEffects<'a> {
    /// The sink for a connection without a [`Session`] (an HTTP/3 one): `token` names it to
    /// the origin's replies, `peer` is its client.
    pub(crate) fn for_peer(ctx: &'a CoreCtx, token: u64, peer: Option<std::net::IpAddr>) -> Self {
        CoreEffects { ctx, token, peer }
    }

    /// The sink for `session`, the connection `token` names on this core.
    #[inline]
    fn new(ctx: &'a CoreCtx, token: u64, session: &Session) -> Self {
        CoreEffects {
            ctx,
            token,
            peer: session.peer,
        }
    }
}

impl Drive for Session {
    #[inline]
    fn receive(&mut self, data: &[u8], ctx: &CoreCtx, token: u64) {
        let mut fx = CoreEffects::new(ctx, token, self);
        Session::on_input(self, data, &ctx.env(), &mut fx);
    }

    fn origin_replied(&mut self, code: &[u8], reply: &OriginAnswer, ctx: &CoreCtx, token: u64) {
        let mut fx = CoreEffects::new(ctx, token, self);
        Session::on_origin_for(self, code, reply, &ctx.env(), &mut fx);
    }

    fn alpn_h2(&mut self, sni: Option<&str>, ctx: &CoreCtx, token: u64) {
        let mut fx = CoreEffects::new(ctx, token, self);
        Session::start_h2(self, sni, &ctx.env(), &mut fx);
    }

    fn drain_h2(&mut self, ctx: &CoreCtx, token: u64) {
        let mut fx = CoreEffects::new(ctx, token, self);
        Session::drain(self, &mut fx);
    }

    fn expire(&mut self, ctx: &CoreCtx, token: u64, idle_ms: i64, header_ms: i64) {
        let mut fx = CoreEffects::new(ctx, token, self);
        Session::goodbye(self, ctx.now_ms, idle_ms, header_ms, &mut fx);
    }
}
