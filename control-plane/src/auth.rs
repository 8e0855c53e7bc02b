//! API keys.
//!
//! Keys are `lh_` + 32 hex characters (128 random bits), shown once at creation and stored only
//! as SHA-256 in `DATA_DIR/api-keys`, one `hash<TAB>owner<TAB>role<TAB>created` line each. The
//! file is separate from the store so `apikey create` works while the server runs (the store
//! file is locked by its one writer); the server re-reads it when it changes. A lost key is
//! replaced, never recovered.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::RwLock;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

/// Who is calling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub owner: String,
    pub admin: bool,
}

/// The file name beside the store.
pub const KEYS_FILE: &str = "api-keys";

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

/// Appends a new key for `owner` to the keys file and returns the key (shown once).
pub fn create_key(data_dir: &Path, owner: &str, admin: bool) -> anyhow::Result<String> {
    anyhow::ensure!(
        valid_owner(owner),
        "owner must be 1-64 characters of A-Z a-z 0-9 . _ @ -"
    );
    std::fs::create_dir_all(data_dir)?;
    let mut raw = [0u8; 16];
    getrandom::getrandom(&mut raw).map_err(|e| anyhow::anyhow!("random: {e}"))?;
    let key = format!("lh_{}", hex::encode(raw));
    let line = format!(
        "{}\t{}\t{}\t{}\n",
        hex::encode(hash_key(&key)),
        owner,
        if admin { "admin" } else { "user" },
        crate::clock::rfc3339(crate::clock::now_ms())
    );
    let path = data_dir.join(KEYS_FILE);
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)?;
    file.write_all(line.as_bytes())?;
    file.sync_all()?;
    Ok(key)
}

#[derive(Default)]
struct Loaded {
    stamp: Option<(SystemTime, u64)>,
    keys: HashMap<[u8; 32], Principal>,
}

/// The server's view of the keys file.
pub struct ApiKeys {
    path: PathBuf,
    loaded: RwLock<Loaded>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiKeys").field("path", &self.path).finish()
    }
}

impl ApiKeys {
    /// Keys from `DATA_DIR/api-keys` (which may not exist yet).
    pub fn open(data_dir: &Path) -> Self {
        let keys = ApiKeys {
            path: data_dir.join(KEYS_FILE),
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
            if loaded.stamp == stamp {
                return;
            }
        }
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        let mut keys = HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let fields: Vec<&str> = line.split('\t').collect();
            let parsed = match fields.as_slice() {
                [hash, owner, role, ..] => hex::decode(hash)
                    .ok()
                    .and_then(|h| <[u8; 32]>::try_from(h).ok())
                    .map(|h| {
                        (
                            h,
                            Principal {
                                owner: owner.to_string(),
                                admin: *role == "admin",
                            },
                        )
                    }),
                _ => None,
            };
            match parsed {
                Some((h, p)) => {
                    keys.insert(h, p);
                }
                None if line.trim().is_empty() => {}
                None => {
                    tracing::warn!(line = n + 1, path = %self.path.display(), "skipping malformed api key line")
                }
            }
        }
        if let Ok(mut loaded) = self.loaded.write() {
            *loaded = Loaded { stamp, keys };
        }
    }

    /// The principal behind a presented key, if any.
    pub fn authenticate(&self, key: &str) -> Option<Principal> {
        let h = hash_key(key);
        if let Some(p) = self.loaded.read().ok()?.keys.get(&h) {
            return Some(p.clone());
        }
        // Unknown key: the file may have grown since we read it.
        self.reload_if_changed();
        self.loaded.read().ok()?.keys.get(&h).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_then_authenticate_while_open() {
        let dir = tempfile::tempdir().unwrap();
        let keys = ApiKeys::open(dir.path());
        assert_eq!(keys.authenticate("lh_nope"), None);
        let k = create_key(dir.path(), "team-a", false).unwrap();
        assert!(k.starts_with("lh_") && k.len() == 35);
        let p = keys.authenticate(&k).unwrap();
        assert_eq!(p.owner, "team-a");
        assert!(!p.admin);
        let admin = create_key(dir.path(), "ops", true).unwrap();
        assert!(keys.authenticate(&admin).unwrap().admin);
        let text = std::fs::read_to_string(dir.path().join(KEYS_FILE)).unwrap();
        assert!(!text.contains(&k), "keys are stored hashed");
        assert!(create_key(dir.path(), "bad owner", false).is_err());
    }
}
