//! `lasthop-control`: the operator's entry point to the control plane.
//!
//! The binary's own modules: `cli` (every subcommand's flags), `commands/` (one file a
//! subcommand) and `serve` (the server's composition root: every service built once, in order,
//! and handed to the listeners). What they call is the `lasthop_control` library beside them.

mod cli;
mod commands;
mod serve;

use clap::CommandFactory;

use cli::{Cli, Command, SnapshotCommand, StoreCommand};

fn main() -> anyhow::Result<()> {
    lasthop_cli::bootstrap::init_tracing();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (cli, file) =
        lasthop_cli::parse::<Cli>(Cli::command(), argv.clone()).unwrap_or_else(|e| e.exit());
    match cli.command {
        Command::Generate { dir } => commands::generate::run(&dir),
        Command::Serve(args) if args.check_config => {
            lasthop_cli::bootstrap::answer_check("lasthop-control", serve::check(&args))
        }
        Command::Serve(args) => serve::run(*args, serve::ConfigReload { argv, file }),
        Command::Keygen {
            out,
            force,
            signing: true,
            ..
        } => commands::keygen::signing(&out, force),
        Command::Keygen {
            out, bits, force, ..
        } => commands::keygen::permutation(&out, bits, force),
        Command::Apikey { command } => commands::apikey::run(command),
        Command::Snapshot {
            command:
                SnapshotCommand::Build {
                    store,
                    out,
                    reserve,
                    hot,
                    clicks_store,
                    clicks_store_ca,
                    budget,
                },
        } => {
            let clicks_store = clicks_store
                .with_ca(clicks_store_ca)
                .map_err(anyhow::Error::msg)?;
            commands::snapshot::build(&store, &out, reserve, hot, &clicks_store, budget)
        }
        Command::Clicks { command } => lasthop_clicks::cli::run(*command),
        Command::Store {
            command: StoreCommand::FindText { store, text },
        } => commands::store::find_text(&store, &text),
        Command::Export { store, out } => commands::export::run(&store, out.as_ref()),
        Command::Import { store, input } => commands::import::run(&store, input.as_ref()),
        Command::Migrate { store } => commands::migrate::run(&store),
        Command::Links { command } => commands::links::run(command),
    }
}
