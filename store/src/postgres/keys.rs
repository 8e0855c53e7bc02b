//! API keys in the shared store: every control plane on the database sees a new key on its
//! first use (a miss is looked up) and a revocation as soon as the `NOTIFY` that commits with
//! it arrives (the cache is dropped and reloaded).

use tokio_postgres::Client;

use super::{corrupt, pg};
use crate::keys::KeyRecord;
use crate::StoreError;

/// The channel shared-state changes (keys, owners, lists) are announced on; the payload names
/// what changed.
pub const STATE_CHANNEL: &str = "lasthop_state";

pub(crate) fn record(row: &tokio_postgres::Row) -> Result<KeyRecord, StoreError> {
    let hash: Vec<u8> = row.get("hash");
    let hash = <[u8; 32]>::try_from(hash)
        .map_err(|_| corrupt("api_keys", "a hash of the wrong length"))?;
    Ok(KeyRecord {
        hash,
        id: row.get("id"),
        owner: row.get("owner"),
        admin: row.get("admin"),
        created_at: row.get("created_at"),
        revoked_at: row.get("revoked_at"),
        domains: crate::keys::domains_of(row.get::<_, &str>("domains")),
    })
}

/// Adds a key (announced to every control plane).
pub async fn insert(client: &mut Client, key: &KeyRecord) -> Result<(), StoreError> {
    let txn = client.transaction().await.map_err(pg)?;
    txn.execute(
        "INSERT INTO api_keys (hash, id, owner, admin, created_at, revoked_at, domains) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[
            &key.hash.as_slice(),
            &key.id,
            &key.owner,
            &key.admin,
            &key.created_at,
            &key.revoked_at,
            &crate::keys::domains_text(&key.domains),
        ],
    )
    .await
    .map_err(pg)?;
    txn.execute("SELECT pg_notify($1, 'keys')", &[&STATE_CHANNEL])
        .await
        .map_err(pg)?;
    txn.commit().await.map_err(pg)
}

/// Revokes key `id`; false if there is no such key or it was revoked before.
pub async fn revoke(client: &mut Client, id: &str, at: &str) -> Result<bool, StoreError> {
    let txn = client.transaction().await.map_err(pg)?;
    let n = txn
        .execute(
            "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL",
            &[&id, &at],
        )
        .await
        .map_err(pg)?;
    if n > 0 {
        txn.execute("SELECT pg_notify($1, 'keys')", &[&STATE_CHANNEL])
            .await
            .map_err(pg)?;
    }
    txn.commit().await.map_err(pg)?;
    Ok(n > 0)
}

/// Every key, in creation order.
pub async fn all(client: &Client) -> Result<Vec<KeyRecord>, StoreError> {
    let rows = client
        .query(
            "SELECT hash, id, owner, admin, created_at, revoked_at, domains FROM api_keys \
             ORDER BY created_at, id",
            &[],
        )
        .await
        .map_err(pg)?;
    rows.iter().map(record).collect()
}

/// The key with this hash, if any.
pub async fn by_hash(client: &Client, hash: &[u8; 32]) -> Result<Option<KeyRecord>, StoreError> {
    let row = client
        .query_opt(
            "SELECT hash, id, owner, admin, created_at, revoked_at, domains FROM api_keys WHERE hash = $1",
            &[&hash.as_slice()],
        )
        .await
        .map_err(pg)?;
    row.as_ref().map(record).transpose()
}

/// The keys of a shared store through one connection of their own, for the CLI (`apikey
/// create|list|revoke --store postgres://…`): no writer, no pool, no listener.
pub struct PgKeys {
    rt: tokio::runtime::Runtime,
    client: tokio::sync::Mutex<Client>,
}

impl std::fmt::Debug for PgKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgKeys").finish_non_exhaustive()
    }
}

impl PgKeys {
    /// Connects and applies the migrations the database lacks.
    pub fn connect(url: &str) -> Result<PgKeys, StoreError> {
        let config = super::parse_config(url)?;
        let rt = super::one_off_runtime()?;
        let client = rt.block_on(async {
            let mut client = super::connect(&config).await?;
            super::migrate(&mut client).await?;
            Ok::<_, StoreError>(client)
        })?;
        Ok(PgKeys {
            rt,
            client: tokio::sync::Mutex::new(client),
        })
    }
}

impl crate::keys::KeyStore for PgKeys {
    fn add_key(&self, key: &KeyRecord) -> Result<(), StoreError> {
        self.rt
            .block_on(async { insert(&mut *self.client.lock().await, key).await })
    }

    fn revoke_key(&self, id: &str, at: &str) -> Result<bool, StoreError> {
        self.rt
            .block_on(async { revoke(&mut *self.client.lock().await, id, at).await })
    }

    fn keys(&self) -> Result<Vec<KeyRecord>, StoreError> {
        self.rt
            .block_on(async { all(&*self.client.lock().await).await })
    }

    fn key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<KeyRecord>, StoreError> {
        self.rt
            .block_on(async { by_hash(&*self.client.lock().await, hash).await })
    }

    fn keys_generation(&self) -> u64 {
        // One-shot tools: every call reads the table.
        0
    }
}
