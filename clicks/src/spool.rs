//! The spool reader: the processor's side of the directory engines append click frames to.
//!
//! Each writer appends to `<writer>.<n:010>.open`, then fsyncs and renames it to
//! `<writer>.<n:010>.seg` (sealed, never written again) and opens n+1. Progress is keyed by stem
//! (`<writer>.<n:010>`), so a rename between reads loses nothing. Files are read in (writer, n)
//! order, a bounded chunk at a time:
//! - an incomplete frame at the end of an `.open` file is a writer mid-append: come back later;
//! - an incomplete tail of a `.seg` (or of an `.open` untouched for the stale time) is torn:
//!   counted, the file is finished;
//! - a bad checksum (or a bad header) is corrupt: counted, the rest of the file is skipped;
//! - a bad event inside a good frame is invalid: counted, the rest of that frame is skipped;
//! - other file names are ignored (logged once).
//!
//! Positions are persisted by the processor in the same transaction as the rollups they cover
//! ([`SpoolReader::checkpoint`]); only after that commit are finished files deleted
//! ([`SpoolReader::committed`]).
//!
//! Two consumers read one spool, each at its own position: the processor (rollups) and the
//! archive consumer. A reader that finished and committed a file leaves a marker,
//! `.<stem>.<reader>.done`; whichever finds every reader's marker deletes the file and the
//! markers ([`SpoolReader::shared_with`]). So a stopped processor holds the files back (the
//! archive keeps taking them in) rather than losing them.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::OsString;
use std::fs::File;
use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use lasthop_core::click::spool::{
    self, parse_stem, Next, SegmentName, FRAME_HEADER, MAX_FRAME_PAYLOAD, SEGMENT_MAGIC,
};
use lasthop_core::click::ClickEvent;

/// Bytes read from a file at a time: always more than one whole frame.
const CHUNK: usize = 32 << 20;
const _: () = assert!(CHUNK > MAX_FRAME_PAYLOAD + FRAME_HEADER);
/// A stored position meaning "skip the rest of this file" (it was corrupt).
pub const SKIP: u64 = u64::MAX;
/// The shortest stale period accepted: engines seal a segment once it is 30 s old, and a live
/// writer's `.open` file must never look dead (it would be deleted under the writer).
pub const MIN_STALE: Duration = Duration::from_secs(120);
/// Prefix of the spool's keys among the store's source offsets.
pub const KEY_PREFIX: &str = "spool/";

/// What a source hands the processor.
#[derive(Debug)]
pub enum Input<'a> {
    /// A decoded, checked event and the bytes it was decoded from, borrowing the source's
    /// buffer; from Kafka, its partition and the offset after it.
    Event(ClickEvent<'a>, &'a [u8], Option<super::store::Pos>),
    /// A Kafka partition left this processor (a rebalance): what it had not flushed of it is
    /// dropped, and the partition's next owner counts it from the stored position.
    Revoked(i32),
    /// An event that does not decode (the rest of its frame or message is skipped).
    Invalid,
    /// A frame with a bad checksum or a file with a bad header (the rest of the file is skipped).
    Corrupt,
    /// A sealed file's incomplete tail.
    Torn,
}

/// How much one poll did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Polled {
    /// Events handed over (valid ones).
    pub events: u64,
    /// Source units consumed (bytes for the spool, messages for Kafka); 0 means idle.
    pub consumed: u64,
}

/// Why reading the spool failed (the directory itself, not a file's content).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    /// A directory or file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> SpoolError + '_ {
    move |source| SpoolError::Io {
        path: path.to_owned(),
        source,
    }
}

#[derive(Debug)]
struct FileState {
    /// Next byte to read ([`SKIP`]: the rest is skipped).
    read: u64,
    /// `read` as of the last committed flush.
    committed: u64,
    /// As of the last scan.
    sealed: bool,
    len: u64,
    modified: SystemTime,
    /// Found by the current scan.
    seen: bool,
    /// Consecutive scans that found neither its `.open` nor its `.seg`.
    missed: u8,
    /// This reader left its done marker (once: after the last reader deletes the file and the
    /// markers, a marker made again would outlive them).
    marked: bool,
}

impl FileState {
    fn finished(&self) -> bool {
        self.read == SKIP || self.read >= self.len
    }
}

/// Scans that must miss a file (both names) before it counts as gone. A listing can miss a file
/// renamed while it runs (readdir returns a renamed entry under either name, or under neither),
/// so one miss proves nothing; a second scan starts after that rename finished and sees `.seg`.
const GONE_AFTER_MISSES: u8 = 2;

/// What a scan needs of a file; a seam so tests can rename files between the listing and the
/// stat.
#[derive(Debug, Clone, Copy)]
struct FileMeta {
    len: u64,
    modified: SystemTime,
}

fn stat_file(path: &Path) -> std::io::Result<FileMeta> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(std::io::ErrorKind::NotFound.into());
    }
    Ok(FileMeta {
        len: meta.len(),
        // Without mtimes (never on Linux) a file is never stale, only sealed files finish.
        modified: meta.modified().unwrap_or_else(|_| SystemTime::now()),
    })
}

/// Where a scan found a stem.
enum Found {
    File {
        sealed: bool,
        meta: FileMeta,
    },
    /// Neither name exists.
    Missing,
    /// The stat failed otherwise (permissions, I/O): no news, not a miss.
    Unknown,
}

/// Stored positions not yet matched with a file, and how many scans missed them.
type Stored = BTreeMap<(String, u64), (u64, u8)>;

/// Reads a spool directory.
#[derive(Debug)]
pub struct SpoolReader {
    dir: PathBuf,
    stale: Duration,
    files: BTreeMap<(String, u64), FileState>,
    /// Positions of files that are gone, to drop from the store at the next flush.
    forget: Vec<String>,
    /// Positions loaded at start whose file no scan has found yet.
    stored: Stored,
    ignored: HashSet<OsString>,
    buf: Vec<u8>,
    /// This reader's name in the done markers.
    me: &'static str,
    /// The other readers that must finish a file before it is deleted.
    peers: &'static [&'static str],
    /// What the last poll that consumed anything read.
    last: Option<LastRead>,
}

/// The file and byte range one poll read (the archive consumer names objects by them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastRead {
    /// The file's stem, `<writer>.<number>`.
    pub stem: String,
    /// The first byte read.
    pub from: u64,
    /// The byte after the last one read ([`SKIP`] for a skipped rest).
    pub to: u64,
}

/// The processor's name among a spool's readers.
pub const ROLLUPS: &str = "rollups";
/// The archive consumer's.
pub const ARCHIVE: &str = "archive";

impl SpoolReader {
    /// A reader of `dir` (created if missing), resuming from `stored` positions (keys without
    /// [`KEY_PREFIX`]). A `.open` file untouched for `stale` is a dead writer's.
    pub fn open(
        dir: PathBuf,
        stale: Duration,
        stored: Vec<(String, u64)>,
    ) -> Result<SpoolReader, SpoolError> {
        Self::open_with(dir, stale, stored, &mut stat_file)
    }

    fn open_with(
        dir: PathBuf,
        stale: Duration,
        stored: Vec<(String, u64)>,
        stat: &mut dyn FnMut(&Path) -> std::io::Result<FileMeta>,
    ) -> Result<SpoolReader, SpoolError> {
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let mut forget = Vec::new();
        let mut matched = Stored::new();
        for (stem, pos) in stored {
            match parse_stem(&stem) {
                Some(key) => {
                    matched.insert(key, (pos, 0));
                }
                // Not a key this reader writes: drop it.
                None => forget.push(stem),
            }
        }
        let mut reader = SpoolReader {
            dir,
            stale,
            files: BTreeMap::new(),
            forget,
            stored: matched,
            ignored: HashSet::new(),
            buf: Vec::new(),
            me: ROLLUPS,
            peers: &[],
            last: None,
        };
        // Positions whose file is gone (deleted after a commit whose key removal never
        // committed) are forgotten once GONE_AFTER_MISSES scans missed them: the first poll.
        reader.scan(stat)?;
        Ok(reader)
    }

    /// This reader is `me` among several: a file it finished is deleted only once every one of
    /// `peers` finished it too (see the module notes).
    pub fn shared_with(mut self, me: &'static str, peers: &'static [&'static str]) -> SpoolReader {
        self.me = me;
        self.peers = peers;
        self
    }

    fn marker(&self, writer: &str, n: u64, reader: &str) -> PathBuf {
        self.dir
            .join(format!(".{}.{reader}.done", spool::stem(writer, n)))
    }

    /// Leaves this reader's done marker on a finished file (once); true when every reader's is
    /// there (the file may go).
    fn all_done(&mut self, writer: &str, n: u64) -> bool {
        if self.peers.is_empty() {
            return true;
        }
        let key = (writer.to_owned(), n);
        if self.files.get(&key).is_some_and(|f| !f.marked) {
            let mine = self.marker(writer, n, self.me);
            if let Err(e) = File::create(&mine) {
                tracing::warn!(path = %mine.display(), error = %e, "cannot mark a spool file done");
                return false;
            }
            if let Some(f) = self.files.get_mut(&key) {
                f.marked = true;
            }
        }
        self.peers
            .iter()
            .all(|p| self.marker(writer, n, p).exists())
    }

    /// The spool directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, writer: &str, n: u64, sealed: bool) -> PathBuf {
        let name = SegmentName {
            writer: writer.to_owned(),
            n,
            sealed,
        };
        self.dir.join(name.file_name())
    }

    /// Stats a stem by path, `.open` first: writers only ever rename `.open` → `.seg`, so when
    /// `.open` is missing the `.seg` (if any) is already in place.
    fn find(
        &self,
        writer: &str,
        n: u64,
        stat: &mut dyn FnMut(&Path) -> std::io::Result<FileMeta>,
    ) -> Found {
        let mut unknown = false;
        for sealed in [false, true] {
            let path = self.path(writer, n, sealed);
            match stat(&path) {
                Ok(meta) => return Found::File { sealed, meta },
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot stat a spool file");
                    unknown = true;
                }
            }
        }
        if unknown {
            Found::Unknown
        } else {
            Found::Missing
        }
    }

    /// Brings `files` up to date with the directory. A file is only dropped (its position
    /// forgotten) after [`GONE_AFTER_MISSES`] consecutive scans found neither of its names.
    fn scan(
        &mut self,
        stat: &mut dyn FnMut(&Path) -> std::io::Result<FileMeta>,
    ) -> Result<(), SpoolError> {
        for f in self.files.values_mut() {
            f.seen = false;
        }
        // Every stem worth a look: the listing's, the known files', the unmatched stored ones.
        let mut stems: BTreeSet<(String, u64)> = BTreeSet::new();
        let entries = std::fs::read_dir(&self.dir).map_err(io(&self.dir))?;
        for entry in entries {
            let entry = entry.map_err(io(&self.dir))?;
            let file_name = entry.file_name();
            if file_name.as_encoded_bytes().starts_with(b".") {
                // Done markers (and other hidden files): never segments.
                if let Some(name) = file_name.to_str() {
                    self.sweep_marker(name);
                }
                continue;
            }
            let Some(name) = file_name.to_str().and_then(SegmentName::parse) else {
                if self.ignored.insert(file_name.clone()) {
                    tracing::warn!(file = ?file_name, dir = %self.dir.display(), "ignoring a file that is not a spool segment");
                }
                continue;
            };
            stems.insert((name.writer, name.n));
        }
        stems.extend(self.files.keys().cloned());
        stems.extend(self.stored.keys().cloned());
        let mut missing = HashSet::new();
        for key in stems {
            let (sealed, meta) = match self.find(&key.0, key.1, stat) {
                Found::File { sealed, meta } => (sealed, meta),
                Found::Missing => {
                    missing.insert(key);
                    continue;
                }
                Found::Unknown => {
                    // No news is not a miss.
                    if let Some(f) = self.files.get_mut(&key) {
                        f.seen = true;
                    }
                    continue;
                }
            };
            if !self.files.contains_key(&key) {
                let read = self.stored.remove(&key).map_or(0, |(pos, _)| pos);
                let stem = spool::stem(&key.0, key.1);
                // Back after being given up on: never send a key's removal beside its position.
                self.forget.retain(|s| *s != stem);
                self.files.insert(
                    key.clone(),
                    FileState {
                        read,
                        committed: read,
                        sealed: false,
                        len: 0,
                        modified: meta.modified,
                        seen: true,
                        missed: 0,
                        marked: false,
                    },
                );
            }
            let grew_marked = self
                .files
                .get(&key)
                .is_some_and(|f| f.marked && meta.len > f.len);
            if grew_marked {
                // A "dead" writer came back and appended after this reader marked the file
                // done: not done any more (another reader must not delete the new tail).
                let _ = std::fs::remove_file(self.marker(&key.0, key.1, self.me));
            }
            if let Some(state) = self.files.get_mut(&key) {
                if grew_marked {
                    state.marked = false;
                }
                // Sealed is for ever (a `.seg` is never renamed back).
                state.sealed |= sealed;
                state.len = state.len.max(meta.len);
                state.modified = meta.modified;
                state.seen = true;
                state.missed = 0;
            }
        }
        // Files (and stored positions) missed by this scan; gone after enough misses in a row.
        let mut gone = Vec::new();
        for (key, f) in self.files.iter_mut().filter(|(_, f)| !f.seen) {
            f.missed = f.missed.saturating_add(1);
            if f.missed >= GONE_AFTER_MISSES {
                gone.push(key.clone());
            }
        }
        for key in gone {
            let finished = self.files.get(&key).is_some_and(FileState::finished);
            if finished {
                // Another reader of the spool deleted it once all were done.
                tracing::debug!(file = %spool::stem(&key.0, key.1), "a finished spool file was deleted");
            } else {
                tracing::warn!(file = %spool::stem(&key.0, key.1), "a spool file vanished without being consumed; forgetting it");
            }
            self.files.remove(&key);
            self.forget.push(spool::stem(&key.0, key.1));
        }
        let mut orphans = Vec::new();
        for (key, (_, missed)) in self.stored.iter_mut() {
            if !missing.contains(key) {
                continue;
            }
            *missed = missed.saturating_add(1);
            if *missed >= GONE_AFTER_MISSES {
                orphans.push(key.clone());
            }
        }
        for key in orphans {
            self.stored.remove(&key);
            self.forget.push(spool::stem(&key.0, key.1));
        }
        Ok(())
    }

    /// Removes a done marker whose segment is gone and that is older than the stale period (a
    /// reader that marked a file as another deleted it).
    fn sweep_marker(&self, name: &str) {
        let Some(rest) = name.strip_prefix('.').and_then(|r| r.strip_suffix(".done")) else {
            return;
        };
        let Some((stem, _reader)) = rest.rsplit_once('.') else {
            return;
        };
        let Some((writer, n)) = parse_stem(stem) else {
            return;
        };
        if self.path(&writer, n, true).exists() || self.path(&writer, n, false).exists() {
            return;
        }
        let path = self.dir.join(name);
        let old = std::fs::metadata(&path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > self.stale);
        if old {
            let _ = std::fs::remove_file(&path);
        }
    }

    fn is_stale(&self, f: &FileState) -> bool {
        !f.sealed
            && SystemTime::now()
                .duration_since(f.modified)
                .is_ok_and(|age| age >= self.stale)
    }

    /// Reads the next chunk of the first file with something new, handing every event (and
    /// every problem) to `sink`. Returns `consumed == 0` when there was nothing to read.
    pub fn poll(&mut self, mut sink: impl FnMut(Input<'_>)) -> Result<Polled, SpoolError> {
        self.scan(&mut stat_file)?;
        let keys: Vec<(String, u64)> = self
            .files
            .iter()
            .filter(|(_, f)| !f.finished())
            .map(|(k, _)| k.clone())
            .collect();
        for key in keys {
            let polled = self.read_file(&key, &mut sink)?;
            if polled.consumed > 0 {
                return Ok(polled);
            }
        }
        Ok(Polled::default())
    }

    fn read_file(
        &mut self,
        key: &(String, u64),
        sink: &mut impl FnMut(Input<'_>),
    ) -> Result<Polled, SpoolError> {
        let Some(state) = self.files.get(key) else {
            return Ok(Polled::default());
        };
        let (start, len, sealed) = (state.read, state.len, state.sealed);
        let dead = sealed || self.is_stale(state);
        let path = self.path(&key.0, key.1, sealed);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            // Renamed .open → .seg since the scan: the next poll finds it.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Polled::default()),
            Err(e) => return Err(io(&path)(e)),
        };
        // The file may have grown since the scan; read what is there now, up to a chunk.
        let want = usize::try_from(len.saturating_sub(start))
            .unwrap_or(CHUNK)
            .min(CHUNK);
        self.buf.clear();
        file.seek(SeekFrom::Start(start)).map_err(io(&path))?;
        (&mut file)
            .take(want as u64)
            .read_to_end(&mut self.buf)
            .map_err(io(&path))?;
        let at_end = start + self.buf.len() as u64 >= len;
        let mut pos = 0usize;
        let mut events = 0u64;
        let mut next_read = None;
        if start == 0 {
            match spool::segment_body(&self.buf) {
                Ok(_) => pos = SEGMENT_MAGIC.len(),
                Err(_) if self.buf.len() < SEGMENT_MAGIC.len() && !dead => {
                    return Ok(Polled::default())
                }
                Err(_) if self.buf.len() < SEGMENT_MAGIC.len() => {
                    sink(Input::Torn);
                    next_read = Some(len);
                }
                Err(_) => {
                    tracing::warn!(path = %path.display(), "spool file without the segment header: skipped");
                    sink(Input::Corrupt);
                    next_read = Some(SKIP);
                }
            }
        }
        while next_read.is_none() {
            match spool::next_frame(&self.buf[pos..]) {
                Ok(Next::Frame {
                    payload, len: used, ..
                }) => {
                    // `spool::events`, keeping each event's bytes for the archive.
                    let mut rest = payload;
                    while !rest.is_empty() {
                        match ClickEvent::decode(rest) {
                            Ok((e, n)) => {
                                events += 1;
                                sink(Input::Event(e, &rest[..n], None));
                                rest = &rest[n..];
                            }
                            Err(_) => {
                                sink(Input::Invalid);
                                break;
                            }
                        }
                    }
                    pos += used;
                }
                Ok(Next::Incomplete) => {
                    if pos == self.buf.len() {
                        break;
                    }
                    if at_end && dead {
                        tracing::warn!(path = %path.display(), bytes = self.buf.len() - pos, "torn tail of a spool file");
                        sink(Input::Torn);
                        pos = self.buf.len();
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), offset = start + pos as u64, error = %e, "corrupt spool frame: skipping the rest of the file");
                    sink(Input::Corrupt);
                    next_read = Some(SKIP);
                }
            }
        }
        let new_read = next_read.unwrap_or(start + pos as u64);
        if let Some(state) = self.files.get_mut(key) {
            state.read = new_read;
        }
        if new_read != start {
            self.last = Some(LastRead {
                stem: spool::stem(&key.0, key.1),
                from: start,
                to: new_read,
            });
        }
        let consumed = if new_read == SKIP {
            len.saturating_sub(start).max(1)
        } else {
            new_read - start
        };
        Ok(Polled { events, consumed })
    }

    /// Whether the file `stem` (`<writer>.<number>`) is done: sealed (or a dead writer's) and
    /// read to its end.
    pub fn finished(&self, stem: &str) -> bool {
        parse_stem(stem)
            .and_then(|k| self.files.get(&k))
            .is_some_and(|f| f.finished() && (f.sealed || self.is_stale(f)))
    }

    /// What the last poll that consumed anything read.
    pub fn last_read(&self) -> Option<&LastRead> {
        self.last.as_ref()
    }

    /// Positions changed since the last commit (`None`: forget the key), keys with
    /// [`KEY_PREFIX`]. A key appears once: a file still tracked is never also forgotten.
    pub fn checkpoint(&self) -> Vec<(String, Option<u64>)> {
        self.checkpoint_capped(|_| None)
    }

    /// [`checkpoint`](Self::checkpoint), each file's position no further than `cap` says for
    /// its stem (`<writer>.<number>`): the archive consumer commits only what its objects hold.
    pub fn checkpoint_capped(
        &self,
        cap: impl Fn(&str) -> Option<u64>,
    ) -> Vec<(String, Option<u64>)> {
        let mut out: BTreeMap<String, Option<u64>> = self
            .forget
            .iter()
            .filter(|stem| parse_stem(stem).is_none_or(|key| !self.files.contains_key(&key)))
            .map(|stem| (format!("{KEY_PREFIX}{stem}"), None))
            .collect();
        out.extend(self.files.iter().filter_map(|((w, n), f)| {
            // A cap is never below the committed position: nothing moved, nothing to name.
            if f.read == f.committed {
                return None;
            }
            let stem = spool::stem(w, *n);
            let at = cap(&stem).map_or(f.read, |c| c.min(f.read));
            (at != f.committed).then(|| (format!("{KEY_PREFIX}{stem}"), Some(at)))
        }));
        out.into_iter().collect()
    }

    /// The checkpoint taken just before is durable: finished files are deleted now.
    pub fn committed(&mut self, checkpoint: &[(String, Option<u64>)]) {
        let forgotten: HashSet<&str> = checkpoint
            .iter()
            .filter(|(_, v)| v.is_none())
            .filter_map(|(k, _)| k.strip_prefix(KEY_PREFIX))
            .collect();
        self.forget.retain(|s| !forgotten.contains(s.as_str()));
        for (key, at) in checkpoint {
            let Some((stem, at)) = key.strip_prefix(KEY_PREFIX).zip(*at) else {
                continue;
            };
            if let Some(f) = parse_stem(stem).and_then(|k| self.files.get_mut(&k)) {
                f.committed = at;
            }
        }
        let done: Vec<(String, u64, bool)> = self
            .files
            .iter()
            .filter(|(_, f)| {
                f.finished() && f.committed == f.read && (f.sealed || self.is_stale(f))
            })
            .map(|((w, n), f)| (w.clone(), *n, f.sealed))
            .collect();
        for (writer, n, sealed) in done {
            if !self.all_done(&writer, n) {
                // Kept (finished: never read again) until the other readers are done with it.
                continue;
            }
            let path = self.path(&writer, n, sealed);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                // A "dead" writer sealed its file after all: keep the position, the next scan
                // finds the `.seg` and reads whatever it appended.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !sealed => continue,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cannot delete a consumed spool file");
                    continue;
                }
            }
            if !sealed {
                tracing::info!(path = %path.display(), "deleted a dead writer's spool file");
            }
            for reader in self.peers.iter().chain([&self.me]) {
                let _ = std::fs::remove_file(self.marker(&writer, n, reader));
            }
            self.files.remove(&(writer.clone(), n));
            self.forget.push(spool::stem(&writer, n));
        }
    }

    /// Reads every file again from its last committed position (what was read since is
    /// dropped by the caller).
    pub fn rewind(&mut self) {
        for f in self.files.values_mut() {
            f.read = f.committed;
        }
    }

    /// Bytes in the spool not yet read.
    pub fn pending_bytes(&self) -> u64 {
        self.files
            .values()
            .filter(|f| f.read != SKIP)
            .map(|f| f.len.saturating_sub(f.read))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::click::{EventId, Method};

    fn event(i: u64) -> ClickEvent<'static> {
        ClickEvent {
            id: EventId::new(7, i),
            at_ms: 1_764_504_000_000,
            code: "Ab3dE9x",
            domain: "",
            pop: "fra1",
            country: None,
            method: Method::Get,
            tls: false,
            prefetch: false,
            protocol: Default::default(),
            early: false,
            visitor: i,
            net: None,
            user_agent: "Mozilla/5.0",
            referrer_host: "",
        }
    }

    fn frame(out: &mut Vec<u8>, ids: std::ops::Range<u64>) {
        let mut payload = Vec::new();
        for i in ids.clone() {
            event(i).encode(&mut payload);
        }
        spool::encode_frame(out, &payload, ids.count() as u32);
    }

    #[derive(Debug, Default, PartialEq, Eq)]
    struct Seen {
        ids: Vec<u64>,
        invalid: u32,
        corrupt: u32,
        torn: u32,
    }

    fn drain(r: &mut SpoolReader, seen: &mut Seen) {
        loop {
            let p = r
                .poll(|i| match i {
                    Input::Event(e, _, _) => seen.ids.push(e.id.0 as u64),
                    Input::Revoked(_) => {}
                    Input::Invalid => seen.invalid += 1,
                    Input::Corrupt => seen.corrupt += 1,
                    Input::Torn => seen.torn += 1,
                })
                .unwrap();
            if p.consumed == 0 {
                break;
            }
        }
    }

    fn commit(r: &mut SpoolReader) -> Vec<(String, Option<u64>)> {
        let c = r.checkpoint();
        r.committed(&c);
        c
    }

    #[test]
    fn two_readers_delete_a_file_once_both_are_done() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = SEGMENT_MAGIC.to_vec();
        frame(&mut bytes, 0..3);
        let seg = dir.path().join("edge-a.0000000000.seg");
        std::fs::write(&seg, &bytes).unwrap();
        let stale = Duration::from_secs(600);
        let open = |me, peers| {
            SpoolReader::open(dir.path().to_owned(), stale, Vec::new())
                .unwrap()
                .shared_with(me, peers)
        };
        let mut rollups = open(ROLLUPS, &[ARCHIVE]);
        let mut archive = open(ARCHIVE, &[ROLLUPS]);
        let (mut a, mut b) = (Seen::default(), Seen::default());
        drain(&mut rollups, &mut a);
        commit(&mut rollups);
        commit(&mut rollups);
        assert!(seg.exists(), "kept for the archive consumer");
        assert!(dir.path().join(".edge-a.0000000000.rollups.done").exists());
        // Read once, never again.
        drain(&mut rollups, &mut a);
        assert_eq!(a.ids, vec![0, 1, 2]);
        drain(&mut archive, &mut b);
        commit(&mut archive);
        assert_eq!(b.ids, vec![0, 1, 2]);
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "file and markers gone: {left:?}");
        // The other reader lets it go without marking it again.
        for _ in 0..3 {
            drain(&mut rollups, &mut a);
            commit(&mut rollups);
        }
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert!(left.is_empty(), "no marker made again: {left:?}");
        assert!(rollups.checkpoint().is_empty(), "its position forgotten");
    }

    #[test]
    fn names() {
        let n = SegmentName::parse("edge-1_a.0000000042.open").unwrap();
        assert_eq!((n.writer.as_str(), n.n, n.sealed), ("edge-1_a", 42, false));
        assert_eq!(n.file_name(), "edge-1_a.0000000042.open");
        assert!(SegmentName::parse("w.0000000001.seg").unwrap().sealed);
        for bad in [
            "w.1.seg",
            "w.00000000001.seg",
            ".0000000001.seg",
            "w x.0000000001.seg",
            "w.0000000001.tmp",
            "notes.txt",
        ] {
            assert_eq!(SegmentName::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn incomplete_open_waits_then_completes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.0000000000.open");
        let mut bytes = SEGMENT_MAGIC.to_vec();
        frame(&mut bytes, 0..3);
        let mut second = Vec::new();
        frame(&mut second, 3..5);
        let cut = second.len() / 2;
        bytes.extend_from_slice(&second[..cut]);
        std::fs::write(&path, &bytes).unwrap();
        let mut r = SpoolReader::open(dir.path().into(), Duration::from_secs(600), vec![]).unwrap();
        let mut seen = Seen::default();
        drain(&mut r, &mut seen);
        assert_eq!(seen.ids, vec![0, 1, 2]);
        assert_eq!(r.pending_bytes(), cut as u64);
        // The writer finishes its append and seals the file.
        bytes.extend_from_slice(&second[cut..]);
        std::fs::write(&path, &bytes).unwrap();
        std::fs::rename(&path, dir.path().join("w.0000000000.seg")).unwrap();
        drain(&mut r, &mut seen);
        assert_eq!(
            seen,
            Seen {
                ids: vec![0, 1, 2, 3, 4],
                ..Seen::default()
            }
        );
        let c = commit(&mut r);
        assert_eq!(
            c,
            vec![("spool/w.0000000000".to_string(), Some(bytes.len() as u64))]
        );
        assert!(
            !dir.path().join("w.0000000000.seg").exists(),
            "consumed segment deleted"
        );
        // The next checkpoint forgets its position.
        assert_eq!(
            commit(&mut r),
            vec![("spool/w.0000000000".to_string(), None)]
        );
        assert!(commit(&mut r).is_empty());
    }

    #[test]
    fn torn_sealed_tail_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = SEGMENT_MAGIC.to_vec();
        frame(&mut bytes, 0..2);
        let mut second = Vec::new();
        frame(&mut second, 2..4);
        bytes.extend_from_slice(&second[..second.len() - 1]);
        std::fs::write(dir.path().join("w.0000000000.seg"), &bytes).unwrap();
        let mut r = SpoolReader::open(dir.path().into(), Duration::from_secs(600), vec![]).unwrap();
        let mut seen = Seen::default();
        drain(&mut r, &mut seen);
        assert_eq!(
            seen,
            Seen {
                ids: vec![0, 1],
                torn: 1,
                ..Seen::default()
            }
        );
        commit(&mut r);
        assert!(!dir.path().join("w.0000000000.seg").exists());
    }

    #[test]
    fn corrupt_invalid_and_foreign_files() {
        let dir = tempfile::tempdir().unwrap();
        // File 0: a good frame, a frame with a flipped byte, then a good frame (skipped).
        let mut bytes = SEGMENT_MAGIC.to_vec();
        frame(&mut bytes, 0..2);
        let flip = bytes.len() + FRAME_HEADER + 3;
        frame(&mut bytes, 2..4);
        bytes[flip] ^= 0xff;
        frame(&mut bytes, 4..6);
        std::fs::write(dir.path().join("w.0000000000.seg"), &bytes).unwrap();
        // File 1: a frame whose second event is garbage, then a good frame.
        let mut bytes = SEGMENT_MAGIC.to_vec();
        let mut payload = Vec::new();
        event(10).encode(&mut payload);
        payload.extend_from_slice(b"\x01garbage");
        event(11).encode(&mut payload);
        spool::encode_frame(&mut bytes, &payload, 3);
        frame(&mut bytes, 12..13);
        std::fs::write(dir.path().join("w.0000000001.seg"), &bytes).unwrap();
        // File 2: not a segment at all, under a segment name; and a foreign name.
        std::fs::write(dir.path().join("w.0000000002.seg"), b"hello, world").unwrap();
        std::fs::write(dir.path().join("README"), b"not mine").unwrap();
        let mut r = SpoolReader::open(dir.path().into(), Duration::from_secs(600), vec![]).unwrap();
        let mut seen = Seen::default();
        drain(&mut r, &mut seen);
        assert_eq!(
            seen,
            Seen {
                ids: vec![0, 1, 10, 12],
                invalid: 1,
                corrupt: 2,
                torn: 0
            }
        );
        commit(&mut r);
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["README".to_string()]);
    }

    #[test]
    fn resumes_from_stored_positions_and_forgets_orphans() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = SEGMENT_MAGIC.to_vec();
        frame(&mut bytes, 0..2);
        let resume_at = bytes.len() as u64;
        frame(&mut bytes, 2..4);
        std::fs::write(dir.path().join("w.0000000003.open"), &bytes).unwrap();
        let stored = vec![
            ("w.0000000003".to_string(), resume_at),
            ("w.0000000001".to_string(), 1234),
        ];
        let mut r = SpoolReader::open(dir.path().into(), Duration::from_secs(600), stored).unwrap();
        let mut seen = Seen::default();
        drain(&mut r, &mut seen);
        assert_eq!(seen.ids, vec![2, 3]);
        let c = commit(&mut r);
        assert!(c.contains(&("spool/w.0000000001".to_string(), None)));
        assert!(c.contains(&("spool/w.0000000003".to_string(), Some(bytes.len() as u64))));
        // An .open file is kept while its writer may be alive...
        assert!(dir.path().join("w.0000000003.open").exists());
        // ...and deleted once it is stale and fully read.
        let mut r = SpoolReader::open(
            dir.path().into(),
            Duration::ZERO,
            vec![("w.0000000003".to_string(), bytes.len() as u64)],
        )
        .unwrap();
        drain(&mut r, &mut Seen::default());
        commit(&mut r);
        assert!(!dir.path().join("w.0000000003.open").exists());
    }

    /// Renames `open` to `seg` the first time a scan stats `open`: after the listing named it,
    /// before its stat.
    fn racing_rename(
        open: PathBuf,
        seg: PathBuf,
    ) -> impl FnMut(&Path) -> std::io::Result<FileMeta> {
        let mut renamed = false;
        move |p: &Path| {
            if p == open && !renamed {
                renamed = true;
                std::fs::rename(&open, &seg).unwrap();
            }
            stat_file(p)
        }
    }

    fn no_key_twice(c: &[(String, Option<u64>)]) {
        let keys: HashSet<&str> = c.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            keys.len(),
            c.len(),
            "a key set and forgotten at once: {c:?}"
        );
    }

    #[test]
    fn seal_between_listing_and_stat_while_running() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("w.0000000000.open");
        let seg = dir.path().join("w.0000000000.seg");
        let mut bytes = SEGMENT_MAGIC.to_vec();
        frame(&mut bytes, 0..3);
        std::fs::write(&open, &bytes).unwrap();
        let mut r = SpoolReader::open(dir.path().into(), Duration::from_secs(600), vec![]).unwrap();
        let mut seen = Seen::default();
        drain(&mut r, &mut seen);
        let c = commit(&mut r);
        assert_eq!(
            c,
            vec![("spool/w.0000000000".to_string(), Some(bytes.len() as u64))]
        );
        // The writer appends a frame, then seals the file while a scan runs.
        frame(&mut bytes, 3..5);
        std::fs::write(&open, &bytes).unwrap();
        r.scan(&mut racing_rename(open.clone(), seg.clone()))
            .unwrap();
        assert!(seg.exists() && !open.exists());
        assert!(r.checkpoint().is_empty(), "{:?}", r.checkpoint());
        // A listing that misses the file altogether (both names) is not the file's end either.
        r.scan(&mut |_: &Path| -> std::io::Result<FileMeta> {
            Err(std::io::ErrorKind::NotFound.into())
        })
        .unwrap();
        assert!(r.checkpoint().is_empty(), "{:?}", r.checkpoint());
        drain(&mut r, &mut seen);
        assert_eq!(seen.ids, vec![0, 1, 2, 3, 4], "nothing read twice");
        let c = commit(&mut r);
        no_key_twice(&c);
        assert_eq!(
            c,
            vec![("spool/w.0000000000".to_string(), Some(bytes.len() as u64))]
        );
        assert!(!seg.exists(), "consumed and deleted");
        assert_eq!(
            commit(&mut r),
            vec![("spool/w.0000000000".to_string(), None)]
        );
    }

    #[test]
    fn seal_between_listing_and_stat_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("w.0000000000.open");
        let seg = dir.path().join("w.0000000000.seg");
        let mut bytes = SEGMENT_MAGIC.to_vec();
        frame(&mut bytes, 0..3);
        let stored_at = bytes.len() as u64;
        frame(&mut bytes, 3..5);
        std::fs::write(&open, &bytes).unwrap();
        // A restart with the first frame's progress stored; the writer seals during the first
        // scan.
        let mut r = SpoolReader::open_with(
            dir.path().into(),
            Duration::from_secs(600),
            vec![("w.0000000000".to_string(), stored_at)],
            &mut racing_rename(open.clone(), seg.clone()),
        )
        .unwrap();
        assert!(seg.exists());
        assert!(r.checkpoint().is_empty(), "{:?}", r.checkpoint());
        let mut seen = Seen::default();
        drain(&mut r, &mut seen);
        assert_eq!(seen.ids, vec![3, 4], "resumed from the stored position");
        let c = commit(&mut r);
        no_key_twice(&c);
        assert_eq!(
            c,
            vec![("spool/w.0000000000".to_string(), Some(bytes.len() as u64))]
        );
    }

    #[test]
    fn a_file_is_gone_after_two_missed_scans() {
        let dir = tempfile::tempdir().unwrap();
        let seg = dir.path().join("w.0000000000.seg");
        let mut bytes = SEGMENT_MAGIC.to_vec();
        frame(&mut bytes, 0..3);
        let half = bytes.len() as u64;
        frame(&mut bytes, 3..5);
        std::fs::write(&seg, &bytes).unwrap();
        let mut r = SpoolReader::open(
            dir.path().into(),
            Duration::from_secs(600),
            vec![("w.0000000000".to_string(), half)],
        )
        .unwrap();
        // An operator removes it before it is read.
        std::fs::remove_file(&seg).unwrap();
        r.scan(&mut stat_file).unwrap();
        assert!(r.checkpoint().is_empty());
        r.scan(&mut stat_file).unwrap();
        assert_eq!(
            r.checkpoint(),
            vec![("spool/w.0000000000".to_string(), None)]
        );
        // It comes back before that removal committed: it is tracked again (an operator's
        // restore is read from the start) and its key is not also sent for removal.
        std::fs::write(&seg, &bytes).unwrap();
        r.scan(&mut stat_file).unwrap();
        assert!(r.checkpoint().is_empty(), "{:?}", r.checkpoint());
    }
}
