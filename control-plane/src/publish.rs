//! Snapshot publishing (control-plane/FEED.md, "Snapshot publishing"): the `serve` process keeps
//! `DATA_DIR/snapshots/<id>.snap` files that engines download, and tells the feed about each new
//! one.
//!
//! A build ([`crate::snapshot::build_snapshot`]) writes a hidden file under a temporary name,
//! the writer fsyncs and renames it, and then the file is hashed and renamed once more to its id,
//! `snapshot_id(seq, sha256)`, so a `<id>.snap` file is always complete and immutable: a
//! download that started before a later rename or garbage collection keeps reading the same
//! bytes (an open file outlives its name). Builds run on the blocking pool, one at a time; the
//! store reads they do never block its writer, so the API keeps answering while one runs.
//!
//! When: at start if there is no snapshot or the newest is behind the change log; every
//! `interval` if anything changed since the last one; as soon as more than `max_overlay` changes
//! accumulated (each engine holds those in memory); and on demand
//! (`POST /v1/admin/snapshots`). After each publication, garbage collection keeps the newest two
//! and every snapshot an engine reported in the last ten minutes, and deletes the rest.

use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use lasthop_core::feed::{snapshot_id, valid_snapshot_id, SnapshotFrame, SNAPSHOT_PATH};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::clock::now_ms;
use crate::fleet::Fleet;
use crate::store::Store;

/// Snapshots kept whatever engines report.
const KEEP_NEWEST: usize = 2;
/// After a failed build, scheduled builds wait this long before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// The snapshot file suffix.
const SUFFIX: &str = ".snap";

/// Publishing settings.
#[derive(Debug, Clone)]
pub struct PublishConfig {
    /// `DATA_DIR/snapshots`.
    pub dir: PathBuf,
    /// Written into each snapshot's header: the permutation key's id, the region count and the
    /// high-water reserve.
    pub key_id: u32,
    pub regions: u32,
    pub reserve: u64,
    /// Publish at least this often when there were changes.
    pub interval: Duration,
    /// Publish as soon as more changes than this accumulated since the last snapshot.
    pub max_overlay: u64,
}

/// The publisher: builds, announces and collects snapshots.
pub struct Publisher {
    store: Arc<dyn Store>,
    fleet: Arc<Fleet>,
    config: PublishConfig,
    latest: watch::Sender<Option<SnapshotFrame>>,
    /// One build at a time.
    building: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// A snapshot file found in the directory.
#[derive(Debug, Clone)]
struct OnDisk {
    id: String,
    seq: u64,
    modified: SystemTime,
    path: PathBuf,
}

impl Publisher {
    /// A publisher over `config.dir` (created if missing; leftovers of interrupted builds are
    /// removed). Call [`Publisher::start`] to load the newest snapshot and begin the schedule.
    pub fn new(
        store: Arc<dyn Store>,
        fleet: Arc<Fleet>,
        config: PublishConfig,
    ) -> anyhow::Result<Arc<Publisher>> {
        std::fs::create_dir_all(&config.dir)
            .with_context(|| format!("creating {}", config.dir.display()))?;
        for entry in std::fs::read_dir(&config.dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_string_lossy().starts_with('.') {
                // Only this process writes here (the store file has one owner at a time).
                let _ = std::fs::remove_file(entry.path());
            }
        }
        let (latest, _) = watch::channel(None);
        Ok(Arc::new(Publisher {
            store,
            fleet,
            config,
            latest,
            building: tokio::sync::Mutex::new(()),
        }))
    }

    /// The newest published snapshot.
    pub fn latest(&self) -> Option<SnapshotFrame> {
        self.latest.borrow().clone()
    }

    /// The newest published snapshot, now and as it changes.
    pub fn subscribe(&self) -> watch::Receiver<Option<SnapshotFrame>> {
        self.latest.subscribe()
    }

    /// Where the snapshot `id` would be; `None` for a string that is not a snapshot id.
    pub fn path_of(&self, id: &str) -> Option<PathBuf> {
        valid_snapshot_id(id).then(|| self.config.dir.join(format!("{id}{SUFFIX}")))
    }

    /// Builds and publishes a snapshot now (waiting for a build in progress first).
    pub async fn publish(self: &Arc<Self>) -> anyhow::Result<SnapshotFrame> {
        let _one_at_a_time = self.building.lock().await;
        let this = Arc::clone(self);
        let frame = tokio::task::spawn_blocking(move || this.build())
            .await
            .context("snapshot build task")??;
        self.latest.send_replace(Some(frame.clone()));
        let this = Arc::clone(self);
        match tokio::task::spawn_blocking(move || this.collect_garbage()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %format!("{e:#}"), "snapshot garbage collection"),
            Err(e) => tracing::warn!(error = %e, "snapshot garbage collection task"),
        }
        Ok(frame)
    }

    /// Loads the newest snapshot on disk, publishes one at once if there is none or it is
    /// behind the change log, then keeps to the schedule until `stop` turns true.
    pub async fn start(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let this = Arc::clone(&self);
        match tokio::task::spawn_blocking(move || this.load_newest()).await {
            Ok(Ok(Some(frame))) => {
                tracing::info!(id = %frame.id, seq = frame.seq, "newest snapshot on disk");
                self.latest.send_replace(Some(frame));
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %format!("{e:#}"), "reading the snapshot directory")
            }
            Err(e) => tracing::warn!(error = %e, "reading the snapshot directory"),
        }
        let mut commits = self.store.commits();
        let mut retry_at = tokio::time::Instant::now();
        if self.due(*commits.borrow_and_update(), 0) {
            self.publish_logged("start", &mut retry_at).await;
        }
        let mut tick = tokio::time::interval(self.config.interval.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
                _ = tick.tick() => {
                    if self.due(*commits.borrow(), 0) {
                        self.publish_logged("interval", &mut retry_at).await;
                    }
                }
                alive = commits.changed() => {
                    if alive.is_err() {
                        return;
                    }
                    let last = *commits.borrow_and_update();
                    if self.due(last, self.config.max_overlay)
                        && tokio::time::Instant::now() >= retry_at
                    {
                        self.publish_logged("overlay", &mut retry_at).await;
                    }
                }
            }
        }
    }

    /// Whether more than `threshold` changes were committed since the newest snapshot (always,
    /// when there is none).
    fn due(&self, last_seq: u64, threshold: u64) -> bool {
        match self.latest.borrow().as_ref() {
            Some(s) => last_seq.saturating_sub(s.seq) > threshold,
            None => true,
        }
    }

    async fn publish_logged(self: &Arc<Self>, why: &str, retry_at: &mut tokio::time::Instant) {
        match self.publish().await {
            Ok(f) => {
                tracing::info!(why, id = %f.id, seq = f.seq, size = f.size, "published a snapshot")
            }
            Err(e) => {
                *retry_at = tokio::time::Instant::now() + RETRY_AFTER;
                tracing::error!(why, error = %format!("{e:#}"), "snapshot build failed");
            }
        }
    }

    /// Builds, hashes and names one snapshot (blocking).
    fn build(&self) -> anyhow::Result<SnapshotFrame> {
        let temp = self
            .config
            .dir
            .join(format!(".building-{}{SUFFIX}", std::process::id()));
        let result = (|| {
            let (seq, _info) = crate::snapshot::build_snapshot(
                &*self.store,
                self.config.key_id,
                self.config.regions,
                self.config.reserve,
                &temp,
            )?;
            let (sha256, size) = sha256_file(&temp)?;
            let id = snapshot_id(seq, &sha256);
            let path = self.config.dir.join(format!("{id}{SUFFIX}"));
            std::fs::rename(&temp, &path)
                .with_context(|| format!("renaming the snapshot to {}", path.display()))?;
            std::fs::File::open(&self.config.dir)?.sync_all()?;
            anyhow::Ok(SnapshotFrame {
                url: format!("{SNAPSHOT_PATH}{id}"),
                id,
                seq,
                size,
                sha256,
            })
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result
    }

    /// The newest intact snapshot on disk (blocking). One whose hash no longer matches its
    /// name is deleted.
    fn load_newest(&self) -> anyhow::Result<Option<SnapshotFrame>> {
        for file in list(&self.config.dir)? {
            let (sha256, size) = sha256_file(&file.path)?;
            if snapshot_id(file.seq, &sha256) == file.id {
                return Ok(Some(SnapshotFrame {
                    url: format!("{SNAPSHOT_PATH}{}", file.id),
                    id: file.id,
                    seq: file.seq,
                    size,
                    sha256,
                }));
            }
            tracing::warn!(path = %file.path.display(), "snapshot does not match its name; deleting it");
            std::fs::remove_file(&file.path)?;
        }
        Ok(None)
    }

    /// Keeps the newest [`KEEP_NEWEST`] and every snapshot in use; deletes the rest (blocking).
    fn collect_garbage(&self) -> anyhow::Result<()> {
        let in_use = self.fleet.snapshots_in_use(now_ms());
        let latest = self.latest().map(|s| s.id);
        for file in list(&self.config.dir)?.into_iter().skip(KEEP_NEWEST) {
            if in_use.contains(&file.id) || latest.as_ref() == Some(&file.id) {
                continue;
            }
            match std::fs::remove_file(&file.path) {
                Ok(()) => tracing::info!(id = %file.id, "deleted an old snapshot"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(e).with_context(|| format!("deleting {}", file.path.display()))
                }
            }
        }
        Ok(())
    }
}

/// Every `<id>.snap` in `dir`, newest first (by sequence, then modification time).
fn list(dir: &Path) -> anyhow::Result<Vec<OnDisk>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(id) = name.to_str().and_then(|n| n.strip_suffix(SUFFIX)) else {
            continue;
        };
        let Some(seq) = sequence_of(id) else {
            continue;
        };
        let modified = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        out.push(OnDisk {
            id: id.to_string(),
            seq,
            modified,
            path: entry.path(),
        });
    }
    out.sort_by_key(|f| std::cmp::Reverse((f.seq, f.modified)));
    Ok(out)
}

/// The sequence in an id `<16 hex digits>-<8 hex digits>`; `None` for anything else.
fn sequence_of(id: &str) -> Option<u64> {
    let (seq, short) = id.split_once('-')?;
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    };
    if !(hex(seq, 16) && hex(short, 8)) {
        return None;
    }
    u64::from_str_radix(seq, 16).ok()
}

/// SHA-256 (lowercase hex) and length of a file, read in 1 MiB blocks.
fn sha256_file(path: &Path) -> anyhow::Result<(String, u64)> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        len += n as u64;
    }
    Ok((hex::encode(hasher.finalize()), len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_parse_strictly() {
        assert_eq!(sequence_of("0000000000001236-5d1f0c2a"), Some(0x1236));
        assert_eq!(sequence_of("0000000000001236-5d1f0c2"), None);
        assert_eq!(sequence_of("000000000000123g-5d1f0c2a"), None);
        assert_eq!(sequence_of("0000000000001236"), None);
        assert_eq!(sequence_of("../00000000001236-5d1f0c2a"), None);
    }

    #[test]
    fn listing_is_newest_first_and_skips_strangers() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "0000000000000001-aaaaaaaa.snap",
            "0000000000000010-bbbbbbbb.snap",
            "0000000000000002-cccccccc.snap",
            "notes.txt",
            ".building-1.snap",
        ] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let ids: Vec<String> = list(dir.path())
            .unwrap()
            .into_iter()
            .map(|f| f.id)
            .collect();
        assert_eq!(
            ids,
            [
                "0000000000000010-bbbbbbbb",
                "0000000000000002-cccccccc",
                "0000000000000001-aaaaaaaa"
            ]
        );
        let (sha, len) = sha256_file(&dir.path().join("notes.txt")).unwrap();
        assert_eq!(len, 1);
        assert_eq!(sha, hex::encode(Sha256::digest(b"x")));
    }
}
