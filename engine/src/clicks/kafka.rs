//! The Kafka sink: one message per click, keyed by the link's key (its code on the default
//! domain, `domain/code` on a branded one: so one link's clicks stay in one partition and one
//! processor owns its counters, and the same alias on two domains is two links), batched and
//! compressed by librdkafka.
//!
//! Lossy by design and never in the way: `acks=1`, a bounded local queue (a full queue drops and
//! counts), and a delivery timeout after which queued events are counted lost. While the broker
//! is down the redirect path does not notice; when it returns, delivery resumes by itself.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use crate::clicks::{ClickSetupError, Sink, SinkStats};

/// Where and how to produce.
#[derive(Clone)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The click topic.
    pub topic: String,
    /// Most events queued locally (waiting for the broker) before new ones are dropped.
    pub queue_events: u32,
    /// Events undelivered this long are dropped (and counted).
    pub delivery_timeout: Duration,
    /// Extra librdkafka properties (`key=value`: security, tuning), applied last.
    pub options: Vec<(String, String)>,
}

impl std::fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The options' keys only: a value may be a password (`sasl.password`).
        let keys: Vec<&str> = self.options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("topic", &self.topic)
            .field("queue_events", &self.queue_events)
            .field("delivery_timeout", &self.delivery_timeout)
            .field("options", &keys)
            .finish()
    }
}

/// Counts deliveries into the sink's counters (librdkafka calls it from `poll`).
struct Deliveries {
    stats: Arc<SinkStats>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.stats.sent(1),
            Err(_) => self.stats.failed(1),
        }
    }
}

/// Produces click batches to Kafka.
pub struct KafkaSink {
    producer: BaseProducer<Deliveries>,
    topic: String,
    full_logged: bool,
    /// A branded domain's link key, written here for each message (reused).
    key: String,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl KafkaSink {
    /// A producer for `cfg` whose deliveries count into `stats` (the flusher's).
    pub fn new(cfg: &KafkaConfig, stats: Arc<SinkStats>) -> Result<KafkaSink, ClickSetupError> {
        let mut c = ClientConfig::new();
        for (k, v) in lasthop_core::click::KAFKA_PRODUCER {
            c.set(*k, *v);
        }
        c.set("bootstrap.servers", &cfg.brokers)
            .set("queue.buffering.max.messages", cfg.queue_events.to_string())
            .set(
                "message.timeout.ms",
                cfg.delivery_timeout.as_millis().to_string(),
            )
            .set("client.id", "lasthop-engine");
        for (k, v) in &cfg.options {
            c.set(k, v);
        }
        let producer: BaseProducer<Deliveries> = c.create_with_context(Deliveries { stats })?;
        Ok(KafkaSink {
            producer,
            topic: cfg.topic.clone(),
            full_logged: false,
            key: String::new(),
        })
    }
}

impl Sink for KafkaSink {
    fn send(&mut self, events: &[u8], count: u32, stats: &SinkStats) {
        let mut rest = events;
        let (mut seen, mut queued) = (0u32, 0u32);
        while !rest.is_empty() {
            // Our own encoding, decoded only to find each event's end and link (the key).
            let Ok((event, used)) = lasthop_core::click::ClickEvent::decode(rest) else {
                break;
            };
            let record = BaseRecord::to(&self.topic)
                .key(event.link_key_in(&mut self.key))
                .payload(&rest[..used]);
            match self.producer.send(record) {
                Ok(()) => queued += 1,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    if !self.full_logged {
                        tracing::warn!("Kafka queue full (broker slow or down); dropping clicks");
                        self.full_logged = true;
                    }
                    stats.failed(1);
                }
                Err((e, _)) => {
                    tracing::debug!(error = %e, "producing a click failed");
                    stats.failed(1);
                }
            }
            seen += 1;
            rest = &rest[used..];
        }
        if queued == count {
            self.full_logged = false;
        }
        // Whatever did not decode (cannot happen for our own bytes) is lost, and counted.
        if seen < count {
            stats.failed(u64::from(count - seen));
        }
        self.producer.poll(Duration::ZERO);
    }

    fn tick(&mut self, _stats: &SinkStats) {
        self.producer.poll(Duration::ZERO);
    }

    fn close(&mut self, stats: &SinkStats) {
        if let Err(e) = self.producer.flush(Duration::from_secs(5)) {
            let left = self.producer.in_flight_count().max(0) as u64;
            tracing::warn!(error = %e, undelivered = left, "clicks undelivered at shutdown");
            stats.failed(left);
        }
    }

    fn kind(&self) -> &'static str {
        "kafka"
    }
}
