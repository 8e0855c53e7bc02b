//! The ClickHouse rollup store (`--clicks-store clickhouse://HOST:8123/DB`), for an analytics
//! tier of several processors sharing one Kafka consumer group.
//!
//! Two tables, both `ReplacingMergeTree` (in every ClickHouse since 2017; tests run Debian's
//! 18.16), talked to over the HTTP interface: rows go in as `RowBinary`, answers come back as
//! `TabSeparated` with the sketches hex-encoded.
//!
//! - `rollups (day, code, part, gen, version, human, bot, rollup)`, sorted by `(day, code,
//!   part)`: one row per (code, day) and Kafka partition, holding the whole
//!   [`Rollup::to_bytes`] (counts, HyperLogLog uniques, breakdowns) of that partition's events.
//!   A processor rewrites its row at every flush; `version` is `gen << 44 | next`, where `next`
//!   is the partition offset the row has counted up to, so of two writes of one row the one
//!   that counted further wins, in merges and in every read (`argMax(_, version)`), whoever
//!   wrote it and in whatever order they landed. Reads merge a (code, day)'s partitions'
//!   sketches in Rust. `code` is the link key: the code, or `domain/code` on a branded domain
//!   (a `String` column, no width to outgrow). Source positions live in the same table, as rows of day 0 (`code` the
//!   position's key, `human` the position), so one `INSERT` (one block, one part: the table has
//!   no partition key) commits a flush's rollups and positions together.
//! - `days (day, gen, state, version)`: each day's state (open, closed, recomputed) and its
//!   generation. A recompute writes the day's rows under the next generation (as partition
//!   [`RECOMPUTED`]), then switches the day to it; reads ignore rows of other generations, and
//!   an `ALTER TABLE … DELETE` mutation removes them in the background.
//!
//! - `locks (name, holder, nonce, at)`: claims, for jobs one processor of several should run
//!   (the scheduled recompute of a day): see [`ClickHouse::try_lock`].
//!
//! Exactly-once across processors: a processor that takes a partition over starts from the
//! partition's stored position (which never goes backwards: its version is the position), and
//! before counting an event into a (code, day) it loaded, skips it if the row has counted that
//! offset already (a processor that lost the partition may still have written further than the
//! stored position). A processor drops whatever it had not flushed of a partition that leaves
//! it. What is not exact: the dedup window starts empty for a partition taken over, so a
//! duplicate delivery split across the takeover counts twice (edges redeliver within seconds).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use lasthop_analytics::Rollup;

use super::{
    decode, storage, ClickHouseUrl, DayRollup, DayState, FlushBatch, Pos, StoreError, Stored,
};
use crate::Day;

/// The partition of a recompute's rows.
pub const RECOMPUTED: i32 = -2;
/// The partition of rows from a spool (one processor per store).
pub const SPOOL: i32 = -1;
/// Bits of `version` below the generation.
const GEN_SHIFT: u32 = 44;
const LOW_MASK: u64 = (1 << GEN_SHIFT) - 1;
const TIMEOUT: Duration = Duration::from_secs(30);
/// The largest answer read (a stats range of a year of dense sketches is about 12 MiB).
const MAX_ANSWER: u64 = 1 << 30;

/// A server answer that is not 200: its status and ClickHouse's message.
#[derive(Debug, thiserror::Error)]
#[error("clickhouse answered {status}: {message}")]
pub struct ServerError {
    status: u16,
    message: String,
}

/// An answer that does not parse as what was asked.
#[derive(Debug, thiserror::Error)]
#[error("clickhouse: unexpected answer: {0}")]
pub struct BadAnswer(String);

/// The ClickHouse store.
pub struct ClickHouse {
    agent: ureq::Agent,
    url: ClickHouseUrl,
    /// Days whose (generation, state) this process knows (`None`: no state row yet).
    days: Mutex<HashMap<u32, (u32, Option<DayState>)>>,
    /// The last `closed_through` this process applied.
    closed_through: Mutex<Option<u32>>,
    /// The last write sequence handed out (milliseconds, strictly increasing, and past every
    /// sequence already stored: see [`ClickHouse::stored_seq`]); `None` until the first write
    /// (a reader, the stats API, never asks).
    seq: Mutex<Option<u64>>,
}

impl std::fmt::Debug for ClickHouse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClickHouse")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// A string literal for a query: quoted, with `\` and `'` escaped.
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\\' || c == '\'' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('\'');
    out
}

/// `RowBinary` for the columns we use.
#[derive(Default)]
struct Rows(Vec<u8>);

impl Rows {
    fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, v: &[u8]) -> &mut Self {
        let mut n = v.len() as u64;
        loop {
            let b = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                self.0.push(b);
                break;
            }
            self.0.push(b | 0x80);
        }
        self.0.extend_from_slice(v);
        self
    }
}

/// One `TabSeparated` line's fields (our answers hold numbers, hex and link keys, which
/// ClickHouse escapes only for `\`, tab and newline; link keys have none).
fn fields(line: &str) -> Vec<&str> {
    line.split('\t').collect()
}

fn num<T: std::str::FromStr>(s: Option<&&str>) -> Result<T, StoreError> {
    s.and_then(|v| v.parse().ok())
        .ok_or_else(|| storage(BadAnswer(format!("expected a number, got {s:?}"))))
}

fn unhex(day: Day, code: &str, s: Option<&&str>) -> Result<Rollup, StoreError> {
    let bytes = s
        .and_then(|v| hex::decode(v).ok())
        .ok_or_else(|| storage(BadAnswer("expected a hex sketch".into())))?;
    decode(day, code, &bytes)
}

impl ClickHouse {
    /// Connects and creates the database and tables if missing.
    pub fn open(url: &ClickHouseUrl) -> Result<ClickHouse, StoreError> {
        let mut agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(5))
            .timeout(TIMEOUT);
        if url.tls {
            // `clickhouses://`: the server verified against --clicks-store-ca, or the
            // system's trusted CAs, under the versions and suites every lasthop client uses.
            let roots = match &url.ca {
                Some(ca) => lasthop_tls::Roots::CaFile(ca),
                None => lasthop_tls::Roots::System,
            };
            agent = agent.tls_config(lasthop_tls::client_config(roots, None).map_err(storage)?);
        }
        let agent = agent.build();
        let store = ClickHouse {
            agent,
            url: url.clone(),
            days: Mutex::new(HashMap::new()),
            closed_through: Mutex::new(None),
            seq: Mutex::new(None),
        };
        let db = &store.url.database;
        store.execute(&format!("CREATE DATABASE IF NOT EXISTS {db}"), None)?;
        store.execute(
            &format!(
                "CREATE TABLE IF NOT EXISTS {db}.rollups (day UInt32, code String, part Int32, \
                 gen UInt32, version UInt64, human UInt64, bot UInt64, rollup String) \
                 ENGINE = ReplacingMergeTree(version) ORDER BY (day, code, part)"
            ),
            None,
        )?;
        store.execute(
            &format!(
                "CREATE TABLE IF NOT EXISTS {db}.days (day UInt32, gen UInt32, state UInt8, \
                 version UInt64) ENGINE = ReplacingMergeTree(version) ORDER BY day"
            ),
            None,
        )?;
        store.execute(
            &format!(
                "CREATE TABLE IF NOT EXISTS {db}.locks (name String, holder String, nonce UInt64, \
                 at DateTime DEFAULT now()) ENGINE = MergeTree ORDER BY (name, at)"
            ),
            None,
        )?;
        Ok(store)
    }

    /// The largest write sequence in the tables: a spool's rollups and positions, recomputed
    /// rows and day states. A process continues after it, not from its own clock: one that
    /// wrote faster than a sequence a millisecond ran ahead of the wall clock, and a successor
    /// starting from the clock would write rows that lose to its predecessor's older ones
    /// (`argMax(_, version)`) until the clock caught up: the counts of the flushes between
    /// hidden, and a restart in that window reading an old position. Kafka positions and
    /// partition rows are versioned by offsets, not sequences, and left out.
    fn stored_seq(&self) -> Result<u64, StoreError> {
        let db = &self.url.database;
        let mut most = 0u64;
        for query in [
            format!(
                "SELECT max(bitAnd(version, {LOW_MASK})) FROM {db}.rollups WHERE part IN \
                 ({SPOOL}, {RECOMPUTED}) OR (day = 0 AND NOT startsWith(code, 'kafka/'))"
            ),
            format!("SELECT max(version) FROM {db}.days"),
        ] {
            for line in self.select(&query)? {
                let found: u64 = num(fields(&line).first())?;
                most = most.max(found);
            }
        }
        Ok(most)
    }

    /// How long a claimant waits for the others' claims to land before reading who won.
    const SETTLE: Duration = Duration::from_secs(2);

    /// Claims lock `name` and reads the claims back after `SETTLE` (2 s): the earliest live
    /// claim (the server's clock, then a random nonce) wins, and every claimant reads the same
    /// winner. A later claimant sees the earlier claim and loses; one whose claim lands after
    /// another's read would lose in that reader's view too (the earlier claim stays earliest).
    /// Claims older than `ttl` are dead: a winner that died mid-job frees the lock then.
    pub fn try_lock(&self, name: &str, ttl: Duration) -> Result<bool, StoreError> {
        let mut nonce = [0u8; 8];
        getrandom::getrandom(&mut nonce).map_err(|e| storage(BadAnswer(e.to_string())))?;
        let nonce = u64::from_le_bytes(nonce);
        let holder = format!("{}:{}", std::process::id(), nonce);
        let mut body = Rows::default();
        body.bytes(name.as_bytes())
            .bytes(holder.as_bytes())
            .u64(nonce);
        let db = &self.url.database;
        self.execute(
            &format!("INSERT INTO {db}.locks (name, holder, nonce) FORMAT RowBinary"),
            Some(&body.0),
        )?;
        std::thread::sleep(Self::SETTLE);
        let winner = self.select(&format!(
            "SELECT holder FROM {db}.locks WHERE name = {} AND at >= now() - {} \
             ORDER BY at, nonce LIMIT 1",
            quote(name),
            ttl.as_secs().max(1)
        ))?;
        Ok(winner.first().is_some_and(|w| *w == holder))
    }

    /// Runs `query`; with `body`, the query is an `INSERT … FORMAT RowBinary` and `body` its
    /// rows. Returns the answer's text.
    fn execute(&self, query: &str, body: Option<&[u8]>) -> Result<String, StoreError> {
        let mut req = self.agent.post(&self.url.endpoint);
        if let Some((user, password)) = &self.url.user {
            req = req
                .set("X-ClickHouse-User", user)
                .set("X-ClickHouse-Key", password);
        }
        let answer = match body {
            Some(rows) => req.query("query", query).send_bytes(rows),
            None => req.send_string(query),
        };
        match answer {
            // Not `into_string`, which refuses answers over 10 MiB (a year of a popular code's
            // sketches is more).
            Ok(r) => {
                use std::io::Read as _;
                let mut text = String::new();
                r.into_reader()
                    .take(MAX_ANSWER)
                    .read_to_string(&mut text)
                    .map_err(storage)?;
                Ok(text)
            }
            Err(ureq::Error::Status(status, r)) => Err(storage(ServerError {
                status,
                message: r
                    .into_string()
                    .unwrap_or_default()
                    .trim()
                    .chars()
                    .take(500)
                    .collect(),
            })),
            Err(e) => Err(storage(e)),
        }
    }

    /// Inserts `body`'s rows into `rollups` in one block (nothing when there are none).
    fn insert_rollups(&self, body: &Rows) -> Result<(), StoreError> {
        if body.0.is_empty() {
            return Ok(());
        }
        let db = &self.url.database;
        self.execute(
            &format!(
                "INSERT INTO {db}.rollups (day, code, part, gen, version, human, bot, rollup) \
                 FORMAT RowBinary"
            ),
            Some(&body.0),
        )?;
        Ok(())
    }

    fn select(&self, query: &str) -> Result<Vec<String>, StoreError> {
        let text = self.execute(&format!("{query} FORMAT TabSeparated"), None)?;
        Ok(text.lines().map(str::to_owned).collect())
    }

    /// A strictly increasing write sequence (wall milliseconds, or one past the last when
    /// that is later), for rows with one writer. One per write, not one per row: a flush of
    /// thousands of rows takes one, so the sequence keeps to the clock.
    /// The first one continues after the largest stored ([`stored_seq`](Self::stored_seq)).
    fn next_seq(&self) -> Result<u64, StoreError> {
        let now = u64::try_from(lasthop_core::clock::now_ms()).unwrap_or(0);
        let mut seq = self.seq.lock().unwrap_or_else(|e| e.into_inner());
        let last = match *seq {
            Some(last) => last,
            None => self.stored_seq()?,
        };
        let next = (last + 1).max(now);
        *seq = Some(next);
        Ok(next)
    }

    /// (generation, state) of the days from `from` to `to` that have a state row.
    fn day_rows(&self, from: u32, to: u32) -> Result<HashMap<u32, (u32, DayState)>, StoreError> {
        let db = &self.url.database;
        let mut out = HashMap::new();
        for line in self.select(&format!(
            "SELECT day, argMax(gen, version), argMax(state, version) FROM {db}.days \
             WHERE day >= {from} AND day <= {to} GROUP BY day"
        ))? {
            let f = fields(&line);
            let day: u32 = num(f.first())?;
            let gen: u32 = num(f.get(1))?;
            let state: u8 = num(f.get(2))?;
            out.insert(day, (gen, DayState::from_u8(state)));
        }
        Ok(out)
    }

    /// A day's (generation, state), from this process's memory or the server; a day with no
    /// state row is generation 0, no state.
    fn day(&self, day: Day) -> Result<(u32, Option<DayState>), StoreError> {
        if let Some(known) = self
            .days
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&day.0)
        {
            return Ok(*known);
        }
        let found = self
            .day_rows(day.0, day.0)?
            .remove(&day.0)
            .map_or((0, None), |(g, s)| (g, Some(s)));
        self.days
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(day.0, found);
        Ok(found)
    }

    fn set_days(&self, rows: &[(u32, u32, DayState)]) -> Result<(), StoreError> {
        if rows.is_empty() {
            return Ok(());
        }
        let mut body = Rows::default();
        let seq = self.next_seq()?;
        for &(day, gen, state) in rows {
            body.u32(day).u32(gen).u8(state.to_u8()).u64(seq);
        }
        let db = &self.url.database;
        self.execute(
            &format!("INSERT INTO {db}.days (day, gen, state, version) FORMAT RowBinary"),
            Some(&body.0),
        )?;
        let mut known = self.days.lock().unwrap_or_else(|e| e.into_inner());
        for &(day, gen, state) in rows {
            known.insert(day, (gen, Some(state)));
        }
        Ok(())
    }

    /// The row of `code` on `day` from partition `part` (a spool's when `None`), if it belongs
    /// to the day's generation.
    pub fn stored(
        &self,
        day: Day,
        code: &str,
        part: Option<i32>,
    ) -> Result<Option<Stored>, StoreError> {
        self.rows_of(day, part, Some(code))?
            .pop()
            .map(|(_, row)| row)
            .transpose()
    }

    /// Every row of `day` from partition `part` (a spool's when `None`) in the day's
    /// generation.
    #[allow(clippy::type_complexity)]
    pub fn stored_day(
        &self,
        day: Day,
        part: Option<i32>,
    ) -> Result<Vec<(Box<str>, Result<Stored, StoreError>)>, StoreError> {
        self.rows_of(day, part, None)
    }

    /// The rows of `day` from partition `part` in the day's generation: all of them, or
    /// `code`'s alone.
    #[allow(clippy::type_complexity)]
    fn rows_of(
        &self,
        day: Day,
        part: Option<i32>,
        code: Option<&str>,
    ) -> Result<Vec<(Box<str>, Result<Stored, StoreError>)>, StoreError> {
        let (gen, _) = self.day(day)?;
        let part_no = part.unwrap_or(SPOOL);
        let db = &self.url.database;
        let only = code.map_or(String::new(), |c| format!(" AND code = {}", quote(c)));
        let mut out = Vec::new();
        for line in self.select(&format!(
            "SELECT code, hex(argMax(rollup, version)), argMax(gen, version), max(version) \
             FROM {db}.rollups WHERE day = {} AND part = {part_no}{only} GROUP BY code",
            day.0
        ))? {
            let f = fields(&line);
            let code = f.first().copied().unwrap_or_default();
            if num::<u32>(f.get(2))? != gen {
                continue;
            }
            let version: u64 = num(f.get(3))?;
            let row = unhex(day, code, f.get(1)).map(|rollup| Stored {
                rollup,
                at: part.map(|part| Pos {
                    part,
                    next: version & LOW_MASK,
                }),
            });
            out.push((code.into(), row));
        }
        Ok(out)
    }

    /// `code`'s rollups from `from` to `to`: each day's partitions of its generation, merged.
    pub fn range(&self, code: &str, from: Day, to: Day) -> Result<Vec<DayRollup>, StoreError> {
        let (from, to) = (from.0.max(1), to.0);
        if from > to {
            return Ok(Vec::new());
        }
        let days = self.day_rows(from, to)?;
        let db = &self.url.database;
        let mut out: Vec<DayRollup> = Vec::new();
        for line in self.select(&format!(
            "SELECT day, argMax(gen, version), hex(argMax(rollup, version)) FROM {db}.rollups \
             WHERE code = {} AND day >= {from} AND day <= {to} GROUP BY day, part ORDER BY day",
            quote(code)
        ))? {
            let f = fields(&line);
            let day = Day(num(f.first())?);
            let gen: u32 = num(f.get(1))?;
            let (current, state) = days.get(&day.0).copied().unwrap_or((0, DayState::Open));
            if gen != current {
                continue;
            }
            let rollup = unhex(day, code, f.get(2))?;
            match out.last_mut() {
                Some(last) if last.day == day => last.rollup.merge(&rollup),
                _ => out.push(DayRollup { day, rollup, state }),
            }
        }
        Ok(out)
    }

    /// The `n` codes with the most human clicks from `from` to `to`, summed in the server.
    pub fn top_codes(
        &self,
        from: Day,
        to: Day,
        n: usize,
    ) -> Result<Vec<(String, u64)>, StoreError> {
        let (from, to) = (from.0.max(1), to.0);
        if from > to || n == 0 {
            return Ok(Vec::new());
        }
        let days = self.day_rows(from, to)?;
        // Each day of the range with its generation (0 for a day with no state row yet).
        let gens: Vec<String> = (from..=to)
            .map(|d| format!("({d}, {})", days.get(&d).map_or(0, |g| g.0)))
            .collect();
        let db = &self.url.database;
        let mut out = Vec::new();
        for line in self.select(&format!(
            "SELECT code, sum(h) AS s FROM (SELECT day, code, argMax(human, version) AS h, \
             argMax(gen, version) AS g FROM {db}.rollups WHERE day >= {from} AND day <= {to} \
             GROUP BY day, code, part) WHERE (day, g) IN ({}) GROUP BY code HAVING s > 0 \
             ORDER BY s DESC, code LIMIT {n}",
            gens.join(", ")
        ))? {
            let f = fields(&line);
            let code = f
                .first()
                .ok_or_else(|| storage(BadAnswer("no code".into())))?;
            out.push(((*code).to_owned(), num(f.get(1))?));
        }
        Ok(out)
    }

    /// Source positions whose key starts with `prefix`.
    pub fn offsets(&self, prefix: &str) -> Result<Vec<(String, u64)>, StoreError> {
        let db = &self.url.database;
        let mut out = Vec::new();
        for line in self.select(&format!(
            "SELECT code, argMax(human, version), argMax(bot, version) FROM {db}.rollups \
             WHERE day = 0 GROUP BY code ORDER BY code"
        ))? {
            let f = fields(&line);
            let Some(key) = f.first().filter(|k| k.starts_with(prefix)) else {
                continue;
            };
            let position: u64 = num(f.get(1))?;
            let set: u8 = num(f.get(2))?;
            if set == 1 {
                out.push(((*key).to_owned(), position));
            }
        }
        Ok(out)
    }

    /// A day's state; `None` when it never had one.
    pub fn day_state(&self, day: Day) -> Result<Option<DayState>, StoreError> {
        Ok(self.day_rows(day.0, day.0)?.remove(&day.0).map(|(_, s)| s))
    }

    /// One flush: the rollup rows and the positions in one `INSERT`, then the days' states.
    pub fn commit(&self, batch: &FlushBatch) -> Result<(), StoreError> {
        let mut body = Rows::default();
        // One sequence for the flush: its rows and positions are one write (each key once).
        let seq = self.next_seq()?;
        // Each row's bytes go through one buffer into the body: the body is the flush's only
        // copy of its sketches.
        let mut bytes = Vec::new();
        for row in &batch.rollups {
            let (gen, _) = self.day(row.day)?;
            let (part, low) = match row.at {
                Some(at) => (at.part, at.next.min(LOW_MASK)),
                None => (SPOOL, seq & LOW_MASK),
            };
            body.u32(row.day.0)
                .bytes(row.code.as_bytes())
                .i32(part)
                .u32(gen)
                .u64(u64::from(gen) << GEN_SHIFT | low)
                .u64(row.human)
                .u64(row.bot);
            bytes.clear();
            row.body.write(&mut bytes);
            body.bytes(&bytes);
        }
        for (key, value) in &batch.offsets {
            // A Kafka position only moves forward (its version is the position, so a processor
            // that lost the partition cannot move it back); a spool file's has one writer.
            let version = match value {
                Some(v) if key.starts_with("kafka/") => *v,
                _ => seq,
            };
            body.u32(0)
                .bytes(key.as_bytes())
                .i32(0)
                .u32(0)
                .u64(version)
                .u64(value.unwrap_or(0))
                .u64(u64::from(value.is_some()))
                .bytes(b"");
        }
        self.insert_rollups(&body)?;
        let mut days = Vec::new();
        for day in &batch.touched_days {
            let (gen, state) = self.day(*day)?;
            if state != Some(DayState::Open) && !days.iter().any(|(d, _, _)| *d == day.0) {
                days.push((day.0, gen, DayState::Open));
            }
        }
        self.set_days(&days)?;
        if let Some(last) = batch.closed_through {
            let mut applied = self
                .closed_through
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if *applied != Some(last.0) {
                let closing: Vec<(u32, u32, DayState)> = self
                    .day_rows(1, last.0)?
                    .into_iter()
                    .filter(|(_, (_, s))| *s == DayState::Open)
                    .map(|(d, (g, _))| (d, g, DayState::Closed))
                    .collect();
                self.set_days(&closing)?;
                *applied = Some(last.0);
            }
        }
        Ok(())
    }

    /// Writes `rollups` as `day`'s next generation, switches the day to it (an open day stays
    /// open, any other becomes recomputed), and has the server delete the older generations'
    /// rows in the background.
    pub fn replace_day<'a>(
        &self,
        day: Day,
        rollups: impl Iterator<Item = (&'a str, &'a Rollup)>,
    ) -> Result<DayState, StoreError> {
        // Fresh from the server: another processor may have moved the day.
        self.days
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&day.0);
        let (gen, was) = self.day(day)?;
        let next = gen.saturating_add(1);
        let seq = self.next_seq()?;
        let mut body = Rows::default();
        for (code, rollup) in rollups {
            let bytes = rollup.to_bytes();
            body.u32(day.0)
                .bytes(code.as_bytes())
                .i32(RECOMPUTED)
                .u32(next)
                // Two recomputes of one generation (a crash before the switch, then another):
                // the later write wins.
                .u64(u64::from(next) << GEN_SHIFT | (seq & LOW_MASK))
                .u64(rollup.human)
                .u64(rollup.bot)
                .bytes(&bytes);
        }
        self.insert_rollups(&body)?;
        let db = &self.url.database;
        let state = if was == Some(DayState::Open) {
            DayState::Open
        } else {
            DayState::Recomputed
        };
        self.set_days(&[(day.0, next, state)])?;
        // Garbage only (reads already skip it): a failure is logged, not returned.
        if let Err(e) = self.execute(
            &format!(
                "ALTER TABLE {db}.rollups DELETE WHERE day = {} AND gen < {next}",
                day.0
            ),
            None,
        ) {
            tracing::warn!(error = %e, %day, "deleting the day's older rollups");
        }
        Ok(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_and_row_binary() {
        assert_eq!(quote(r"a'b\c"), r"'a\'b\\c'");
        let mut r = Rows::default();
        r.u32(1).bytes(&[7; 200]).i32(-1);
        assert_eq!(&r.0[..4], &[1, 0, 0, 0]);
        // 200 = 0xC8: LEB128 0xC8 0x01.
        assert_eq!(&r.0[4..6], &[0xc8, 0x01]);
        assert_eq!(&r.0[206..], &[0xff; 4]);
    }
}
