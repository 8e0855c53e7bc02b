//! The rollup store: its own redb file, `DATA_DIR/clicks/rollups.redb`, apart from the link store.
//!
//! Tables:
//! - `rollups`: (day, code) → [`Rollup::to_bytes`]. Keyed day first, so a recompute replaces one
//!   day with a range delete; stats read a code's range with one point lookup per day.
//! - `source_offsets`: a source position → the next byte (spool) or message (Kafka) to read,
//!   committed in the same transaction as the rollups it covers.
//! - `days`: day → [`DayState`]: `open` while the day takes streaming counts (any flush that
//!   counts events of a day marks it open), `closed` once past its grace, `recomputed` when a
//!   closed day was rebuilt from the archive. A recompute of an open day replaces its numbers
//!   but leaves it open: events keep streaming in on top, and it closes as usual.

use std::path::{Path, PathBuf};

use lasthop_analytics::Rollup;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::clickhouse::{ClickHouse, ClickHouseUrl};
use super::Day;

const ROLLUPS: TableDefinition<(u32, &str), &[u8]> = TableDefinition::new("rollups");
const OFFSETS: TableDefinition<&str, u64> = TableDefinition::new("source_offsets");
const DAYS: TableDefinition<u32, u8> = TableDefinition::new("days");

/// Where a day's numbers stand, in the order a day goes through them (so the least final of
/// several is their `min`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DayState {
    /// Streaming: late events still count (even after a recompute of the day).
    Open,
    /// Past its grace: the streaming numbers are final until a recompute.
    Closed,
    /// Closed, then rebuilt from the archive with the rules of the time.
    Recomputed,
}

impl DayState {
    /// The name the stats API shows.
    pub fn as_str(self) -> &'static str {
        match self {
            DayState::Open => "open",
            DayState::Closed => "closed",
            DayState::Recomputed => "recomputed",
        }
    }

    /// [`as_str`](Self::as_str)'s inverse.
    pub fn parse(s: &str) -> Option<DayState> {
        match s {
            "open" => Some(DayState::Open),
            "closed" => Some(DayState::Closed),
            "recomputed" => Some(DayState::Recomputed),
            _ => None,
        }
    }

    fn to_u8(self) -> u8 {
        match self {
            DayState::Open => 0,
            DayState::Closed => 1,
            DayState::Recomputed => 2,
        }
    }

    fn from_u8(v: u8) -> DayState {
        match v {
            1 => DayState::Closed,
            2 => DayState::Recomputed,
            _ => DayState::Open,
        }
    }
}

/// Why the rollup store failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Another process (a running `serve`, most likely) holds the file.
    #[error("{path} is in use by another process (stop the server, or use the admin API)")]
    Busy {
        /// The store file.
        path: PathBuf,
    },
    /// redb or the disk failed.
    #[error("rollup store: {}", lasthop_core::error_chain::chain(.0))]
    Storage(lasthop_core::error_chain::Cause),
    /// A stored rollup does not decode. It is never treated as absent (that would count from
    /// zero and overwrite it); recomputing its day replaces it.
    #[error("unreadable rollup of {code} on {day}: {reason} (recompute the day to repair it)")]
    Corrupt {
        /// The day.
        day: Day,
        /// The code.
        code: String,
        /// What the decoder said.
        reason: String,
    },
}

fn storage(e: impl Into<lasthop_core::error_chain::Cause>) -> StoreError {
    StoreError::Storage(e.into())
}

/// Where a Kafka-sourced rollup stands in its partition: every event of its (code, day) in
/// `part` below offset `next` is in it. A shared store keeps it with the row, so a processor
/// that takes the partition over (after a rebalance or a crash) skips what the row already
/// counts: the per-key half of exactly-once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pos {
    /// The Kafka partition.
    pub part: i32,
    /// The next offset the row has not counted.
    pub next: u64,
}

/// One (code, day) rollup to upsert.
#[derive(Debug)]
pub struct RollupRow {
    /// The day.
    pub day: Day,
    /// The code.
    pub code: Box<str>,
    /// [`Rollup::to_bytes`].
    pub bytes: Vec<u8>,
    /// Human clicks (a copy of the rollup's, for stores that rank codes in a query).
    pub human: u64,
    /// Bot clicks (likewise).
    pub bot: u64,
    /// Where the rollup stands in its Kafka partition (`None` for a spool or an embedded store,
    /// whose rows have one writer).
    pub at: Option<Pos>,
}

impl RollupRow {
    /// The row of `rollup`.
    pub fn new(day: Day, code: Box<str>, rollup: &Rollup, at: Option<Pos>) -> RollupRow {
        RollupRow {
            day,
            code,
            bytes: rollup.to_bytes(),
            human: rollup.human,
            bot: rollup.bot,
            at,
        }
    }
}

/// A stored rollup a processor counts on.
#[derive(Debug)]
pub struct Stored {
    /// Its numbers.
    pub rollup: Rollup,
    /// Where it stands in its Kafka partition (shared stores only).
    pub at: Option<Pos>,
}

/// One flush's writes, committed together.
#[derive(Debug, Default)]
pub struct FlushBatch {
    /// Rollups to upsert.
    pub rollups: Vec<RollupRow>,
    /// Source positions: `Some` sets, `None` forgets (a consumed file that is gone).
    pub offsets: Vec<(String, Option<u64>)>,
    /// Days that counted events: marked open (a closed or recomputed day counting again, after a
    /// longer grace, is open until it closes again).
    pub touched_days: Vec<Day>,
    /// Every open day up to and including this one is past its grace: mark it closed.
    pub closed_through: Option<Day>,
}

/// One code's rollup on one day, as the stats API reads it.
#[derive(Debug)]
pub struct DayRollup {
    /// The day.
    pub day: Day,
    /// Its numbers.
    pub rollup: Rollup,
    /// Its state.
    pub state: DayState,
}

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
            for row in &batch.rollups {
                rollups
                    .insert((row.day.0, &*row.code), row.bytes.as_slice())
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

/// Where rollups are kept: `--clicks-store embedded` (the default) or
/// `--clicks-store clickhouse://[USER[:PASSWORD]@]HOST[:PORT]/DB`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// `DATA_DIR/clicks/rollups.redb`, one processor.
    Embedded,
    /// A ClickHouse database, shared by several processors.
    ClickHouse(ClickHouseUrl),
}

impl std::str::FromStr for StoreLocation {
    type Err = String;

    fn from_str(s: &str) -> Result<StoreLocation, String> {
        if s == "embedded" {
            return Ok(StoreLocation::Embedded);
        }
        if s.starts_with("clickhouse://") {
            return ClickHouseUrl::parse(s).map(StoreLocation::ClickHouse);
        }
        Err(format!(
            "{s:?} is not a rollup store: use `embedded` or `clickhouse://HOST:8123/DB`"
        ))
    }
}

/// The rollup store, by [`StoreLocation`]: everything that reads or writes rollups (the
/// processor, recompute, the stats API, the console, the hot-set ranking) goes through it.
#[derive(Debug)]
pub enum RollupStore {
    /// The embedded redb file.
    Embedded(Embedded),
    /// ClickHouse.
    ClickHouse(ClickHouse),
}

impl RollupStore {
    /// Opens the embedded store at `path`; [`StoreError::Busy`] when another process has it.
    pub fn open(path: &Path) -> Result<RollupStore, StoreError> {
        Embedded::open(path).map(RollupStore::Embedded)
    }

    /// Opens the store `location` names (`clicks_dir` holds the embedded one).
    pub fn open_at(location: &StoreLocation, clicks_dir: &Path) -> Result<RollupStore, StoreError> {
        match location {
            StoreLocation::Embedded => RollupStore::open(&clicks_dir.join("rollups.redb")),
            StoreLocation::ClickHouse(url) => ClickHouse::open(url).map(RollupStore::ClickHouse),
        }
    }

    /// Whether several processors may write it (each then keeps its rows' partition positions,
    /// and drops what it had not flushed when a partition leaves it).
    pub fn shared(&self) -> bool {
        matches!(self, RollupStore::ClickHouse(_))
    }

    /// The stored rollup of `code` on `day` (all of it); `None` when there is none,
    /// [`StoreError::Corrupt`] when it does not decode.
    pub fn rollup(&self, day: Day, code: &str) -> Result<Option<Rollup>, StoreError> {
        match self {
            RollupStore::Embedded(s) => s.rollup(day, code),
            RollupStore::ClickHouse(s) => Ok(s
                .range(code, day, day)?
                .into_iter()
                .next()
                .map(|d| d.rollup)),
        }
    }

    /// What a processor counts on for `code` on `day` from Kafka partition `part` (`None`: a
    /// spool): in a shared store that partition's row only, with its position; in the
    /// embedded store the whole rollup.
    pub fn stored(
        &self,
        day: Day,
        code: &str,
        part: Option<i32>,
    ) -> Result<Option<Stored>, StoreError> {
        match self {
            RollupStore::Embedded(s) => Ok(s
                .rollup(day, code)?
                .map(|rollup| Stored { rollup, at: None })),
            RollupStore::ClickHouse(s) => s.stored(day, code, part),
        }
    }

    /// Every row of `day` from Kafka partition `part` (`None`: a spool), each decoded or
    /// [`StoreError::Corrupt`], for a shared store's processor to load at once; the embedded
    /// store answers per code ([`RollupStore::stored`]) and says so with an empty list.
    #[allow(clippy::type_complexity)]
    pub fn stored_day(
        &self,
        day: Day,
        part: Option<i32>,
    ) -> Result<Vec<(Box<str>, Result<Stored, StoreError>)>, StoreError> {
        match self {
            RollupStore::Embedded(_) => Ok(Vec::new()),
            RollupStore::ClickHouse(s) => s.stored_day(day, part),
        }
    }

    /// `code`'s rollups from `from` to `to` (inclusive), days with data only, in day order.
    pub fn range(&self, code: &str, from: Day, to: Day) -> Result<Vec<DayRollup>, StoreError> {
        match self {
            RollupStore::Embedded(s) => s.range(code, from, to),
            RollupStore::ClickHouse(s) => s.range(code, from, to),
        }
    }

    /// The `n` codes with the most human clicks from `from` to `to`, most first (ties by code).
    pub fn top_codes(
        &self,
        from: Day,
        to: Day,
        n: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        match self {
            RollupStore::Embedded(s) => s.top_codes(from, to, n),
            RollupStore::ClickHouse(s) => s.top_codes(from, to, n),
        }
    }

    /// Every stored source position whose key starts with `prefix`.
    pub fn offsets(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        match self {
            RollupStore::Embedded(s) => s.offsets(prefix),
            RollupStore::ClickHouse(s) => s.offsets(prefix),
        }
    }

    /// A day's state; `None` when the day never had events.
    pub fn day_state(&self, day: Day) -> Result<Option<DayState>, StoreError> {
        match self {
            RollupStore::Embedded(s) => s.day_state(day),
            RollupStore::ClickHouse(s) => s.day_state(day),
        }
    }

    /// Commits one flush durably.
    pub fn commit(&self, batch: &FlushBatch) -> Result<(), StoreError> {
        match self {
            RollupStore::Embedded(s) => s.commit(batch),
            RollupStore::ClickHouse(s) => s.commit(batch),
        }
    }

    /// Takes the lock `name` for `ttl` if nobody holds it: true for the one caller that gets it.
    /// The embedded store has one process, so one lock holder always; on ClickHouse the
    /// callers race through a claim table (see `ClickHouse::try_lock`).
    pub fn try_lock(&self, name: &str, ttl: std::time::Duration) -> Result<bool, StoreError> {
        match self {
            RollupStore::Embedded(_) => Ok(true),
            RollupStore::ClickHouse(s) => s.try_lock(name, ttl),
        }
    }

    /// Replaces every rollup of `day` with `rollups` and returns the day's state.
    pub fn replace_day<'a>(
        &self,
        day: Day,
        rollups: impl Iterator<Item = (&'a str, &'a Rollup)>,
    ) -> Result<DayState, StoreError> {
        match self {
            RollupStore::Embedded(s) => s.replace_day(day, rollups),
            RollupStore::ClickHouse(s) => s.replace_day(day, rollups),
        }
    }
}

fn decode(day: Day, code: &str, bytes: &[u8]) -> Result<Rollup, StoreError> {
    Rollup::from_bytes(bytes).map_err(|e| StoreError::Corrupt {
        day,
        code: code.to_owned(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_analytics::{BotReason, Device, Verdict};
    use lasthop_core::click::{ClickEvent, EventId, Method};

    fn rollup_of(n: u64) -> Rollup {
        let mut r = Rollup::default();
        for i in 0..n {
            let e = ClickEvent {
                id: EventId::new(1, i),
                at_ms: 1_764_504_000_000,
                code: "Ab3dE9x",
                pop: "fra1",
                country: Some(*b"DE"),
                method: Method::Get,
                tls: true,
                prefetch: false,
                protocol: Default::default(),
                visitor: i,
                net: None,
                user_agent: "Mozilla/5.0",
                referrer_host: "",
            };
            let verdict = Verdict {
                bot: (i % 2 == 1).then_some(BotReason::UserAgent),
                device: Device::Desktop,
                browser: "Firefox",
                os: "Linux",
            };
            r.add(&e, &verdict);
        }
        r
    }

    #[test]
    fn store_locations() {
        assert_eq!("embedded".parse(), Ok(StoreLocation::Embedded));
        assert!(matches!(
            "clickhouse://127.0.0.1:8123/lasthop".parse::<StoreLocation>(),
            Ok(StoreLocation::ClickHouse(_))
        ));
        for bad in ["", "redb", "postgres://h/db", "clickhouse://h"] {
            assert!(bad.parse::<StoreLocation>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_corrupt_row_is_an_error_not_an_absence() {
        let dir = tempfile::tempdir().unwrap();
        let store = RollupStore::open(&dir.path().join("rollups.redb")).unwrap();
        let d = Day(20_000);
        store
            .commit(&FlushBatch {
                rollups: vec![
                    RollupRow {
                        day: d,
                        code: "abc".into(),
                        bytes: b"\xffnot a rollup".to_vec(),
                        human: 0,
                        bot: 0,
                        at: None,
                    },
                    RollupRow::new(d.next(), "abc".into(), &rollup_of(2), None),
                ],
                touched_days: vec![d, d.next()],
                ..FlushBatch::default()
            })
            .unwrap();
        assert!(matches!(
            store.rollup(d, "abc"),
            Err(StoreError::Corrupt { day, .. }) if day == d
        ));
        assert!(matches!(
            store.range("abc", d, d.next()),
            Err(StoreError::Corrupt { .. })
        ));
        assert_eq!(store.range("abc", d.next(), d.next()).unwrap().len(), 1);
        // A recompute repairs it.
        store
            .replace_day(d, [("abc", &rollup_of(1))].into_iter())
            .unwrap();
        assert_eq!(store.rollup(d, "abc").unwrap(), Some(rollup_of(1)));
    }
}
