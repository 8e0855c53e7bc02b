//! `GET /v1/links/{code}/stats`: a link's rollups over a range of days, merged. The link is
//! named by its key, as the processor keys its rollups: the code on the default domain,
//! `domain/code` on a branded one.

use lasthop_analytics::{Breakdown, Rollup};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::store::{DayRollup, DayState, RollupStore, StoreError};
use super::Day;

/// Days shown when the caller names no range (ending today).
pub const DEFAULT_DAYS: u32 = 30;
/// The longest range one call may ask for, in days.
pub const MAX_DAYS: u32 = 366;

/// Why a range was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RangeError {
    /// `from` or `to` is not `YYYY-MM-DD`.
    #[error("`{0}` must be a date, YYYY-MM-DD")]
    BadDate(&'static str),
    /// `from` is after `to`.
    #[error("`from` is after `to`")]
    Reversed,
    /// More than [`MAX_DAYS`] days.
    #[error("the range is longer than {MAX_DAYS} days")]
    TooLong,
}

impl RangeError {
    /// The API's machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            RangeError::BadDate(_) => "invalid_date",
            RangeError::Reversed | RangeError::TooLong => "invalid_range",
        }
    }
}

/// The range a query asks for: `to` defaults to today, `from` to [`DEFAULT_DAYS`] days up to `to`.
pub fn range(from: Option<&str>, to: Option<&str>, today: Day) -> Result<(Day, Day), RangeError> {
    let to = match to {
        None => today,
        Some(s) => Day::parse(s).ok_or(RangeError::BadDate("to"))?,
    };
    let from = match from {
        None => to.minus(DEFAULT_DAYS - 1),
        Some(s) => Day::parse(s).ok_or(RangeError::BadDate("from"))?,
    };
    if from > to {
        return Err(RangeError::Reversed);
    }
    if to.0 - from.0 >= MAX_DAYS {
        return Err(RangeError::TooLong);
    }
    Ok((from, to))
}

/// The stats answer for `code` from `from` to `to`.
pub fn stats(store: &RollupStore, code: &str, from: Day, to: Day) -> Result<Value, StoreError> {
    Ok(render(code, from, to, &store.range(code, from, to)?))
}

/// The stats answer for `code` from `from` to `to` out of `days` (one region's, or several
/// merged by [`merge`]). Visitors are hashed with a salt that changes every day, so a day's
/// `unique_visitors` is a distinct count but a range's is not: the range says `visitor_days`
/// (the sum of its days' unique visitors), named for what it is.
pub fn render(code: &str, from: Day, to: Day, days: &[DayRollup]) -> Value {
    let mut total = Rollup::default();
    let mut per_day = Vec::with_capacity(days.len());
    let mut visitor_days = 0u64;
    for d in days {
        total.merge(&d.rollup);
        visitor_days += d.rollup.uniques.estimate();
        per_day.push(json!({
            "day": d.day.to_string(),
            "clicks": d.rollup.human,
            "bot_clicks": d.rollup.bot,
            "unique_visitors": d.rollup.uniques.estimate(),
            "state": d.state.as_str(),
        }));
    }
    let counts = |b: &Breakdown| json!(b.sorted());
    json!({
        "code": code,
        "from": from.to_string(),
        "to": to.to_string(),
        "clicks": total.human,
        "bot_clicks": total.bot,
        "visitor_days": visitor_days,
        "days": per_day,
        "countries": counts(&total.countries),
        "referrers": counts(&total.referrers),
        "devices": counts(&total.devices),
        "browsers": counts(&total.browsers),
        "os": counts(&total.oses),
        "bot_reasons": counts(&total.bot_reasons),
    })
}

/// Adds another region's days to `days`: a day both have is merged (counts summed, unique
/// sketches merged, so a visitor counted in both regions counts once), and is `open` while
/// either region's is, `closed` while either is closed, else `recomputed`.
pub fn merge(days: &mut Vec<DayRollup>, more: Vec<DayRollup>) {
    for d in more {
        match days.binary_search_by_key(&d.day, |x| x.day) {
            Ok(i) => {
                days[i].rollup.merge(&d.rollup);
                days[i].state = days[i].state.min(d.state);
            }
            Err(i) => days.insert(i, d),
        }
    }
}

/// One day of a code's rollup as a peer region sends it (`GET /peer/v1/stats/{code}`): the
/// rollup's stored bytes (`Rollup::to_bytes`, with its unique-visitor sketch), base64.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireDay {
    pub day: String,
    pub state: String,
    pub rollup: String,
}

/// `days` as they travel to a peer region.
pub fn to_wire(days: &[DayRollup]) -> Vec<WireDay> {
    use base64::Engine as _;
    days.iter()
        .map(|d| WireDay {
            day: d.day.to_string(),
            state: d.state.as_str().to_string(),
            rollup: base64::engine::general_purpose::STANDARD.encode(d.rollup.to_bytes()),
        })
        .collect()
}

/// A peer region's days, checked: in order, each a valid day, state and rollup.
pub fn from_wire(days: Vec<WireDay>) -> Result<Vec<DayRollup>, String> {
    use base64::Engine as _;
    let mut out: Vec<DayRollup> = Vec::with_capacity(days.len());
    for w in days {
        let day = Day::parse(&w.day).ok_or_else(|| format!("bad day `{}`", w.day))?;
        let state = DayState::parse(&w.state).ok_or_else(|| format!("bad state `{}`", w.state))?;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(w.rollup.as_bytes())
            .map_err(|e| format!("{day}: {e}"))?;
        let rollup = Rollup::from_bytes(&bytes).map_err(|e| format!("{day}: {e}"))?;
        if out.last().is_some_and(|l| l.day >= day) {
            return Err(format!("{day} is out of order"));
        }
        out.push(DayRollup { day, rollup, state });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        let today = Day::parse("2026-03-31").unwrap();
        let (f, t) = range(None, None, today).unwrap();
        assert_eq!((f.to_string(), t), ("2026-03-02".to_string(), today));
        let (f, t) = range(Some("2026-01-01"), Some("2026-01-01"), today).unwrap();
        assert_eq!(f, t);
        assert_eq!(
            range(Some("2026-02-30"), None, today),
            Err(RangeError::BadDate("from"))
        );
        assert_eq!(
            range(None, Some("soon"), today),
            Err(RangeError::BadDate("to"))
        );
        assert_eq!(
            range(Some("2026-03-02"), Some("2026-03-01"), today),
            Err(RangeError::Reversed)
        );
        assert!(range(Some("2025-03-31"), Some("2026-03-31"), today).is_ok()); // 366 days
        assert_eq!(
            range(Some("2025-03-30"), Some("2026-03-31"), today),
            Err(RangeError::TooLong)
        );
    }

    fn day(d: &str, human: u64, visitors: &[u64], state: DayState) -> DayRollup {
        let mut rollup = Rollup {
            human,
            ..Rollup::default()
        };
        for v in visitors {
            rollup.uniques.insert(*v);
        }
        DayRollup {
            day: Day::parse(d).unwrap(),
            rollup,
            state,
        }
    }

    /// Two regions' days merge: counts add, a visitor seen in both counts once, the day is as
    /// open as either region's; the wire form round-trips and refuses garbage.
    #[test]
    fn regions_merge_by_day() {
        let mut ours = vec![
            day("2026-03-01", 3, &[1, 2], DayState::Closed),
            day("2026-03-03", 1, &[9], DayState::Open),
        ];
        let theirs = vec![
            day("2026-03-01", 2, &[2, 3], DayState::Open),
            day("2026-03-02", 5, &[4], DayState::Recomputed),
        ];
        let theirs = from_wire(to_wire(&theirs)).unwrap();
        merge(&mut ours, theirs);
        let v = render(
            "abc1234",
            Day::parse("2026-03-01").unwrap(),
            Day::parse("2026-03-03").unwrap(),
            &ours,
        );
        assert_eq!(v["clicks"], 11);
        assert_eq!(v["visitor_days"], 5);
        assert!(v.get("unique_visitors").is_none(), "{v}");
        assert_eq!(v["days"][0]["unique_visitors"], 3);
        assert_eq!(v["days"][0]["clicks"], 5);
        assert_eq!(v["days"][0]["state"], "open");
        assert_eq!(v["days"][1]["day"], "2026-03-02");
        let bad = |f: fn(&mut WireDay)| {
            let mut w = to_wire(&[day("2026-03-01", 1, &[1], DayState::Open)]);
            f(&mut w[0]);
            from_wire(w)
        };
        assert!(bad(|w| w.rollup = "!!".into()).is_err());
        assert!(bad(|w| w.rollup = "AAAA".into()).is_err());
        assert!(bad(|w| w.day = "2026-02-30".into()).is_err());
        assert!(bad(|w| w.state = "done".into()).is_err());
        let twice = [
            day("2026-03-01", 1, &[], DayState::Open),
            day("2026-03-01", 1, &[], DayState::Open),
        ];
        assert!(from_wire(to_wire(&twice)).is_err());
    }
}
