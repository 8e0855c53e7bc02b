//! The overlay: links created after the snapshot was built (docs/ARCHITECTURE.md, "The request
//! path", step 5), streamed from the feed until the next snapshot covers them.
//!
//! An [`Overlay`] is immutable once published, like the snapshot and the denylist: the feed
//! brings its spare copy up to date with what changed and publishes that behind an `Arc`
//! ([`crate::generations`]); [`Overlay::with_inserted`] and [`Overlay::with_all`] build a new
//! one by copying (tests, the origin path's fixtures).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use hashbrown::HashMap;

use crate::generations::Patch;

/// A link the overlay knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OverlayLink {
    /// Destination, exactly as it will be served (re-checked with `is_servable` at serve time);
    /// empty for a link that is gone (deleted, disabled, taken down), which answers 410.
    pub url: Box<[u8]>,
    /// Expiry in Unix milliseconds; at or after it the link answers 410.
    pub expires_at_ms: Option<i64>,
    /// Flagged: served through the warning interstitial.
    pub warn: bool,
    /// When the control plane created the link (feed `link_created`), for the
    /// creation-to-first-redirect metric.
    pub created_at_ms: Option<i64>,
    /// Set by the first redirect served for this link here, across generations and cores.
    pub first_served: FirstServed,
    /// How the redirect is served (issue 43).
    pub options: lasthop_core::LinkOptions,
}

impl OverlayLink {
    /// A link with no creation time (tests, `state_changed` entries).
    pub fn new(url: &[u8], expires_at_ms: Option<i64>, warn: bool) -> OverlayLink {
        OverlayLink {
            url: url.into(),
            expires_at_ms,
            warn,
            created_at_ms: None,
            first_served: FirstServed::default(),
            options: lasthop_core::LinkOptions::default(),
        }
    }
}

/// A once-only flag shared by every copy of an overlay entry.
#[derive(Debug, Clone, Default)]
pub struct FirstServed(Arc<AtomicBool>);

impl FirstServed {
    /// True exactly once: for the first caller.
    pub fn claim(&self) -> bool {
        !self.0.load(Ordering::Relaxed) && !self.0.swap(true, Ordering::Relaxed)
    }
}

impl PartialEq for FirstServed {
    /// Bookkeeping, not part of a link's value.
    fn eq(&self, _: &FirstServed) -> bool {
        true
    }
}

impl Eq for FirstServed {}

/// A map from code (generated or alias) to [`OverlayLink`], immutable once published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overlay {
    links: HashMap<Box<[u8]>, OverlayLink>,
}

impl Overlay {
    /// An overlay with no links; [`Overlay::get`] on it costs one branch.
    pub fn empty() -> Self {
        Overlay::default()
    }

    /// The link behind `code`, if the overlay has it. Never allocates.
    #[inline]
    pub fn get(&self, code: &[u8]) -> Option<&OverlayLink> {
        if self.links.is_empty() {
            return None;
        }
        self.links.get(code)
    }

    /// A new overlay: this one plus `code` → `link` (replacing an entry for the same code).
    #[must_use]
    pub fn with_inserted(&self, code: &[u8], link: OverlayLink) -> Overlay {
        let mut links = self.links.clone();
        links.insert(Box::from(code), link);
        Overlay { links }
    }

    /// A new overlay: this one plus every `(code, link)` of `entries`, copying the map once.
    #[must_use]
    pub fn with_all<I, K>(&self, entries: I) -> Overlay
    where
        I: IntoIterator<Item = (K, OverlayLink)>,
        K: AsRef<[u8]>,
    {
        let mut links = self.links.clone();
        for (code, link) in entries {
            links.insert(Box::from(code.as_ref()), link);
        }
        Overlay { links }
    }

    /// Number of links.
    pub fn len(&self) -> usize {
        self.links.len()
    }

    /// True when the overlay holds no link.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }
}

impl Patch for Overlay {
    type Value = OverlayLink;

    /// Sets `code`'s link, or drops it.
    fn patch(&mut self, code: &[u8], link: Option<&OverlayLink>) {
        match link {
            Some(l) => match self.links.get_mut(code) {
                Some(slot) => *slot = l.clone(),
                None => {
                    self.links.insert(Box::from(code), l.clone());
                }
            },
            None => {
                self.links.remove(code);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(url: &str) -> OverlayLink {
        OverlayLink::new(url.as_bytes(), None, false)
    }

    #[test]
    fn first_served_is_claimed_once_across_copies() {
        let a = link("https://a.example/");
        let b = a.clone();
        assert!(b.first_served.claim());
        assert!(!a.first_served.claim());
        assert!(!b.first_served.claim());
    }

    #[test]
    fn copy_on_write() {
        let empty = Overlay::empty();
        assert!(empty.get(b"abcDEF1").is_none());
        let one = empty.with_inserted(b"abcDEF1", link("https://a.example/"));
        assert!(empty.is_empty(), "the old generation is untouched");
        assert_eq!(one.len(), 1);
        assert_eq!(
            &*one
                .get(b"abcDEF1")
                .map(|l| l.url.clone())
                .unwrap_or_default(),
            b"https://a.example/"
        );
        let two = one.with_all([
            (&b"abcDEF1"[..], link("https://b.example/")),
            (b"new-alias", link("https://c.example/")),
        ]);
        assert_eq!(two.len(), 2);
        assert_eq!(
            &*two
                .get(b"abcDEF1")
                .map(|l| l.url.clone())
                .unwrap_or_default(),
            b"https://b.example/"
        );
        assert_eq!(
            &*one
                .get(b"abcDEF1")
                .map(|l| l.url.clone())
                .unwrap_or_default(),
            b"https://a.example/"
        );
    }
}
