//! Engine metrics: per-core counters written by their core, read by the admin thread, and the
//! Prometheus text rendering of the whole process.
//!
//! Each serving core owns one [`CoreMetrics`] and is its only writer, so an increment is a
//! relaxed load and store rather than a locked read-modify-write: on x86 that is two plain moves
//! instead of a `lock xadd` (about 20 cycles that would otherwise sit on every request). The admin
//! thread reads with relaxed loads; a value it sees may be a request behind, never torn. Each
//! `CoreMetrics` is aligned to 128 bytes (two cache lines: the adjacent-line prefetcher pairs
//! them) so no two cores ever share a line.
//!
//! Series are summed over cores except where a per-core view is what an operator needs (open
//! connections and requests per core, to spot an unbalanced `SO_REUSEPORT` spread). No metric is
//! ever labelled by a code: the hot codes are `/debug/top`'s business.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::prom::{family, sample};
use crate::origin::OriginStats;

/// Response status classes counted per core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum StatusClass {
    /// 302: the redirect.
    Found = 0,
    NotFound = 1,
    /// 410: deleted, disabled, taken down, expired.
    Gone = 2,
    /// 200: preview or warning interstitial.
    Ok = 3,
    MethodNotAllowed = 4,
    BadRequest = 5,
    /// 425: a request in TLS early data that may not be replayed.
    TooEarly = 6,
    Other = 7,
}

impl StatusClass {
    /// Every class, in index order.
    pub const ALL: [StatusClass; 8] = [
        StatusClass::Found,
        StatusClass::NotFound,
        StatusClass::Gone,
        StatusClass::Ok,
        StatusClass::MethodNotAllowed,
        StatusClass::BadRequest,
        StatusClass::TooEarly,
        StatusClass::Other,
    ];

    /// The class of an HTTP status code.
    pub fn of(status: u16) -> StatusClass {
        match status {
            302 => StatusClass::Found,
            404 => StatusClass::NotFound,
            410 => StatusClass::Gone,
            200 => StatusClass::Ok,
            405 => StatusClass::MethodNotAllowed,
            400 => StatusClass::BadRequest,
            425 => StatusClass::TooEarly,
            _ => StatusClass::Other,
        }
    }

    /// The `status` label value.
    pub fn label(self) -> &'static str {
        match self {
            StatusClass::Found => "302",
            StatusClass::NotFound => "404",
            StatusClass::Gone => "410",
            StatusClass::Ok => "200",
            StatusClass::MethodNotAllowed => "405",
            StatusClass::BadRequest => "400",
            StatusClass::TooEarly => "425",
            StatusClass::Other => "other",
        }
    }
}

/// Most answer layers [`CoreMetrics::answer`] counts; higher indexes are ignored.
pub const MAX_LAYERS: usize = 8;

/// What an origin read-through told a core.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum OriginOutcome {
    Found = 0,
    NotFound = 1,
    Unavailable = 2,
}

const ORIGIN_OUTCOMES: [&str; 3] = ["found", "not_found", "unavailable"];

/// Latency buckets: `le` = 2^i µs for i in 0..LATENCY_BUCKETS (1 µs … about 1.05 s), then +Inf.
pub const LATENCY_BUCKETS: usize = 21;

/// The bucket of a latency in nanoseconds: the smallest i with ns <= 2^i µs, or
/// `LATENCY_BUCKETS` (the +Inf bucket).
fn latency_bucket(ns: u64) -> usize {
    let us = ns.div_ceil(1000);
    if us <= 1 {
        return 0;
    }
    // ceil(log2(us)) for us >= 2; at most 64, so the cast is lossless.
    let b = (64 - (us - 1).leading_zeros()) as usize;
    b.min(LATENCY_BUCKETS)
}

/// One serving core's counters. The core is the only writer; see the module docs.
#[derive(Debug)]
#[repr(align(128))]
pub struct CoreMetrics {
    requests: [AtomicU64; 8],
    answers: [AtomicU64; MAX_LAYERS],
    /// Per-bucket (not cumulative) counts; the last is the +Inf overflow.
    latency: [AtomicU64; LATENCY_BUCKETS + 1],
    latency_sum_ns: AtomicU64,
    open_connections: AtomicU64,
    accepted: AtomicU64,
    closed: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    origin: [AtomicU64; 3],
    /// `--io xdp`: the userspace TCP's counters, as `TcpStats::NAMES` names them.
    xdp_tcp: [AtomicU64; 8],
    /// HTTP/2: connections, streams (requests), resets received and sent.
    h2: [AtomicU64; 4],
    /// HTTP/2 GOAWAYs sent, by error code (`ErrorCode::ALL`'s order).
    h2_goaway: [AtomicU64; 14],
    /// HTTP/2 clients refused by a limit, by `Flood::ALL`'s order.
    h2_refused: [AtomicU64; 9],
    /// HTTP/3 answers (requests).
    h3: AtomicU64,
}

/// Single-writer increment: a relaxed load and store, no locked instruction. Correct because
/// only the owning core writes; readers see some recent value.
#[inline]
fn bump(c: &AtomicU64, by: u64) {
    c.store(
        c.load(Ordering::Relaxed).wrapping_add(by),
        Ordering::Relaxed,
    );
}

impl Default for CoreMetrics {
    fn default() -> Self {
        CoreMetrics::new()
    }
}

impl CoreMetrics {
    pub fn new() -> CoreMetrics {
        CoreMetrics {
            requests: Default::default(),
            answers: Default::default(),
            latency: Default::default(),
            latency_sum_ns: AtomicU64::new(0),
            open_connections: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            closed: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            origin: Default::default(),
            xdp_tcp: Default::default(),
            h2: Default::default(),
            h2_goaway: Default::default(),
            h2_refused: Default::default(),
            h3: AtomicU64::new(0),
        }
    }

    /// What an HTTP/2 connection reported.
    #[inline]
    pub fn h2(&self, event: lasthop_edge::h2::Event) {
        use lasthop_edge::h2::frame::ErrorCode;
        use lasthop_edge::h2::{Event, Flood};
        let c = match event {
            Event::Connection => &self.h2[0],
            Event::Stream => &self.h2[1],
            Event::ResetReceived => &self.h2[2],
            Event::ResetSent => &self.h2[3],
            Event::GoAway(code) => match ErrorCode::ALL.iter().position(|c| *c == code) {
                Some(i) => &self.h2_goaway[i],
                None => return,
            },
            Event::Refused(flood) => match Flood::ALL.iter().position(|f| *f == flood) {
                Some(i) => &self.h2_refused[i],
                None => return,
            },
        };
        bump(c, 1);
    }

    /// One response sent, by status class.
    #[inline]
    pub fn request(&self, class: StatusClass) {
        bump(&self.requests[class as usize], 1);
    }

    /// One request answered by layer `layer` (the request path's own index; see
    /// [`EngineMetrics::new`]). Indexes at or above [`MAX_LAYERS`] are ignored.
    #[inline]
    pub fn answer(&self, layer: usize) {
        if let Some(c) = self.answers.get(layer) {
            bump(c, 1);
        }
    }

    /// Time from the first byte of a request to its response being queued.
    #[inline]
    pub fn latency_ns(&self, ns: u64) {
        bump(&self.latency[latency_bucket(ns)], 1);
        bump(&self.latency_sum_ns, ns);
    }

    /// [`CoreMetrics::latency_ns`] from a `Duration` (saturating at u64 nanoseconds, 584 years).
    #[inline]
    pub fn latency(&self, d: Duration) {
        self.latency_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// A connection accepted (and now open).
    #[inline]
    pub fn connection_opened(&self) {
        bump(&self.accepted, 1);
        bump(&self.open_connections, 1);
    }

    /// A connection closed.
    #[inline]
    pub fn connection_closed(&self) {
        bump(&self.closed, 1);
        let open = self.open_connections.load(Ordering::Relaxed);
        self.open_connections
            .store(open.saturating_sub(1), Ordering::Relaxed);
    }

    #[inline]
    pub fn bytes_in(&self, n: u64) {
        bump(&self.bytes_in, n);
    }

    #[inline]
    pub fn bytes_out(&self, n: u64) {
        bump(&self.bytes_out, n);
    }

    /// An origin reply reached this core: counted by what it said.
    #[inline]
    pub fn origin_reply(&self, answer: &crate::origin::OriginAnswer) {
        use crate::origin::OriginAnswer;
        let outcome = match answer {
            OriginAnswer::Found { .. } => OriginOutcome::Found,
            OriginAnswer::NotFound => OriginOutcome::NotFound,
            OriginAnswer::Unavailable => OriginOutcome::Unavailable,
        };
        bump(&self.origin[outcome as usize], 1);
    }

    /// One answer sent over HTTP/3.
    #[inline]
    pub fn h3_answer(&self) {
        bump(&self.h3, 1);
    }

    /// All responses sent so far.
    pub fn requests_total(&self) -> u64 {
        self.requests
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .sum()
    }

    /// `--io xdp`: the userspace TCP's counters so far (`TcpStats::counts`, absolute; the
    /// loop copies them in).
    pub fn set_xdp_tcp(&self, counts: [u64; 8]) {
        for (slot, v) in self.xdp_tcp.iter().zip(counts) {
            slot.store(v, Ordering::Relaxed);
        }
    }

    /// Connections open now.
    pub fn open_connections(&self) -> u64 {
        self.open_connections.load(Ordering::Relaxed)
    }
}

/// Health flags the admin listener's `/readyz` reports and `/metrics` shows.
#[derive(Debug, Default)]
pub struct Health {
    /// Set once a snapshot is mapped and the listeners accept.
    pub ready: AtomicBool,
    /// The feed's heartbeat timed out (safe mode).
    pub feed_lost: AtomicBool,
    /// No usable snapshot file.
    pub snapshot_missing: AtomicBool,
}

impl Health {
    /// `Ok(None)` when ready, `Ok(Some(why))` when serving but degraded (the feed is lost: the
    /// engine is in safe mode and still redirects, since redirect availability comes first and
    /// a control-plane outage must not pull every PoP out of its load balancer at once), else
    /// the first reason it is not ready.
    pub fn readiness(&self) -> Result<Option<&'static str>, &'static str> {
        if self.snapshot_missing.load(Ordering::Relaxed) {
            Err("snapshot missing")
        } else if !self.ready.load(Ordering::Relaxed) {
            Err("starting")
        } else if self.feed_lost.load(Ordering::Relaxed) {
            Ok(Some("feed lost, safe mode"))
        } else {
            Ok(None)
        }
    }
}

/// The whole process's metrics: the cores' counters plus process-level gauges.
#[derive(Debug)]
pub struct EngineMetrics {
    /// One per serving core, index = core number.
    pub cores: Vec<Arc<CoreMetrics>>,
    /// `"io_uring"` or `"epoll"`, chosen at start.
    pub io_backend: &'static str,
    /// Feed sequence of the snapshot being served.
    pub snapshot_sequence: AtomicU64,
    /// Links in that snapshot.
    pub snapshot_links: AtomicU64,
    /// Snapshot swaps (SIGHUP or the feed) since start.
    pub snapshot_swaps: AtomicU64,
    pub health: Health,
    /// The control planes and the one in use, when `--control` is given.
    pub control: Option<Arc<crate::control::ControlPlanes>>,
    /// The origin read-through's fetch counters, when `--control` is given.
    pub origin: Option<Arc<OriginStats>>,
    /// The feed's state and counters, when `--control` is given.
    pub feed: Option<Arc<crate::feed::FeedStats>>,
    /// TLS counters, when `--tls-listen` is given.
    pub tls: Option<Arc<crate::tls::TlsStats>>,
    /// QUIC counters, when HTTP/3 is served.
    pub quic: Option<Arc<crate::quic::QuicStats>>,
    /// Click recording, unless `--clicks off`.
    pub clicks: Option<Arc<crate::clicks::Clicks>>,
}

impl EngineMetrics {
    /// Metrics for `cores` serving cores.
    pub fn new(cores: usize, io_backend: &'static str) -> EngineMetrics {
        EngineMetrics {
            cores: (0..cores).map(|_| Arc::new(CoreMetrics::new())).collect(),
            io_backend,
            snapshot_sequence: AtomicU64::new(0),
            snapshot_links: AtomicU64::new(0),
            snapshot_swaps: AtomicU64::new(0),
            health: Health::default(),
            control: None,
            origin: None,
            feed: None,
            tls: None,
            quic: None,
            clicks: None,
        }
    }

    fn sum(&self, f: impl Fn(&CoreMetrics) -> &AtomicU64) -> u64 {
        self.cores
            .iter()
            .map(|c| f(c).load(Ordering::Relaxed))
            .fold(0, u64::wrapping_add)
    }

    /// The Prometheus text exposition (format 0.0.4) of every metric.
    pub fn render_prometheus(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        let o = &mut out;

        family(
            o,
            "lasthop_engine_io_backend",
            "gauge",
            "The socket loop in use (1 for the one chosen at start).",
        );
        sample(
            o,
            "lasthop_engine_io_backend",
            &format!("backend=\"{}\"", self.io_backend),
            1,
        );
        family(o, "lasthop_engine_cores", "gauge", "Serving cores.");
        sample(o, "lasthop_engine_cores", "", self.cores.len() as u64);

        family(
            o,
            "lasthop_engine_requests_total",
            "counter",
            "Responses sent, by status.",
        );
        for class in StatusClass::ALL {
            let n = self.sum(|c| &c.requests[class as usize]);
            sample(
                o,
                "lasthop_engine_requests_total",
                &format!("status=\"{}\"", class.label()),
                n,
            );
        }
        family(
            o,
            "lasthop_engine_core_requests_total",
            "counter",
            "Responses sent, by serving core.",
        );
        for (i, c) in self.cores.iter().enumerate() {
            sample(
                o,
                "lasthop_engine_core_requests_total",
                &format!("core=\"{i}\""),
                c.requests_total(),
            );
        }

        family(
            o,
            "lasthop_engine_requests_by_protocol_total",
            "counter",
            "Responses sent, by HTTP version.",
        );
        let all = self
            .cores
            .iter()
            .map(|c| c.requests_total())
            .fold(0, u64::wrapping_add);
        let h2 = self.sum(|c| &c.h2[1]);
        let h3 = self.sum(|c| &c.h3);
        sample(
            o,
            "lasthop_engine_requests_by_protocol_total",
            "protocol=\"h1\"",
            all.saturating_sub(h2).saturating_sub(h3),
        );
        sample(
            o,
            "lasthop_engine_requests_by_protocol_total",
            "protocol=\"h2\"",
            h2,
        );
        if self.quic.is_some() {
            sample(
                o,
                "lasthop_engine_requests_by_protocol_total",
                "protocol=\"h3\"",
                h3,
            );
        }
        family(
            o,
            "lasthop_engine_h2_connections_total",
            "counter",
            "Connections that spoke HTTP/2 (ALPN h2, or h2c with prior knowledge).",
        );
        sample(
            o,
            "lasthop_engine_h2_connections_total",
            "",
            self.sum(|c| &c.h2[0]),
        );
        family(
            o,
            "lasthop_engine_h2_streams_total",
            "counter",
            "HTTP/2 request streams opened.",
        );
        sample(
            o,
            "lasthop_engine_h2_streams_total",
            "",
            self.sum(|c| &c.h2[1]),
        );
        family(
            o,
            "lasthop_engine_h2_resets_total",
            "counter",
            "HTTP/2 RST_STREAM frames, by direction.",
        );
        sample(
            o,
            "lasthop_engine_h2_resets_total",
            "direction=\"received\"",
            self.sum(|c| &c.h2[2]),
        );
        sample(
            o,
            "lasthop_engine_h2_resets_total",
            "direction=\"sent\"",
            self.sum(|c| &c.h2[3]),
        );
        family(
            o,
            "lasthop_engine_h2_goaways_total",
            "counter",
            "HTTP/2 GOAWAY frames sent, by error code.",
        );
        for (i, code) in lasthop_edge::h2::frame::ErrorCode::ALL.iter().enumerate() {
            sample(
                o,
                "lasthop_engine_h2_goaways_total",
                &format!("error=\"{}\"", code.name()),
                self.sum(|c| &c.h2_goaway[i]),
            );
        }
        family(
            o,
            "lasthop_engine_h2_refused_total",
            "counter",
            "HTTP/2 connections ended by a limit (GOAWAY ENHANCE_YOUR_CALM), by kind.",
        );
        for (i, flood) in lasthop_edge::h2::Flood::ALL.iter().enumerate() {
            sample(
                o,
                "lasthop_engine_h2_refused_total",
                &format!("kind=\"{}\"", flood.name()),
                self.sum(|c| &c.h2_refused[i]),
            );
        }

        family(
            o,
            "lasthop_engine_answers_total",
            "counter",
            "Requests for a code, by the layer that decided the answer.",
        );
        // Answer layer `i` is named `Layer::NAMES[i]`, the request path's order.
        for (i, name) in crate::answer::Layer::NAMES
            .iter()
            .enumerate()
            .take(MAX_LAYERS)
        {
            let n = self.sum(|c| &c.answers[i]);
            sample(
                o,
                "lasthop_engine_answers_total",
                &format!("layer=\"{name}\""),
                n,
            );
        }

        let h = "lasthop_engine_request_duration_seconds";
        family(
            o,
            h,
            "histogram",
            "Time from a request's first byte to its response being queued.",
        );
        let mut cumulative = 0u64;
        for b in 0..=LATENCY_BUCKETS {
            cumulative = cumulative.wrapping_add(self.sum(|c| &c.latency[b]));
            let le = if b == LATENCY_BUCKETS {
                "+Inf".to_string()
            } else {
                // 2^b µs in seconds, exact in decimal.
                format_seconds_from_us(1u64 << b)
            };
            sample(
                o,
                &format!("{h}_bucket"),
                &format!("le=\"{le}\""),
                cumulative,
            );
        }
        let sum_ns = self.sum(|c| &c.latency_sum_ns);
        let _ = writeln!(
            o,
            "{h}_sum {}.{:09}",
            sum_ns / 1_000_000_000,
            sum_ns % 1_000_000_000
        );
        sample(o, &format!("{h}_count"), "", cumulative);

        family(
            o,
            "lasthop_engine_open_connections",
            "gauge",
            "Client connections open, by serving core.",
        );
        for (i, c) in self.cores.iter().enumerate() {
            sample(
                o,
                "lasthop_engine_open_connections",
                &format!("core=\"{i}\""),
                c.open_connections(),
            );
        }
        if self.io_backend == "af_xdp" {
            family(
                o,
                "lasthop_engine_xdp_tcp_events_total",
                "counter",
                "The userspace TCP of --io xdp: SYNs answered with a cookie, returned cookies refused, connections opened, retransmissions, resets sent, connections timed out, frames refused, segments held out of order for reassembly.",
            );
            for (i, event) in lasthop_edge::tcp::TcpStats::NAMES.iter().enumerate() {
                sample(
                    o,
                    "lasthop_engine_xdp_tcp_events_total",
                    &format!("event=\"{event}\""),
                    self.sum(|c| &c.xdp_tcp[i]),
                );
            }
        }
        family(
            o,
            "lasthop_engine_connections_accepted_total",
            "counter",
            "Client connections accepted.",
        );
        sample(
            o,
            "lasthop_engine_connections_accepted_total",
            "",
            self.sum(|c| &c.accepted),
        );
        family(
            o,
            "lasthop_engine_connections_closed_total",
            "counter",
            "Client connections closed.",
        );
        sample(
            o,
            "lasthop_engine_connections_closed_total",
            "",
            self.sum(|c| &c.closed),
        );
        family(
            o,
            "lasthop_engine_received_bytes_total",
            "counter",
            "Bytes read from clients.",
        );
        sample(
            o,
            "lasthop_engine_received_bytes_total",
            "",
            self.sum(|c| &c.bytes_in),
        );
        family(
            o,
            "lasthop_engine_sent_bytes_total",
            "counter",
            "Bytes written to clients.",
        );
        sample(
            o,
            "lasthop_engine_sent_bytes_total",
            "",
            self.sum(|c| &c.bytes_out),
        );

        family(
            o,
            "lasthop_engine_origin_replies_total",
            "counter",
            "Origin read-through answers delivered to serving cores, by outcome.",
        );
        for (i, name) in ORIGIN_OUTCOMES.iter().enumerate() {
            sample(
                o,
                "lasthop_engine_origin_replies_total",
                &format!("outcome=\"{name}\""),
                self.sum(|c| &c.origin[i]),
            );
        }
        if let Some(control) = &self.control {
            control.render(o);
        }
        if let Some(stats) = &self.origin {
            stats.render(o);
        }
        if let Some(feed) = &self.feed {
            feed.render(o);
        }
        if let Some(tls) = &self.tls {
            tls.render(o);
        }
        if let Some(quic) = &self.quic {
            quic.render(o);
        }
        if let Some(clicks) = &self.clicks {
            clicks.render(o);
        }

        family(
            o,
            "lasthop_engine_snapshot_sequence",
            "gauge",
            "Feed sequence of the snapshot being served.",
        );
        sample(
            o,
            "lasthop_engine_snapshot_sequence",
            "",
            self.snapshot_sequence.load(Ordering::Relaxed),
        );
        family(
            o,
            "lasthop_engine_snapshot_links",
            "gauge",
            "Links in the snapshot being served.",
        );
        sample(
            o,
            "lasthop_engine_snapshot_links",
            "",
            self.snapshot_links.load(Ordering::Relaxed),
        );
        family(
            o,
            "lasthop_engine_snapshot_swaps_total",
            "counter",
            "Snapshots swapped in since start.",
        );
        sample(
            o,
            "lasthop_engine_snapshot_swaps_total",
            "",
            self.snapshot_swaps.load(Ordering::Relaxed),
        );

        let flag = |b: &AtomicBool| u64::from(b.load(Ordering::Relaxed));
        family(
            o,
            "lasthop_engine_ready",
            "gauge",
            "1 when /readyz answers 200 (degraded included).",
        );
        sample(
            o,
            "lasthop_engine_ready",
            "",
            u64::from(self.health.readiness().is_ok()),
        );
        family(
            o,
            "lasthop_engine_feed_lost",
            "gauge",
            "1 while the feed's heartbeat is missing (safe mode).",
        );
        sample(
            o,
            "lasthop_engine_feed_lost",
            "",
            flag(&self.health.feed_lost),
        );
        family(
            o,
            "lasthop_engine_snapshot_missing",
            "gauge",
            "1 while no usable snapshot is mapped.",
        );
        sample(
            o,
            "lasthop_engine_snapshot_missing",
            "",
            flag(&self.health.snapshot_missing),
        );
        out
    }
}

/// `us` microseconds as decimal seconds without float rounding, e.g. 1 → "0.000001".
fn format_seconds_from_us(us: u64) -> String {
    let s = format!("{}.{:06}", us / 1_000_000, us % 1_000_000);
    let s = s.trim_end_matches('0');
    s.strip_suffix('.').unwrap_or(s).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::prom::tests::check_exposition;

    #[test]
    fn latency_buckets_are_log2_microseconds() {
        assert_eq!(latency_bucket(0), 0);
        assert_eq!(latency_bucket(1_000), 0);
        assert_eq!(latency_bucket(1_001), 1);
        assert_eq!(latency_bucket(2_000), 1);
        assert_eq!(latency_bucket(2_001), 2);
        assert_eq!(latency_bucket(1_000 << 20), 20);
        assert_eq!(latency_bucket((1_000 << 20) + 1), LATENCY_BUCKETS);
        assert_eq!(latency_bucket(u64::MAX), LATENCY_BUCKETS);
        assert_eq!(format_seconds_from_us(1), "0.000001");
        assert_eq!(format_seconds_from_us(1 << 20), "1.048576");
        assert_eq!(format_seconds_from_us(1_000_000), "1");
    }

    #[test]
    fn core_metrics_are_line_aligned() {
        assert_eq!(std::mem::align_of::<CoreMetrics>(), 128);
        let m = EngineMetrics::new(3, "epoll");
        for c in &m.cores {
            assert_eq!(Arc::as_ptr(c) as usize % 128, 0);
        }
    }

    #[test]
    fn renders_valid_prometheus_text() {
        let m = EngineMetrics::new(2, "io_uring");
        let (a, b) = (&m.cores[0], &m.cores[1]);
        a.request(StatusClass::of(302));
        a.request(StatusClass::of(302));
        b.request(StatusClass::of(302));
        b.request(StatusClass::of(404));
        b.request(StatusClass::of(503));
        a.answer(3);
        b.answer(1);
        b.answer(99); // ignored
        a.latency_ns(500);
        a.latency(Duration::from_micros(3));
        b.latency(Duration::from_secs(5));
        a.connection_opened();
        a.connection_opened();
        a.connection_closed();
        b.bytes_in(100);
        a.bytes_out(40);
        b.origin_reply(&crate::origin::OriginAnswer::NotFound);
        m.snapshot_sequence.store(42, Ordering::Relaxed);
        m.snapshot_links.store(1_000_000, Ordering::Relaxed);
        let text = m.render_prometheus();
        check_exposition(&text);
        for line in [
            "lasthop_engine_io_backend{backend=\"io_uring\"} 1",
            "lasthop_engine_cores 2",
            "lasthop_engine_requests_total{status=\"302\"} 3",
            "lasthop_engine_requests_total{status=\"404\"} 1",
            "lasthop_engine_requests_total{status=\"other\"} 1",
            "lasthop_engine_requests_total{status=\"425\"} 0",
            "lasthop_engine_core_requests_total{core=\"0\"} 2",
            "lasthop_engine_core_requests_total{core=\"1\"} 3",
            "lasthop_engine_answers_total{layer=\"snapshot\"} 1",
            "lasthop_engine_answers_total{layer=\"high_water\"} 1",
            "lasthop_engine_answers_total{layer=\"origin\"} 0",
            "lasthop_engine_request_duration_seconds_bucket{le=\"0.000001\"} 1",
            "lasthop_engine_request_duration_seconds_bucket{le=\"0.000002\"} 1",
            "lasthop_engine_request_duration_seconds_bucket{le=\"0.000004\"} 2",
            "lasthop_engine_request_duration_seconds_bucket{le=\"1.048576\"} 2",
            "lasthop_engine_request_duration_seconds_bucket{le=\"+Inf\"} 3",
            "lasthop_engine_request_duration_seconds_sum 5.000003500",
            "lasthop_engine_request_duration_seconds_count 3",
            "lasthop_engine_open_connections{core=\"0\"} 1",
            "lasthop_engine_open_connections{core=\"1\"} 0",
            "lasthop_engine_connections_accepted_total 2",
            "lasthop_engine_connections_closed_total 1",
            "lasthop_engine_received_bytes_total 100",
            "lasthop_engine_sent_bytes_total 40",
            "lasthop_engine_origin_replies_total{outcome=\"not_found\"} 1",
            "lasthop_engine_snapshot_sequence 42",
            "lasthop_engine_snapshot_links 1000000",
            "lasthop_engine_ready 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
    }

    #[test]
    fn readiness_reasons() {
        let h = Health::default();
        assert_eq!(h.readiness(), Err("starting"));
        h.ready.store(true, Ordering::Relaxed);
        assert_eq!(h.readiness(), Ok(None));
        h.feed_lost.store(true, Ordering::Relaxed);
        assert_eq!(h.readiness(), Ok(Some("feed lost, safe mode")));
        h.snapshot_missing.store(true, Ordering::Relaxed);
        assert_eq!(h.readiness(), Err("snapshot missing"));
    }

    #[test]
    fn connection_gauge_never_wraps() {
        let c = CoreMetrics::new();
        c.connection_closed();
        assert_eq!(c.open_connections(), 0);
    }
}
