//! `archive-convert`: rewrites a day of the local NDJSON archive (`archive.rs`, written before the
//! Parquet archive) as Parquet objects in the archive (`objects.rs`), one object per part and
//! hour, named `ndjson-<part>-<first line>-<last line>.parquet`, then deletes the day's parts.
//! A run stopped half way leaves both forms of some events, which every reader drops by event
//! id; running it again rewrites the same objects.

use std::path::Path;

use bytes::Bytes;
use lasthop_core::click::ArchivedClick;
use serde::Serialize;

use super::archive::{self, ReadReport};
use super::columnar::ObjectWriter;
use super::objects::{ArchiveLocation, ObjectKey, Objects};
use super::recompute::RecomputeError;
use super::Day;

/// What a conversion did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ConvertReport {
    /// The day, `YYYY-MM-DD`.
    pub day: String,
    /// NDJSON parts read.
    pub parts: u64,
    /// Events written as Parquet rows.
    pub events: u64,
    /// Lines that are not a valid event of the day (left out).
    pub invalid_lines: u64,
    /// Parts that ended in a torn frame.
    pub torn_frames: u64,
    /// Objects written.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The NDJSON bytes they replace.
    pub ndjson_bytes: u64,
}

/// Converts `day` of the NDJSON archive under `root` into the archive at `to`.
pub fn convert_day(
    root: &Path,
    to: &ArchiveLocation,
    day: Day,
    part_bytes: usize,
) -> Result<ConvertReport, RecomputeError> {
    let parts = archive::parts(root, day)?;
    if parts.is_empty() {
        return Err(RecomputeError::NoArchive(day));
    }
    let objects = Objects::open(to, None)?;
    let mut report = ConvertReport {
        day: day.to_string(),
        ..ConvertReport::default()
    };
    let mut read = ReadReport::default();
    for (number, path) in &parts {
        let bytes = std::fs::read(path).map_err(|source| archive::ArchiveError::Io {
            path: path.clone(),
            source,
        })?;
        report.ndjson_bytes += bytes.len() as u64;
        let mut hours: Vec<Option<ObjectWriter>> = (0..24).map(|_| None).collect();
        let (mut line_no, mut failed) = (0u64, None);
        archive::read_part(
            &bytes,
            &path.display().to_string(),
            &mut read,
            &mut |line| {
                line_no += 1;
                let Ok(a) = serde_json::from_slice::<ArchivedClick>(line) else {
                    report.invalid_lines += 1;
                    return;
                };
                let e = match a.event() {
                    Ok(e) if Day::of_ms(e.at_ms) == day => e,
                    _ => {
                        report.invalid_lines += 1;
                        return;
                    }
                };
                let hour = ((e.at_ms % 86_400_000) / 3_600_000) as usize;
                let slot = &mut hours[hour];
                if slot.is_none() {
                    match ObjectWriter::new() {
                        Ok(w) => *slot = Some(w),
                        Err(err) => {
                            failed.get_or_insert(err);
                            return;
                        }
                    }
                }
                if let Some(Err(err)) = slot.as_mut().map(|w| w.push(&e)) {
                    failed.get_or_insert(err);
                }
            },
        );
        if let Some(err) = failed {
            return Err(RecomputeError::Flush(format!("{}: {err}", path.display())));
        }
        for (hour, writer) in hours.into_iter().enumerate() {
            let Some(writer) = writer else { continue };
            report.events += writer.rows();
            let bytes = writer
                .finish()
                .map_err(|e| RecomputeError::Flush(format!("{}: {e}", path.display())))?;
            let key = ObjectKey {
                day,
                hour: hour as u8,
                source: "ndjson".into(),
                partition: format!("{number:06}"),
                first: 1,
                last: line_no,
            };
            report.objects += 1;
            report.bytes += bytes.len() as u64;
            objects.put(&key, Bytes::from(bytes), part_bytes)?;
        }
    }
    report.parts = read.parts;
    report.torn_frames = read.torn;
    // Every object is durable: the NDJSON day goes.
    let dir = archive::day_dir(root, day);
    std::fs::remove_dir_all(&dir).map_err(|source| archive::ArchiveError::Io {
        path: dir.clone(),
        source,
    })?;
    tracing::info!(%day, objects = report.objects, events = report.events, "NDJSON archive day rewritten as Parquet");
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::ArchiveWriter;
    use crate::recompute;
    use lasthop_analytics::Rules;
    use lasthop_core::click::{ClickEvent, EventId, Method, Protocol};
    use std::sync::Arc;

    fn event(i: u64, at_ms: u64) -> ClickEvent<'static> {
        ClickEvent {
            id: EventId::new(0x51, i),
            at_ms,
            code: if i % 2 == 0 { "Ab3dE9x" } else { "Zz9yY8x" },
            domain: "",
            pop: "fra1",
            country: Some(*b"DE"),
            method: Method::Get,
            tls: true,
            prefetch: false,
            protocol: Protocol::H2,
            early: false,
            visitor: i * 7919,
            net: None,
            user_agent: "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0",
            referrer_host: "",
        }
    }

    fn rebuild(objects: &Objects, day: Day) -> recompute::RecomputeReport {
        let rules = Arc::new(Rules::load(None, None).unwrap());
        recompute::rebuild(objects, day, rules).unwrap().0
    }

    /// A day in NDJSON parts, then also in Parquet objects, then converted: the recompute reads
    /// both forms and counts each event once, before and after.
    #[test]
    fn ndjson_and_parquet_days_read_alike_and_convert() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let day = Day::parse("2026-12-01").unwrap();
        let at = |i: u64| day.start_ms() + 3_600_000 * (i % 3) + i;
        // 30 events as NDJSON, in two parts (a writer per part).
        for part in 0..2u64 {
            let writer = ArchiveWriter::start(root.clone()).unwrap();
            let mut events = Vec::new();
            for i in part * 15..part * 15 + 15 {
                event(i, at(i)).encode(&mut events);
            }
            writer.append(day, events).unwrap();
            writer.sync().unwrap();
        }
        let objects = Objects::open(&ArchiveLocation::local(&root), None).unwrap();
        let r = rebuild(&objects, day);
        assert_eq!((r.events, r.ndjson_parts, r.objects), (30, 2, 0));

        // Parquet objects of the same day: events 20..40 (20..30 repeat the NDJSON ones).
        for hour in 0..3u8 {
            let events: Vec<ClickEvent<'_>> = (20..40)
                .filter(|i| (i % 3) as u8 == hour)
                .map(|i| event(i, at(i)))
                .collect();
            let key = ObjectKey {
                day,
                hour,
                source: "spool".into(),
                partition: "edge-a.0000000001".into(),
                first: 0,
                last: 99,
            };
            let bytes = crate::columnar::encode(&events).unwrap();
            objects.put(&key, Bytes::from(bytes), 8 << 20).unwrap();
        }
        let r = rebuild(&objects, day);
        assert_eq!((r.events, r.duplicates, r.objects), (40, 10, 3), "{r:?}");

        // Converted: the NDJSON day is gone, its events are Parquet, the counts stand.
        let report = convert_day(&root, &ArchiveLocation::local(&root), day, 8 << 20).unwrap();
        assert_eq!((report.parts, report.events), (2, 30), "{report:?}");
        assert!(report.bytes > 0 && report.ndjson_bytes > 0);
        assert!(!archive::day_dir(&root, day).exists());
        let r = rebuild(&objects, day);
        assert_eq!(
            (r.events, r.duplicates, r.ndjson_parts),
            (40, 10, 0),
            "{r:?}"
        );
        assert_eq!(r.objects, 3 + report.objects);
        // Nothing left to convert.
        assert!(matches!(
            convert_day(&root, &ArchiveLocation::local(&root), day, 8 << 20),
            Err(RecomputeError::NoArchive(_))
        ));
    }
}
