//! The spool sink: click batches appended to local segment files, the default that needs no
//! server. The control plane's processor reads the same directory (`core/EVENTS.md`, "The spool").
//!
//! One writer per engine process, named `<engine-id>-<nonce>`: it appends whole frames to
//! `<writer>.<n:010>.open` with one `write` each, `fdatasync`s once per flush round, and seals a
//! segment by renaming it to `.seg` when it reaches its size or age limit. A reader never sees a
//! frame half-written as valid (the length comes first; the checksum covers the payload).
//!
//! The directory is bounded: past `max_dir_bytes` (the processor has fallen behind, or none
//! runs) batches are dropped and counted rather than filling the disk.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use lasthop_core::click::spool::{encode_frame, SegmentName, SEGMENT_MAGIC};

use crate::clicks::{Sink, SinkStats};

/// Limits of one writer.
#[derive(Debug, Clone)]
pub struct SpoolConfig {
    /// The spool directory (created if missing).
    pub dir: PathBuf,
    /// Seal a segment at this size.
    pub max_segment_bytes: u64,
    /// Seal a segment this old (so the processor can delete what it consumed).
    pub max_segment_age: Duration,
    /// Drop batches while the directory holds more than this.
    pub max_dir_bytes: u64,
}

/// The writer's open segment.
#[derive(Debug)]
struct Segment {
    file: File,
    path: PathBuf,
    len: u64,
    opened: Instant,
    dirty: bool,
}

/// Appends click batches to spool segments.
#[derive(Debug)]
pub struct SpoolWriter {
    cfg: SpoolConfig,
    writer: String,
    next: u64,
    open: Option<Segment>,
    frame: Vec<u8>,
    dir_bytes: u64,
    dir_checked: Option<Instant>,
    full_logged: bool,
    /// Writes are failing (logged once per streak).
    failing: bool,
}

/// How often the directory's size is re-read.
const DIR_CHECK: Duration = Duration::from_secs(1);

impl SpoolWriter {
    /// A writer for engine `engine_id` (any characters; kept to `[A-Za-z0-9_-]` in file names).
    /// The directory is created on first write: a spool that cannot be written (permissions, a
    /// full disk) costs clicks, counted, never the engine's start or a redirect.
    pub fn new(cfg: SpoolConfig, engine_id: &str) -> std::io::Result<SpoolWriter> {
        let mut nonce = [0u8; 8];
        getrandom::getrandom(&mut nonce).map_err(|e| std::io::Error::other(e.to_string()))?;
        let id: String = engine_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        Ok(SpoolWriter {
            cfg,
            writer: format!("{id}-{}", hex::encode(nonce)),
            next: 0,
            open: None,
            frame: Vec::new(),
            dir_bytes: 0,
            dir_checked: None,
            full_logged: false,
            failing: false,
        })
    }

    /// This writer's name (the prefix of its segment files).
    pub fn name(&self) -> &str {
        &self.writer
    }

    fn segment_path(&self, n: u64, sealed: bool) -> PathBuf {
        let name = SegmentName {
            writer: self.writer.clone(),
            n,
            sealed,
        };
        self.cfg.dir.join(name.file_name())
    }

    fn ensure_open(&mut self) -> std::io::Result<&mut Segment> {
        if self.open.is_none() {
            std::fs::create_dir_all(&self.cfg.dir)?;
            let path = self.segment_path(self.next, false);
            self.next += 1;
            let mut file = OpenOptions::new()
                .create_new(true)
                .append(true)
                .open(&path)?;
            file.write_all(SEGMENT_MAGIC)?;
            self.open = Some(Segment {
                file,
                path,
                len: SEGMENT_MAGIC.len() as u64,
                opened: Instant::now(),
                dirty: true,
            });
        }
        self.open
            .as_mut()
            .ok_or_else(|| std::io::Error::other("segment vanished"))
    }

    /// Makes the open segment durable and renames it `.seg` (sealed).
    fn seal(&mut self) -> std::io::Result<()> {
        let Some(seg) = self.open.take() else {
            return Ok(());
        };
        seg.file.sync_data()?;
        let sealed = seg.path.with_extension("seg");
        std::fs::rename(&seg.path, &sealed)?;
        Ok(())
    }

    fn over_budget(&mut self) -> bool {
        if self.dir_checked.is_none_or(|at| at.elapsed() >= DIR_CHECK) {
            self.dir_bytes = dir_size(&self.cfg.dir);
            self.dir_checked = Some(Instant::now());
        }
        self.dir_bytes > self.cfg.max_dir_bytes
    }
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

impl Sink for SpoolWriter {
    fn send(&mut self, events: &[u8], count: u32, stats: &SinkStats) {
        if self.over_budget() {
            if !self.full_logged {
                tracing::warn!(
                    dir = %self.cfg.dir.display(),
                    bytes = self.dir_bytes,
                    "click spool full (is the processor running?); dropping click events"
                );
                self.full_logged = true;
            }
            stats.failed(u64::from(count));
            return;
        }
        self.full_logged = false;
        self.frame.clear();
        encode_frame(&mut self.frame, events, count);
        let frame = std::mem::take(&mut self.frame);
        let result = self.ensure_open().and_then(|seg| {
            seg.file.write_all(&frame)?;
            seg.len += frame.len() as u64;
            seg.dirty = true;
            Ok(())
        });
        self.dir_bytes += frame.len() as u64;
        self.frame = frame;
        match result {
            Ok(()) => {
                if self.failing {
                    tracing::info!(dir = %self.cfg.dir.display(), "click spool writable again");
                    self.failing = false;
                }
                stats.sent(u64::from(count))
            }
            Err(e) => {
                if !self.failing {
                    tracing::error!(dir = %self.cfg.dir.display(), error = %e,
                        "click spool write failed; dropping click events until it works");
                    self.failing = true;
                }
                stats.failed(u64::from(count));
                // Start a fresh segment next time: this one may end in a torn frame.
                self.open = None;
            }
        }
    }

    fn tick(&mut self, stats: &SinkStats) {
        let Some(seg) = self.open.as_mut() else {
            return;
        };
        if seg.dirty {
            if let Err(e) = seg.file.sync_data() {
                tracing::warn!(error = %e, "click spool fsync failed");
                stats.failed(0);
            }
            seg.dirty = false;
        }
        if seg.len >= self.cfg.max_segment_bytes || seg.opened.elapsed() >= self.cfg.max_segment_age
        {
            if let Err(e) = self.seal() {
                tracing::warn!(error = %e, "sealing a click spool segment failed");
                stats.failed(0);
            }
        }
    }

    fn close(&mut self, _stats: &SinkStats) {
        if let Err(e) = self.seal() {
            tracing::warn!(error = %e, "sealing the last click spool segment failed");
        }
    }

    fn kind(&self) -> &'static str {
        "spool"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::click::spool::{next_frame, segment_body, Next};

    #[test]
    fn writes_frames_seals_and_respects_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = SpoolConfig {
            dir: dir.path().join("spool"),
            max_segment_bytes: 64,
            max_segment_age: Duration::from_secs(3600),
            max_dir_bytes: 1 << 20,
        };
        let stats = SinkStats::default();
        let mut w = SpoolWriter::new(cfg.clone(), "host:8080").unwrap();
        assert!(w.name().starts_with("host_8080-"));
        w.send(b"payload-one", 1, &stats);
        w.tick(&stats); // 8 + 12 + 11 = 31 bytes: stays open
        let open: Vec<_> = std::fs::read_dir(&cfg.dir).unwrap().collect();
        assert_eq!(open.len(), 1);
        w.send(&[b'x'; 40], 2, &stats);
        w.tick(&stats); // over 64: sealed
        let sealed = cfg.dir.join(
            SegmentName {
                writer: w.name().to_owned(),
                n: 0,
                sealed: true,
            }
            .file_name(),
        );
        let bytes = std::fs::read(&sealed).unwrap();
        let body = segment_body(&bytes).unwrap();
        let Next::Frame {
            payload,
            count,
            len,
        } = next_frame(body).unwrap()
        else {
            panic!("frame")
        };
        assert_eq!((payload, count), (&b"payload-one"[..], 1));
        assert!(matches!(
            next_frame(&body[len..]).unwrap(),
            Next::Frame { count: 2, .. }
        ));
        assert_eq!(stats.sent.load(std::sync::atomic::Ordering::Relaxed), 3);

        let mut tight = SpoolWriter::new(
            SpoolConfig {
                max_dir_bytes: 10,
                ..cfg
            },
            "e",
        )
        .unwrap();
        tight.send(b"dropped", 5, &stats);
        assert_eq!(stats.dropped.load(std::sync::atomic::Ordering::Relaxed), 5);
    }
}
