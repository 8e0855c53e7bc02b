//! The `build` input: one link per line, `key<TAB>url[<TAB>expires_at[<TAB>options]]`, where
//! `key` is the link key (a code or alias on the default domain, `domain/code` on a branded
//! one). Blank lines and lines starting with `#` are skipped. `expires_at` is either Unix
//! seconds (an integer) or an RFC 3339 timestamp (`2027-01-01T00:00:00Z`); both become Unix
//! milliseconds; empty, no expiry. `options` (format version 4) is the link's serving options
//! as comma-separated `name=value` items named as the API names them: `redirect_status=301`
//! (301, 302, 307 or 308), `cache_seconds=86400` (0: `no-store`), `forward_query=true`,
//! `query_precedence=request` (or `destination`); an item left out keeps its default, and an
//! empty column is the defaults. A line of two or three columns means what it always meant.

use lasthop_core::LinkOptions;

/// One parsed line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TsvLink<'a> {
    /// The link key, unchecked (the writer checks it).
    pub key: &'a str,
    pub url: &'a str,
    pub expires_at_ms: Option<i64>,
    /// The fourth column's options; the defaults without one.
    pub options: LinkOptions,
}

/// Why a line did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TsvError {
    #[error("expected key<TAB>url[<TAB>expires_at[<TAB>options]], found {fields} field(s)")]
    Fields { fields: usize },
    #[error("expires_at {value:?} is neither Unix seconds nor RFC 3339")]
    Expiry { value: String },
    #[error(
        "options item {item:?}: {why} (items: redirect_status=301|302|307|308, cache_seconds=N, forward_query=true|false, query_precedence=request|destination)"
    )]
    Options { item: String, why: &'static str },
}

/// Parses one line; `Ok(None)` for blank and comment lines.
pub fn parse_line(line: &str) -> Result<Option<TsvLink<'_>>, TsvError> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.trim().is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let fields: Vec<&str> = line.split('\t').collect();
    let (key, url, expiry, options) = match fields[..] {
        [key, url] => (key, url, "", ""),
        [key, url, e] => (key, url, e, ""),
        [key, url, e, o] => (key, url, e, o),
        _ => {
            return Err(TsvError::Fields {
                fields: fields.len(),
            })
        }
    };
    let expiry = expiry.trim();
    let expires_at_ms = (!expiry.is_empty())
        .then(|| parse_expiry(expiry))
        .transpose()?;
    Ok(Some(TsvLink {
        key,
        url,
        expires_at_ms,
        options: parse_options(options)?,
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

/// The options column: `name=value` items, comma-separated, each name at most once.
fn parse_options(column: &str) -> Result<LinkOptions, TsvError> {
    let mut options = LinkOptions::default();
    let mut seen = [false; 4];
    for item in column.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let err = |why| TsvError::Options {
            item: item.to_string(),
            why,
        };
        let (name, value) = item.split_once('=').ok_or(err("not name=value"))?;
        let (name, value) = (name.trim(), value.trim());
        let which = match name {
            "redirect_status" => {
                options.redirect_status = value
                    .parse()
                    .ok()
                    .filter(|s| matches!(s, 301 | 302 | 307 | 308))
                    .ok_or(err("redirect_status must be 301, 302, 307 or 308"))?;
                0
            }
            "cache_seconds" => {
                options.cache_seconds = value
                    .parse()
                    .ok()
                    .filter(|&s| s <= lasthop_core::options::CACHE_SECONDS_MAX)
                    .ok_or(err("cache_seconds must be 0..=31536000"))?;
                1
            }
            "forward_query" => {
                options.forward_query = value
                    .parse()
                    .map_err(|_| err("forward_query must be true or false"))?;
                2
            }
            "query_precedence" => {
                options.request_precedence = match value {
                    "request" => true,
                    "destination" => false,
                    _ => return Err(err("query_precedence must be request or destination")),
                };
                3
            }
            _ => return Err(err("unknown option")),
        };
        if std::mem::replace(&mut seen[which], true) {
            return Err(err("given twice"));
        }
    }
    Ok(options)
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
        assert!(l.options.is_default());
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
        assert!(matches!(
            parse_line("abcDEF1\tu\t\t\t"),
            Err(TsvError::Fields { fields: 5 })
        ));
    }

    /// The fourth column: the API's names, any order, each at most once; an item left out
    /// keeps its default; an empty column (or none) is the defaults.
    #[test]
    fn options_column() {
        let options = |line: &str| parse_line(line).map(|l| l.unwrap().options);
        let l = parse_line("abcDEF1\thttps://x/\t\tredirect_status=301,cache_seconds=86400")
            .unwrap()
            .unwrap();
        assert_eq!(l.expires_at_ms, None);
        assert_eq!(
            l.options,
            LinkOptions {
                redirect_status: 301,
                cache_seconds: 86_400,
                ..LinkOptions::default()
            }
        );
        assert_eq!(
            options(
                "a1234567\tu\t1800000000\t query_precedence=request , forward_query=true,redirect_status=307,cache_seconds=0"
            )
            .unwrap(),
            LinkOptions {
                redirect_status: 307,
                cache_seconds: 0,
                forward_query: true,
                request_precedence: true,
            }
        );
        assert!(options("abcDEF1\tu\t\t").unwrap().is_default());
        assert!(
            options("abcDEF1\tu\t\tredirect_status=302,cache_seconds=300")
                .unwrap()
                .is_default()
        );
        assert!(
            options("abcDEF1\tu\t\tforward_query=false,query_precedence=destination")
                .unwrap()
                .is_default()
        );
        for bad in [
            "redirect_status=303",
            "redirect_status=",
            "cache_seconds=-1",
            "cache_seconds=31536001",
            "forward_query=yes",
            "query_precedence=both",
            "forward",
            "max_age=5",
            "redirect_status=301,redirect_status=308",
        ] {
            assert!(
                matches!(
                    options(&format!("abcDEF1\tu\t\t{bad}")),
                    Err(TsvError::Options { .. })
                ),
                "{bad}"
            );
        }
    }
}
