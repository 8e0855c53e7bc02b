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
    /// The status at `now_ms`; deletion outranks takedown outranks disablement outranks expiry.
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
