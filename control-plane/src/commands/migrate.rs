//! `lasthop-control migrate`: the PostgreSQL store's schema migrations alone.

use super::is_postgres;

pub(crate) fn run(store: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        is_postgres(store),
        "--store must be a PostgreSQL connection string"
    );
    #[cfg(not(feature = "postgres"))]
    return Err(lasthop_control::StoreError::NotBuilt("migrate").into());
    #[cfg(feature = "postgres")]
    migrate(store)
}

#[cfg(feature = "postgres")]
fn migrate(store: &str) -> anyhow::Result<()> {
    use lasthop_control::store::postgres;
    let ran = postgres::migrate_only(store)?;
    println!(
        "{ran} migration(s) applied; schema version {}",
        postgres::MIGRATIONS.len()
    );
    Ok(())
}
