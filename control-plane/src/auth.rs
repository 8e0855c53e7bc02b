//! API keys.
//!
//! Keys are `lh_` + 32 hex characters (128 random bits), shown once at creation and stored only
//! as SHA-256 in `DATA_DIR/api-keys`, beside a public id (`lhk_` + 16 hex characters) that
//! names the key everywhere else: the audit trail, `apikey list`, the admin API, revocation.
//! The file is append-only, one record a line:
//!
//! - `hash<TAB>owner<TAB>role<TAB>created<TAB>id`: a key (lines written before ids existed have
//!   four fields; their id is `lhk_` + the first 16 hex digits of the hash, which says nothing
//!   about the secret);
//! - `revoke<TAB>id<TAB>when`: the key with that id no longer authenticates.
//!
//! The file is separate from the store so `apikey create` and `apikey revoke` work while the
//! server runs (the store file is locked by its one writer); each line is one `write` to a file
//! opened for appending, so the CLI and the server can both append. The server checks the
//! file's size and mtime on every authentication (one `stat`) and re-reads it when it changed,
//! so a revoked key fails on its very next request. A lost key is replaced, never recovered.
//!
//! With the PostgreSQL store the keys live in the store instead (the `api_keys` table), so
//! every control plane on the database shares them: [`ApiKeys::from_store`] caches them, looks
//! a key it has not seen up in the store (a new key works on its first request anywhere) and
//! drops the cache when a `NOTIFY` says keys changed (a revocation reaches every control plane
//! in the time a notification takes, milliseconds; the control plane that revokes sees it at
//! once). `apikey create|list|revoke --store postgres://…` write the same table.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub owner: String,
    pub admin: bool,
    /// The public id of the key used (`lhk_…`).
    pub key_id: String,
    /// The domains the key may act on (`apikey create --domain D`); empty: every domain.
    pub domains: Vec<String>,
}

/// Why a presented key does not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No such key.
    Unknown,
    /// The key was revoked.
    Revoked,
    /// The store that holds the keys cannot be reached (answer 503 and retry).
    Unavailable,
}

/// Why the keys could not be read or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeysError {
    /// Appending to the keys file (or creating its directory) failed.
    #[error(transparent)]
    File(#[from] std::io::Error),
    /// The system's random source failed. (getrandom 0.2 without its `std` feature does not
    /// implement [`std::error::Error`], so the cause is only in the message.)
    #[error("random: {0}")]
    Random(getrandom::Error),
    /// The owner of a new key is not a valid owner ([`valid_owner`]).
    #[error("owner must be 1-64 characters of A-Z a-z 0-9 . _ @ -")]
    InvalidOwner,
    /// A `--domain` that is no domain name.
    #[error("{0:?} is not a domain name (lower case, as the domain was added)")]
    InvalidDomain(String),
    /// `--admin` with `--domain`: admin calls are fleet-wide.
    #[error("an admin key cannot be limited to domains (admin calls are fleet-wide)")]
    AdminWithDomains,
    /// The shared store's `api_keys` table failed.
    #[error("the key store: {0}")]
    Store(crate::store::StoreError),
    /// [`ApiKeys::from_store`] of a store that keeps no keys.
    #[error("this store does not keep API keys")]
    NotKept,
    /// A thread panicked while holding the keys file's cache.
    #[error("the keys cache is poisoned")]
    Poisoned,
}

/// A key as `apikey list` and `GET /v1/admin/apikeys` show it: never the secret or its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    pub id: String,
    pub owner: String,
    pub admin: bool,
    pub created_at: String,
    /// The domains it may act on; empty (and absent): every domain.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub domains: Vec<String>,
    pub revoked: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// A key just made: the secret (shown once) and its public id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedKey {
    pub key: String,
    pub id: String,
}

/// The file name beside the store.
pub const KEYS_FILE: &str = "api-keys";
const REVOKE: &str = "revoke";

pub use crate::store::keys::{valid_key_id, valid_owner, KeyRecord, KeyStore};

fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn append_line(data_dir: &Path, line: &str) -> Result<(), KeysError> {
    std::fs::create_dir_all(data_dir)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join(KEYS_FILE))?;
    file.write_all(line.as_bytes())?;
    file.sync_all()?;
    Ok(())
}

fn random_hex(bytes: usize) -> Result<String, KeysError> {
    let mut raw = vec![0u8; bytes];
    getrandom::getrandom(&mut raw).map_err(KeysError::Random)?;
    Ok(hex::encode(raw))
}

/// A fresh key for `owner`: the secret (shown once) and the record that stores its hash.
fn new_key(
    owner: &str,
    admin: bool,
    domains: &[String],
) -> Result<(CreatedKey, KeyRecord), KeysError> {
    if !valid_owner(owner) {
        return Err(KeysError::InvalidOwner);
    }
    if let Some(bad) = domains
        .iter()
        .find(|d| !lasthop_core::code::domain_shape(d.as_bytes()))
    {
        return Err(KeysError::InvalidDomain(bad.clone()));
    }
    // An admin key acts fleet-wide (reports, owners, keys, suspensions): no domain limit
    // could hold it.
    if admin && !domains.is_empty() {
        return Err(KeysError::AdminWithDomains);
    }
    let key = format!("lh_{}", random_hex(16)?);
    let id = format!("lhk_{}", random_hex(8)?);
    let record = KeyRecord {
        hash: hash_key(&key),
        id: id.clone(),
        owner: owner.to_string(),
        admin,
        created_at: crate::clock::rfc3339(crate::clock::now_ms()),
        revoked_at: None,
        domains: domains.to_vec(),
    };
    Ok((CreatedKey { key, id }, record))
}

/// Appends a new key for `owner` to the keys file and returns it (the secret is shown once).
pub fn create_key(data_dir: &Path, owner: &str, admin: bool) -> Result<CreatedKey, KeysError> {
    create_key_for(data_dir, owner, admin, &[])
}

/// [`create_key`] limited to `domains` (empty: every domain).
pub fn create_key_for(
    data_dir: &Path,
    owner: &str,
    admin: bool,
    domains: &[String],
) -> Result<CreatedKey, KeysError> {
    let (created, record) = new_key(owner, admin, domains)?;
    append_line(data_dir, &key_line(&record))?;
    Ok(created)
}

/// A key's line in the keys file: hash, owner, role, created, id, then its domains
/// (comma-separated) when it is limited to some.
fn key_line(k: &KeyRecord) -> String {
    let mut line = format!(
        "{}\t{}\t{}\t{}\t{}",
        hex::encode(k.hash),
        k.owner,
        if k.admin { "admin" } else { "user" },
        k.created_at,
        k.id
    );
    if !k.domains.is_empty() {
        line.push('\t');
        line.push_str(&crate::store::keys::domains_text(&k.domains));
    }
    line.push('\n');
    line
}

/// Adds keys from an export to the keys file in `data_dir` (with their revocations), skipping
/// any whose hash is there already; how many were added.
pub fn import_keys(data_dir: &Path, keys: &[KeyRecord]) -> Result<usize, KeysError> {
    let present: std::collections::HashSet<[u8; 32]> = ApiKeys::open(data_dir)
        .records()?
        .iter()
        .map(|k| k.hash)
        .collect();
    let mut text = String::new();
    let mut added = 0;
    for k in keys.iter().filter(|k| !present.contains(&k.hash)) {
        text.push_str(&key_line(k));
        if let Some(at) = &k.revoked_at {
            text.push_str(&format!("{REVOKE}\t{}\t{at}\n", k.id));
        }
        added += 1;
    }
    if added > 0 {
        append_line(data_dir, &text)?;
    }
    Ok(added)
}

/// Appends a revocation of key `id`; false if no such key exists (or it was revoked before).
pub fn revoke_key(data_dir: &Path, id: &str) -> Result<bool, KeysError> {
    let keys = ApiKeys::open(data_dir);
    keys.revoke(id)
}

#[derive(Debug, Clone)]
struct Entry {
    principal: Principal,
    created_at: String,
    revoked_at: Option<String>,
}

impl Entry {
    fn from_record(r: KeyRecord) -> Entry {
        Entry {
            principal: Principal {
                owner: r.owner,
                admin: r.admin,
                key_id: r.id,
                domains: r.domains,
            },
            created_at: r.created_at,
            revoked_at: r.revoked_at,
        }
    }

    fn info(&self) -> KeyInfo {
        KeyInfo {
            id: self.principal.key_id.clone(),
            owner: self.principal.owner.clone(),
            admin: self.principal.admin,
            created_at: self.created_at.clone(),
            domains: self.principal.domains.clone(),
            revoked: self.revoked_at.is_some(),
            revoked_at: self.revoked_at.clone(),
        }
    }

    fn answer(&self) -> Result<Principal, AuthError> {
        match self.revoked_at {
            Some(_) => Err(AuthError::Revoked),
            None => Ok(self.principal.clone()),
        }
    }
}

#[derive(Default)]
struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    by_hash: HashMap<[u8; 32], Entry>,
    /// id → hash, in file order.
    ids: Vec<(String, [u8; 32])>,
}

impl Loaded {
    fn list(&self, owner: Option<&str>) -> Vec<KeyInfo> {
        self.ids
            .iter()
            .filter_map(|(_, h)| self.by_hash.get(h))
            .filter(|e| owner.is_none_or(|o| e.principal.owner == o))
            .map(Entry::info)
            .collect()
    }

    fn live(&self, id: &str) -> bool {
        self.ids
            .iter()
            .find(|(i, _)| i == id)
            .and_then(|(_, h)| self.by_hash.get(h))
            .is_some_and(|e| e.revoked_at.is_none())
    }
}

/// The server's view of the keys: the keys file beside the embedded store, or the shared
/// store's `api_keys` table.
pub struct ApiKeys {
    source: Source,
}

enum Source {
    File {
        path: PathBuf,
        data_dir: PathBuf,
        loaded: RwLock<Loaded>,
    },
    Store {
        keys: Arc<dyn KeyStore>,
        /// The cache and the store generation it was loaded at (`None`: never loaded).
        cache: RwLock<(Option<u64>, Loaded)>,
    },
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            Source::File { path, .. } => f.debug_struct("ApiKeys").field("path", path).finish(),
            Source::Store { .. } => f.debug_struct("ApiKeys").field("source", &"store").finish(),
        }
    }
}

fn parse(text: &str, path: &Path) -> Loaded {
    let mut loaded = Loaded::default();
    let mut by_id: HashMap<String, [u8; 32]> = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split('\t').collect();
        match fields.as_slice() {
            [REVOKE, id, when, ..] => {
                match by_id.get(*id).and_then(|h| loaded.by_hash.get_mut(h)) {
                    Some(entry) => {
                        entry.revoked_at.get_or_insert_with(|| when.to_string());
                    }
                    None => {
                        tracing::warn!(line = n + 1, path = %path.display(), "revocation of an unknown key id")
                    }
                }
            }
            [hash, owner, role, created, rest @ ..] => {
                let Some(h) = hex::decode(hash)
                    .ok()
                    .and_then(|h| <[u8; 32]>::try_from(h).ok())
                else {
                    tracing::warn!(line = n + 1, path = %path.display(), "skipping malformed api key line");
                    continue;
                };
                let id = match rest.first() {
                    Some(id) if valid_key_id(id) => id.to_string(),
                    _ => format!("lhk_{}", &hash[..16]),
                };
                let domains = rest
                    .get(1)
                    .map(|d| crate::store::keys::domains_of(d))
                    .unwrap_or_default();
                by_id.insert(id.clone(), h);
                loaded.ids.push((id.clone(), h));
                loaded.by_hash.insert(
                    h,
                    Entry {
                        principal: Principal {
                            owner: owner.to_string(),
                            admin: *role == "admin",
                            key_id: id,
                            domains,
                        },
                        created_at: created.to_string(),
                        revoked_at: None,
                    },
                );
            }
            _ => {
                tracing::warn!(line = n + 1, path = %path.display(), "skipping malformed api key line")
            }
        }
    }
    loaded
}

fn from_records(records: Vec<KeyRecord>) -> Loaded {
    let mut loaded = Loaded::default();
    for r in records {
        loaded.ids.push((r.id.clone(), r.hash));
        loaded.by_hash.insert(r.hash, Entry::from_record(r));
    }
    loaded
}

impl ApiKeys {
    /// Keys from `DATA_DIR/api-keys` (which may not exist yet).
    pub fn open(data_dir: &Path) -> Self {
        let keys = ApiKeys {
            source: Source::File {
                path: data_dir.join(KEYS_FILE),
                data_dir: data_dir.to_path_buf(),
                loaded: RwLock::new(Loaded::default()),
            },
        };
        keys.reload_if_changed();
        keys
    }

    /// Keys kept by `store` (which must hold keys: [`crate::store::Store::key_store`]).
    pub fn from_store(store: Arc<dyn crate::store::Store>) -> Result<Self, KeysError> {
        let keys = store.key_store().ok_or(KeysError::NotKept)?;
        Self::from_key_store(keys)
    }

    /// Keys kept by a [`KeyStore`] (the CLI's own connection to the store).
    pub fn from_key_store(keys: Arc<dyn KeyStore>) -> Result<Self, KeysError> {
        // Loaded here rather than by `refresh`, so a failure reaches the caller with its cause.
        let generation = keys.keys_generation();
        let records = keys.keys().map_err(KeysError::Store)?;
        Ok(ApiKeys {
            source: Source::Store {
                keys,
                cache: RwLock::new((Some(generation), from_records(records))),
            },
        })
    }

    /// Whether the keys are the shared store's.
    pub fn in_store(&self) -> bool {
        matches!(self.source, Source::Store { .. })
    }

    /// Creates a key for `owner` wherever these keys live.
    pub fn create(&self, owner: &str, admin: bool) -> Result<CreatedKey, KeysError> {
        self.create_for(owner, admin, &[])
    }

    /// [`ApiKeys::create`] limited to `domains` (empty: every domain).
    pub fn create_for(
        &self,
        owner: &str,
        admin: bool,
        domains: &[String],
    ) -> Result<CreatedKey, KeysError> {
        match &self.source {
            Source::File { data_dir, .. } => create_key_for(data_dir, owner, admin, domains),
            Source::Store { keys, cache } => {
                let (created, record) = new_key(owner, admin, domains)?;
                keys.add_key(&record).map_err(KeysError::Store)?;
                if let Ok(mut c) = cache.write() {
                    c.0 = None;
                }
                Ok(created)
            }
        }
    }

    fn reload_if_changed(&self) {
        let Source::File { path, loaded, .. } = &self.source else {
            return;
        };
        let stamp = std::fs::metadata(path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())));
        if let Ok(loaded) = loaded.read() {
            if loaded.stamp.is_some() && loaded.stamp == stamp {
                return;
            }
        }
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut fresh = parse(&text, path);
        fresh.stamp = stamp;
        if let Ok(mut loaded) = loaded.write() {
            *loaded = fresh;
        }
    }

    /// Store keys: reloads the cache when any control plane changed a key since it was
    /// loaded. An unreachable store keeps the old cache (and tries again on the next call).
    fn refresh(&self) -> Result<(), AuthError> {
        let Source::Store { keys, cache } = &self.source else {
            return Ok(());
        };
        let generation = keys.keys_generation();
        if cache.read().is_ok_and(|c| c.0 == Some(generation)) {
            return Ok(());
        }
        let records = keys.keys().map_err(|e| {
            tracing::warn!(error = %e, "cannot load the api keys from the store");
            AuthError::Unavailable
        })?;
        if let Ok(mut c) = cache.write() {
            *c = (Some(generation), from_records(records));
        }
        Ok(())
    }

    /// The answer from memory alone, or `None` when finding it needs the store (a key not
    /// cached, or a cache some control plane made stale): async callers run
    /// [`ApiKeys::authenticate`] on a blocking thread then.
    pub fn authenticate_cached(&self, key: &str) -> Option<Result<Principal, AuthError>> {
        match &self.source {
            Source::File { .. } => Some(self.authenticate(key)),
            Source::Store { keys, cache } => {
                let generation = keys.keys_generation();
                let c = cache.read().ok()?;
                if c.0 != Some(generation) {
                    return None;
                }
                c.1.by_hash.get(&hash_key(key)).map(Entry::answer)
            }
        }
    }

    /// The principal behind a presented key.
    pub fn authenticate(&self, key: &str) -> Result<Principal, AuthError> {
        let h = hash_key(key);
        match &self.source {
            Source::File { loaded, .. } => {
                // One stat per call: a revocation by the CLI takes effect on the next request.
                self.reload_if_changed();
                let loaded = loaded.read().map_err(|_| AuthError::Unknown)?;
                loaded.by_hash.get(&h).ok_or(AuthError::Unknown)?.answer()
            }
            Source::Store { keys, cache } => {
                self.refresh()?;
                if let Some(e) = cache.read().ok().and_then(|c| c.1.by_hash.get(&h).cloned()) {
                    return e.answer();
                }
                // Made since the cache was loaded (perhaps on another control plane).
                let found = keys.key_by_hash(&h).map_err(|e| {
                    tracing::warn!(error = %e, "cannot look an api key up in the store");
                    AuthError::Unavailable
                })?;
                let record = found.ok_or(AuthError::Unknown)?;
                let entry = Entry::from_record(record);
                let answer = entry.answer();
                if let Ok(mut c) = cache.write() {
                    if !c.1.by_hash.contains_key(&h) {
                        c.1.ids.push((entry.principal.key_id.clone(), h));
                        c.1.by_hash.insert(h, entry);
                    }
                }
                answer
            }
        }
    }

    /// Every key (optionally only `owner`'s), in creation order.
    pub fn list(&self, owner: Option<&str>) -> Vec<KeyInfo> {
        match &self.source {
            Source::File { loaded, .. } => {
                self.reload_if_changed();
                loaded.read().map(|l| l.list(owner)).unwrap_or_default()
            }
            Source::Store { keys, .. } => match keys.keys() {
                Ok(records) => from_records(records).list(owner),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot list the api keys");
                    Vec::new()
                }
            },
        }
    }

    /// Every key as a record (hashes, never secrets), in creation order.
    pub fn records(&self) -> Result<Vec<KeyRecord>, KeysError> {
        match &self.source {
            Source::File { loaded, .. } => {
                self.reload_if_changed();
                let l = loaded.read().map_err(|_| KeysError::Poisoned)?;
                Ok(l.ids
                    .iter()
                    .filter_map(|(_, h)| l.by_hash.get(h).map(|e| (h, e)))
                    .map(|(h, e)| KeyRecord {
                        hash: *h,
                        id: e.principal.key_id.clone(),
                        owner: e.principal.owner.clone(),
                        admin: e.principal.admin,
                        created_at: e.created_at.clone(),
                        revoked_at: e.revoked_at.clone(),
                        domains: e.principal.domains.clone(),
                    })
                    .collect())
            }
            Source::Store { keys, .. } => keys.keys().map_err(KeysError::Store),
        }
    }

    /// Makes these keys follow another region's `theirs`: keys missing here are added (with
    /// their revocations), and keys revoked there are revoked here. How many were added and
    /// revoked.
    pub fn copy_from(&self, theirs: &[KeyRecord]) -> Result<(usize, usize), KeysError> {
        let ours = self.records()?;
        let added = match &self.source {
            Source::File { data_dir, .. } => {
                let added = import_keys(data_dir, theirs)?;
                self.reload_if_changed();
                added
            }
            Source::Store { keys, cache } => {
                let present: std::collections::HashSet<[u8; 32]> =
                    ours.iter().map(|k| k.hash).collect();
                let mut added = 0;
                for k in theirs.iter().filter(|k| !present.contains(&k.hash)) {
                    keys.add_key(k).map_err(KeysError::Store)?;
                    added += 1;
                }
                if added > 0 {
                    if let Ok(mut c) = cache.write() {
                        c.0 = None;
                    }
                }
                added
            }
        };
        let mut revoked = 0;
        for k in theirs.iter().filter(|k| k.revoked_at.is_some()) {
            let live_here = ours
                .iter()
                .any(|o| o.hash == k.hash && o.revoked_at.is_none());
            if live_here && self.revoke(&k.id)? {
                revoked += 1;
            }
        }
        Ok((added, revoked))
    }

    /// Revokes key `id`; false if there is no such key or it was already revoked.
    pub fn revoke(&self, id: &str) -> Result<bool, KeysError> {
        let at = crate::clock::rfc3339(crate::clock::now_ms());
        match &self.source {
            Source::File {
                data_dir, loaded, ..
            } => {
                self.reload_if_changed();
                if !loaded.read().ok().is_some_and(|l| l.live(id)) {
                    return Ok(false);
                }
                append_line(data_dir, &format!("{REVOKE}\t{id}\t{at}\n"))?;
                self.reload_if_changed();
                Ok(true)
            }
            Source::Store { keys, cache } => {
                let revoked = keys.revoke_key(id, &at).map_err(KeysError::Store)?;
                // This control plane stops honouring it now, not when the notification lands.
                if let Ok(mut c) = cache.write() {
                    c.0 = None;
                    if let Some(e) = c.1.by_hash.values_mut().find(|e| e.principal.key_id == id) {
                        e.revoked_at.get_or_insert(at);
                    }
                }
                Ok(revoked)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_then_authenticate_while_open() {
        let dir = tempfile::tempdir().unwrap();
        let keys = ApiKeys::open(dir.path());
        assert_eq!(keys.authenticate("lh_nope"), Err(AuthError::Unknown));
        let k = create_key(dir.path(), "team-a", false).unwrap();
        assert!(k.key.starts_with("lh_") && k.key.len() == 35);
        assert!(valid_key_id(&k.id), "{}", k.id);
        let p = keys.authenticate(&k.key).unwrap();
        assert_eq!((p.owner.as_str(), p.admin), ("team-a", false));
        assert_eq!(p.key_id, k.id);
        let admin = create_key(dir.path(), "ops", true).unwrap();
        assert!(keys.authenticate(&admin.key).unwrap().admin);
        let text = std::fs::read_to_string(dir.path().join(KEYS_FILE)).unwrap();
        assert!(!text.contains(&k.key), "keys are stored hashed");
        assert!(matches!(
            create_key(dir.path(), "bad owner", false),
            Err(KeysError::InvalidOwner)
        ));
    }

    #[test]
    fn revocation_takes_effect_at_once_and_shows_in_the_list() {
        let dir = tempfile::tempdir().unwrap();
        let keys = ApiKeys::open(dir.path());
        let a = create_key(dir.path(), "alice", false).unwrap();
        let b = create_key(dir.path(), "bob", false).unwrap();
        assert!(keys.authenticate(&a.key).is_ok());
        // Revoked by another process (the CLI): seen on the next call.
        assert!(revoke_key(dir.path(), &a.id).unwrap());
        assert_eq!(keys.authenticate(&a.key), Err(AuthError::Revoked));
        assert!(keys.authenticate(&b.key).is_ok());
        assert!(!keys.revoke(&a.id).unwrap(), "already revoked");
        assert!(!keys.revoke("lhk_0000000000000000").unwrap(), "unknown");
        let all = keys.list(None);
        assert_eq!(all.len(), 2);
        assert!(all[0].revoked && all[0].revoked_at.is_some() && !all[1].revoked);
        let bobs = keys.list(Some("bob"));
        assert_eq!(bobs.len(), 1);
        assert_eq!(bobs[0].id, b.id);
        let json = serde_json::to_string(&all).unwrap();
        assert!(!json.contains(&a.key) && !json.contains("lh_"), "{json}");
    }

    #[test]
    fn old_four_field_lines_get_a_derived_id() {
        let dir = tempfile::tempdir().unwrap();
        let secret = "lh_0123456789abcdef0123456789abcdef";
        let hash = hex::encode(hash_key(secret));
        std::fs::write(
            dir.path().join(KEYS_FILE),
            format!("{hash}\tlegacy\tuser\t2026-01-01T00:00:00Z\nnot a line\n"),
        )
        .unwrap();
        let keys = ApiKeys::open(dir.path());
        let p = keys.authenticate(secret).unwrap();
        assert_eq!(p.key_id, format!("lhk_{}", &hash[..16]));
        assert!(valid_key_id(&p.key_id));
    }
}
