//! `lasthop-control snapshot build`: a snapshot of every link, or with `--hot` the hot set
//! `serve` publishes, built offline.

use std::path::Path;

use lasthop_control::clicks::StoreLocation;
use lasthop_control::snapshot::HotSet;

use crate::cli::{HotSetArgs, StoreArgs};

pub(crate) fn build(
    store: &StoreArgs,
    out: &Path,
    reserve: u64,
    hot: bool,
    clicks_store: &StoreLocation,
    budget: HotSetArgs,
) -> anyhow::Result<()> {
    let (key, opened) = store.open()?;
    let started = std::time::Instant::now();
    let hot_set = budget.hot_set();
    let (seq, info) = if hot {
        let popular = offline_popular(store, clicks_store, &hot_set);
        let (seq, info, stats) = lasthop_control::snapshot::build_hot_snapshot(
            &*opened,
            key.id(),
            store.regions,
            reserve,
            out,
            &hot_set,
            &popular,
            lasthop_control::clock::now_ms(),
        )?;
        eprintln!("hot set: {stats:?}");
        (seq, info)
    } else {
        lasthop_control::snapshot::build_snapshot(
            &*opened,
            key.id(),
            store.regions,
            reserve,
            out,
            hot_set.layout,
        )?
    };
    eprintln!("built in {:.3} s", started.elapsed().as_secs_f64());
    opened.shutdown()?;
    println!("wrote {} (seq {seq}, {info:?})", out.display());
    Ok(())
}

/// Popular links for an offline hot-set build: from ClickHouse, or the rollups in
/// `DATA_DIR/clicks/rollups.redb` when there is one and no server holds it; none otherwise
/// (said on stderr).
fn offline_popular(store: &StoreArgs, rollups: &StoreLocation, hot: &HotSet) -> Vec<(String, u64)> {
    use lasthop_control::clicks::{Day, RollupStore};
    let clicks_dir = store.data_dir.as_ref().map(|d| d.join("clicks"));
    let clicks_dir = match (rollups, clicks_dir) {
        (StoreLocation::ClickHouse(_), dir) => dir.unwrap_or_default(),
        (StoreLocation::Embedded, Some(dir)) if dir.join("rollups.redb").exists() => dir,
        (StoreLocation::Embedded, _) => return Vec::new(),
    };
    let today = Day::today();
    let n = usize::try_from(hot.max_links).unwrap_or(usize::MAX);
    match RollupStore::open_at(rollups, &clicks_dir).and_then(|r| {
        r.top_codes(
            today.minus(lasthop_control::snapshot::POPULAR_DAYS - 1),
            today,
            n,
        )
    }) {
        Ok(top) => top,
        Err(e) => {
            eprintln!("no popular links ({e}); the recent ones alone");
            Vec::new()
        }
    }
}
