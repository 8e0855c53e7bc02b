//! Snapshot publishing (core/FEED.md, "Snapshot publishing"): the `serve` process keeps
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
//!
//! With several control planes on one shared store ([`crate::store::Shared`]) one publishes at
//! a time: a build runs under the `snapshots` leader lock (a PostgreSQL advisory lock), after
//! the publisher has caught up with what the store already has, so a schedule that fires on
//! every control plane at once still makes one snapshot. The bytes go into the store; every
//! other control plane hears of it (`NOTIFY`), copies the file into its own directory, checks
//! its hash and announces it on its feed, so an engine downloads from whichever control plane
//! it talks to (one missing locally is fetched from the store on its first request). The
//! publisher under the lock collects the store's garbage; each control plane prunes its copies
//! of what the store no longer has.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use lasthop_core::feed::SnapshotDigest;
use lasthop_core::feed::{snapshot_id, valid_snapshot_id, SnapshotFrame, SNAPSHOT_PATH};
use tokio::sync::watch;

use crate::clicks::day::Day;
use crate::clicks::store::RollupStore;
use crate::clock::now_ms;
use crate::error_chain::ErrorChain;
use crate::fleet::Fleet;
use crate::reply::{offload, TaskFailed};
use crate::signing::SigningKey;
use crate::snapshot::SnapshotBuildError;
use crate::snapshot::{HotSet, POPULAR_DAYS};
use crate::store::{Lead, News, Shared, Store, StoreError};

/// Snapshots kept whatever engines report.
const KEEP_NEWEST: usize = 2;
/// After a failed build, scheduled builds wait this long before trying again.
const RETRY_AFTER: Duration = Duration::from_secs(10);
/// The snapshot file suffix.
const SUFFIX: &str = ".snap";
/// The zstd copy of a snapshot beside it: `<id>.snap.zst`.
const ZSTD_SUFFIX: &str = ".snap.zst";
/// zstd level of the copies engines download: level 3 compresses ~110 B/link snapshots to about
/// half at a few hundred MB/s, once per snapshot.
const ZSTD_LEVEL: i32 = 3;
/// The shared store's leader lock for publishing.
const LOCK: &str = "snapshots";
/// How long an on-demand publish waits for another control plane's build.
const LEAD_WAIT: Duration = Duration::from_secs(120);
/// How often a control plane on a shared store checks for news of snapshots (the news itself
/// comes by `NOTIFY`; this is how soon it is acted on).
const NEWS_POLL: Duration = Duration::from_millis(200);

/// Why a snapshot could not be published, copied, loaded or collected.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// A file or directory operation failed: `op` is what was being done to `path`
    /// (`creating`, `listing`, `opening`, `reading`, `renaming the snapshot to`, `deleting`).
    #[error("{op} {}", path.display())]
    File {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// An operation on the snapshot directory that names no path failed: reading it at start,
    /// reading an entry, its fsync, deleting a snapshot that does not match its name.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Building the snapshot failed.
    #[error(transparent)]
    Build(#[from] SnapshotBuildError),
    /// The shared store failed at `op` (`storing the snapshot`, `listing stored snapshots`,
    /// `the snapshot lock`).
    #[error("{op}: {cause}")]
    Store { op: &'static str, cause: StoreError },
    /// The shared store failed at `op` (`fetching`, `dropping`) on snapshot `id`.
    #[error("{op} snapshot {id}: {cause}")]
    Stored {
        op: &'static str,
        id: String,
        cause: StoreError,
    },
    /// The shared store no longer has the snapshot being copied.
    #[error("snapshot {id} is no longer in the store")]
    NoLongerStored { id: String },
    /// The copy of a stored snapshot does not have the hash and length its frame announces.
    #[error("snapshot {id} from the store does not match its frame")]
    Mismatch { id: String },
    /// An on-demand publish waited two minutes for another control plane's build in vain.
    #[error("another control plane held the snapshot lock too long")]
    LockHeld,
    /// A task on the blocking pool panicked or was cancelled: `what` names it.
    #[error("{what}")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

impl PublishError {
    fn file<'a>(
        op: &'static str,
        path: &'a Path,
    ) -> impl FnOnce(std::io::Error) -> PublishError + 'a {
        move |source| PublishError::File {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    fn task(what: &'static str) -> impl FnOnce(TaskFailed) -> PublishError {
        move |failed| PublishError::Task {
            what,
            source: failed.source,
        }
    }

    fn store(op: &'static str) -> impl FnOnce(StoreError) -> PublishError {
        move |cause| PublishError::Store { op, cause }
    }

    fn stored<'a>(op: &'static str, id: &'a str) -> impl FnOnce(StoreError) -> PublishError + 'a {
        move |cause| PublishError::Stored {
            op,
            id: id.to_string(),
            cause,
        }
    }
}

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
    /// Signs every snapshot frame announced (`--snapshot-signing-key`).
    pub signing: Option<Arc<SigningKey>>,
    /// What a snapshot holds (`--snapshot-max-links`, `--snapshot-max-bytes`,
    /// `--snapshot-recent-days`).
    pub hot: HotSet,
}

/// The publisher: builds, announces and collects snapshots.
pub struct Publisher {
    store: Arc<dyn Store>,
    /// The store several control planes share, if they do.
    shared: Option<Arc<dyn Shared>>,
    fleet: Arc<Fleet>,
    config: PublishConfig,
    latest: watch::Sender<Option<SnapshotFrame>>,
    /// One build at a time.
    building: tokio::sync::Mutex<()>,
    /// One copy from the store at a time, so a download and a catch-up that want the same
    /// snapshot never write one temporary file together (the second finds the copy made).
    fetching: std::sync::Mutex<()>,
    /// The click rollups, where popular links come from (the click processor's, where this
    /// server runs one).
    rollups: Option<Arc<RollupStore>>,
    /// One zstd copy made at a time, through one compression context kept for them all: a
    /// fresh context a publish is ~3.7 MiB allocated and freed each time, on whichever blocking
    /// thread runs it, and the allocator keeps such peaks in every arena it has used.
    compressing: std::sync::Mutex<Option<zstd::zstd_safe::CCtx<'static>>>,
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
    /// removed). Popular links come from `rollups`, where there are some. Call
    /// [`Publisher::start`] to load the newest snapshot and begin the schedule.
    pub fn new(
        store: Arc<dyn Store>,
        fleet: Arc<Fleet>,
        config: PublishConfig,
        rollups: Option<Arc<RollupStore>>,
    ) -> Result<Arc<Publisher>, PublishError> {
        std::fs::create_dir_all(&config.dir)
            .map_err(PublishError::file("creating", &config.dir))?;
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
            shared: Arc::clone(&store).shared(),
            store,
            fleet,
            config,
            latest,
            building: tokio::sync::Mutex::new(()),
            fetching: std::sync::Mutex::new(()),
            rollups,
            compressing: std::sync::Mutex::new(None),
        }))
    }

    /// The codes with the most human clicks over the last [`POPULAR_DAYS`] days, most first, as
    /// many as the budget could hold; none without rollups (or when they cannot be read: the
    /// snapshot then holds the recent links alone, and says so in the log).
    fn popular(&self, hot: &HotSet) -> Vec<(String, u64)> {
        let Some(rollups) = &self.rollups else {
            return Vec::new();
        };
        let today = Day::today();
        let n = usize::try_from(hot.max_links).unwrap_or(usize::MAX);
        match rollups.top_codes(today.minus(POPULAR_DAYS - 1), today, n) {
            Ok(top) => top,
            Err(e) => {
                tracing::warn!(error = %e, "reading the click rollups for popular links; building with the recent ones alone");
                Vec::new()
            }
        }
    }

    /// Makes `frame` the newest snapshot, signed when there is a signing key; returns it as
    /// announced.
    fn announce(&self, frame: SnapshotFrame) -> SnapshotFrame {
        let frame = match &self.config.signing {
            Some(key) => key.sign(frame),
            None => frame,
        };
        self.latest.send_replace(Some(frame.clone()));
        frame
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
        valid_snapshot_id(id).then(|| self.snap_path(id))
    }

    /// Builds and publishes a snapshot now (waiting for a build in progress first, here or on
    /// another control plane of the store).
    pub async fn publish(self: &Arc<Self>) -> Result<SnapshotFrame, PublishError> {
        self.publish_if(None).await?.ok_or(PublishError::LockHeld)
    }

    /// Publishes unless the newest snapshot (here or in the shared store) is within
    /// `threshold` changes of the log; `None` publishes whatever. Returns what is newest now,
    /// or `None` when another control plane is publishing (a scheduled build then skips).
    async fn publish_if(
        self: &Arc<Self>,
        threshold: Option<u64>,
    ) -> Result<Option<SnapshotFrame>, PublishError> {
        let _one_at_a_time = self.building.lock().await;
        let lead = match &self.shared {
            None => None,
            Some(shared) => {
                let shared = Arc::clone(shared);
                let wait = if threshold.is_none() {
                    LEAD_WAIT
                } else {
                    Duration::ZERO
                };
                let lead = offload("snapshot lock", move || take_lead(&*shared, wait))
                    .await
                    .map_err(PublishError::task("snapshot lock task"))??;
                let Some(lead) = lead else {
                    return Ok(None);
                };
                // What another control plane published meanwhile counts.
                let this = Arc::clone(self);
                offload("snapshot adoption", move || this.adopt_newest())
                    .await
                    .map_err(PublishError::task("snapshot adoption task"))??;
                if let Some(threshold) = threshold {
                    let last = *self.store.commits().borrow();
                    if !self.due(last, threshold) {
                        return Ok(self.latest());
                    }
                }
                Some(lead)
            }
        };
        let this = Arc::clone(self);
        let frame = offload("snapshot build", move || {
            let frame = this.build()?;
            if let Some(shared) = &this.shared {
                let path = this.snap_path(&frame.id);
                shared
                    .put_snapshot(&frame, &path)
                    .map_err(PublishError::store("storing the snapshot"))?;
            }
            Ok::<_, PublishError>(frame)
        })
        .await
        .map_err(PublishError::task("snapshot build task"))??;
        let frame = self.announce(frame);
        let this = Arc::clone(self);
        if let Ok(Err(e)) = offload("snapshot garbage collection", move || {
            this.collect_garbage()
        })
        .await
        {
            tracing::warn!(error = %ErrorChain(&e), "snapshot garbage collection");
        }
        drop(lead);
        Ok(Some(frame))
    }

    /// A local copy of snapshot `id` to serve, fetched from the shared store when this control
    /// plane has none (blocking); `None` for an unknown id.
    /// Where snapshot `id`'s zstd copy is (or would be).
    fn snap_path(&self, id: &str) -> PathBuf {
        self.config.dir.join(format!("{id}{SUFFIX}"))
    }

    fn zst_path(&self, id: &str) -> PathBuf {
        self.config.dir.join(format!("{id}{ZSTD_SUFFIX}"))
    }

    /// The zstd copy of snapshot `id` (`<id>.snap.zst`), made from the local copy if there is
    /// none yet (blocking; one at a time, so two downloads never write it together); `None`
    /// when there is no such snapshot.
    pub fn compressed_copy(&self, id: &str) -> Result<Option<PathBuf>, PublishError> {
        let Some(zst) = valid_snapshot_id(id).then(|| self.zst_path(id)) else {
            return Ok(None);
        };
        if zst.exists() {
            return Ok(Some(zst));
        }
        let Some(path) = self.local_copy(id)? else {
            return Ok(None);
        };
        let mut context = self.compressing.lock().unwrap_or_else(|p| p.into_inner());
        if zst.exists() {
            return Ok(Some(zst));
        }
        let temp = self
            .config
            .dir
            .join(format!(".compressing-{}{ZSTD_SUFFIX}", std::process::id()));
        let result = (|| {
            let mut input =
                std::fs::File::open(&path).map_err(PublishError::file("opening", &path))?;
            let output =
                std::fs::File::create(&temp).map_err(PublishError::file("creating", &temp))?;
            let context = context.get_or_insert_with(zstd::zstd_safe::CCtx::create);
            let zstd_error = |e: zstd::zstd_safe::ErrorCode| {
                PublishError::file("compressing into", &temp)(std::io::Error::other(
                    zstd::zstd_safe::get_error_name(e),
                ))
            };
            // A new frame from a clean state at our level, in the context's own buffers.
            context
                .reset(zstd::zstd_safe::ResetDirective::SessionAndParameters)
                .map_err(zstd_error)?;
            context
                .set_parameter(zstd::zstd_safe::CParameter::CompressionLevel(ZSTD_LEVEL))
                .map_err(zstd_error)?;
            let mut encoder = zstd::stream::write::Encoder::with_context(output, context);
            std::io::copy(&mut input, &mut encoder)
                .map_err(PublishError::file("compressing into", &temp))?;
            let output = encoder
                .finish()
                .map_err(PublishError::file("compressing into", &temp))?;
            output
                .sync_all()
                .map_err(PublishError::file("fsync", &temp))?;
            std::fs::rename(&temp, &zst).map_err(PublishError::file("renaming", &temp))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result.map(|()| Some(zst))
    }

    pub fn local_copy(&self, id: &str) -> Result<Option<PathBuf>, PublishError> {
        let Some(path) = self.path_of(id) else {
            return Ok(None);
        };
        if path.exists() {
            return Ok(Some(path));
        }
        let Some(shared) = &self.shared else {
            return Ok(None);
        };
        let Some(frame) = shared
            .snapshots()
            .map_err(PublishError::store("listing stored snapshots"))?
            .into_iter()
            .find(|f| f.id == id)
        else {
            return Ok(None);
        };
        self.fetch(&**shared, &frame)?;
        Ok(Some(path))
    }

    /// Copies a stored snapshot into the directory: a hidden temporary file, its hash and
    /// length checked against the frame, fsynced, then renamed to its id (blocking).
    fn fetch(&self, shared: &dyn Shared, frame: &SnapshotFrame) -> Result<(), PublishError> {
        let _one_at_a_time = self.fetching.lock().unwrap_or_else(|e| e.into_inner());
        let path = self.snap_path(&frame.id);
        if path.exists() {
            return Ok(());
        }
        let temp = self.config.dir.join(format!(
            ".fetching-{}-{}{SUFFIX}",
            std::process::id(),
            frame.id
        ));
        let result = (|| {
            let found = shared
                .fetch_snapshot(&frame.id, &temp)
                .map_err(PublishError::stored("fetching", &frame.id))?;
            if !found {
                return Err(PublishError::NoLongerStored {
                    id: frame.id.clone(),
                });
            }
            let (sha256, size) = sha256_file(&temp)?;
            if sha256 != frame.sha256 || size != frame.size {
                return Err(PublishError::Mismatch {
                    id: frame.id.clone(),
                });
            }
            std::fs::rename(&temp, &path)
                .map_err(PublishError::file("renaming the snapshot to", &path))?;
            std::fs::File::open(&self.config.dir)?.sync_all()?;
            tracing::info!(id = %frame.id, seq = frame.seq, "copied a snapshot from the store");
            Ok(())
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temp);
        }
        result
    }

    /// Catches up with the shared store (blocking): its newest snapshot, if newer than ours,
    /// is copied here and becomes the latest (the feed announces it); copies of snapshots the
    /// store no longer has are deleted.
    fn adopt_newest(&self) -> Result<(), PublishError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let stored = shared
            .snapshots()
            .map_err(PublishError::store("listing stored snapshots"))?;
        if let Some(newest) = stored.first() {
            let ours = self.latest();
            let newer = ours.as_ref().is_none_or(|o| {
                o.seq < newest.seq || (o.id != newest.id && !stored.iter().any(|s| s.id == o.id))
            });
            if newer {
                self.fetch(&**shared, newest)?;
                self.announce(newest.clone());
            }
        }
        let latest = self.latest().map(|s| s.id);
        for file in list(&self.config.dir)? {
            let kept = stored.iter().any(|s| s.id == file.id) || latest.as_ref() == Some(&file.id);
            if !kept {
                let _ = std::fs::remove_file(self.zst_path(&file.id));
                match std::fs::remove_file(&file.path) {
                    Ok(()) => {
                        tracing::info!(id = %file.id, "deleted a copy the store no longer has")
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => tracing::warn!(id = %file.id, error = %e, "deleting a snapshot copy"),
                }
            }
        }
        Ok(())
    }

    /// Loads the newest snapshot on disk, publishes one at once if there is none or it is
    /// behind the change log, then keeps to the schedule until `stop` turns true.
    pub async fn start(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let this = Arc::clone(&self);
        match offload("reading the snapshot directory", move || this.load_newest()).await {
            Ok(Ok(Some(frame))) => {
                tracing::info!(id = %frame.id, seq = frame.seq, "newest snapshot on disk");
                self.announce(frame);
            }
            Ok(Ok(None)) | Err(_) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %ErrorChain(&e), "reading the snapshot directory")
            }
        }
        self.adopt_logged().await;
        let mut commits = self.store.commits();
        let mut retry_at = tokio::time::Instant::now();
        if self.due(*commits.borrow_and_update(), 0) {
            self.publish_logged("start", 0, &mut retry_at).await;
        }
        let mut tick = tokio::time::interval(self.config.interval.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await; // the first tick is immediate
        let mut news_tick = tokio::time::interval(NEWS_POLL);
        news_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let news = |s: &Self| s.shared.as_ref().map(|sh| sh.generation(News::Snapshots));
        let mut heard = news(&self);
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
                _ = tick.tick() => {
                    if self.due(*commits.borrow(), 0) {
                        self.publish_logged("interval", 0, &mut retry_at).await;
                    }
                }
                _ = news_tick.tick(), if self.shared.is_some() => {
                    let now = news(&self);
                    if now != heard {
                        heard = now;
                        self.adopt_logged().await;
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
                        self.publish_logged("overlay", self.config.max_overlay, &mut retry_at)
                            .await;
                    }
                }
            }
        }
    }

    /// [`Publisher::adopt_newest`] on the blocking pool, failures logged (the next news or
    /// build tries again).
    async fn adopt_logged(self: &Arc<Self>) {
        if self.shared.is_none() {
            return;
        }
        let _one_at_a_time = self.building.lock().await;
        let this = Arc::clone(self);
        if let Ok(Err(e)) = offload("catching up with stored snapshots", move || {
            this.adopt_newest()
        })
        .await
        {
            tracing::warn!(error = %ErrorChain(&e), "catching up with stored snapshots");
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

    async fn publish_logged(
        self: &Arc<Self>,
        why: &str,
        threshold: u64,
        retry_at: &mut tokio::time::Instant,
    ) {
        match self.publish_if(Some(threshold)).await {
            Ok(Some(f)) => {
                tracing::info!(why, id = %f.id, seq = f.seq, size = f.size, "newest snapshot")
            }
            Ok(None) => {
                tracing::debug!(why, "another control plane is publishing a snapshot")
            }
            Err(e) => {
                *retry_at = tokio::time::Instant::now() + RETRY_AFTER;
                tracing::error!(why, error = %ErrorChain(&e), "snapshot build failed");
            }
        }
    }

    /// Builds, hashes and names one snapshot (blocking).
    fn build(&self) -> Result<SnapshotFrame, PublishError> {
        let temp = self
            .config
            .dir
            .join(format!(".building-{}{SUFFIX}", std::process::id()));
        let result = (|| {
            let started = std::time::Instant::now();
            let hot = &self.config.hot;
            let popular = self.popular(hot);
            let (seq, info, stats) = crate::snapshot::build_hot_snapshot(
                &*self.store,
                self.config.key_id,
                self.config.regions,
                self.config.reserve,
                &temp,
                hot,
                &popular,
                now_ms(),
            )?;
            tracing::info!(
                links = info.links,
                recent = stats.recent,
                popular = stats.popular,
                budget_spent = stats.full,
                changes_read = stats.changes_read,
                ms = started.elapsed().as_millis() as u64,
                "built a hot-set snapshot"
            );
            let (sha256, size) = sha256_file(&temp)?;
            let id = snapshot_id(seq, &sha256);
            let path = self.snap_path(&id);
            std::fs::rename(&temp, &path)
                .map_err(PublishError::file("renaming the snapshot to", &path))?;
            std::fs::File::open(&self.config.dir)?.sync_all()?;
            // The copy engines download, made now rather than by the first download (best
            // effort: a download makes it if this fails).
            let zstarted = std::time::Instant::now();
            match self.compressed_copy(&id) {
                Ok(Some(zst)) => tracing::info!(
                    %id,
                    bytes = size,
                    compressed = zst.metadata().map_or(0, |m| m.len()),
                    ms = zstarted.elapsed().as_millis() as u64,
                    "compressed the snapshot for download"
                ),
                Ok(None) => {}
                Err(e) => tracing::warn!(%id, error = %ErrorChain(&e), "compressing the snapshot"),
            }
            Ok::<_, PublishError>(SnapshotFrame {
                signature: None,
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
    fn load_newest(&self) -> Result<Option<SnapshotFrame>, PublishError> {
        for file in list(&self.config.dir)? {
            let (sha256, size) = sha256_file(&file.path)?;
            if snapshot_id(file.seq, &sha256) == file.id {
                return Ok(Some(SnapshotFrame {
                    signature: None,
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
    /// On a shared store (under the lock) the store's are collected too, with the engines of
    /// every control plane counted.
    fn collect_garbage(&self) -> Result<(), PublishError> {
        if let Err(e) = self.fleet.refresh(now_ms()) {
            tracing::warn!(error = %e, "reading the shared fleet before garbage collection");
        }
        let in_use = self.fleet.snapshots_in_use(now_ms());
        let latest = self.latest().map(|s| s.id);
        if let Some(shared) = &self.shared {
            let stored = shared
                .snapshots()
                .map_err(PublishError::store("listing stored snapshots"))?;
            for frame in stored.into_iter().skip(KEEP_NEWEST) {
                if in_use.contains(&frame.id) || latest.as_ref() == Some(&frame.id) {
                    continue;
                }
                shared
                    .drop_snapshot(&frame.id)
                    .map_err(PublishError::stored("dropping", &frame.id))?;
                tracing::info!(id = %frame.id, "dropped an old snapshot from the store");
            }
        }
        // A zstd copy whose snapshot is gone (a copy finished just after its collection).
        for entry in std::fs::read_dir(&self.config.dir)?.flatten() {
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(ZSTD_SUFFIX)) else {
                continue;
            };
            if !self.snap_path(id).exists() {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        for file in list(&self.config.dir)?.into_iter().skip(KEEP_NEWEST) {
            if in_use.contains(&file.id) || latest.as_ref() == Some(&file.id) {
                continue;
            }
            // Its zstd copy first: a copy never outlives its snapshot.
            let _ = std::fs::remove_file(self.zst_path(&file.id));
            match std::fs::remove_file(&file.path) {
                Ok(()) => tracing::info!(id = %file.id, "deleted an old snapshot"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(PublishError::File {
                        op: "deleting",
                        path: file.path,
                        source,
                    })
                }
            }
        }
        Ok(())
    }
}

/// Takes leader lock [`LOCK`], trying for up to `wait` (blocking).
fn take_lead(shared: &dyn Shared, wait: Duration) -> Result<Option<Box<dyn Lead>>, PublishError> {
    let deadline = std::time::Instant::now() + wait;
    loop {
        if let Some(lead) = shared
            .try_lead(LOCK)
            .map_err(PublishError::store("the snapshot lock"))?
        {
            return Ok(Some(lead));
        }
        if std::time::Instant::now() >= deadline {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every `<id>.snap` in `dir`, newest first (by sequence, then modification time).
fn list(dir: &Path) -> Result<Vec<OnDisk>, PublishError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(PublishError::file("listing", dir))? {
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

/// SHA-256 (lowercase hex) and length of a file ([`SnapshotDigest::of`]).
fn sha256_file(path: &Path) -> Result<(String, u64), PublishError> {
    let file = std::fs::File::open(path).map_err(PublishError::file("opening", path))?;
    SnapshotDigest::of(file).map_err(PublishError::file("reading", path))
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
        assert_eq!(
            sha,
            hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"x"))
        );
    }
}
