//! The Kafka source: a consumer group on the clicks topic (key = the link key, value = one event).
//!
//! Offsets are committed to the group only after the flush covering them committed (no
//! auto-commit). The processor also stores each partition's next offset in the rollup store in
//! the same transaction as the rollups, and this source skips messages below it: a crash between
//! that transaction and the group commit, or a rebalance that hands a partition back at the
//! group's older offset, never counts a message twice. A stored offset above the partition's
//! high watermark means the topic was recreated (or truncated): it is reset, with a warning and
//! a count in the errors counter, instead of skipping every message for ever. A broker that is
//! down is retried by librdkafka forever; errors are counted
//! (`lasthop_clicks_kafka_errors_total`) and logged at most every few seconds.
//!
//! With the embedded store the stored offsets live in this processor's local file, so one
//! processor consumes a topic: the group gives failover, not sharding. With a shared store
//! (ClickHouse) several processors split the partitions: at every rebalance a processor drops
//! what it had not flushed of the partitions it lost (the processor is told with
//! [`Input::Revoked`](crate::spool::Input::Revoked)) and starts each partition it gains from
//! the position the store holds, whoever wrote it (see `store/clickhouse.rs` for the per-row
//! half of exactly-once).
//!
//! The consumer (`kafka/consumer.rs`, librdkafka) is built with the `kafka` feature; the
//! configuration here always is, so `--kafka` and `--clicks-kafka` parse in every build, and
//! without the feature [`KafkaSource::open`] says so.

#[cfg(feature = "kafka")]
mod consumer;

pub use consumer::KafkaSource;

/// Where to consume from.
#[derive(Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
    /// How long the group waits for a silent member (a killed processor) before handing its
    /// partitions to the others (librdkafka's `session.timeout.ms`).
    pub session_timeout_ms: u32,
    /// `--clicks-kafka-option`s: librdkafka properties set after lasthop's own (TLS, SASL,
    /// tuning). Values are never logged (a SASL password is one).
    pub options: Vec<(String, String)>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The options' keys only: a value may be a password.
        let keys: Vec<&str> = self.options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("group", &self.group)
            .field("session_timeout_ms", &self.session_timeout_ms)
            .field("options", &keys)
            .finish()
    }
}

/// `--clicks-kafka-option KEY=VALUE`.
pub fn parse_option(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err("expected KEY=VALUE (a librdkafka property)".to_string()),
    }
}

/// librdkafka's default `session.timeout.ms`.
pub const DEFAULT_SESSION_TIMEOUT_MS: u32 = 45_000;

/// Why the consumer could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaSourceError {
    /// librdkafka refused the configuration or the subscription.
    #[cfg(feature = "kafka")]
    #[error("kafka consumer: {0}")]
    Setup(#[from] rdkafka::error::KafkaError),
    /// This build has no Kafka consumer.
    #[error(
        "Kafka source (--kafka, --clicks-kafka): this build of lasthop-clicks has no `kafka` feature"
    )]
    NotBuilt,
}

/// The prefix of this topic's keys among the store's source offsets.
pub fn key_prefix(topic: &str) -> String {
    format!("kafka/{topic}/")
}

/// Without the `kafka` feature: a consumer that cannot be opened. It has no values, so the
/// processor's and the archive consumer's Kafka arms cannot be reached and need no `cfg` of
/// their own (as std's `sys/pal/unsupported` stubs do).
#[cfg(not(feature = "kafka"))]
mod consumer {
    use std::sync::Arc;
    use std::time::Duration;

    use prometheus::IntCounter;

    use super::{KafkaConfig, KafkaSourceError};
    use crate::spool::{Input, Polled};
    use crate::store::RollupStore;

    /// A consumer of the clicks topic (none in this build).
    #[derive(Debug)]
    pub enum KafkaSource {}

    impl KafkaSource {
        /// Always [`KafkaSourceError::NotBuilt`].
        pub fn open(
            _: &KafkaConfig,
            _: Vec<(String, u64)>,
            _: IntCounter,
            _: Option<Arc<RollupStore>>,
        ) -> Result<KafkaSource, KafkaSourceError> {
            Err(KafkaSourceError::NotBuilt)
        }

        pub fn poll(&mut self, _: Duration, _: impl FnMut(Input<'_>)) -> Polled {
            match *self {}
        }

        pub fn checkpoint(&self) -> Vec<(String, Option<u64>)> {
            match *self {}
        }

        pub fn committed(&mut self) {
            match *self {}
        }

        pub fn rewind(&mut self, _: i32) {
            match *self {}
        }

        pub fn owns(&self, _: i32) -> bool {
            match *self {}
        }

        pub fn next_offsets(&self) -> &std::collections::BTreeMap<i32, i64> {
            match *self {}
        }

        pub fn commit_offsets(&mut self, _: &std::collections::BTreeMap<i32, i64>) {
            match *self {}
        }

        pub fn holds_all(&self) -> bool {
            match *self {}
        }

        pub fn drained(&self) -> bool {
            match *self {}
        }
    }
}
