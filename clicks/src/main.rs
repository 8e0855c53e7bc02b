//! `lasthop-clicks`: the click pipeline on a host of its own: `process` (the processor, with the
//! archive consumer beside it), `archive`, `recompute`, `synth`. The same commands and flags as
//! `lasthop-control clicks ...`, so a processor host installs only this program.

use clap::{CommandFactory, Parser};
use lasthop_clicks::cli::{run, ClicksCommand};

#[derive(Parser)]
#[command(name = "lasthop-clicks", version, about = "lasthop click pipeline")]
struct Cli {
    #[command(subcommand)]
    command: ClicksCommand,
}

fn main() -> anyhow::Result<()> {
    lasthop_cli::bootstrap::init_tracing();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cli, _file) = lasthop_cli::parse::<Cli>(Cli::command(), argv).unwrap_or_else(|e| e.exit());
    run(cli.command)
}
