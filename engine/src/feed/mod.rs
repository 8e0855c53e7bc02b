//! The feed's control threads: the engine's subscription to the control plane
//! (`core/FEED.md` is the wire contract; docs/ARCHITECTURE.md, "Snapshots, deltas and the
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
//!   [`Published::publish`] after each burst (one generation per burst, not per frame). It spawns
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
//! [`lasthop_edge::feed_apply`] decides what every frame does to the tables and builds each
//! generation (its docs list what the overlay and the denylist hold); the applier thread here
//! feeds it, downloads what it asks for, counts, logs and publishes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lasthop_core::feed::{Frame, SnapshotFrame};
use lasthop_edge::feed_apply::{Applied, FeedView};
use lasthop_snapshot::{Snapshot, SnapshotError};

use crate::control::ControlPlanes;
use crate::metrics::prom::{family, sample};
use crate::metrics::EngineMetrics;
use crate::tables::{Published, Tables};

pub mod certificates;
mod download;
mod reader;
mod reporter;

pub use download::{
    fetch_latest, newest_local, open_verified, DownloadError, OpenError, SignatureError,
    SnapshotKeys, VerifyKeyError,
};
use download::{fetch_snapshot, prune_snapshots};

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
    /// Keys a snapshot's announcement must be signed by (none: not checked).
    pub verify_keys: SnapshotKeys,
    /// Where the branded domains' certificates are served (the HTTPS and QUIC listeners'
    /// resolver), when TLS is served: fetched when the feed announces a new generation, kept
    /// sealed in `data_dir` ([`certificates`]).
    pub certificates: Option<Arc<crate::tls::sni::Branded>>,
    /// The read-through, whose cached answers for a link the feed changes are dropped.
    pub origin: Option<Arc<crate::origin::Origin>>,
}

impl FeedConfig {
    fn snapshot_dir(&self) -> PathBuf {
        self.data_dir.join("snapshots")
    }

    /// The client of downloads (snapshots, certificates): 2 s to connect, 30 s per read.
    fn transfer_agent(&self) -> ureq::Agent {
        self.control
            .agent()
            .timeout_connect(Duration::from_secs(2))
            .timeout_read(Duration::from_secs(30))
            .build()
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
    signature_failures: AtomicU64,
    /// Since when the tables are unconfirmed (not in sync); `None` while in sync.
    unconfirmed_since: Mutex<Option<Instant>>,
    overlay_links: AtomicU64,
    denylist_codes: AtomicU64,
    publishes: AtomicU64,
    /// Denylist and overlay generations patched in place, and copied or rebuilt whole.
    table_patches: AtomicU64,
    table_copies: AtomicU64,
    /// Safe-mode redirects served from local tables because the origin could not confirm.
    unconfirmed: AtomicU64,
    first_redirect: [AtomicU64; FIRST_REDIRECT_BUCKETS.len() + 1],
    first_redirect_sum_ms: AtomicU64,
    /// Branded certificates served, refused by this engine's checks, fetches failed, the
    /// generation held, and the nearest expiry of those served (Unix ms, 0: none).
    certificates_served: AtomicU64,
    certificates_refused: AtomicU64,
    certificate_fetch_failures: AtomicU64,
    certificates_generation: AtomicU64,
    certificates_nearest_expiry_ms: AtomicU64,
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
                "lasthop_engine_snapshot_signature_failures_total",
                "counter",
                "Snapshots refused because their announcement is not signed by a pinned key (--snapshot-verify-key).",
                self.signature_failures.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_table_patches_total",
                "counter",
                "Denylist and overlay generations made by patching the spare copy with what changed.",
                self.table_patches.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_table_copies_total",
                "counter",
                "Denylist and overlay generations made whole: a new standing list, a rewind, or a core still on the generation before last.",
                self.table_copies.load(Ordering::Relaxed),
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
                "lasthop_engine_certificates",
                "gauge",
                "Branded domains whose certificate this engine serves by SNI.",
                self.certificates_served.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_certificates_refused",
                "gauge",
                "Branded domains' certificates of the last set that this engine's checks refused (key, name, validity, chain).",
                self.certificates_refused.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_certificate_fetch_failures_total",
                "counter",
                "Fetches of the branded domains' certificates that failed at every control plane.",
                self.certificate_fetch_failures.load(Ordering::Relaxed),
            ),
            (
                "lasthop_engine_certificates_generation",
                "gauge",
                "The domains' generation of the certificates served (the feed's certificates frame).",
                self.certificates_generation.load(Ordering::Relaxed),
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
        let name = "lasthop_engine_certificate_expiry_seconds";
        family(
            o,
            name,
            "gauge",
            "Seconds until the nearest expiry of the branded certificates served (absent with none).",
        );
        let nearest = self.certificates_nearest_expiry_ms.load(Ordering::Relaxed);
        if nearest > 0 {
            let left = (nearest as f64 - lasthop_core::clock::now_ms() as f64) / 1000.0;
            let _ = std::fmt::Write::write_fmt(o, format_args!("{name} {left:.0}\n"));
        }
        let name = "lasthop_engine_unconfirmed_seconds";
        family(
            o,
            name,
            "gauge",
            "Seconds since the feed last confirmed the tables (lost or catching up); 0 while in sync.",
        );
        let unconfirmed = self
            .unconfirmed_since
            .lock()
            .ok()
            .and_then(|s| *s)
            .map_or(0.0, |t| t.elapsed().as_secs_f64());
        let _ = std::fmt::Write::write_fmt(o, format_args!("{name} {unconfirmed:.3}\n"));
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
        result: Result<Arc<Snapshot>, DownloadError>,
    },
    /// SIGHUP: a snapshot file to serve if it is not older than the current one.
    Reload(Arc<Snapshot>),
    /// A certificates fetch ended.
    Certificates(Result<certificates::Fetched, String>),
}

/// The running feed: hand SIGHUP reloads to it.
#[derive(Debug)]
pub struct Feed {
    tx: Mutex<Sender<Event>>,
}

impl Feed {
    /// Serve `snapshot` if it is at least as new as the current one (SIGHUP).
    pub fn reload(&self, snapshot: Arc<Snapshot>) {
        if let Ok(tx) = self.tx.lock() {
            let _ = tx.send(Event::Reload(snapshot));
        }
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
            Event::Certificates(_) => "Certificates",
        })
    }
}

/// Starts the reader, applier and reporter threads. `base` is what the engine serves now (its
/// snapshot, if any, and marks); `snapshot_id` names that snapshot when it came from the feed.
pub fn start(
    cfg: FeedConfig,
    published: Arc<Published>,
    base: Tables,
    snapshot_id: Option<String>,
    metrics: Arc<EngineMetrics>,
    stats: Arc<FeedStats>,
) -> std::io::Result<Feed> {
    let cfg = Arc::new(cfg);
    let mut view = FeedView::new(base);
    view.set_snapshot_id(snapshot_id.clone());
    let snapshot_seq = view.snapshot_seq();
    stats.applied_seq.store(snapshot_seq, Ordering::Release);
    stats.snapshot_seq.store(snapshot_seq, Ordering::Relaxed);
    if let Ok(mut id) = stats.snapshot_id.lock() {
        id.clone_from(&snapshot_id);
    }
    stats.safe_mode.store(cfg.safe_mode, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    // The last good certificates, served before any control plane answers.
    let mut certs_held = None;
    {
        match certificates::AtRest::new(&cfg.data_dir).load() {
            Ok(Some(body)) => match certificates::parse(&body, lasthop_core::clock::now_ms()) {
                Ok(set) => {
                    tracing::info!(
                        domains = set.domains.len(),
                        certificates = set.certs.len(),
                        generation = set.generation,
                        "serving the branded domains and certificates kept on disk"
                    );
                    certs_held = Some(set.generation);
                    install(&stats, cfg.certificates.as_deref(), &mut view, set);
                }
                Err(e) => tracing::warn!(error = %e, "the certificates kept on disk do not parse"),
            },
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "the certificates kept on disk cannot be read; fetching them again")
            }
        }
    }
    let mut applier = Applier {
        cfg: Arc::clone(&cfg),
        published,
        stats: Arc::clone(&stats),
        tx: tx.clone(),
        view,
        feed_control: cfg.control.current(),
        downloading: None,
        queued: None,
        unreachable: None,
        unconfirmed_since: Some(Instant::now()),
        metrics,
        certs_held,
        certs_announced: None,
        certs_fetching: false,
        certs_failed_at: None,
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
            .spawn(move || reader::reader(&cfg, &stats, &tx))?;
    }
    {
        let (cfg, stats) = (Arc::clone(&cfg), Arc::clone(&stats));
        std::thread::Builder::new()
            .name("feed-report".into())
            .spawn(move || reporter::reporter(&cfg, &stats))?;
    }
    Ok(Feed { tx: Mutex::new(tx) })
}

/// The applier thread: a [`FeedView`] (what the frames do to the tables, pure) and what it
/// cannot do itself: threads for downloads, the counters, the log, publishing.
struct Applier {
    cfg: Arc<FeedConfig>,
    published: Arc<Published>,
    stats: Arc<FeedStats>,
    tx: Sender<Event>,
    view: FeedView,
    /// The control plane the feed comes (or last came) from: snapshots it announces are
    /// downloaded from it first.
    feed_control: usize,
    /// The snapshot being downloaded, and the newest one announced meanwhile.
    downloading: Option<SnapshotFrame>,
    queued: Option<SnapshotFrame>,
    metrics: Arc<EngineMetrics>,
    /// The last reason the feed could not be reached, as logged.
    unreachable: Option<String>,
    /// Since when the tables have not been confirmed by the feed (not in sync); `None` while
    /// in sync.
    unconfirmed_since: Option<Instant>,
    /// The certificates' generation served, the last one announced, a fetch under way, and
    /// when the last fetch failed (retried after [`CERTIFICATES_RETRY`]).
    certs_held: Option<u64>,
    certs_announced: Option<u64>,
    certs_fetching: bool,
    certs_failed_at: Option<Instant>,
}

/// A failed certificates fetch is tried again after this long.
const CERTIFICATES_RETRY: Duration = Duration::from_secs(5);

/// Serves `set` and says so in the counters and the log.
/// The domains go into the next tables published; the certificates, where this engine serves
/// TLS, to the SNI resolver.
fn install(
    stats: &FeedStats,
    branded: Option<&crate::tls::sni::Branded>,
    view: &mut FeedView,
    set: certificates::Set,
) {
    view.set_domains(Arc::new(set.domains));
    let Some(branded) = branded else {
        stats
            .certificates_generation
            .store(set.generation, Ordering::Relaxed);
        return;
    };
    for (domain, why) in &set.refused {
        tracing::warn!(%domain, reason = %why, "a branded certificate was refused; the default certificate answers for it");
    }
    stats
        .certificates_refused
        .store(set.refused.len() as u64, Ordering::Relaxed);
    stats
        .certificates_served
        .store(set.certs.len() as u64, Ordering::Relaxed);
    stats
        .certificates_generation
        .store(set.generation, Ordering::Relaxed);
    stats.certificates_nearest_expiry_ms.store(
        set.nearest_expiry_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .unwrap_or(0),
        Ordering::Relaxed,
    );
    branded.replace(set.certs, set.acme_certs);
}

impl Applier {
    fn run(&mut self, rx: &Receiver<Event>) {
        loop {
            let first = match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(ev) => ev,
                Err(RecvTimeoutError::Timeout) => {
                    if self.tick() {
                        self.publish();
                    }
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let mut dirty = self.handle(first);
            // Apply the whole burst, then publish once.
            while let Ok(ev) = rx.try_recv() {
                dirty |= self.handle(ev);
            }
            dirty |= self.tick();
            if dirty {
                self.publish();
            }
        }
    }

    /// Keeps the time unconfirmed (not in sync) and the marks' widening current; true when
    /// the published marks must widen further.
    /// A `certificates` frame: fetch the set if it is news.
    fn certificates_announced(&mut self, generation: u64) {
        self.certs_announced = Some(generation);
        self.fetch_certificates();
    }

    /// Starts a fetch when the set announced is not the one held, none is under way, and the
    /// last one did not just fail.
    fn fetch_certificates(&mut self) {
        if self.certs_fetching
            || self.certs_announced.is_none()
            || self.certs_announced == self.certs_held
            || self
                .certs_failed_at
                .is_some_and(|t| t.elapsed() < CERTIFICATES_RETRY)
        {
            return;
        }
        self.certs_fetching = true;
        let (cfg, tx, from, held) = (
            Arc::clone(&self.cfg),
            self.tx.clone(),
            self.feed_control,
            self.certs_held,
        );
        let spawned = std::thread::Builder::new()
            .name("feed-certificates".into())
            .spawn(move || {
                let _ = tx.send(Event::Certificates(certificates::fetch(&cfg, from, held)));
            });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start a certificates fetch thread");
            self.certs_fetching = false;
        }
    }

    fn certificates_fetched(&mut self, result: Result<certificates::Fetched, String>) {
        self.certs_fetching = false;
        let parsed = match result {
            Ok(certificates::Fetched::Current) => {
                // The control plane says the set held is its current one.
                self.certs_announced = self.certs_held;
                return;
            }
            Ok(certificates::Fetched::Body(body)) => {
                certificates::parse(&body, lasthop_core::clock::now_ms()).map(|set| (set, body))
            }
            Err(e) => Err(e),
        };
        match parsed {
            Ok((set, body)) => {
                if let Err(e) = certificates::AtRest::new(&self.cfg.data_dir).save(&body) {
                    tracing::warn!(error = %e, "could not keep the certificates on disk; a restart waits for the control plane");
                }
                tracing::info!(
                    domains = set.certs.len(),
                    generation = set.generation,
                    "branded certificates updated"
                );
                self.certs_held = Some(set.generation);
                self.certs_failed_at = None;
                install(
                    &self.stats,
                    self.cfg.certificates.as_deref(),
                    &mut self.view,
                    set,
                );
                self.publish();
            }
            Err(e) => {
                self.stats
                    .certificate_fetch_failures
                    .fetch_add(1, Ordering::Relaxed);
                self.certs_failed_at = Some(Instant::now());
                tracing::warn!(error = %e, "fetching the branded certificates failed; serving the ones held");
            }
        }
    }

    fn tick(&mut self) -> bool {
        self.fetch_certificates();
        match (self.view.in_sync(), self.unconfirmed_since) {
            (true, Some(_)) => self.unconfirmed_since = None,
            (false, None) => self.unconfirmed_since = Some(Instant::now()),
            _ => {}
        }
        let ms = self.unconfirmed_since.map_or(0, |t| {
            u64::try_from(t.elapsed().as_millis()).unwrap_or(u64::MAX)
        });
        if let Ok(mut since) = self.stats.unconfirmed_since.lock() {
            *since = self.unconfirmed_since;
        }
        self.view.set_unconfirmed(ms)
    }

    /// Applies one event; true when the tables changed.
    fn handle(&mut self, ev: Event) -> bool {
        let was_in_sync = self.view.in_sync();
        let changed = match ev {
            Event::Connected(control) => {
                self.view.connected();
                self.feed_control = control;
                self.stats.connected.store(true, Ordering::Release);
                self.stats.connects.fetch_add(1, Ordering::Relaxed);
                false
            }
            Event::Lost(why) => {
                if self.view.lost() {
                    tracing::warn!(reason = %why, "feed lost; safe mode until it is back");
                    self.stats.losses.fetch_add(1, Ordering::Relaxed);
                } else if self.unreachable.as_deref() != Some(why.as_str()) {
                    // Once per distinct reason (a refused certificate, a refused connection),
                    // so an engine that never subscribes says why without flooding the log.
                    tracing::warn!(reason = %why, "feed unreachable");
                } else {
                    tracing::debug!(reason = %why, "feed still unreachable");
                }
                self.unreachable = Some(why);
                self.stats.connected.store(false, Ordering::Release);
                false
            }
            Event::Frame(frame) => self.apply(frame),
            Event::Downloaded { frame, result } => self.downloaded(frame, result),
            Event::Certificates(result) => {
                self.certificates_fetched(result);
                false
            }
            Event::Reload(snapshot) => {
                let (seq, serving) = (snapshot.sequence(), self.view.snapshot_seq());
                if seq >= serving {
                    self.swap_snapshot(snapshot, None)
                } else {
                    tracing::warn!(
                        file = seq,
                        serving,
                        "SIGHUP: the snapshot file is older than the one being served; kept"
                    );
                    false
                }
            }
        };
        self.stats
            .applied_seq
            .store(self.view.applied(), Ordering::Release);
        if let Some(t) = self.view.target() {
            self.stats.last_seq.store(t, Ordering::Relaxed);
        }
        let now_in_sync = self.view.in_sync();
        if now_in_sync != was_in_sync {
            tracing::info!(
                in_sync = now_in_sync,
                applied = self.view.applied(),
                "feed state"
            );
        }
        // The caught-up flag and the health flag follow in `publish`, after the tables they
        // describe are out: whoever reads "in sync" can rely on what it then gets served.
        changed || now_in_sync != was_in_sync
    }

    fn apply(&mut self, frame: Frame) -> bool {
        if let (Some(origin), Frame::LinkCreated(f) | Frame::StateChanged(f)) =
            (&self.cfg.origin, &frame)
        {
            // Before the tables change: a lookup that misses them after this finds no
            // answer cached from before the change.
            origin.forget([f.code.as_bytes()]);
        }
        match self.view.apply(frame) {
            Applied::Changed => true,
            Applied::Download(s) => {
                self.announce(s);
                false
            }
            Applied::Rewound { control, applied } => {
                tracing::warn!(
                    control,
                    applied,
                    "the control plane's change log is behind this engine's (restored from \
                     an older backup?); new changes will be applied from its sequence on"
                );
                false
            }
            Applied::OrphanPart { part } => {
                tracing::warn!(part, "denylist part without its first part; ignored");
                false
            }
            Applied::Certificates { generation } => {
                self.certificates_announced(generation);
                false
            }
            Applied::Nothing => false,
        }
    }

    /// A snapshot worth having was announced: download it, or queue it behind the download
    /// under way.
    fn announce(&mut self, s: SnapshotFrame) {
        match &self.downloading {
            Some(d) if d.id == s.id => {}
            Some(_) => self.queued = Some(s),
            None => self.download(s),
        }
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

    fn downloaded(
        &mut self,
        frame: SnapshotFrame,
        result: Result<Arc<Snapshot>, DownloadError>,
    ) -> bool {
        self.downloading = None;
        let changed = match result {
            Ok(snapshot) if self.view.wants_snapshot(frame.seq, &frame.id) => {
                self.stats.downloads_ok.fetch_add(1, Ordering::Relaxed);
                self.swap_snapshot(snapshot, Some(frame.id.clone()))
            }
            Ok(_) => false,
            Err(e) => {
                self.stats.downloads_failed.fetch_add(1, Ordering::Relaxed);
                if matches!(e, DownloadError::Signature { .. }) {
                    self.stats
                        .signature_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::error!(id = %frame.id, error = %e, "snapshot refused: its signature does not verify; serving the one we have");
                } else {
                    tracing::warn!(id = %frame.id, error = %e, "snapshot download failed");
                }
                // Every control plane was tried; retried when one announces it again (next
                // subscription).
                false
            }
        };
        if let Some(next) = self.queued.take() {
            if self.view.wants_snapshot(next.seq, &next.id) {
                self.announce(next);
            }
        }
        changed
    }

    fn swap_snapshot(&mut self, snapshot: Arc<Snapshot>, id: Option<String>) -> bool {
        if let Err(e) = self
            .view
            .swap_snapshot(Arc::clone(&snapshot), id.as_deref())
        {
            tracing::error!(error = %e, "refusing snapshot");
            return false;
        }
        let seq = snapshot.sequence();
        self.stats.snapshot_seq.store(seq, Ordering::Relaxed);
        if let Ok(mut current) = self.stats.snapshot_id.lock() {
            current.clone_from(&id);
        }
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
        let tables = self.view.tables(self.cfg.safe_mode);
        let stats = &self.stats;
        stats.safe_mode.store(tables.safe_mode, Ordering::Relaxed);
        stats
            .overlay_links
            .store(tables.overlay.len() as u64, Ordering::Relaxed);
        stats
            .denylist_codes
            .store(tables.denylist.len() as u64, Ordering::Relaxed);
        self.published.publish(tables);
        stats.publishes.fetch_add(1, Ordering::Relaxed);
        let made = self.view.publish_stats();
        stats.table_patches.store(made.in_place, Ordering::Relaxed);
        stats
            .table_copies
            .store(made.copied + made.rebuilt, Ordering::Relaxed);
        stats
            .caught_up
            .store(self.view.caught_up(), Ordering::Release);
        self.metrics
            .health
            .feed_lost
            .store(!self.view.in_sync(), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
