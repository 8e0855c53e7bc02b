//! Times as the exports spell them, into Unix milliseconds.
//!
//! Each spelling is rewritten into RFC 3339 and handed to [`crate::clock::parse_rfc3339`], so
//! the calendar arithmetic is chrono's, done once:
//!
//! | spelling                         | who writes it                                   |
//! |----------------------------------|-------------------------------------------------|
//! | `2024-05-01T10:00:00.123Z`       | Kutt and Dub (`Date.toISOString()`), lasthop     |
//! | `2023-05-01T10:00:00+02:00`      | Shlink (PHP's `DATE_ATOM`)                       |
//! | `2021-03-04T05:06:07+0000`       | Bitly API v4 (`created_at`)                      |
//! | `2020-01-02 03:04:05`            | YOURLS (a MySQL `timestamp`), Kutt on SQLite     |
//! | `2020-01-02`                     | spreadsheets (midnight UTC)                      |
//! | `1714557600`                     | Unix seconds, accepted by lasthop's CSV          |
//! | `0000-00-00 00:00:00`            | MySQL's zero date: no time at all                |
//!
//! A time without an offset is UTC: YOURLS stores the server's local time in a column that
//! carries no zone, and UTC is the only guess that is right for most servers. A wrong guess
//! moves a creation date by hours, which nothing downstream depends on.

/// A time none of the spellings reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Malformed;

/// Year 1 to year 9999, the range RFC 3339 can spell.
const MIN_MS: i64 = -62_135_596_800_000;
const MAX_MS: i64 = 253_402_300_799_999;

/// Reads `s` (trimmed; empty is no time) into Unix milliseconds.
pub(super) fn parse(s: &str) -> Result<Option<i64>, Malformed> {
    let s = s.trim();
    if s.is_empty() || s.starts_with("0000-00-00") {
        return Ok(None);
    }
    let digits = s.strip_prefix('-').unwrap_or(s);
    if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<i64>()
            .ok()
            .and_then(|secs| secs.checked_mul(1000))
            .filter(|ms| (MIN_MS..=MAX_MS).contains(ms))
            .map(Some)
            .ok_or(Malformed);
    }
    let rfc3339 = normalize(s).ok_or(Malformed)?;
    crate::clock::parse_rfc3339(&rfc3339)
        .map(Some)
        .ok_or(Malformed)
}

/// `s` spelled as RFC 3339, if it has one of the shapes above.
fn normalize(s: &str) -> Option<String> {
    // Byte offsets below are character offsets only in ASCII.
    if !s.is_ascii() || s.len() < 10 {
        return None;
    }
    let (date, rest) = s.split_at(10);
    if rest.is_empty() {
        return Some(format!("{date}T00:00:00Z"));
    }
    let time = rest.strip_prefix(['T', 't', ' '])?;
    // HH:MM:SS, then an optional fraction.
    let mut end = 8.min(time.len());
    if time.as_bytes().get(end) == Some(&b'.') {
        end += 1;
        end += time[end..].bytes().take_while(u8::is_ascii_digit).count();
    }
    let (clock, zone) = time.split_at(end);
    let zone = zone.trim_start();
    let zone = match zone.as_bytes() {
        [] | [b'Z' | b'z'] => "Z".to_string(),
        _ if zone.eq_ignore_ascii_case("utc") || zone.eq_ignore_ascii_case("gmt") => {
            "Z".to_string()
        }
        // +HH:MM as it is; +HHMM and +HH given their colon and minutes.
        [b'+' | b'-', _, _, b':', _, _] => zone.to_string(),
        [sign @ (b'+' | b'-'), h1, h2, m1, m2] => {
            format!(
                "{}{}{}:{}{}",
                *sign as char, *h1 as char, *h2 as char, *m1 as char, *m2 as char
            )
        }
        [sign @ (b'+' | b'-'), h1, h2] => {
            format!("{}{}{}:00", *sign as char, *h1 as char, *h2 as char)
        }
        _ => return None,
    };
    Some(format!("{date}T{clock}{zone}"))
}

/// `ms` as RFC 3339 in UTC, with milliseconds only when there are some:
/// `2024-05-01T10:00:00Z`, `2024-05-01T10:00:00.250Z`.
pub(super) fn format(ms: i64) -> String {
    let full = crate::clock::rfc3339(ms);
    match full.strip_suffix(".000Z") {
        Some(seconds) => format!("{seconds}Z"),
        None => full,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2021-03-04T05:06:07Z.
    const T: i64 = 1_614_834_367_000;

    #[test]
    fn every_spelling_the_exports_use_reads_the_same_instant() {
        for s in [
            "2021-03-04T05:06:07Z",
            "2021-03-04T05:06:07.000Z",
            "2021-03-04T05:06:07+00:00",
            "2021-03-04T05:06:07+0000",
            "2021-03-04T06:06:07+01",
            "2021-03-04T00:06:07-0500",
            "2021-03-04 05:06:07",
            "2021-03-04 05:06:07 UTC",
            "2021-03-04t05:06:07z",
            "  2021-03-04T05:06:07Z\t",
            "1614834367",
        ] {
            assert_eq!(parse(s), Ok(Some(T)), "{s}");
        }
        assert_eq!(parse("2021-03-04T05:06:07.25Z"), Ok(Some(T + 250)));
        assert_eq!(
            parse("2021-03-04"),
            Ok(Some(T - (5 * 3600 + 6 * 60 + 7) * 1000))
        );
        assert_eq!(parse("-1"), Ok(Some(-1000)));
    }

    #[test]
    fn empty_and_the_mysql_zero_date_are_no_time() {
        assert_eq!(parse(""), Ok(None));
        assert_eq!(parse("   "), Ok(None));
        assert_eq!(parse("0000-00-00 00:00:00"), Ok(None));
        assert_eq!(parse("0000-00-00"), Ok(None));
    }

    #[test]
    fn anything_else_is_malformed() {
        for s in [
            "yesterday",
            "2021-13-04T05:06:07Z",
            "2021-03-04T25:06:07Z",
            "2021-03-04X05:06:07Z",
            "2021-03-04T05:06",
            "2021-03-04T05:06:07+5",
            "2021-03-04T05:06:07 Europe/Paris",
            "2021-03-04T05:06:07é",
            "04/03/2021",
            "99999999999999999999",
            "999999999999999",
            "1.5",
            "-",
        ] {
            assert_eq!(parse(s), Err(Malformed), "{s}");
        }
    }

    #[test]
    fn formats_whole_seconds_without_a_fraction() {
        assert_eq!(format(T), "2021-03-04T05:06:07Z");
        assert_eq!(format(T + 250), "2021-03-04T05:06:07.250Z");
        assert_eq!(format(-1), "1969-12-31T23:59:59.999Z");
        for ms in [T, T + 1, 0, -1, MIN_MS, MAX_MS] {
            assert_eq!(parse(&format(ms)), Ok(Some(ms)));
        }
    }
}
