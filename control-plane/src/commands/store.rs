//! `lasthop-control store find-text`: where a text appears in the record (an erasure audit).

use crate::cli::StoreArgs;

pub(crate) fn find_text(store: &StoreArgs, text: &str) -> anyhow::Result<()> {
    let (_, store) = store.open()?;
    for (table, rows) in store.find_text(text)? {
        println!("{table}\t{rows}");
    }
    store.shutdown()?;
    Ok(())
}
