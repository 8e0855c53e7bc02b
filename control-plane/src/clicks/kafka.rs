//! The Kafka source: a consumer group on the clicks topic (key = code, value = one event).
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
//! The stored offsets live in this processor's local store, so one processor (one store)
//! consumes a topic: the consumer group gives failover, not sharding. Two processors in one
//! group would split the partitions between two stores, and a rebalance between them replays up
//! to a flush interval into the store that takes a partition over.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use lasthop_core::click::ClickEvent;

use super::spool::{Input, Polled};

/// Most messages handed over per poll.
const BATCH: usize = 65_536;
/// At most one error log line per this long (they are counted regardless).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Where to consume from.
#[derive(Debug, Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The topic.
    pub topic: String,
    /// The consumer group.
    pub group: String,
}

/// Why the consumer could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaSourceError {
    /// librdkafka refused the configuration or the subscription.
    #[error("kafka consumer: {0}")]
    Setup(#[from] KafkaError),
}

/// Routes librdkafka's log and error callbacks to tracing and the error counter.
struct Context {
    errors: IntCounter,
    last_log: std::sync::Mutex<Option<Instant>>,
}

impl Context {
    fn should_log(&self) -> bool {
        let Ok(mut last) = self.last_log.lock() else {
            return true;
        };
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

impl ClientContext for Context {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => tracing::error!(target: "librdkafka", fac, "{message}"),
            RDKafkaLogLevel::Warning => tracing::warn!(target: "librdkafka", fac, "{message}"),
            _ => tracing::debug!(target: "librdkafka", fac, "{message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        self.errors.inc();
        if self.should_log() {
            tracing::warn!(error = %error, reason, "kafka client error (retrying)");
        }
    }
}

impl ConsumerContext for Context {}

/// A consumer of the clicks topic.
pub struct KafkaSource {
    consumer: BaseConsumer<Context>,
    topic: String,
    key_prefix: String,
    /// Next offset to count, per partition (stored or consumed).
    next: BTreeMap<i32, i64>,
    /// `next` as of the last committed flush.
    committed: BTreeMap<i32, i64>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topic", &self.topic)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

/// The prefix of this topic's keys among the store's source offsets.
pub fn key_prefix(topic: &str) -> String {
    format!("kafka/{topic}/")
}

impl KafkaSource {
    /// Subscribes to the topic; `stored` holds the positions from the rollup store (keys without
    /// [`key_prefix`], i.e. partition numbers). Needs no broker to be up.
    pub fn open(
        config: &KafkaConfig,
        stored: Vec<(String, u64)>,
        errors: IntCounter,
    ) -> Result<KafkaSource, KafkaSourceError> {
        let consumer: BaseConsumer<Context> = ClientConfig::new()
            .set("bootstrap.servers", &config.brokers)
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("queued.min.messages", "200000")
            .set("fetch.wait.max.ms", "100")
            .set_log_level(RDKafkaLogLevel::Warning)
            .create_with_context(Context {
                errors,
                last_log: std::sync::Mutex::new(None),
            })?;
        consumer.subscribe(&[config.topic.as_str()])?;
        let next: BTreeMap<i32, i64> = stored
            .into_iter()
            .filter_map(|(p, o)| Some((p.parse().ok()?, i64::try_from(o).ok()?)))
            .collect();
        Ok(KafkaSource {
            consumer,
            key_prefix: key_prefix(&config.topic),
            topic: config.topic.clone(),
            committed: next.clone(),
            next,
        })
    }

    /// Hands over what arrived (waiting up to `wait` for the first message).
    pub fn poll(&mut self, wait: Duration, mut sink: impl FnMut(Input<'_>)) -> Polled {
        let mut polled = Polled::default();
        let mut timeout = wait;
        // Partitions whose skipped messages were checked against the high watermark.
        let mut checked: Vec<i32> = Vec::new();
        for _ in 0..BATCH {
            match self.consumer.poll(timeout) {
                None => break,
                Some(Err(e)) => {
                    self.consumer.context().error(e, "poll");
                    break;
                }
                Some(Ok(m)) => {
                    timeout = Duration::ZERO;
                    polled.consumed += 1;
                    let (p, offset) = (m.partition(), m.offset());
                    let stored = self.next.get(&p).copied().unwrap_or(0);
                    if offset < stored {
                        // Counted before a crash or rebalance (the group's offset lagged ours),
                        // unless our offset is past the partition's end. Asked once per poll:
                        // a replay skips many messages in a row.
                        let first = !checked.contains(&p);
                        if first {
                            checked.push(p);
                        }
                        if !(first && self.past_end(p, stored)) {
                            continue;
                        }
                    }
                    self.next.insert(p, offset + 1);
                    let payload = m.payload().unwrap_or_default();
                    match ClickEvent::decode(payload) {
                        Ok((e, used)) if used == payload.len() => {
                            polled.events += 1;
                            sink(Input::Event(e, payload));
                        }
                        _ => sink(Input::Invalid),
                    }
                }
            }
        }
        polled
    }

    /// Whether `stored` (partition `p`'s next offset) is above the partition's high watermark:
    /// the topic was recreated or truncated since it was stored. Logs and counts it.
    fn past_end(&self, p: i32, stored: i64) -> bool {
        let high = match self
            .consumer
            .fetch_watermarks(&self.topic, p, Duration::from_secs(2))
        {
            Ok((_, high)) => high,
            Err(e) => {
                self.consumer.context().error(e, "watermarks");
                return false;
            }
        };
        if high < 0 || stored <= high {
            return false;
        }
        self.consumer.context().errors.inc();
        tracing::warn!(
            topic = %self.topic,
            partition = p,
            stored,
            high_watermark = high,
            "stored offset is past the partition's end (topic recreated?); counting from what the broker holds"
        );
        true
    }

    /// Positions changed since the last commit, keyed `kafka/<topic>/<partition>`.
    pub fn checkpoint(&self) -> Vec<(String, Option<u64>)> {
        self.next
            .iter()
            .filter(|(p, o)| self.committed.get(p) != Some(o))
            .map(|(p, o)| {
                (
                    format!("{}{p}", self.key_prefix),
                    Some(u64::try_from(*o).unwrap_or(0)),
                )
            })
            .collect()
    }

    /// The checkpoint is durable in our store: commit the same offsets to the group.
    pub fn committed(&mut self) {
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &self.next {
            if self.committed.get(p) != Some(o) {
                if let Err(e) = tpl.add_partition_offset(&self.topic, *p, Offset::Offset(*o)) {
                    self.consumer.context().error(e, "commit list");
                }
            }
        }
        self.committed = self.next.clone();
        if tpl.count() == 0 {
            return;
        }
        // Async: a failed group commit only means a replay that our stored offsets skip.
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            self.consumer.context().error(e, "commit");
        }
    }

    /// Whether every assigned partition is read up to its end (asks the broker).
    pub fn drained(&self) -> bool {
        let Ok(assignment) = self.consumer.assignment() else {
            return false;
        };
        let parts = assignment.elements_for_topic(&self.topic);
        if parts.is_empty() {
            return false;
        }
        parts.iter().all(|e| {
            match self
                .consumer
                .fetch_watermarks(&self.topic, e.partition(), Duration::from_secs(2))
            {
                // Above the end is not drained: the topic was recreated, and `poll` resets the
                // offset when its messages arrive.
                Ok((low, high)) => high <= low || self.next.get(&e.partition()) == Some(&high),
                Err(_) => false,
            }
        })
    }
}
