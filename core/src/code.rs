//! The code scheme: generated codes are `base62(FF1_k(n))`, exactly [`CODE_LEN`] characters;
//! custom aliases are 8–64 characters of `[A-Za-z0-9_-]`, not all digits. Length alone tells the
//! two namespaces apart, and [`classify`] is the one place that says what shape a string has:
//! the edge's request path, the feed and click decoders, the stores and the API all ask it.
//!
//! A third shape holds the codes other shorteners issued, moved in by an import (issue 44): a
//! **legacy code** is 1–64 characters of `[A-Za-z0-9_-]` that is neither a generated code nor
//! an alias (1–6 characters; 7 with `_` or `-`; 8–64 digits). No namespace of ours mints one,
//! so the edge looks one up only when the snapshot's legacy set (or the overlay) says it may
//! exist; a scanner's junk of that shape still costs no lookup. A 7-character base62 code an
//! old shortener issued is shaped as a generated code: it is *claimed* (its counter value can
//! then never be minted) and stays [`CodeKind::Generated`].

use crate::base62;
use crate::ff1::{Ff1Domain, Ff1Error};
use crate::key::PermutationKey;

/// Length of a generated code.
pub const CODE_LEN: usize = 7;
/// Shortest custom alias.
pub const ALIAS_MIN: usize = 8;
/// Longest custom alias.
pub const ALIAS_MAX: usize = 64;
/// Number of generated codes: 62^7.
pub const CODE_SPACE: u64 = 3_521_614_606_208;

/// What shape a string has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeKind {
    /// Exactly 7 base62 characters.
    Generated,
    /// An alias's shape ([`alias_shape`]); the reserved words are the alias rules' business.
    Alias,
    /// Another shortener's code ([`legacy_shape`]): only an import makes one.
    Legacy,
    /// Anything else: no namespace holds it, so it never existed (answered 404 without a lookup).
    Invalid,
}

/// Why a string does not have an alias's shape, in the order the checks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeError {
    InvalidChar,
    TooShort,
    TooLong,
    AllDigits,
}

/// Whether `code` has an alias's shape: [`ALIAS_MIN`]–[`ALIAS_MAX`] characters of
/// `[A-Za-z0-9_-]`, not all digits.
#[inline]
pub fn alias_shape(code: &[u8]) -> Result<(), ShapeError> {
    if !code_alphabet(code) {
        return Err(ShapeError::InvalidChar);
    }
    if code.len() < ALIAS_MIN {
        return Err(ShapeError::TooShort);
    }
    if code.len() > ALIAS_MAX {
        return Err(ShapeError::TooLong);
    }
    if code.iter().all(u8::is_ascii_digit) {
        return Err(ShapeError::AllDigits);
    }
    Ok(())
}

/// Whether `code` has a legacy code's alphabet and length: 1–[`ALIAS_MAX`] characters of
/// `[A-Za-z0-9_-]` (whether it is one, rather than a generated code or an alias, is
/// [`classify`]'s answer).
#[inline]
pub fn legacy_shape(code: &[u8]) -> bool {
    (1..=ALIAS_MAX).contains(&code.len()) && code_alphabet(code)
}

/// Every byte of `[A-Za-z0-9_-]`, the alphabet of aliases and legacy codes.
#[inline]
fn code_alphabet(code: &[u8]) -> bool {
    code.iter()
        .all(|&b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// What shape `code` has: a generated code by its length and alphabet, an alias by
/// [`alias_shape`], a legacy code by [`legacy_shape`], else nothing any namespace holds.
#[inline]
pub fn classify(code: &[u8]) -> CodeKind {
    match classify_native(code) {
        CodeKind::Invalid if legacy_shape(code) => CodeKind::Legacy,
        kind => kind,
    }
}

/// [`classify`] without legacy codes (a legacy code is [`CodeKind::Invalid`] here): the
/// request path's first question, exactly as it was before imports, whose answer it refines
/// off the hot path only for a code that is neither a generated code nor an alias.
#[inline]
pub fn classify_native(code: &[u8]) -> CodeKind {
    match code.len() {
        CODE_LEN if base62::is_base62(code) => CodeKind::Generated,
        ALIAS_MIN..=ALIAS_MAX if alias_shape(code).is_ok() => CodeKind::Alias,
        _ => CodeKind::Invalid,
    }
}

/// A code some namespace could hold (whether it exists is the store's business).
#[inline]
pub fn plausible(code: &[u8]) -> bool {
    classify(code) != CodeKind::Invalid
}

/// A code that needs no import to exist: a generated code or an alias (what readers of the
/// formats before legacy codes accept).
#[inline]
pub fn native(code: &[u8]) -> bool {
    classify_native(code) != CodeKind::Invalid
}

/// Between a branded domain and its code in a [link key](split_key).
pub const KEY_SEPARATOR: u8 = b'/';
/// Longest domain name (RFC 1035: 253 characters in text form).
pub const DOMAIN_MAX: usize = 253;
/// Longest link key: a domain, the separator and the longest alias.
pub const KEY_MAX: usize = DOMAIN_MAX + 1 + ALIAS_MAX;

/// Whether `domain` is a domain name as the record keeps it: lower-case letters, digits and
/// hyphens in dot-separated labels of 1–63 characters that neither start nor end with a hyphen,
/// at most [`DOMAIN_MAX`] in all, and at least two labels. (What the API accepts as a branded
/// domain is stricter: not an IP address, not a public suffix; see the control plane.)
#[inline]
pub fn domain_shape(domain: &[u8]) -> bool {
    if domain.is_empty() || domain.len() > DOMAIN_MAX {
        return false;
    }
    let mut labels = 0;
    for label in domain.split(|&b| b == b'.') {
        labels += 1;
        if label.is_empty()
            || label.len() > 63
            || label.first() == Some(&b'-')
            || label.last() == Some(&b'-')
            || !label
                .iter()
                .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return false;
        }
    }
    labels >= 2
}

/// A link's key, the name every table keeps it under (the store, the change log, the denylist,
/// the snapshot, the overlay, the rollups): its code on the default domain, `domain/code` on a
/// branded one, that is the short URL without its scheme, the default domain left out. A
/// code's namespace is its domain: the same alias on two domains is two keys, two links.
/// Generated codes are unique across all domains (one counter mints them), so a generated
/// code's key differs between domains only by the domain.
///
/// Splits `key` into its domain (`None`: the default domain) and its code. Does not check
/// shapes ([`classify_key`] does).
#[inline]
pub fn split_key(key: &[u8]) -> (Option<&[u8]>, &[u8]) {
    match key.iter().position(|&b| b == KEY_SEPARATOR) {
        Some(at) => (key.get(..at), key.get(at + 1..).unwrap_or(&[])),
        None => (None, key),
    }
}

/// [`split_key`] on text.
#[inline]
pub fn split_key_str(key: &str) -> (Option<&str>, &str) {
    match key.split_once(KEY_SEPARATOR as char) {
        Some((domain, code)) => (Some(domain), code),
        None => (None, key),
    }
}

/// The key of `code` on `domain` (`None`: the default domain).
pub fn link_key(domain: Option<&str>, code: &str) -> String {
    match domain {
        Some(d) => {
            let mut key = String::with_capacity(d.len() + 1 + code.len());
            key.push_str(d);
            key.push(KEY_SEPARATOR as char);
            key.push_str(code);
            key
        }
        None => code.to_string(),
    }
}

/// What shape a link key's code has ([`classify`]), or [`CodeKind::Invalid`] when its domain
/// part is no [`domain_shape`].
#[inline]
pub fn classify_key(key: &[u8]) -> CodeKind {
    match split_key(key) {
        (None, code) => classify(code),
        (Some(domain), code) if domain_shape(domain) => classify(code),
        _ => CodeKind::Invalid,
    }
}

/// A key some namespace could hold ([`classify_key`]).
#[inline]
pub fn plausible_key(key: &[u8]) -> bool {
    classify_key(key) != CodeKind::Invalid
}

/// FF1 over radix 62, length 7, empty tweak, under one permutation key.
#[derive(Clone, Debug)]
pub struct CodeScheme {
    domain: Ff1Domain,
    key_id: u32,
}

impl CodeScheme {
    /// The scheme under `key`.
    pub fn new(key: &PermutationKey) -> Result<Self, Ff1Error> {
        Ok(CodeScheme {
            domain: key.ff1().domain(62, CODE_LEN as u32, &[])?,
            key_id: key.id(),
        })
    }

    /// Id of the key this scheme runs under.
    pub fn key_id(&self) -> u32 {
        self.key_id
    }

    /// The code for counter value `n` (`n < CODE_SPACE`).
    #[inline]
    pub fn encode(&self, n: u64) -> Result<[u8; CODE_LEN], Ff1Error> {
        let permuted = self.domain.encrypt(u128::from(n))?;
        let mut out = [0u8; CODE_LEN];
        // permuted < 62^7 by FF1's definition, so it always fits seven numerals.
        base62::encode_into(permuted as u64, &mut out);
        Ok(out)
    }

    /// The code for `n` as a `String`.
    pub fn encode_string(&self, n: u64) -> Result<String, Ff1Error> {
        let code = self.encode(n)?;
        Ok(code.iter().map(|&b| char::from(b)).collect())
    }

    /// The counter value behind a 7-character code, or `None` when it is not a code at all.
    #[inline]
    pub fn decode(&self, code: &[u8]) -> Option<u64> {
        self.decode_with(code, || {})
    }

    /// [`CodeScheme::decode`], running `midway` halfway through the decrypt (when `code` has
    /// a code's shape at all): see [`Ff1Domain::decrypt_with`].
    #[inline]
    pub fn decode_with(&self, code: &[u8], midway: impl FnOnce()) -> Option<u64> {
        if code.len() != CODE_LEN {
            return None;
        }
        let permuted = base62::decode(code)?;
        // decode of 7 numerals is < 62^7, inside the domain.
        self.domain
            .decrypt_with(u128::from(permuted), midway)
            .ok()
            .map(|n| n as u64)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn link_keys() {
        assert_eq!(split_key(b"Ab3dE9x"), (None, &b"Ab3dE9x"[..]));
        assert_eq!(
            split_key(b"go.example.com/spring-sale"),
            (Some(&b"go.example.com"[..]), &b"spring-sale"[..])
        );
        assert_eq!(
            link_key(Some("lh.example"), "spring-sale"),
            "lh.example/spring-sale"
        );
        assert_eq!(link_key(None, "spring-sale"), "spring-sale");
        assert_eq!(
            split_key_str("lh.example/spring-sale"),
            (Some("lh.example"), "spring-sale")
        );
        assert_eq!(classify_key(b"lh.example/spring-sale"), CodeKind::Alias);
        assert_eq!(classify_key(b"lh.example/Ab3dE9x"), CodeKind::Generated);
        assert_eq!(classify_key(b"spring-sale"), CodeKind::Alias);
        for bad in [
            &b"/spring-sale"[..],
            b"LH.example/spring-sale",
            b"localhost/spring-sale",
            b"lh.example/",
            b"lh.example/a/b-and-more",
            b"-lh.example/spring-sale",
            b"lh..example/spring-sale",
            b"lh.example/sh.rt",
        ] {
            assert_eq!(
                classify_key(bad),
                CodeKind::Invalid,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let long = format!("{}.example", "a".repeat(60));
        assert!(domain_shape(long.as_bytes()));
        assert!(!domain_shape(
            format!("{}.example", "a".repeat(64)).as_bytes()
        ));
        let max = [&"a".repeat(63)[..]; 4].join(".");
        assert_eq!(max.len(), 255);
        assert!(!domain_shape(max.as_bytes()));
        assert!(domain_shape(
            max.get(..DOMAIN_MAX)
                .unwrap()
                .trim_end_matches('.')
                .as_bytes()
        ));
    }

    use super::*;
    use std::collections::HashSet;

    fn scheme() -> CodeScheme {
        let key = PermutationKey::from_bytes(&[42u8; 16]).unwrap();
        CodeScheme::new(&key).unwrap()
    }

    #[test]
    fn classify_by_length() {
        assert_eq!(classify(b"abcDEF1"), CodeKind::Generated);
        assert_eq!(classify(b"abc-EF1"), CodeKind::Legacy);
        assert_eq!(classify(b"abcdef"), CodeKind::Legacy);
        assert_eq!(classify(b"a"), CodeKind::Legacy);
        assert_eq!(classify(b"my-alias"), CodeKind::Alias);
        assert_eq!(classify(&[b'a'; 64]), CodeKind::Alias);
        assert_eq!(classify(&[b'a'; 65]), CodeKind::Invalid);
        assert_eq!(classify(b""), CodeKind::Invalid);
        // An alias's shape: its alphabet, and not all digits.
        assert_eq!(classify(b"dot.dot.dot"), CodeKind::Invalid);
        assert_eq!(classify(b"has space"), CodeKind::Invalid);
        assert_eq!(classify(b"12345678"), CodeKind::Legacy);
        assert_eq!(classify(&[b'1'; 65]), CodeKind::Invalid);
        assert_eq!(classify(b"12345678a"), CodeKind::Alias);
        assert_eq!(classify(b"1234567"), CodeKind::Generated);
        assert!(plausible(b"abcDEF1") && plausible(b"my-alias_2"));
        assert!(!plausible(b"") && !plausible(b"dot.dot.dot"));
        assert!(plausible(b"short") && !native(b"short") && native(b"my-alias"));
        assert_eq!(
            alias_shape(b"a.b"),
            Err(ShapeError::InvalidChar),
            "alphabet first"
        );
        assert_eq!(alias_shape(b"abc"), Err(ShapeError::TooShort));
        assert_eq!(alias_shape(&[b'a'; 65]), Err(ShapeError::TooLong));
        assert_eq!(alias_shape(b"00000000"), Err(ShapeError::AllDigits));
    }

    #[test]
    fn sequential_counters_do_not_look_sequential() {
        let s = scheme();
        let a = s.encode_string(1).unwrap();
        let b = s.encode_string(2).unwrap();
        assert_eq!(a.len(), 7);
        assert_ne!(
            a[..5],
            b[..5],
            "neighbouring counters share a prefix: {a} {b}"
        );
    }

    /// A sample of distinct counters never collides (FF1 is a permutation; this checks the
    /// integer plumbing around it).
    #[test]
    fn distinct_counters_never_collide() {
        let s = scheme();
        let mut seen = HashSet::new();
        for n in (0..50_000u64).chain((CODE_SPACE - 50_000)..CODE_SPACE) {
            let code = s.encode(n).unwrap();
            assert!(seen.insert(code), "collision at {n}");
            assert_eq!(s.decode(&code), Some(n));
        }
    }

    #[test]
    fn decode_with_runs_midway_once_and_answers_as_decode() {
        let s = scheme();
        for n in [0, 1, 61, 62, 123_456_789, CODE_SPACE - 1] {
            let code = s.encode(n).unwrap();
            let mut runs = 0;
            assert_eq!(s.decode_with(&code, || runs += 1), Some(n));
            assert_eq!(runs, 1);
        }
        // Not a code's shape: no decrypt, and nothing midway.
        let mut runs = 0;
        assert_eq!(s.decode_with(b"abc", || runs += 1), None);
        assert_eq!(runs, 0);
    }

    #[test]
    fn decode_rejects_non_codes() {
        let s = scheme();
        assert_eq!(s.decode(b"abc"), None);
        assert_eq!(s.decode(b"abc-def"), None);
        assert!(s.encode(CODE_SPACE).is_err());
    }

    proptest::proptest! {
        #[test]
        fn round_trip(n in 0u64..CODE_SPACE) {
            let s = scheme();
            let code = s.encode(n).unwrap();
            proptest::prop_assert_eq!(s.decode(&code), Some(n));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..10)) {
            let _ = scheme().decode(&bytes);
        }
    }
}
