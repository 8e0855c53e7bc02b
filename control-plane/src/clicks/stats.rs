//! `GET /v1/links/{code}/stats`: a code's rollups over a range of days, merged.

use lasthop_analytics::{Breakdown, Rollup};
use serde_json::{json, Value};

use super::store::{RollupStore, StoreError};
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
    let days = store.range(code, from, to)?;
    let mut total = Rollup::default();
    let mut per_day = Vec::with_capacity(days.len());
    for d in &days {
        total.merge(&d.rollup);
        per_day.push(json!({
            "day": d.day.to_string(),
            "clicks": d.rollup.human,
            "bot_clicks": d.rollup.bot,
            "unique_visitors": d.rollup.uniques.estimate(),
            "state": d.state.as_str(),
        }));
    }
    let counts = |b: &Breakdown| json!(b.sorted());
    Ok(json!({
        "code": code,
        "from": from.to_string(),
        "to": to.to_string(),
        "clicks": total.human,
        "bot_clicks": total.bot,
        "unique_visitors": total.uniques.estimate(),
        "days": per_day,
        "countries": counts(&total.countries),
        "referrers": counts(&total.referrers),
        "devices": counts(&total.devices),
        "browsers": counts(&total.browsers),
        "os": counts(&total.oses),
        "bot_reasons": counts(&total.bot_reasons),
    }))
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
}
