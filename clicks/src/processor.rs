//! The stream processor: one dedicated thread, off the API's runtime; the same code runs inside
//! `serve` and as `lasthop-control clicks process`.
//!
//! Per event: too far in the future, or so old that its day is past both the grace and the
//! archive's retention → invalid; a second sighting of an id within the dedup window →
//! duplicate; its UTC day past the grace → late (not counted; the archive consumer keeps it and
//! a recompute of that day includes it); else classified and added to the in-memory (link, day)
//! rollup, loaded from the store the first time the key is touched. A link is its key
//! ([`ClickEvent::link_key`]): the code on the default domain, `domain/code` on a branded one,
//! so the same alias on two domains is two rollups, and the default domain's are keyed as they
//! were before branded domains. A stored rollup that does not decode is never counted on or
//! overwritten: the event counts as `corrupt_rollup` (recomputing the day repairs the row).
//! Every flush interval: (1) the dirty rollups and the source positions are upserted in one
//! store transaction, (2) then Kafka offsets are committed or consumed spool files marked done.
//! Rollups of closed days leave memory.
//!
//! The raw archive is not written here: the archive consumer (`archiver.rs`) reads the same
//! source at its own position, so a processor that is down costs no raw event.
//!
//! The common path allocates nothing per event: events borrow the source's buffer, and the
//! rollup key (the code itself on the default domain, written into a reused buffer on a branded
//! one) is looked up by `(&str, day)` and only copied on first touch.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lasthop_analytics::{early_key, Classifier, Dedup, KeyDedup, Rollup, Rules};
use lasthop_core::click::{ClickEvent, EventId};
use prometheus::IntCounter;
use serde::Serialize;

use super::archiver::{ArchiveHandle, ArchiverConfig};
use super::kafka::{self, KafkaSource};
use super::objects::{ArchiveLocation, Objects};
use super::recompute::{self, RecomputeError, RecomputeReport};
use super::source::{ProcessorError, SourceConfig, IDLE_WAIT, MAX_FUTURE_MS};
use super::spool::{self, Input, Polled, SpoolReader};
use super::store::{FlushBatch, Pos, RollupRow, RollupStore, StoreError, StoreLocation};
use super::Day;
use crate::metrics::ClickMetrics as Metrics;
use lasthop_core::clock::now_ms;

/// The shortest dedup window accepted.
pub const MIN_DEDUP_MS: u64 = 10 * 60 * 1000;
/// Days one scheduled run rebuilds at most (the rest wait for the next run).
const SCHEDULED_PER_RUN: usize = 4;
/// How long a scheduled recompute's lock holds a day against other processors.
const LOCK_TTL: Duration = Duration::from_secs(3600);
/// The pause before reading a partition again after its rows would not load.
const REWIND_PAUSE: Duration = Duration::from_secs(1);

/// The processor's settings.
#[derive(Debug, Clone)]
pub struct ProcessorConfig {
    /// `DATA_DIR/clicks`: the archive (and the embedded rollup store) live here.
    pub clicks_dir: PathBuf,
    /// Where rollups are kept.
    pub store: StoreLocation,
    /// The source.
    pub source: SourceConfig,
    /// Dedup window (at least [`MIN_DEDUP_MS`]).
    pub dedup_ms: u64,
    /// How long after its end a day still counts late events.
    pub grace_ms: u64,
    /// Flush interval.
    pub flush_every: Duration,
    /// Archive retention in days (events of older days are not counted).
    pub archive_days: u32,
    /// How often to look for days past their grace to rebuild from the archive (`None`: never).
    /// Only a processor with the archive consumer beside it does (it knows how far the archive
    /// has caught up); with several, a lock in the rollup store picks one per day.
    pub recompute_every: Option<Duration>,
    /// Whether to run the archive consumer beside this processor (`--clicks-archive`). A spool
    /// always has both readers: without one here, `clicks archive` runs elsewhere on it.
    pub archive_peer: bool,
    /// An `.open` spool file untouched this long belongs to a dead writer.
    pub spool_stale: Duration,
    /// Where the archive is (`--clicks-archive-url`): the archive consumer writes it, recompute
    /// reads it.
    pub archive: ArchiveLocation,
    /// The archive consumer's object sizes: events, age and multipart part size.
    pub object_events: u64,
    pub object_every: Duration,
    pub part_bytes: usize,
    /// The bot rules.
    pub rules: Arc<Rules>,
}

impl ProcessorConfig {
    /// The settings of the archive consumer beside this processor: the same source, flush
    /// interval and retention.
    pub fn archiver(&self) -> ArchiverConfig {
        ArchiverConfig {
            clicks_dir: self.clicks_dir.clone(),
            source: self.source.clone(),
            archive: self.archive.clone(),
            object_events: self.object_events,
            object_every: self.object_every,
            part_bytes: self.part_bytes,
            flush_every: self.flush_every,
            archive_days: self.archive_days,
            spool_stale: self.spool_stale,
        }
    }
}

/// Event counts by outcome.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Outcomes {
    /// Events decoded (every outcome below but corrupt and torn).
    pub events: u64,
    /// Counted as human.
    pub human: u64,
    /// Counted as bot.
    pub bot: u64,
    /// Dropped: an id seen within the window.
    pub duplicate: u64,
    /// Dropped: a second early-data event of one visitor and link in one minute (a possible
    /// 0-RTT replay: `lasthop_analytics::early_key`).
    pub early_replay: u64,
    /// Archived, not counted: the day was closed.
    pub late: u64,
    /// Undecodable, or too far in the future.
    pub invalid: u64,
    /// Spool frames (or files) with a bad checksum or header.
    pub corrupt: u64,
    /// Torn spool tails.
    pub torn: u64,
    /// Not counted: the stored rollup of its (link, day) does not decode.
    pub corrupt_rollup: u64,
}

/// Prometheus handles of [`Outcomes`], resolved once.
struct OutcomeCounters([IntCounter; 9]);

impl OutcomeCounters {
    const NAMES: [&'static str; 9] = [
        "human",
        "bot",
        "duplicate",
        "early_replay",
        "late",
        "invalid",
        "corrupt",
        "torn",
        "corrupt_rollup",
    ];

    fn new(m: &Metrics) -> OutcomeCounters {
        OutcomeCounters(Self::NAMES.map(|n| m.events.with_label_values(&[n])))
    }

    fn values(o: &Outcomes) -> [u64; 9] {
        [
            o.human,
            o.bot,
            o.duplicate,
            o.early_replay,
            o.late,
            o.invalid,
            o.corrupt,
            o.torn,
            o.corrupt_rollup,
        ]
    }

    fn report(&self, now: &Outcomes, before: &Outcomes) {
        for ((c, n), b) in self
            .0
            .iter()
            .zip(Self::values(now))
            .zip(Self::values(before))
        {
            c.inc_by(n.saturating_sub(b));
        }
    }
}

enum Command {
    Recompute {
        day: Day,
        reply: tokio::sync::oneshot::Sender<Result<RecomputeReport, RecomputeError>>,
    },
    Stop,
}

/// The API's handle on a running processor.
#[derive(Clone)]
pub struct ClicksHandle {
    store: Arc<RollupStore>,
    commands: mpsc::Sender<Command>,
}

impl std::fmt::Debug for ClicksHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClicksHandle").finish_non_exhaustive()
    }
}

impl ClicksHandle {
    /// The rollup store (for reading stats).
    pub fn store(&self) -> &Arc<RollupStore> {
        &self.store
    }

    /// Recomputes `day` on the processor thread, after a flush.
    pub async fn recompute(&self, day: Day) -> Result<RecomputeReport, RecomputeError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.commands
            .send(Command::Recompute { day, reply })
            .map_err(|_| RecomputeError::Stopped)?;
        answer.await.map_err(|_| RecomputeError::Stopped)?
    }

    /// Asks the processor to flush and stop.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
    }
}

/// A rollup in memory.
struct Slot {
    rollup: Rollup,
    dirty: bool,
    /// In a shared store, where the rollup stands in its Kafka partition.
    at: Option<Pos>,
}

/// The rollups in memory are keyed by day and partition (in a shared store, a Kafka
/// partition's rows are its own and leave with it; otherwise always [`NO_PART`]).
type Part = i32;
const NO_PART: Part = -1;

/// The per-event state, apart from the source so both can be borrowed at once.
struct State {
    store: Arc<RollupStore>,
    dedup: Dedup,
    /// Early-data events' keys ([`early_key`]): one counted per visitor, link and minute.
    replays: KeyDedup,
    classifier: Classifier,
    grace_ms: u64,
    archive_days: u32,
    /// By (day, partition), then by link key.
    rollups: HashMap<(Day, Part), HashMap<Box<str>, Slot>>,
    /// Keys whose stored rollup does not decode: left alone until their day is recomputed.
    corrupt: HashMap<Day, HashSet<Box<str>>>,
    dirty: Vec<(Day, Part, Box<str>)>,
    /// A shared store: the ids of each partition's events counted since the last flush, to
    /// forget when the partition leaves (its next owner counts them again).
    unflushed: HashMap<Part, Vec<(EventId, Option<u64>)>>,
    shared: bool,
    /// Partitions whose rows could not be loaded during this poll: to read again.
    rewind: Vec<Part>,
    out: Outcomes,
    newest_ms: u64,
    /// Where a branded domain's link key is written ([`ClickEvent::link_key_in`]), reused.
    key: String,
}

impl State {
    fn on_input(&mut self, input: Input<'_>, now: u64) {
        match input {
            Input::Event(e, _, at) => self.on_event(&e, at, now),
            Input::Revoked(part) => self.revoked(part),
            Input::Invalid => self.out.invalid += 1,
            Input::Corrupt => self.out.corrupt += 1,
            Input::Torn => self.out.torn += 1,
        }
    }

    /// The rollups held in memory, and their heap bytes: each one's sketch and breakdowns,
    /// its key, and its slot in its table (a control byte a slot, as hashbrown keeps).
    fn held(&self) -> (usize, usize) {
        let slot = std::mem::size_of::<(Box<str>, Slot)>() + 1;
        self.rollups.values().fold((0, 0), |(n, bytes), codes| {
            let inner: usize = codes
                .iter()
                .map(|(k, s)| k.len() + s.rollup.heap_bytes())
                .sum();
            (n + codes.len(), bytes + codes.capacity() * slot + inner)
        })
    }

    /// Drops what partition `part` had not flushed; its next owner counts it from the
    /// store's position.
    fn revoked(&mut self, part: Part) {
        self.rollups.retain(|(_, p), _| *p != part);
        self.dirty.retain(|(_, p, _)| *p != part);
        for (id, early) in self.unflushed.remove(&part).unwrap_or_default() {
            self.dedup.forget(id);
            if let Some(key) = early {
                self.replays.forget(key);
            }
        }
    }

    /// Loads every stored row of `day` from partition `part` (a shared store: one query,
    /// where a round trip per code would cap the rate at the server's latency). False when the
    /// store failed: the partition is then read again from its stored position (see
    /// [`Processor::poll`]), its events meanwhile left alone.
    fn load(&mut self, day: Day, part: Part, at: Option<Pos>) -> bool {
        let rows = match self.store.stored_day(day, at.map(|a| a.part)) {
            Ok(rows) => rows,
            Err(err) => {
                tracing::error!(error = %err, %day, part, "loading the day's rollups failed; reading the partition again from its stored position");
                self.rewind.push(part);
                return false;
            }
        };
        let mut codes = HashMap::with_capacity(rows.len());
        for (code, row) in rows {
            match row {
                Ok(s) => {
                    codes.insert(
                        code,
                        Slot {
                            rollup: s.rollup,
                            dirty: false,
                            at: s.at,
                        },
                    );
                }
                Err(err) => {
                    tracing::error!(error = %err, "events of this link and day are not counted until the day is recomputed");
                    self.corrupt.entry(day).or_default().insert(code);
                }
            }
        }
        self.rollups.insert((day, part), codes);
        true
    }

    fn on_event(&mut self, e: &ClickEvent<'_>, at: Option<Pos>, now: u64) {
        let mut buf = std::mem::take(&mut self.key);
        self.count(e, e.link_key_in(&mut buf), at, now);
        self.key = buf;
    }

    /// [`on_event`](Self::on_event) for the link `key` (`e`'s [`ClickEvent::link_key`]).
    fn count(&mut self, e: &ClickEvent<'_>, key: &str, at: Option<Pos>, now: u64) {
        // Only a shared store keeps partitions apart.
        let at = at.filter(|_| self.shared);
        let part = at.map_or(NO_PART, |a| a.part);
        if self.rewind.contains(&part) {
            // Read again after the rewind.
            return;
        }
        self.out.events += 1;
        if e.at_ms > now.saturating_add(MAX_FUTURE_MS) {
            self.out.invalid += 1;
            return;
        }
        let day = Day::of_ms(e.at_ms);
        let late = now > day.end_ms().saturating_add(self.grace_ms);
        if late && day < Day::of_ms(now).minus(self.archive_days.saturating_sub(1)) {
            // Never counted, and its archive day is (or is about to be) pruned.
            self.out.invalid += 1;
            return;
        }
        if !self.dedup.first(e.id, now) {
            self.out.duplicate += 1;
            return;
        }
        self.newest_ms = self.newest_ms.max(e.at_ms);
        if late {
            self.out.late += 1;
            return;
        }
        let early = early_key(e);
        if let Some(key) = early {
            if !self.replays.first(key, now) {
                self.out.early_replay += 1;
                return;
            }
        }
        let verdict = self.classifier.classify(e);
        if self.shared && !self.rollups.contains_key(&(day, part)) && !self.load(day, part, at) {
            // Read again after the rewind: not a duplicate then.
            self.dedup.forget(e.id);
            if let Some(key) = early {
                self.replays.forget(key);
            }
            return;
        }
        let codes = self.rollups.entry((day, part)).or_default();
        match codes.get_mut(key) {
            Some(slot) => {
                if counted(slot.at, at) {
                    self.out.duplicate += 1;
                    return;
                }
                slot.rollup.add(e, &verdict);
                slot.at = at.or(slot.at);
                if !slot.dirty {
                    slot.dirty = true;
                    self.dirty.push((day, part, key.into()));
                }
            }
            None => {
                if self.corrupt.get(&day).is_some_and(|c| c.contains(key)) {
                    self.out.corrupt_rollup += 1;
                    return;
                }
                // A shared store's (day, partition) was loaded whole by `load`.
                let stored = if self.shared {
                    Ok(None)
                } else {
                    self.store.stored(day, key, at.map(|a| a.part))
                };
                let (mut rollup, stored_at) = match stored {
                    Ok(Some(s)) => (s.rollup, s.at),
                    Ok(None) => (Rollup::default(), None),
                    Err(err @ StoreError::Corrupt { .. }) => {
                        // Counting on top of nothing would overwrite the stored numbers at the
                        // next flush; the key is left alone until its day is recomputed.
                        tracing::error!(error = %err, "events of this link and day are not counted until the day is recomputed");
                        self.corrupt.entry(day).or_default().insert(key.into());
                        self.out.corrupt_rollup += 1;
                        return;
                    }
                    Err(err) => {
                        // Same reasoning; a failing store is retried at the next event.
                        tracing::error!(error = %err, %day, code = key, "loading a rollup failed; event not counted");
                        return;
                    }
                };
                if counted(stored_at, at) {
                    // Another processor counted it before this one took the partition over.
                    codes.insert(
                        key.into(),
                        Slot {
                            rollup,
                            dirty: false,
                            at: stored_at,
                        },
                    );
                    self.out.duplicate += 1;
                    return;
                }
                rollup.add(e, &verdict);
                codes.insert(
                    key.into(),
                    Slot {
                        rollup,
                        dirty: true,
                        at: at.or(stored_at),
                    },
                );
                self.dirty.push((day, part, key.into()));
            }
        }
        if self.shared && at.is_some() {
            self.unflushed.entry(part).or_default().push((e.id, early));
        }
        if verdict.bot.is_some() {
            self.out.bot += 1;
        } else {
            self.out.human += 1;
        }
    }
}

/// Whether the event at `event` is already in a rollup standing at `row` (same partition, an
/// offset the row counted).
fn counted(row: Option<Pos>, event: Option<Pos>) -> bool {
    matches!((row, event), (Some(r), Some(e)) if r.part == e.part && e.next <= r.next)
}

enum Source {
    Spool(Box<SpoolReader>),
    Kafka(Box<KafkaSource>),
}

/// What a run did (the standalone `clicks process` prints it).
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// Events decoded.
    pub events: u64,
    /// From the first event read to the last flush done.
    pub seconds: f64,
    /// `events / seconds`.
    pub events_per_sec: f64,
    /// From start to exit, set-up included.
    pub wall_seconds: f64,
    /// Flushes done.
    pub flushes: u64,
    /// Counts by outcome.
    pub outcomes: Outcomes,
    /// Event ids the dedup window held at the end, and the heap bytes they took.
    pub dedup_ids: u64,
    pub dedup_bytes: u64,
}

/// The processor.
pub struct Processor {
    config: ProcessorConfig,
    store: Arc<RollupStore>,
    source: Source,
    state: State,
    metrics: Metrics,
    counters: OutcomeCounters,
    reported: Outcomes,
    commands: mpsc::Receiver<Command>,
    commands_tx: mpsc::Sender<Command>,
    flushes: u64,
    flush_failing: bool,
    /// The archive consumer beside this processor, flushed before a recompute reads the archive.
    archive: Option<ArchiveHandle>,
    /// The archive, read by recomputes.
    objects: Arc<Objects>,
    /// The scheduled recompute running now, if any.
    scheduled: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processor")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Processor {
    /// Opens the store, the archive and the source. Fails with [`StoreError::Busy`] when another
    /// process holds the store.
    pub fn open(config: ProcessorConfig, metrics: Metrics) -> Result<Processor, ProcessorError> {
        let store = Arc::new(RollupStore::open_at(&config.store, &config.clicks_dir)?);
        let shared = store.shared();
        let objects = Arc::new(Objects::open(&config.archive, None)?);
        let source = match &config.source {
            SourceConfig::Spool(dir) => {
                let stored = store
                    .offsets(spool::KEY_PREFIX)?
                    .into_iter()
                    .map(|(k, v)| (k[spool::KEY_PREFIX.len()..].to_owned(), v))
                    .collect();
                Source::Spool(Box::new(
                    SpoolReader::open(dir.clone(), config.spool_stale, stored)?
                        .shared_with(spool::ROLLUPS, &[spool::ARCHIVE]),
                ))
            }
            SourceConfig::Kafka(k) => {
                let prefix = kafka::key_prefix(&k.topic);
                let stored = store
                    .offsets(&prefix)?
                    .into_iter()
                    .map(|(key, v)| (key[prefix.len()..].to_owned(), v))
                    .collect();
                Source::Kafka(Box::new(KafkaSource::open(
                    k,
                    stored,
                    metrics.kafka_errors.clone(),
                    shared.then(|| Arc::clone(&store)),
                )?))
            }
        };
        let state = State {
            store: Arc::clone(&store),
            dedup: Dedup::new(config.dedup_ms.max(MIN_DEDUP_MS)),
            replays: KeyDedup::new(config.dedup_ms.max(MIN_DEDUP_MS)),
            classifier: Classifier::new(Arc::clone(&config.rules)),
            grace_ms: config.grace_ms,
            archive_days: config.archive_days,
            rollups: HashMap::new(),
            corrupt: HashMap::new(),
            dirty: Vec::new(),
            unflushed: HashMap::new(),
            shared,
            rewind: Vec::new(),
            out: Outcomes::default(),
            newest_ms: 0,
            key: String::new(),
        };
        let (commands_tx, commands) = mpsc::channel();
        Ok(Processor {
            counters: OutcomeCounters::new(&metrics),
            reported: Outcomes::default(),
            config,
            store,
            source,
            state,
            metrics,
            commands,
            commands_tx,
            flushes: 0,
            flush_failing: false,
            archive: None,
            objects,
            scheduled: None,
        })
    }

    /// The archive consumer running beside this processor (its archive is the one recompute
    /// reads).
    pub fn set_archive(&mut self, archive: ArchiveHandle) {
        self.archive = Some(archive);
    }

    /// A handle for the API (stats reads, recompute, stop).
    pub fn handle(&self) -> ClicksHandle {
        ClicksHandle {
            store: Arc::clone(&self.store),
            commands: self.commands_tx.clone(),
        }
    }

    /// Runs on a thread of its own until [`ClicksHandle::stop`].
    pub fn spawn(self) -> Result<std::thread::JoinHandle<()>, ProcessorError> {
        std::thread::Builder::new()
            .name("clicks".into())
            .spawn(move || {
                self.run(false);
            })
            .map_err(ProcessorError::Thread)
    }

    /// Processes until stopped, or (with `exit_when_idle`) until the source is drained; flushes
    /// before returning.
    pub fn run(mut self, exit_when_idle: bool) -> RunSummary {
        let started = Instant::now();
        let mut first_event: Option<Instant> = None;
        let mut next_flush = Instant::now() + self.config.flush_every;
        let mut next_recompute = self
            .config
            .recompute_every
            .map(|every| Instant::now() + every);
        loop {
            match self.commands.try_recv() {
                Ok(Command::Stop) => break,
                Ok(Command::Recompute { day, reply }) => {
                    let _ = reply.send(self.recompute(day));
                    continue;
                }
                Err(_) => {}
            }
            let polled = self.poll();
            if polled.consumed > 0 {
                first_event.get_or_insert_with(Instant::now);
            }
            self.report();
            if Instant::now() >= next_flush {
                self.flush();
                next_flush = Instant::now() + self.config.flush_every;
            }
            if let (Some(at), Some(every)) = (next_recompute, self.config.recompute_every) {
                if Instant::now() >= at {
                    self.schedule_recompute();
                    next_recompute = Some(Instant::now() + every);
                }
            }
            if polled.consumed == 0 {
                if exit_when_idle && self.drained() {
                    break;
                }
                if let Source::Spool(_) = self.source {
                    match self.commands.recv_timeout(IDLE_WAIT) {
                        Ok(Command::Stop) => break,
                        Ok(Command::Recompute { day, reply }) => {
                            let _ = reply.send(self.recompute(day));
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        self.flush();
        if let Some(t) = self.scheduled.take() {
            // A recompute writes the day's rows, then switches the day: let it finish.
            let _ = t.join();
        }
        // A failing store or disk: one more try after a pause before giving up on the interval
        // (it is read again from the source at the next start).
        if self.flush_failing {
            std::thread::sleep(Duration::from_millis(500));
            self.flush();
        }
        let end = Instant::now();
        let seconds = first_event.map_or(0.0, |t| end.duration_since(t).as_secs_f64());
        let out = self.state.out;
        tracing::info!(?out, "click processor stopped");
        RunSummary {
            events: out.events,
            seconds,
            events_per_sec: if seconds > 0.0 {
                out.events as f64 / seconds
            } else {
                0.0
            },
            wall_seconds: end.duration_since(started).as_secs_f64(),
            flushes: self.flushes,
            outcomes: out,
            dedup_ids: self.state.dedup.len() as u64,
            dedup_bytes: self.state.dedup.bytes() as u64,
        }
    }

    fn poll(&mut self) -> Polled {
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let state = &mut self.state;
        let polled = match &mut self.source {
            Source::Spool(r) => match r.poll(|i| state.on_input(i, now)) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "reading the spool");
                    Polled::default()
                }
            },
            Source::Kafka(k) => k.poll(IDLE_WAIT, |i| state.on_input(i, now)),
        };
        // A partition whose rows would not load: what it counted since the last flush is
        // dropped (its ids forgotten) and it is read again from the stored position, after a
        // pause, so a store that blinks loses no click and is not hammered.
        let rewind = std::mem::take(&mut self.state.rewind);
        for part in &rewind {
            self.state.revoked(*part);
            match &mut self.source {
                Source::Spool(r) => r.rewind(),
                Source::Kafka(k) => k.rewind(*part),
            }
        }
        if !rewind.is_empty() {
            std::thread::sleep(REWIND_PAUSE);
        }
        polled
    }

    /// Starts rebuilding, on a thread of its own, the days that need it: past their grace, not
    /// rebuilt yet, and archived up to their end (the archive consumer caught up after the
    /// grace ended). Oldest first, a few per run; days still in memory are closed, so the
    /// processor never touches them again. "Fresh, then correct" without an operator.
    fn schedule_recompute(&mut self) {
        let Some(archive) = &self.archive else { return };
        if self.scheduled.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let caught_up = archive.caught_up_ms();
        let grace = self.config.grace_ms;
        let objects = Arc::clone(&self.objects);
        let (store, rules) = (Arc::clone(&self.store), Arc::clone(&self.config.rules));
        let job = move || {
            let days = match objects.days() {
                Ok(d) => d,
                Err(e) => {
                    tracing::error!(error = %e, "scheduled recompute: listing the archive");
                    return;
                }
            };
            let due = |day: Day| {
                let closes = day.end_ms().saturating_add(grace);
                now > closes && caught_up > closes
            };
            let mut done = 0;
            for day in days.into_iter().filter(|d| due(*d)) {
                if done == SCHEDULED_PER_RUN {
                    break;
                }
                match store.day_state(day) {
                    Ok(Some(super::DayState::Recomputed | super::DayState::Open)) => continue,
                    Ok(_) => {}
                    Err(e) => {
                        tracing::error!(error = %e, %day, "scheduled recompute: the day's state");
                        return;
                    }
                }
                match store.try_lock(&format!("recompute/{day}"), LOCK_TTL) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(e) => {
                        tracing::error!(error = %e, %day, "scheduled recompute: the lock");
                        return;
                    }
                }
                // Another processor may have finished it while the lock settled.
                if matches!(store.day_state(day), Ok(Some(super::DayState::Recomputed))) {
                    continue;
                }
                match recompute::recompute_into(&store, &objects, day, Arc::clone(&rules)) {
                    Ok(r) => tracing::info!(%day, events = r.events, "scheduled recompute done"),
                    Err(e) => tracing::error!(error = %e, %day, "scheduled recompute failed"),
                }
                done += 1;
            }
        };
        match std::thread::Builder::new()
            .name("clicks-recompute".into())
            .spawn(job)
        {
            Ok(t) => self.scheduled = Some(t),
            Err(e) => tracing::error!(error = %e, "starting the scheduled recompute"),
        }
    }

    /// Polls until nothing is left to read (at most a few seconds' worth).
    fn drain(&mut self) {
        let until = Instant::now() + Duration::from_secs(5);
        while Instant::now() < until && self.poll().consumed > 0 {}
    }

    fn drained(&self) -> bool {
        match &self.source {
            Source::Spool(_) => true,
            Source::Kafka(k) => k.drained(),
        }
    }

    fn report(&mut self) {
        self.counters.report(&self.state.out, &self.reported);
        self.reported = self.state.out;
    }

    /// One flush; failures are logged and counted, and the interval is retried at the next one.
    fn flush(&mut self) {
        let started = Instant::now();
        match self.try_flush() {
            Ok(()) => {
                self.flushes += 1;
                if self.flush_failing {
                    tracing::info!("click flushes recovered");
                }
                self.flush_failing = false;
                self.metrics.flushes.with_label_values(&["ok"]).inc();
            }
            Err(e) => {
                if !self.flush_failing {
                    tracing::error!(error = %e, "click flush failed; retrying every interval");
                }
                self.flush_failing = true;
                self.metrics.flushes.with_label_values(&["error"]).inc();
            }
        }
        let m = &self.metrics;
        m.flush_seconds.observe(started.elapsed().as_secs_f64());
        let dedup = &self.state.dedup;
        m.dedup_ids
            .set(i64::try_from(dedup.len()).unwrap_or(i64::MAX));
        m.dedup_bytes
            .set(i64::try_from(dedup.bytes()).unwrap_or(i64::MAX));
        m.dedup_overflow_ids
            .set(i64::try_from(dedup.overflow_ids()).unwrap_or(i64::MAX));
        if self.flushes % 10 == 1 {
            // A walk of every rollup held: every tenth flush is enough for a gauge.
            let (held, held_bytes) = self.state.held();
            m.rollups_held.set(i64::try_from(held).unwrap_or(i64::MAX));
            m.rollups_held_bytes
                .set(i64::try_from(held_bytes).unwrap_or(i64::MAX));
        }
        if self.state.newest_ms > 0 {
            let lag = now_ms() - i64::try_from(self.state.newest_ms).unwrap_or(i64::MAX);
            m.lag_seconds.set(lag as f64 / 1000.0);
        }
        if let Source::Spool(r) = &self.source {
            m.spool_pending_bytes
                .set(i64::try_from(r.pending_bytes()).unwrap_or(i64::MAX));
        }
    }

    fn try_flush(&mut self) -> Result<(), String> {
        let state = &mut self.state;
        // (1) Rollups and source positions, one transaction.
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let closed_through = Day::of_ms(now.saturating_sub(state.grace_ms).saturating_sub(1))
            .0
            .checked_sub(1)
            .map(Day);
        let mut batch = FlushBatch {
            closed_through,
            ..FlushBatch::default()
        };
        for (day, part, code) in &state.dirty {
            if let Some(slot) = state.rollups.get(&(*day, *part)).and_then(|c| c.get(code)) {
                batch
                    .rollups
                    .push(RollupRow::new(*day, code.clone(), &slot.rollup, slot.at));
            }
            if batch.touched_days.last() != Some(day) && !batch.touched_days.contains(day) {
                batch.touched_days.push(*day);
            }
        }
        let checkpoint = match &self.source {
            Source::Spool(r) => r.checkpoint(),
            Source::Kafka(k) => k.checkpoint(),
        };
        batch.offsets = checkpoint.clone();
        self.store.commit(&batch).map_err(|e| e.to_string())?;
        for (day, part, code) in state.dirty.drain(..) {
            if let Some(slot) = state
                .rollups
                .get_mut(&(day, part))
                .and_then(|c| c.get_mut(&code))
            {
                slot.dirty = false;
            }
        }
        state.unflushed.clear();

        // (2) Only now may the source forget what it handed over.
        match &mut self.source {
            Source::Spool(r) => r.committed(&checkpoint),
            Source::Kafka(k) => k.committed(),
        }
        if let Some(last) = closed_through {
            state.rollups.retain(|(day, _), _| *day > last);
            state.corrupt.retain(|day, _| *day > last);
        }
        Ok(())
    }

    fn recompute(&mut self, day: Day) -> Result<RecomputeReport, RecomputeError> {
        // Read to the source's end, as the archive consumer does before its flush below, so
        // both stand at about the same place: an open day's recompute then neither misses nor
        // repeats what arrived before it (what arrives meanwhile is made right by the day's
        // recompute after its grace).
        self.drain();
        self.flush();
        if self.flush_failing {
            return Err(RecomputeError::Flush(
                "the store or the archive is failing; see the log".into(),
            ));
        }
        // The archive consumer writes out what it read, so the day's archive is as complete as
        // it can be.
        if let Some(archive) = &self.archive {
            archive
                .flush(Duration::from_secs(60))
                .map_err(RecomputeError::Flush)?;
        }
        // Several processors count into a shared store, each beside its own archive consumer
        // or none: only a whole archive, caught up past the day's grace, may replace the day.
        if self.store.shared() {
            if self.store.day_state(day)? == Some(super::DayState::Open) {
                return Err(RecomputeError::DayOpen(day));
            }
            let closes = day.end_ms().saturating_add(self.config.grace_ms);
            if self
                .archive
                .as_ref()
                .is_none_or(|a| a.caught_up_ms() <= closes)
            {
                return Err(RecomputeError::ArchiveIncomplete(day));
            }
        }
        let report = recompute::recompute_into(
            &self.store,
            &self.objects,
            day,
            Arc::clone(&self.config.rules),
        )?;
        // Everything was clean after the flush: the day is reloaded from the store when touched
        // (its rows are all fresh, corrupt ones included).
        self.state.rollups.retain(|(d, _), _| *d != day);
        self.state.corrupt.remove(&day);
        Ok(report)
    }
}
