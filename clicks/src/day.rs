//! UTC days: the unit of rollups, the archive and recompute.

use std::fmt;

use chrono::{Datelike, NaiveDate};

/// Milliseconds in a day ([`lasthop_core::day::DAY_MS`], unsigned as event times are).
pub const DAY_MS: u64 = lasthop_core::day::DAY_MS as u64;

/// A UTC calendar day, as days since 1970-01-01.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Day(pub u32);

fn epoch() -> NaiveDate {
    NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default()
}

impl Day {
    /// The day an event at `ms` (Unix milliseconds) belongs to. Times past year ~11.7 million
    /// saturate; the processor rejects events from the future long before that.
    pub fn of_ms(ms: u64) -> Day {
        let day = lasthop_core::day::of_ms(i64::try_from(ms).unwrap_or(i64::MAX));
        Day(u32::try_from(day).unwrap_or(u32::MAX))
    }

    /// Today, by the wall clock.
    pub fn today() -> Day {
        Day::of_ms(u64::try_from(lasthop_core::clock::now_ms()).unwrap_or(0))
    }

    /// The first millisecond of the day.
    pub fn start_ms(self) -> u64 {
        u64::from(self.0) * DAY_MS
    }

    /// The first millisecond after the day.
    pub fn end_ms(self) -> u64 {
        (u64::from(self.0) + 1) * DAY_MS
    }

    /// `YYYY-MM-DD`, from 1970-01-01 on; anything else is `None`.
    pub fn parse(s: &str) -> Option<Day> {
        if s.len() != 10 {
            return None;
        }
        let date = NaiveDate::parse_from_str(s, "%Y-%m-%d").ok()?;
        let days = date.signed_duration_since(epoch()).num_days();
        u32::try_from(days).ok().map(Day)
    }

    /// The day `n` days before this one (saturating at 1970-01-01).
    pub fn minus(self, n: u32) -> Day {
        Day(self.0.saturating_sub(n))
    }

    /// The day after.
    pub fn next(self) -> Day {
        Day(self.0.saturating_add(1))
    }
}

impl fmt::Display for Day {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match epoch().checked_add_days(chrono::Days::new(u64::from(self.0))) {
            Some(d) => write!(f, "{:04}-{:02}-{:02}", d.year(), d.month(), d.day()),
            None => write!(f, "day-{}", self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_print() {
        let d = Day::parse("2026-11-30").unwrap();
        assert_eq!(d.to_string(), "2026-11-30");
        assert_eq!(Day::of_ms(d.start_ms()), d);
        assert_eq!(Day::of_ms(d.end_ms() - 1), d);
        assert_eq!(Day::of_ms(d.end_ms()), d.next());
        assert_eq!(Day::parse("1970-01-01"), Some(Day(0)));
        for bad in [
            "2026-13-01",
            "2026-1-01",
            "1969-12-31",
            "yesterday",
            "2026-11-30T00",
        ] {
            assert_eq!(Day::parse(bad), None, "{bad}");
        }
    }
}
