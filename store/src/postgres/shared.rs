//! What several control planes on one database share beyond the record: leader locks
//! (session advisory locks on a connection of their own), engines' status reports, and
//! published snapshots (their bytes in `snapshot_chunks`, so any control plane serves any
//! download; each keeps a copy in its data directory to serve from).

use std::io::Write as _;
use std::path::Path;

use futures_util::{pin_mut, TryStreamExt as _};
use lasthop_core::feed::{SnapshotFrame, SNAPSHOT_PATH};
use sha2::{Digest, Sha256};

use super::keys::STATE_CHANNEL;
use super::{corrupt, pg, PgStore};
use crate::{Lead, News, Shared, StoreError};

/// Bytes per stored snapshot chunk.
const CHUNK: usize = 1 << 20;

/// The advisory lock key of leader lock `name` (stable across versions: the first 8 bytes of
/// `SHA-256("lasthop:" + name)`).
fn lock_key(name: &str) -> i64 {
    let digest = Sha256::digest(format!("lasthop:{name}").as_bytes());
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(first)
}

/// A held advisory lock: the connection that holds it.
struct PgLead {
    client: tokio_postgres::Client,
}

impl Lead for PgLead {
    fn held(&self) -> bool {
        !self.client.is_closed()
    }
}

fn io(e: std::io::Error) -> StoreError {
    StoreError::File {
        what: "snapshot file",
        cause: Box::new(e),
    }
}

impl Shared for PgStore {
    fn try_lead(&self, name: &str) -> Result<Option<Box<dyn Lead>>, StoreError> {
        let key = lock_key(name);
        let config = self.pg_config().clone();
        self.run(async move {
            let client = super::connect(&config).await?;
            let got: bool = client
                .query_one("SELECT pg_try_advisory_lock($1)", &[&key])
                .await
                .map_err(pg)?
                .get(0);
            Ok(got.then(|| Box::new(PgLead { client }) as Box<dyn Lead>))
        })
    }

    fn generation(&self, what: News) -> u64 {
        self.news().get(what)
    }

    fn put_edge(
        &self,
        engine: &str,
        entry: &str,
        received_ms: i64,
        forget_before_ms: i64,
    ) -> Result<(), StoreError> {
        let (engine, entry) = (engine.to_string(), entry.to_string());
        self.with_client(move |c| async move {
            c.execute(
                "INSERT INTO edge_reports (engine, entry, received_ms) VALUES ($1, $2, $3) \
                 ON CONFLICT (engine) DO UPDATE SET entry = excluded.entry, \
                 received_ms = excluded.received_ms \
                 WHERE edge_reports.received_ms <= excluded.received_ms",
                &[&engine, &entry, &received_ms],
            )
            .await
            .map_err(pg)?;
            // Engines silent for a week go with the writes that would have replaced them
            // (the fleet forgets them too); silent ones before that stay listed as missing.
            c.execute(
                "DELETE FROM edge_reports WHERE received_ms < $1",
                &[&forget_before_ms],
            )
            .await
            .map_err(pg)?;
            Ok(())
        })
    }

    fn edges(&self, since_ms: i64) -> Result<Vec<String>, StoreError> {
        self.with_client(move |c| async move {
            let rows = c
                .query(
                    "SELECT entry FROM edge_reports WHERE received_ms >= $1",
                    &[&since_ms],
                )
                .await
                .map_err(pg)?;
            Ok(rows.iter().map(|r| r.get(0)).collect())
        })
    }

    fn delete_edge(&self, engine: &str) -> Result<bool, StoreError> {
        let engine = engine.to_string();
        self.with_client(move |c| async move {
            let n = c
                .execute("DELETE FROM edge_reports WHERE engine = $1", &[&engine])
                .await
                .map_err(pg)?;
            Ok(n > 0)
        })
    }

    fn put_snapshot(&self, frame: &SnapshotFrame, file: &Path) -> Result<(), StoreError> {
        let frame = frame.clone();
        let mut reader = std::fs::File::open(file).map_err(io)?;
        let seq = i64::try_from(frame.seq).map_err(|e| corrupt("snapshot seq", e))?;
        let size = i64::try_from(frame.size).map_err(|e| corrupt("snapshot size", e))?;
        let pool = self.pool();
        // Chunks are read on this (blocking) thread and sent to the store's runtime one at a
        // time, so memory holds one chunk however large the snapshot.
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(2);
        let upload = {
            let frame = frame.clone();
            let (done_tx, done_rx) = std::sync::mpsc::sync_channel(1);
            self.spawn(async move {
                let result = async {
                    let mut c = pool.get().await.map_err(super::pool_err)?;
                    let txn = c.transaction().await.map_err(pg)?;
                    let fresh = txn
                        .execute(
                            "INSERT INTO snapshots (id, seq, sha256, size, published_ms) \
                             VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                            &[
                                &frame.id,
                                &seq,
                                &frame.sha256,
                                &size,
                                &crate::clock::now_ms(),
                            ],
                        )
                        .await
                        .map_err(pg)?;
                    let insert = txn
                        .prepare("INSERT INTO snapshot_chunks (id, n, data) VALUES ($1, $2, $3)")
                        .await
                        .map_err(pg)?;
                    let mut n = 0i32;
                    while let Some(chunk) = rx.recv().await {
                        if fresh == 1 {
                            txn.execute(&insert, &[&frame.id, &n, &chunk])
                                .await
                                .map_err(pg)?;
                        }
                        n += 1;
                    }
                    txn.execute("SELECT pg_notify($1, 'snapshots')", &[&STATE_CHANNEL])
                        .await
                        .map_err(pg)?;
                    txn.commit().await.map_err(pg)
                }
                .await;
                let _ = done_tx.send(result);
            });
            done_rx
        };
        let mut sent = 0u64;
        loop {
            let mut chunk = vec![0u8; CHUNK];
            let mut filled = 0;
            while filled < CHUNK {
                match std::io::Read::read(&mut reader, &mut chunk[filled..]).map_err(io)? {
                    0 => break,
                    k => filled += k,
                }
            }
            if filled == 0 {
                break;
            }
            chunk.truncate(filled);
            sent += filled as u64;
            if tx.blocking_send(chunk).is_err() {
                break;
            }
        }
        drop(tx);
        let result = upload.recv().map_err(|_| StoreError::ShuttingDown)?;
        if result.is_ok() && sent != frame.size {
            return Err(corrupt(
                "snapshot upload",
                format!("sent {sent} bytes of {}", frame.size),
            ));
        }
        result
    }

    fn snapshots(&self) -> Result<Vec<SnapshotFrame>, StoreError> {
        self.with_client(|c| async move {
            let rows = c
                .query(
                    "SELECT id, seq, sha256, size FROM snapshots ORDER BY seq DESC, published_ms DESC",
                    &[],
                )
                .await
                .map_err(pg)?;
            rows.iter()
                .map(|r| {
                    let id: String = r.get(0);
                    Ok(SnapshotFrame {
                        signature: None,
                        url: format!("{SNAPSHOT_PATH}{id}"),
                        seq: u64::try_from(r.get::<_, i64>(1))
                            .map_err(|e| corrupt("snapshots", e))?,
                        sha256: r.get(2),
                        size: u64::try_from(r.get::<_, i64>(3))
                            .map_err(|e| corrupt("snapshots", e))?,
                        id,
                    })
                })
                .collect()
        })
    }

    fn fetch_snapshot(&self, id: &str, dest: &Path) -> Result<bool, StoreError> {
        let id = id.to_string();
        let mut file = std::fs::File::create(dest).map_err(io)?;
        // Chunks come from the store's runtime one at a time; this thread writes them.
        enum Piece {
            Chunk(Vec<u8>),
            Done,
            Missing,
            Failed(StoreError),
        }
        let (tx, rx) = std::sync::mpsc::sync_channel::<Piece>(2);
        let pool = self.pool();
        self.spawn(async move {
            let result = async {
                let c = pool.get().await.map_err(super::pool_err)?;
                let known = c
                    .query_opt("SELECT 1 FROM snapshots WHERE id = $1", &[&id])
                    .await
                    .map_err(pg)?
                    .is_some();
                if !known {
                    return Ok(false);
                }
                let rows = c
                    .query_raw(
                        "SELECT data FROM snapshot_chunks WHERE id = $1 ORDER BY n",
                        [&id],
                    )
                    .await
                    .map_err(pg)?;
                pin_mut!(rows);
                while let Some(row) = rows.try_next().await.map_err(pg)? {
                    if tx.send(Piece::Chunk(row.get::<_, Vec<u8>>(0))).is_err() {
                        return Ok(true);
                    }
                }
                Ok(true)
            }
            .await;
            let _ = tx.send(match result {
                Ok(true) => Piece::Done,
                Ok(false) => Piece::Missing,
                Err(e) => Piece::Failed(e),
            });
        });
        loop {
            match rx.recv().map_err(|_| StoreError::ShuttingDown)? {
                Piece::Chunk(chunk) => file.write_all(&chunk).map_err(io)?,
                Piece::Done => break,
                Piece::Missing => return Ok(false),
                Piece::Failed(e) => return Err(e),
            }
        }
        file.sync_all().map_err(io)?;
        Ok(true)
    }

    fn drop_snapshot(&self, id: &str) -> Result<(), StoreError> {
        let id = id.to_string();
        self.with_client(move |c| async move {
            c.execute("DELETE FROM snapshots WHERE id = $1", &[&id])
                .await
                .map_err(pg)?;
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn lock_keys_are_stable_and_distinct() {
        assert_eq!(super::lock_key("snapshots"), super::lock_key("snapshots"));
        assert_ne!(super::lock_key("snapshots"), super::lock_key("scanner"));
    }
}
