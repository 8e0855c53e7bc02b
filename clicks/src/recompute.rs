//! Recompute ("fresh, then correct"): rebuild one day's rollups from its archive with the current
//! rules and replace the streaming numbers. A closed day becomes `recomputed`; a day still within
//! its grace stays `open` (see [`super::store`]).
//!
//! The day is read from the archive's object store (`objects.rs`) hour by hour, in bounded memory
//! (one hour's events at a time, in their binary form): the hour's Parquet objects
//! (`day=D/hour=HH/`; a damaged one is counted, named in the log and skipped whole) and, for a
//! day written before the Parquet archive, its NDJSON parts (`D/*.ndjson.zst`: unreadable lines
//! counted and skipped, a torn last frame tolerated; read once and kept by hour). Events are
//! deduplicated by id within their hour (a duplicate is the same event, so the same hour: the
//! streaming window is only minutes long, and the archive may hold an interval twice after a
//! crash or overlapping objects after a replay), early-data replays dropped as the processor
//! drops them (one per visitor, link and minute), classified in time order by a fresh
//! [`Classifier`], and every link's rollup for the day is replaced in one transaction. A link is its key, as the processor keys it: the code on the default domain,
//! `domain/code` on a branded one (an archive line's `d`). The running processor does this on its own thread, after a flush
//! ([`crate::ClicksHandle::recompute`]); `lasthop-control clicks recompute` does it
//! offline ([`recompute_offline`]).

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::Arc;

use lasthop_analytics::{early_key, Classifier, Rollup, Rules};
use lasthop_core::click::{ArchivedClick, ClickEvent};
use serde::Serialize;

use super::archive::{self, ArchiveError};
use super::objects::{ArchiveLocation, Objects, ObjectsError};
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
    /// Parquet objects read.
    pub objects: u64,
    /// Parquet objects skipped as damaged (each named in the log).
    pub corrupt_objects: u64,
    /// NDJSON parts read (a day archived before Parquet).
    pub ndjson_parts: u64,
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
    /// The archive's object store failed.
    #[error(transparent)]
    Objects(#[from] ObjectsError),
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

/// Rebuilds `day` from the archive: the report and every link's rollup, by link key.
pub fn rebuild(
    objects: &Objects,
    day: Day,
    rules: Arc<Rules>,
) -> Result<(RecomputeReport, HashMap<Box<str>, Rollup>), RecomputeError> {
    let listing = objects.day_objects(day)?;
    if listing.parquet.is_empty() && listing.ndjson.is_empty() {
        return Err(RecomputeError::NoArchive(day));
    }
    let mut report = RecomputeReport {
        day: day.to_string(),
        ..RecomputeReport::default()
    };
    let mut classifier = Classifier::new(rules);
    let mut rollups: HashMap<Box<str>, Rollup> = HashMap::new();
    for hour in 0..24 {
        // The NDJSON parts (days archived before Parquet) hold every hour: each is read once per
        // hour, keeping that hour's events, so memory stays one hour's whatever the form.
        let mut arena = Vec::new();
        let mut read = archive::ReadReport::default();
        for path in &listing.ndjson {
            let bytes = objects.get(path)?;
            let invalid = &mut report.invalid_lines;
            archive::read_part(&bytes, path.as_ref(), &mut read, &mut |line| {
                let Ok(a) = serde_json::from_slice::<ArchivedClick>(line) else {
                    // Counted once, in the first pass.
                    *invalid += u64::from(hour == 0);
                    return;
                };
                match a.event() {
                    Ok(e) if Day::of_ms(e.at_ms) == day => {
                        if hour_of(e.at_ms) == hour {
                            e.encode(&mut arena);
                        }
                    }
                    _ => *invalid += u64::from(hour == 0),
                }
            });
        }
        if hour == 0 {
            report.torn_frames = read.torn;
            report.ndjson_parts = read.parts;
        }
        for (_, path) in listing
            .parquet
            .iter()
            .filter(|(h, _)| usize::from(*h) == hour)
        {
            let bytes = objects.get(path)?;
            let before = arena.len();
            match super::columnar::read(bytes, |event| arena.extend_from_slice(event)) {
                Ok(_) => report.objects += 1,
                Err(e) => {
                    arena.truncate(before);
                    report.corrupt_objects += 1;
                    tracing::error!(object = %path, error = %e, "damaged archive object skipped by the recompute");
                }
            }
        }
        rebuild_hour(
            &arena,
            day,
            hour,
            &mut classifier,
            &mut rollups,
            &mut report,
        );
    }
    report.events = report.human + report.bot;
    report.codes = rollups.len() as u64;
    Ok((report, rollups))
}

/// Calls `event` with every event of `day`'s archive (binary, [`ClickEvent::encode`]'s form),
/// Parquet objects and NDJSON parts alike, duplicates included; returns the objects read and
/// the damaged ones skipped. For tools and tests; the recompute reads by hour ([`rebuild`]).
pub fn day_events(
    objects: &Objects,
    day: Day,
    mut event: impl FnMut(&[u8]),
) -> Result<(u64, u64), RecomputeError> {
    let listing = objects.day_objects(day)?;
    let (mut read, mut damaged) = (0, 0);
    let mut rows = Vec::new();
    for (_, path) in &listing.parquet {
        rows.clear();
        // A damaged object hands over nothing, not the rows before its damage.
        match super::columnar::read(objects.get(path)?, |e| rows.extend_from_slice(e)) {
            Ok(_) => {
                read += 1;
                let mut rest = &rows[..];
                while let Ok((_, n)) = ClickEvent::decode(rest) {
                    event(&rest[..n]);
                    rest = &rest[n..];
                }
            }
            Err(e) => {
                damaged += 1;
                tracing::error!(object = %path, error = %e, "damaged archive object skipped");
            }
        }
    }
    let mut buf = Vec::new();
    for path in &listing.ndjson {
        let bytes = objects.get(path)?;
        let mut report = archive::ReadReport::default();
        archive::read_part(&bytes, path.as_ref(), &mut report, &mut |line| {
            if let Ok(a) = serde_json::from_slice::<ArchivedClick>(line) {
                if let Ok(e) = a.event() {
                    buf.clear();
                    e.encode(&mut buf);
                    event(&buf);
                }
            }
        });
        read += 1;
    }
    Ok((read, damaged))
}

fn hour_of(at_ms: u64) -> usize {
    ((at_ms % 86_400_000) / 3_600_000) as usize
}

/// Counts one hour's events (binary, back to back) in time order, each id once.
fn rebuild_hour(
    arena: &[u8],
    day: Day,
    hour: usize,
    classifier: &mut Classifier,
    rollups: &mut HashMap<Box<str>, Rollup>,
    report: &mut RecomputeReport,
) {
    // (time, id, offset): time order, so the behaviour rule sees what the stream would have;
    // the id breaks ties so a recompute is deterministic and puts duplicates side by side.
    let mut index: Vec<(u64, u128, usize)> = Vec::new();
    let mut at = 0;
    while at < arena.len() {
        // Every event here was checked on the way in.
        let Ok((e, n)) = ClickEvent::decode(&arena[at..]) else {
            break;
        };
        if Day::of_ms(e.at_ms) == day && hour_of(e.at_ms) == hour {
            index.push((e.at_ms, e.id.0, at));
        } else {
            report.invalid_lines += 1;
        }
        at += n;
    }
    index.sort_unstable();
    let mut early = HashSet::new();
    let mut last_id = None;
    for (_, id, offset) in index {
        if last_id == Some(id) {
            report.duplicates += 1;
            continue;
        }
        last_id = Some(id);
        let Ok((e, _)) = ClickEvent::decode(&arena[offset..]) else {
            continue;
        };
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
}

/// Rebuilds `day` and replaces its rollups in `store`.
pub fn recompute_into(
    store: &RollupStore,
    objects: &Objects,
    day: Day,
    rules: Arc<Rules>,
) -> Result<RecomputeReport, RecomputeError> {
    if store.shared() && store.day_state(day)? == Some(super::DayState::Open) {
        return Err(RecomputeError::DayOpen(day));
    }
    let (mut report, rollups) = rebuild(objects, day, rules)?;
    let state = store.replace_day(day, rollups.iter().map(|(c, r)| (&**c, r)))?;
    report.state = state.as_str().to_owned();
    tracing::info!(%day, events = report.events, codes = report.codes, "day recomputed from the archive");
    Ok(report)
}

/// `lasthop-control clicks recompute`: the same, with the server stopped (its store file has one
/// owner at a time; a running server answers [`StoreError::Busy`]).
pub fn recompute_offline(
    clicks_dir: &Path,
    archive: &ArchiveLocation,
    day: Day,
    rules: Arc<Rules>,
) -> Result<RecomputeReport, RecomputeError> {
    let store = RollupStore::open(&clicks_dir.join("rollups.redb"))?;
    let objects = Objects::open(archive, None)?;
    recompute_into(&store, &objects, day, rules)
}
