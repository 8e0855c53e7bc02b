//! The archive consumer: writes every raw event into the day archive, apart from the processor
//! (docs/ARCHITECTURE.md, "The click pipeline"), so a processor that crashes, is stopped or
//! cannot reach its rollup store costs no raw event.
//!
//! It reads the same source at a position of its own: on Kafka a consumer group of its own
//! (`<group>.archive`), committed after each archive fsync; on the spool its own positions
//! (`DATA_DIR/clicks/archive-positions.json`, written after each fsync), a spool file being
//! deleted only once both readers finished it (`spool.rs`). Delivery into the archive is at
//! least once: a crash between the fsync and the position write appends an interval twice, and
//! the recompute drops repeated event ids.
//!
//! Every event the processor could count is kept: an event from more than five minutes in the
//! future, or of a day past the archive's retention, is not (the processor counts neither).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::archive::{self, ArchiveError, ArchiveWriter};
use super::kafka::{KafkaConfig, KafkaSource};
use super::source::{ProcessorError, SourceConfig, IDLE_WAIT, MAX_FUTURE_MS};
use super::spool::{self, Input, SpoolReader};
use super::Day;
use crate::metrics::ClickMetrics as Metrics;
use lasthop_core::clock::now_ms;

/// The archive consumer's settings.
#[derive(Debug, Clone)]
pub struct ArchiverConfig {
    /// `DATA_DIR/clicks`: the archive and this consumer's spool positions live here.
    pub clicks_dir: PathBuf,
    /// The source (a Kafka group is suffixed `.archive`: see [`archive_group`]).
    pub source: SourceConfig,
    /// Flush interval.
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
    /// Events written to the archive.
    pub archived: u64,
    /// Events not kept: undecodable, from the future, or past retention.
    pub skipped: u64,
    /// Flushes done.
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
    /// Has the consumer read to the source's end and write and fsync it; waits up to `wait`.
    pub fn flush(&self, wait: Duration) -> Result<(), String> {
        let (reply, answer) = mpsc::channel();
        self.commands
            .send(Command::Flush(reply))
            .map_err(|_| "the archive consumer is not running".to_string())?;
        answer
            .recv_timeout(wait)
            .map_err(|_| "the archive consumer did not answer".to_string())?
    }

    /// Wall time (Unix ms) of the last flush after which nothing was left to read of the whole
    /// source (on Kafka: every partition held by this consumer and read to its end): every
    /// event that arrived before it is in this archive. 0 before the first, and always 0 for a
    /// consumer that shares its group (each then holds part of the archive).
    pub fn caught_up_ms(&self) -> u64 {
        self.caught_up_ms.load(Ordering::Relaxed)
    }

    /// Asks the consumer to flush and stop.
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

/// The archive consumer.
pub struct Archiver {
    config: ArchiverConfig,
    source: Source,
    archive: ArchiveWriter,
    lines: HashMap<Day, Vec<u8>>,
    archive_failed: bool,
    summary: ArchiveSummary,
    commands: mpsc::Receiver<Command>,
    handle: ArchiveHandle,
    flush_failing: bool,
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

/// Replaces the positions file durably: a temp file, fsynced, renamed over it, the directory
/// fsynced.
fn write_positions(path: &Path, positions: &BTreeMap<String, u64>) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec(positions).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

impl Archiver {
    /// Opens the archive and the source.
    pub fn open(config: ArchiverConfig, metrics: &Metrics) -> Result<Archiver, ProcessorError> {
        let root = config.clicks_dir.join("archive");
        archive::prune(&root, config.archive_days, Day::today(), |_| false)?;
        let archive = ArchiveWriter::start(root)?;
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
        Ok(Archiver {
            config,
            source,
            archive,
            lines: HashMap::new(),
            archive_failed: false,
            summary: ArchiveSummary::default(),
            commands,
            handle: ArchiveHandle {
                commands: tx,
                caught_up_ms: Arc::new(AtomicU64::new(0)),
            },
            flush_failing: false,
            idle: false,
        })
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

    /// Archives until stopped, or (with `exit_when_idle`) until the source is drained; flushes
    /// before returning.
    pub fn run(mut self, exit_when_idle: bool) -> ArchiveSummary {
        let mut next_flush = Instant::now() + self.config.flush_every;
        let mut next_prune = Instant::now() + Duration::from_secs(86_400);
        loop {
            match self.commands.try_recv() {
                Ok(Command::Stop) => break,
                Ok(Command::Flush(reply)) => {
                    self.drain();
                    let _ = reply.send(self.flush());
                    continue;
                }
                Err(_) => {}
            }
            let consumed = self.poll();
            self.idle = consumed == 0;
            if Instant::now() >= next_flush {
                let _ = self.flush();
                next_flush = Instant::now() + self.config.flush_every;
            }
            if Instant::now() >= next_prune {
                if let Err(e) = self.archive.prune(self.config.archive_days, Day::today()) {
                    tracing::error!(error = %e, "archive retention");
                }
                next_prune = Instant::now() + Duration::from_secs(86_400);
            }
            if consumed == 0 {
                if exit_when_idle && self.drained() {
                    break;
                }
                if let Source::Spool { .. } = self.source {
                    match self.commands.recv_timeout(IDLE_WAIT) {
                        Ok(Command::Stop) => break,
                        Ok(Command::Flush(reply)) => {
                            self.drain();
                            let _ = reply.send(self.flush());
                        }
                        Err(_) => {}
                    }
                }
            }
        }
        let _ = self.flush();
        if self.flush_failing {
            std::thread::sleep(Duration::from_millis(500));
            let _ = self.flush();
        }
        tracing::info!(summary = ?self.summary, "archive consumer stopped");
        self.summary
    }

    /// Polls until nothing is left to read (at most a few seconds' worth).
    fn drain(&mut self) {
        let until = Instant::now() + Duration::from_secs(5);
        loop {
            self.idle = self.poll() == 0;
            if self.idle || Instant::now() >= until {
                break;
            }
        }
    }

    fn drained(&self) -> bool {
        match &self.source {
            Source::Spool { .. } => true,
            Source::Kafka(k) => k.drained(),
        }
    }

    /// One poll; returns the source units consumed.
    fn poll(&mut self) -> u64 {
        let now = u64::try_from(now_ms()).unwrap_or(0);
        let oldest = Day::of_ms(now).minus(self.config.archive_days.saturating_sub(1));
        let (lines, summary, archive, failed) = (
            &mut self.lines,
            &mut self.summary,
            &self.archive,
            &mut self.archive_failed,
        );
        let mut sink = |input: Input<'_>| {
            let Input::Event(e, raw, _) = input else {
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
            summary.archived += 1;
            let buf = lines.entry(day).or_default();
            buf.extend_from_slice(raw);
            if buf.len() >= archive::CHUNK_BYTES
                && archive.append(day, std::mem::take(buf)).is_err()
            {
                *failed = true;
            }
        };
        let polled = match &mut self.source {
            Source::Spool { reader, .. } => match reader.poll(&mut sink) {
                Ok(p) => p,
                Err(e) => {
                    tracing::error!(error = %e, "archive consumer: reading the spool");
                    Default::default()
                }
            },
            Source::Kafka(k) => k.poll(IDLE_WAIT, &mut sink),
        };
        polled.consumed
    }

    /// Writes and fsyncs the interval's events, then records the position past them.
    fn flush(&mut self) -> Result<(), String> {
        let was_idle = self.idle
            && match &self.source {
                Source::Spool { .. } => true,
                Source::Kafka(k) => k.holds_all() && k.drained(),
            };
        let started = now_ms();
        let result = self.try_flush();
        match &result {
            Ok(()) => {
                self.summary.flushes += 1;
                if self.flush_failing {
                    tracing::info!("archive flushes recovered");
                }
                self.flush_failing = false;
                if was_idle {
                    self.handle
                        .caught_up_ms
                        .store(u64::try_from(started).unwrap_or(0), Ordering::Relaxed);
                }
            }
            Err(e) => {
                if !self.flush_failing {
                    tracing::error!(error = %e, "archive flush failed; retrying every interval");
                }
                self.flush_failing = true;
            }
        }
        result
    }

    fn try_flush(&mut self) -> Result<(), String> {
        for (day, lines) in self.lines.iter_mut() {
            if !lines.is_empty() && self.archive.append(*day, std::mem::take(lines)).is_err() {
                self.archive_failed = true;
            }
        }
        self.lines.retain(|_, l| l.capacity() > 0);
        if std::mem::take(&mut self.archive_failed) {
            return Err("the archive thread stopped".into());
        }
        self.archive.sync().map_err(|e| e.to_string())?;
        match &mut self.source {
            Source::Spool {
                reader,
                positions,
                file,
            } => {
                let checkpoint = reader.checkpoint();
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
            Source::Kafka(k) => k.committed(),
        }
        Ok(())
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
}
