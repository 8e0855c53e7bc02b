//! `lasthop-clicks`: the click stream processor and what it writes (docs/ARCHITECTURE.md, "The
//! click pipeline"), as a library for `lasthop-control serve` and as its own program
//! (`lasthop-clicks process|archive|recompute|synth`).
//!
//! Events come from a [`spool`] directory (the embedded default) or a Kafka consumer group
//! ([`kafka`]), as the [`source`] says; the [`processor`] drops duplicates, classifies bots,
//! keeps per-(code, day) rollups in memory and, every flush interval, (1) upserts the dirty
//! rollups and the source offsets in one transaction of the rollup [`store`], (2) only then
//! commits Kafka offsets or marks consumed spool segments done. The raw events go to the archive
//! by their own consumer ([`archiver`]: Parquet objects, [`columnar`], on object storage,
//! [`objects`]). [`recompute`] rebuilds a day from the archive with the
//! current rules; [`stats`] answers `GET /v1/links/{code}/stats`; [`synth`] fills a spool or a
//! topic with realistic events for tests and `perf/clicks.sh`.
//!
//! Layout under the data dir: `clicks/spool/` (default spool), `clicks/rollups.redb`, the
//! archive consumer's `clicks/archive-positions.json` and `clicks/archive-uploads.json`, and the
//! default archive `clicks/archive/day=YYYY-MM-DD/hour=HH/*.parquet` ([`objects`]; days written
//! before Parquet: `clicks/archive/<YYYY-MM-DD>/<part:06>.ndjson.zst`, [`archive`]).
//!
//! Cargo features, both on by default: `kafka` (the Kafka consumer and synth's producer,
//! librdkafka) and `clickhouse` (the ClickHouse rollup store). A build without one still parses
//! every flag, and fails at start, naming the feature, when asked for what it left out.

pub mod archive;
pub mod archiver;
pub mod cli;
pub mod columnar;
pub mod convert;
pub mod day;
mod footer;
pub mod kafka;
pub mod metrics;
pub mod objects;
pub mod processor;
pub mod recompute;
pub mod source;
pub mod spool;
pub mod stats;
pub mod store;
pub mod synth;

pub use day::Day;
pub use processor::{ClicksHandle, Outcomes, Processor, ProcessorConfig, RunSummary};
pub use recompute::{RecomputeError, RecomputeReport};
pub use source::{ProcessorError, SourceConfig};
pub use store::{DayState, RollupStore, StoreError as RollupStoreError, StoreLocation};
