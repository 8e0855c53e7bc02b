//! The checks every format makes on a record's fields, and the words its refusals use.

use super::short_link::{quote, BadCode};
use super::{timestamp, Refused};

impl BadCode {
    /// The refusal of record `line` for this code.
    pub(super) fn at(self, line: u64) -> Refused {
        Refused {
            line,
            code: self.code,
            reason: self.reason,
        }
    }
}

/// The destination, trimmed; the caller checks it as it checks a create.
pub(super) fn long_url(raw: &str) -> Result<String, String> {
    match raw.trim() {
        "" => Err("malformed row: missing long_url".to_string()),
        url => Ok(url.to_string()),
    }
}

/// An optional text, trimmed; empty is absent.
pub(super) fn text(raw: &str) -> Option<String> {
    Some(raw.trim())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

/// A time ([`timestamp::parse`]); `name` says which in the refusal.
pub(super) fn time(raw: &str, name: &str) -> Result<Option<i64>, String> {
    timestamp::parse(raw).map_err(|_| format!("malformed {name}: {}", quote(raw.trim())))
}

/// A count of clicks: a non-negative integer, or nothing.
pub(super) fn clicks(raw: &str) -> Result<Option<u64>, String> {
    match raw.trim() {
        "" => Ok(None),
        n => n
            .parse()
            .map(Some)
            .map_err(|_| format!("malformed clicks: {}", quote(n))),
    }
}

/// A yes-or-no column (`true`/`false`, `yes`/`no`, `1`/`0`; empty is no).
pub(super) fn flag(raw: &str, name: &str) -> Result<bool, String> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "" | "false" | "no" | "0" => Ok(false),
        "true" | "yes" | "1" => Ok(true),
        _ => Err(format!("malformed {name}: {}", quote(raw.trim()))),
    }
}

/// Tags out of one cell, split at any of `separators`, trimmed, empty ones dropped.
pub(super) fn tags(raw: &str, separators: &[char]) -> Vec<String> {
    raw.split(separators).filter_map(text).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_destination_is_the_reason_the_callers_count() {
        assert_eq!(
            long_url("  "),
            Err("malformed row: missing long_url".to_string())
        );
        assert_eq!(
            long_url(" https://a.example/x "),
            Ok("https://a.example/x".to_string())
        );
    }

    #[test]
    fn tags_are_split_trimmed_and_empty_ones_dropped() {
        assert_eq!(tags(" a | b||c ", &['|']), ["a", "b", "c"]);
        assert_eq!(tags("a, b;c", &[',', ';']), ["a", "b", "c"]);
        assert!(tags("", &['|']).is_empty());
    }

    #[test]
    fn counts_and_flags_refuse_what_they_cannot_read() {
        assert_eq!(clicks(" 42 "), Ok(Some(42)));
        assert_eq!(clicks(""), Ok(None));
        assert_eq!(clicks("-1"), Err("malformed clicks: '-1'".to_string()));
        assert_eq!(flag("Yes", "archived"), Ok(true));
        assert_eq!(flag("No", "archived"), Ok(false));
        assert_eq!(
            flag("maybe", "archived"),
            Err("malformed archived: 'maybe'".to_string())
        );
        assert_eq!(
            time("soon", "created_at"),
            Err("malformed created_at: 'soon'".to_string())
        );
        assert_eq!(text("  "), None);
    }
}
