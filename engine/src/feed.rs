//! The feed's control threads: the engine's subscription to the control plane
//! (`control-plane/FEED.md` is the wire contract; DESIGN.md, "Snapshots, deltas and the
//! denylist", the why). Nothing here runs on a serving core. With several control planes
//! ([`ControlPlanes`]), everything here talks to the one in use and fails over to the next.
//!
//! Three threads, so that no network wait delays another duty:
//!
//! - **reader**: holds `GET /edge/v1/feed?after=<applied>`, reads NDJSON frames (each line
//!   bounded and parsed as untrusted bytes by [`lasthop_core::feed::parse_frame`]), and hands
//!   them to the applier. A read that sees nothing for `timeout` (3 s; heartbeats come every
//!   second) means the feed is lost: it fails over to the next control plane and resumes from
//!   the applier's sequence there (the control planes share one store, hence one numbering).
//!   Once every control plane has failed in a row it backs off, capped and exponential (50 ms to
//!   2 s, jittered), before the next round; a subscription that opens resets both.
//! - **applier**: owns the engine's view (standing denylist, overlay, current snapshot, applied
//!   sequence), applies frames in order, and publishes a new [`Tables`] generation through
//!   [`Shared::publish`] after each burst (one generation per burst, not per frame). It spawns
//!   a snapshot download beside the serving one when a newer snapshot is announced (from the
//!   control plane whose feed announced it, else from the others in turn: ids are shared), and
//!   swaps it in once it has the announced size and SHA-256 and passes the reader's `verify`.
//! - **reporter**: posts a [`StatusReport`] to `POST /edge/v1/status` on the control plane in use
//!   every second.
//!
//! ## Safe mode
//!
//! Until the feed is connected *and caught up* (the standing denylist received and every change
//! up to the control plane's last sequence applied), the published tables have `safe_mode` set
//! (unless disabled with `--safe-mode off`): a redirect found locally is first confirmed at the
//! origin (see [`crate::answer::decide`]), and served from the local tables, counted, when the
//! origin cannot answer either. A takedown issued while the engine was cut off reaches it in the
//! replay before the catch-up point, so it is applied before safe mode ends.
//!
//! ## What the tables hold
//!
//! - overlay: every link created or changed after the current snapshot's sequence, in its
//!   current form (a gone link with an empty URL, which answers 410);
//! - denylist: the standing list (disabled and taken down → `Gone`, flagged → `Warn`), plus
//!   `Gone` or `Changed` for every overlay entry that came from a state change after the
//!   snapshot, so that a restore or a moved expiry is answered from the overlay instead of the
//!   snapshot's stale entry;
//! - high-water marks raised for every generated code the feed announces.
//!
//! Rebuilding the overlay and denylist maps for each published generation costs O(overlay +
//! denylist); the control plane bounds the overlay by publishing a snapshot every 100k changes.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lasthop_core::feed::{
    parse_frame, DenyKind, Frame, LinkFrame, SnapshotFrame, StatusReport, MAX_FRAME_LEN,
};
use lasthop_core::{classify, CodeKind};
use lasthop_snapshot::{Snapshot, SnapshotError};
use sha2::{Digest, Sha256};

use crate::control::ControlPlanes;
use crate::denylist::{Deny, Denylist};
use crate::metrics::{family, sample, EngineMetrics};
use crate::overlay::{Overlay, OverlayLink};
use crate::serve::Shared;
use crate::tables::Tables;

/// How a snapshot file becomes a [`Snapshot`] (`Snapshot::load` or `Snapshot::open`).
pub type LoadFn = fn(&Path) -> Result<Snapshot, SnapshotError>;

/// The subscription's settings.
#[derive(Debug, Clone)]
pub struct FeedConfig {
    /// The control planes' edge listeners (shared with the origin read-through).
    pub control: Arc<ControlPlanes>,
    /// The edge token.
    pub token: Option<String>,
    /// This engine's id and PoP, as reported.
    pub engine_id: String,
    pub pop: String,
    /// Downloaded snapshots live in `data_dir/snapshots/`.
    pub data_dir: PathBuf,
    /// Silence after which the feed counts as lost.
    pub timeout: Duration,
    /// Confirm at the origin while the feed is lost (`--safe-mode confirm`).
    pub safe_mode: bool,
    /// How a snapshot file is brought into memory.
    pub load: LoadFn,
}

impl FeedConfig {
    fn snapshot_dir(&self) -> PathBuf {
        self.data_dir.join("snapshots")
    }

    /// A GET of `path_and_query` on control plane `control`.
    fn get(&self, agent: &ureq::Agent, control: usize, path_and_query: &str) -> ureq::Request {
        let req = agent.get(&format!("{}{path_and_query}", self.control.url(control)));
        match &self.token {
            Some(t) => req.set("Authorization", &format!("Bearer {t}")),
            None => req,
        }
    }
}

/// Upper bounds (seconds) of the creation-to-first-redirect histogram.
const FIRST_REDIRECT_BUCKETS: [f64; 12] = [
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0, 300.0,
];

/// What the feed threads report, read by `/metrics`, `/readyz`, the reporter and the cores.
#[derive(Debug, Default)]
pub struct FeedStats {
    connected: AtomicBool,
    caught_up: AtomicBool,
    safe_mode: AtomicBool,
    applied_seq: AtomicU64,
    last_seq: AtomicU64,
    snapshot_seq: AtomicU64,
    snapshot_id: Mutex<Option<String>>,
    frames: AtomicU64,
    bad_frames: AtomicU64,
    connects: AtomicU64,
    losses: AtomicU64,
    downloads_ok: AtomicU64,
    downloads_failed: AtomicU64,
    overlay_links: AtomicU64,
    denylist_codes: AtomicU64,
    publishes: AtomicU64,
    /// Safe-mode redirects served from local tables because the origin could not confirm.
    unconfirmed: AtomicU64,
    first_redirect: [AtomicU64; FIRST_REDIRECT_BUCKETS.len() + 1],
    first_redirect_sum_ms: AtomicU64,
}

impl FeedStats {
    /// The sequence this engine has applied.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq.load(Ordering::Acquire)
    }

    /// Connected and caught up.
    pub fn in_sync(&self) -> bool {
        self.connected.load(Ordering::Acquire) && self.caught_up.load(Ordering::Acquire)
    }

    /// A safe-mode redirect went out unconfirmed (the origin was unreachable too).
    pub fn count_unconfirmed(&self) {
        self.unconfirmed.fetch_add(1, Ordering::Relaxed);
    }

    /// Safe-mode redirects served unconfirmed so far.
    pub fn unconfirmed(&self) -> u64 {
        self.unconfirmed.load(Ordering::Relaxed)
    }

    /// The first redirect of a link this engine learnt from the feed, `ms` after its creation.
    pub fn observe_first_redirect(&self, ms: i64) {
        let ms = u64::try_from(ms).unwrap_or(0);
        let secs = ms as f64 / 1000.0;
        let i = FIRST_REDIRECT_BUCKETS
            .iter()
            .position(|&b| secs <= b)
            .unwrap_or(FIRST_REDIRECT_BUCKETS.len());
        self.first_redirect[i].fetch_add(1, Ordering::Relaxed);
        self.first_redirect_sum_ms.fetch_add(ms, Ordering::Relaxed);
    }

    /// Prometheus families (appended to the engine's `/metrics`).
    pub(crate) fn render(&self, o: &mut String) {
        let flag = |b: &AtomicBool| u64::from(b.load(Ordering::Relaxed));
        for (name, kind, help, v) in [
            (
                "lasthop_engine_feed_connected",
                "gauge",
                "1 while the feed subscription is open.",
                flag(&self.connected),
            ),
            (
                "lasthop_engine_feed_in_sync",
                "gauge",
                "1 while connected and caught up with the control plane's last sequence.",
                u64::from(self.in_sync()),
            ),
            (
                "lasthop_engine_safe_mode",
                "gauge",
                "1 while redirects are confirmed at the origin (feed lost or catching up).",
                flag(&self.safe_mode),
            ),
            (
                "lasthop_engine_feed_applied_sequence",
                "gauge",
                "Highest change-log sequence applied.",
                self.applied_seq.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_feed_control_sequence",
                "gauge",
                "Control plane's last sequence, as last heard.",
                self.last_seq.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_overlay_links",
                "gauge",
                "Links held in the overlay.",
                self.overlay_links.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_denylist_codes",
                "gauge",
                "Codes in the published denylist.",
                self.denylist_codes.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_feed_frames_total",
                "counter",
                "Feed frames received.",
                self.frames.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_feed_bad_frames_total",
                "counter",
                "Feed lines refused (the connection was dropped and resumed).",
                self.bad_frames.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_feed_connects_total",
                "counter",
                "Feed subscriptions opened.",
                self.connects.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_feed_losses_total",
                "counter",
                "Feed subscriptions lost (error, close or heartbeat timeout).",
                self.losses.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_feed_publishes_total",
                "counter",
                "Table generations published by the feed.",
                self.publishes.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_snapshot_downloads_total",
                "counter",
                "Snapshots downloaded, verified and swapped in.",
                self.downloads_ok.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_snapshot_download_failures_total",
                "counter",
                "Snapshot downloads that failed (size, checksum, verify or I/O).",
                self.downloads_failed.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_safe_mode_unconfirmed_total",
                "counter",
                "Safe-mode redirects served from local tables because the origin was unreachable.",
                self.unconfirmed.load(Ordering::Relaxed),
            ),
        ] {
            family(o, name, kind, help);
            sample(o, name, "", v);
        }
        let name = "lasthop_engine_first_redirect_seconds";
        family(
            o,
            name,
            "histogram",
            "Time from a link's creation at the control plane to its first redirect here.",
        );
        let mut cumulative = 0;
        for (i, bound) in FIRST_REDIRECT_BUCKETS.iter().enumerate() {
            cumulative += self.first_redirect[i].load(Ordering::Relaxed);
            sample(
                o,
                &format!("{name}_bucket"),
                &format!("le=\"{bound}\""),
                cumulative,
            );
        }
        cumulative += self.first_redirect[FIRST_REDIRECT_BUCKETS.len()].load(Ordering::Relaxed);
        sample(o, &format!("{name}_bucket"), "le=\"+Inf\"", cumulative);
        let sum_ms = self.first_redirect_sum_ms.load(Ordering::Relaxed);
        let _ = std::fmt::Write::write_fmt(
            o,
            format_args!("{name}_sum {}.{:03}\n", sum_ms / 1000, sum_ms % 1000),
        );
        sample(o, &format!("{name}_count"), "", cumulative);
    }
}

/// What the applier is told.
enum Event {
    /// Subscribed, to the control plane at this index.
    Connected(usize),
    Frame(Frame),
    Lost(String),
    Downloaded {
        frame: SnapshotFrame,
        result: Result<Arc<Snapshot>, String>,
    },
    /// SIGHUP: a snapshot file to serve if it is not older than the current one.
    Reload(Arc<Snapshot>),
}

/// The running feed: hand SIGHUP reloads to it.
#[derive(Debug)]
pub struct Feed {
    tx: Mutex<Sender<Event>>,
    stats: Arc<FeedStats>,
}

impl Feed {
    /// Serve `snapshot` if it is at least as new as the current one (SIGHUP).
    pub fn reload(&self, snapshot: Arc<Snapshot>) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(Event::Reload(snapshot));
        }
    }

    /// The shared counters.
    pub fn stats(&self) -> Arc<FeedStats> {
        Arc::clone(&self.stats)
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Event::Connected(_) => "Connected",
            Event::Frame(_) => "Frame",
            Event::Lost(_) => "Lost",
            Event::Downloaded { .. } => "Downloaded",
            Event::Reload(_) => "Reload",
        })
    }
}

/// Starts the reader, applier and reporter threads. `base` is what the engine serves now (its
/// snapshot, if any, and marks); `snapshot_id` names that snapshot when it came from the feed.
pub fn start(
    cfg: FeedConfig,
    shared: Arc<Shared>,
    base: Tables,
    snapshot_id: Option<String>,
    metrics: Arc<EngineMetrics>,
    stats: Arc<FeedStats>,
) -> std::io::Result<Feed> {
    let cfg = Arc::new(cfg);
    let snapshot_seq = base.snapshot.as_ref().map_or(0, |s| s.sequence());
    stats.applied_seq.store(snapshot_seq, Ordering::Release);
    stats.snapshot_seq.store(snapshot_seq, Ordering::Relaxed);
    if let Ok(mut id) = stats.snapshot_id.lock() {
        id.clone_from(&snapshot_id);
    }
    stats.safe_mode.store(cfg.safe_mode, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    let mut applier = Applier {
        cfg: Arc::clone(&cfg),
        shared,
        stats: Arc::clone(&stats),
        tx: tx.clone(),
        base,
        snapshot_seq,
        applied: snapshot_seq,
        standing: HashMap::new(),
        pending_denylist: None,
        standing_seq: 0,
        overlay: HashMap::new(),
        target: None,
        connected: false,
        got_denylist: false,
        feed_control: cfg.control.current(),
        downloading: None,
        queued: None,
        metrics,
    };
    // The first generation already carries safe mode: nothing is confirmed yet.
    applier.publish();
    std::thread::Builder::new()
        .name("feed-apply".into())
        .spawn(move || applier.run(&rx))?;
    {
        let (cfg, stats, tx) = (Arc::clone(&cfg), Arc::clone(&stats), tx.clone());
        std::thread::Builder::new()
            .name("feed-read".into())
            .spawn(move || reader(&cfg, &stats, &tx))?;
    }
    {
        let (cfg, stats) = (Arc::clone(&cfg), Arc::clone(&stats));
        std::thread::Builder::new()
            .name("feed-report".into())
            .spawn(move || reporter(&cfg, &stats))?;
    }
    Ok(Feed {
        tx: Mutex::new(tx),
        stats,
    })
}

/// One overlay entry and the change that produced it.
#[derive(Debug, Clone)]
struct Entry {
    link: OverlayLink,
    seq: u64,
    /// From a state change (else a creation): the snapshot's entry, if any, is stale.
    changed: bool,
}

struct Applier {
    cfg: Arc<FeedConfig>,
    shared: Arc<Shared>,
    stats: Arc<FeedStats>,
    tx: Sender<Event>,
    /// Scheme, marks, snapshot, origin flag; denylist and overlay are rebuilt on publish.
    base: Tables,
    snapshot_seq: u64,
    applied: u64,
    standing: HashMap<Box<[u8]>, DenyKind>,
    /// A standing list arriving in parts.
    pending_denylist: Option<HashMap<Box<[u8]>, DenyKind>>,
    /// The change sequence the standing list is current as of.
    standing_seq: u64,
    overlay: HashMap<Box<[u8]>, Entry>,
    /// The control plane's last sequence (hello, heartbeat): caught up once applied reaches it.
    target: Option<u64>,
    connected: bool,
    got_denylist: bool,
    /// The control plane the feed comes (or last came) from: snapshots it announces are
    /// downloaded from it first.
    feed_control: usize,
    /// The snapshot being downloaded, and the newest one announced meanwhile.
    downloading: Option<SnapshotFrame>,
    queued: Option<SnapshotFrame>,
    metrics: Arc<EngineMetrics>,
}

impl Applier {
    fn run(&mut self, rx: &Receiver<Event>) {
        loop {
            let first = match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let mut dirty = self.handle(first);
            // Apply the whole burst, then publish once.
            while let Ok(ev) = rx.try_recv() {
                dirty |= self.handle(ev);
            }
            if dirty {
                self.publish();
            }
        }
    }

    fn in_sync(&self) -> bool {
        self.connected && self.got_denylist && self.target.is_some_and(|t| self.applied >= t)
    }

    /// Applies one event; true when the tables changed.
    fn handle(&mut self, ev: Event) -> bool {
        let was_in_sync = self.in_sync();
        let changed = match ev {
            Event::Connected(control) => {
                self.connected = true;
                self.feed_control = control;
                self.got_denylist = false;
                self.pending_denylist = None;
                self.target = None;
                self.stats.connected.store(true, Ordering::Release);
                self.stats.connects.fetch_add(1, Ordering::Relaxed);
                false
            }
            Event::Lost(why) => {
                if self.connected {
                    tracing::warn!(reason = %why, "feed lost; safe mode until it is back");
                    self.stats.losses.fetch_add(1, Ordering::Relaxed);
                } else {
                    tracing::debug!(reason = %why, "feed still unreachable");
                }
                self.connected = false;
                self.stats.connected.store(false, Ordering::Release);
                false
            }
            Event::Frame(frame) => self.apply(frame),
            Event::Downloaded { frame, result } => self.downloaded(frame, result),
            Event::Reload(snapshot) => {
                let seq = snapshot.sequence();
                if seq >= self.snapshot_seq {
                    self.swap_snapshot(snapshot, None)
                } else {
                    tracing::warn!(
                        file = seq,
                        serving = self.snapshot_seq,
                        "SIGHUP: the snapshot file is older than the one being served; kept"
                    );
                    false
                }
            }
        };
        let now_in_sync = self.in_sync();
        if now_in_sync != was_in_sync {
            tracing::info!(in_sync = now_in_sync, applied = self.applied, "feed state");
        }
        // The caught-up flag and the health flag follow in `publish`, after the tables they
        // describe are out: whoever reads "in sync" can rely on what it then gets served.
        changed || now_in_sync != was_in_sync
    }

    fn apply(&mut self, frame: Frame) -> bool {
        match frame {
            Frame::Hello { last_seq, .. } => {
                if last_seq < self.applied {
                    tracing::warn!(
                        control = last_seq,
                        applied = self.applied,
                        "the control plane's change log is behind this engine's (restored from \
                         an older backup?); new changes will be applied from its sequence on"
                    );
                    self.applied = last_seq;
                    self.stats.applied_seq.store(last_seq, Ordering::Release);
                    // The old numbering means nothing now: forget what it covered, so changes
                    // under the new numbers apply (a newer snapshot will be downloaded).
                    self.overlay.clear();
                    self.snapshot_seq = self.snapshot_seq.min(last_seq);
                    self.standing_seq = 0;
                }
                self.note_target(last_seq);
                false
            }
            Frame::Heartbeat { last_seq, .. } => {
                self.note_target(last_seq);
                false
            }
            Frame::Denylist {
                seq,
                entries,
                part,
                last,
            } => {
                // Parts gather aside; the list in force changes only once it is whole.
                let pending = match (part, self.pending_denylist.as_mut()) {
                    (0, _) => self.pending_denylist.insert(HashMap::new()),
                    (_, Some(p)) => p,
                    (_, None) => {
                        tracing::warn!(part, "denylist part without its first part; ignored");
                        return false;
                    }
                };
                pending.extend(
                    entries
                        .into_iter()
                        .map(|e| (e.code.into_bytes().into_boxed_slice(), e.deny)),
                );
                if !last {
                    return false;
                }
                self.standing = self.pending_denylist.take().unwrap_or_default();
                self.standing_seq = seq;
                self.got_denylist = true;
                true
            }
            Frame::LinkCreated(l) => {
                self.note_applied(l.seq);
                self.learn_code(&l.code);
                if l.seq <= self.snapshot_seq {
                    return false; // the snapshot has it
                }
                self.upsert(l, false);
                true
            }
            Frame::StateChanged(l) => {
                self.note_applied(l.seq);
                self.learn_code(&l.code);
                let code: Box<[u8]> = l.code.as_bytes().into();
                // The standing list is current as of its own sequence: replayed older changes
                // must not undo it.
                if l.seq > self.standing_seq {
                    if l.gone() && !l.deleted {
                        self.standing.insert(code, DenyKind::Gone);
                    } else if l.warn && !l.gone() {
                        self.standing.insert(code, DenyKind::Warn);
                    } else {
                        self.standing.remove(&code);
                    }
                }
                if l.seq > self.snapshot_seq {
                    self.upsert(l, true);
                }
                true
            }
            Frame::Snapshot(s) => {
                self.announce(s);
                false
            }
            Frame::Unknown => false,
        }
    }

    fn note_target(&mut self, last_seq: u64) {
        self.target = Some(self.target.map_or(last_seq, |t| t.max(last_seq)));
        self.stats.last_seq.store(last_seq, Ordering::Relaxed);
    }

    fn note_applied(&mut self, seq: u64) {
        if seq > self.applied {
            self.applied = seq;
            self.stats.applied_seq.store(seq, Ordering::Release);
        }
    }

    /// A generated code exists: make sure the high-water check lets it through.
    fn learn_code(&mut self, code: &str) {
        if classify(code.as_bytes()) == CodeKind::Generated {
            if let Some(n) = self.base.scheme.decode(code.as_bytes()) {
                self.base.high_water.note_issued(n);
            }
        }
    }

    fn upsert(&mut self, l: LinkFrame, changed: bool) {
        let code: Box<[u8]> = l.code.as_bytes().into();
        let previous = self.overlay.get(&code);
        if previous.is_some_and(|p| p.seq > l.seq) {
            return; // a replayed older frame
        }
        // Only a creation the engine saw counts for the creation-to-first-redirect metric: a
        // state change of an old link carries its old creation time, which is no first redirect.
        let created_at_ms = if changed {
            previous.and_then(|p| p.link.created_at_ms)
        } else {
            l.created_at_ms
        };
        let first_served = previous
            .map(|p| p.link.first_served.clone())
            .unwrap_or_default();
        let changed = changed || previous.is_some_and(|p| p.changed);
        let url = if l.gone() {
            Vec::new().into_boxed_slice()
        } else {
            l.long_url.into_bytes().into_boxed_slice()
        };
        self.overlay.insert(
            code,
            Entry {
                link: OverlayLink {
                    url,
                    expires_at_ms: l.expires_at_ms,
                    warn: l.warn,
                    created_at_ms,
                    first_served,
                },
                seq: l.seq,
                changed,
            },
        );
    }

    /// A snapshot was announced: download it unless it is not newer.
    fn announce(&mut self, s: SnapshotFrame) {
        if !self.wants_snapshot(s.seq) {
            return;
        }
        match &self.downloading {
            Some(d) if d.id == s.id => {}
            Some(_) => self.queued = Some(s),
            None => self.download(s),
        }
    }

    /// Whether a snapshot complete up to `seq` would be news: newer than the one served, or
    /// any at all when none is (a fresh control plane's first snapshot has sequence 0).
    fn wants_snapshot(&self, seq: u64) -> bool {
        self.base.snapshot.is_none() || seq > self.snapshot_seq
    }

    fn download(&mut self, s: SnapshotFrame) {
        self.downloading = Some(s.clone());
        let (cfg, tx, from) = (Arc::clone(&self.cfg), self.tx.clone(), self.feed_control);
        let spawned = std::thread::Builder::new()
            .name("feed-download".into())
            .spawn(move || {
                let result = fetch_snapshot(&cfg, &s, from);
                let _ = tx.send(Event::Downloaded { frame: s, result });
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a snapshot download thread");
            self.downloading = None;
        }
    }

    fn downloaded(&mut self, frame: SnapshotFrame, result: Result<Arc<Snapshot>, String>) -> bool {
        self.downloading = None;
        let changed = match result {
            Ok(snapshot) if self.wants_snapshot(frame.seq) => {
                self.stats.downloads_ok.fetch_add(1, Ordering::Relaxed);
                self.swap_snapshot(snapshot, Some(frame.id.clone()))
            }
            Ok(_) => false,
            Err(e) => {
                self.stats.downloads_failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(id = %frame.id, error = %e, "snapshot download failed");
                // Every control plane was tried; retried when one announces it again (next
                // subscription).
                false
            }
        };
        if let Some(next) = self.queued.take() {
            self.announce(next);
        }
        changed
    }

    fn swap_snapshot(&mut self, snapshot: Arc<Snapshot>, id: Option<String>) -> bool {
        let seq = snapshot.sequence();
        match self.base.with_snapshot(Arc::clone(&snapshot)) {
            Ok(t) => self.base = t,
            Err(e) => {
                tracing::error!(error = %e, "refusing snapshot");
                return false;
            }
        }
        self.snapshot_seq = seq;
        self.overlay.retain(|_, e| e.seq > seq);
        self.stats.snapshot_seq.store(seq, Ordering::Relaxed);
        if let Ok(mut current) = self.stats.snapshot_id.lock() {
            current.clone_from(&id);
        }
        self.note_applied(seq);
        let m = &self.metrics;
        m.snapshot_sequence.store(seq, Ordering::Relaxed);
        m.snapshot_links.store(snapshot.links(), Ordering::Relaxed);
        m.snapshot_swaps.fetch_add(1, Ordering::Relaxed);
        m.health.snapshot_missing.store(false, Ordering::Relaxed);
        tracing::info!(sequence = seq, links = snapshot.links(), id = ?id, "snapshot swapped in");
        if let Some(id) = &id {
            prune_snapshots(&self.cfg.snapshot_dir(), id);
        }
        true
    }

    fn publish(&mut self) {
        let mut deny: Vec<(&[u8], Deny)> = self
            .standing
            .iter()
            .map(|(code, kind)| {
                let d = match kind {
                    DenyKind::Gone => Deny::Gone,
                    DenyKind::Warn => Deny::Warn,
                };
                (&**code, d)
            })
            .collect();
        for (code, e) in &self.overlay {
            if e.changed {
                let d = if e.link.url.is_empty() {
                    Deny::Gone
                } else {
                    Deny::Changed
                };
                deny.push((&**code, d));
            }
        }
        let denylist = Denylist::new(deny);
        let overlay = Overlay::empty().with_all(
            self.overlay
                .iter()
                .map(|(code, e)| (&**code, e.link.clone())),
        );
        let safe = self.cfg.safe_mode && !self.in_sync();
        self.stats.safe_mode.store(safe, Ordering::Relaxed);
        self.stats
            .overlay_links
            .store(overlay.len() as u64, Ordering::Relaxed);
        self.stats
            .denylist_codes
            .store(denylist.len() as u64, Ordering::Relaxed);
        let mut tables = self
            .base
            .with_denylist(Arc::new(denylist))
            .with_overlay(Arc::new(overlay));
        tables.safe_mode = safe;
        self.shared.publish(tables);
        self.stats.publishes.fetch_add(1, Ordering::Relaxed);
        let caught_up = self.got_denylist && self.target.is_some_and(|t| self.applied >= t);
        self.stats.caught_up.store(caught_up, Ordering::Release);
        self.metrics
            .health
            .feed_lost
            .store(!self.in_sync(), Ordering::Relaxed);
    }
}

/// Reads `r` up to and including the next `\n` into `out` (cleared first), refusing lines
/// longer than `max`. Returns the bytes read; 0 at end of stream.
fn read_line_bounded(
    r: &mut impl BufRead,
    out: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<usize> {
    out.clear();
    loop {
        let buf = r.fill_buf()?;
        if buf.is_empty() {
            return Ok(out.len());
        }
        let (take, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(i) => (i + 1, true),
            None => (buf.len(), false),
        };
        if out.len() + take > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("feed line over {max} bytes"),
            ));
        }
        out.extend_from_slice(&buf[..take]);
        r.consume(take);
        if done {
            return Ok(out.len());
        }
    }
}

/// Reads frames from an open subscription until it fails; returns why.
fn read_frames(body: impl Read, stats: &FeedStats, tx: &Sender<Event>) -> String {
    let mut r = BufReader::with_capacity(64 * 1024, body);
    let mut line = Vec::with_capacity(1024);
    loop {
        match read_line_bounded(&mut r, &mut line, MAX_FRAME_LEN + 2) {
            Ok(0) => return "the control plane closed the feed".into(),
            Ok(_) if line.last() != Some(&b'\n') => return "the feed ended mid-line".into(),
            Ok(_) => match parse_frame(&line) {
                Ok(frame) => {
                    stats.frames.fetch_add(1, Ordering::Relaxed);
                    if tx.send(Event::Frame(frame)).is_err() {
                        return "stopping".into();
                    }
                }
                Err(e) => {
                    stats.bad_frames.fetch_add(1, Ordering::Relaxed);
                    return format!("refused a feed line: {e}");
                }
            },
            Err(e) => return format!("reading the feed: {e}"),
        }
    }
}

fn reader(cfg: &FeedConfig, stats: &FeedStats, tx: &Sender<Event>) {
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout_read(cfg.timeout)
        .redirects(0)
        .build();
    let controls = &*cfg.control;
    let mut backoff = Duration::from_millis(50);
    let mut jitter = std::process::id() as u64 | 1;
    // Control planes that failed in a row: every one is tried once before a backoff.
    let mut failures = 0usize;
    loop {
        let control = controls.current();
        let after = stats.applied_seq();
        let query = format!(
            "/edge/v1/feed?after={after}&engine={}&pop={}",
            cfg.engine_id, cfg.pop
        );
        let lost = match cfg.get(&agent, control, &query).call() {
            Ok(resp) => {
                controls.working(control);
                if tx.send(Event::Connected(control)).is_err() {
                    return;
                }
                tracing::info!(
                    control = controls.url(control),
                    index = control,
                    after,
                    "feed subscribed"
                );
                backoff = Duration::from_millis(50);
                failures = 0;
                read_frames(resp.into_reader(), stats, tx)
            }
            Err(ureq::Error::Status(status, _)) => format!("the feed answered {status}"),
            Err(e) => format!("connecting to the feed: {e}"),
        };
        if tx.send(Event::Lost(lost.clone())).is_err() {
            return;
        }
        controls.failed(control, &lost);
        failures += 1;
        if failures % controls.len() != 0 {
            continue; // the next control plane, at once
        }
        // xorshift jitter of up to half the backoff, so engines do not reconnect in lockstep.
        jitter ^= jitter << 13;
        jitter ^= jitter >> 7;
        jitter ^= jitter << 17;
        let half = backoff.as_millis() as u64 / 2;
        std::thread::sleep(backoff + Duration::from_millis(jitter % (half + 1)));
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

fn reporter(cfg: &FeedConfig, stats: &FeedStats) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(1))
        .redirects(0)
        .build();
    loop {
        // Whichever is in use: they share the store the reports land in.
        let url = format!("{}/edge/v1/status", cfg.control.url(cfg.control.current()));
        let report = StatusReport {
            engine: cfg.engine_id.clone(),
            pop: cfg.pop.clone(),
            applied_seq: stats.applied_seq(),
            snapshot_id: stats.snapshot_id.lock().ok().and_then(|id| id.clone()),
            snapshot_seq: stats.snapshot_seq.load(Ordering::Relaxed),
            feed_connected: stats.connected.load(Ordering::Relaxed),
            safe_mode: stats.safe_mode.load(Ordering::Relaxed),
            time_ms: now_ms(),
        };
        let mut req = agent.post(&url);
        if let Some(t) = &cfg.token {
            req = req.set("Authorization", &format!("Bearer {t}"));
        }
        if let Err(e) = req.send_json(&report) {
            tracing::debug!(error = %e, "status report not delivered");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Why a download from one control plane failed.
#[derive(Debug)]
struct DownloadFailure {
    why: String,
    /// The control plane failed (unreachable, a 5xx, the transfer broke), rather than the file
    /// it sent or this host: fail over.
    fail_over: bool,
}

impl DownloadFailure {
    /// A request that got no answer, or an error status.
    fn request(what: &str, e: ureq::Error) -> DownloadFailure {
        let fail_over = match &e {
            ureq::Error::Status(status, _) => *status >= 500,
            ureq::Error::Transport(_) => true,
        };
        DownloadFailure {
            why: format!("{what}: {e}"),
            fail_over,
        }
    }

    /// The file, or this host, is at fault.
    fn local(why: String) -> DownloadFailure {
        DownloadFailure {
            why,
            fail_over: false,
        }
    }
}

/// Downloads, checks and opens the snapshot `s` announces, into `data_dir/snapshots/<id>.snap`:
/// from control plane `from` (the one whose feed announced it), else from the others in turn
/// (they share the store, so snapshot ids mean the same on each).
fn fetch_snapshot(
    cfg: &FeedConfig,
    s: &SnapshotFrame,
    from: usize,
) -> Result<Arc<Snapshot>, String> {
    let dir = cfg.snapshot_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let path = dir.join(format!("{}.snap", s.id));
    let partial = dir.join(format!(".{}.partial", s.id));
    let agent = ureq::AgentBuilder::new()
        .timeout_connect(Duration::from_secs(2))
        .timeout_read(Duration::from_secs(30))
        .redirects(0)
        .build();
    let mut failures = Vec::new();
    for control in cfg.control.order(from) {
        match download_to(cfg, s, &agent, control, &partial, &dir, &path) {
            Ok(snapshot) => return Ok(snapshot),
            Err(e) => {
                let _ = std::fs::remove_file(&partial);
                if e.fail_over {
                    cfg.control.failed(control, &e.why);
                }
                failures.push(format!("{}: {}", cfg.control.url(control), e.why));
            }
        }
    }
    Err(failures.join("; "))
}

/// The body of [`fetch_snapshot`] for one control plane: download into `partial`, check, then
/// rename to `path`.
fn download_to(
    cfg: &FeedConfig,
    s: &SnapshotFrame,
    agent: &ureq::Agent,
    control: usize,
    partial: &Path,
    dir: &Path,
    path: &Path,
) -> Result<Arc<Snapshot>, DownloadFailure> {
    let started = Instant::now();
    let resp = cfg
        .get(agent, control, &s.url)
        .call()
        .map_err(|e| DownloadFailure::request(&format!("GET {}", s.url), e))?;
    let mut body = resp.into_reader().take(s.size.saturating_add(1));
    let mut file = File::create(partial)
        .map_err(|e| DownloadFailure::local(format!("creating {}: {e}", partial.display())))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 256 * 1024];
    let mut got: u64 = 0;
    loop {
        let n = body.read(&mut buf).map_err(|e| DownloadFailure {
            why: format!("downloading: {e}"),
            fail_over: true,
        })?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| DownloadFailure::local(format!("writing {}: {e}", partial.display())))?;
        got += n as u64;
    }
    if got != s.size {
        return Err(DownloadFailure::local(format!(
            "got {got} bytes, announced {}",
            s.size
        )));
    }
    let sha = hex::encode(hasher.finalize());
    if sha != s.sha256 {
        return Err(DownloadFailure::local(format!(
            "sha256 {sha}, announced {}",
            s.sha256
        )));
    }
    file.sync_all()
        .map_err(|e| DownloadFailure::local(format!("fsync: {e}")))?;
    drop(file);
    // Checked before it takes its final name, so a start-up never finds a bad `<id>.snap`.
    let snapshot = open_verified(cfg.load, partial).map_err(DownloadFailure::local)?;
    if snapshot.sequence() != s.seq {
        return Err(DownloadFailure::local(format!(
            "file says sequence {}, announced {}",
            snapshot.sequence(),
            s.seq
        )));
    }
    std::fs::rename(partial, path).map_err(|e| DownloadFailure::local(format!("rename: {e}")))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    tracing::info!(id = %s.id, bytes = got, ms = started.elapsed().as_millis() as u64,
        control = cfg.control.url(control), "snapshot downloaded");
    Ok(Arc::new(snapshot))
}

/// Loads the snapshot at `path` with `load` and checks every byte of it (`verify`).
pub fn open_verified(load: LoadFn, path: &Path) -> Result<Snapshot, String> {
    let snapshot = load(path).map_err(|e| format!("{}: {e}", path.display()))?;
    snapshot
        .verify()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(snapshot)
}

/// Deletes downloaded snapshots other than `keep` and the newest one before it.
fn prune_snapshots(dir: &Path, keep: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".snap"))
        .collect();
    names.sort();
    let keep_name = format!("{keep}.snap");
    let Some(pos) = names.iter().position(|n| *n == keep_name) else {
        return;
    };
    for (i, name) in names.iter().enumerate() {
        // Ids start with the sequence in fixed-width hex, so names sort by age.
        if i + 1 < pos {
            let _ = std::fs::remove_file(dir.join(name));
        }
    }
}

/// The newest snapshot in `data_dir/snapshots/` that opens and verifies, with its id.
pub fn newest_local(data_dir: &Path, load: LoadFn) -> Option<(Arc<Snapshot>, String)> {
    let dir = data_dir.join("snapshots");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".snap") && !n.starts_with('.'))
        .collect();
    names.sort();
    for name in names.iter().rev() {
        match open_verified(load, &dir.join(name)) {
            Ok(s) => {
                let id = name.trim_end_matches(".snap").to_string();
                return Some((Arc::new(s), id));
            }
            Err(e) => tracing::warn!(error = %e, "skipping a local snapshot"),
        }
    }
    None
}

/// Asks the control planes for the newest snapshot and downloads it (start-up without one):
/// the one in use first, then the others in turn.
pub fn fetch_latest(cfg: &FeedConfig) -> Result<(Arc<Snapshot>, String), String> {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(5))
        .redirects(0)
        .build();
    let controls = &*cfg.control;
    let mut failures = Vec::new();
    for control in controls.order(controls.current()) {
        match newest_snapshot(cfg, &agent, control) {
            Ok(frame) => {
                let snapshot = fetch_snapshot(cfg, &frame, control)?;
                return Ok((snapshot, frame.id));
            }
            Err(e) => {
                if e.fail_over {
                    controls.failed(control, &e.why);
                }
                failures.push(format!("{}: {}", controls.url(control), e.why));
            }
        }
    }
    Err(failures.join("; "))
}

/// Control plane `control`'s description of its newest snapshot.
fn newest_snapshot(
    cfg: &FeedConfig,
    agent: &ureq::Agent,
    control: usize,
) -> Result<SnapshotFrame, DownloadFailure> {
    let resp = cfg
        .get(agent, control, "/edge/v1/snapshots/latest")
        .call()
        .map_err(|e| DownloadFailure::request("asking for the newest snapshot", e))?;
    let mut body = Vec::new();
    resp.into_reader()
        .take(MAX_FRAME_LEN as u64)
        .read_to_end(&mut body)
        .map_err(|e| DownloadFailure {
            why: format!("reading the newest snapshot's description: {e}"),
            fail_over: true,
        })?;
    let bad = |why: String| DownloadFailure::local(format!("snapshot description: {why}"));
    // The answer is a snapshot frame without its `type`.
    let mut value: serde_json::Value =
        serde_json::from_slice(&body).map_err(|e| bad(e.to_string()))?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("type".into(), serde_json::Value::from("snapshot"));
    }
    let line = serde_json::to_vec(&value).map_err(|e| bad(e.to_string()))?;
    match parse_frame(&line).map_err(|e| bad(e.to_string()))? {
        Frame::Snapshot(frame) => Ok(frame),
        _ => Err(bad("not a snapshot frame".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_lines() {
        let mut r = BufReader::with_capacity(4, &b"ab\ncdef\nghijklmnop\ntail"[..]);
        let mut line = Vec::new();
        assert_eq!(read_line_bounded(&mut r, &mut line, 8).unwrap(), 3);
        assert_eq!(line, b"ab\n");
        assert_eq!(read_line_bounded(&mut r, &mut line, 8).unwrap(), 5);
        assert_eq!(line, b"cdef\n");
        assert!(read_line_bounded(&mut r, &mut line, 8).is_err(), "11 bytes");
    }

    #[test]
    fn first_redirect_histogram_renders() {
        let s = FeedStats::default();
        s.observe_first_redirect(40);
        s.observe_first_redirect(700);
        s.observe_first_redirect(400_000);
        let mut o = String::new();
        s.render(&mut o);
        assert!(
            o.contains("lasthop_engine_first_redirect_seconds_bucket{le=\"0.05\"} 1\n"),
            "{o}"
        );
        assert!(
            o.contains("lasthop_engine_first_redirect_seconds_bucket{le=\"1\"} 2\n"),
            "{o}"
        );
        assert!(
            o.contains("lasthop_engine_first_redirect_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{o}"
        );
        assert!(
            o.contains("lasthop_engine_first_redirect_seconds_sum 400.740\n"),
            "{o}"
        );
        assert!(
            o.contains("lasthop_engine_first_redirect_seconds_count 3\n"),
            "{o}"
        );
    }

    #[test]
    fn prune_keeps_the_current_and_previous() {
        let dir = tempfile::tempdir().unwrap();
        for seq in [1u64, 2, 3, 4] {
            std::fs::write(dir.path().join(format!("{seq:016x}-aa.snap")), b"x").unwrap();
        }
        prune_snapshots(dir.path(), &format!("{:016x}-aa", 3));
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            [2u64, 3, 4].map(|s| format!("{s:016x}-aa.snap")).to_vec()
        );
    }
}
