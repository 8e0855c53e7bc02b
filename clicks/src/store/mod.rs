//! The rollup store: the processor's per-(code, day) rollups, its source positions and each
//! day's state, behind one type ([`RollupStore`]) for everything that reads or writes them.
//! "Code" here is a link's key (`lasthop_core::link_key`): the code on the default domain,
//! `domain/code` on a branded one (up to `lasthop_core::code::KEY_MAX` characters), so the same
//! alias on two domains has two rows, and the default domain's rows are keyed as they always were. Two
//! backends, each built on the types here and neither on the other: [`embedded`] (a redb file of
//! its own, `DATA_DIR/clicks/rollups.redb`, one processor; the default) and [`clickhouse`] (one
//! database shared by several processors on one Kafka consumer group, with the `clickhouse`
//! feature).
//!
//! A day is `open` while it takes streaming counts (any flush that counts events of a day marks
//! it open), `closed` once past its grace, `recomputed` when a closed day was rebuilt from the
//! archive. A recompute of an open day replaces its numbers but leaves it open: events keep
//! streaming in on top, and it closes as usual.

#[cfg(feature = "clickhouse")]
pub mod clickhouse;
pub mod embedded;
mod location;

use std::path::{Path, PathBuf};

use lasthop_analytics::Rollup;

use self::clickhouse::ClickHouse;
use self::embedded::Embedded;
pub use self::location::{ClickHouseUrl, StoreLocation};
use crate::Day;

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

    /// The number both backends store for the state.
    fn to_u8(self) -> u8 {
        match self {
            DayState::Open => 0,
            DayState::Closed => 1,
            DayState::Recomputed => 2,
        }
    }

    /// [`to_u8`](Self::to_u8)'s inverse (an unknown number reads as open).
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
    /// The location names a backend this build left out.
    #[error("--clicks-store {scheme}: this build of lasthop-clicks has no `{feature}` feature")]
    NotBuilt {
        /// The location's scheme, e.g. `clickhouse://`.
        scheme: &'static str,
        /// The Cargo feature that builds it.
        feature: &'static str,
    },
}

/// A backend's (or the disk's) failure.
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
pub struct RollupRow<'a> {
    /// The day.
    pub day: Day,
    /// The link key: the code, or `domain/code` on a branded domain.
    pub code: Box<str>,
    /// What is stored.
    pub body: RowBody<'a>,
    /// Human clicks (a copy of the rollup's, for stores that rank codes in a query).
    pub human: u64,
    /// Bot clicks (likewise).
    pub bot: u64,
    /// Where the rollup stands in its Kafka partition (`None` for a spool or an embedded store,
    /// whose rows have one writer).
    pub at: Option<Pos>,
}

/// A row's stored bytes ([`Rollup::to_bytes`]'s form).
#[derive(Debug)]
pub enum RowBody<'a> {
    /// Written from the processor's rollup as the store commits: a flush holds no copy of
    /// every sketch it writes (a dense one is 16 KiB; a flush of every link's is hundreds of
    /// MiB, and the allocator keeps what it once held).
    Rollup(&'a Rollup),
    /// Given as bytes (a row read elsewhere, or damaged on purpose in a test).
    Bytes(Vec<u8>),
}

impl RowBody<'_> {
    /// Appends the row's bytes to `out`.
    pub fn write(&self, out: &mut Vec<u8>) {
        match self {
            RowBody::Rollup(r) => r.write(out),
            RowBody::Bytes(b) => out.extend_from_slice(b),
        }
    }
}

impl<'a> RollupRow<'a> {
    /// The row of `rollup`, written from it at the commit.
    pub fn new(day: Day, code: Box<str>, rollup: &'a Rollup, at: Option<Pos>) -> RollupRow<'a> {
        RollupRow {
            day,
            code,
            body: RowBody::Rollup(rollup),
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
pub struct FlushBatch<'a> {
    /// Rollups to upsert.
    pub rollups: Vec<RollupRow<'a>>,
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

    /// The `n` codes with the most human clicks from `from` to `to`, most first (ties by code):
    /// link keys, so a branded domain's link is `domain/code`.
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

/// A stored rollup of `code` on `day`, or why it does not decode.
fn decode(day: Day, code: &str, bytes: &[u8]) -> Result<Rollup, StoreError> {
    Rollup::from_bytes(bytes).map_err(|e| StoreError::Corrupt {
        day,
        code: code.to_owned(),
        reason: e.to_string(),
    })
}

/// Without the `clickhouse` feature: a ClickHouse store that cannot be opened. It has no
/// values, so [`RollupStore`]'s ClickHouse arms cannot be reached and need no `cfg` of their own
/// (as std's `sys/pal/unsupported` stubs do).
#[cfg(not(feature = "clickhouse"))]
pub mod clickhouse {
    use std::time::Duration;

    use lasthop_analytics::Rollup;

    use super::{ClickHouseUrl, DayRollup, DayState, FlushBatch, StoreError, Stored};
    use crate::Day;

    /// The ClickHouse store (none in this build).
    #[derive(Debug)]
    pub enum ClickHouse {}

    impl ClickHouse {
        /// Always [`StoreError::NotBuilt`].
        pub fn open(_: &ClickHouseUrl) -> Result<ClickHouse, StoreError> {
            Err(StoreError::NotBuilt {
                scheme: "clickhouse://",
                feature: "clickhouse",
            })
        }

        pub fn try_lock(&self, _: &str, _: Duration) -> Result<bool, StoreError> {
            match *self {}
        }

        pub fn stored(
            &self,
            _: Day,
            _: &str,
            _: Option<i32>,
        ) -> Result<Option<Stored>, StoreError> {
            match *self {}
        }

        #[allow(clippy::type_complexity)]
        pub fn stored_day(
            &self,
            _: Day,
            _: Option<i32>,
        ) -> Result<Vec<(Box<str>, Result<Stored, StoreError>)>, StoreError> {
            match *self {}
        }

        pub fn range(&self, _: &str, _: Day, _: Day) -> Result<Vec<DayRollup>, StoreError> {
            match *self {}
        }

        pub fn top_codes(
            &self,
            _: Day,
            _: Day,
            _: usize,
        ) -> Result<Vec<(String, u64)>, StoreError> {
            match *self {}
        }

        pub fn offsets(&self, _: &str) -> Result<Vec<(String, u64)>, StoreError> {
            match *self {}
        }

        pub fn day_state(&self, _: Day) -> Result<Option<DayState>, StoreError> {
            match *self {}
        }

        pub fn commit(&self, _: &FlushBatch) -> Result<(), StoreError> {
            match *self {}
        }

        pub fn replace_day<'a>(
            &self,
            _: Day,
            _: impl Iterator<Item = (&'a str, &'a Rollup)>,
        ) -> Result<DayState, StoreError> {
            match *self {}
        }
    }
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
                domain: "",
                pop: "fra1",
                country: Some(*b"DE"),
                method: Method::Get,
                tls: true,
                prefetch: false,
                protocol: Default::default(),
                early: false,
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
                        body: super::RowBody::Bytes(b"\xffnot a rollup".to_vec()),
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
