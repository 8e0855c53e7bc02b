//! What the feed does to the tables, without threads or sockets: the engine's view of the
//! control plane's changes (standing denylist, overlay, current snapshot, applied sequence) and
//! the [`Tables`] generation it publishes. The engine's feed applier thread owns one
//! [`FeedView`], hands it every frame and every downloaded snapshot, and publishes
//! [`FeedView::tables`] once per burst (`core/FEED.md` is the wire contract;
//! `engine/DESIGN.md`, "The feed", the why).
//!
//! The generation it builds holds:
//!
//! - overlay: every link created or changed after the current snapshot's sequence, in its
//!   current form (a gone link with an empty URL, which answers 410);
//! - denylist: the standing list (disabled and taken down → `Gone`, flagged → `Warn`), plus
//!   `Gone` or `Changed` for every overlay entry that came from a state change after the
//!   snapshot, so that a restore or a moved expiry is answered from the overlay instead of the
//!   snapshot's stale entry;
//! - high-water marks raised for every generated code the feed announces;
//! - `safe_mode` until the feed is connected and caught up (the standing denylist received and
//!   every change up to the control plane's last sequence applied).
//!
//! A burst of frames costs what it changed, not the size of the standing denylist: the view
//! notes which codes a frame touched, and the next generation of each table is its spare copy
//! patched with those codes' new entries ([`crate::generations`], left-right). Only a new
//! standing list and a rewind rebuild both tables whole. `benches/feed.rs` measures a burst
//! against 10k and 1M standing entries.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use lasthop_core::feed::{DenyKind, Frame, LinkFrame, SnapshotFrame};
use lasthop_snapshot::Snapshot;

use crate::denylist::{stronger, Deny, Denylist};
use crate::generations::{Change, Generations, PublishStats};
use crate::overlay::{Overlay, OverlayLink};
use crate::tables::{Tables, TablesError};

/// One overlay entry and the change that produced it.
#[derive(Debug, Clone)]
struct Entry {
    link: OverlayLink,
    seq: u64,
    /// From a state change (else a creation): the snapshot's entry, if any, is stale.
    changed: bool,
}

/// What applying a frame did, beyond the tables. Exhaustive on purpose: the engine's applier
/// acts on every variant, so a new one is a compile error there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// Nothing the tables show changed.
    Nothing,
    /// The next generation differs: publish.
    Changed,
    /// A snapshot newer than the one served was announced: download it.
    Download(SnapshotFrame),
    /// The control plane's change log is behind this engine's (restored from an older
    /// backup?): what the old numbering covered was forgotten, and changes apply from its
    /// sequence on.
    Rewound { control: u64, applied: u64 },
    /// A denylist part arrived without its first part, and was ignored.
    OrphanPart { part: u32 },
    /// The branded domains' certificates are at `generation`: fetch them if the engine holds
    /// another.
    Certificates { generation: u64 },
}

/// The engine's view of the feed. See the module docs.
#[derive(Debug)]
pub struct FeedView {
    /// Scheme, marks, snapshot, origin flag; the denylist and overlay come from `deny` and
    /// `links`.
    base: Tables,
    snapshot_seq: u64,
    /// The id of the snapshot served, when it came from the feed.
    snapshot_id: Option<String>,
    applied: u64,
    standing: HashMap<Box<[u8]>, DenyKind>,
    /// A standing list arriving in parts.
    pending_denylist: Option<HashMap<Box<[u8]>, DenyKind>>,
    /// The change sequence the standing list is current as of.
    standing_seq: u64,
    overlay: HashMap<Box<[u8]>, Entry>,
    /// The control plane's last sequence (hello, heartbeat): caught up once applied reaches it.
    target: Option<u64>,
    connected: bool,
    got_denylist: bool,
    /// The published denylist (standing list and the overlay's state changes) and overlay.
    deny: Generations<Denylist>,
    links: Generations<Overlay>,
    /// Codes whose published entries may be out of date.
    dirty: HashSet<Box<[u8]>>,
    /// The next generation rebuilds both tables whole.
    rebuild: bool,
    /// The most codes a region mints per second, as the control plane last announced.
    mint_rate: Option<u64>,
    /// How long the marks have gone unconfirmed (not in sync), as the applier last said.
    unconfirmed_ms: u64,
    /// Regions the control plane's region has lost touch with, and the counters each may
    /// have minted since (hello and heartbeat `widen`).
    peer_widen: Vec<lasthop_core::feed::Window>,
}

impl FeedView {
    /// A view starting from `base` (the snapshot the engine serves, if any, and its marks):
    /// everything up to the snapshot's sequence counts as applied.
    pub fn new(base: Tables) -> FeedView {
        let snapshot_seq = base.snapshot.as_ref().map_or(0, |s| s.sequence());
        FeedView {
            base,
            snapshot_seq,
            snapshot_id: None,
            applied: snapshot_seq,
            standing: HashMap::new(),
            pending_denylist: None,
            standing_seq: 0,
            overlay: HashMap::new(),
            target: None,
            connected: false,
            got_denylist: false,
            deny: Generations::new(Denylist::empty()),
            links: Generations::new(Overlay::empty()),
            dirty: HashSet::new(),
            rebuild: false,
            mint_rate: None,
            unconfirmed_ms: 0,
            peer_widen: Vec::new(),
        }
    }

    /// A subscription opened: the standing list and the catch-up point come again.
    pub fn connected(&mut self) {
        self.connected = true;
        self.got_denylist = false;
        self.pending_denylist = None;
        self.target = None;
    }

    /// The subscription was lost; returns whether it had been connected.
    pub fn lost(&mut self) -> bool {
        std::mem::replace(&mut self.connected, false)
    }

    /// Connected, the standing list received, and every change up to the control plane's last
    /// sequence applied.
    pub fn in_sync(&self) -> bool {
        self.connected && self.caught_up()
    }

    /// The standing list received and applied up to the last sequence the control plane
    /// announced (whether or not the subscription is still open).
    pub fn caught_up(&self) -> bool {
        self.got_denylist && self.target.is_some_and(|t| self.applied >= t)
    }

    /// The change sequence applied.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The control plane's last sequence, as last announced.
    pub fn target(&self) -> Option<u64> {
        self.target
    }

    /// The sequence of the snapshot served.
    pub fn snapshot_seq(&self) -> u64 {
        self.snapshot_seq
    }

    /// Names the snapshot the view started from (a downloaded one found on disk).
    pub fn set_snapshot_id(&mut self, id: Option<String>) {
        self.snapshot_id = id;
    }

    /// Applies one frame.
    pub fn apply(&mut self, frame: Frame) -> Applied {
        match frame {
            Frame::Hello {
                last_seq,
                mint_rate,
                widen,
                ..
            } => {
                self.mint_rate = mint_rate;
                let widened = self.set_peer_widen(widen);
                let rewound = last_seq < self.applied;
                let applied = self.applied;
                if rewound {
                    self.applied = last_seq;
                    // The old numbering means nothing now: forget what it covered, so changes
                    // under the new numbers apply (a newer snapshot will be downloaded).
                    self.overlay.clear();
                    self.rebuild = true;
                    self.snapshot_seq = self.snapshot_seq.min(last_seq);
                    self.standing_seq = 0;
                }
                self.note_target(last_seq);
                if rewound {
                    Applied::Rewound {
                        control: last_seq,
                        applied,
                    }
                } else if widened {
                    Applied::Changed
                } else {
                    Applied::Nothing
                }
            }
            Frame::Heartbeat {
                last_seq,
                mint_rate,
                widen,
                ..
            } => {
                self.mint_rate = mint_rate;
                self.note_target(last_seq);
                if self.set_peer_widen(widen) {
                    Applied::Changed
                } else {
                    Applied::Nothing
                }
            }
            Frame::Denylist {
                seq,
                entries,
                part,
                last,
            } => {
                // Parts gather aside; the list in force changes only once it is whole.
                let pending = match (part, self.pending_denylist.as_mut()) {
                    (0, _) => self.pending_denylist.insert(HashMap::new()),
                    (_, Some(p)) => p,
                    (_, None) => return Applied::OrphanPart { part },
                };
                pending.extend(
                    entries
                        .into_iter()
                        .map(|e| (e.code.into_bytes().into_boxed_slice(), e.deny)),
                );
                if !last {
                    return Applied::Nothing;
                }
                self.standing = self.pending_denylist.take().unwrap_or_default();
                self.rebuild = true;
                self.standing_seq = seq;
                self.got_denylist = true;
                Applied::Changed
            }
            Frame::LinkCreated(l) => {
                self.note_applied(l.seq);
                self.learn_code(&l.code);
                if l.seq <= self.snapshot_seq {
                    return Applied::Nothing; // the snapshot has it
                }
                self.upsert(l, false);
                Applied::Changed
            }
            Frame::StateChanged(l) => {
                self.note_applied(l.seq);
                self.learn_code(&l.code);
                // The standing list is current as of its own sequence: replayed older changes
                // must not undo it.
                if l.seq > self.standing_seq {
                    let code: Box<[u8]> = l.code.as_bytes().into();
                    match l.deny_kind() {
                        Some(kind) => self.standing.insert(code.clone(), kind),
                        None => self.standing.remove(&code),
                    };
                    self.dirty.insert(code);
                }
                if l.seq > self.snapshot_seq {
                    self.upsert(l, true);
                }
                Applied::Changed
            }
            Frame::Snapshot(s) if self.wants_snapshot(s.seq, &s.id) => Applied::Download(s),
            Frame::Certificates { generation } => Applied::Certificates { generation },
            Frame::Snapshot(_) | Frame::Unknown => Applied::Nothing,
        }
    }

    /// Whether snapshot `id`, complete up to `seq`, would be news: newer than the one served,
    /// another build of the same sequence (a hot set re-ranked by clicks), or any at all when
    /// none is served (a fresh control plane's first snapshot has sequence 0).
    pub fn wants_snapshot(&self, seq: u64, id: &str) -> bool {
        self.base.snapshot.is_none()
            || seq > self.snapshot_seq
            || (seq == self.snapshot_seq && self.snapshot_id.as_deref() != Some(id))
    }

    /// Serves `snapshot` (named `id` when it came from the feed) from now on: the overlay
    /// entries it covers are dropped and its sequence counts as applied. Refuses a snapshot
    /// built under another key.
    pub fn swap_snapshot(
        &mut self,
        snapshot: Arc<Snapshot>,
        id: Option<&str>,
    ) -> Result<(), TablesError> {
        let seq = snapshot.sequence();
        self.base = self.base.with_snapshot(snapshot)?;
        self.snapshot_seq = seq;
        self.snapshot_id = id.map(str::to_owned);
        let dirty = &mut self.dirty;
        self.overlay.retain(|code, e| {
            let keep = e.seq > seq;
            if !keep {
                dirty.insert(code.clone());
            }
            keep
        });
        self.note_applied(seq);
        Ok(())
    }

    /// The generation to publish now: the base tables with the denylist and overlay brought up
    /// to date (the codes changed since the last call, or both whole after a new standing
    /// list or a rewind), in safe mode unless in sync (when `safe_mode` is on at all).
    pub fn tables(&mut self, safe_mode: bool) -> Tables {
        if std::mem::take(&mut self.rebuild) {
            self.dirty.clear();
            self.deny.replace(self.whole_denylist());
            self.links.replace(
                Overlay::empty().with_all(
                    self.overlay
                        .iter()
                        .map(|(code, e)| (&**code, e.link.clone())),
                ),
            );
        } else if !self.dirty.is_empty() {
            let dirty = std::mem::take(&mut self.dirty);
            let mut deny: Vec<Change<Denylist>> = Vec::new();
            let mut links: Vec<Change<Overlay>> = Vec::new();
            for code in dirty {
                let listed = self.listed(&code);
                if self.deny.front().check(&code) != listed {
                    deny.push((code.clone(), listed));
                }
                let link = self.overlay.get(&code).map(|e| &e.link);
                if self.links.front().get(&code) != link {
                    links.push((code, link.cloned()));
                }
            }
            self.deny.publish(deny);
            self.links.publish(links);
        }
        let mut tables = self
            .base
            .with_denylist(Arc::clone(self.deny.front()))
            .with_overlay(Arc::clone(self.links.front()));
        tables.safe_mode = safe_mode && !self.in_sync();
        let widening = self.widening();
        if widening > 0 {
            tables.high_water = tables.high_water.widened(widening);
        }
        for w in &self.peer_widen {
            tables.high_water = tables.high_water.widened_region(w.region, w.extra);
        }
        tables
    }

    /// Serves `domains` (the branded domains, by `Host`) from the next generation on.
    pub fn set_domains(&mut self, domains: Arc<crate::domains::Domains>) {
        self.base = self.base.with_domains(domains);
    }

    /// Takes the control plane's latest per-region widening; true when it changed (publish).
    fn set_peer_widen(&mut self, widen: Vec<lasthop_core::feed::Window>) -> bool {
        let changed = widen != self.peer_widen;
        self.peer_widen = widen;
        changed
    }

    /// The marks have gone unconfirmed for `ms` (0 once in sync again): returns whether the
    /// published marks' widening changed (publish again).
    pub fn set_unconfirmed(&mut self, ms: u64) -> bool {
        let before = self.widening();
        self.unconfirmed_ms = ms;
        self.widening() != before
    }

    /// Counters added above every region's mark while out of sync: the mint rate × the time
    /// unconfirmed, so a link minted during a partition is never rejected by arithmetic (a
    /// code in the window that is not local goes to the origin, which answers 503 when it
    /// is unreachable too, never 404). Nothing while in sync or without an announced rate.
    pub fn widening(&self) -> u64 {
        match self.mint_rate {
            Some(rate) if !self.in_sync() => rate.saturating_mul(self.unconfirmed_ms) / 1000,
            _ => 0,
        }
    }

    /// How the denylist's and the overlay's generations were made, added up.
    pub fn publish_stats(&self) -> PublishStats {
        let (d, l) = (self.deny.stats(), self.links.stats());
        PublishStats {
            in_place: d.in_place + l.in_place,
            copied: d.copied + l.copied,
            rebuilt: d.rebuilt + l.rebuilt,
        }
    }

    /// What the published denylist says about `code`: its standing listing or the overlay's
    /// (a state change after the snapshot: `Gone` when the link is gone, else `Changed`),
    /// whichever is stronger.
    fn listed(&self, code: &[u8]) -> Option<Deny> {
        let standing = self.standing.get(code).map(|&kind| deny_of(kind));
        stronger(standing, self.overlay.get(code).and_then(changed_deny))
    }

    /// The published denylist built from scratch.
    fn whole_denylist(&self) -> Denylist {
        let standing = self
            .standing
            .iter()
            .map(|(code, &kind)| (&**code, deny_of(kind)));
        let changed = self
            .overlay
            .iter()
            .filter_map(|(code, e)| Some((&**code, changed_deny(e)?)));
        Denylist::new(standing.chain(changed))
    }

    fn note_target(&mut self, last_seq: u64) {
        self.target = Some(self.target.map_or(last_seq, |t| t.max(last_seq)));
    }

    fn note_applied(&mut self, seq: u64) {
        self.applied = self.applied.max(seq);
    }

    /// A generated code exists: make sure the high-water check lets it through.
    fn learn_code(&mut self, code: &str) {
        // Only a code of the generated shape (7 base62 characters) decrypts.
        if let Some(n) = self.base.scheme.decode(code.as_bytes()) {
            self.base.high_water.note_issued(n);
        }
    }

    fn upsert(&mut self, l: LinkFrame, changed: bool) {
        let code: Box<[u8]> = l.code.as_bytes().into();
        let previous = self.overlay.get(&code);
        if previous.is_some_and(|p| p.seq > l.seq) {
            return; // a replayed older frame
        }
        // Only a creation the engine saw counts for the creation-to-first-redirect metric: a
        // state change of an old link carries its old creation time, which is no first redirect.
        let created_at_ms = if changed {
            previous.and_then(|p| p.link.created_at_ms)
        } else {
            l.created_at_ms
        };
        let first_served = previous
            .map(|p| p.link.first_served.clone())
            .unwrap_or_default();
        let changed = changed || previous.is_some_and(|p| p.changed);
        let url = if l.gone() {
            Vec::new().into_boxed_slice()
        } else {
            l.long_url.into_bytes().into_boxed_slice()
        };
        self.dirty.insert(code.clone());
        self.overlay.insert(
            code,
            Entry {
                link: OverlayLink {
                    url,
                    expires_at_ms: l.expires_at_ms,
                    warn: l.warn,
                    created_at_ms,
                    first_served,
                    options: l.options,
                },
                seq: l.seq,
                changed,
            },
        );
    }
}

fn deny_of(kind: DenyKind) -> Deny {
    match kind {
        DenyKind::Gone => Deny::Gone,
        DenyKind::Warn => Deny::Warn,
    }
}

/// What an overlay entry lists: nothing for a creation, else `Gone` or `Changed`.
fn changed_deny(e: &Entry) -> Option<Deny> {
    e.changed.then_some(if e.link.url.is_empty() {
        Deny::Gone
    } else {
        Deny::Changed
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::feed::DenyEntry;
    use lasthop_core::{CodeScheme, HighWater, PermutationKey};
    use lasthop_snapshot::{SnapshotMeta, SnapshotWriter};

    fn scheme() -> CodeScheme {
        CodeScheme::new(&PermutationKey::from_bytes(&[3; 16]).unwrap()).unwrap()
    }

    /// A snapshot complete up to `seq` holding `links` (code, URL).
    fn snapshot(seq: u64, links: &[(&str, &str)]) -> Arc<Snapshot> {
        let mut hw = HighWater::new(1, 100).unwrap();
        hw.raise(0, 1_000).unwrap();
        let mut w =
            SnapshotWriter::in_memory(SnapshotMeta::new(seq, scheme().key_id(), hw)).unwrap();
        let mut links = links.to_vec();
        links.sort();
        for (code, url) in links {
            w.add(code.as_bytes(), url.as_bytes(), None).unwrap();
        }
        let (_, bytes) = w.seal().unwrap();
        Arc::new(Snapshot::from_vec(bytes).unwrap())
    }

    fn view(snap: Option<Arc<Snapshot>>) -> FeedView {
        let base = match snap {
            Some(s) => Tables::from_snapshot(scheme(), s, true).unwrap(),
            None => Tables::new(scheme(), HighWater::new(1, 100).unwrap(), true),
        };
        FeedView::new(base)
    }

    fn link(seq: u64, code: &str, url: &str) -> LinkFrame {
        LinkFrame {
            seq,
            code: code.into(),
            long_url: url.into(),
            expires_at_ms: None,
            created_at_ms: Some(1),
            deleted: false,
            disabled: false,
            takedown_reason: None,
            warn: false,
            options: Default::default(),
        }
    }

    fn denylist(seq: u64, entries: &[(&str, DenyKind)]) -> Frame {
        Frame::Denylist {
            seq,
            entries: entries
                .iter()
                .map(|(c, d)| DenyEntry {
                    code: (*c).into(),
                    deny: *d,
                })
                .collect(),
            part: 0,
            last: true,
        }
    }

    fn hello(last_seq: u64) -> Frame {
        Frame::Hello {
            last_seq,
            time_ms: 0,
            mint_rate: None,
            widen: Vec::new(),
        }
    }

    /// What the published tables say about `code`: (denylist, overlay URL).
    fn seen(v: &mut FeedView, code: &str) -> (Option<Deny>, Option<String>) {
        let t = v.tables(true);
        let url = t
            .overlay
            .get(code.as_bytes())
            .map(|l| String::from_utf8(l.url.to_vec()).unwrap());
        (t.denylist.check(code.as_bytes()), url)
    }

    #[test]
    fn safe_mode_lasts_until_connected_listed_and_caught_up() {
        let mut v = view(None);
        assert!(v.tables(true).safe_mode);
        v.connected();
        assert_eq!(v.apply(hello(3)), Applied::Nothing);
        assert!(v.tables(true).safe_mode, "no standing list yet");
        assert_eq!(v.apply(denylist(3, &[])), Applied::Changed);
        assert!(v.tables(true).safe_mode, "changes 1..3 not applied");
        for seq in 1..=3 {
            let code = format!("alias-{seq:03}");
            v.apply(Frame::LinkCreated(link(seq, &code, "https://a.example/")));
        }
        assert!(v.in_sync());
        assert!(!v.tables(true).safe_mode);
        assert!(!v.tables(true).overlay.is_empty());
        assert!(!v.tables(false).safe_mode, "--safe-mode off");
        // A heartbeat announcing more moves the catch-up point.
        v.apply(Frame::Heartbeat {
            last_seq: 4,
            time_ms: 0,
            mint_rate: None,
            widen: Vec::new(),
        });
        assert!(!v.in_sync());
        assert!(!v.caught_up());
        assert_eq!(v.target(), Some(4));
        assert!(v.lost() && !v.lost(), "lost once");
    }

    #[test]
    fn creations_apply_in_order_and_raise_the_marks() {
        let mut v = view(None);
        let code = scheme().encode_string(5_000).unwrap();
        let n = scheme().decode(code.as_bytes()).unwrap();
        assert!(!v.tables(true).high_water.below_mark(n));
        assert_eq!(
            v.apply(Frame::LinkCreated(link(7, &code, "https://new.example/"))),
            Applied::Changed
        );
        assert_eq!(v.applied(), 7);
        assert!(
            v.tables(true).high_water.below_mark(n),
            "the mark covers it"
        );
        assert_eq!(
            seen(&mut v, &code),
            (None, Some("https://new.example/".into()))
        );
        // A replayed older frame changes nothing.
        v.apply(Frame::LinkCreated(link(6, &code, "https://old.example/")));
        assert_eq!(
            seen(&mut v, &code).1.as_deref(),
            Some("https://new.example/")
        );
        assert_eq!(v.applied(), 7, "never goes back");
    }

    #[test]
    fn the_standing_list_is_not_undone_by_replayed_changes() {
        let mut v = view(Some(snapshot(10, &[("taken-alias", "https://a/")])));
        v.connected();
        v.apply(hello(20));
        // The standing list as of 20 says taken down.
        v.apply(denylist(20, &[("taken-alias", DenyKind::Gone)]));
        // Replay of an older restore (seq 15): the standing list stays.
        let restore = link(15, "taken-alias", "https://a/");
        v.apply(Frame::StateChanged(restore));
        let t = v.tables(true);
        assert_eq!(t.denylist.check(b"taken-alias"), Some(Deny::Gone));
        // A newer restore (seq 21) lifts it: the overlay answers, the snapshot's entry is stale.
        v.apply(Frame::StateChanged(link(21, "taken-alias", "https://a/")));
        assert_eq!(
            seen(&mut v, "taken-alias"),
            (Some(Deny::Changed), Some("https://a/".into()))
        );
    }

    #[test]
    fn state_changes_rank_gone_over_changed_over_warn() {
        let mut v = view(Some(snapshot(10, &[("flag-alias", "https://a/")])));
        // Flagged after the snapshot: listed Warn and also Changed; Changed wins (the overlay
        // carries the warn flag and the current URL).
        let mut flagged = link(11, "flag-alias", "https://a/");
        flagged.warn = true;
        v.apply(Frame::StateChanged(flagged));
        let t = v.tables(true);
        assert_eq!(t.denylist.check(b"flag-alias"), Some(Deny::Changed));
        assert!(t.overlay.get(b"flag-alias").unwrap().warn);
        // Taken down: Gone outranks both.
        let mut taken = link(12, "flag-alias", "https://a/");
        taken.takedown_reason = Some("phishing".into());
        v.apply(Frame::StateChanged(taken));
        assert_eq!(
            seen(&mut v, "flag-alias"),
            (Some(Deny::Gone), Some(String::new()))
        );
        // Deleted: never in the standing list, but gone from the overlay (410).
        let mut deleted = link(13, "flag-alias", "");
        deleted.deleted = true;
        v.apply(Frame::StateChanged(deleted));
        assert_eq!(
            seen(&mut v, "flag-alias"),
            (Some(Deny::Gone), Some(String::new()))
        );
        assert!(!v.standing.contains_key(&b"flag-alias"[..]));
    }

    #[test]
    fn a_snapshot_prunes_the_overlay_it_covers() {
        let mut v = view(Some(snapshot(10, &[])));
        v.apply(Frame::LinkCreated(link(11, "first-alias", "https://1/")));
        v.apply(Frame::LinkCreated(link(12, "second-alias", "https://2/")));
        // A creation the snapshot already has is skipped.
        assert_eq!(
            v.apply(Frame::LinkCreated(link(9, "older-alias", "https://0/"))),
            Applied::Nothing
        );
        let announced = SnapshotFrame {
            signature: None,
            id: format!("{:016x}-00000000", 11),
            seq: 11,
            size: 1,
            sha256: String::new(),
            url: "/edge/v1/snapshots/x".into(),
        };
        assert_eq!(
            v.apply(Frame::Snapshot(announced.clone())),
            Applied::Download(announced.clone())
        );
        v.swap_snapshot(
            snapshot(11, &[("first-alias", "https://1/")]),
            Some(&announced.id),
        )
        .unwrap();
        assert_eq!(v.snapshot_seq(), 11);
        let t = v.tables(true);
        assert!(t.overlay.get(b"first-alias").is_none(), "covered");
        assert!(t.overlay.get(b"second-alias").is_some(), "newer");
        // An older snapshot, or the same one, is not news; a newer one is, and so is another
        // build at the same sequence (the hot set re-ranked by clicks).
        assert!(!v.wants_snapshot(10, "0000000000000010-00000000"));
        assert!(!v.wants_snapshot(11, &announced.id));
        assert!(v.wants_snapshot(11, "000000000000000b-11111111"));
        assert!(v.wants_snapshot(12, "000000000000000c-00000000"));
        // Nor a snapshot under another key.
        let other = CodeScheme::new(&PermutationKey::from_bytes(&[4; 16]).unwrap()).unwrap();
        let mut w = SnapshotWriter::in_memory(SnapshotMeta::new(
            20,
            other.key_id(),
            HighWater::new(1, 0).unwrap(),
        ))
        .unwrap();
        w.add(b"x-alias-1", b"https://x/", None).unwrap();
        let foreign = Arc::new(Snapshot::from_vec(w.seal().unwrap().1).unwrap());
        assert!(v.swap_snapshot(foreign, None).is_err());
        assert_eq!(v.snapshot_seq(), 11);
    }

    #[test]
    fn an_engine_ahead_of_a_restored_control_plane_rewinds() {
        let mut v = view(Some(snapshot(50, &[])));
        v.apply(Frame::LinkCreated(link(60, "late-alias", "https://late/")));
        v.connected();
        // The control plane was restored from a backup at 40.
        assert_eq!(
            v.apply(hello(40)),
            Applied::Rewound {
                control: 40,
                applied: 60
            }
        );
        assert_eq!((v.applied(), v.snapshot_seq()), (40, 40));
        assert!(
            v.tables(true).overlay.is_empty(),
            "the old numbering is forgotten"
        );
        // Changes under the new numbering apply, and the next snapshot is wanted.
        assert_eq!(
            v.apply(Frame::LinkCreated(link(41, "new-alias", "https://new/"))),
            Applied::Changed
        );
        assert!(v.wants_snapshot(45, "000000000000002d-00000000"));
    }

    #[test]
    fn denylist_parts_replace_the_list_only_when_whole() {
        let mut v = view(None);
        v.apply(denylist(5, &[("old-alias-1", DenyKind::Gone)]));
        let part = |n: u32, last: bool, code: &str| Frame::Denylist {
            seq: 9,
            entries: vec![DenyEntry {
                code: code.into(),
                deny: DenyKind::Warn,
            }],
            part: n,
            last,
        };
        assert_eq!(
            v.apply(part(1, false, "x-alias-1")),
            Applied::OrphanPart { part: 1 }
        );
        assert_eq!(v.apply(part(0, false, "a-alias-1")), Applied::Nothing);
        assert_eq!(
            seen(&mut v, "old-alias-1").0,
            Some(Deny::Gone),
            "still in force"
        );
        assert_eq!(v.apply(part(1, true, "b-alias-1")), Applied::Changed);
        let t = v.tables(true);
        assert_eq!(t.denylist.check(b"old-alias-1"), None);
        assert_eq!(t.denylist.check(b"a-alias-1"), Some(Deny::Warn));
        assert_eq!(t.denylist.check(b"b-alias-1"), Some(Deny::Warn));
        // A reconnect starts the list over.
        v.apply(part(0, false, "c-alias-1"));
        v.connected();
        assert_eq!(
            v.apply(part(1, true, "d-alias-1")),
            Applied::OrphanPart { part: 1 }
        );
    }

    #[test]
    fn a_state_change_keeps_the_first_redirect_clock_of_the_creation() {
        let mut v = view(None);
        let mut created = link(1, "clock-alias", "https://c/");
        created.created_at_ms = Some(1_000);
        v.apply(Frame::LinkCreated(created));
        let mut changed = link(2, "clock-alias", "https://c/");
        changed.created_at_ms = Some(5);
        changed.warn = true;
        v.apply(Frame::StateChanged(changed));
        let t = v.tables(true);
        let l = t.overlay.get(b"clock-alias").unwrap();
        assert_eq!(l.created_at_ms, Some(1_000));
        // A state change of a link the engine never saw created carries no creation time.
        let mut old = link(3, "ancient-alias", "https://o/");
        old.created_at_ms = Some(7);
        v.apply(Frame::StateChanged(old));
        assert_eq!(
            v.tables(true)
                .overlay
                .get(b"ancient-alias")
                .unwrap()
                .created_at_ms,
            None
        );
    }

    /// A step of the incremental-publish property below.
    #[derive(Debug, Clone)]
    enum Step {
        Create(usize),
        /// 0 restore, 1 disable, 2 take down, 3 flag, 4 delete, 5 move the expiry.
        Change(usize, u8),
        /// A standing list: (code, warn?).
        Standing(Vec<(usize, bool)>),
        Snapshot,
        Rewind(u64),
        /// Publish; keep the generation held (a core on it) or drop it.
        Publish {
            hold: bool,
        },
        /// Cores move on: drop every held generation.
        Release,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        let code = 0usize..24;
        prop_oneof![
            4 => code.clone().prop_map(Step::Create),
            4 => (code.clone(), 0u8..6).prop_map(|(c, k)| Step::Change(c, k)),
            1 => proptest::collection::vec((code, any::<bool>()), 0..8).prop_map(Step::Standing),
            1 => Just(Step::Snapshot),
            1 => (0u64..40).prop_map(Step::Rewind),
            4 => any::<bool>().prop_map(|hold| Step::Publish { hold }),
            1 => Just(Step::Release),
        ]
    }

    proptest::proptest! {
        /// Whatever the frames, the held generations and the snapshots, each published
        /// generation equals the denylist and overlay built from scratch, and a generation a
        /// core holds never changes under it.
        #[test]
        fn incremental_generations_equal_whole_ones(
            steps in proptest::collection::vec(step(), 1..80)
        ) {
            let mut v = view(None);
            v.connected();
            let mut seq = 0u64;
            let mut held: Vec<(Tables, Denylist, Overlay)> = Vec::new();
            let code = |i: usize| if i % 3 == 0 { format!("alias-{i}") } else { format!("abcDE{i:02}") };
            for s in steps {
                match s {
                    Step::Create(i) => {
                        seq += 1;
                        v.apply(Frame::LinkCreated(link(seq, &code(i), &format!("https://{seq}.example/"))));
                    }
                    Step::Change(i, kind) => {
                        seq += 1;
                        let mut l = link(seq, &code(i), &format!("https://{seq}.example/"));
                        match kind {
                            1 => l.disabled = true,
                            2 => l.takedown_reason = Some("phishing".into()),
                            3 => l.warn = true,
                            4 => l.deleted = true,
                            5 => l.expires_at_ms = Some(seq as i64),
                            _ => {}
                        }
                        v.apply(Frame::StateChanged(l));
                    }
                    Step::Standing(entries) => {
                        let entries: Vec<(String, DenyKind)> = entries
                            .into_iter()
                            .map(|(i, warn)| (code(i), if warn { DenyKind::Warn } else { DenyKind::Gone }))
                            .collect();
                        let refs: Vec<(&str, DenyKind)> =
                            entries.iter().map(|(c, k)| (c.as_str(), *k)).collect();
                        v.apply(denylist(seq, &refs));
                    }
                    Step::Snapshot => {
                        v.swap_snapshot(snapshot(seq, &[]), None).unwrap();
                    }
                    Step::Rewind(to) => {
                        v.apply(hello(to.min(seq)));
                        seq = v.applied();
                    }
                    Step::Publish { hold } => {
                        let t = v.tables(true);
                        proptest::prop_assert_eq!(&*t.denylist, &v.whole_denylist());
                        let whole = Overlay::empty().with_all(
                            v.overlay.iter().map(|(c, e)| (&**c, e.link.clone())),
                        );
                        proptest::prop_assert_eq!(&*t.overlay, &whole);
                        if hold {
                            let (d, o) = (Denylist::clone(&t.denylist), Overlay::clone(&t.overlay));
                            held.push((t, d, o));
                        }
                    }
                    Step::Release => held.clear(),
                }
                for (t, d, o) in &held {
                    proptest::prop_assert_eq!(&*t.denylist, d);
                    proptest::prop_assert_eq!(&*t.overlay, o);
                }
            }
        }
    }

    #[test]
    fn a_burst_patches_the_spare_unless_a_core_holds_it() {
        let mut v = view(None);
        v.connected();
        v.apply(denylist(0, &[("abcDE01", DenyKind::Gone)]));
        let first = v.tables(true);
        assert_eq!(
            v.publish_stats().rebuilt,
            2,
            "a new standing list rebuilds both tables"
        );
        v.apply(Frame::LinkCreated(link(1, "abcDE02", "https://a.example/")));
        let second = v.tables(true);
        assert_eq!(
            v.publish_stats().in_place,
            1,
            "the overlay's spare, patched"
        );
        // `first` is still held (a core on it): the overlay's next generation is a copy.
        v.apply(Frame::LinkCreated(link(2, "abcDE03", "https://b.example/")));
        drop(second);
        let _third = v.tables(true);
        assert_eq!(
            (v.publish_stats().in_place, v.publish_stats().copied),
            (1, 1)
        );
        drop(first);
        v.apply(Frame::LinkCreated(link(3, "abcDE04", "https://c.example/")));
        let t = v.tables(true);
        assert_eq!(
            (v.publish_stats().in_place, v.publish_stats().copied),
            (2, 1)
        );
        assert_eq!(t.overlay.len(), 3);
        assert_eq!(t.denylist.check(b"abcDE01"), Some(Deny::Gone));
    }

    #[test]
    fn marks_widen_by_the_mint_rate_while_unconfirmed() {
        let mut v = view(Some(snapshot(0, &[])));
        let mark = v.tables(true).high_water.marks()[0];
        let reserve = v.tables(true).high_water.reserve();
        v.connected();
        v.apply(Frame::Hello {
            last_seq: 0,
            time_ms: 0,
            mint_rate: Some(1_000),
            widen: Vec::new(),
        });
        v.apply(denylist(0, &[]));
        assert!(v.in_sync());
        assert!(!v.set_unconfirmed(5_000), "in sync: nothing widens");
        assert_eq!(v.tables(true).high_water.reserve(), reserve);
        v.lost();
        assert!(v.set_unconfirmed(2_500));
        let t = v.tables(true);
        // 2.5 s at 1,000 codes/s: 2,500 more counters may have been issued meanwhile.
        assert_eq!(t.high_water.reserve(), reserve + 2_500);
        assert!(t.high_water.may_be_issued(mark + reserve + 2_499));
        assert!(!t.high_water.may_be_issued(mark + reserve + 2_500));
        assert!(!t.high_water.below_mark(mark), "widening caches no 404");
        assert!(
            !v.set_unconfirmed(2_500),
            "the same time: nothing new to publish"
        );
        // Back in sync: the truthful marks again.
        v.connected();
        v.apply(hello(0));
        v.apply(denylist(0, &[]));
        v.set_unconfirmed(0);
        assert_eq!(v.tables(true).high_water.reserve(), reserve);
        // A control plane that announces no rate: nothing widens.
        v.lost();
        v.set_unconfirmed(60_000);
        assert_eq!(v.tables(true).high_water.reserve(), reserve);
    }

    /// A peer region out of touch (announced in heartbeats): that region's window alone
    /// widens, in sync or not, and narrows again when the control plane says so.
    #[test]
    fn a_lost_peer_region_widens_its_window_alone() {
        use lasthop_core::feed::Window;
        let mut v = view(Some(snapshot(0, &[])));
        v.connected();
        v.apply(hello(0));
        v.apply(denylist(0, &[]));
        assert!(v.in_sync());
        let t = v.tables(true);
        let (reserve, marks) = (t.high_water.reserve(), t.high_water.marks().to_vec());
        let beat = |widen: Vec<Window>| Frame::Heartbeat {
            last_seq: 0,
            time_ms: 0,
            mint_rate: None,
            widen,
        };
        let wide = vec![Window {
            region: 0,
            extra: 3_000,
        }];
        assert_eq!(v.apply(beat(wide.clone())), Applied::Changed);
        assert_eq!(
            v.apply(beat(wide)),
            Applied::Nothing,
            "the same: no publish"
        );
        let t = v.tables(true);
        assert!(t.high_water.may_be_issued(marks[0] + reserve + 2_999));
        assert!(!t.high_water.may_be_issued(marks[0] + reserve + 3_000));
        assert!(
            !t.high_water.below_mark(marks[0] + 1),
            "widening caches no 404"
        );
        assert_eq!(v.apply(beat(Vec::new())), Applied::Changed);
        assert!(!v.tables(true).high_water.may_be_issued(marks[0] + reserve));
    }
}
