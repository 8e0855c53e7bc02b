//! The scanner: every new link is checked after its 201 (never inside the create: a third
//! party in the create path would be in its latency and its availability), and every live
//! link is checked again on a schedule, because a check at creation is defeated by the time
//! bomb (a harmless page that turns malicious next week).
//!
//! The checks, strictest verdict wins:
//! 1. the reputation lists → `block` (as the list: `list:<name>`);
//! 2. the heuristics of [`lasthop_trust::heuristics`] → `warn`;
//! 3. with `--scan-webhook URL`, the verdict service: `POST {"url": ...}` →
//!    `{"verdict": "clean"|"warn"|"block", "reason": ...}`, with a timeout, retries and a
//!    breaker: after 3 calls in a row that failed every retry, the service is skipped for 30 s
//!    (counted as `skipped`), so a dead or hanging service costs each link nothing but its
//!    own absent verdict. A failing service never blocks creation and never keeps a held link
//!    held: the verdict is then made from the local checks.
//!
//! The first scans tail the change log (every creation is in it) from a cursor the store keeps
//! in the verdicts' own transaction, so a crash between a 201 and its verdict loses no first
//! scan, and a create pays nothing for being scanned: an earlier design queued each new code in
//! a table of the create's transaction and cost a fifth of the creates/s.
//! The re-scan walks the store in key order at `links / --rescan-interval` a second (at most
//! `--rescan-max-rate`), so a sweep is spread evenly over the interval; it starts again from
//! the beginning after a restart.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use lasthop_core::Hold;
use lasthop_trust::heuristics::Heuristics;
use lasthop_trust::Destination;
use serde::Deserialize;
use url::Url;

use super::Safety;
use crate::error_chain::ErrorChain;
use crate::store::{
    Actor, Batch, BatchUpdate, StateUpdate, StoreError, StoredLink, Verdict, RESCAN_POSITION,
    SCAN_POSITION,
};

/// Links scanned per batch.
const PAGE: usize = 128;
/// Consecutive failed calls that open the webhook's breaker, and how long it stays open.
const BREAKER_FAILURES: u32 = 3;
const BREAKER_OPEN: Duration = Duration::from_secs(30);
/// Longest verdict reason kept.
const MAX_REASON: usize = 200;
/// The first scans' position, as saved.
fn scan_position(seq: u64) -> Vec<(String, String)> {
    vec![(SCAN_POSITION.to_string(), seq.to_string())]
}

/// How often the first scans' cursor is saved while only state changes go by.
const CURSOR_EVERY: Duration = Duration::from_secs(5);

/// What a verdict judges.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Judged {
    /// The link's destination (`held`: the link waits on an `unverified` hold).
    Link { held: bool },
    /// An edit's destination, whose hash is `to` ([`StateUpdate::EditVerdict`]).
    Edit { to: String },
}

/// The edited destination `s` waits to have judged, if any: a pending edit's, else one
/// served unjudged.
fn edit_to_judge(s: &StoredLink) -> Option<(String, String)> {
    if s.state.deleted {
        return None;
    }
    let url = match (&s.state.pending_destination, &s.state.destination) {
        (Some(p), _) => p,
        (None, Some(d)) if s.state.destination_unscanned => d,
        _ => return None,
    };
    Some((s.link.code.clone(), url.clone()))
}

/// Settings of the scanner.
#[derive(Debug, Clone)]
pub struct ScannerConfig {
    pub webhook: Option<WebhookConfig>,
    /// A whole re-scan sweep takes this long.
    pub rescan_interval: Duration,
    /// Links re-checked a second, at most.
    pub rescan_max_rate: f64,
}

/// The verdict service.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    pub url: String,
    /// Per attempt.
    pub timeout: Duration,
    /// Attempts after the first.
    pub retries: u32,
    /// Calls in flight at once.
    pub concurrency: usize,
}

/// A verdict and who gave it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evaluation {
    pub verdict: Verdict,
    pub actor: Actor,
    pub reason: String,
}

#[derive(Debug, Deserialize)]
struct WebhookReply {
    verdict: String,
    #[serde(default)]
    reason: Option<String>,
}

/// Why a webhook call gave no verdict (the metric's `kind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallError {
    Timeout,
    Connect,
    Status,
    Garbage,
}

impl CallError {
    fn kind(self) -> &'static str {
        match self {
            CallError::Timeout => "timeout",
            CallError::Connect => "connect",
            CallError::Status => "status",
            CallError::Garbage => "garbage",
        }
    }
}

#[derive(Debug, Default)]
struct Breaker {
    failures: u32,
    open_until: Option<Instant>,
}

struct Webhook {
    agent: ureq::Agent,
    config: WebhookConfig,
    breaker: Mutex<Breaker>,
    /// Calls in flight, at most `config.concurrency` across the first scans and the re-scan.
    in_flight: Mutex<usize>,
    slot_free: std::sync::Condvar,
}

/// A held place among the webhook's calls in flight.
struct Slot<'a>(&'a Webhook);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(mut n) = self.0.in_flight.lock() {
            *n = n.saturating_sub(1);
        }
        self.0.slot_free.notify_one();
    }
}

impl Webhook {
    fn new(config: WebhookConfig) -> Webhook {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(config.timeout)
            .timeout(config.timeout)
            .redirects(0)
            .build();
        Webhook {
            agent,
            config,
            breaker: Mutex::new(Breaker::default()),
            in_flight: Mutex::new(0),
            slot_free: std::sync::Condvar::new(),
        }
    }

    /// Waits for a place among the calls in flight.
    fn slot(&self) -> Slot<'_> {
        let limit = self.config.concurrency.max(1);
        if let Ok(mut n) = self.in_flight.lock() {
            while *n >= limit {
                n = match self.slot_free.wait(n) {
                    Ok(n) => n,
                    Err(_) => return Slot(self),
                };
            }
            *n += 1;
        }
        Slot(self)
    }

    fn call_once(&self, long_url: &str) -> Result<(Verdict, Option<String>), CallError> {
        let resp = self
            .agent
            .post(&self.config.url)
            .set("Content-Type", "application/json")
            .send_json(serde_json::json!({ "url": long_url }));
        let resp = match resp {
            Ok(r) => r,
            Err(ureq::Error::Status(..)) => return Err(CallError::Status),
            Err(ureq::Error::Transport(t)) => {
                let text = t.to_string().to_ascii_lowercase();
                return Err(if text.contains("timed out") || text.contains("timeout") {
                    CallError::Timeout
                } else {
                    CallError::Connect
                });
            }
        };
        let body = resp.into_string().map_err(|e| {
            if e.kind() == std::io::ErrorKind::TimedOut
                || e.kind() == std::io::ErrorKind::WouldBlock
            {
                CallError::Timeout
            } else {
                CallError::Garbage
            }
        })?;
        let reply: WebhookReply = serde_json::from_str(&body).map_err(|_| CallError::Garbage)?;
        let verdict = match reply.verdict.as_str() {
            "clean" => Verdict::Clean,
            "warn" => Verdict::Warn,
            "block" => Verdict::Block,
            _ => return Err(CallError::Garbage),
        };
        let reason = reply.reason.map(|r| {
            r.chars()
                .filter(|c| !c.is_control())
                .take(MAX_REASON)
                .collect::<String>()
        });
        Ok((verdict, reason.filter(|r| !r.trim().is_empty())))
    }

    /// The service's verdict, or `None` when it gave none (every attempt failed, or the
    /// breaker is open).
    fn verdict(
        &self,
        long_url: &str,
        metrics: &crate::metrics::Metrics,
    ) -> Option<(Verdict, Option<String>)> {
        if let Ok(b) = self.breaker.lock() {
            if b.open_until.is_some_and(|t| Instant::now() < t) {
                metrics
                    .scan_webhook_errors
                    .with_label_values(&["skipped"])
                    .inc();
                return None;
            }
        }
        let _slot = self.slot();
        let mut backoff = Duration::from_millis(100);
        for attempt in 0..=self.config.retries {
            match self.call_once(long_url) {
                Ok(v) => {
                    if let Ok(mut b) = self.breaker.lock() {
                        *b = Breaker::default();
                    }
                    return Some(v);
                }
                Err(e) => {
                    metrics
                        .scan_webhook_errors
                        .with_label_values(&[e.kind()])
                        .inc();
                    tracing::debug!(attempt, kind = e.kind(), "verdict webhook call failed");
                    if attempt < self.config.retries {
                        std::thread::sleep(backoff);
                        backoff *= 4;
                    }
                }
            }
        }
        if let Ok(mut b) = self.breaker.lock() {
            b.failures += 1;
            if b.failures >= BREAKER_FAILURES {
                tracing::warn!(url = %self.config.url, "verdict webhook failing; skipped for 30 s (local checks only)");
                b.open_until = Some(Instant::now() + BREAKER_OPEN);
                b.failures = 0;
            }
        }
        None
    }
}

/// The scanner's threads' shared part.
pub struct Scanner {
    safety: Arc<Safety>,
    heuristics: Heuristics,
    webhook: Option<Webhook>,
    config: ScannerConfig,
}

impl std::fmt::Debug for Scanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scanner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Why the scanner could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ScannerError {
    /// Reading the first scans' position, or the change log's end, from the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A scanner thread could not be started.
    #[error(transparent)]
    Thread(#[from] std::io::Error),
}

/// Running scanner threads; stop them with [`ScannerThreads::stop`].
#[derive(Debug)]
pub struct ScannerThreads {
    stop: Arc<AtomicBool>,
    wake: mpsc::Sender<()>,
    threads: Vec<JoinHandle<()>>,
}

impl ScannerThreads {
    /// Stops and joins every thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.wake.send(());
        for t in self.threads {
            if t.join().is_err() {
                tracing::error!("a scanner thread panicked");
            }
        }
    }
}

/// The shared store's leader lock for the scanner.
pub const SCANNER_LOCK: &str = "scanner";

/// The scanner on a store several control planes share: only the holder of the
/// [`SCANNER_LOCK`] runs it (so every link is scanned once and the webhook is called once),
/// from the cursors the store keeps; the others wait to take over if it stops or its
/// connection is lost. The leader's first scans are woken by its own creates and otherwise
/// look at the log every second, so a link created through another control plane gets its
/// verdict within about a second.
#[derive(Debug)]
pub struct LeadingScanner {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl LeadingScanner {
    /// Starts competing for the lock.
    pub fn spawn(
        safety: Arc<Safety>,
        config: ScannerConfig,
        shared: Arc<dyn crate::store::Shared>,
    ) -> Result<LeadingScanner, ScannerError> {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name("scan-lead".into())
                .spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let lead = match shared.try_lead(SCANNER_LOCK) {
                            Ok(Some(lead)) => lead,
                            Ok(None) => {
                                Scanner::sleep_until(
                                    &stop,
                                    Instant::now() + Duration::from_secs(2),
                                );
                                continue;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "scanner: taking the leader lock");
                                Scanner::sleep_until(
                                    &stop,
                                    Instant::now() + Duration::from_secs(2),
                                );
                                continue;
                            }
                        };
                        match Scanner::spawn(Arc::clone(&safety), config.clone()) {
                            Ok(threads) => {
                                tracing::info!("this control plane runs the scanner");
                                while lead.held() && !stop.load(Ordering::Relaxed) {
                                    std::thread::sleep(Duration::from_millis(200));
                                }
                                if !lead.held() {
                                    tracing::warn!("scanner: lost the leader lock; stopping");
                                }
                                threads.stop();
                                safety.metrics().scanner_leader.set(0);
                            }
                            Err(e) => {
                                tracing::error!(error = %ErrorChain(&e), "scanner: starting");
                                Scanner::sleep_until(
                                    &stop,
                                    Instant::now() + Duration::from_secs(2),
                                );
                            }
                        }
                    }
                })?
        };
        Ok(LeadingScanner { stop, thread })
    }

    /// Stops scanning (handing the lock to another control plane) and joins.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        if self.thread.join().is_err() {
            tracing::error!("the scanner's leader thread panicked");
        }
    }
}

fn strictest(a: Evaluation, b: Evaluation) -> Evaluation {
    let rank = |v: Verdict| match v {
        Verdict::Clean => 0,
        Verdict::Warn => 1,
        Verdict::Block => 2,
    };
    if rank(b.verdict) > rank(a.verdict) {
        b
    } else {
        a
    }
}

impl Scanner {
    /// Starts the first-scan and re-scan threads.
    pub fn spawn(
        safety: Arc<Safety>,
        config: ScannerConfig,
    ) -> Result<ScannerThreads, ScannerError> {
        let scanner = Arc::new(Scanner {
            heuristics: Heuristics::new(lasthop_core::alias::brands().iter().copied()),
            webhook: config.webhook.clone().map(Webhook::new),
            safety: Arc::clone(&safety),
            config,
        });
        // Where the first scans start, settled before any create can be answered: the stored
        // cursor, or on a first start the log's end (older links are the re-scan's), saved.
        let store = safety.store();
        let saved = store.position(SCAN_POSITION)?;
        let cursor = match saved.as_deref().map(str::parse::<u64>) {
            Some(Ok(c)) => c,
            _ => {
                let c = store.last_seq()?;
                scanner.save_position(SCAN_POSITION, c.to_string());
                c
            }
        };
        let stop = Arc::new(AtomicBool::new(false));
        let (wake, woken) = mpsc::channel();
        safety.set_scan_wake(wake.clone());
        let first = {
            let (s, stop) = (Arc::clone(&scanner), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("scan-new".into())
                .spawn(move || s.scan_new(cursor, &stop, &woken))?
        };
        let rescan = {
            let (s, stop) = (Arc::clone(&scanner), Arc::clone(&stop));
            std::thread::Builder::new()
                .name("rescan".into())
                .spawn(move || s.rescan(&stop))?
        };
        safety.metrics().scanner_leader.set(1);
        Ok(ScannerThreads {
            stop,
            wake,
            threads: vec![first, rescan],
        })
    }

    /// The verdict on one link's destination.
    pub fn evaluate(&self, long_url: &str) -> Evaluation {
        let clean = Evaluation {
            verdict: Verdict::Clean,
            actor: Actor::Scanner,
            reason: "clean".to_string(),
        };
        let Ok(url) = Url::parse(long_url) else {
            return clean;
        };
        let Some(dest) = Destination::of_url(&url) else {
            return clean;
        };
        if let Some(hit) = self.safety.lists().check(&dest) {
            return Evaluation {
                verdict: Verdict::Block,
                reason: format!("list:{}", hit.list),
                actor: Actor::List(hit.list),
            };
        }
        let mut best = clean;
        if let Some(signal) = self.heuristics.check(&url, &dest).first() {
            best = Evaluation {
                verdict: Verdict::Warn,
                actor: Actor::Scanner,
                reason: signal.reason(),
            };
        }
        if let Some(webhook) = &self.webhook {
            if let Some((verdict, reason)) = webhook.verdict(long_url, self.safety.metrics()) {
                let reason = match reason {
                    Some(r) => format!("webhook:{r}"),
                    None => format!("webhook:{}", verdict.as_str()),
                };
                best = strictest(
                    best,
                    Evaluation {
                        verdict,
                        actor: Actor::Scanner,
                        reason,
                    },
                );
            }
        }
        best
    }

    /// Evaluates `links` (in parallel when a webhook is configured).
    fn evaluate_all(&self, links: &[StoredLink]) -> Vec<Evaluation> {
        let workers = self
            .webhook
            .as_ref()
            .map_or(1, |w| w.config.concurrency.max(1))
            .min(links.len().max(1));
        if workers == 1 {
            return links
                .iter()
                .map(|s| self.evaluate(s.state.url(&s.link)))
                .collect();
        }
        let next = AtomicUsize::new(0);
        let results: Vec<Mutex<Option<Evaluation>>> =
            links.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|scope| {
            for _ in 0..workers {
                scope.spawn(|| loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(s) = links.get(i) else { break };
                    let e = self.evaluate(s.state.url(&s.link));
                    if let Some(slot) = results.get(i) {
                        if let Ok(mut slot) = slot.lock() {
                            *slot = Some(e);
                        }
                    }
                });
            }
        });
        results
            .into_iter()
            .map(|m| {
                m.into_inner().ok().flatten().unwrap_or(Evaluation {
                    verdict: Verdict::Clean,
                    actor: Actor::Scanner,
                    reason: "clean".into(),
                })
            })
            .collect()
    }

    /// Commits `evaluated` (code, verdict, what it judged) grouped by actor, one batch each; a
    /// clean verdict on a link that is not held changes nothing and is not sent (one on an
    /// edit is: it ends the edit's wait). `positions` (the walk's new position) go with the
    /// last batch, or alone.
    fn commit(
        &self,
        evaluated: Vec<(String, Evaluation, Judged)>,
        mut positions: Vec<(String, String)>,
        first: bool,
    ) -> Result<(), StoreError> {
        let metrics = self.safety.metrics();
        let pass = if first { "new" } else { "rescan" };
        let mut groups: Vec<(Actor, Vec<BatchUpdate>)> = Vec::new();
        for (code, e, judged) in evaluated {
            metrics
                .scan_verdicts
                .with_label_values(&[e.verdict.as_str(), pass])
                .inc();
            let update = match judged {
                Judged::Link { held: false } if e.verdict == Verdict::Clean => continue,
                Judged::Link { .. } => StateUpdate::Verdict {
                    verdict: e.verdict,
                    reason: e.reason,
                },
                Judged::Edit { to } => StateUpdate::EditVerdict {
                    verdict: e.verdict,
                    reason: e.reason,
                    to,
                },
            };
            let update = BatchUpdate { code, update };
            match groups.iter_mut().find(|(a, _)| *a == e.actor) {
                Some((_, updates)) => updates.push(update),
                None => groups.push((e.actor, vec![update])),
            }
        }
        if groups.is_empty() && !positions.is_empty() {
            groups.push((Actor::Scanner, Vec::new()));
        }
        let last = groups.len().saturating_sub(1);
        for (i, (actor, updates)) in groups.into_iter().enumerate() {
            let source = if matches!(actor, Actor::List(_)) {
                "list"
            } else {
                "scanner"
            };
            let results = self.safety.store().apply_batch(Batch {
                updates,
                actor,
                now_ms: crate::clock::now_ms(),
                mark_changed: None,
                unmark: None,
                positions: if i == last {
                    std::mem::take(&mut positions)
                } else {
                    Vec::new()
                },
            })?;
            for r in results.iter().filter(|r| r.changed) {
                let Some(s) = &r.link else { continue };
                if s.state.takedown_reason.is_some() || s.state.warn {
                    metrics.safety_actions.with_label_values(&[source]).inc();
                    tracing::warn!(code = %r.code, state = ?s.state, "scanner verdict applied");
                }
            }
        }
        Ok(())
    }

    /// The edits to judge among the links `codes` as they are now: (code, destination). A
    /// link created with an edit (imported, replicated) that waits on an `unverified` hold is
    /// added to `created`, to be judged as it is now.
    fn edits_to_judge(
        &self,
        codes: &[String],
        created: &mut Vec<StoredLink>,
    ) -> Result<Vec<(String, String)>, StoreError> {
        if codes.is_empty() {
            return Ok(Vec::new());
        }
        let found = self.safety.store().get_many(codes)?;
        let edits = found.iter().flatten().filter_map(edit_to_judge).collect();
        created.extend(
            found
                .into_iter()
                .flatten()
                .filter(|s| !s.state.deleted && s.state.held == Some(Hold::Unverified)),
        );
        Ok(edits)
    }

    /// The first scans: tails the change log from the stored cursor and checks every link
    /// created there (as it is now: one deleted since is skipped), committing the verdicts with
    /// the new cursor. Pages of changes without creations only move the cursor, persisted at
    /// most every few seconds.
    fn scan_new(&self, mut cursor: u64, stop: &AtomicBool, woken: &mpsc::Receiver<()>) {
        let store = Arc::clone(self.safety.store());
        let mut persisted = Some(cursor);
        let mut persisted_at = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            // One look at the log answers every wake sent so far.
            while woken.try_recv().is_ok() {}
            let changes = match store.changes_since(cursor, PAGE) {
                Ok(c) => c,
                Err(e) => {
                    tracing::error!(error = %e, "scanner: reading the change log");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            let Some(&(last, _)) = changes.last() else {
                if persisted != Some(cursor) && persisted_at.elapsed() > CURSOR_EVERY {
                    match self.commit(Vec::new(), scan_position(cursor), true) {
                        Ok(()) => persisted = Some(cursor),
                        Err(e) => tracing::error!(error = %e, "scanner: saving its cursor"),
                    }
                    persisted_at = Instant::now();
                }
                // Wait for a new link (or a second, to notice anything a missed wake left).
                let _ = woken.recv_timeout(Duration::from_secs(1));
                continue;
            };
            // The creation entries carry the link as it was made; a verdict on one deleted or
            // changed since is harmless (a deleted link's state is final, a pinned one ignores
            // verdicts, verdicts only tighten), so nothing is read back. A state change that
            // marks an edit to judge names the link only: its destination is read as it is now.
            let mut edited = Vec::new();
            let mut links: Vec<StoredLink> = changes
                .into_iter()
                .filter_map(|(seq, c)| match c {
                    // Imported or replicated with an edit: the log has the mark, not the URL.
                    lasthop_core::Change::LinkCreated { link, state }
                        if state.destination.is_some() || state.pending_destination.is_some() =>
                    {
                        if !edited.contains(&link.code) {
                            edited.push(link.code);
                        }
                        None
                    }
                    lasthop_core::Change::LinkCreated { link, state } => {
                        Some(StoredLink { link, state, seq })
                    }
                    lasthop_core::Change::StateChanged { code, state } => {
                        if state.edit_to_scan() && !edited.contains(&code) {
                            edited.push(code);
                        }
                        None
                    }
                })
                .collect();
            let edits = match self.edits_to_judge(&edited, &mut links) {
                Ok(edits) => edits,
                Err(e) => {
                    tracing::error!(error = %e, "scanner: reading edited links");
                    std::thread::sleep(Duration::from_secs(1));
                    continue;
                }
            };
            if links.is_empty() && edits.is_empty() {
                cursor = last;
                continue;
            }
            // A URL deleted since must not travel to the verdict service: with one, the links
            // are read back as they are now.
            let links = if self.webhook.is_some() {
                let codes: Vec<String> = links.iter().map(|s| s.link.code.clone()).collect();
                match store.get_many(&codes) {
                    Ok(found) => found
                        .into_iter()
                        .flatten()
                        .filter(|s| !s.state.deleted)
                        .collect(),
                    Err(e) => {
                        tracing::error!(error = %e, "scanner: reading links");
                        std::thread::sleep(Duration::from_secs(1));
                        continue;
                    }
                }
            } else {
                links
            };
            let evaluations = self.evaluate_all(&links);
            let now = crate::clock::now_ms();
            let mut evaluated = Vec::with_capacity(links.len());
            for (s, e) in links.iter().zip(evaluations) {
                let waited = (now - s.link.created_at_ms).max(0) as f64 / 1000.0;
                self.safety
                    .metrics()
                    .scan_first_verdict_seconds
                    .observe(waited);
                let held = s.state.held == Some(Hold::Unverified);
                if held {
                    tracing::info!(code = %s.link.code, verdict = e.verdict.as_str(), reason = %e.reason, "first verdict of a held link");
                }
                evaluated.push((s.link.code.clone(), e, Judged::Link { held }));
            }
            for (code, url) in edits {
                let e = self.evaluate(&url);
                tracing::info!(%code, verdict = e.verdict.as_str(), reason = %e.reason, "first verdict of an edited destination");
                let to = crate::store::destination_hash(&url);
                evaluated.push((code, e, Judged::Edit { to }));
            }
            // The cursor travels with verdicts that change something; a page of clean ones
            // only moves it in memory, saved every few seconds: each save is a write in the
            // creates' group commits, and one a page cost a tenth of the creates/s. A crash
            // re-scans those seconds, which is harmless.
            let acts = evaluated.iter().any(|(_, e, judged)| {
                !matches!(judged, Judged::Link { held: false }) || e.verdict != Verdict::Clean
            });
            let save = acts || persisted_at.elapsed() >= CURSOR_EVERY;
            let positions = if save {
                scan_position(last)
            } else {
                Vec::new()
            };
            match self.commit(evaluated, positions, true) {
                Ok(()) => {
                    cursor = last;
                    if save {
                        persisted = Some(last);
                        persisted_at = Instant::now();
                    }
                }
                Err(e) => {
                    tracing::error!(error = %e, "scanner: committing verdicts");
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    }

    /// Sleeps until `until` or a stop; false when stopped.
    fn sleep_until(stop: &AtomicBool, until: Instant) -> bool {
        loop {
            if stop.load(Ordering::Relaxed) {
                return false;
            }
            let now = Instant::now();
            if now >= until {
                return true;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(200)));
        }
    }

    /// Saves a walk's position in a batch of its own.
    fn save_position(&self, name: &str, value: String) {
        let saved = self.safety.store().apply_batch(Batch {
            updates: Vec::new(),
            actor: Actor::Scanner,
            now_ms: crate::clock::now_ms(),
            mark_changed: None,
            unmark: None,
            positions: vec![(name.to_string(), value)],
        });
        if let Err(e) = saved {
            tracing::error!(error = %e, name, "scanner: saving a position");
        }
    }

    /// The re-scan: walks every live link in key order, paced at `links / --rescan-interval` a
    /// second (recomputed every page, so a store that grows is still covered within one
    /// interval), at most `--rescan-max-rate`, and never faster to make up for time lost (no
    /// credit is banked). Its position (`<sweep start ms> <cursor>`) is saved every few seconds,
    /// so a restart resumes the sweep instead of starting over.
    fn rescan(&self, stop: &AtomicBool) {
        let store = Arc::clone(self.safety.store());
        let interval_ms = i64::try_from(self.config.rescan_interval.as_millis())
            .unwrap_or(i64::MAX)
            .max(1000);
        let saved = store.position(RESCAN_POSITION).ok().flatten();
        let (mut started_ms, mut after) = saved
            .as_deref()
            .and_then(|p| {
                let (start, cursor) = p.split_once(' ')?;
                let start: i64 = start.parse().ok()?;
                Some((start, (!cursor.is_empty()).then(|| cursor.to_string())))
            })
            .unwrap_or((crate::clock::now_ms(), None));
        let mut next_at = Instant::now();
        let mut saved_at = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let (links, next) = match store.scan_links(after.as_deref(), PAGE) {
                Ok(p) => p,
                Err(StoreError::BadCursor) => {
                    // A position from another layout: start the sweep over.
                    after = None;
                    continue;
                }
                Err(e) => {
                    tracing::error!(error = %e, "re-scan: reading links; retrying");
                    if !Self::sleep_until(stop, Instant::now() + Duration::from_secs(5)) {
                        return;
                    }
                    continue;
                }
            };
            let total = store.count_links().unwrap_or(0).max(1) as f64;
            let rate = (total * 1000.0 / interval_ms as f64)
                .min(self.config.rescan_max_rate)
                .max(0.001);
            let step = Duration::from_secs_f64(1.0 / rate);
            next_at = next_at.max(Instant::now());
            let live: Vec<StoredLink> = links
                .into_iter()
                .filter(|s| !s.state.deleted && s.state.takedown_reason.is_none())
                .collect();
            for chunk in live.chunks(16) {
                next_at += step * chunk.len() as u32;
                if !Self::sleep_until(stop, next_at) {
                    return;
                }
                let evaluations = self.evaluate_all(chunk);
                self.safety
                    .metrics()
                    .rescan_checked
                    .inc_by(chunk.len() as u64);
                let mut evaluated: Vec<_> = chunk
                    .iter()
                    .zip(evaluations)
                    .map(|(s, e)| {
                        let held = s.state.held == Some(Hold::Unverified);
                        (s.link.code.clone(), e, Judged::Link { held })
                    })
                    .collect();
                // An edit whose first verdict a crash lost is judged here.
                for (code, url) in chunk.iter().filter_map(edit_to_judge) {
                    let to = crate::store::destination_hash(&url);
                    evaluated.push((code, self.evaluate(&url), Judged::Edit { to }));
                }
                if let Err(e) = self.commit(evaluated, Vec::new(), false) {
                    tracing::error!(error = %e, "re-scan: committing verdicts");
                }
            }
            match next {
                Some(n) => {
                    if saved_at.elapsed() >= CURSOR_EVERY {
                        self.save_position(RESCAN_POSITION, format!("{started_ms} {n}"));
                        saved_at = Instant::now();
                    }
                    after = Some(n);
                }
                None => {
                    // The sweep is done; the next starts an interval after this one did.
                    self.safety.metrics().rescan_sweeps.inc();
                    let next_start = started_ms.saturating_add(interval_ms);
                    self.save_position(RESCAN_POSITION, format!("{next_start} "));
                    saved_at = Instant::now();
                    let wait = u64::try_from(next_start - crate::clock::now_ms()).unwrap_or(0);
                    if !Self::sleep_until(stop, Instant::now() + Duration::from_millis(wait)) {
                        return;
                    }
                    started_ms = next_start.max(crate::clock::now_ms() - interval_ms);
                    after = None;
                }
            }
        }
    }
}
