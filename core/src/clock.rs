//! Wall-clock time as Unix milliseconds, and its RFC 3339 spelling in the API.

use chrono::{DateTime, SecondsFormat, Utc};

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// RFC 3339 with milliseconds and `Z`, e.g. `2026-11-30T08:30:00.123Z`.
pub fn rfc3339(ms: i64) -> String {
    match DateTime::<Utc>::from_timestamp_millis(ms) {
        Some(t) => t.to_rfc3339_opts(SecondsFormat::Millis, true),
        // Out of chrono's range (±262,000 years): only reachable with a corrupt record.
        None => format!("@{ms}ms"),
    }
}

/// Parses an RFC 3339 timestamp into Unix milliseconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc).timestamp_millis())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let ms = 1_796_027_400_123;
        assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms));
        assert_eq!(
            parse_rfc3339("2026-11-30T09:30:00+01:00"),
            parse_rfc3339("2026-11-30T08:30:00Z")
        );
        assert_eq!(parse_rfc3339("tomorrow"), None);
        assert_eq!(parse_rfc3339("2026-13-01T00:00:00Z"), None);
    }
}
