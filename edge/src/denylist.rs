//! The denylist: codes that must not redirect (disabled, taken down: answered 410) or must go
//! through the warning interstitial (flagged `warn`).
//!
//! Checked before any cache (docs/ARCHITECTURE.md, "The request path", step 3), so a takedown
//! wins over the snapshot, the overlay and the origin alike. A [`Denylist`] is immutable once
//! published: the next generation is the spare copy brought up to date with what changed
//! ([`crate::generations`], left-right) and published to the serving cores behind an `Arc`
//! ([`crate::tables::Published`], the seqlock-pattern swap), so a reader never blocks and never
//! sees half a list.
//!
//! The map is hashbrown with its default hasher (foldhash, seeded per process): fast on short
//! keys, and a seed an attacker cannot know, since the keys come from the control plane but the
//! probes come from the internet.

use hashbrown::HashMap;

use crate::generations::Patch;

/// What a denylisted code answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deny {
    /// 410 Gone (disabled or taken down).
    Gone,
    /// The warning interstitial instead of a redirect.
    Warn,
    /// The code's state changed after the snapshot was built (restored, expiry moved, flag
    /// cleared): the snapshot's entry is stale, so skip it and answer from the overlay, which
    /// holds the link's current form (its `warn` flag included). Ranks below `Gone` and above
    /// `Warn` when a code is listed twice.
    Changed,
}

/// A set of denylisted codes (generated codes and aliases alike), immutable once published.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Denylist {
    codes: HashMap<Box<[u8]>, Deny>,
}

impl Denylist {
    /// A list with no codes; [`Denylist::check`] on it costs one branch.
    pub fn empty() -> Self {
        Denylist::default()
    }

    /// Builds a list; when a code appears twice, [`Deny::Gone`] wins over [`Deny::Changed`],
    /// which wins over [`Deny::Warn`].
    pub fn new<I, K>(entries: I) -> Self
    where
        I: IntoIterator<Item = (K, Deny)>,
        K: AsRef<[u8]>,
    {
        let mut codes: HashMap<Box<[u8]>, Deny> = HashMap::new();
        for (code, deny) in entries {
            let slot = codes.entry(Box::from(code.as_ref())).or_insert(deny);
            if rank(deny) > rank(*slot) {
                *slot = deny;
            }
        }
        codes.shrink_to_fit();
        Denylist { codes }
    }

    /// What `code` answers, if it is listed. Never allocates.
    #[inline]
    pub fn check(&self, code: &[u8]) -> Option<Deny> {
        if self.codes.is_empty() {
            return None;
        }
        self.codes.get(code).copied()
    }

    /// Number of listed codes.
    pub fn len(&self) -> usize {
        self.codes.len()
    }

    /// True when no code is listed.
    pub fn is_empty(&self) -> bool {
        self.codes.is_empty()
    }
}

impl Patch for Denylist {
    type Value = Deny;

    /// Lists `code` as `deny` (whatever it was), or unlists it.
    fn patch(&mut self, code: &[u8], deny: Option<&Deny>) {
        match deny {
            Some(&d) => match self.codes.get_mut(code) {
                Some(slot) => *slot = d,
                None => {
                    self.codes.insert(Box::from(code), d);
                }
            },
            None => {
                self.codes.remove(code);
            }
        }
    }
}

/// Which of two listings of one code is in force: `Gone` over `Changed` over `Warn`.
pub fn stronger(a: Option<Deny>, b: Option<Deny>) -> Option<Deny> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if rank(b) > rank(a) { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}

/// `Changed` outranks `Warn`: the overlay entry it points to carries the link's current
/// `warn` flag too, while the snapshot a `Warn` entry reads may hold a stale tombstone.
fn rank(d: Deny) -> u8 {
    match d {
        Deny::Warn => 0,
        Deny::Changed => 1,
        Deny::Gone => 2,
    }
}

impl<K: AsRef<[u8]>> FromIterator<(K, Deny)> for Denylist {
    fn from_iter<I: IntoIterator<Item = (K, Deny)>>(iter: I) -> Self {
        Denylist::new(iter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check() {
        let list = Denylist::new([
            (&b"abcDEF1"[..], Deny::Gone),
            (b"flagged-alias", Deny::Warn),
            (b"both-kinds", Deny::Warn),
            (b"both-kinds", Deny::Gone),
            (b"both-kinds", Deny::Warn),
            (b"restored", Deny::Changed),
            (b"flag-then-change", Deny::Changed),
            (b"flag-then-change", Deny::Warn),
        ]);
        assert_eq!(list.len(), 5);
        assert_eq!(list.check(b"restored"), Some(Deny::Changed));
        assert_eq!(list.check(b"flag-then-change"), Some(Deny::Changed));
        assert_eq!(list.check(b"abcDEF1"), Some(Deny::Gone));
        assert_eq!(list.check(b"flagged-alias"), Some(Deny::Warn));
        assert_eq!(list.check(b"both-kinds"), Some(Deny::Gone));
        assert_eq!(list.check(b"abcDEF2"), None);
        assert_eq!(list.check(b""), None);
    }

    #[test]
    fn patch_and_rank() {
        let mut list = Denylist::new([(&b"abcDEF1"[..], Deny::Warn)]);
        list.patch(b"abcDEF1", Some(&Deny::Gone));
        list.patch(b"new-alias", Some(&Deny::Changed));
        assert_eq!(list.check(b"abcDEF1"), Some(Deny::Gone));
        assert_eq!(list.check(b"new-alias"), Some(Deny::Changed));
        list.patch(b"abcDEF1", None);
        list.patch(b"never-listed", None);
        assert_eq!((list.check(b"abcDEF1"), list.len()), (None, 1));
        assert_eq!(
            stronger(Some(Deny::Warn), Some(Deny::Changed)),
            Some(Deny::Changed)
        );
        assert_eq!(
            stronger(Some(Deny::Gone), Some(Deny::Changed)),
            Some(Deny::Gone)
        );
        assert_eq!(stronger(None, Some(Deny::Warn)), Some(Deny::Warn));
        assert_eq!(stronger(Some(Deny::Warn), None), Some(Deny::Warn));
        assert_eq!(stronger(None, None), None);
    }

    #[test]
    fn empty() {
        let list = Denylist::empty();
        assert!(list.is_empty());
        assert_eq!(list.check(b"abcDEF1"), None);
        let collected: Denylist = vec![(String::from("abcDEF1"), Deny::Gone)]
            .into_iter()
            .collect();
        assert_eq!(collected.check(b"abcDEF1"), Some(Deny::Gone));
    }
}
