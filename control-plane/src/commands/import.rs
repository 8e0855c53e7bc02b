//! `lasthop-control import`: an export read into an empty store, all or nothing.

use std::path::PathBuf;

use anyhow::Context;
use lasthop_core::{CodeScheme, PermutationKey};

use super::is_postgres;
use crate::cli::StoreArgs;

pub(crate) fn run(store: &StoreArgs, input: Option<&PathBuf>) -> anyhow::Result<()> {
    let key = PermutationKey::load(&store.key_file)?;
    let data_dir = if is_postgres(&store.store) {
        None
    } else {
        Some(store.data_dir()?)
    };
    let run = |r: &mut dyn std::io::BufRead| {
        lasthop_control::backup::import_all(
            &store.store,
            data_dir,
            CodeScheme::new(&key)?,
            store.region,
            store.regions,
            r,
        )
        .map_err(anyhow::Error::from)
    };
    let done = match input {
        Some(path) => {
            let file =
                std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
            run(&mut std::io::BufReader::with_capacity(1 << 20, file))?
        }
        None => run(&mut std::io::stdin().lock())?,
    };
    eprintln!(
        "imported {} links, {} audit records, {} other records and {} API keys; \
         change log at {}",
        done.links, done.audit, done.other, done.api_keys, done.last_seq
    );
    Ok(())
}
