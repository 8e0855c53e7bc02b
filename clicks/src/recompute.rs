//! Recompute ("fresh, then correct"): rebuild one day's rollups from its archive with the current
//! rules and replace the streaming numbers. A closed day becomes `recomputed`; a day still within
//! its grace stays `open` (see [`super::store`]).
//!
//! Every archive part of the day is read (unreadable lines counted and skipped, a torn last frame
//! tolerated), events are deduplicated by id over the whole day (the streaming window is only
//! minutes long, and the archive may hold an interval twice after a crash), early-data replays
//! dropped as the processor drops them (one per visitor, link and minute), classified in time
//! order by a fresh [`Classifier`], and every link's rollup for the day is replaced in one
//! transaction. A link is its key, as the processor keys it: the code on the default domain,
//! `domain/code` on a branded one (an archive line's `d`). The running processor does this on its own thread, after a flush
//! ([`crate::ClicksHandle::recompute`]); `lasthop-control clicks recompute` does it
//! offline ([`recompute_offline`]).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use lasthop_analytics::{early_key, Classifier, Rollup, Rules};
use lasthop_core::click::ArchivedClick;
use serde::Serialize;

use super::archive::{self, ArchiveError};
use super::store::{RollupStore, StoreError};
use super::Day;

/// What a recompute did (the admin API's answer).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecomputeReport {
    /// The day, `YYYY-MM-DD`.
    pub day: String,
    /// Distinct events counted.
    pub events: u64,
    /// Of which human.
    pub human: u64,
    /// Of which bots.
    pub bot: u64,
    /// Archive lines dropped as duplicates of an id seen earlier that day.
    pub duplicates: u64,
    /// Early-data events dropped as replays: a second one of its visitor, link and minute
    /// (the processor's rule, `lasthop_analytics::early_key`).
    pub early_replays: u64,
    /// Archive lines that are not a valid event of this day.
    pub invalid_lines: u64,
    /// Archive parts that ended in a torn frame.
    pub torn_frames: u64,
    /// Links (codes on the default domain, `domain/code` on a branded one) with a rollup that
    /// day.
    pub codes: u64,
    /// The day's state afterwards: `recomputed`, or `open` for a day still within its grace
    /// (streaming events keep adding to the recomputed numbers until it closes).
    pub state: String,
}

/// Why a recompute failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RecomputeError {
    /// The day has no archive (never had events, or past retention): refusing to wipe its numbers.
    #[error("no archive for {0}: nothing to recompute from (never had events, or past retention)")]
    NoArchive(Day),
    /// Reading the archive failed.
    #[error(transparent)]
    Archive(#[from] ArchiveError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The processor is not running (or stopped mid-way).
    #[error("the click processor is not running")]
    Stopped,
    /// A shared store's day still counts streaming events from several processors: rebuilding
    /// it now would race them. It can be recomputed once past its grace.
    #[error(
        "{0} is still open (counting streaming events); recompute it once its grace has passed"
    )]
    DayOpen(Day),
    /// A shared store's day can be rebuilt only from a whole archive: the archive consumer
    /// beside this processor must hold the whole source and have caught up past the day's
    /// grace (with several archive consumers in one group, each holds a part).
    #[error("the archive here is not whole for {0} (run the recompute where one archive consumer holds the whole topic, after the day's grace)")]
    ArchiveIncomplete(Day),
    /// The flush before the recompute failed.
    #[error("flush before recompute failed: {0}")]
    Flush(String),
}

/// Rebuilds `day` from the archive under `root`: the report and every link's rollup, by link key.
pub fn rebuild(
    root: &Path,
    day: Day,
    rules: Arc<Rules>,
) -> Result<(RecomputeReport, HashMap<Box<str>, Rollup>), RecomputeError> {
    if !archive::day_dir(root, day).is_dir() {
        return Err(RecomputeError::NoArchive(day));
    }
    let mut report = RecomputeReport {
        day: day.to_string(),
        ..RecomputeReport::default()
    };
    let mut seen = HashSet::new();
    let mut events: Vec<ArchivedClick> = Vec::new();
    let read = archive::read_day(root, day, |line| {
        let Ok(a) = serde_json::from_slice::<ArchivedClick>(line) else {
            report.invalid_lines += 1;
            return;
        };
        let id = match a.event() {
            Ok(e) if Day::of_ms(e.at_ms) == day => e.id,
            _ => {
                report.invalid_lines += 1;
                return;
            }
        };
        if seen.insert(id) {
            events.push(a);
        } else {
            report.duplicates += 1;
        }
    })?;
    report.torn_frames = read.torn;
    drop(seen);
    // Time order, so the behaviour rule sees what the stream would have; id breaks ties so a
    // recompute is deterministic.
    events.sort_unstable_by(|a, b| (a.t, &a.id).cmp(&(b.t, &b.id)));
    let mut classifier = Classifier::new(rules);
    let mut rollups: HashMap<Box<str>, Rollup> = HashMap::new();
    let mut early = HashSet::new();
    for a in &events {
        // Checked above; a line that passed once passes again.
        let Ok(e) = a.event() else { continue };
        if early_key(&e).is_some_and(|key| !early.insert(key)) {
            report.early_replays += 1;
            continue;
        }
        let verdict = classifier.classify(&e);
        if verdict.bot.is_some() {
            report.bot += 1;
        } else {
            report.human += 1;
        }
        let key = e.link_key();
        match rollups.get_mut(&*key) {
            Some(r) => r.add(&e, &verdict),
            None => {
                let mut r = Rollup::default();
                r.add(&e, &verdict);
                rollups.insert(key.into(), r);
            }
        }
    }
    report.events = report.human + report.bot;
    report.codes = rollups.len() as u64;
    Ok((report, rollups))
}

/// Rebuilds `day` and replaces its rollups in `store`.
pub fn recompute_into(
    store: &RollupStore,
    root: &Path,
    day: Day,
    rules: Arc<Rules>,
) -> Result<RecomputeReport, RecomputeError> {
    if store.shared() && store.day_state(day)? == Some(super::DayState::Open) {
        return Err(RecomputeError::DayOpen(day));
    }
    let (mut report, rollups) = rebuild(root, day, rules)?;
    let state = store.replace_day(day, rollups.iter().map(|(c, r)| (&**c, r)))?;
    report.state = state.as_str().to_owned();
    tracing::info!(%day, events = report.events, codes = report.codes, "day recomputed from the archive");
    Ok(report)
}

/// `lasthop-control clicks recompute`: the same, with the server stopped (its store file has one
/// owner at a time; a running server answers [`StoreError::Busy`]).
pub fn recompute_offline(
    clicks_dir: &Path,
    day: Day,
    rules: Arc<Rules>,
) -> Result<RecomputeReport, RecomputeError> {
    let store = RollupStore::open(&clicks_dir.join("rollups.redb"))?;
    recompute_into(&store, &clicks_dir.join("archive"), day, rules)
}
