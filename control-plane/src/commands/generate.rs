//! `lasthop-control generate DIR` (hidden): man pages, shell completions and `serve`'s example
//! config for `scripts/package`.

use std::path::Path;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::Cli;

pub(crate) fn run(dir: &Path) -> anyhow::Result<()> {
    let cmd = Cli::command();
    let serve = cmd
        .find_subcommand("serve")
        .cloned()
        .context("the serve subcommand")?;
    for path in lasthop_cli::generate(cmd, &serve, dir)? {
        println!("{}", path.display());
    }
    Ok(())
}
