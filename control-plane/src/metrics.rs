//! The control plane's Prometheus registry.

use prometheus::{
    Encoder, Gauge, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts,
    Registry, TextEncoder,
};

/// Every metric the control plane exports.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Requests by matched route and status.
    pub requests: IntCounterVec,
    /// Request latency by matched route.
    pub latency: HistogramVec,
    /// Create latency (validation to durable answer).
    pub create_latency: Histogram,
    /// Operations per group commit.
    pub commit_batch: Histogram,
    /// Seconds per group commit (begin to fsync done).
    pub commit_seconds: Histogram,
    /// Engines that reported in the last ten minutes (set at each scrape).
    pub edge_engines: IntGauge,
    /// The largest `lag_seconds` of any engine (FEED.md, "Status reports").
    pub edge_worst_lag_seconds: Gauge,
    /// The largest `lag_seq` of any engine.
    pub edge_worst_lag_sequences: IntGauge,
    /// 1 while any engine is more than `--edge-lag-alarm-secs` behind.
    pub edge_lag_alarm: IntGauge,
}

fn registered<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: prometheus::Result<T>,
) -> prometheus::Result<T> {
    let metric = metric?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> prometheus::Result<Self> {
        let registry = Registry::new_custom(Some("lasthop".into()), None)?;
        let latency_buckets = vec![
            0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
        ];
        Ok(Metrics {
            requests: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new("api_requests_total", "API requests by route and status"),
                    &["route", "status"],
                ),
            )?,
            latency: registered(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new("api_request_seconds", "API request latency by route")
                        .buckets(latency_buckets.clone()),
                    &["route"],
                ),
            )?,
            create_latency: registered(
                &registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "create_seconds",
                        "Link creation latency, request to durable answer",
                    )
                    .buckets(latency_buckets.clone()),
                ),
            )?,
            commit_batch: registered(
                &registry,
                Histogram::with_opts(
                    HistogramOpts::new("store_commit_ops", "Operations per group commit").buckets(
                        vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0],
                    ),
                ),
            )?,
            commit_seconds: registered(
                &registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "store_commit_seconds",
                        "Group commit duration (fsync included)",
                    )
                    .buckets(latency_buckets),
                ),
            )?,
            edge_engines: registered(
                &registry,
                IntGauge::new(
                    "edge_engines",
                    "Engines that reported in the last 10 minutes",
                ),
            )?,
            edge_worst_lag_seconds: registered(
                &registry,
                Gauge::new(
                    "edge_worst_lag_seconds",
                    "Largest time since an engine last reported having applied everything",
                ),
            )?,
            edge_worst_lag_sequences: registered(
                &registry,
                IntGauge::new(
                    "edge_worst_lag_sequences",
                    "Largest number of committed changes an engine has not applied",
                ),
            )?,
            edge_lag_alarm: registered(
                &registry,
                IntGauge::new(
                    "edge_lag_alarm",
                    "1 while any engine is more than --edge-lag-alarm-secs behind",
                ),
            )?,
            registry,
        })
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            tracing::error!(error = %e, "encoding metrics");
        }
        String::from_utf8(buf).unwrap_or_default()
    }
}
