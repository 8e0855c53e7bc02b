//! The raw-event archive as it was before Parquet (`objects.rs`, `columnar.rs`):
//! `archive/<YYYY-MM-DD>/<part:06>.ndjson.zst`, one line per event (`serde_json` of
//! [`ClickEvent::archived`]). Days written so stay readable ([`read_part`], by the recompute) and
//! convertible (`convert.rs`); [`ArchiveWriter`] still writes the form, for tools and tests.
//!
//! Each flush appends whole zstd frames to the day's current part and fsyncs; concatenated frames
//! are one valid zstd stream. A crash mid-append leaves a torn last frame, which [`read_day`]
//! skips. A writer never appends after a tear: every process start (and every failed write)
//! begins a new part, so a torn frame is always the last of its part. Parts roll at
//! [`PART_BYTES`]. The processor hands over events in their binary form (a copy of the bytes it
//! decoded); turning them into JSON lines and compressing runs on the archive's own thread
//! ([`ArchiveWriter`]), so the processor keeps parsing meanwhile.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread::JoinHandle;

use lasthop_core::click::{ClickEvent, Method, Net, Protocol};
use serde::{Serialize, Serializer};

use super::Day;

/// A part rolls once it is this large.
pub const PART_BYTES: u64 = 256 << 20;
/// Binary events the processor hands over at a time (about twice that as JSON lines, one zstd
/// frame).
pub const CHUNK_BYTES: usize = 2 << 20;
/// zstd level: fast enough to keep up with the processor on one core.
const LEVEL: i32 = 1;

/// Why the archive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ArchiveError {
    /// A file operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The compressor thread is gone.
    #[error("the archive thread stopped")]
    Stopped,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ArchiveError + '_ {
    move |source| ArchiveError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The directory of `day`'s parts.
pub fn day_dir(root: &Path, day: Day) -> PathBuf {
    root.join(day.to_string())
}

fn part_path(root: &Path, day: Day, part: u32) -> PathBuf {
    day_dir(root, day).join(format!("{part:06}.ndjson.zst"))
}

/// The days the archive under `root` holds, oldest first.
pub fn days(root: &Path) -> Result<Vec<Day>, ArchiveError> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io(root)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io(root))?;
        if let Some(day) = entry.file_name().to_str().and_then(Day::parse) {
            out.push(day);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The parts of a day, in order: (number, path).
pub fn parts(root: &Path, day: Day) -> Result<Vec<(u32, PathBuf)>, ArchiveError> {
    let dir = day_dir(root, day);
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io(&dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(io(&dir))?;
        let name = entry.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".ndjson.zst"))
            .filter(|n| n.len() == 6 && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        out.push((n, entry.path()));
    }
    out.sort();
    Ok(out)
}

/// Appends one archive line (and its `\n`) for `event`: byte for byte what
/// `serde_json::to_writer(out, &event.archived())` writes, without its allocations.
pub fn write_line(out: &mut Vec<u8>, event: &ClickEvent<'_>) {
    let mut id = [0u8; 32];
    let mut vis = [0u8; 16];
    // Both buffers are exactly twice the input length, the only failure hex reports.
    let _ = hex::encode_to_slice(event.id.0.to_be_bytes(), &mut id);
    let _ = hex::encode_to_slice(event.visitor.to_be_bytes(), &mut vis);
    let line = Line {
        v: event.version(),
        id: std::str::from_utf8(&id).unwrap_or_default(),
        t: event.at_ms,
        code: event.code,
        d: event.branded(),
        pop: event.pop,
        cc: event.country_str(),
        m: event.method,
        tls: event.tls,
        pf: event.prefetch,
        proto: event.protocol,
        early: event.early,
        vis: std::str::from_utf8(&vis).unwrap_or_default(),
        net: event.net.map(NetText),
        ua: event.user_agent,
        rh: event.referrer_host,
    };
    // Writing into a Vec cannot fail, and every field serialises.
    let _ = serde_json::to_writer(&mut *out, &line);
    out.push(b'\n');
}

/// [`lasthop_core::click::ArchivedClick`], borrowed. Field order and names must match it.
#[derive(Serialize)]
struct Line<'a> {
    v: u8,
    id: &'a str,
    t: u64,
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    d: Option<&'a str>,
    pop: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cc: Option<&'a str>,
    m: Method,
    tls: bool,
    #[serde(skip_serializing_if = "is_false")]
    pf: bool,
    #[serde(skip_serializing_if = "is_h1")]
    proto: Protocol,
    #[serde(skip_serializing_if = "is_false")]
    early: bool,
    vis: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    net: Option<NetText>,
    ua: &'a str,
    rh: &'a str,
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn is_h1(p: &Protocol) -> bool {
    *p == Protocol::H1
}

struct NetText(Net);

impl Serialize for NetText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

enum Msg {
    /// Events of one day in their binary form, back to back.
    Events(Day, Vec<u8>),
    Sync(mpsc::Sender<Result<(), ArchiveError>>),
    Prune {
        keep_days: u32,
        today: Day,
        reply: mpsc::Sender<Result<usize, ArchiveError>>,
    },
}

/// The archive's writer: compresses chunks on its own thread, writes and fsyncs on [`sync`].
///
/// [`sync`]: ArchiveWriter::sync
#[derive(Debug)]
pub struct ArchiveWriter {
    tx: Option<mpsc::SyncSender<Msg>>,
    thread: Option<JoinHandle<()>>,
}

impl ArchiveWriter {
    /// Starts the writer for the archive under `root`.
    pub fn start(root: PathBuf) -> Result<ArchiveWriter, ArchiveError> {
        std::fs::create_dir_all(&root).map_err(io(&root))?;
        // A few chunks in flight: enough to overlap parsing and compression, bounded memory.
        let (tx, rx) = mpsc::sync_channel(4);
        let thread = std::thread::Builder::new()
            .name("clicks-archive".into())
            .spawn(move || Compressor::new(root).run(rx))
            .map_err(io(Path::new("clicks-archive thread")))?;
        Ok(ArchiveWriter {
            tx: Some(tx),
            thread: Some(thread),
        })
    }

    /// Hands over events of `day`, encoded back to back ([`ClickEvent::encode`]); they become
    /// one zstd frame of JSON lines.
    pub fn append(&self, day: Day, events: Vec<u8>) -> Result<(), ArchiveError> {
        let tx = self.tx.as_ref().ok_or(ArchiveError::Stopped)?;
        tx.send(Msg::Events(day, events))
            .map_err(|_| ArchiveError::Stopped)
    }

    /// Writes everything handed over so far and fsyncs it. Any failure since the last sync
    /// (a chunk that could not be given a part, a write) fails it, and every later sync until
    /// the chunk is written: the caller must not commit what the archive does not hold.
    pub fn sync(&self) -> Result<(), ArchiveError> {
        let tx = self.tx.as_ref().ok_or(ArchiveError::Stopped)?;
        let (reply, answer) = mpsc::channel();
        tx.send(Msg::Sync(reply))
            .map_err(|_| ArchiveError::Stopped)?;
        answer.recv().map_err(|_| ArchiveError::Stopped)?
    }

    /// [`prune`], on the writer's thread so that no day with a part open (or data pending) is
    /// deleted under it.
    pub fn prune(&self, keep_days: u32, today: Day) -> Result<usize, ArchiveError> {
        let tx = self.tx.as_ref().ok_or(ArchiveError::Stopped)?;
        let (reply, answer) = mpsc::channel();
        tx.send(Msg::Prune {
            keep_days,
            today,
            reply,
        })
        .map_err(|_| ArchiveError::Stopped)?;
        answer.recv().map_err(|_| ArchiveError::Stopped)?
    }
}

impl Drop for ArchiveWriter {
    fn drop(&mut self) {
        self.tx = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The current part of a day.
struct Part {
    number: u32,
    /// Open while the day is written to (today and yesterday); closed after a clean fsync, so
    /// reopening appends to the same part.
    file: Option<File>,
    size: u64,
    /// Compressed frames not yet written.
    pending: Vec<u8>,
}

struct Compressor {
    root: PathBuf,
    days: HashMap<Day, Part>,
    /// Compressed chunks whose day had no part to go to (its directory unreadable): kept, and
    /// every sync fails until they are written.
    homeless: Vec<(Day, Vec<u8>)>,
}

impl Compressor {
    fn new(root: PathBuf) -> Compressor {
        Compressor {
            root,
            days: HashMap::new(),
            homeless: Vec::new(),
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let mut zstd = zstd::bulk::Compressor::new(LEVEL).ok();
        let mut lines = Vec::new();
        while let Ok(msg) = rx.recv() {
            match msg {
                Msg::Events(day, events) => {
                    lines.clear();
                    let mut rest = &events[..];
                    while !rest.is_empty() {
                        // The processor decoded these very bytes a moment ago.
                        let Ok((e, used)) = ClickEvent::decode(rest) else {
                            tracing::error!(%day, "undecodable event handed to the archive");
                            break;
                        };
                        write_line(&mut lines, &e);
                        rest = &rest[used..];
                    }
                    let frame = match zstd.as_mut().map(|z| z.compress(&lines)) {
                        Some(Ok(f)) => f,
                        // Out of memory in zstd's context, most likely: compress with a fresh
                        // one (and keep the lines either way).
                        _ => zstd::bulk::compress(&lines, LEVEL).unwrap_or_else(|e| {
                            tracing::error!(error = %e, "zstd failed; storing the chunk in a raw frame");
                            raw_frame(&lines)
                        }),
                    };
                    match self.part(day) {
                        Ok(p) => p.pending.extend_from_slice(&frame),
                        Err(e) => {
                            tracing::error!(error = %e, %day, "no archive part for a chunk; kept for the next sync");
                            self.homeless.push((day, frame));
                        }
                    }
                }
                Msg::Sync(reply) => {
                    let _ = reply.send(self.write_all(Day::today()));
                }
                Msg::Prune {
                    keep_days,
                    today,
                    reply,
                } => {
                    let _ = reply.send(self.prune(keep_days, today));
                }
            }
        }
        // Dropped without a final sync: the processor syncs before it stops, so this is an
        // abandoned run whose offsets were never committed either.
    }

    /// The day's current part, starting after any part an earlier run left.
    fn part(&mut self, day: Day) -> Result<&mut Part, ArchiveError> {
        if !self.days.contains_key(&day) {
            let next = parts(&self.root, day)?
                .last()
                .map_or(0, |(n, _)| n.saturating_add(1));
            self.days.insert(
                day,
                Part {
                    number: next,
                    file: None,
                    size: 0,
                    pending: Vec::new(),
                },
            );
        }
        self.days.get_mut(&day).ok_or(ArchiveError::Stopped) // inserted just above
    }

    /// Writes and fsyncs every pending chunk; then closes the parts of days before yesterday
    /// (`today` by the wall clock: late events for them are rare, and reopen the same part).
    fn write_all(&mut self, today: Day) -> Result<(), ArchiveError> {
        let mut first_err = None;
        for (day, frame) in std::mem::take(&mut self.homeless) {
            match self.part(day) {
                Ok(p) => p.pending.extend_from_slice(&frame),
                Err(e) => {
                    first_err.get_or_insert(e);
                    self.homeless.push((day, frame));
                }
            }
        }
        let root = self.root.clone();
        for (day, part) in self.days.iter_mut() {
            if part.pending.is_empty() {
                continue;
            }
            if let Err(e) = write_part(&root, *day, part) {
                tracing::error!(error = %e, %day, "archive write failed; retrying in a new part");
                // Never append after what may be a torn frame.
                part.file = None;
                part.number = part.number.saturating_add(1);
                part.size = 0;
                first_err.get_or_insert(e);
            }
        }
        // Days that are no longer written to hold no file open. The entry stays (it is small
        // and dropped by `prune`) so a late event appends to the same, cleanly closed, part.
        let yesterday = today.minus(1);
        for (day, part) in self.days.iter_mut() {
            if *day < yesterday && part.pending.is_empty() {
                part.file = None;
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// A day is busy while a part of it is open or it has data not yet written.
    fn busy(&self, day: Day) -> bool {
        self.days
            .get(&day)
            .is_some_and(|p| p.file.is_some() || !p.pending.is_empty())
            || self.homeless.iter().any(|(d, _)| *d == day)
    }

    fn prune(&mut self, keep_days: u32, today: Day) -> Result<usize, ArchiveError> {
        let removed = prune(&self.root, keep_days, today, |day| self.busy(day))?;
        let oldest_kept = today.minus(keep_days.saturating_sub(1));
        let busy: Vec<Day> = self
            .days
            .keys()
            .copied()
            .filter(|d| *d < oldest_kept && self.busy(*d))
            .collect();
        self.days
            .retain(|day, _| *day >= oldest_kept || busy.contains(day));
        Ok(removed)
    }
}

fn write_part(root: &Path, day: Day, part: &mut Part) -> Result<(), ArchiveError> {
    if part.file.is_some() && part.size >= PART_BYTES {
        part.file = None;
        part.number = part.number.saturating_add(1);
        part.size = 0;
    }
    if part.file.is_none() {
        let dir = day_dir(root, day);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let path = part_path(root, day, part.number);
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        part.size = file.metadata().map_err(io(&path))?.len();
        // A new file's directory entry must be durable too.
        File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(io(&dir))?;
        part.file = Some(file);
    }
    let path = part_path(root, day, part.number);
    let Some(file) = part.file.as_mut() else {
        return Err(ArchiveError::Stopped); // opened just above
    };
    file.write_all(&part.pending).map_err(io(&path))?;
    file.sync_data().map_err(io(&path))?;
    part.size += part.pending.len() as u64;
    part.pending.clear();
    Ok(())
}

/// A zstd frame that stores `data` uncompressed (raw blocks), for when compression fails.
fn raw_frame(data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() + 32);
    out.extend_from_slice(&0xFD2F_B528u32.to_le_bytes());
    // Frame header: single segment off, no checksum, no dictionary, no content size.
    out.push(0);
    // Window descriptor: 128 KiB windows hold any raw block (≤ 128 KiB).
    out.push(0x38);
    let mut chunks = data.chunks(128 * 1024).peekable();
    if chunks.peek().is_none() {
        out.extend_from_slice(&[1, 0, 0]); // an empty last raw block
    }
    while let Some(chunk) = chunks.next() {
        let last = u32::from(chunks.peek().is_none());
        let header = ((chunk.len() as u32) << 3) | last; // block type raw = 0
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        out.extend_from_slice(chunk);
    }
    out
}

/// What reading a day's archive met.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReadReport {
    /// Part files read.
    pub parts: u64,
    /// Whole frames decoded.
    pub frames: u64,
    /// Parts that ended in a torn or undecodable frame (the rest of the part is skipped).
    pub torn: u64,
}

/// Calls `line` with every line (without `\n`) of `day`'s archive, part by part, frame by frame.
pub fn read_day(
    root: &Path,
    day: Day,
    mut line: impl FnMut(&[u8]),
) -> Result<ReadReport, ArchiveError> {
    let mut report = ReadReport::default();
    for (_, path) in parts(root, day)? {
        let bytes = std::fs::read(&path).map_err(io(&path))?;
        read_part(&bytes, &path.display().to_string(), &mut report, &mut line);
    }
    Ok(report)
}

/// Calls `line` with every line of one part's bytes (`label` names it in the log), counting it,
/// its frames and a torn or undecodable end in `report`.
pub fn read_part(bytes: &[u8], label: &str, report: &mut ReadReport, line: &mut impl FnMut(&[u8])) {
    report.parts += 1;
    let mut rest = bytes;
    while !rest.is_empty() {
        let size = match zstd::zstd_safe::find_frame_compressed_size(rest) {
            Ok(n) if n > 0 && n <= rest.len() => n,
            _ => {
                tracing::warn!(path = %label, "torn frame at the end of an archive part");
                report.torn += 1;
                break;
            }
        };
        let plain = match zstd::stream::decode_all(&rest[..size]) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(path = %label, error = %e, "undecodable archive frame");
                report.torn += 1;
                break;
            }
        };
        report.frames += 1;
        for l in plain.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            line(l);
        }
        rest = &rest[size..];
    }
}

/// Deletes the day directories older than `keep_days` before `today`, except those `busy` says
/// are being written; returns how many.
pub fn prune(
    root: &Path,
    keep_days: u32,
    today: Day,
    busy: impl Fn(Day) -> bool,
) -> Result<usize, ArchiveError> {
    let oldest_kept = today.minus(keep_days.saturating_sub(1));
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io(root)(e)),
    };
    let mut removed = 0;
    for entry in entries {
        let entry = entry.map_err(io(root))?;
        let Some(day) = entry.file_name().to_str().and_then(Day::parse) else {
            continue;
        };
        if day < oldest_kept && busy(day) {
            tracing::info!(%day, "archive day past retention still being written; kept for now");
        } else if day < oldest_kept {
            let path = entry.path();
            std::fs::remove_dir_all(&path).map_err(io(&path))?;
            tracing::info!(%day, "archive day past retention deleted");
            removed += 1;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::click::{ArchivedClick, EventId};

    fn event(i: u64, ua: &str) -> ClickEvent<'_> {
        ClickEvent {
            id: EventId::new(0xabc, i),
            at_ms: 1_764_504_000_000 + i,
            code: "Ab3dE9x",
            domain: if i % 3 == 2 { "go.example.com" } else { "" },
            pop: "fra1",
            country: (i % 2 == 0).then_some(*b"DE"),
            method: if i % 3 == 0 {
                Method::Head
            } else {
                Method::Get
            },
            tls: i % 2 == 1,
            prefetch: i % 4 == 1,
            protocol: [Protocol::H1, Protocol::H2, Protocol::H3][(i % 3) as usize],
            early: i % 4 == 2,
            visitor: i.wrapping_mul(0x9e37_79b9_7f4a_7c15),
            net: match i % 3 {
                0 => None,
                1 => Some(Net::V4([203, 0, 113])),
                _ => Some(Net::V6([0x20, 0x01, 0x0d, 0xb8, 0, 1])),
            },
            user_agent: ua,
            referrer_host: if i % 2 == 0 { "" } else { "news.example.com" },
        }
    }

    #[test]
    fn lines_match_the_archived_form() {
        for i in 0..9 {
            let e = event(i, "Mozilla/5.0 \"quoted\" \\ é");
            let mut mine = Vec::new();
            write_line(&mut mine, &e);
            let mut theirs = serde_json::to_vec(&e.archived()).unwrap();
            theirs.push(b'\n');
            let line = String::from_utf8(mine).unwrap();
            assert_eq!(line, String::from_utf8(theirs).unwrap());
            // A branded domain's click says its domain, as version 2; it reads back.
            let branded = i % 3 == 2;
            assert_eq!(line.contains(r#""d":"go.example.com""#), branded, "{line}");
            assert_eq!(line.starts_with(r#"{"v":2,"#), branded, "{line}");
            let parsed: ArchivedClick = serde_json::from_str(&line).unwrap();
            assert_eq!(parsed.event().unwrap(), e);
        }
    }

    #[test]
    fn round_trip_with_a_torn_last_frame() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("archive");
        let day = Day(20_000);
        let writer = ArchiveWriter::start(root.clone()).unwrap();
        let mut want = Vec::new();
        for batch in 0..3u64 {
            let mut events = Vec::new();
            for i in 0..100 {
                let e = event(batch * 100 + i, "Mozilla/5.0");
                e.encode(&mut events);
                want.push(e.archived());
            }
            writer.append(day, events).unwrap();
            writer.sync().unwrap();
        }
        drop(writer);
        let read = |root: &Path| {
            let mut got = Vec::new();
            let report = read_day(root, day, |l| {
                got.push(serde_json::from_slice::<ArchivedClick>(l).unwrap())
            })
            .unwrap();
            (got, report)
        };
        let (got, report) = read(&root);
        assert_eq!(got, want);
        assert_eq!((report.parts, report.frames, report.torn), (1, 3, 0));

        // Tear the last frame: the first two come back whole, the tear is counted.
        let (_, path) = parts(&root, day).unwrap().pop().unwrap();
        let len = std::fs::metadata(&path).unwrap().len();
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 7).unwrap();
        let (got, report) = read(&root);
        assert_eq!(got, want[..200]);
        assert_eq!((report.frames, report.torn), (2, 1));

        // A new writer starts a new part, so later frames stay readable.
        let writer = ArchiveWriter::start(root.clone()).unwrap();
        let mut events = Vec::new();
        event(999, "curl/8").encode(&mut events);
        writer.append(day, events).unwrap();
        writer.sync().unwrap();
        drop(writer);
        let (got, report) = read(&root);
        assert_eq!(got.len(), 201);
        assert_eq!(got[200].ua, "curl/8");
        assert_eq!((report.parts, report.frames, report.torn), (2, 3, 1));
    }

    #[test]
    fn raw_frames_decode() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        assert_eq!(
            zstd::stream::decode_all(&raw_frame(&data)[..]).unwrap(),
            data
        );
        assert!(zstd::stream::decode_all(&raw_frame(&[])[..])
            .unwrap()
            .is_empty());
    }

    #[test]
    fn prunes_old_days() {
        let dir = tempfile::tempdir().unwrap();
        let today = Day::parse("2026-03-31").unwrap();
        for d in ["2026-03-31", "2026-01-01", "2025-12-31", "notes"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        assert_eq!(prune(dir.path(), 90, today, |_| false).unwrap(), 1);
        assert!(dir.path().join("2026-01-01").exists());
        assert!(!dir.path().join("2025-12-31").exists());
        assert!(dir.path().join("notes").exists());
    }

    #[test]
    fn a_chunk_without_a_part_fails_every_sync_until_written() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("archive");
        let day = Day(20_000);
        let writer = ArchiveWriter::start(root.clone()).unwrap();
        // The day's directory cannot be listed: a file sits where it should be.
        std::fs::write(day_dir(&root, day), b"in the way").unwrap();
        let mut events = Vec::new();
        event(1, "Mozilla/5.0").encode(&mut events);
        writer.append(day, events).unwrap();
        assert!(writer.sync().is_err(), "the lost chunk fails the sync");
        assert!(
            writer.sync().is_err(),
            "and the next one, until it is written"
        );
        std::fs::remove_file(day_dir(&root, day)).unwrap();
        writer.sync().unwrap();
        drop(writer);
        let mut lines = 0;
        read_day(&root, day, |_| lines += 1).unwrap();
        assert_eq!(lines, 1, "the chunk was kept, not dropped");
    }

    #[test]
    fn old_days_are_closed_and_busy_days_never_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let today = Day(20_010);
        let old = today.minus(5);
        let mut c = Compressor::new(root.clone());
        let frame = || zstd::bulk::compress(b"{}\n", LEVEL).unwrap();
        for day in [today, today.minus(1), old] {
            c.part(day).unwrap().pending.extend_from_slice(&frame());
        }
        c.write_all(today).unwrap();
        assert!(c.days[&today].file.is_some());
        assert!(c.days[&today.minus(1)].file.is_some());
        assert!(c.days[&old].file.is_none(), "closed after the sync");
        // A late event for the old day reopens the same, cleanly closed, part.
        c.part(old).unwrap().pending.extend_from_slice(&frame());
        c.write_all(today).unwrap();
        assert_eq!(parts(&root, old).unwrap().len(), 1);
        let mut lines = 0;
        read_day(&root, old, |_| lines += 1).unwrap();
        assert_eq!(lines, 2);
        // Keeping one day: yesterday's part is still open, so it stays; the old day goes.
        assert_eq!(c.prune(1, today).unwrap(), 1);
        assert!(day_dir(&root, today.minus(1)).exists());
        assert!(!day_dir(&root, old).exists());
        assert!(!c.days.contains_key(&old));
        // Two days on, both parts are closed and both days go.
        let later = today.next().next();
        c.write_all(later).unwrap();
        assert_eq!(c.prune(1, later).unwrap(), 2);
        assert!(!day_dir(&root, today.minus(1)).exists());
        assert!(!day_dir(&root, today).exists());
    }
}
