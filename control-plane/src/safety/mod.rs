//! Trust and safety in the control plane (README "Trust and safety"; the rules themselves are
//! the pure `lasthop-trust` crate):
//!
//! - [`lists`]: reputation list files, their reloads and metrics;
//! - [`enforce`]: takedowns of many links at once (a new list entry's matches, a host, an
//!   owner's suspension and its undoing), in batches through the store and so the feed;
//! - [`scanner`]: the first scan of every new link after its 201, the scheduled re-scan of
//!   every live one, the verdict webhook;
//! - [`Safety`]: what the API consults on every create (lists, chained shorteners, velocity,
//!   holds) and on every call (suspended owners).
//!
//! Everything that changes what an edge answers is an ordinary state change in the store, so
//! it reaches every engine through the change log and the feed like an operator's takedown.

pub mod enforce;
pub mod lists;
pub mod scanner;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use lasthop_core::Hold;
use lasthop_trust::shorteners::{ShortDomain, Shorteners};
use lasthop_trust::velocity::Velocity;
use lasthop_trust::Destination;
use url::Url;

use crate::metrics::Metrics;
use crate::store::{OwnerFlag, OwnerRecord, Store, StoreError};

pub use lists::{ListError, ListHit, ListSet};

/// Settings of the create-time checks.
#[derive(Debug, Clone)]
pub struct SafetyConfig {
    /// `--allow-shortener-chains`: accept destinations on shortener domains and our own.
    pub allow_shortener_chains: bool,
    /// Extra shortener domains (`--shortener-list`), in the shipped list's format.
    pub extra_shorteners: Option<String>,
    /// The short base URL, whose host is our own short domain.
    pub short_base: String,
    /// `--hold-unverified`: new links answer the interstitial until their first verdict.
    pub hold_unverified: bool,
    /// `--velocity-domains-per-hour` (0: off).
    pub velocity_domains_per_hour: usize,
    /// Whether a scanner runs (new links are queued for it).
    pub scan: bool,
    /// `--no-edits`: destination edits are refused fleet-wide (409 `edits_disabled`).
    pub no_edits: bool,
}

impl Default for SafetyConfig {
    fn default() -> Self {
        SafetyConfig {
            allow_shortener_chains: false,
            extra_shorteners: None,
            short_base: "http://127.0.0.1:8080".into(),
            hold_unverified: false,
            velocity_domains_per_hour: 500,
            scan: false,
            no_edits: false,
        }
    }
}

/// Why a create is refused with `destination_blocked`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A reputation list lists the destination.
    List(String),
    /// Another shortener, or our own short domain.
    ShortenerChain,
}

impl Refusal {
    /// The error body's `reason`.
    pub fn reason(&self) -> String {
        match self {
            Refusal::List(name) => format!("list:{name}"),
            Refusal::ShortenerChain => "shortener_chain".to_string(),
        }
    }
}

/// The trust-and-safety state the API shares with the background threads.
pub struct Safety {
    store: Arc<dyn Store>,
    lists: ListSet,
    shorteners: Shorteners,
    short_domain: Option<ShortDomain>,
    config: SafetyConfig,
    velocity: Mutex<Velocity>,
    /// Every owner with a trust record (flagged or suspended), from the store.
    owners: RwLock<HashMap<String, OwnerRecord>>,
    /// Held while an owner's record is read, changed and written ([`Safety::update_owner`]).
    owner_writes: Mutex<()>,
    /// Wakes the scanner when a new link is queued.
    scan_wake: Mutex<Option<std::sync::mpsc::Sender<()>>>,
    metrics: Metrics,
}

impl std::fmt::Debug for Safety {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Safety")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Safety {
    /// Loads the owners' records from `store`.
    pub fn new(
        store: Arc<dyn Store>,
        lists: ListSet,
        config: SafetyConfig,
        metrics: Metrics,
    ) -> Result<Safety, StoreError> {
        let owners = store.owners()?;
        Ok(Safety::build(store, lists, config, metrics, owners))
    }

    fn build(
        store: Arc<dyn Store>,
        lists: ListSet,
        config: SafetyConfig,
        metrics: Metrics,
        owners: Vec<OwnerRecord>,
    ) -> Safety {
        let mut shorteners = Shorteners::shipped();
        if let Some(extra) = &config.extra_shorteners {
            for line in shorteners.add_text(extra) {
                tracing::warn!(line, "skipping a malformed line of the shortener list");
            }
        }
        let owners = owners
            .into_iter()
            .filter(acting)
            .map(|r| (r.owner.clone(), r))
            .collect();
        let safety = Safety {
            store,
            lists,
            shorteners,
            short_domain: ShortDomain::from_base(&config.short_base),
            velocity: Mutex::new(Velocity::new(config.velocity_domains_per_hour)),
            config,
            owners: RwLock::new(owners),
            owner_writes: Mutex::new(()),
            scan_wake: Mutex::new(None),
            metrics,
        };
        safety.export_owners();
        safety
    }

    /// No lists, defaults otherwise (tests, tools); a store that cannot list its owners'
    /// records is logged and none are known.
    pub fn with_defaults(store: Arc<dyn Store>, metrics: Metrics) -> Safety {
        let owners = store.owners().unwrap_or_else(|e| {
            tracing::error!(error = %e, "reading owners' trust records");
            Vec::new()
        });
        let lists = ListSet::empty(metrics.clone());
        Safety::build(store, lists, SafetyConfig::default(), metrics, owners)
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The reputation lists.
    pub fn lists(&self) -> &ListSet {
        &self.lists
    }

    /// The settings.
    pub fn config(&self) -> &SafetyConfig {
        &self.config
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The reputation lists' verdict on a raw destination (any URL the WHATWG parser takes,
    /// credentials and private hosts included: a listed host is refused as listed, whatever
    /// else is wrong with the URL).
    pub fn listed(&self, raw: &str) -> Option<ListHit> {
        let dest = Destination::parse(raw)?;
        self.lists.check(&dest)
    }

    /// Create-time check of a normalised destination (`dest` is `url`'s): lists, then chained
    /// shorteners.
    pub fn check_destination(&self, url: &Url, dest: &Destination) -> Result<(), Refusal> {
        if let Some(hit) = self.lists.check(dest) {
            return Err(Refusal::List(hit.list));
        }
        if !self.config.allow_shortener_chains {
            let ours = self
                .short_domain
                .as_ref()
                .is_some_and(|d| d.covers(url, &dest.host));
            if ours || self.shorteners.contains(&dest.host) {
                return Err(Refusal::ShortenerChain);
            }
        }
        Ok(())
    }

    /// Counts a refusal.
    pub fn count_refusal(&self, refusal: &Refusal) {
        self.metrics
            .creates_blocked
            .with_label_values(&[refusal.reason().as_str()])
            .inc();
    }

    /// Whether new links are queued for the scanner.
    pub fn scans(&self) -> bool {
        self.config.scan
    }

    /// The hold a new link by `owner` to `url` is created with: `Velocity` while the owner is
    /// flagged, or once this create takes it past the limit (which flags it, durably);
    /// `Unverified` with `--hold-unverified`. Blocks on the store when it flags an owner.
    pub fn hold_for(
        &self,
        owner: &str,
        dest: &Destination,
        now_ms: i64,
    ) -> Result<Option<Hold>, StoreError> {
        let domains = match self.velocity.lock() {
            Ok(mut v) => v.observe(owner, &dest.host.velocity_key(), now_ms),
            Err(_) => 0,
        };
        if self.flagged(owner) {
            return Ok(Some(Hold::Velocity));
        }
        let limit = self.config.velocity_domains_per_hour;
        if limit > 0 && domains > limit {
            let flagged_now = self.update_owner(owner, |record| {
                if record.flagged.is_some() {
                    return false;
                }
                record.flagged = Some(OwnerFlag {
                    at_ms: now_ms,
                    reason: format!(
                        "{domains} distinct destination domains in an hour (limit {limit})"
                    ),
                    domains_last_hour: domains as u64,
                    limit: limit as u64,
                });
                true
            })?;
            if flagged_now {
                tracing::warn!(
                    owner,
                    domains,
                    limit,
                    "creation velocity: owner flagged; new links are held"
                );
            }
            return Ok(Some(Hold::Velocity));
        }
        Ok(self.config.hold_unverified.then_some(Hold::Unverified))
    }

    /// Distinct destination domains `owner` used in the last hour (in this process).
    pub fn domains_last_hour(&self, owner: &str, now_ms: i64) -> usize {
        self.velocity
            .lock()
            .map(|mut v| v.current(owner, now_ms))
            .unwrap_or(0)
    }

    /// Starts `owner`'s velocity window afresh.
    pub fn forget_velocity(&self, owner: &str) {
        if let Ok(mut v) = self.velocity.lock() {
            v.forget(owner);
        }
    }

    /// Counts a held create.
    pub fn count_hold(&self, hold: Hold) {
        self.metrics
            .creates_held
            .with_label_values(&[hold.as_str()])
            .inc();
    }

    fn flagged(&self, owner: &str) -> bool {
        self.owners
            .read()
            .is_ok_and(|o| o.get(owner).is_some_and(|r| r.flagged.is_some()))
    }

    /// Whether `owner`'s keys are suspended.
    pub fn suspended(&self, owner: &str) -> bool {
        self.owners
            .read()
            .is_ok_and(|o| o.get(owner).is_some_and(|r| r.suspended.is_some()))
    }

    /// `owner`'s trust record, if any.
    pub fn owner_record(&self, owner: &str) -> Option<OwnerRecord> {
        self.owners.read().ok()?.get(owner).cloned()
    }

    /// Every owner's trust record, by name.
    pub fn owner_records(&self) -> Vec<OwnerRecord> {
        let mut all: Vec<_> = self
            .owners
            .read()
            .map(|o| o.values().cloned().collect())
            .unwrap_or_default();
        all.sort_by(|a, b| a.owner.cmp(&b.owner));
        all
    }

    /// Changes `owner`'s trust record with `change` (given the current record, or an empty one)
    /// and, if it changed, writes it durably and then into the cache the API checks. One change
    /// at a time: a velocity flag and a suspension arriving together both land. Blocks.
    pub fn update_owner<T>(
        &self,
        owner: &str,
        change: impl FnOnce(&mut OwnerRecord) -> T,
    ) -> Result<T, StoreError> {
        let _one_at_a_time = self
            .owner_writes
            .lock()
            .map_err(|_| StoreError::NotApplied("owner updates poisoned by a panic"))?;
        // The stored record, not the cache: another control plane on a shared store may have
        // changed it since.
        let before = self.store.owner(owner)?.unwrap_or(OwnerRecord {
            owner: owner.to_string(),
            ..OwnerRecord::default()
        });
        let mut record = before.clone();
        let out = change(&mut record);
        if record != before {
            self.store.put_owner(record.clone())?;
            if let Ok(mut owners) = self.owners.write() {
                if !acting(&record) {
                    owners.remove(&record.owner);
                } else {
                    owners.insert(record.owner.clone(), record);
                }
            }
            self.export_owners();
        }
        Ok(out)
    }

    /// Reloads every owner's record from the store (another control plane on a shared store
    /// changed one: [`crate::store::News::Owners`]). Blocks.
    pub fn reload_owners(&self) -> Result<(), StoreError> {
        let fresh: HashMap<String, OwnerRecord> = self
            .store
            .owners()?
            .into_iter()
            .filter(acting)
            .map(|r| (r.owner.clone(), r))
            .collect();
        if let Ok(mut owners) = self.owners.write() {
            *owners = fresh;
        }
        self.export_owners();
        Ok(())
    }

    fn export_owners(&self) {
        if let Ok(owners) = self.owners.read() {
            let flagged = owners.values().filter(|r| r.flagged.is_some()).count();
            let suspended = owners.values().filter(|r| r.suspended.is_some()).count();
            self.metrics
                .owners_flagged
                .set(i64::try_from(flagged).unwrap_or(i64::MAX));
            self.metrics
                .owners_suspended
                .set(i64::try_from(suspended).unwrap_or(i64::MAX));
        }
    }

    /// Where the scanner listens for new links.
    pub fn set_scan_wake(&self, wake: std::sync::mpsc::Sender<()>) {
        if let Ok(mut w) = self.scan_wake.lock() {
            *w = Some(wake);
        }
    }

    /// Tells the scanner a new link is queued.
    pub fn wake_scanner(&self) {
        if let Ok(w) = self.scan_wake.lock() {
            if let Some(w) = w.as_ref() {
                let _ = w.send(());
            }
        }
    }
}

/// Whether an owner's record says something the API acts on (a flag, a suspension), rather
/// than only when a suspension was lifted.
fn acting(record: &OwnerRecord) -> bool {
    record.flagged.is_some() || record.suspended.is_some()
}
