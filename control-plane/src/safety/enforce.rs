//! Changing many links at once: what a new list entry matches (the time-bomb defence), every
//! link on a host, every link of a suspended owner, and undoing a suspension's takedowns.
//!
//! Each walks an index page by page and commits each page as one [`Batch`] (one transaction,
//! one fsync, one feed burst), so taking down 100,000 links costs 200 commits rather than
//! 100,000, and a crash part-way leaves every committed page taken down. Automatic actors
//! (lists) skip pinned links inside the store's transaction; admins' actions do not.

use std::collections::HashMap;

use lasthop_trust::{host_of_key, url_key_hash, Added, CanonicalHost, Destination};

use crate::store::{
    suspension_set, Actor, Batch, BatchUpdate, OwnerRecord, StateUpdate, Store, StoreError, Verdict,
};

/// Codes per batch.
pub const PAGE: usize = 500;

/// Applies `update` by `actor` to every code in `codes`; returns how many changed.
fn apply(
    store: &dyn Store,
    codes: Vec<String>,
    update: &StateUpdate,
    actor: &Actor,
    mark_changed: Option<String>,
    unmark: Option<String>,
) -> Result<u64, StoreError> {
    let results = apply_results(store, codes, update, actor, mark_changed, unmark)?;
    Ok(results.iter().filter(|r| r.changed).count() as u64)
}

/// [`apply`], returning what each update did.
fn apply_results(
    store: &dyn Store,
    codes: Vec<String>,
    update: &StateUpdate,
    actor: &Actor,
    mark_changed: Option<String>,
    unmark: Option<String>,
) -> Result<Vec<crate::store::BatchResult>, StoreError> {
    if codes.is_empty() {
        return Ok(Vec::new());
    }
    let batch = Batch {
        updates: codes
            .into_iter()
            .map(|code| BatchUpdate {
                code,
                update: update.clone(),
            })
            .collect(),
        actor: actor.clone(),
        now_ms: crate::clock::now_ms(),
        mark_changed,
        unmark,
        positions: Vec::new(),
    };
    store.apply_batch(batch)
}

/// Applies `update` to every link whose destination is `host` or a subdomain; returns (links
/// seen, links changed).
pub fn update_host(
    store: &dyn Store,
    host: &CanonicalHost,
    update: &StateUpdate,
    actor: &Actor,
) -> Result<(u64, u64), StoreError> {
    let (mut seen, mut changed) = (0, 0);
    let mut after: Option<String> = None;
    loop {
        let page = store.codes_by_host(host, true, after.as_deref(), PAGE)?;
        seen += page.entries.len() as u64;
        let codes = page.entries.into_iter().map(|e| e.code).collect();
        changed += apply(store, codes, update, actor, None, None)?;
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok((seen, changed)),
        }
    }
}

/// A host's added URL entries: match-key hash → (match key, list).
type UrlEntries<'a> = HashMap<u64, Vec<(&'a str, &'a str)>>;

/// Takes down what the entries a list reload added match, as that list; returns the links
/// taken down. Host entries walk their host's (and subdomains') part of the destination index;
/// URL entries are grouped by host, so each host's part is walked once and compared by the
/// hash of the match key, reading only the links whose hash matches.
pub fn enforce_added(store: &dyn Store, added: &[Added]) -> Result<u64, StoreError> {
    let mut down = 0;
    let mut urls: HashMap<CanonicalHost, UrlEntries<'_>> = HashMap::new();
    for entry in added {
        match entry {
            Added::Host { host, list } => {
                let update = list_verdict(list);
                let (_, changed) = update_host(store, host, &update, &Actor::List(list.clone()))?;
                if changed > 0 {
                    tracing::warn!(list, host = %host, links = changed, "list entry: took down existing links");
                }
                down += changed;
            }
            Added::Url { key, list } => {
                if let Some(host) = host_of_key(key) {
                    urls.entry(host)
                        .or_default()
                        .entry(url_key_hash(key))
                        .or_default()
                        .push((key.as_str(), list.as_str()));
                }
            }
        }
    }
    for (host, wanted) in urls {
        let mut by_list: HashMap<&str, Vec<String>> = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let page = store.codes_by_host(&host, false, after.as_deref(), PAGE)?;
            for e in page.entries {
                let Some(candidates) = wanted.get(&e.url_hash) else {
                    continue;
                };
                // The index holds a hash: compare the real key.
                let Some(s) = store.get(&e.code)? else {
                    continue;
                };
                let Some(dest) = Destination::parse(s.state.url(&s.link)) else {
                    continue;
                };
                if let Some((_, list)) = candidates.iter().find(|(k, _)| *k == dest.url_key) {
                    by_list.entry(list).or_default().push(e.code);
                }
            }
            match page.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        for (list, codes) in by_list {
            let changed = apply(
                store,
                codes,
                &list_verdict(list),
                &Actor::List(list.to_string()),
                None,
                None,
            )?;
            if changed > 0 {
                tracing::warn!(list, host = %host, links = changed, "list URL entries: took down existing links");
            }
            down += changed;
        }
    }
    Ok(down)
}

/// Takes down, as each list's verdict, those of `links` a loaded list matches; returns how
/// many changed.
fn takedown_listed<'a>(
    store: &dyn Store,
    lists: &super::ListSet,
    links: impl Iterator<Item = &'a crate::store::StoredLink>,
) -> Result<u64, StoreError> {
    let mut by_list: Vec<(String, Vec<String>)> = Vec::new();
    for s in links {
        let link = &s.link;
        let Some(hit) = Destination::parse(s.state.url(link)).and_then(|d| lists.check(&d)) else {
            continue;
        };
        match by_list.iter_mut().find(|(l, _)| *l == hit.list) {
            Some((_, codes)) => codes.push(link.code.clone()),
            None => by_list.push((hit.list, vec![link.code.clone()])),
        }
    }
    let mut down = 0;
    for (list, codes) in by_list {
        let changed = apply(
            store,
            codes,
            &list_verdict(&list),
            &Actor::List(list.clone()),
            None,
            None,
        )?;
        if changed > 0 {
            tracing::warn!(
                list,
                links = changed,
                "took down existing links the list matches"
            );
        }
        down += changed;
    }
    Ok(down)
}

/// Takes down every live link some loaded list matches, walking the store: at start, when the
/// store holds fewer links than the lists hold entries, cheaper than looking every entry up.
/// Returns the links taken down.
pub fn sweep_links(
    store: &dyn Store,
    lists: &super::ListSet,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<u64, StoreError> {
    let mut down = 0;
    let mut after: Option<String> = None;
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(down);
        }
        let (links, next) = store.scan_links(after.as_deref(), PAGE)?;
        down += takedown_listed(
            store,
            lists,
            links
                .iter()
                .filter(|s| !s.state.deleted && s.state.takedown_reason.is_none()),
        )?;
        match next {
            Some(n) => after = Some(n),
            None => return Ok(down),
        }
    }
}

fn list_verdict(list: &str) -> StateUpdate {
    StateUpdate::Verdict {
        verdict: Verdict::Block,
        reason: format!("list:{list}"),
    }
}

/// The takedown reason a suspension's links carry.
pub fn suspension_reason(reason: &str) -> String {
    format!("account suspended: {reason}")
}

/// Applies `update` to every link `owner` ever created (through the owner index) whose state
/// `wanted` picks, marking the ones it changed in `mark`; returns how many changed.
fn update_owner_links(
    store: &dyn Store,
    owner: &str,
    wanted: impl Fn(&lasthop_core::LinkState) -> bool,
    update: &StateUpdate,
    actor: &Actor,
    mark: Option<String>,
) -> Result<u64, StoreError> {
    let mut changed = 0;
    let mut cursor: Option<String> = None;
    loop {
        let page = store.list(owner, cursor.as_deref(), PAGE)?;
        let codes = page
            .links
            .iter()
            .filter(|s| wanted(&s.state))
            .map(|s| s.link.code.clone())
            .collect();
        changed += apply(store, codes, update, actor, mark.clone(), None)?;
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(changed),
        }
    }
}

/// Takes down every live link `owner` ever created with `takedown_reason`, remembering which
/// ones this changed; returns how many. Safe to run again (an interrupted suspension is
/// finished so): links already down stay as they are.
pub fn takedown_owner(
    store: &dyn Store,
    owner: &str,
    takedown_reason: &str,
    actor: &Actor,
) -> Result<u64, StoreError> {
    let update = StateUpdate::Suspend {
        reason: takedown_reason.to_string(),
    };
    update_owner_links(
        store,
        owner,
        |s| !s.deleted && s.takedown_reason.is_none(),
        &update,
        actor,
        Some(suspension_set(owner)),
    )
}

/// Lifts the takedowns `owner`'s suspension made (those still carrying `takedown_reason`:
/// a link taken down again since, for another reason, stays down), then checks the links it
/// brought back against the lists (one listed meanwhile goes down again, as the list); returns
/// how many came back. Besides the links this region's suspension took down (its code set),
/// every link of the owner still carrying `takedown_reason` is lifted: one another region's
/// copy of the suspension took down and replicated here, which this region, its home, must
/// lift for the lifting to reach every region.
pub fn restore_owner(
    store: &dyn Store,
    owner: &str,
    takedown_reason: &str,
    actor: &Actor,
    lists: &super::ListSet,
) -> Result<u64, StoreError> {
    let update = StateUpdate::Lift {
        reason: takedown_reason.to_string(),
    };
    let set = suspension_set(owner);
    let mut restored = 0;
    loop {
        // Each batch removes its codes from the set, so the walk always starts at the front.
        let page = store.code_set(&set, None, PAGE)?;
        if page.codes.is_empty() {
            break;
        }
        let results = apply_results(store, page.codes, &update, actor, None, Some(set.clone()))?;
        restored += recheck_lists(store, results, lists)?;
    }
    let mut cursor: Option<String> = None;
    loop {
        let page = store.list(owner, cursor.as_deref(), PAGE)?;
        let codes: Vec<String> = page
            .links
            .iter()
            .filter(|s| s.state.takedown_reason.as_deref() == Some(takedown_reason))
            .map(|s| s.link.code.clone())
            .collect();
        if !codes.is_empty() {
            let results = apply_results(store, codes, &update, actor, None, None)?;
            restored += recheck_lists(store, results, lists)?;
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(restored),
        }
    }
}

/// Counts the links a lifting brought back, and takes down again (as the list) those a list
/// matches meanwhile.
fn recheck_lists(
    store: &dyn Store,
    results: Vec<crate::store::BatchResult>,
    lists: &super::ListSet,
) -> Result<u64, StoreError> {
    let back: Vec<_> = results.into_iter().filter(|r| r.changed).collect();
    takedown_listed(store, lists, back.iter().filter_map(|r| r.link.as_ref()))?;
    Ok(back.len() as u64)
}

/// Makes this region's record of `theirs.owner` follow another region's (`region`) when that
/// one's latest suspension or unsuspension is newer than ours: a suspension is copied (with
/// its takedown of every link the owner has here), an unsuspension lifts ours. What it did:
/// `Some("suspended")`, `Some("unsuspended")`, or `None` when ours is as new.
pub fn copy_suspension(
    safety: &super::Safety,
    theirs: &OwnerRecord,
    region: u32,
) -> Result<Option<&'static str>, StoreError> {
    let Some(when) = theirs.suspension_event_ms() else {
        return Ok(None);
    };
    let actor = Actor::Region(region);
    let store = safety.store().as_ref();
    match &theirs.suspended {
        Some(suspension) => {
            let newer = safety.update_owner(&theirs.owner, |ours| {
                let newer = ours.suspension_event_ms().is_none_or(|o| o < when);
                if newer {
                    ours.suspended = Some(suspension.clone());
                    ours.unsuspended_at_ms = theirs.unsuspended_at_ms;
                }
                newer
            })?;
            if !newer {
                return Ok(None);
            }
            if suspension.takedown_links {
                takedown_owner(store, &theirs.owner, &suspension.takedown_reason, &actor)?;
            }
            Ok(Some("suspended"))
        }
        None => {
            let ours = safety.store().owner(&theirs.owner)?.unwrap_or_default();
            if ours.suspension_event_ms().is_some_and(|o| o >= when) {
                return Ok(None);
            }
            // The links first, then the record: a failure part-way is finished next time.
            if let Some(s) = &ours.suspended {
                restore_owner(
                    store,
                    &theirs.owner,
                    &s.takedown_reason,
                    &actor,
                    safety.lists(),
                )?;
            }
            safety.update_owner(&theirs.owner, |ours| {
                if ours.suspension_event_ms().is_none_or(|o| o < when) {
                    ours.suspended = None;
                    ours.unsuspended_at_ms = Some(when);
                }
            })?;
            Ok(Some("unsuspended"))
        }
    }
}

/// Releases every link of `owner` held for `hold`; returns how many.
pub fn release_owner(
    store: &dyn Store,
    owner: &str,
    hold: lasthop_core::Hold,
    actor: &Actor,
) -> Result<u64, StoreError> {
    update_owner_links(
        store,
        owner,
        |s| s.held == Some(hold),
        &StateUpdate::Release { hold },
        actor,
        None,
    )
}

/// The list watcher's thread: at start, matches every loaded list against the store by the
/// shorter walk (the store's links, or the lists' entries) and finishes the takedowns of any
/// suspension a crash interrupted; then, every `poll` (or at once when `reloads` says so,
/// SIGHUP), re-reads changed lists and takes down what their new entries match. Takedowns that
/// fail (the store was unavailable) are kept and tried again at the next poll.
pub fn watch_lists(
    safety: &super::Safety,
    reloads: &std::sync::mpsc::Receiver<()>,
    poll: std::time::Duration,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    use std::sync::mpsc::RecvTimeoutError;
    let store = safety.store().as_ref();
    let counted = |n: u64| {
        safety
            .metrics()
            .safety_actions
            .with_label_values(&["list"])
            .inc_by(n)
    };
    let mut retry: Vec<Vec<Added>> = Vec::new();
    let enforce_all = |batches: Vec<Vec<Added>>, retry: &mut Vec<Vec<Added>>| {
        for added in batches {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match enforce_added(store, &added) {
                Ok(n) => counted(n),
                Err(e) => {
                    tracing::error!(error = %e, entries = added.len(), "list takedowns failed; retrying at the next poll");
                    retry.push(added);
                }
            }
        }
    };

    let lists = safety.lists().lists();
    let entries: usize = lists.iter().map(|l| l.index.len()).sum();
    let links = store.count_links().unwrap_or(u64::MAX);
    if entries > 0 && links <= entries as u64 {
        match sweep_links(store, safety.lists(), stop) {
            Ok(n) => counted(n),
            Err(e) => {
                tracing::error!(error = %e, "list sweep at start failed; the re-scan will catch up")
            }
        }
    } else if entries > 0 {
        let empty = lasthop_trust::ReputationIndex::build(std::iter::empty());
        for list in lists.iter() {
            enforce_all(vec![list.index.added(&empty)], &mut retry);
        }
    }
    drop(lists);
    for record in safety.owner_records() {
        if let Some(s) = record.suspended.filter(|s| s.takedown_links) {
            let actor = Actor::Key(s.by.clone());
            match takedown_owner(store, &record.owner, &s.takedown_reason, &actor) {
                Ok(0) => {}
                Ok(n) => {
                    tracing::warn!(owner = %record.owner, links = n, "finished an interrupted suspension's takedowns")
                }
                Err(e) => {
                    tracing::error!(error = %e, owner = %record.owner, "finishing a suspension's takedowns")
                }
            }
        }
    }
    while !stop.load(Ordering::Relaxed) {
        let forced = match reloads.recv_timeout(poll) {
            Ok(()) => true,
            Err(RecvTimeoutError::Timeout) => false,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let mut batches = std::mem::take(&mut retry);
        batches.extend(safety.lists().reload(forced));
        enforce_all(batches, &mut retry);
    }
}
