//! `lasthop-engine`: the edge redirect server PoP operators run. Flags are [`config`]'s, read
//! through `lasthop_cli` so a `--config` file sits under them; starting, serving and draining
//! are [`engine`]'s.

use clap::CommandFactory;
use lasthop_engine::io::signals;

mod config;
mod engine;

/// mimalloc, not glibc's malloc: quinn-proto allocates per QUIC stream, and glibc's malloc and
/// free were 13.5 % of the engine's HTTP/3 CPU (`engine/DESIGN.md`, HTTP/3, per server
/// CPU-second).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    // Before any thread exists, so every thread inherits the mask and only the control thread
    // (this one) takes SIGHUP/SIGTERM.
    signals::block()?;
    lasthop_cli::bootstrap::init_tracing();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let (args, file) = lasthop_cli::parse::<config::Args>(config::Args::command(), argv.clone())
        .unwrap_or_else(|e| e.exit());
    if let Some(dir) = &args.generate {
        let cmd = config::Args::command();
        for path in lasthop_cli::generate(cmd.clone(), &cmd, dir)? {
            println!("{}", path.display());
        }
        return Ok(());
    }
    if args.check_config {
        lasthop_cli::bootstrap::answer_check("lasthop-engine", engine::check(&args));
    }
    engine::run(args, engine::Reloads { argv, file })
}
