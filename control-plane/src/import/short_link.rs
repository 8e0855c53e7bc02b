//! Codes and domains out of the fields that hold them.
//!
//! Two kinds of field: a *code* field holds the code (YOURLS `keyword`, Kutt `address`, Shlink
//! `shortCode`, lasthop's `code`), though a user's spreadsheet may hold the path or the whole
//! short URL there instead; a *short link* field holds the short URL, with or without its
//! scheme (Bitly's `id` is `bit.ly/3abcDEF`, its `link` `https://bit.ly/3abcDEF`, Dub's
//! `https://dub.sh/key`). Either way the code is the path without its leading `/`, and must be
//! a legacy code's shape (`lasthop_core::legacy_shape`: 1–64 characters of `[A-Za-z0-9_-]`):
//! no query, no second segment. Anything else is
//! refused here rather than guessed at, since the code is the one field an import must not
//! change: it is what the old links in the wild point at.

/// Longest piece of a bad value quoted back in a reason.
const QUOTE_MAX: usize = 80;

/// Why a code could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct BadCode {
    /// The code as far as it was read.
    pub(super) code: Option<String>,
    pub(super) reason: String,
}

/// The code in a code field.
pub(super) fn code(raw: &str) -> Result<String, BadCode> {
    let raw = raw.trim();
    let path = match split_url(raw) {
        Some((_, path)) => path,
        None => raw,
    };
    check(path.strip_prefix('/').unwrap_or(path))
}

/// The domain and code in a short link field.
pub(super) fn short_link(raw: &str) -> Result<(Option<String>, String), BadCode> {
    let raw = raw.trim();
    let (authority, path) = match split_url(raw) {
        Some(parts) => parts,
        None => match raw.split_once('/') {
            // `bit.ly/3abcDEF`: a host, then the path.
            Some((host, path)) if !host.is_empty() => (host, path),
            // `3abcDEF` or `/3abcDEF`: no host given.
            _ => return code(raw).map(|code| (None, code)),
        },
    };
    let Some(domain) = host(authority) else {
        return Err(BadCode {
            code: None,
            reason: format!("malformed short link: {}", quote(raw)),
        });
    };
    let code = check(path.strip_prefix('/').unwrap_or(path))?;
    Ok((Some(domain), code))
}

/// A host as a domain: lower-cased, without user information or port; `None` when empty or
/// not a DNS name.
pub(super) fn host(authority: &str) -> Option<String> {
    let host = authority
        .rsplit_once('@')
        .map_or(authority, |(_, host)| host);
    let host = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    let valid = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    valid.then(|| host.to_ascii_lowercase())
}

/// `s` quoted for a reason, cut short when long.
pub(super) fn quote(s: &str) -> String {
    match s.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("'{}…'", &s[..cut]),
        None => format!("'{s}'"),
    }
}

/// A URL's authority and the rest from its path on, when `s` has a scheme (`https://`) or
/// starts with `//`.
fn split_url(s: &str) -> Option<(&str, &str)> {
    let after = match s.split_once("://") {
        Some((scheme, after))
            if !scheme.is_empty()
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')) =>
        {
            after
        }
        _ => s.strip_prefix("//")?,
    };
    let end = after.find(['/', '?', '#']).unwrap_or(after.len());
    Some(after.split_at(end))
}

fn check(code: &str) -> Result<String, BadCode> {
    if code.is_empty() {
        return Err(BadCode {
            code: None,
            reason: "malformed row: missing code".to_string(),
        });
    }
    if lasthop_core::legacy_shape(code.as_bytes()) {
        Ok(code.to_string())
    } else {
        Err(BadCode {
            code: Some(code.to_string()),
            reason: format!("malformed code: {}", quote(code)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(s: &str) -> Result<(Option<String>, String), String> {
        short_link(s).map_err(|bad| bad.reason)
    }

    fn ok(domain: Option<&str>, code: &str) -> Result<(Option<String>, String), String> {
        Ok((domain.map(str::to_string), code.to_string()))
    }

    #[test]
    fn a_code_field_takes_the_code_a_path_or_a_whole_short_url() {
        for raw in [
            "3abcDEF",
            " 3abcDEF ",
            "/3abcDEF",
            "https://sho.rt/3abcDEF",
            "//sho.rt/3abcDEF",
        ] {
            assert_eq!(code(raw), Ok("3abcDEF".to_string()), "{raw}");
        }
        assert_eq!(code("a_b-C9"), Ok("a_b-C9".to_string()));
        assert_eq!(code("x"), Ok("x".to_string()));
        assert_eq!(code(&"y".repeat(64)), Ok("y".repeat(64)));
    }

    #[test]
    fn a_code_outside_the_alphabet_or_too_long_is_malformed() {
        let bad = code("a b").expect_err("space");
        assert_eq!(bad.reason, "malformed code: 'a b'");
        assert_eq!(bad.code.as_deref(), Some("a b"));
        assert_eq!(
            code(&"y".repeat(65)).expect_err("65").code,
            Some("y".repeat(65))
        );
        for raw in ["ünï", "a/b", "abc?utm=1", "a.b", "https://sho.rt/a/b"] {
            assert!(code(raw).is_err(), "{raw}");
        }
        let missing = code(" / ").expect_err("empty");
        assert_eq!(missing.reason, "malformed row: missing code");
        assert_eq!(missing.code, None);
        assert!(code("https://sho.rt").is_err());
    }

    #[test]
    fn a_short_link_gives_its_host_lower_cased_and_its_code() {
        assert_eq!(link("bit.ly/3abcDEF"), ok(Some("bit.ly"), "3abcDEF"));
        assert_eq!(
            link("https://Brand.CO/spring-sale"),
            ok(Some("brand.co"), "spring-sale")
        );
        assert_eq!(
            link("http://user@go.example:8080/x"),
            ok(Some("go.example"), "x")
        );
        assert_eq!(link("https://go.example./x"), ok(Some("go.example"), "x"));
        assert_eq!(link("3abcDEF"), ok(None, "3abcDEF"));
        assert_eq!(link("/3abcDEF"), ok(None, "3abcDEF"));
    }

    #[test]
    fn a_short_link_without_a_usable_host_or_code_is_refused() {
        assert_eq!(
            link("https:///abc"),
            Err("malformed short link: 'https:///abc'".into())
        );
        assert_eq!(
            link("https://bad host/abc"),
            Err("malformed short link: 'https://bad host/abc'".into())
        );
        assert_eq!(
            link("https://dub.example"),
            Err("malformed row: missing code".into())
        );
        assert_eq!(link("bit.ly/a b"), Err("malformed code: 'a b'".into()));
    }

    #[test]
    fn long_values_are_quoted_cut_short() {
        let long = "é".repeat(100);
        assert_eq!(quote(&long), format!("'{}…'", "é".repeat(80)));
        assert_eq!(quote("ab"), "'ab'");
    }
}
