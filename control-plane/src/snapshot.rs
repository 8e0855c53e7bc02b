//! Building an edge snapshot from the store (`lasthop-control snapshot build`).
//!
//! Every link goes in: live ones with their URL and expiry, and deleted, disabled or taken-down
//! ones with an empty URL, which the engine answers 410 locally (an empty URL is never
//! servable) instead of asking the origin about a code it already knows is gone.

use std::path::Path;

use lasthop_core::{HighWater, LinkStatus, RegionError};
use lasthop_snapshot::{SealedInfo, SnapshotMeta, SnapshotWriter};

use crate::store::{Store, StoreError};

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
) -> Result<(u64, SealedInfo), SnapshotBuildError> {
    let mut high_water = HighWater::new(regions, reserve)?;
    for (region, mark) in store.high_water_marks()? {
        high_water.raise(region, mark)?;
    }
    // Taken before the read, so the snapshot is complete up to `sequence` and may hold a little
    // more; an engine replaying the feed from `sequence` re-applies those changes, which is
    // harmless because applying a change is idempotent.
    let sequence = store.last_seq()?;
    let meta = SnapshotMeta::new(sequence, key_id, high_water);
    let mut writer = SnapshotWriter::create(out, meta)?;
    let now = crate::clock::now_ms();
    // The writer's own error, kept for the caller; the store's walk is stopped with a
    // placeholder that is never returned.
    let mut failed = None;
    let walked = store.for_each_link(&mut |s| {
        let url: &[u8] = match s.state.status(now) {
            LinkStatus::Active | LinkStatus::Expired => s.link.long_url.as_bytes(),
            LinkStatus::Deleted | LinkStatus::Disabled | LinkStatus::TakenDown => b"",
        };
        writer
            .add(s.link.code.as_bytes(), url, s.state.expires_at_ms)
            .map_err(|e| {
                failed = Some(e);
                StoreError::NotApplied("the snapshot writer failed")
            })
    });
    if let Some(e) = failed {
        return Err(SnapshotBuildError::Writer(e));
    }
    walked?;
    Ok((sequence, writer.seal()?))
}
