//! Link, link state and change-log types.
//!
//! A [`Link`] never changes once written (deletion aside, which erases the URL and keeps the
//! code claimed). Everything that can change lives in [`LinkState`] and travels on its own
//! channel. Times are Unix milliseconds, UTC.

use serde::{Deserialize, Serialize};

/// The immutable mapping.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    pub code: String,
    /// Normalised destination; empty once deleted.
    pub long_url: String,
    pub owner: String,
    pub created_at_ms: i64,
}

/// The mutable state beside a link.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkState {
    /// Soft-deleted by its owner: URL erased, code claimed forever.
    #[serde(default)]
    pub deleted: bool,
    /// Disabled by an operator without a public reason.
    #[serde(default)]
    pub disabled: bool,
    /// Expiry; at or after it the link answers 410.
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    /// Set by a takedown; cleared by a restore.
    #[serde(default)]
    pub takedown_reason: Option<String>,
    /// Flagged: served through a warning interstitial.
    #[serde(default)]
    pub warn: bool,
    /// Held: served through the interstitial until released (the first scan verdict, or an
    /// admin). Absent from the stored form when not held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<Hold>,
    /// Pinned by an admin's restore: automatic verdicts (lists, scanner, velocity) leave the
    /// link alone until an admin unpins it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub pinned: bool,
    /// How the redirect is served (issue 43); absent from the stored form at the defaults.
    #[serde(default, skip_serializing_if = "crate::LinkOptions::is_default")]
    pub options: crate::LinkOptions,
    /// The destination an owner's edit set (issue 43), served instead of [`Link::long_url`];
    /// absent for a link never edited. Never written to the change log (see
    /// [`LinkState::logged`]): readers of the log take it from the link as it is now, so a
    /// deletion, which clears it, leaves no edited URL behind.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// An edit waiting for its destination's first scan verdict (`--hold-unverified`): the
    /// current destination is served meanwhile, and a clean or warn verdict makes this one
    /// current. Kept out of the change log like [`LinkState::destination`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_destination: Option<String>,
    /// The current destination came from an edit the scanner has not judged yet.
    #[serde(default, skip_serializing_if = "is_false")]
    pub destination_unscanned: bool,
    /// The owner's tags (issue 43): at most [`TAGS_MAX`], each a [`tag_ok`] name, in the order
    /// given, without repeats.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The clicks the link had at the shortener it was imported from (issue 44, `links import
    /// --with-clicks`): history shown beside lasthop's own counts, never added to them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_clicks: Option<u64>,
    /// Imported with an old code that is no alias (issue 44: a legacy code, or a claimed
    /// 7-character one): every region keeps its key in the legacy set its snapshots carry.
    #[serde(default, skip_serializing_if = "is_false")]
    pub legacy_code: bool,
}

/// The most tags a link carries.
pub const TAGS_MAX: usize = 10;

/// Whether `tag` is a tag's name: 1–32 of `[a-z0-9_-]`.
pub fn tag_ok(tag: &str) -> bool {
    (1..=32).contains(&tag.len())
        && tag
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

impl LinkState {
    /// The URL this link redirects to: its edited destination, else the one it was made with.
    pub fn url<'a>(&'a self, link: &'a Link) -> &'a str {
        self.destination.as_deref().unwrap_or(&link.long_url)
    }

    /// This state as the change log keeps it: an edited or pending destination is replaced by
    /// an empty string, which says there is one without saying what it is (the log outlives
    /// a deletion's erasure; its readers read the link as it is now for the URL).
    pub fn logged(&self) -> LinkState {
        let mut s = self.clone();
        if let Some(d) = s.destination.as_mut() {
            d.clear();
        }
        if let Some(d) = s.pending_destination.as_mut() {
            d.clear();
        }
        s
    }

    /// Whether the change log's form of this state names an edit the scanner has to judge.
    pub fn edit_to_scan(&self) -> bool {
        self.pending_destination.is_some() || self.destination_unscanned
    }
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Why a link is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Hold {
    /// Created with `--hold-unverified`: waits for its first scan verdict.
    Unverified,
    /// Created while its owner was over the creation-velocity limit: waits for an admin.
    Velocity,
}

impl Hold {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Hold::Unverified => "unverified",
            Hold::Velocity => "velocity",
        }
    }
}

/// What a standing denylist entry answers (the feed's `denylist` frames carry it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DenyKind {
    /// Disabled or taken down: 410.
    Gone,
    /// Flagged: the warning interstitial.
    Warn,
}

impl DenyKind {
    /// The rule of [`LinkState::deny_kind`], from the facts it reads (so a feed frame, which
    /// carries them, needs no `LinkState` built for it).
    pub fn of(deleted: bool, disabled_or_taken_down: bool, interstitial: bool) -> Option<Self> {
        if deleted {
            None
        } else if disabled_or_taken_down {
            Some(DenyKind::Gone)
        } else if interstitial {
            Some(DenyKind::Warn)
        } else {
            None
        }
    }
}

/// What a link is, right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkStatus {
    Active,
    Expired,
    Deleted,
    Disabled,
    TakenDown,
}

impl LinkStatus {
    /// The API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkStatus::Active => "active",
            LinkStatus::Expired => "expired",
            LinkStatus::Deleted => "deleted",
            LinkStatus::Disabled => "disabled",
            LinkStatus::TakenDown => "taken_down",
        }
    }
}

impl LinkState {
    /// Whether an edge serves the interstitial instead of a redirect: flagged or held.
    pub fn interstitial(&self) -> bool {
        self.warn || self.held.is_some()
    }

    /// What the standing denylist says about a link in this state: disabled or taken down is
    /// [`DenyKind::Gone`], flagged or held is [`DenyKind::Warn`]; deleted links are never
    /// listed (the snapshot and the feed carry them), and expiry is each engine's own clock's
    /// business. The control plane lists links by this rule and engines apply feed frames by it.
    pub fn deny_kind(&self) -> Option<DenyKind> {
        DenyKind::of(
            self.deleted,
            self.disabled || self.takedown_reason.is_some(),
            self.interstitial(),
        )
    }

    /// The status at `now_ms`; deletion outranks takedown outranks disablement outranks expiry.
    /// (A held link is `Active` here: it is served, through the interstitial.)
    pub fn status(&self, now_ms: i64) -> LinkStatus {
        if self.deleted {
            LinkStatus::Deleted
        } else if self.takedown_reason.is_some() {
            LinkStatus::TakenDown
        } else if self.disabled {
            LinkStatus::Disabled
        } else if self.expires_at_ms.is_some_and(|e| now_ms >= e) {
            LinkStatus::Expired
        } else {
            LinkStatus::Active
        }
    }
}

/// One entry of the ordered change log the edge feed streams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Change {
    LinkCreated { link: Link, state: LinkState },
    StateChanged { code: String, state: LinkState },
}

impl Change {
    /// The code the change is about.
    pub fn code(&self) -> &str {
        match self {
            Change::LinkCreated { link, .. } => &link.code,
            Change::StateChanged { code, .. } => code,
        }
    }

    /// The link's state the change carries (as the log keeps it: [`LinkState::logged`]).
    pub fn state_mut(&mut self) -> &mut LinkState {
        match self {
            Change::LinkCreated { state, .. } | Change::StateChanged { state, .. } => state,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_precedence() {
        let mut s = LinkState::default();
        assert_eq!(s.status(0), LinkStatus::Active);
        s.expires_at_ms = Some(100);
        assert_eq!(s.status(99), LinkStatus::Active);
        assert_eq!(s.status(100), LinkStatus::Expired);
        s.disabled = true;
        assert_eq!(s.status(0), LinkStatus::Disabled);
        s.takedown_reason = Some("phishing".into());
        assert_eq!(s.status(0), LinkStatus::TakenDown);
        s.deleted = true;
        assert_eq!(s.status(0), LinkStatus::Deleted);
    }

    #[test]
    fn held_and_pinned_are_absent_unless_set() {
        let plain = serde_json::to_string(&LinkState::default()).unwrap();
        assert!(
            !plain.contains("held") && !plain.contains("pinned"),
            "{plain}"
        );
        let held = LinkState {
            held: Some(Hold::Velocity),
            pinned: true,
            ..LinkState::default()
        };
        let j = serde_json::to_string(&held).unwrap();
        assert!(
            j.contains("\"held\":\"velocity\"") && j.contains("\"pinned\":true"),
            "{j}"
        );
        assert_eq!(serde_json::from_str::<LinkState>(&j).unwrap(), held);
        assert!(held.interstitial() && !LinkState::default().interstitial());
        assert_eq!(held.status(0), LinkStatus::Active);
    }

    #[test]
    fn change_json_is_tagged() {
        let c = Change::StateChanged {
            code: "abcdefg".into(),
            state: LinkState::default(),
        };
        let j = serde_json::to_string(&c).unwrap();
        assert!(j.contains("\"type\":\"state_changed\""), "{j}");
        assert_eq!(serde_json::from_str::<Change>(&j).unwrap(), c);
    }
}
