//! A link's serving options (issue 43): the redirect's status and cache lifetime, and whether
//! the request's query is forwarded into the destination. A link without options has
//! [`LinkOptions::default`] (302, five minutes, the query dropped) and stores, sends and
//! encodes nothing for them.

use serde::{Deserialize, Serialize};

/// The longest cache lifetime a link may ask for: a year.
pub const CACHE_SECONDS_MAX: u32 = 31_536_000;
/// The cache lifetime of a link that asks for none.
pub const CACHE_SECONDS_DEFAULT: u32 = 300;

/// How a link's redirect is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkOptions {
    /// 301, 302, 307 or 308.
    #[serde(default = "default_status")]
    pub redirect_status: u16,
    /// `Cache-Control: private, max-age=N` (0: `no-store`).
    #[serde(default = "default_cache")]
    pub cache_seconds: u32,
    /// Merge the request's query into the destination's (`edge::query`).
    #[serde(default)]
    pub forward_query: bool,
    /// With `forward_query`, a name in both queries keeps the request's value.
    #[serde(default)]
    pub request_precedence: bool,
}

fn default_status() -> u16 {
    302
}

fn default_cache() -> u32 {
    CACHE_SECONDS_DEFAULT
}

impl Default for LinkOptions {
    fn default() -> Self {
        LinkOptions {
            redirect_status: 302,
            cache_seconds: CACHE_SECONDS_DEFAULT,
            forward_query: false,
            request_precedence: false,
        }
    }
}

/// Why options were refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    #[error("redirect_status must be 301, 302, 307 or 308")]
    Status,
    #[error("cache_seconds must be 0..={CACHE_SECONDS_MAX}")]
    CacheSeconds,
}

impl LinkOptions {
    /// Whether these are the defaults (nothing to store or send).
    pub fn is_default(&self) -> bool {
        *self == LinkOptions::default()
    }

    /// Checks the fields' ranges.
    pub fn validate(&self) -> Result<(), OptionsError> {
        if !matches!(self.redirect_status, 301 | 302 | 307 | 308) {
            return Err(OptionsError::Status);
        }
        if self.cache_seconds > CACHE_SECONDS_MAX {
            return Err(OptionsError::CacheSeconds);
        }
        Ok(())
    }

    /// The options in 32 bits, for the snapshot and the edge's tables: bits 0–1 the status
    /// (302, 301, 307, 308), bit 2 `forward_query`, bit 3 `request_precedence`, bits 4–29 the
    /// cache lifetime. Only valid options pack.
    pub fn pack(&self) -> Option<u32> {
        self.validate().ok()?;
        let status = match self.redirect_status {
            302 => 0,
            301 => 1,
            307 => 2,
            _ => 3,
        };
        Some(
            status
                | u32::from(self.forward_query) << 2
                | u32::from(self.request_precedence) << 3
                | self.cache_seconds << 4,
        )
    }

    /// What [`LinkOptions::pack`] packed; `None` for words no valid options pack to.
    pub fn unpack(word: u32) -> Option<LinkOptions> {
        let options = LinkOptions {
            redirect_status: [302, 301, 307, 308][(word & 3) as usize],
            forward_query: word & 4 != 0,
            request_precedence: word & 8 != 0,
            cache_seconds: word >> 4,
        };
        (options.validate().is_ok() && word >> 30 == 0).then_some(options)
    }
}

/// A change to some of a link's options (`PATCH /v1/links/{code}`): absent fields are left as
/// they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct OptionsPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_query: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_precedence: Option<bool>,
}

impl OptionsPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == OptionsPatch::default()
    }

    /// `options` with this patch applied.
    pub fn apply(&self, options: LinkOptions) -> LinkOptions {
        LinkOptions {
            redirect_status: self.redirect_status.unwrap_or(options.redirect_status),
            cache_seconds: self.cache_seconds.unwrap_or(options.cache_seconds),
            forward_query: self.forward_query.unwrap_or(options.forward_query),
            request_precedence: self
                .request_precedence
                .unwrap_or(options.request_precedence),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn defaults_and_ranges() {
        let d = LinkOptions::default();
        assert!(d.is_default());
        assert_eq!(d.validate(), Ok(()));
        let parsed: LinkOptions = serde_json::from_str("{}").unwrap();
        assert_eq!(parsed, d);
        for s in [301, 302, 307, 308] {
            assert!(LinkOptions {
                redirect_status: s,
                ..d
            }
            .validate()
            .is_ok());
        }
        for s in [200, 303, 304, 399] {
            assert_eq!(
                LinkOptions {
                    redirect_status: s,
                    ..d
                }
                .validate(),
                Err(OptionsError::Status)
            );
        }
        assert_eq!(
            LinkOptions {
                cache_seconds: CACHE_SECONDS_MAX + 1,
                ..d
            }
            .validate(),
            Err(OptionsError::CacheSeconds)
        );
    }

    proptest! {
        #[test]
        fn packing_round_trips(status in prop_oneof![Just(301u16), Just(302), Just(307), Just(308)],
                               cache in 0..=CACHE_SECONDS_MAX, fwd: bool, req: bool) {
            let o = LinkOptions { redirect_status: status, cache_seconds: cache, forward_query: fwd, request_precedence: req };
            prop_assert_eq!(LinkOptions::unpack(o.pack().unwrap()), Some(o));
        }

        #[test]
        fn any_word_unpacks_to_valid_options_or_none(word: u32) {
            if let Some(o) = LinkOptions::unpack(word) {
                prop_assert!(o.validate().is_ok());
                prop_assert_eq!(o.pack(), Some(word));
            }
        }
    }
}
