//! Synthetic events produced to a Kafka topic (built with the `kafka` feature).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lasthop_core::click::ClickEvent;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::ClientContext;

use super::{Synth, SynthConfig, SynthError, SynthReport};

struct Delivery {
    failed: Arc<AtomicU64>,
}

impl ClientContext for Delivery {}

impl ProducerContext for Delivery {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if result.is_err() {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Produces `cfg.events` events to `topic` (key = the link key, value = one event), waits for
/// delivery.
pub fn produce_kafka(
    brokers: &str,
    topic: &str,
    compression: &str,
    cfg: SynthConfig,
) -> Result<SynthReport, SynthError> {
    let failed = Arc::new(AtomicU64::new(0));
    let mut config = ClientConfig::new();
    for (k, v) in lasthop_core::click::KAFKA_PRODUCER {
        config.set(*k, *v);
    }
    let producer: BaseProducer<Delivery> = config
        .set("bootstrap.servers", brokers)
        .set("queue.buffering.max.messages", "1000000")
        .set("compression.type", compression)
        .create_with_context(Delivery {
            failed: Arc::clone(&failed),
        })?;
    let total = cfg.events;
    let mut synth = Synth::new(cfg);
    let mut report = SynthReport::default();
    let mut value = Vec::new();
    for _ in 0..total {
        value.clear();
        synth.next_into(&mut value);
        // The link is inside the event; decode it back rather than track it twice.
        let key = ClickEvent::decode(&value)
            .map(|(e, _)| e.link_key())
            .unwrap_or_default();
        let key: &str = &key;
        let mut record = BaseRecord::to(topic).key(key).payload(&value);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull,
                    ),
                    r,
                )) => {
                    producer.poll(Duration::from_millis(50));
                    record = r;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        report.bytes += value.len() as u64;
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(120))?;
    report.events = total;
    report.duplicates = synth.duplicates;
    report.failed = failed.load(Ordering::Relaxed);
    Ok(report)
}
