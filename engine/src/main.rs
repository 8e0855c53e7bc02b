//! `lasthop-engine`: the edge redirect server PoP operators run. Flags are [`config`]'s;
//! starting, serving and draining are [`engine`]'s.

use clap::Parser;
use lasthop_engine::io::signals;

mod config;
mod engine;

fn main() -> anyhow::Result<()> {
    // Before any thread exists, so every thread inherits the mask and only the control thread
    // (this one) takes SIGHUP/SIGTERM.
    signals::block()?;
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only for a terminal: log files and the journal get plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = config::Args::parse();
    engine::run(args)
}
