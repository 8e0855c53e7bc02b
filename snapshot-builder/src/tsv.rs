//! The `build` input: one link per line, `key<TAB>url[<TAB>expires_at]`, where `key` is the
//! link key (a code or alias on the default domain, `domain/code` on a branded one). Blank
//! lines and lines starting with `#` are skipped. `expires_at` is either Unix seconds (an integer) or an
//! RFC 3339 timestamp (`2027-01-01T00:00:00Z`); both become Unix milliseconds.

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TsvLink<'a> {
    /// The link key, unchecked (the writer checks it).
    pub key: &'a str,
    pub url: &'a str,
    pub expires_at_ms: Option<i64>,
}

/// Why a line did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TsvError {
    #[error("expected key<TAB>url[<TAB>expires_at], found {fields} field(s)")]
    Fields { fields: usize },
    #[error("expires_at {value:?} is neither Unix seconds nor RFC 3339")]
    Expiry { value: String },
}

/// Parses one line; `Ok(None)` for blank and comment lines.
pub fn parse_line(line: &str) -> Result<Option<TsvLink<'_>>, TsvError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.trim().is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let fields: Vec<&str> = line.split('\t').collect();
    let (key, url, expiry) = match fields[..] {
        [key, url] => (key, url, None),
        [key, url, e] if e.trim().is_empty() => (key, url, None),
        [key, url, e] => (key, url, Some(e.trim())),
        _ => {
            return Err(TsvError::Fields {
                fields: fields.len(),
            })
        }
    };
    let expires_at_ms = expiry.map(parse_expiry).transpose()?;
    Ok(Some(TsvLink {
        key,
        url,
        expires_at_ms,
    }))
}

fn parse_expiry(value: &str) -> Result<i64, TsvError> {
    let err = || TsvError::Expiry {
        value: value.to_string(),
    };
    if let Ok(secs) = value.parse::<i64>() {
        return secs.checked_mul(1000).ok_or_else(err);
    }
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|t| t.timestamp_millis())
        .map_err(|_| err())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines() {
        assert_eq!(parse_line("").unwrap(), None);
        assert_eq!(parse_line("# comment").unwrap(), None);
        let l = parse_line("abcDEF1\thttps://x/\r").unwrap().unwrap();
        assert_eq!(
            (l.key, l.url, l.expires_at_ms),
            ("abcDEF1", "https://x/", None)
        );
        let l = parse_line("abcDEF1\thttps://x/\t1800000000")
            .unwrap()
            .unwrap();
        assert_eq!(l.expires_at_ms, Some(1_800_000_000_000));
        let l = parse_line("abcDEF1\thttps://x/\t2027-01-15T08:00:00.5+01:00")
            .unwrap()
            .unwrap();
        assert_eq!(l.expires_at_ms, Some(1_799_996_400_500));
        let l = parse_line("go.example.com/spring-sale\thttps://x/spring")
            .unwrap()
            .unwrap();
        assert_eq!(
            (l.key, l.url, l.expires_at_ms),
            ("go.example.com/spring-sale", "https://x/spring", None)
        );
        assert!(matches!(
            parse_line("abcDEF1"),
            Err(TsvError::Fields { fields: 1 })
        ));
        assert!(matches!(
            parse_line("abcDEF1\tu\ttomorrow"),
            Err(TsvError::Expiry { .. })
        ));
    }
}
