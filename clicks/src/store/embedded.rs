//! The embedded rollup store: a redb file of its own, `DATA_DIR/clicks/rollups.redb`, apart from
//! the link store, with one writer process.
//!
//! Tables:
//! - `rollups`: (day, code) → [`Rollup::to_bytes`], `code` the link key (`domain/code` on a
//!   branded domain). Keyed day first, so a recompute replaces one
//!   day with a range delete; stats read a code's range with one point lookup per day.
//! - `source_offsets`: a source position → the next byte (spool) or message (Kafka) to read,
//!   committed in the same transaction as the rollups it covers.
//! - `days`: day → [`DayState`].

use std::path::{Path, PathBuf};

use lasthop_analytics::Rollup;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::{decode, storage, DayRollup, DayState, FlushBatch, StoreError};
use crate::Day;

const ROLLUPS: TableDefinition<(u32, &str), &[u8]> = TableDefinition::new("rollups");
const OFFSETS: TableDefinition<&str, u64> = TableDefinition::new("source_offsets");
const DAYS: TableDefinition<u32, u8> = TableDefinition::new("days");

/// The embedded rollup store: a redb file with one writer process.
pub struct Embedded {
    db: Database,
    path: PathBuf,
}

impl std::fmt::Debug for Embedded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Embedded")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl Embedded {
    /// Opens (or creates) the store at `path`; [`StoreError::Busy`] when another process has it.
    pub fn open(path: &Path) -> Result<Embedded, StoreError> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(storage)?;
        }
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Busy {
                path: path.to_owned(),
            },
            other => storage(other),
        })?;
        let txn = db.begin_write().map_err(storage)?;
        // Create every table so readers never meet a missing one.
        txn.open_table(ROLLUPS).map_err(storage)?;
        txn.open_table(OFFSETS).map_err(storage)?;
        txn.open_table(DAYS).map_err(storage)?;
        txn.commit().map_err(storage)?;
        Ok(Embedded {
            db,
            path: path.to_owned(),
        })
    }

    /// The stored rollup of `code` on `day`; `None` when there is none, [`StoreError::Corrupt`]
    /// when the row does not decode.
    pub fn rollup(&self, day: Day, code: &str) -> Result<Option<Rollup>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(ROLLUPS).map_err(storage)?;
        let Some(bytes) = table.get((day.0, code)).map_err(storage)? else {
            return Ok(None);
        };
        decode(day, code, bytes.value()).map(Some)
    }

    /// `code`'s rollups from `from` to `to` (inclusive), days with data only, in day order;
    /// [`StoreError::Corrupt`] when one of them does not decode.
    pub fn range(&self, code: &str, from: Day, to: Day) -> Result<Vec<DayRollup>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(ROLLUPS).map_err(storage)?;
        let days = txn.open_table(DAYS).map_err(storage)?;
        let mut out = Vec::new();
        let mut day = from;
        while day <= to {
            if let Some(bytes) = table.get((day.0, code)).map_err(storage)? {
                let rollup = decode(day, code, bytes.value())?;
                let state = days
                    .get(day.0)
                    .map_err(storage)?
                    .map_or(DayState::Open, |g| DayState::from_u8(g.value()));
                out.push(DayRollup { day, rollup, state });
            }
            if day.0 == u32::MAX {
                break;
            }
            day = day.next();
        }
        Ok(out)
    }

    /// The `n` codes with the most human clicks from `from` to `to` (inclusive), most first
    /// (ties by code): what makes a link popular for the edge's hot-set snapshot. Reads every
    /// rollup of those days once, so its cost follows the codes clicked, not the links stored.
    pub fn top_codes(
        &self,
        from: Day,
        to: Day,
        n: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(ROLLUPS).map_err(storage)?;
        let mut clicks: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        for row in table.range((from.0, "")..).map_err(storage)? {
            let (k, v) = row.map_err(storage)?;
            let (day, code) = k.value();
            if day > to.0 {
                break;
            }
            let rollup = decode(Day(day), code, v.value())?;
            if rollup.human > 0 {
                *clicks.entry(code.to_owned()).or_default() += rollup.human;
            }
        }
        let mut top: Vec<(String, u64)> = clicks.into_iter().collect();
        top.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        top.truncate(n);
        Ok(top)
    }

    /// Every stored source position whose key starts with `prefix`.
    pub fn offsets(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(OFFSETS).map_err(storage)?;
        let mut out = Vec::new();
        for row in table.range(prefix..).map_err(storage)? {
            let (k, v) = row.map_err(storage)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push((k.value().to_owned(), v.value()));
        }
        Ok(out)
    }

    /// A day's state; `None` when the day never had events.
    pub fn day_state(&self, day: Day) -> Result<Option<DayState>, StoreError> {
        let txn = self.db.begin_read().map_err(storage)?;
        let table = txn.open_table(DAYS).map_err(storage)?;
        Ok(table
            .get(day.0)
            .map_err(storage)?
            .map(|g| DayState::from_u8(g.value())))
    }

    /// Commits one flush durably (fsync), all or nothing.
    pub fn commit(&self, batch: &FlushBatch) -> Result<(), StoreError> {
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        {
            let mut rollups = txn.open_table(ROLLUPS).map_err(storage)?;
            // One buffer for every row's bytes.
            let mut bytes = Vec::new();
            for row in &batch.rollups {
                bytes.clear();
                row.body.write(&mut bytes);
                rollups
                    .insert((row.day.0, &*row.code), bytes.as_slice())
                    .map_err(storage)?;
            }
            let mut offsets = txn.open_table(OFFSETS).map_err(storage)?;
            for (key, value) in &batch.offsets {
                match value {
                    Some(v) => offsets.insert(key.as_str(), *v).map_err(storage)?,
                    None => offsets.remove(key.as_str()).map_err(storage)?,
                };
            }
            let mut days = txn.open_table(DAYS).map_err(storage)?;
            for day in &batch.touched_days {
                let state = days.get(day.0).map_err(storage)?.map(|g| g.value());
                if state != Some(DayState::Open.to_u8()) {
                    days.insert(day.0, DayState::Open.to_u8())
                        .map_err(storage)?;
                }
            }
            if let Some(last) = batch.closed_through {
                let mut closing = Vec::new();
                for row in days.range(..=last.0).map_err(storage)? {
                    let (k, v) = row.map_err(storage)?;
                    if DayState::from_u8(v.value()) == DayState::Open {
                        closing.push(k.value());
                    }
                }
                for d in closing {
                    days.insert(d, DayState::Closed.to_u8()).map_err(storage)?;
                }
            }
        }
        txn.commit().map_err(storage)
    }

    /// Replaces every rollup of `day` with `rollups`, in one transaction, and returns the day's
    /// state: an open day stays open, any other becomes recomputed.
    pub fn replace_day<'a>(
        &self,
        day: Day,
        rollups: impl Iterator<Item = (&'a str, &'a Rollup)>,
    ) -> Result<DayState, StoreError> {
        let state;
        let mut txn = self.db.begin_write().map_err(storage)?;
        txn.set_durability(Durability::Immediate).map_err(storage)?;
        {
            let mut table = txn.open_table(ROLLUPS).map_err(storage)?;
            table
                .retain_in((day.0, "")..(day.0.saturating_add(1), ""), |_, _| false)
                .map_err(storage)?;
            for (code, rollup) in rollups {
                table
                    .insert((day.0, code), rollup.to_bytes().as_slice())
                    .map_err(storage)?;
            }
            let mut days = txn.open_table(DAYS).map_err(storage)?;
            let was = days.get(day.0).map_err(storage)?.map(|g| g.value());
            state = if was == Some(DayState::Open.to_u8()) {
                DayState::Open
            } else {
                DayState::Recomputed
            };
            days.insert(day.0, state.to_u8()).map_err(storage)?;
        }
        txn.commit().map_err(storage)?;
        Ok(state)
    }
}
