//! Building an edge snapshot from the store.
//!
//! Two shapes, one entry format: live links with their URL, expiry and serving options (format
//! version 4 carries a link's own options; a link with the defaults is written as before),
//! deleted, disabled or taken-down ones with an empty URL, which the engine answers 410 locally
//! (an empty URL is never servable) instead of asking the origin about a code it already knows
//! is gone.
//!
//! - [`build_snapshot`]: every link (`lasthop-control snapshot build` without a budget): a full
//!   walk of the store.
//! - [`build_hot_snapshot`]: the hot set, what an edge should answer locally, inside a budget
//!   ([`HotSet`]: `--snapshot-max-links`, `--snapshot-max-bytes`, `--snapshot-recent-days`),
//!   which `serve` publishes. Everything else is answered by the engines' origin read-through.
//!   Its cost grows with the hot set, not with the store: the recent links come from the tail of
//!   the change log (a binary search by creation time finds where "recent" starts; the log is
//!   the store's index by creation time), with their current state (the log holds each
//!   creation and every later state change), the popular ones from the click rollups' top codes
//!   with one keyed read each.
//!
//! The ranking (documented in core/FEED.md, "Snapshot publishing"): first every link created in
//! the last `recent_days`, newest first (a new link is the likeliest to be clicked, and the one
//! no origin cache holds yet); then the links with the most human clicks over the last
//! [`POPULAR_DAYS`] days, most first; both cut where the budget ends.

use std::collections::HashSet;
use std::path::Path;

use lasthop_core::{Change, HighWater, LinkStatus, RegionError};
use lasthop_snapshot::{Layout, SealedInfo, SnapshotMeta, SnapshotWriter};

use crate::store::{Store, StoreError, StoredLink};

/// Days of clicks that make a link popular.
pub const POPULAR_DAYS: u32 = 30;

/// What a hot-set snapshot may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotSet {
    /// Most links (codes and aliases).
    pub max_links: u64,
    /// Most bytes of links, each counted as [`Layout::link_cost_with_options`] estimates it for
    /// `layout` (the header is not counted).
    pub max_bytes: u64,
    /// Links created within this many days are in, newest first.
    pub recent_days: u32,
    /// How the file is laid out: memory against a cold hit's memory accesses.
    pub layout: Layout,
}

impl Default for HotSet {
    /// 10M links or 2 GiB, a week of new links: a PoP host's memory holds it many times over.
    fn default() -> Self {
        HotSet {
            max_links: 10_000_000,
            max_bytes: 2 << 30,
            recent_days: 7,
            layout: Layout::default(),
        }
    }
}

/// What went into a hot-set snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HotStats {
    /// Links created within the recent days.
    pub recent: u64,
    /// Links in for their clicks.
    pub popular: u64,
    /// The budget was spent before the candidates were (the rest are not read).
    pub full: bool,
    /// Changes of the log read to find the recent links.
    pub changes_read: u64,
}

/// Why a snapshot could not be built from the store.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotBuildError {
    /// The region count and reserve, or a region's high-water mark, do not fit.
    #[error(transparent)]
    Regions(#[from] RegionError),
    /// Reading the store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Creating, filling or sealing the snapshot file failed.
    #[error(transparent)]
    Writer(#[from] lasthop_snapshot::BuildError),
}

/// Writes a snapshot of everything in `store` to `out` (temp name, fsync, rename); returns the
/// change-log sequence it is complete up to, and what the writer sealed.
pub fn build_snapshot(
    store: &dyn Store,
    key_id: u32,
    regions: u32,
    reserve: u64,
    out: &Path,
    layout: Layout,
) -> Result<(u64, SealedInfo), SnapshotBuildError> {
    let mut high_water = HighWater::new(regions, reserve)?;
    for (region, mark) in store.high_water_marks()? {
        high_water.raise(region, mark)?;
    }
    // Taken before the read, so the snapshot is complete up to `sequence` and may hold a little
    // more; an engine replaying the feed from `sequence` re-applies those changes, which is
    // harmless because applying a change is idempotent.
    let sequence = store.last_seq()?;
    let meta = SnapshotMeta::new(sequence, key_id, high_water).with_layout(layout);
    let mut writer = SnapshotWriter::create(out, meta)?;
    let now = crate::clock::now_ms();
    // The writer's own error, kept for the caller; the store's walk is stopped with a
    // placeholder that is never returned.
    let mut failed = None;
    let walked = store.for_each_link(&mut |s| {
        let url = servable_url(s, now);
        if s.state.options.validate().is_err() {
            // Only an import could store such options: the link is left to the overlay and
            // the origin rather than failing every snapshot.
            tracing::warn!(code = %s.link.code, "a link's stored options are invalid; not in the snapshot");
            return Ok(());
        }
        writer
            .add_with_options(
                s.link.code.as_bytes(),
                url,
                s.state.expires_at_ms,
                s.state.options,
            )
            .map_err(|e| {
                failed = Some(e);
                StoreError::NotApplied("the snapshot writer failed")
            })
    });
    if let Some(e) = failed {
        return Err(SnapshotBuildError::Writer(e));
    }
    walked?;
    add_legacy_set(store, &mut writer)?;
    Ok((sequence, writer.seal()?))
}

/// Adds every imported legacy or claimed code of the record ([`crate::store::LEGACY_SET`]) to
/// the snapshot's legacy set (format version 5), hot or not: an engine then asks its origin
/// about a cold one and 404s any other code of that shape without a lookup. A link deleted
/// since stays in the set (its code stays claimed forever, and answers 410).
fn add_legacy_set<S: lasthop_snapshot::Sink>(
    store: &dyn Store,
    writer: &mut SnapshotWriter<S>,
) -> Result<(), SnapshotBuildError> {
    let mut after = None;
    loop {
        let page = store.code_set(crate::store::LEGACY_SET, after.as_deref(), 10_000)?;
        for key in &page.codes {
            writer.add_legacy(key.as_bytes())?;
        }
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}

/// Writes the hot set of `store` to `out` within `hot` (see the module docs): the links created
/// since `now_ms` − `hot.recent_days`, then `popular` (codes with their clicks, most first; the
/// caller reads them from the rollups), cut at the budget. Returns the change-log sequence it is
/// complete up to (for every link it holds), what the writer sealed, and what went in.
#[allow(clippy::too_many_arguments)]
pub fn build_hot_snapshot(
    store: &dyn Store,
    key_id: u32,
    regions: u32,
    reserve: u64,
    out: &Path,
    hot: &HotSet,
    popular: &[(String, u64)],
    now_ms: i64,
) -> Result<(u64, SealedInfo, HotStats), SnapshotBuildError> {
    let mut high_water = HighWater::new(regions, reserve)?;
    for (region, mark) in store.high_water_marks()? {
        high_water.raise(region, mark)?;
    }
    // Taken before the reads, as for a full build.
    let sequence = store.last_seq()?;
    let mut stats = HotStats::default();
    let cutoff = now_ms.saturating_sub(i64::from(hot.recent_days) * lasthop_core::day::DAY_MS);
    let keep = usize::try_from(hot.max_links).unwrap_or(usize::MAX);
    let recent = recent_links(store, cutoff, sequence, keep, &mut stats)?;
    let meta = SnapshotMeta::new(sequence, key_id, high_water).with_layout(hot.layout);
    let mut writer = SnapshotWriter::create(out, meta)?;
    let mut taken: HashSet<&str> = HashSet::new();
    let mut budget = Budget {
        hot,
        links: 0,
        bytes: 0,
        full: false,
    };
    // Recent links, newest first, as the log left them.
    for code in recent.order.iter().rev() {
        let Some(entry) = recent.state.get(code.as_str()) else {
            continue;
        };
        if !taken.insert(code.as_str()) {
            continue;
        }
        let url = entry.url(now_ms);
        if entry.state.options.validate().is_err() {
            continue;
        }
        if !budget.admit(code, url, &entry.state.options) {
            break;
        }
        writer.add_with_options(
            code.as_bytes(),
            url,
            entry.state.expires_at_ms,
            entry.state.options,
        )?;
        stats.recent += 1;
    }
    // Then the popular ones, read by key, a batch at a time.
    let mut rest = popular
        .iter()
        .map(|(c, _)| c.as_str())
        .filter(|c| !taken.contains(c));
    while !budget.full {
        let batch: Vec<String> = rest.by_ref().take(BATCH).map(str::to_owned).collect();
        if batch.is_empty() {
            break;
        }
        for (code, link) in batch.iter().zip(store.get_many(&batch)?) {
            let Some(link) = link else {
                continue;
            };
            let url = servable_url(&link, now_ms);
            if link.state.options.validate().is_err() {
                continue;
            }
            if !budget.admit(code, url, &link.state.options) {
                break;
            }
            writer.add_with_options(
                code.as_bytes(),
                url,
                link.state.expires_at_ms,
                link.state.options,
            )?;
            stats.popular += 1;
        }
    }
    stats.full = budget.full;
    add_legacy_set(store, &mut writer)?;
    Ok((sequence, writer.seal()?, stats))
}

/// Candidates read from the store at a time.
const BATCH: usize = 1_000;

/// What an entry holds for `link`: its URL while it may redirect, else empty (410 at the edge).
fn servable_url(link: &StoredLink, now_ms: i64) -> &[u8] {
    match link.state.status(now_ms) {
        LinkStatus::Active | LinkStatus::Expired => link.state.url(&link.link).as_bytes(),
        LinkStatus::Deleted | LinkStatus::Disabled | LinkStatus::TakenDown => b"",
    }
}

/// What the budget has taken so far.
struct Budget<'a> {
    hot: &'a HotSet,
    links: u64,
    bytes: u64,
    full: bool,
}

impl Budget<'_> {
    /// Takes `code` with `url` and `options` if it fits; once something does not, nothing more
    /// is taken.
    fn admit(&mut self, code: &str, url: &[u8], options: &lasthop_core::LinkOptions) -> bool {
        let size = self
            .hot
            .layout
            .link_cost_with_options(code.len(), url.len(), options);
        if self.full
            || self.links + 1 > self.hot.max_links
            || self.bytes + size > self.hot.max_bytes
        {
            self.full = true;
            return false;
        }
        self.links += 1;
        self.bytes += size;
        true
    }
}

/// A recent link as the change log leaves it.
struct RecentLink {
    long_url: String,
    state: lasthop_core::LinkState,
}

impl RecentLink {
    fn url(&self, now_ms: i64) -> &[u8] {
        match self.state.status(now_ms) {
            LinkStatus::Active | LinkStatus::Expired => self.long_url.as_bytes(),
            LinkStatus::Deleted | LinkStatus::Disabled | LinkStatus::TakenDown => b"",
        }
    }
}

/// The links created at or after a cutoff: codes in creation order, and each one's state after
/// every later change in the log.
struct Recent {
    order: std::collections::VecDeque<String>,
    state: std::collections::HashMap<String, RecentLink>,
}

/// The newest `keep` links created at or after `cutoff_ms`, read from the log's tail up to
/// `last_seq`.
fn recent_links(
    store: &dyn Store,
    cutoff_ms: i64,
    last_seq: u64,
    keep: usize,
    stats: &mut HotStats,
) -> Result<Recent, StoreError> {
    let keep = keep.max(1);
    let start = first_created_since(store, cutoff_ms, last_seq, stats)?;
    let mut recent = Recent {
        order: std::collections::VecDeque::new(),
        state: std::collections::HashMap::new(),
    };
    stats.changes_read += crate::store::walk_changes(
        store,
        start.saturating_sub(1),
        last_seq,
        10_000,
        &mut |_, change| match change {
            Change::LinkCreated { link, state } if link.created_at_ms >= cutoff_ms => {
                // Only the newest `keep` can make the cut: memory follows the budget, not the
                // week's creations.
                if recent.order.len() == keep {
                    if let Some(oldest) = recent.order.pop_front() {
                        recent.state.remove(&oldest);
                    }
                }
                recent.order.push_back(link.code.clone());
                recent.state.insert(
                    link.code,
                    RecentLink {
                        long_url: link.long_url,
                        state,
                    },
                );
            }
            Change::StateChanged { code, state } => {
                if let Some(entry) = recent.state.get_mut(&code) {
                    entry.state = state;
                }
            }
            Change::LinkCreated { .. } => {}
        },
    )?;
    // The log marks an edited destination without its URL: read those links as they are.
    for (code, entry) in recent.state.iter_mut() {
        if entry.state.destination.is_some() {
            if let Some(now) = store.get(code)? {
                entry.long_url = now.state.url(&now.link).to_string();
                entry.state = now.state;
            }
        }
    }
    Ok(recent)
}

/// The first change-log sequence at or after which links are created at or after `cutoff_ms`:
/// a binary search over the log (creation times rise with the sequence, give or take one
/// group commit; the caller filters by time anyway), each probe reading the first creation at or
/// after its sequence.
fn first_created_since(
    store: &dyn Store,
    cutoff_ms: i64,
    last_seq: u64,
    stats: &mut HotStats,
) -> Result<u64, StoreError> {
    // Changes at or before `lo` are older than the cutoff; at or after `hi`, not.
    let (mut lo, mut hi) = (0u64, last_seq.saturating_add(1));
    while lo + 1 < hi {
        let mid = lo + (hi - lo) / 2;
        let page = store.changes_since(mid - 1, 64)?;
        stats.changes_read += page.len() as u64;
        let created = page.iter().find_map(|(seq, c)| match c {
            Change::LinkCreated { link, .. } => Some((*seq, link.created_at_ms)),
            Change::StateChanged { .. } => None,
        });
        match created {
            Some((_, at)) if at < cutoff_ms => lo = mid,
            // Recent, or a run of state changes that says nothing (a bulk takedown): look
            // earlier. Erring this way reads more of the log, never leaves a recent link out.
            _ => hi = mid,
        }
    }
    // Back off by one page so creations committed slightly out of time order are not missed.
    Ok(hi.saturating_sub(64).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Actor, CreateRequest, StateUpdate};
    use crate::{EmbeddedStore, EmbeddedStoreConfig};
    use lasthop_core::{CodeScheme, PermutationKey};
    use lasthop_snapshot::Snapshot;

    fn store(dir: &Path) -> EmbeddedStore {
        let key = PermutationKey::from_bytes(&[9; 16]).unwrap();
        let scheme = CodeScheme::new(&key).unwrap();
        EmbeddedStore::open(
            EmbeddedStoreConfig::new(dir.join("links.redb"), scheme),
            None,
        )
        .unwrap()
    }

    fn create(s: &EmbeddedStore, url: &str, now_ms: i64) -> String {
        create_with(s, url, now_ms, Default::default())
    }

    fn create_with(
        s: &EmbeddedStore,
        url: &str,
        now_ms: i64,
        options: lasthop_core::LinkOptions,
    ) -> String {
        let req = CreateRequest {
            owner: "o".into(),
            long_url: url.into(),
            domain: None,
            alias: None,
            expires_at_ms: None,
            idempotency: None,
            now_ms,
            hold: None,
            options,
            tags: Vec::new(),
            actor: Actor::System,
            destination: None,
            imported: None,
        };
        match s.create(req).unwrap() {
            crate::store::CreateOutcome::Created(l) | crate::store::CreateOutcome::Replayed(l) => {
                l.link.code
            }
            other => panic!("{other:?}"),
        }
    }

    const DAY: i64 = lasthop_core::day::DAY_MS;

    #[test]
    fn the_hot_set_is_recent_links_then_popular_ones_within_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let now = 100 * DAY;
        // Forty old links (created 30 days ago), then ten recent ones (one a day... ago).
        let old: Vec<String> = (0..40)
            .map(|i| create(&s, &format!("https://old.example/{i}"), now - 30 * DAY + i))
            .collect();
        let recent: Vec<String> = (0..10)
            .map(|i| create(&s, &format!("https://new.example/{i}"), now - DAY + i))
            .collect();
        // A recent link taken down: in, with an empty URL (410 at the edge).
        s.update_state(
            &recent[0],
            StateUpdate::Takedown {
                reason: "phishing".into(),
                warn: false,
            },
            &Actor::System,
        )
        .unwrap();
        let popular = vec![
            (old[7].clone(), 500),
            (recent[3].clone(), 90),
            (old[2].clone(), 40),
        ];
        let out = dir.path().join("hot.snap");
        let hot = HotSet {
            max_links: 12,
            max_bytes: 1 << 20,
            recent_days: 7,
            layout: Layout::Paged,
        };
        let (_, _, stats) = build_hot_snapshot(&s, 1, 1, 100, &out, &hot, &popular, now).unwrap();
        assert_eq!(
            (stats.recent, stats.popular, stats.full),
            (10, 2, false),
            "{stats:?}"
        );
        let snap = Snapshot::open(&out).unwrap();
        for code in &recent[1..] {
            assert!(snap.lookup(code.as_bytes()).is_some(), "recent {code}");
        }
        assert_eq!(
            snap.lookup(recent[0].as_bytes()).map(|e| e.url().len()),
            Some(0)
        );
        assert!(snap.lookup(old[7].as_bytes()).is_some(), "popular");
        assert!(snap.lookup(old[2].as_bytes()).is_some(), "popular");
        assert!(
            snap.lookup(old[5].as_bytes()).is_none(),
            "neither: the origin's"
        );

        // A tighter budget: the newest first, popular ones left out.
        let hot = HotSet {
            max_links: 4,
            ..hot
        };
        let (_, _, stats) = build_hot_snapshot(&s, 1, 1, 100, &out, &hot, &popular, now).unwrap();
        assert_eq!(
            (stats.recent, stats.popular, stats.full),
            (4, 0, true),
            "{stats:?}"
        );
        let snap = Snapshot::open(&out).unwrap();
        assert!(snap.lookup(recent[9].as_bytes()).is_some(), "the newest");
        assert!(snap.lookup(recent[1].as_bytes()).is_none());
        // Bytes bound it too.
        let hot = HotSet {
            max_links: 100,
            max_bytes: 3 * Layout::Paged.link_cost(7, 24),
            recent_days: 7,
            layout: Layout::Paged,
        };
        let (_, info, _) = build_hot_snapshot(&s, 1, 1, 100, &out, &hot, &popular, now).unwrap();
        assert_eq!(info.links, 3, "{info:?}");
        assert!(info.page_len > 64, "paged: {info:?}");
        // The compact layout: the same links and answers, pages of the bucket line alone,
        // and a budget that counts its smaller links (the same bytes take more of them).
        let compact = HotSet {
            layout: Layout::Compact,
            ..hot
        };
        let (_, info, _) =
            build_hot_snapshot(&s, 1, 1, 100, &out, &compact, &popular, now).unwrap();
        assert_eq!(info.page_len, 64, "{info:?}");
        assert!(info.links > 3, "{info:?}");
        let snap = Snapshot::open(&out).unwrap();
        assert!(snap.lookup(recent[9].as_bytes()).is_some(), "the newest");
    }

    /// Links with options of their own are in every snapshot (format version 4), with them;
    /// the hot set's budget counts their options entries' extra bytes.
    #[test]
    fn links_with_options_are_in_the_snapshot_with_them() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let now = 100 * DAY;
        let permanent = lasthop_core::LinkOptions {
            redirect_status: 301,
            cache_seconds: 86_400,
            ..Default::default()
        };
        let with = create_with(&s, "https://options.example/", now - DAY, permanent);
        let plain = create(&s, "https://plain.example/", now - DAY + 1);
        let popular_one = create_with(&s, "https://popular.example/", now - 30 * DAY, permanent);
        let out = dir.path().join("full.snap");
        let (_, info) = build_snapshot(&s, 1, 1, 100, &out, Layout::Compact).unwrap();
        assert_eq!((info.links, info.with_options), (3, 2), "{info:?}");
        let snap = Snapshot::open(&out).unwrap();
        snap.verify().unwrap();
        snap.audit().unwrap();
        assert_eq!(snap.format_version(), lasthop_snapshot::FORMAT_VERSION);
        assert_eq!(snap.lookup(with.as_bytes()).unwrap().options(), permanent);
        assert!(snap
            .lookup(plain.as_bytes())
            .unwrap()
            .options()
            .is_default());

        // The hot set: the recent ones, then the popular one, each with its options.
        let out = dir.path().join("hot.snap");
        let popular = vec![(popular_one.clone(), 10)];
        let (_, info, stats) =
            build_hot_snapshot(&s, 1, 1, 100, &out, &HotSet::default(), &popular, now).unwrap();
        assert_eq!((stats.recent, stats.popular), (2, 1), "{stats:?}");
        assert_eq!(info.with_options, 2, "{info:?}");
        let snap = Snapshot::open(&out).unwrap();
        snap.audit().unwrap();
        assert_eq!(snap.lookup(with.as_bytes()).unwrap().options(), permanent);
        assert_eq!(
            snap.lookup(popular_one.as_bytes()).unwrap().options(),
            permanent
        );
        assert!(snap
            .lookup(plain.as_bytes())
            .unwrap()
            .options()
            .is_default());
        // A budget of exactly the two recent links' cost: the link with options costs its
        // entry's 7 bytes more, so a budget that counted it as plain would take one too few.
        let cost = |url: &str, options: &lasthop_core::LinkOptions| {
            Layout::Compact.link_cost_with_options(with.len(), url.len(), options)
        };
        let exact = cost("https://options.example/", &permanent)
            + cost("https://plain.example/", &Default::default());
        assert_eq!(
            cost("https://options.example/", &permanent),
            Layout::Compact.link_cost(with.len(), "https://options.example/".len()) + 7
        );
        for (max_bytes, links) in [(exact, 2), (exact - 1, 1)] {
            let hot = HotSet {
                max_bytes,
                layout: Layout::Compact,
                ..HotSet::default()
            };
            let (_, info, _) =
                build_hot_snapshot(&s, 1, 1, 100, &out, &hot, &popular, now).unwrap();
            assert_eq!(info.links, links, "{max_bytes}: {info:?}");
        }
    }

    #[test]
    fn finding_the_recent_links_reads_the_log_tail_not_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path());
        let now = 100 * DAY;
        for i in 0..3_000 {
            create(&s, "https://old.example/", now - 60 * DAY + i);
        }
        for i in 0..5 {
            create(&s, "https://new.example/", now - DAY + i);
        }
        let out = dir.path().join("hot.snap");
        let (_, _, stats) =
            build_hot_snapshot(&s, 1, 1, 100, &out, &HotSet::default(), &[], now).unwrap();
        assert_eq!(stats.recent, 5);
        // A binary search (12 probes of at most 64 changes) and one page of margin, not 3,005.
        assert!(stats.changes_read < 1_000, "{stats:?}");
    }
}
