//! `lasthop-core`: what every lasthop process agrees on.
//!
//! - [`ff1`]: NIST SP 800-38G FF1 format-preserving encryption over integers (no bignum);
//! - [`base62`]: the code alphabet;
//! - [`code`]: the code scheme, `base62(FF1_k(n))` for generated codes, and length routing;
//! - [`key`]: the permutation key file and its id;
//! - [`region`]: per-region counter ranges and the high-water-mark check;
//! - [`alias`]: custom alias rules and the reserved-word list;
//! - [`destination`]: destination URL rules (create time and serve time);
//! - [`link`]: link, link state and change-log types;
//! - [`feed`]: the edge feed's frames and status reports (core/FEED.md);
//! - [`click`]: click events and the spool's frames (core/EVENTS.md);
//! - [`day`]: UTC days of Unix-millisecond times;
//! - [`secret`]: secret files, written 0600 from their first byte.

#[cfg(all(
    target_arch = "x86_64",
    target_feature = "aes",
    target_feature = "sse4.1"
))]
mod aesni;
pub mod alias;
pub mod base62;
pub mod click;
pub mod clock;
pub mod code;
pub mod cursor;
pub mod day;
pub mod destination;
pub mod error_chain;
pub mod feed;
pub mod ff1;
pub mod key;
pub mod link;
pub mod options;
pub mod region;
pub mod secret;

pub use alias::{validate_alias, AliasError};
pub use code::{
    classify, classify_key, classify_native, legacy_shape, link_key, native, plausible_key,
    split_key, split_key_str, CodeKind, CodeScheme, CODE_LEN, CODE_SPACE,
};
pub use destination::{is_servable, normalize_destination, visible_ascii, UrlError, UrlPolicy};
pub use ff1::{Ff1, Ff1Domain, Ff1Error};
pub use key::{KeyError, PermutationKey};
pub use link::{tag_ok, Change, Hold, Link, LinkState, LinkStatus, TAGS_MAX};
pub use options::{LinkOptions, OptionsError, OptionsPatch};
pub use region::{region_range, HighWater, RegionError};
