//! The control plane's Prometheus registry.

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
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
    /// Bytes the embedded store's page cache holds (set at each scrape; 0 on PostgreSQL,
    /// whose cache is its server's).
    pub store_cache_bytes: IntGauge,
    /// Engines that reported in the last ten minutes (set at each scrape).
    pub edge_engines: IntGauge,
    /// The largest `lag_seconds` of any engine (core/FEED.md, "Status reports").
    pub edge_worst_lag_seconds: Gauge,
    /// The largest `lag_seq` of any engine.
    pub edge_worst_lag_sequences: IntGauge,
    /// 1 while any engine is more than `--edge-lag-alarm-secs` behind.
    pub edge_lag_alarm: IntGauge,
    /// Branded domains by status (`pending`, `active`, `expired`, `suspended`), set at scrapes.
    pub domains: IntGaugeVec,
    /// Seconds until the nearest `not_after` of an unsuspended domain's certificate, negative
    /// once one has expired (+Inf with none).
    pub domain_certificate_expiry_seconds: Gauge,
    /// ACME orders by result (`issued`, `failed`; an attempt that tried both challenge types
    /// counts once).
    pub acme_orders: IntCounterVec,
    /// When each failing domain's last ACME attempt failed (Unix seconds), by the ACME problem
    /// type (`connection`, `dns`, `unauthorized`, ... `timeout`, `other`); gone once it succeeds.
    pub acme_last_error: GaugeVec,
    /// Replication from each peer region (`--peer`), set at each scrape: 1 while its last
    /// request succeeded.
    pub peer_connected: IntGaugeVec,
    /// Changes of a peer region's log not applied here (as of its last known head).
    pub peer_lag_changes: IntGaugeVec,
    /// Seconds since this region last had everything a peer region had.
    pub peer_lag_seconds: GaugeVec,
    /// 1 while a peer region's lag is past `--peer-lag-alarm-secs`.
    pub peer_lag_alarm: IntGaugeVec,
    /// The click pipeline's (`lasthop-clicks`), in the same registry.
    pub clicks: lasthop_clicks::metrics::ClickMetrics,
    /// Entries of each reputation list as loaded now.
    pub reputation_list_entries: IntGaugeVec,
    /// Malformed (skipped) lines of each list's loaded version.
    pub reputation_list_malformed_lines: IntGaugeVec,
    /// When each list's loaded version was read (Unix seconds).
    pub reputation_list_loaded_seconds: GaugeVec,
    /// 1 while a list's last reload failed and its previous version is still in use.
    pub reputation_list_stale: IntGaugeVec,
    /// Reloads that failed, by list.
    pub reputation_list_load_failures: IntCounterVec,
    /// Creates refused by trust and safety, by reason (`list:<name>`, `shortener_chain`).
    pub creates_blocked: IntCounterVec,
    /// Links created held, by hold (`unverified`, `velocity`).
    pub creates_held: IntCounterVec,
    /// Links taken down or flagged by trust and safety, by source (`list`, `scanner`, `host`,
    /// `suspension`, `report`).
    pub safety_actions: IntCounterVec,
    /// Asks of an old shortener by the lazy fallback (issue 44), by outcome (`imported`,
    /// `not_there`, `remembered`, `refused`, `failed`, `rate_limited`).
    pub legacy_fallback: IntCounterVec,
    /// Scanner verdicts by verdict (`clean`, `warn`, `block`) and pass (`new`, `rescan`).
    pub scan_verdicts: IntCounterVec,
    /// Verdict webhook failures by kind (`timeout`, `connect`, `status`, `garbage`, `skipped`).
    pub scan_webhook_errors: IntCounterVec,
    /// Creation to first verdict, seconds (how long a held link waits).
    pub scan_first_verdict_seconds: Histogram,
    /// 1 while this control plane runs the scanner (on a shared store one does at a time).
    pub scanner_leader: IntGauge,
    /// Links the re-scan has checked, and its completed sweeps.
    pub rescan_checked: IntCounter,
    pub rescan_sweeps: IntCounter,
    /// Owners flagged by creation velocity, and suspended owners.
    pub owners_flagged: IntGauge,
    pub owners_suspended: IntGauge,
    /// Reports and appeals filed, by kind.
    pub reports: IntCounterVec,
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
            store_cache_bytes: registered(
                &registry,
                IntGauge::new(
                    "store_cache_bytes",
                    "Bytes the embedded store's page cache holds in this process (0 on PostgreSQL)",
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
            domains: registered(
                &registry,
                IntGaugeVec::new(
                    Opts::new("domains", "Branded domains by status"),
                    &["status"],
                ),
            )?,
            domain_certificate_expiry_seconds: registered(
                &registry,
                Gauge::new(
                    "domain_certificate_expiry_seconds",
                    "Seconds until the nearest expiry of an unsuspended branded domain's certificate, negative once expired (+Inf with none)",
                ),
            )?,
            acme_orders: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new("acme_orders_total", "ACME certificate orders by result"),
                    &["result"],
                ),
            )?,
            acme_last_error: registered(
                &registry,
                GaugeVec::new(
                    Opts::new(
                        "acme_last_error_timestamp_seconds",
                        "When the domain's last ACME attempt failed, by ACME problem type (gone once it succeeds)",
                    ),
                    &["domain", "problem"],
                ),
            )?,
            peer_connected: registered(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "region_peer_connected",
                        "1 while replication from the peer region is connected",
                    ),
                    &["region"],
                ),
            )?,
            peer_lag_changes: registered(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "region_peer_lag_changes",
                        "Changes of the peer region's log not applied here",
                    ),
                    &["region"],
                ),
            )?,
            peer_lag_seconds: registered(
                &registry,
                GaugeVec::new(
                    Opts::new(
                        "region_peer_lag_seconds",
                        "Seconds since this region last had everything the peer region had",
                    ),
                    &["region"],
                ),
            )?,
            peer_lag_alarm: registered(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "region_peer_lag_alarm",
                        "1 while the peer region's lag is past --peer-lag-alarm-secs",
                    ),
                    &["region"],
                ),
            )?,
            clicks: lasthop_clicks::metrics::ClickMetrics::register(&registry)?,
            reputation_list_entries: registered(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "reputation_list_entries",
                        "Entries of each reputation list as loaded",
                    ),
                    &["list"],
                ),
            )?,
            reputation_list_malformed_lines: registered(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "reputation_list_malformed_lines",
                        "Malformed lines skipped in each list's loaded version",
                    ),
                    &["list"],
                ),
            )?,
            reputation_list_loaded_seconds: registered(
                &registry,
                GaugeVec::new(
                    Opts::new(
                        "reputation_list_loaded_timestamp_seconds",
                        "When each list's loaded version was read",
                    ),
                    &["list"],
                ),
            )?,
            reputation_list_stale: registered(
                &registry,
                IntGaugeVec::new(
                    Opts::new(
                        "reputation_list_stale",
                        "1 while a list's last reload failed and its previous version serves",
                    ),
                    &["list"],
                ),
            )?,
            reputation_list_load_failures: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "reputation_list_load_failures_total",
                        "Failed reloads of each reputation list",
                    ),
                    &["list"],
                ),
            )?,
            creates_blocked: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "creates_blocked_total",
                        "Creates refused as destination_blocked, by reason",
                    ),
                    &["reason"],
                ),
            )?,
            creates_held: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new("creates_held_total", "Links created held, by hold"),
                    &["hold"],
                ),
            )?,
            legacy_fallback: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "legacy_fallback_total",
                        "Asks of an old shortener by the lazy fallback, by outcome",
                    ),
                    &["outcome"],
                ),
            )?,
            safety_actions: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "safety_actions_total",
                        "Links taken down or flagged by trust and safety, by source",
                    ),
                    &["source"],
                ),
            )?,
            scan_verdicts: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "scan_verdicts_total",
                        "Scanner verdicts by verdict and pass",
                    ),
                    &["verdict", "pass"],
                ),
            )?,
            scan_webhook_errors: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new(
                        "scan_webhook_errors_total",
                        "Verdict webhook failures by kind",
                    ),
                    &["kind"],
                ),
            )?,
            scan_first_verdict_seconds: registered(
                &registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "scan_first_verdict_seconds",
                        "Link creation to its first scan verdict",
                    )
                    .buckets(vec![
                        0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
                    ]),
                ),
            )?,
            scanner_leader: registered(
                &registry,
                IntGauge::new(
                    "scanner_leader",
                    "1 while this control plane runs the scanner",
                ),
            )?,
            rescan_checked: registered(
                &registry,
                IntCounter::new("rescan_checked_total", "Links checked by the re-scan"),
            )?,
            rescan_sweeps: registered(
                &registry,
                IntCounter::new("rescan_sweeps_total", "Completed re-scan sweeps"),
            )?,
            owners_flagged: registered(
                &registry,
                IntGauge::new("owners_flagged", "Owners flagged by creation velocity"),
            )?,
            owners_suspended: registered(
                &registry,
                IntGauge::new("owners_suspended", "Suspended owners"),
            )?,
            reports: registered(
                &registry,
                IntCounterVec::new(
                    Opts::new("reports_total", "Reports and appeals filed, by kind"),
                    &["kind"],
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
