//! The engines' status reports (core/FEED.md, "Status reports"), kept in memory.
//!
//! Pure bookkeeping: every method takes the current change-log sequence and `now` from its
//! caller, so lag arithmetic is tested without clocks or sockets. A report older than
//! [`REPORT_TTL_MS`] is forgotten; an engine that stops reporting leaves the list after that.
//!
//! With several control planes on one store each engine reports to one of them, so every
//! report is also written to the store ([`Fleet::persist`]) and every control plane folds the
//! others' into its view ([`Fleet::refresh`], every couple of seconds and before
//! `GET /v1/edges`): the fleet list, the lag gauges and snapshot garbage collection see every
//! engine whichever control plane it talks to.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use lasthop_core::feed::StatusReport;
use serde::{Deserialize, Serialize};

use crate::store::{Shared, StoreError};

/// How long a report counts (core/FEED.md: the last 10 minutes).
pub const REPORT_TTL_MS: i64 = 10 * 60 * 1000;
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

/// One engine as `GET /v1/edges` lists it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EdgeView {
    pub engine: String,
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

    /// Whether reports are shared through the store.
    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
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
        shared.put_edge(engine, &text, entry.received_ms)
    }

    /// Folds in the reports other control planes received (blocking; nothing to do without a
    /// shared store). For each engine the newest report wins.
    pub fn refresh(&self, now_ms: i64) -> Result<(), StoreError> {
        let Some(shared) = &self.shared else {
            return Ok(());
        };
        let rows = shared.edges(now_ms - REPORT_TTL_MS)?;
        let mut entries = self.lock();
        for row in rows {
            let Ok(theirs) = serde_json::from_str::<Entry>(&row) else {
                tracing::warn!("skipping an unreadable shared engine report");
                continue;
            };
            let engine = theirs.report.engine.clone();
            match entries.get(&engine) {
                Some(ours) if ours.received_ms >= theirs.received_ms => {}
                _ if entries.len() >= MAX_ENGINES && !entries.contains_key(&engine) => {}
                _ => {
                    entries.insert(engine, theirs);
                }
            }
        }
        prune(&mut entries, now_ms);
        Ok(())
    }

    /// Records a validated report that arrived at `now_ms`, when `last_seq` was committed.
    pub fn record(
        &self,
        report: StatusReport,
        last_seq: u64,
        now_ms: i64,
    ) -> Result<(), FleetError> {
        let mut entries = self.lock();
        prune(&mut entries, now_ms);
        let caught_up = report.applied_seq >= last_seq;
        match entries.get_mut(&report.engine) {
            Some(e) => {
                if caught_up {
                    e.caught_up_ms = now_ms;
                }
                e.report = report;
                e.received_ms = now_ms;
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
            }
        }
        Ok(())
    }

    /// Every engine heard from in the last [`REPORT_TTL_MS`], by PoP then engine id.
    pub fn view(&self, last_seq: u64, now_ms: i64) -> Vec<EdgeView> {
        let mut entries = self.lock();
        prune(&mut entries, now_ms);
        let mut out: Vec<EdgeView> = entries
            .values()
            .map(|e| EdgeView {
                engine: e.report.engine.clone(),
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

    /// Snapshot ids some engine reported in the last [`REPORT_TTL_MS`]: garbage collection
    /// keeps them.
    pub fn snapshots_in_use(&self, now_ms: i64) -> HashSet<String> {
        let mut entries = self.lock();
        prune(&mut entries, now_ms);
        entries
            .values()
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

fn prune(entries: &mut HashMap<String, Entry>, now_ms: i64) {
    entries.retain(|_, e| now_ms - e.received_ms <= REPORT_TTL_MS);
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
            time_ms: 0,
        }
    }

    #[test]
    fn lag_grows_while_behind_or_silent_and_resets_when_caught_up() {
        let fleet = Fleet::new();
        fleet.record(report("e1", 10, None), 10, 1_000).unwrap();
        let v = fleet.view(10, 1_000);
        assert_eq!((v[0].lag_seq, v[0].lag_seconds), (0, 0.0));
        // Silent: the seconds grow even though nothing new was committed.
        assert_eq!(fleet.view(10, 3_500)[0].lag_seconds, 2.5);
        // Behind at its next report: the clock keeps running from the last caught-up report.
        fleet.record(report("e1", 11, None), 14, 4_000).unwrap();
        let v = fleet.view(14, 5_000);
        assert_eq!((v[0].lag_seq, v[0].lag_seconds), (3, 4.0));
        assert_eq!(v[0].last_report_ms, 4_000);
        // Caught up again.
        fleet.record(report("e1", 14, None), 14, 6_000).unwrap();
        assert_eq!(fleet.view(14, 6_000)[0].lag_seconds, 0.0);
        // Ahead of what we know (a report racing a commit notification): never negative.
        fleet.record(report("e1", 20, None), 14, 7_000).unwrap();
        assert_eq!(fleet.view(14, 7_000)[0].lag_seq, 0);
    }

    #[test]
    fn old_reports_are_forgotten_and_summaries_take_the_worst() {
        let fleet = Fleet::new();
        fleet.record(report("old", 1, Some("00-aa")), 1, 0).unwrap();
        fleet
            .record(report("new", 5, Some("00-bb")), 9, 1_000)
            .unwrap();
        assert_eq!(fleet.view(9, 1_000).len(), 2);
        let later = REPORT_TTL_MS + 500;
        let v = fleet.view(9, later);
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].engine, "new");
        let s = summarize(&v);
        assert_eq!(s.engines, 1);
        assert_eq!(s.worst_lag_seq, 4);
        assert_eq!(s.worst_lag_seconds, (later - 1_000) as f64 / 1000.0);
        assert_eq!(
            fleet.snapshots_in_use(later),
            HashSet::from(["00-bb".to_string()])
        );
        assert_eq!(summarize(&[]), FleetSummary::default());
    }
}
