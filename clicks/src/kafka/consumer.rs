//! The Kafka consumer itself (librdkafka), built with the `kafka` feature: see the parent
//! module for how it counts every message once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::Message as _;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use lasthop_core::click::ClickEvent;

use super::{key_prefix, KafkaConfig, KafkaSourceError};
use crate::spool::{Input, Polled};
use crate::store::{Pos, RollupStore};

/// Most messages handed over per poll.
const BATCH: usize = 65_536;
/// At most one error log line per this long (they are counted regardless).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// Routes librdkafka's log and error callbacks to tracing and the error counter.
struct Context {
    errors: IntCounter,
    last_log: std::sync::Mutex<Option<Instant>>,
    changes: std::sync::Mutex<Vec<Change>>,
    group: String,
    topic: String,
    /// A shared store and this topic's key prefix among its positions.
    shared: Option<(Arc<RollupStore>, String)>,
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

impl ConsumerContext for Context {
    /// The eager protocol's rebalance, done here rather than by rdkafka's default so that with
    /// a shared store a gained partition is assigned at the position the store holds: the
    /// fetch starts exactly where the rows stand, whatever the group's offset says (it may
    /// be behind, or ahead when the store's write failed after the group's commit of an
    /// earlier owner).
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let mut gained: Vec<(i32, Option<i64>)> =
                    partitions(tpl).into_iter().map(|p| (p, None)).collect();
                if let Some((store, prefix)) = &self.shared {
                    match store.offsets(prefix) {
                        Ok(stored) => {
                            for (p, at) in &mut gained {
                                let key = format!("{prefix}{p}");
                                *at = stored
                                    .iter()
                                    .find(|(k, _)| *k == key)
                                    .and_then(|(_, o)| i64::try_from(*o).ok());
                                let offset = at.map_or(Offset::Beginning, Offset::Offset);
                                if let Err(e) = tpl.set_partition_offset(&self.topic, *p, offset) {
                                    self.error(e, "assign at the stored position");
                                }
                            }
                        }
                        // The group's offsets then (the rows' own positions skip what they
                        // hold).
                        Err(e) => self.error(
                            KafkaError::Subscription(format!("reading stored positions: {e}")),
                            "assign",
                        ),
                    }
                }
                if let Err(e) = consumer.assign(tpl) {
                    self.error(e, "assign");
                }
                self.push(Change::Assigned(gained));
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                self.push(Change::Revoked(partitions(tpl)));
                if let Err(e) = consumer.unassign() {
                    self.error(e, "unassign");
                }
            }
            // An error: everything is unassigned, the same as losing it all.
            other => {
                if let Ok(list) = consumer.assignment() {
                    self.push(Change::Revoked(partitions(&list)));
                }
                tracing::warn!(error = ?other, "kafka rebalance error; unassigning");
                if let Err(e) = consumer.unassign() {
                    self.error(e, "unassign");
                }
            }
        }
    }
}

impl Context {
    fn push(&self, change: Change) {
        let (what, at) = match &change {
            Change::Revoked(parts) => (format!("Revoked({parts:?})"), Vec::new()),
            Change::Assigned(parts) => (
                format!(
                    "Assigned({:?})",
                    parts.iter().map(|(p, _)| *p).collect::<Vec<_>>()
                ),
                parts.iter().map(|(_, at)| *at).collect(),
            ),
        };
        tracing::info!(group = %self.group, change = %what, ?at, "kafka rebalance");
        self.changes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(change);
    }

    fn take_changes(&self) -> Vec<Change> {
        std::mem::take(&mut *self.changes.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

fn partitions(list: &TopicPartitionList) -> Vec<i32> {
    list.elements().iter().map(|e| e.partition()).collect()
}

/// A rebalance, as the callbacks saw it (inside `poll`), handled before the next message.
#[derive(Debug)]
enum Change {
    Revoked(Vec<i32>),
    /// Partitions gained, each with the position it was assigned at (the store's, when there
    /// is a shared store and it holds one).
    Assigned(Vec<(i32, Option<i64>)>),
}

/// A consumer of the clicks topic.
pub struct KafkaSource {
    consumer: BaseConsumer<Context>,
    topic: String,
    key_prefix: String,
    /// Next offset to count, per partition (stored or consumed).
    next: BTreeMap<i32, i64>,
    /// `next` as of the last committed flush.
    committed: BTreeMap<i32, i64>,
    /// Several processors share the store (it lives in the context, which reads positions
    /// from it at every assignment).
    shared: bool,
    /// When the group last gave this consumer partitions.
    assigned_at: Option<Instant>,
    /// With a shared store, the partitions this consumer holds as its rebalance callbacks said.
    owned: BTreeSet<i32>,
    /// With a shared store, the position each partition was last sought to.
    sought: BTreeMap<i32, i64>,
}

/// How long after an assignment a consumer with nothing to read is not yet called drained:
/// fetching a partition it just got takes a moment.
const SETTLE_AFTER_ASSIGN: Duration = Duration::from_secs(2);

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("topic", &self.topic)
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl KafkaSource {
    /// Subscribes to the topic; `stored` holds the positions from the rollup store (keys without
    /// [`key_prefix`], i.e. partition numbers). Needs no broker to be up.
    /// With `shared`, rebalances split the partitions among several processors: see the
    /// parent module's notes.
    pub fn open(
        config: &KafkaConfig,
        stored: Vec<(String, u64)>,
        errors: IntCounter,
        shared: Option<Arc<RollupStore>>,
    ) -> Result<KafkaSource, KafkaSourceError> {
        let is_shared = shared.is_some();
        let mut client = ClientConfig::new();
        client
            .set("bootstrap.servers", &config.brokers)
            .set("group.id", &config.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("queued.min.messages", "200000")
            .set("fetch.wait.max.ms", "100")
            .set("session.timeout.ms", config.session_timeout_ms.to_string())
            .set(
                "heartbeat.interval.ms",
                (config.session_timeout_ms / 3).clamp(100, 3000).to_string(),
            )
            .set_log_level(RDKafkaLogLevel::Warning);
        for (key, value) in &config.options {
            client.set(key, value);
        }
        let consumer: BaseConsumer<Context> = client.create_with_context(Context {
            errors,
            last_log: std::sync::Mutex::new(None),
            changes: std::sync::Mutex::new(Vec::new()),
            group: config.group.clone(),
            topic: config.topic.clone(),
            shared: shared.map(|s| (s, key_prefix(&config.topic))),
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
            shared: is_shared,
            assigned_at: None,
            owned: BTreeSet::new(),
            sought: BTreeMap::new(),
        })
    }

    /// Hands over what arrived (waiting up to `wait` for the first message).
    pub fn poll(&mut self, wait: Duration, mut sink: impl FnMut(Input<'_>)) -> Polled {
        let mut polled = Polled::default();
        let mut timeout = wait;
        // Partitions whose skipped messages were checked against the high watermark.
        let mut checked: Vec<i32> = Vec::new();
        for _ in 0..BATCH {
            let got = self.consumer.poll(timeout);
            for change in self.consumer.context().take_changes() {
                match &change {
                    Change::Assigned(parts) => {
                        self.assigned_at = Some(Instant::now());
                        self.owned.extend(parts.iter().map(|(p, _)| *p));
                    }
                    Change::Revoked(parts) => {
                        for p in parts {
                            self.owned.remove(p);
                            self.sought.remove(p);
                        }
                    }
                }
                if self.shared {
                    let positions = Positions {
                        next: &mut self.next,
                        committed: &mut self.committed,
                    };
                    positions.rebalanced(change, &mut sink);
                }
            }
            match got {
                None => break,
                Some(Err(e)) => {
                    self.consumer.context().error(e, "poll");
                    break;
                }
                Some(Ok(m)) => {
                    timeout = Duration::ZERO;
                    polled.consumed += 1;
                    let (p, offset) = (m.partition(), m.offset());
                    if self.shared && !self.owned.contains(&p) {
                        // Fetched before a rebalance took the partition away and handed over
                        // after it: its next owner counts it. Counting it here would write a
                        // row that skips what this processor dropped at the revoke.
                        continue;
                    }
                    let stored = self.next.get(&p).copied().unwrap_or(0);
                    if self.shared && offset > stored && self.next.contains_key(&p) {
                        if self.sought.get(&p) != Some(&stored) {
                            // After a rebalance that handed the partition straight back, the
                            // fetcher may go on from where it was, past what this processor
                            // dropped: counting on from there would leave a hole in the rows.
                            // Seek to the stored position once.
                            self.sought.insert(p, stored);
                            if let Err(e) = self.consumer.seek(
                                &self.topic,
                                p,
                                Offset::Offset(stored),
                                Duration::from_secs(5),
                            ) {
                                self.consumer
                                    .context()
                                    .error(e, "seek to the stored position");
                            }
                            continue;
                        }
                        // The broker answers past the position again: a real gap in the log
                        // (compaction, transaction markers), or a broker that skips records
                        // (tansu 0.6 answers a fetch inside a record batch with the next
                        // batch). Counted on from here, said and counted.
                        self.consumer.context().errors.inc();
                        tracing::warn!(
                            topic = %self.topic,
                            partition = p,
                            from = stored,
                            to = offset,
                            "the broker skipped offsets; counting on from the next record it gives"
                        );
                        self.sought.remove(&p);
                    }
                    if offset < stored {
                        // Counted before a crash or rebalance (the group's offset lagged ours),
                        // unless our offset is past the partition's end. Asked once per poll:
                        // a replay skips many messages in a row.
                        let first = !checked.contains(&p);
                        if first {
                            checked.push(p);
                        }
                        // With a shared store a recreated topic is reset by hand (its
                        // positions are the rows'), and tansu's batch-based watermark would
                        // call any replay "past the end".
                        if self.shared || !(first && self.past_end(p, stored)) {
                            continue;
                        }
                    }
                    self.next.insert(p, offset + 1);
                    let payload = m.payload().unwrap_or_default();
                    match ClickEvent::decode(payload) {
                        Ok((e, used)) if used == payload.len() => {
                            polled.events += 1;
                            let at = Pos {
                                part: p,
                                next: u64::try_from(offset + 1).unwrap_or(0),
                            };
                            sink(Input::Event(e, payload, Some(at)));
                        }
                        _ => sink(Input::Invalid),
                    }
                }
            }
        }
        polled
    }
}

/// A source's positions, apart from its consumer (whose message is borrowed while a rebalance
/// is handled).
struct Positions<'a> {
    next: &'a mut BTreeMap<i32, i64>,
    committed: &'a mut BTreeMap<i32, i64>,
}

impl Positions<'_> {
    /// A rebalance of a shared store's group. A lost partition is forgotten (its next owner
    /// commits it). A gained one starts from the store's position, not from what this
    /// processor counted before (it dropped that, unflushed, when the partition left it) nor
    /// from the group's offset (committed after the store, so never ahead of it).
    fn rebalanced(self, change: Change, sink: &mut impl FnMut(Input<'_>)) {
        match change {
            Change::Revoked(parts) => {
                for p in parts {
                    self.next.remove(&p);
                    self.committed.remove(&p);
                    sink(Input::Revoked(p));
                }
            }
            Change::Assigned(parts) => {
                for (p, at) in parts {
                    // Whatever this processor still holds of the partition (a broker may
                    // assign it again without revoking it first) is older than the rows the
                    // store has now: dropped, as at a revoke; the fetch starts at `at`.
                    sink(Input::Revoked(p));
                    match at {
                        Some(o) => {
                            self.next.insert(p, o);
                            self.committed.insert(p, o);
                        }
                        // Never stored: from the start (assigned there too).
                        None => {
                            self.next.insert(p, 0);
                            self.committed.remove(&p);
                        }
                    }
                }
            }
        }
    }
}

impl KafkaSource {
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

    /// Whether the group has given this consumer partition `p` (and not taken it back).
    pub fn owns(&self, p: i32) -> bool {
        self.owned.contains(&p)
    }

    /// The next offset to read, per partition.
    pub fn next_offsets(&self) -> &BTreeMap<i32, i64> {
        &self.next
    }

    /// Commits, per partition, the offset given (at most the next to read): the archive
    /// consumer commits only what its durable objects hold.
    pub fn commit_offsets(&mut self, upto: &BTreeMap<i32, i64>) {
        let mut tpl = TopicPartitionList::new();
        for (p, o) in upto {
            let o = (*o).min(self.next.get(p).copied().unwrap_or(*o));
            if self.committed.get(p) == Some(&o) {
                continue;
            }
            if let Err(e) = tpl.add_partition_offset(&self.topic, *p, Offset::Offset(o)) {
                self.consumer.context().error(e, "commit list");
            }
            self.committed.insert(*p, o);
        }
        if tpl.count() == 0 {
            return;
        }
        // Async: a failed group commit only means an interval archived again, which every
        // reader of the archive drops by event id.
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            self.consumer.context().error(e, "commit");
        }
    }

    /// Reads partition `p` again from its last committed position (the start, without one).
    pub fn rewind(&mut self, p: i32) {
        let offset = match self.committed.get(&p) {
            Some(o) => Offset::Offset(*o),
            None => Offset::Beginning,
        };
        match self.committed.get(&p) {
            Some(o) => self.next.insert(p, *o),
            None => self.next.remove(&p),
        };
        if let Err(e) = self
            .consumer
            .seek(&self.topic, p, offset, Duration::from_secs(5))
        {
            self.consumer.context().error(e, "rewind");
        }
    }

    /// Whether this consumer holds every partition of the topic (asks the broker): its group
    /// is not split with other consumers.
    pub fn holds_all(&self) -> bool {
        let Ok(assignment) = self.consumer.assignment() else {
            return false;
        };
        let held = assignment.elements_for_topic(&self.topic).len();
        match self
            .consumer
            .fetch_metadata(Some(&self.topic), Duration::from_secs(2))
        {
            Ok(m) => m
                .topics()
                .iter()
                .find(|t| t.name() == self.topic)
                .is_some_and(|t| !t.partitions().is_empty() && t.partitions().len() == held),
            Err(_) => false,
        }
    }

    /// Whether every assigned partition is read up to its end (asks the broker).
    pub fn drained(&self) -> bool {
        if self
            .assigned_at
            .is_none_or(|t| t.elapsed() < SETTLE_AFTER_ASSIGN)
        {
            return false;
        }
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
                // At or past the end. (Past it: tansu 0.6 answers the last record batch's base
                // offset + 1 as the high watermark, so a partition of batched records reads as
                // shorter than it is; a real broker never does, and `poll` handles a recreated
                // topic when its messages arrive.)
                Ok((low, high)) => {
                    high <= low || self.next.get(&e.partition()).is_some_and(|n| *n >= high)
                }
                Err(_) => false,
            }
        })
    }
}
