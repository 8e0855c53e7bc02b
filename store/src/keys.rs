//! API key records, for the stores that keep them (the PostgreSQL store; beside the embedded
//! store they are the `api-keys` file, the control plane's `auth`), and the rules for their ids and owners.

use super::StoreError;

/// A key as the shared store keeps it (the hash of the secret, never the secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRecord {
    pub hash: [u8; 32],
    pub id: String,
    pub owner: String,
    pub admin: bool,
    pub created_at: String,
    pub revoked_at: Option<String>,
    /// The domains the key may act on (`apikey create --domain D`); empty: every domain.
    pub domains: Vec<String>,
}

/// A key's domains as one text field (the keys file, the shared store): comma-separated.
pub fn domains_text(domains: &[String]) -> String {
    domains.join(",")
}

/// [`domains_text`] read back (empty: every domain).
pub fn domains_of(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(str::to_string)
        .collect()
}

/// Where a store that holds API keys keeps them (the PostgreSQL store).
pub trait KeyStore: Send + Sync {
    fn add_key(&self, key: &KeyRecord) -> Result<(), StoreError>;
    /// False if there is no such key or it was revoked before.
    fn revoke_key(&self, id: &str, at: &str) -> Result<bool, StoreError>;
    /// Every key, in creation order.
    fn keys(&self) -> Result<Vec<KeyRecord>, StoreError>;
    fn key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<KeyRecord>, StoreError>;
    /// Raised whenever any control plane changes a key (and whenever the store could have
    /// missed such news, e.g. after a reconnect): a cache older than this is stale.
    fn keys_generation(&self) -> u64;
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
