//! `lasthop-control export`: the whole record as NDJSON (store/src/transfer.rs has the format).

use std::path::PathBuf;

use anyhow::Context;
use lasthop_core::CodeScheme;

use super::is_postgres;
use crate::cli::StoreArgs;

pub(crate) fn run(store: &StoreArgs, out: Option<&PathBuf>) -> anyhow::Result<()> {
    let (key, opened) = store.open()?;
    let scheme = CodeScheme::new(&key)?;
    let source = if is_postgres(&store.store) {
        "postgres"
    } else {
        "embedded"
    };
    let keys_dir = (source == "embedded")
        .then(|| store.data_dir())
        .transpose()?;
    // A file gets every URL and key hash of the record: readable by its owner only, fsynced
    // once written.
    let (sink, file): (Box<dyn std::io::Write>, _) = match out {
        Some(path) => {
            use std::os::unix::fs::OpenOptionsExt as _;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            (Box::new(file.try_clone()?), Some(file))
        }
        None => (Box::new(std::io::stdout().lock()), None),
    };
    let end = lasthop_control::backup::export_all(
        &*opened,
        source,
        scheme.key_id(),
        store.regions,
        keys_dir,
        std::io::BufWriter::with_capacity(1 << 20, sink),
    )?;
    if let Some(file) = file {
        file.sync_all()?;
    }
    opened.shutdown()?;
    eprintln!(
        "exported {} links and {} other records, change log at {}",
        end.links,
        end.records - end.links,
        end.last_seq
    );
    Ok(())
}
