//! The archive consumer: writes every raw event into the archive on object storage
//! (`objects.rs`) as Parquet objects (`columnar.rs`), apart from the processor
//! (docs/ARCHITECTURE.md, "The click pipeline"), so a processor that crashes, is stopped or
//! cannot reach its rollup store costs no raw event.
//!
//! It reads the same source at a position of its own: on Kafka a consumer group of its own
//! (`<group>.archive`), on the spool its own positions (`DATA_DIR/clicks/archive-positions.json`),
//! a spool file being deleted only once both readers finished it (`spool.rs`).
//!
//! Events go into open objects, one per source partition (a spool segment, a Kafka partition)
//! and event hour. A partition's objects close together: after `object_events` events, at the end
//! of its spool segment, or `object_every` after its first event; then they are uploaded, and
//! only then is the partition's position committed, up to the first event still in an open
//! object. A crash repeats at most one object's range (at least once); a replay that cuts at
//! other positions leaves overlapping objects, which every reader de-duplicates by event id.
//! While uploads fail the consumer stops reading (the spool or Kafka holds the events) and
//! retries with backoff, counting each.
//!
//! Every event the processor could count is kept: an event from more than five minutes in the
//! future, or of a day past the archive's retention, is not (the processor counts neither).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use bytes::Bytes;
use lasthop_core::click::ClickEvent;
use serde::Serialize;

use super::archive::ArchiveError;
use super::columnar::ObjectWriter;
use super::kafka::{KafkaConfig, KafkaSource};
use super::objects::{ArchiveLocation, ObjectKey, Objects};
use super::source::{ProcessorError, SourceConfig, IDLE_WAIT, MAX_FUTURE_MS};
use super::spool::{self, Input, SpoolReader};
use super::Day;
use crate::metrics::ClickMetrics as Metrics;
use lasthop_core::clock::now_ms;

/// `--clicks-archive-object-events`' default.
pub const DEFAULT_OBJECT_EVENTS: u64 = 1_000_000;
/// `--clicks-archive-object-secs`' default.
pub const DEFAULT_OBJECT_SECS: u64 = 300;
/// `--clicks-archive-part-bytes`' default: objects larger go up in multipart uploads of parts
/// this size.
pub const DEFAULT_PART_BYTES: usize = 16 << 20;
/// The longest wait between retries of a failing upload.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The archive consumer's settings.
#[derive(Debug, Clone)]
pub struct ArchiverConfig {
    /// `DATA_DIR/clicks`: this consumer's spool positions and upload journal live here.
    pub clicks_dir: PathBuf,
    /// The source (a Kafka group is suffixed `.archive`: see [`archive_group`]).
    pub source: SourceConfig,
    /// Where the archive is.
    pub archive: ArchiveLocation,
    /// A partition's objects close after this many events.
    pub object_events: u64,
    /// Or this long after their first event.
    pub object_every: Duration,
    /// Objects larger than this go up in multipart uploads of parts this size.
    pub part_bytes: usize,
    /// How often positions of partitions with nothing open are committed (and the retention
    /// and catch-up checks run).
    pub flush_every: Duration,
    /// Archive retention in days.
    pub archive_days: u32,
    /// An `.open` spool file untouched this long belongs to a dead writer.
    pub spool_stale: Duration,
}

/// The archive consumer's Kafka group for the processors' `group`.
pub fn archive_group(group: &str) -> String {
    format!("{group}.archive")
}

/// What a run archived.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ArchiveSummary {
    /// Events written to durable objects.
    pub archived: u64,
    /// Events not kept: undecodable, from the future, or past retention.
    pub skipped: u64,
    /// Objects written.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Commits of positions.
    pub flushes: u64,
}

enum Command {
    Flush(mpsc::Sender<Result<(), String>>),
    Stop,
}

/// A handle on a running archive consumer.
#[derive(Clone)]
pub struct ArchiveHandle {
    commands: mpsc::Sender<Command>,
    caught_up_ms: Arc<AtomicU64>,
}

impl std::fmt::Debug for ArchiveHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArchiveHandle").finish_non_exhaustive()
    }
}

impl ArchiveHandle {
    /// Has the consumer read to the source's end, close every open object, upload it and commit;
    /// waits up to `wait`.
    pub fn flush(&self, wait: Duration) -> Result<(), String> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Flush(reply))
            .map_err(|_| "the archive consumer is not running".to_string())?;
        answer
            .recv_timeout(wait)
            .map_err(|_| "the archive consumer did not answer".to_string())?
    }

    /// Wall time (Unix ms) up to which every event that arrived is in a durable object: set
    /// when the consumer has read the whole source (on Kafka: every partition held by this
    /// consumer and read to its end), to the read time of the oldest event still in an open
    /// object, or the time of that check. 0 before the first, and always 0 for a consumer that
    /// shares its group (each then holds part of the archive).
    pub fn caught_up_ms(&self) -> u64 {
        self.caught_up_ms.load(Ordering::Relaxed)
    }

    /// Asks the consumer to close its objects, upload them, commit and stop.
    pub fn stop(&self) {
        let _ = self.commands.send(Command::Stop);
    }
}

enum Source {
    Spool {
        reader: Box<SpoolReader>,
        /// Every stored position, as in the positions file.
        positions: BTreeMap<String, u64>,
        file: PathBuf,
    },
    Kafka(Box<KafkaSource>),
}

/// The open objects of one source partition.
struct Partition {
    /// By (day, hour).
    open: BTreeMap<(Day, u8), ObjectWriter>,
    /// The first position the open objects hold (spool: the byte offset of the first chunk
    /// read into them; Kafka: the first offset).
    first: u64,
    /// The last (spool: the offset after the last chunk; Kafka: the last offset).
    last: u64,
    rows: u64,
    /// When the first event of the open objects was read.
    opened: Instant,
    opened_ms: u64,
}

/// A closed object waiting for its upload.
struct Closed {
    key: ObjectKey,
    bytes: Bytes,
    rows: u64,
}

/// The archive consumer.
pub struct Archiver {
    config: ArchiverConfig,
    source: Source,
    objects: Objects,
    /// Open objects by partition name (a spool stem, a Kafka partition number).
    partitions: BTreeMap<String, Partition>,
    /// Closed objects not yet uploaded (in order); nothing is read while there are any.
    closed: Vec<Closed>,
    /// When to try uploading them again.
    retry_at: Option<Instant>,
    backoff: Duration,
    /// Events of the current poll (binary, back to back) and, from Kafka, their positions.
    scratch: Vec<u8>,
    scratch_pos: Vec<(i32, u64)>,
    summary: ArchiveSummary,
    metrics: Metrics,
    commands: mpsc::Receiver<Command>,
    handle: ArchiveHandle,
    /// Whether the last poll found nothing to read.
    idle: bool,
}

impl std::fmt::Debug for Archiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Archiver")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn positions_file(clicks_dir: &Path) -> PathBuf {
    clicks_dir.join("archive-positions.json")
}

/// The multipart upload journal (`objects.rs`).
pub fn uploads_file(clicks_dir: &Path) -> PathBuf {
    clicks_dir.join("archive-uploads.json")
}

/// Reads the positions file; a missing file is no positions.
fn read_positions(path: &Path) -> Result<BTreeMap<String, u64>, ArchiveError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ArchiveError::Io {
            path: path.to_owned(),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(BTreeMap::new()),
        Err(e) => Err(ArchiveError::Io {
            path: path.to_owned(),
            source: e,
        }),
    }
}

/// Replaces `path` durably: a temp file, fsynced, renamed over it, the directory fsynced.
pub(crate) fn write_durably(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

fn write_positions(path: &Path, positions: &BTreeMap<String, u64>) -> std::io::Result<()> {
    write_durably(
        path,
        &serde_json::to_vec(positions).map_err(std::io::Error::other)?,
    )
}

fn objects_error(e: super::objects::ObjectsError) -> ProcessorError {
    ProcessorError::from(e)
}

impl Archiver {
    /// Opens the archive and the source; aborts the multipart uploads a killed run left and
    /// applies the retention.
    pub fn open(config: ArchiverConfig, metrics: &Metrics) -> Result<Archiver, ProcessorError> {
        std::fs::create_dir_all(&config.clicks_dir).map_err(|source| ArchiveError::Io {
            path: config.clicks_dir.clone(),
            source,
        })?;
        let objects = Objects::open(&config.archive, Some(uploads_file(&config.clicks_dir)))
            .map_err(objects_error)?;
        match objects.abort_unfinished() {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                uploads = n,
                "aborted the unfinished uploads of a killed run"
            ),
            // The store may be down at start: the journal keeps them for the next start.
            Err(e) => {
                tracing::warn!(error = %e, "could not abort the unfinished uploads of a killed run; retried at the next start")
            }
        }
        let source = match &config.source {
            SourceConfig::Spool(dir) => {
                let file = positions_file(&config.clicks_dir);
                let positions = read_positions(&file)?;
                let stored = positions
                    .iter()
                    .filter_map(|(k, v)| Some((k.strip_prefix(spool::KEY_PREFIX)?.to_owned(), *v)))
                    .collect();
                let reader = Box::new(
                    SpoolReader::open(dir.clone(), config.spool_stale, stored)?
                        .shared_with(spool::ARCHIVE, &[spool::ROLLUPS]),
                );
                Source::Spool {
                    reader,
                    positions,
                    file,
                }
            }
            SourceConfig::Kafka(k) => {
                let group = KafkaConfig {
                    group: archive_group(&k.group),
                    ..k.clone()
                };
                Source::Kafka(Box::new(KafkaSource::open(
                    &group,
                    Vec::new(),
                    metrics.kafka_errors.clone(),
                    None,
                )?))
            }
        };
        let (tx, commands) = mpsc::channel();
        let mut archiver = Archiver {
            config,
            source,
            objects,
            partitions: BTreeMap::new(),
            closed: Vec::new(),
            retry_at: None,
            backoff: Duration::from_millis(500),
            scratch: Vec::new(),
            scratch_pos: Vec::new(),
            summary: ArchiveSummary::default(),
            metrics: metrics.clone(),
            commands,
            handle: ArchiveHandle {
                commands: tx,
                caught_up_ms: Arc::new(AtomicU64::new(0)),
            },
            idle: false,
        };
        archiver.prune();
        Ok(archiver)
    }

    /// A handle (flush, stop, how far it caught up).
    pub fn handle(&self) -> ArchiveHandle {
        self.handle.clone()
    }

    /// Runs on a thread of its own until [`ArchiveHandle::stop`].
    pub fn spawn(self) -> Result<std::thread::JoinHandle<ArchiveSummary>, ProcessorError> {
        std::thread::Builder::new()
            .name("clicks-archiver".into())
            .spawn(move || self.run(false))
            .map_err(ProcessorError::Thread)
    }

    /// Archives until stopped, or (with `exit_when_idle`) until the source is drained; closes,
    /// uploads and commits before returning.
    pub fn run(mut self, exit_when_idle: bool) -> ArchiveSummary {
        let mut next_flush = Instant::now() + self.config.flush_every;
        let mut next_prune = Instant::now() + Duration::from_secs(3600);
        loop {
            match self.commands.try_recv() {
                Ok(Command::Stop) => break,
                Ok(Command::Flush(reply)) => {
                    let _ = reply.send(self.flush_all(Duration::from_secs(50)));
                    continue;
                }
                Err(_) => {}
            }
            let mut consumed = 0;
            if self.closed.is_empty() {
                consumed = self.poll();
                self.idle = consumed == 0;
                self.close_due(false);
            }
            if !self.closed.is_empty() && self.retry_at.is_none_or(|t| Instant::now() >= t) {
                self.upload();
            }
            if Instant::now() >= next_flush {
                if self.closed.is_empty() {
                    let _ = self.commit();
                    self.catch_up();
                }
                self.gauge();
                next_flush = Instant::now() + self.config.flush_every;
            }
            if Instant::now() >= next_prune {
                self.prune();
                next_prune = Instant::now() + Duration::from_secs(3600);
            }
            if consumed == 0 {
                if exit_when_idle && self.closed.is_empty() && self.drained() {
                    break;
                }
                let wait = if self.closed.is_empty() {
                    IDLE_WAIT
                } else {
                    Duration::from_millis(100)
                };
                if matches!(self.source, Source::Spool { .. }) || !self.closed.is_empty() {
                    match self.commands.recv_timeout(wait) {
                        Ok(Command::Stop) => break,
                        Ok(Command::Flush(reply)) => {
                            let _ = reply.send(self.flush_all(Duration::from_secs(50)));
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        if let Err(e) = self.flush_all(Duration::from_secs(10)) {
            tracing::error!(error = %e, "archive consumer stopping with objects not uploaded; their events are read again at the next start");
        }
        tracing::info!(summary = ?self.summary, "archive consumer stopped");
        self.summary
    }

    fn drained(&self) -> bool {
        match &self.source {
            Source::Spool { .. } => true,
            Source::Kafka(k) => k.drained(),
        }
    }

    /// One poll: its events go into their partitions' open objects. Returns the source units
    /// consumed.
    fn poll(&mut self) -> u64 {
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let oldest = Day::of_ms(now).minus(self.config.archive_days.saturating_sub(1));
        let (scratch, positions, summary) =
            (&mut self.scratch, &mut self.scratch_pos, &mut self.summary);
        scratch.clear();
        positions.clear();
        let mut sink = |input: Input<'_>| {
            let Input::Event(e, raw, pos) = input else {
                if !matches!(input, Input::Revoked(_)) {
                    summary.skipped += 1;
                }
                return;
            };
            let day = Day::of_ms(e.at_ms);
            if e.at_ms > now.saturating_add(MAX_FUTURE_MS) || day < oldest {
                summary.skipped += 1;
                return;
            }
            scratch.extend_from_slice(raw);
            if let Some(p) = pos {
                positions.push((p.part, p.next.saturating_sub(1)));
            }
        };
        let (polled, spool_read) = match &mut self.source {
            Source::Spool { reader, .. } => match reader.poll(&mut sink) {
                Ok(p) => (p, reader.last_read().cloned().filter(|_| p.consumed > 0)),
                Err(e) => {
                    tracing::error!(error = %e, "archive consumer: reading the spool");
                    Default::default()
                }
            },
            Source::Kafka(k) => (k.poll(IDLE_WAIT, &mut sink), None),
        };
        let read_ms = now;
        let scratch = std::mem::take(&mut self.scratch);
        let positions = std::mem::take(&mut self.scratch_pos);
        let mut rest = &scratch[..];
        let mut kafka_name = String::new();
        for i in 0.. {
            // Decoded a moment ago by the source.
            let Ok((e, n)) = ClickEvent::decode(rest) else {
                break;
            };
            rest = &rest[n..];
            let (name, first, last) = match (&spool_read, positions.get(i)) {
                (Some(r), _) => (r.stem.as_str(), r.from, r.to),
                (None, Some((p, offset))) => {
                    use std::fmt::Write as _;
                    kafka_name.clear();
                    let _ = write!(kafka_name, "{p}");
                    (kafka_name.as_str(), *offset, *offset)
                }
                (None, None) => break,
            };
            self.add(name, first, last, read_ms, &e);
        }
        self.scratch = scratch;
        self.scratch_pos = positions;
        if let Source::Kafka(k) = &self.source {
            // A partition taken by another consumer: its open objects are dropped unwritten
            // (their events are read again by the new owner from the committed offset).
            self.partitions.retain(|name, _| {
                let held = name.parse().is_ok_and(|p| k.owns(p));
                if !held {
                    tracing::info!(partition = %name, "kafka partition revoked; its open objects are the new owner's to write");
                }
                held
            });
        }
        polled.consumed
    }

    fn add(&mut self, name: &str, first: u64, last: u64, read_ms: u64, e: &ClickEvent<'_>) {
        // The name is allocated once a partition, not once an event.
        if !self.partitions.contains_key(name) {
            self.partitions.insert(
                name.to_owned(),
                Partition {
                    open: BTreeMap::new(),
                    first,
                    last,
                    rows: 0,
                    opened: Instant::now(),
                    opened_ms: read_ms,
                },
            );
        }
        let Some(p) = self.partitions.get_mut(name) else {
            return; // inserted just above
        };
        // A Kafka partition read again from an earlier offset (a recreated topic) must not
        // commit past what its open objects hold.
        p.first = p.first.min(first);
        p.last = p.last.max(last);
        let hour = ((e.at_ms % 86_400_000) / 3_600_000) as u8;
        let slot = (Day::of_ms(e.at_ms), hour);
        let w = match p.open.entry(slot) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => match ObjectWriter::new() {
                Ok(w) => v.insert(w),
                Err(err) => {
                    tracing::error!(error = %err, "archive consumer: starting an object");
                    return;
                }
            },
        };
        if let Err(err) = w.push(e) {
            // Only an I/O error into memory could fail this: the object closes short.
            tracing::error!(error = %err, "archive consumer: adding an event to an object");
            return;
        }
        p.rows += 1;
    }

    /// Closes the partitions that are due (or all, with `all`).
    fn close_due(&mut self, all: bool) {
        let (limit, every) = (self.config.object_events, self.config.object_every);
        // A spool segment is done once sealed (or a dead writer's) and read to its end; an
        // engine seals by renaming, so that is seen here rather than on a read.
        let reader = match &self.source {
            Source::Spool { reader, .. } => Some(reader),
            Source::Kafka(_) => None,
        };
        let due: Vec<String> = self
            .partitions
            .iter()
            .filter(|(n, p)| {
                all || p.rows >= limit
                    || p.opened.elapsed() >= every
                    || reader.is_some_and(|r| r.finished(n))
            })
            .map(|(n, _)| n.clone())
            .collect();
        let source = match &self.config.source {
            SourceConfig::Kafka(k) => k.topic.clone(),
            SourceConfig::Spool(_) => "spool".to_owned(),
        };
        for name in due {
            let Some(p) = self.partitions.remove(&name) else {
                continue;
            };
            for ((day, hour), writer) in p.open {
                let rows = writer.rows();
                match writer.finish() {
                    Ok(bytes) => self.closed.push(Closed {
                        key: ObjectKey {
                            day,
                            hour,
                            source: source.clone(),
                            partition: name.clone(),
                            first: p.first,
                            last: p.last,
                        },
                        bytes: Bytes::from(bytes),
                        rows,
                    }),
                    Err(e) => {
                        tracing::error!(error = %e, partition = %name, "archive consumer: finishing an object");
                    }
                }
            }
        }
        if !self.closed.is_empty() {
            self.retry_at = None;
        }
    }

    /// Uploads the closed objects in order; once all are up, commits. On a failure, the rest
    /// waits for the next try, with backoff.
    fn upload(&mut self) -> bool {
        while let Some(c) = self.closed.first() {
            match self
                .objects
                .put(&c.key, c.bytes.clone(), self.config.part_bytes)
            {
                Ok(()) => {
                    self.metrics.archive_objects.inc();
                    self.metrics.archive_bytes.inc_by(c.bytes.len() as u64);
                    self.metrics.archive_rows.inc_by(c.rows);
                    self.summary.objects += 1;
                    self.summary.bytes += c.bytes.len() as u64;
                    self.summary.archived += c.rows;
                    tracing::debug!(object = %c.key.path(self.objects.prefix()), rows = c.rows, bytes = c.bytes.len(), "archive object written");
                    self.closed.remove(0);
                }
                Err(e) => {
                    if self.retry_at.is_none() {
                        tracing::error!(error = %e, object = %c.key.path(self.objects.prefix()), "archive upload failed; retrying with backoff, not reading meanwhile");
                    } else {
                        self.metrics.archive_upload_retries.inc();
                    }
                    self.metrics.archive_upload_errors.inc();
                    self.retry_at = Some(Instant::now() + self.backoff);
                    self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                    return false;
                }
            }
        }
        if self.retry_at.take().is_some() {
            tracing::info!("archive uploads recovered");
        }
        self.backoff = Duration::from_millis(500);
        self.commit().is_ok()
    }

    /// Commits every partition's position up to its first event still in an open object.
    fn commit(&mut self) -> Result<(), String> {
        if !self.closed.is_empty() {
            return Err("objects not yet uploaded".into());
        }
        let open: BTreeMap<&str, u64> = self
            .partitions
            .iter()
            .map(|(n, p)| (n.as_str(), p.first))
            .collect();
        match &mut self.source {
            Source::Spool {
                reader,
                positions,
                file,
            } => {
                let checkpoint = reader.checkpoint_capped(|stem| open.get(stem).copied());
                if checkpoint.is_empty() {
                    reader.committed(&checkpoint);
                    return Ok(());
                }
                let mut next = positions.clone();
                for (key, value) in &checkpoint {
                    match value {
                        Some(v) => next.insert(key.clone(), *v),
                        None => next.remove(key),
                    };
                }
                write_positions(file, &next).map_err(|e| format!("{}: {e}", file.display()))?;
                *positions = next;
                reader.committed(&checkpoint);
            }
            Source::Kafka(k) => {
                let upto: BTreeMap<i32, i64> = k
                    .next_offsets()
                    .iter()
                    .filter(|(p, _)| k.owns(**p))
                    .map(|(p, next)| {
                        let first = open
                            .get(p.to_string().as_str())
                            .map(|f| i64::try_from(*f).unwrap_or(i64::MAX));
                        (*p, first.map_or(*next, |f| f.min(*next)))
                    })
                    .collect();
                k.commit_offsets(&upto);
            }
        }
        self.summary.flushes += 1;
        Ok(())
    }

    /// Reads to the source's end (a few seconds at most), closes everything, uploads and
    /// commits, retrying uploads for up to `wait`.
    fn flush_all(&mut self, wait: Duration) -> Result<(), String> {
        let until = Instant::now() + wait;
        if self.closed.is_empty() {
            let read_until = Instant::now() + Duration::from_secs(5);
            loop {
                self.idle = self.poll() == 0;
                if self.idle || Instant::now() >= read_until {
                    break;
                }
            }
        }
        self.close_due(true);
        loop {
            if self.upload() {
                self.catch_up();
                return Ok(());
            }
            if Instant::now() >= until {
                return Err("the archive's object store is failing; see the log".into());
            }
            std::thread::sleep(
                self.retry_at
                    .map_or(Duration::ZERO, |t| {
                        t.saturating_duration_since(Instant::now())
                    })
                    .min(until.saturating_duration_since(Instant::now())),
            );
        }
    }

    /// After a poll that found nothing to read, with the whole source held: every event read
    /// before the oldest open object's first is durable.
    fn catch_up(&self) {
        let whole = self.idle
            && self.closed.is_empty()
            && match &self.source {
                Source::Spool { .. } => true,
                Source::Kafka(k) => k.holds_all() && k.drained(),
            };
        if whole {
            let now = u64::try_from(now_ms()).unwrap_or(0);
            let oldest_open = self.partitions.values().map(|p| p.opened_ms).min();
            self.handle
                .caught_up_ms
                .store(oldest_open.unwrap_or(now).min(now), Ordering::Relaxed);
        }
    }

    /// The age of the oldest event read and not yet durable.
    fn gauge(&self) {
        let oldest = self.partitions.values().map(|p| p.opened.elapsed()).max();
        self.metrics
            .archive_unarchived_seconds
            .set(oldest.map_or(0.0, |d| d.as_secs_f64()));
    }

    /// Deletes the days past retention, except a day with an open object.
    fn prune(&mut self) {
        let oldest_kept = Day::today().minus(self.config.archive_days.saturating_sub(1));
        let days = match self.objects.days() {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "archive retention: listing the days");
                return;
            }
        };
        for day in days.into_iter().filter(|d| *d < oldest_kept) {
            let open = self
                .partitions
                .values()
                .any(|p| p.open.keys().any(|(d, _)| *d == day))
                || self.closed.iter().any(|c| c.key.day == day);
            if open {
                tracing::info!(%day, "archive day past retention still being written; kept for now");
                continue;
            }
            match self.objects.delete_day(day) {
                Ok(n) => tracing::info!(%day, objects = n, "archive day past retention deleted"),
                Err(e) => tracing::error!(error = %e, %day, "archive retention: deleting a day"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_round_trip_and_garbage_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = positions_file(dir.path());
        assert!(read_positions(&path).unwrap().is_empty());
        let mut p = BTreeMap::new();
        p.insert("spool/edge-a.0000000001".to_string(), 42u64);
        write_positions(&path, &p).unwrap();
        assert_eq!(read_positions(&path).unwrap(), p);
        std::fs::write(&path, b"{not json").unwrap();
        assert!(read_positions(&path).is_err());
    }

    #[test]
    fn group_name() {
        assert_eq!(archive_group("lasthop-clicks"), "lasthop-clicks.archive");
    }

    fn config(dir: &Path) -> ArchiverConfig {
        ArchiverConfig {
            clicks_dir: dir.join("clicks"),
            source: SourceConfig::Spool(dir.join("clicks/spool")),
            archive: ArchiveLocation::local(&dir.join("archive")),
            object_events: 3,
            object_every: Duration::from_secs(300),
            part_bytes: 8 << 20,
            flush_every: Duration::from_millis(100),
            archive_days: 90,
            spool_stale: Duration::from_secs(600),
        }
    }

    fn put(objects: &Objects, day: Day) {
        let key = ObjectKey {
            day,
            hour: 1,
            source: "spool".into(),
            partition: "edge-a.0000000000".into(),
            first: 0,
            last: 1,
        };
        objects
            .put(&key, Bytes::from_static(b"x"), 8 << 20)
            .unwrap();
    }

    /// Retention deletes whole days past it at start and later, never a day with an object
    /// open; a finished spool segment closes its objects, and its position is committed once
    /// they are up.
    #[test]
    fn retention_spares_open_days_and_positions_wait_for_objects() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = config(dir.path());
        let objects = Objects::open(&cfg.archive, None).unwrap();
        let today = Day::today();
        for day in [today, today.minus(89), today.minus(90), today.minus(200)] {
            put(&objects, day);
        }
        let metrics = Metrics::standalone().unwrap();
        let mut archiver = Archiver::open(cfg.clone(), &metrics).unwrap();
        assert_eq!(objects.days().unwrap(), vec![today.minus(89), today]);

        // An old day with an object open is kept until it closes.
        put(&objects, today.minus(100));
        let e = crate::columnar::tests::event(1, "Mozilla/5.0");
        let old = ClickEvent {
            at_ms: today.minus(100).start_ms() + 3_600_000,
            ..e
        };
        archiver.add("edge-a.0000000009", 0, 10, 0, &old);
        archiver.prune();
        assert!(objects.days().unwrap().contains(&today.minus(100)));
        archiver.partitions.clear();
        archiver.prune();
        assert!(!objects.days().unwrap().contains(&today.minus(100)));

        // A sealed segment of 5 events, read to its end: its objects close.
        let spool_dir = dir.path().join("clicks/spool");
        std::fs::create_dir_all(&spool_dir).unwrap();
        let mut frame = Vec::new();
        for i in 0..5 {
            ClickEvent {
                id: lasthop_core::click::EventId::new(0x42, i),
                at_ms: u64::try_from(now_ms()).unwrap() - 1000,
                ..e
            }
            .encode(&mut frame);
        }
        let mut seg = lasthop_core::click::spool::SEGMENT_MAGIC.to_vec();
        lasthop_core::click::spool::encode_frame(&mut seg, &frame, 5);
        std::fs::write(spool_dir.join("edge-b.0000000001.seg"), &seg).unwrap();
        archiver.poll();
        assert_eq!(archiver.partitions["edge-b.0000000001"].rows, 5);
        assert!(
            matches!(&archiver.source, Source::Spool { reader, .. } if reader.finished("edge-b.0000000001"))
        );
        archiver.close_due(false);
        assert!(archiver.partitions.is_empty());
        assert!(archiver.upload());
        let positions = read_positions(&positions_file(&cfg.clicks_dir)).unwrap();
        assert_eq!(
            positions.get("spool/edge-b.0000000001"),
            Some(&(seg.len() as u64)),
            "committed once the object is up"
        );
        let mut rows = 0;
        crate::recompute::day_events(&objects, today, |_| rows += 1).unwrap();
        assert_eq!(rows, 5);

        // An engine's way: the `.open` file is read as it grows, then sealed by a rename with
        // nothing new to read. The seal alone closes its objects.
        let open = spool_dir.join("edge-c.0000000002.open");
        std::fs::write(&open, &seg).unwrap();
        archiver.config.object_events = 1000;
        archiver.poll();
        archiver.close_due(false);
        assert_eq!(
            archiver.partitions["edge-c.0000000002"].rows, 5,
            "still open"
        );
        std::fs::rename(&open, spool_dir.join("edge-c.0000000002.seg")).unwrap();
        assert_eq!(archiver.poll(), 0, "nothing new to read");
        archiver.close_due(false);
        assert!(archiver.partitions.is_empty(), "closed by the seal");
        assert!(archiver.upload());
    }
}
