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

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
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
}

/// Why a presented key does not authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No such key.
    Unknown,
    /// The key was revoked.
    Revoked,
}

/// A key as `apikey list` and `GET /v1/admin/apikeys` show it: never the secret or its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyInfo {
    pub id: String,
    pub owner: String,
    pub admin: bool,
    pub created_at: String,
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

fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// Owner names: 1–64 of `[A-Za-z0-9._@-]`.
pub fn valid_owner(owner: &str) -> bool {
    (1..=64).contains(&owner.len())
        && owner
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'))
}

/// Key ids: `lhk_` + 16 lowercase hex digits.
pub fn valid_key_id(id: &str) -> bool {
    id.strip_prefix("lhk_").is_some_and(|h| {
        h.len() == 16
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn append_line(data_dir: &Path, line: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(data_dir)?;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(data_dir.join(KEYS_FILE))?;
    file.write_all(line.as_bytes())?;
    file.sync_all()?;
    Ok(())
}

fn random_hex(bytes: usize) -> anyhow::Result<String> {
    let mut raw = vec![0u8; bytes];
    getrandom::getrandom(&mut raw).map_err(|e| anyhow::anyhow!("random: {e}"))?;
    Ok(hex::encode(raw))
}

/// Appends a new key for `owner` to the keys file and returns it (the secret is shown once).
pub fn create_key(data_dir: &Path, owner: &str, admin: bool) -> anyhow::Result<CreatedKey> {
    anyhow::ensure!(
        valid_owner(owner),
        "owner must be 1-64 characters of A-Z a-z 0-9 . _ @ -"
    );
    let key = format!("lh_{}", random_hex(16)?);
    let id = format!("lhk_{}", random_hex(8)?);
    let line = format!(
        "{}\t{}\t{}\t{}\t{}\n",
        hex::encode(hash_key(&key)),
        owner,
        if admin { "admin" } else { "user" },
        crate::clock::rfc3339(crate::clock::now_ms()),
        id
    );
    append_line(data_dir, &line)?;
    Ok(CreatedKey { key, id })
}

/// Appends a revocation of key `id`; false if no such key exists (or it was revoked before).
pub fn revoke_key(data_dir: &Path, id: &str) -> anyhow::Result<bool> {
    let keys = ApiKeys::open(data_dir);
    keys.revoke(id)
}

#[derive(Debug, Clone)]
struct Entry {
    principal: Principal,
    created_at: String,
    revoked_at: Option<String>,
}

#[derive(Default)]
struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    by_hash: HashMap<[u8; 32], Entry>,
    /// id → hash, in file order.
    ids: Vec<(String, [u8; 32])>,
}

/// The server's view of the keys file.
pub struct ApiKeys {
    path: PathBuf,
    data_dir: PathBuf,
    loaded: RwLock<Loaded>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys").field("path", &self.path).finish()
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
                by_id.insert(id.clone(), h);
                loaded.ids.push((id.clone(), h));
                loaded.by_hash.insert(
                    h,
                    Entry {
                        principal: Principal {
                            owner: owner.to_string(),
                            admin: *role == "admin",
                            key_id: id,
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

impl ApiKeys {
    /// Keys from `DATA_DIR/api-keys` (which may not exist yet).
    pub fn open(data_dir: &Path) -> Self {
        let keys = ApiKeys {
            path: data_dir.join(KEYS_FILE),
            data_dir: data_dir.to_path_buf(),
            loaded: RwLock::new(Loaded::default()),
        };
        keys.reload_if_changed();
        keys
    }

    fn reload_if_changed(&self) {
        let stamp = std::fs::metadata(&self.path)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())));
        if let Ok(loaded) = self.loaded.read() {
            if loaded.stamp.is_some() && loaded.stamp == stamp {
                return;
            }
        }
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let mut fresh = parse(&text, &self.path);
        fresh.stamp = stamp;
        if let Ok(mut loaded) = self.loaded.write() {
            *loaded = fresh;
        }
    }

    /// The principal behind a presented key.
    pub fn authenticate(&self, key: &str) -> Result<Principal, AuthError> {
        // One stat per call: a revocation by the CLI takes effect on the next request.
        self.reload_if_changed();
        let h = hash_key(key);
        let loaded = self.loaded.read().map_err(|_| AuthError::Unknown)?;
        match loaded.by_hash.get(&h) {
            None => Err(AuthError::Unknown),
            Some(e) if e.revoked_at.is_some() => Err(AuthError::Revoked),
            Some(e) => Ok(e.principal.clone()),
        }
    }

    /// Every key (optionally only `owner`'s), in creation order.
    pub fn list(&self, owner: Option<&str>) -> Vec<KeyInfo> {
        self.reload_if_changed();
        let Ok(loaded) = self.loaded.read() else {
            return Vec::new();
        };
        loaded
            .ids
            .iter()
            .filter_map(|(_, h)| loaded.by_hash.get(h))
            .filter(|e| owner.is_none_or(|o| e.principal.owner == o))
            .map(|e| KeyInfo {
                id: e.principal.key_id.clone(),
                owner: e.principal.owner.clone(),
                admin: e.principal.admin,
                created_at: e.created_at.clone(),
                revoked: e.revoked_at.is_some(),
                revoked_at: e.revoked_at.clone(),
            })
            .collect()
    }

    /// Revokes key `id` (appending to the file); false if there is no such key or it was
    /// already revoked.
    pub fn revoke(&self, id: &str) -> anyhow::Result<bool> {
        self.reload_if_changed();
        let live = self.loaded.read().ok().is_some_and(|l| {
            l.ids
                .iter()
                .find(|(i, _)| i == id)
                .and_then(|(_, h)| l.by_hash.get(h))
                .is_some_and(|e| e.revoked_at.is_none())
        });
        if !live {
            return Ok(false);
        }
        let line = format!(
            "{REVOKE}\t{id}\t{}\n",
            crate::clock::rfc3339(crate::clock::now_ms())
        );
        append_line(&self.data_dir, &line)?;
        self.reload_if_changed();
        Ok(true)
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
        assert!(create_key(dir.path(), "bad owner", false).is_err());
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
