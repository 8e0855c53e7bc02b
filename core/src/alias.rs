//! Custom alias rules: 8–64 characters of `[A-Za-z0-9_-]`, not all digits, and not a reserved
//! word (routes, brands, credential-phishing bait; `data/reserved-aliases.txt`).

use std::collections::HashSet;
use std::sync::OnceLock;

use crate::code::{ALIAS_MAX, ALIAS_MIN};

const RESERVED_TEXT: &str = include_str!("../data/reserved-aliases.txt");

/// Why an alias was rejected; [`AliasError::code`] is the API's machine code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AliasError {
    #[error("alias is shorter than {ALIAS_MIN} characters")]
    TooShort,
    #[error("alias is longer than {ALIAS_MAX} characters")]
    TooLong,
    #[error("alias may only contain A-Z, a-z, 0-9, '-' and '_'")]
    InvalidChar,
    #[error("alias may not be all digits")]
    AllDigits,
    #[error("alias uses the reserved word {word:?}")]
    Reserved { word: String },
}

impl AliasError {
    /// Stable machine-readable code.
    pub fn code(&self) -> &'static str {
        match self {
            AliasError::TooShort => "alias_too_short",
            AliasError::TooLong => "alias_too_long",
            AliasError::InvalidChar => "alias_invalid_char",
            AliasError::AllDigits => "alias_all_digits",
            AliasError::Reserved { .. } => "alias_reserved",
        }
    }
}

fn reserved() -> &'static HashSet<&'static str> {
    static SET: OnceLock<HashSet<&'static str>> = OnceLock::new();
    SET.get_or_init(|| {
        RESERVED_TEXT
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect()
    })
}

/// Checks an alias against every rule.
pub fn validate_alias(alias: &str) -> Result<(), AliasError> {
    let bytes = alias.as_bytes();
    if !bytes
        .iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(AliasError::InvalidChar);
    }
    if bytes.len() < ALIAS_MIN {
        return Err(AliasError::TooShort);
    }
    if bytes.len() > ALIAS_MAX {
        return Err(AliasError::TooLong);
    }
    if bytes.iter().all(u8::is_ascii_digit) {
        return Err(AliasError::AllDigits);
    }
    let lower = alias.to_ascii_lowercase();
    let squashed: String = lower.chars().filter(|c| *c != '-' && *c != '_').collect();
    let set = reserved();
    let hit = std::iter::once(squashed.as_str())
        .chain(lower.split(['-', '_']))
        .find(|token| set.contains(token));
    if let Some(word) = hit {
        return Err(AliasError::Reserved {
            word: word.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_aliases() {
        for ok in [
            "spring-sale",
            "Summer_2026",
            "a1234567",
            "badminton-club",
            &"x".repeat(64),
        ] {
            assert_eq!(validate_alias(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn each_rejection_has_its_code() {
        let cases = [
            ("short", "alias_too_short"),
            (&"x".repeat(65) as &str, "alias_too_long"),
            ("has space", "alias_invalid_char"),
            ("slash/alias", "alias_invalid_char"),
            ("ünïcödé-alias", "alias_invalid_char"),
            ("12345678", "alias_all_digits"),
            ("dashboard", "alias_reserved"),
            ("Admin-Panel", "alias_reserved"),
            ("Pay-Pal_", "alias_reserved"),
            ("PayPal__", "alias_reserved"),
            ("verify-now-123", "alias_reserved"),
        ];
        for (alias, code) in cases {
            assert_eq!(validate_alias(alias).unwrap_err().code(), code, "{alias}");
        }
    }

    #[test]
    fn reserved_list_is_well_formed() {
        for word in reserved() {
            assert!(
                word.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()),
                "{word}"
            );
        }
        assert!(reserved().len() > 40);
    }
}
