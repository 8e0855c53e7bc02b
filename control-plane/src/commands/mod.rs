//! One file a subcommand of `lasthop-control` (`serve` is `serve.rs`, the composition root),
//! and what several of them share: opening the store a command names.

pub(crate) mod apikey;
pub(crate) mod export;
pub(crate) mod generate;
pub(crate) mod import;
pub(crate) mod keygen;
pub(crate) mod links;
pub(crate) mod migrate;
pub(crate) mod snapshot;
pub(crate) mod store;

use std::sync::Arc;

use anyhow::Context;
use lasthop_control::store::CommitObserver;
use lasthop_control::{EmbeddedStore, EmbeddedStoreConfig, Store};
use lasthop_core::{CodeScheme, PermutationKey};

use crate::cli::StoreArgs;

impl StoreArgs {
    pub(crate) fn data_dir(&self) -> anyhow::Result<&std::path::Path> {
        self.data_dir
            .as_deref()
            .context("--data-dir is needed with the embedded store")
    }

    pub(crate) fn open(&self) -> anyhow::Result<(PermutationKey, Arc<dyn Store>)> {
        let key = PermutationKey::load(&self.key_file)?;
        let dir = match is_postgres(&self.store) {
            true => std::path::Path::new("."),
            false => self.data_dir()?,
        };
        let store = open_store(
            &self.store,
            dir,
            CodeScheme::new(&key)?,
            self.region,
            self.regions,
            10_000,
            None,
        )?;
        Ok((key, store))
    }
}

/// Opens the store `spec` names: `embedded` (redb in `DATA_DIR/links.redb`) or a PostgreSQL
/// connection string (`postgres://…`, `postgresql://…` or libpq `key=value` words).
pub(crate) fn open_store(
    spec: &str,
    data_dir: &std::path::Path,
    scheme: CodeScheme,
    region: u32,
    regions: u32,
    block_size: u64,
    observer: Option<CommitObserver>,
) -> anyhow::Result<Arc<dyn Store>> {
    if spec == "embedded" {
        let mut config = EmbeddedStoreConfig::new(data_dir.join("links.redb"), scheme);
        config.region = region;
        config.regions = regions;
        config.block_size = block_size;
        let store = EmbeddedStore::open(config, observer)
            .with_context(|| format!("opening the store in {}", data_dir.display()))?;
        return Ok(Arc::new(store));
    }
    anyhow::ensure!(
        is_postgres(spec),
        "--store must be `embedded` or a PostgreSQL connection string (postgres://...)"
    );
    postgres_store(spec, scheme, region, regions, block_size, observer)
}

/// The PostgreSQL store (`--store postgres://...`), where this build has it.
fn postgres_store(
    spec: &str,
    scheme: CodeScheme,
    region: u32,
    regions: u32,
    block_size: u64,
    observer: Option<CommitObserver>,
) -> anyhow::Result<Arc<dyn Store>> {
    #[cfg(feature = "postgres")]
    {
        use lasthop_control::store::postgres;
        let mut config = postgres::PgStoreConfig::new(spec, scheme);
        config.region = region;
        config.regions = regions;
        config.block_size = block_size;
        config.observer = observer;
        let store = postgres::PgStore::open(config).context("opening the PostgreSQL store")?;
        Ok(Arc::new(store))
    }
    #[cfg(not(feature = "postgres"))]
    {
        let _ = (spec, scheme, region, regions, block_size, observer);
        Err(lasthop_control::StoreError::NotBuilt("--store").into())
    }
}

pub(crate) fn is_postgres(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://") || spec.contains('=')
}
