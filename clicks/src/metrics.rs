//! The click pipeline's Prometheus metrics, registered into the registry of the program that
//! runs it (`lasthop-control serve`, or `lasthop-clicks`), under its `lasthop_` prefix.

use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, Opts};
use prometheus::{Registry, Result};

/// The processor's and the archive consumer's counters and gauges.
#[derive(Debug, Clone)]
pub struct ClickMetrics {
    /// Click events by outcome: human, bot, duplicate, early_replay, late, invalid; corrupt and torn count
    /// spool frames (or files) whose events are lost.
    pub events: IntCounterVec,
    /// Click processor flushes by result (ok, error).
    pub flushes: IntCounterVec,
    /// Seconds per flush (archive fsync and store commit included).
    pub flush_seconds: Histogram,
    /// Now minus the newest event time the processor has seen.
    pub lag_seconds: Gauge,
    /// Spool bytes not yet read.
    pub spool_pending_bytes: IntGauge,
    /// Kafka client errors (broker down, poll and commit failures).
    pub kafka_errors: IntCounter,
    /// Event ids held by the dedup window.
    pub dedup_ids: IntGauge,
    /// Heap bytes those ids hold.
    pub dedup_bytes: IntGauge,
    /// Of those ids, the ones of writers past the window's cap, held as fingerprints.
    pub dedup_overflow_ids: IntGauge,
    /// (link, day) rollups the processor holds in memory (today's, and yesterday's in its
    /// grace).
    pub rollups_held: IntGauge,
    /// Heap bytes they hold (sketches, breakdowns, keys, table slots).
    pub rollups_held_bytes: IntGauge,
    /// Archive objects written (durable).
    pub archive_objects: IntCounter,
    /// Their bytes.
    pub archive_bytes: IntCounter,
    /// Their rows (events).
    pub archive_rows: IntCounter,
    /// Failed archive uploads (each try).
    pub archive_upload_errors: IntCounter,
    /// Of those, retries of an upload that had failed before.
    pub archive_upload_retries: IntCounter,
    /// Seconds since the oldest event the archive consumer read and has not yet made durable.
    pub archive_unarchived_seconds: Gauge,
}

fn registered<T: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: Result<T>,
) -> Result<T> {
    let metric = metric?;
    registry.register(Box::new(metric.clone()))?;
    Ok(metric)
}

impl ClickMetrics {
    /// The metrics in a registry of their own (a command that serves no `/metrics`).
    pub fn standalone() -> Result<ClickMetrics> {
        ClickMetrics::register(&Registry::new_custom(Some("lasthop".into()), None)?)
    }

    /// The metrics, registered in `registry`.
    pub fn register(registry: &Registry) -> Result<ClickMetrics> {
        Ok(ClickMetrics {
            events: registered(
                registry,
                IntCounterVec::new(
                    Opts::new("clicks_events_total", "Click events by processing outcome"),
                    &["outcome"],
                ),
            )?,
            flushes: registered(
                registry,
                IntCounterVec::new(
                    Opts::new("clicks_flushes_total", "Click processor flushes by result"),
                    &["result"],
                ),
            )?,
            flush_seconds: registered(
                registry,
                Histogram::with_opts(
                    HistogramOpts::new(
                        "clicks_flush_seconds",
                        "Click flush duration: archive fsync and rollup commit",
                    )
                    .buckets(vec![
                        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                    ]),
                ),
            )?,
            lag_seconds: registered(
                registry,
                Gauge::new(
                    "clicks_lag_seconds",
                    "Now minus the newest click event time the processor has seen",
                ),
            )?,
            spool_pending_bytes: registered(
                registry,
                IntGauge::new("clicks_spool_pending_bytes", "Spool bytes not yet read"),
            )?,
            kafka_errors: registered(
                registry,
                IntCounter::new("clicks_kafka_errors_total", "Kafka consumer errors"),
            )?,
            dedup_ids: registered(
                registry,
                IntGauge::new("clicks_dedup_ids", "Event ids held by the dedup window"),
            )?,
            dedup_bytes: registered(
                registry,
                IntGauge::new(
                    "clicks_dedup_bytes",
                    "Heap bytes the dedup window's event ids hold (per-writer bitmaps)",
                ),
            )?,
            dedup_overflow_ids: registered(
                registry,
                IntGauge::new(
                    "clicks_dedup_overflow_ids",
                    "Event ids of writers past the dedup window's cap (65536 engine cores a generation), held as 64-bit fingerprints",
                ),
            )?,
            rollups_held: registered(
                registry,
                IntGauge::new(
                    "clicks_rollups_held",
                    "(link, day) rollups the processor holds in memory",
                ),
            )?,
            rollups_held_bytes: registered(
                registry,
                IntGauge::new(
                    "clicks_rollups_held_bytes",
                    "Heap bytes the processor's rollups in memory hold (sketches, breakdowns, keys, table slots)",
                ),
            )?,
            archive_objects: registered(
                registry,
                IntCounter::new(
                    "clicks_archive_objects_total",
                    "Parquet objects the archive consumer wrote (durable)",
                ),
            )?,
            archive_bytes: registered(
                registry,
                IntCounter::new(
                    "clicks_archive_bytes_total",
                    "Bytes of the archive objects written",
                ),
            )?,
            archive_rows: registered(
                registry,
                IntCounter::new(
                    "clicks_archive_rows_total",
                    "Events (rows) in the archive objects written",
                ),
            )?,
            archive_upload_errors: registered(
                registry,
                IntCounter::new(
                    "clicks_archive_upload_errors_total",
                    "Failed archive uploads, each try",
                ),
            )?,
            archive_upload_retries: registered(
                registry,
                IntCounter::new(
                    "clicks_archive_upload_retries_total",
                    "Retried archive uploads (a try after a failure)",
                ),
            )?,
            archive_unarchived_seconds: registered(
                registry,
                Gauge::new(
                    "clicks_archive_unarchived_seconds",
                    "Seconds since the oldest event the archive consumer read was read, while it is not yet in a durable object (0: none)",
                ),
            )?,
        })
    }
}
