//! The engines' status reports (core/FEED.md, "Status reports"): the fleet the control plane
//! expects.
//!
//! Pure bookkeeping: every method takes the current change-log sequence and `now` from its
//! caller, so lag arithmetic is tested without clocks or sockets. An engine, once heard from,
//! stays on the list until an admin removes it (`DELETE /v1/edges/{engine}`): one that goes
//! silent for [`MISSING_AFTER_MS`] is `missing`, its lag keeps growing, and so the lag alarm
//! stays raised, which is the point (an engine nobody hears from may be serving stale
//! tables). Only an engine silent for [`FORGET_AFTER_MS`] is dropped by itself.
//!
//! The list survives restarts: with the embedded store it is saved to `DATA_DIR/fleet.json`
//! ([`Fleet::with_file`]: at once when an engine joins or leaves, else at most every
//! [`SAVE_EVERY_MS`]); with several control planes on one store each engine reports to one of
//! them, so every report is also written to the store ([`Fleet::persist`]) and every control
//! plane folds the others' into its view ([`Fleet::refresh`], every couple of seconds and
//! before `GET /v1/edges`): the fleet list, the lag gauges and snapshot garbage collection see
//! every engine whichever control plane it talks to.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use lasthop_core::feed::StatusReport;
use serde::{Deserialize, Serialize};

use crate::store::{Shared, StoreError};

/// How long a report keeps the snapshot it names from garbage collection.
pub const REPORT_TTL_MS: i64 = 10 * 60 * 1000;
/// Silent this long (ten missed reports), an engine is `missing`.
pub const MISSING_AFTER_MS: i64 = 10_000;
/// Silent this long, an engine is forgotten without an admin's `DELETE`.
pub const FORGET_AFTER_MS: i64 = 7 * 24 * 3600 * 1000;
/// The saved fleet file is rewritten at most this often for reports alone.
pub const SAVE_EVERY_MS: i64 = 5_000;
/// Most engines remembered at once: reports from more are refused, so a misconfigured fleet
/// (say, a random engine id per start) cannot grow this map without bound.
pub const MAX_ENGINES: usize = 10_000;

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    report: StatusReport,
    /// Control-plane clock when the report arrived.
    received_ms: i64,
    /// When the engine last reported having applied everything committed at that moment (or
    /// when it was first heard from, if it never has).
    caught_up_ms: i64,
}

/// Where an engine stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EdgeState {
    /// Reporting, and caught up within the lag alarm's threshold.
    Connected,
    /// Reporting, but further behind than the threshold or without its feed.
    Lagging,
    /// Silent for [`MISSING_AFTER_MS`].
    Missing,
}

/// One engine as `GET /v1/edges` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EdgeView {
    pub engine: String,
    pub state: EdgeState,
    pub pop: String,
    pub applied_seq: u64,
    /// `last_seq - applied_seq`, never negative.
    pub lag_seq: u64,
    /// Seconds since the engine last reported having applied everything committed at the
    /// moment of its report: grows while it is behind or silent.
    pub lag_seconds: f64,
    /// Control-plane clock when its last report arrived.
    pub last_report_ms: i64,
    pub snapshot_id: Option<String>,
    pub feed_connected: bool,
    pub safe_mode: bool,
}

/// The fleet's worst figures, for the Prometheus gauges.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct FleetSummary {
    pub engines: usize,
    pub worst_lag_seconds: f64,
    pub worst_lag_seq: u64,
}

/// Refused reports.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FleetError {
    #[error("already tracking {MAX_ENGINES} engines")]
    Full,
}

/// Every engine's latest report.
#[derive(Default)]
pub struct Fleet {
    entries: Mutex<HashMap<String, Entry>>,
    /// The store the control planes share, if they do.
    shared: Option<Arc<dyn Shared>>,
    /// Where the list is saved (the embedded store's `DATA_DIR/fleet.json`).
    file: Option<PathBuf>,
    /// When a save was last claimed (control-plane clock).
    saved_ms: AtomicI64,
    /// One save at a time, so saves never interleave on the file and a later list is never
    /// replaced by an earlier one.
    saving: Mutex<()>,
}

/// Whether a recorded report calls for saving the list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// The engine was not on the list.
    pub joined: bool,
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fleet")
            .field("shared", &self.shared.is_some())
            .finish_non_exhaustive()
    }
}

impl Fleet {
    /// An empty fleet.
    pub fn new() -> Fleet {
        Fleet::default()
    }

    /// An empty fleet whose reports are shared with the other control planes on `shared`.
    pub fn with_shared(shared: Option<Arc<dyn Shared>>) -> Fleet {
        Fleet {
            shared,
            ..Fleet::default()
        }
    }

    /// A fleet saved to `path` (a JSON file, written under a temporary name and renamed),
    /// starting from what it holds; a missing file is an empty fleet and an unreadable one is
    /// logged and replaced.
    pub fn with_file(path: PathBuf) -> Fleet {
        let entries = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<Vec<Entry>>(&bytes) {
                Ok(list) => list
                    .into_iter()
                    .map(|e| (e.report.engine.clone(), e))
                    .collect(),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "unreadable fleet file; starting with an empty fleet");
                    HashMap::new()
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => HashMap::new(),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the fleet file; starting with an empty fleet");
                HashMap::new()
            }
        };
        Fleet {
            entries: Mutex::new(entries),
            file: Some(path),
            ..Fleet::default()
        }
    }

    /// Whether reports are shared through the store.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// Whether the list should be saved now (there is a file, and an engine joined or left,
    /// or the last save is [`SAVE_EVERY_MS`] old). A timed save is claimed by the one caller
    /// that gets `true`, so concurrent reports start one save, not one each.
    pub fn save_due(&self, recorded: Recorded, now_ms: i64) -> bool {
        if self.file.is_none() {
            return false;
        }
        if recorded.joined {
            return true;
        }
        let last = self.saved_ms.load(Ordering::Relaxed);
        now_ms - last >= SAVE_EVERY_MS
            && self
                .saved_ms
                .compare_exchange(last, now_ms, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
    }

    /// Writes the list to its file (blocking; nothing to do without one).
    pub fn save(&self, now_ms: i64) -> std::io::Result<()> {
        let Some(path) = &self.file else {
            return Ok(());
        };
        let _one_at_a_time = self.saving.lock().unwrap_or_else(|p| p.into_inner());
        self.saved_ms.fetch_max(now_ms, Ordering::AcqRel);
        // Read under the save lock: the list written last is the newest.
        let list: Vec<Entry> = self.lock().values().cloned().collect();
        let bytes = serde_json::to_vec(&list).map_err(std::io::Error::other)?;
        write_atomically(path, &bytes)
    }

    /// Removes `engine` from the list (here, in the shared store and in the saved file):
    /// false when it was not on it. Blocking.
    pub fn remove(&self, engine: &str, now_ms: i64) -> Result<bool, StoreError> {
        let known = self.lock().remove(engine).is_some();
        let shared_known = match &self.shared {
            Some(shared) => shared.delete_edge(engine)?,
            None => false,
        };
        if known {
            if let Err(e) = self.save(now_ms) {
                // Removed here all the same; the next save writes the list without it.
                tracing::warn!(error = %e, "saving the fleet after a removal");
            }
        }
        Ok(known || shared_known)
    }

    /// Writes `engine`'s entry to the shared store (blocking; nothing to do without one).
    pub fn persist(&self, engine: &str) -> Result<(), StoreError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let Some(entry) = self.lock().get(engine).cloned() else {
            return Ok(());
        };
        let text = serde_json::to_string(&entry)?;
        shared.put_edge(
            engine,
            &text,
            entry.received_ms,
            entry.received_ms - FORGET_AFTER_MS,
        )
    }

    /// Folds in the reports other control planes received (blocking; nothing to do without a
    /// shared store). For each engine the newest report wins.
    pub fn refresh(&self, now_ms: i64) -> Result<(), StoreError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let rows = shared.edges(now_ms - FORGET_AFTER_MS)?;
        let mut entries = self.lock();
        let mut listed = HashSet::new();
        for row in rows {
            let Ok(theirs) = serde_json::from_str::<Entry>(&row) else {
                tracing::warn!("skipping an unreadable shared engine report");
                continue;
            };
            let engine = theirs.report.engine.clone();
            listed.insert(engine.clone());
            match entries.get(&engine) {
                Some(ours) if ours.received_ms >= theirs.received_ms => {}
                _ if entries.len() >= MAX_ENGINES && !entries.contains_key(&engine) => {}
                _ => {
                    entries.insert(engine, theirs);
                }
            }
        }
        // Removed by an admin on another control plane: gone from the store. (A report that
        // arrived here moments ago may not be stored yet; it is kept.)
        entries.retain(|engine, e| {
            listed.contains(engine) || now_ms - e.received_ms < MISSING_AFTER_MS
        });
        prune(&mut entries, now_ms);
        Ok(())
    }

    /// Records a validated report that arrived at `now_ms`, when `last_seq` was committed.
    pub fn record(
        &self,
        report: StatusReport,
        last_seq: u64,
        now_ms: i64,
    ) -> Result<Recorded, FleetError> {
        let mut entries = self.lock();
        prune(&mut entries, now_ms);
        let caught_up = report.applied_seq >= last_seq;
        match entries.get_mut(&report.engine) {
            Some(e) => {
                if caught_up {
                    e.caught_up_ms = now_ms;
                }
                // Back from missing: its lag runs from when it was last caught up, as before.
                let rejoined = now_ms - e.received_ms > MISSING_AFTER_MS;
                e.report = report;
                e.received_ms = now_ms;
                Ok(Recorded { joined: rejoined })
            }
            None => {
                if entries.len() >= MAX_ENGINES {
                    return Err(FleetError::Full);
                }
                entries.insert(
                    report.engine.clone(),
                    Entry {
                        report,
                        received_ms: now_ms,
                        caught_up_ms: now_ms,
                    },
                );
                Ok(Recorded { joined: true })
            }
        }
    }

    /// Every engine on the list, by PoP then engine id; `lagging` beyond `lag_alarm_secs`.
    pub fn view(&self, last_seq: u64, now_ms: i64, lag_alarm_secs: f64) -> Vec<EdgeView> {
        let mut entries = self.lock();
        prune(&mut entries, now_ms);
        let mut out: Vec<EdgeView> = entries
            .values()
            .map(|e| EdgeView {
                engine: e.report.engine.clone(),
                state: state_of(e, now_ms, lag_alarm_secs),
                pop: e.report.pop.clone(),
                applied_seq: e.report.applied_seq,
                lag_seq: last_seq.saturating_sub(e.report.applied_seq),
                lag_seconds: (now_ms - e.caught_up_ms).max(0) as f64 / 1000.0,
                last_report_ms: e.received_ms,
                snapshot_id: e.report.snapshot_id.clone(),
                feed_connected: e.report.feed_connected,
                safe_mode: e.report.safe_mode,
            })
            .collect();
        out.sort_by(|a, b| (&a.pop, &a.engine).cmp(&(&b.pop, &b.engine)));
        out
    }

    /// Engines heard from within `recent_ms` that do not yet serve the domains' `generation`
    /// (their certificates, settings and ACME challenge answers).
    pub fn behind_certificates(&self, generation: u64, now_ms: i64, recent_ms: i64) -> Vec<String> {
        let entries = self.lock();
        let mut behind: Vec<String> = entries
            .values()
            .filter(|e| now_ms - e.received_ms <= recent_ms)
            .filter(|e| e.report.certificates_generation < generation)
            .map(|e| e.report.engine.clone())
            .collect();
        behind.sort();
        behind
    }

    /// Snapshot ids some engine reported in the last [`REPORT_TTL_MS`]: garbage collection
    /// keeps them.
    pub fn snapshots_in_use(&self, now_ms: i64) -> HashSet<String> {
        let mut entries = self.lock();
        prune(&mut entries, now_ms);
        entries
            .values()
            .filter(|e| now_ms - e.received_ms <= REPORT_TTL_MS)
            .filter_map(|e| e.report.snapshot_id.clone())
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock cannot leave the map half-updated in a way that
        // matters (every update is one insert or field assignment), so keep serving.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The worst figures of a view.
pub fn summarize(view: &[EdgeView]) -> FleetSummary {
    FleetSummary {
        engines: view.len(),
        worst_lag_seconds: view.iter().map(|e| e.lag_seconds).fold(0.0, f64::max),
        worst_lag_seq: view.iter().map(|e| e.lag_seq).max().unwrap_or(0),
    }
}

fn state_of(e: &Entry, now_ms: i64, lag_alarm_secs: f64) -> EdgeState {
    let lag_seconds = (now_ms - e.caught_up_ms).max(0) as f64 / 1000.0;
    if now_ms - e.received_ms > MISSING_AFTER_MS {
        EdgeState::Missing
    } else if lag_seconds > lag_alarm_secs || !e.report.feed_connected {
        EdgeState::Lagging
    } else {
        EdgeState::Connected
    }
}

fn prune(entries: &mut HashMap<String, Entry>, now_ms: i64) {
    entries.retain(|_, e| now_ms - e.received_ms <= FORGET_AFTER_MS);
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    let tmp = path.with_extension("json.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(engine: &str, applied_seq: u64, snapshot: Option<&str>) -> StatusReport {
        StatusReport {
            engine: engine.into(),
            pop: "ams".into(),
            applied_seq,
            snapshot_id: snapshot.map(str::to_string),
            snapshot_seq: 0,
            feed_connected: true,
            safe_mode: false,
            certificates_generation: 0,
            time_ms: 0,
        }
    }

    #[test]
    fn lag_grows_while_behind_or_silent_and_resets_when_caught_up() {
        let fleet = Fleet::new();
        fleet.record(report("e1", 10, None), 10, 1_000).unwrap();
        let v = fleet.view(10, 1_000, 30.0);
        assert_eq!((v[0].lag_seq, v[0].lag_seconds), (0, 0.0));
        assert_eq!(v[0].state, EdgeState::Connected);
        // Silent: the seconds grow even though nothing new was committed.
        assert_eq!(fleet.view(10, 3_500, 30.0)[0].lag_seconds, 2.5);
        // Behind at its next report: the clock keeps running from the last caught-up report.
        fleet.record(report("e1", 11, None), 14, 4_000).unwrap();
        let v = fleet.view(14, 5_000, 30.0);
        assert_eq!((v[0].lag_seq, v[0].lag_seconds), (3, 4.0));
        assert_eq!(v[0].last_report_ms, 4_000);
        assert_eq!(fleet.view(14, 5_000, 3.0)[0].state, EdgeState::Lagging);
        // Caught up again.
        fleet.record(report("e1", 14, None), 14, 6_000).unwrap();
        assert_eq!(fleet.view(14, 6_000, 30.0)[0].lag_seconds, 0.0);
        // Ahead of what we know (a report racing a commit notification): never negative.
        fleet.record(report("e1", 20, None), 14, 7_000).unwrap();
        assert_eq!(fleet.view(14, 7_000, 30.0)[0].lag_seq, 0);
    }

    #[test]
    fn a_silent_engine_is_missing_and_keeps_the_alarm_until_removed() {
        let fleet = Fleet::new();
        assert_eq!(
            fleet.record(report("old", 1, Some("00-aa")), 1, 0).unwrap(),
            Recorded { joined: true }
        );
        assert_eq!(
            fleet
                .record(report("new", 5, Some("00-bb")), 9, 1_000)
                .unwrap(),
            Recorded { joined: true }
        );
        assert_eq!(
            fleet
                .record(report("new", 9, Some("00-bb")), 9, 1_500)
                .unwrap(),
            Recorded { joined: false }
        );
        let later = REPORT_TTL_MS + 500;
        fleet
            .record(report("new", 9, Some("00-bb")), 9, later)
            .unwrap();
        let v = fleet.view(9, later, 30.0);
        assert_eq!(v.len(), 2, "a silent engine stays listed");
        let old = v.iter().find(|e| e.engine == "old").unwrap();
        assert_eq!(old.state, EdgeState::Missing);
        let s = summarize(&v);
        assert_eq!(s.engines, 2);
        assert_eq!(s.worst_lag_seq, 8);
        assert_eq!(
            s.worst_lag_seconds,
            later as f64 / 1000.0,
            "the missing one's"
        );
        // Its snapshot is no longer kept for it.
        assert_eq!(
            fleet.snapshots_in_use(later),
            HashSet::from(["00-bb".to_string()])
        );
        // Back after a silence: it rejoins (saved at once).
        assert_eq!(
            fleet.record(report("old", 9, None), 9, later + 1).unwrap(),
            Recorded { joined: true }
        );
        assert_eq!(
            fleet.view(9, later + 1, 30.0)[0].state,
            EdgeState::Connected
        );
        // Removed by an admin: off the list, the alarm with it.
        assert!(fleet.remove("old", later + 2).unwrap());
        assert!(!fleet.remove("old", later + 2).unwrap());
        assert_eq!(fleet.view(9, later + 2, 30.0).len(), 1);
        // A week of silence: forgotten.
        assert!(fleet.view(9, later + FORGET_AFTER_MS + 1, 30.0).is_empty());
        assert_eq!(summarize(&[]), FleetSummary::default());
    }

    #[test]
    fn the_list_survives_a_restart_in_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fleet.json");
        let fleet = Fleet::with_file(path.clone());
        let joined = fleet.record(report("e1", 3, None), 3, 1_000).unwrap();
        assert!(fleet.save_due(joined, 1_000));
        fleet.save(1_000).unwrap();
        let again = fleet.record(report("e1", 3, None), 3, 2_000).unwrap();
        assert!(!fleet.save_due(again, 2_000), "saved a moment ago");
        assert!(fleet.save_due(again, 1_000 + SAVE_EVERY_MS));
        let restarted = Fleet::with_file(path.clone());
        let v = restarted.view(3, 60_000, 30.0);
        assert_eq!((v.len(), v[0].state), (1, EdgeState::Missing));
        assert_eq!(v[0].last_report_ms, 1_000);
        assert!(
            !Fleet::new().save_due(joined, 0),
            "no file, nothing to save"
        );
        std::fs::write(&path, b"not json").unwrap();
        assert!(Fleet::with_file(path).view(0, 0, 30.0).is_empty());
    }
}
