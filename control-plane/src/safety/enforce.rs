//! Changing many links at once: what a new list entry matches (the time-bomb defence), every
//! link on a host, every link of a suspended owner, and undoing a suspension's takedowns.
//!
//! Each walks an index page by page and commits each page as one [`Batch`] (one transaction,
//! one fsync, one feed burst), so taking down 100,000 links costs 200 commits rather than
//! 100,000, and a crash part-way leaves every committed page taken down. Automatic actors
//! (lists) skip pinned links inside the store's transaction; admins' actions do not.

use std::sync::Arc;

use lasthop_trust::{Added, CanonicalHost, Destination};

use crate::store::{
    suspension_set, Actor, Batch, BatchUpdate, StateUpdate, Store, StoreError, Verdict,
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
    if codes.is_empty() {
        return Ok(0);
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
    };
    let results = store.apply_batch(batch)?;
    Ok(results.iter().filter(|r| r.changed).count() as u64)
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
        let page = store.codes_by_host(host, after.as_deref(), PAGE)?;
        seen += page.codes.len() as u64;
        changed += apply(store, page.codes, update, actor, None, None)?;
        match page.next {
            Some(next) => after = Some(next),
            None => return Ok((seen, changed)),
        }
    }
}

/// Takes down what the entries a list reload added match, as that list; returns the links
/// taken down.
pub fn enforce_added(store: &dyn Store, added: &[Added]) -> Result<u64, StoreError> {
    let mut down = 0;
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
                let candidates = store.codes_by_url(lasthop_trust::url_key_hash(key))?;
                let mut matching = Vec::new();
                for code in candidates {
                    // The index holds a hash: compare the real key.
                    let Some(s) = store.get(&code)? else { continue };
                    if Destination::parse(&s.link.long_url).is_some_and(|d| &d.url_key == key) {
                        matching.push(code);
                    }
                }
                let update = list_verdict(list);
                let changed = apply(
                    store,
                    matching,
                    &update,
                    &Actor::List(list.clone()),
                    None,
                    None,
                )?;
                if changed > 0 {
                    tracing::warn!(list, url_key = %key, links = changed, "list entry: took down existing links");
                }
                down += changed;
            }
        }
    }
    Ok(down)
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

/// Takes down every link `owner` ever created (through the owner index) with
/// `takedown_reason`, remembering which ones this changed; returns how many.
pub fn takedown_owner(
    store: &dyn Store,
    owner: &str,
    takedown_reason: &str,
    actor: &Actor,
) -> Result<u64, StoreError> {
    let update = StateUpdate::Takedown {
        reason: takedown_reason.to_string(),
        warn: false,
    };
    let set = suspension_set(owner);
    let mut changed = 0;
    let mut cursor: Option<String> = None;
    loop {
        let page = store.list(owner, cursor.as_deref(), PAGE)?;
        let codes = page
            .links
            .iter()
            .filter(|s| !s.state.deleted && s.state.takedown_reason.is_none())
            .map(|s| s.link.code.clone())
            .collect();
        changed += apply(store, codes, &update, actor, Some(set.clone()), None)?;
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(changed),
        }
    }
}

/// Lifts the takedowns `owner`'s suspension made (those still carrying `takedown_reason`:
/// a link taken down again since, for another reason, stays down); returns how many.
pub fn restore_owner(
    store: &dyn Store,
    owner: &str,
    takedown_reason: &str,
    actor: &Actor,
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
            return Ok(restored);
        }
        restored += apply(store, page.codes, &update, actor, None, Some(set.clone()))?;
    }
}

/// Releases every link of `owner` held for `hold`; returns how many.
pub fn release_owner(
    store: &Arc<dyn Store>,
    owner: &str,
    hold: lasthop_core::Hold,
    actor: &Actor,
) -> Result<u64, StoreError> {
    let update = StateUpdate::Release { hold };
    let mut released = 0;
    let mut cursor: Option<String> = None;
    loop {
        let page = store.list(owner, cursor.as_deref(), PAGE)?;
        let codes = page
            .links
            .iter()
            .filter(|s| s.state.held == Some(hold))
            .map(|s| s.link.code.clone())
            .collect();
        released += apply(store.as_ref(), codes, &update, actor, None, None)?;
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(released),
        }
    }
}
