//! What every program (`lasthop-engine`, `lasthop-control`, `lasthop-clicks`) does at start and
//! at stop: the log set-up and sd-notify (the `bootstrap` feature); with `shutdown`, the
//! shutdown signal (SIGTERM or SIGINT, told to systemd) on tokio, for the control-plane
//! programs. The engine takes its signals synchronously on its control thread, without tokio.

/// What [`notify`] tells systemd (`Ready`, `Reloading`, `Stopping`, ...).
pub use sd_notify::NotifyState;

/// Logs to stderr at `RUST_LOG`'s levels (default `info`), coloured only for a terminal: log
/// files and the journal get plain text.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// `--check-config`'s answer, the same for every program: `<program>: configuration OK` on
/// stdout and exit 0, or `<program>: configuration invalid: <why>` (the whole cause chain) on
/// stderr and exit 1.
pub fn answer_check<E: std::fmt::Display>(program: &str, checked: Result<(), E>) -> ! {
    match checked {
        Ok(()) => {
            println!("{program}: configuration OK");
            std::process::exit(0)
        }
        Err(e) => {
            eprintln!("{program}: configuration invalid: {e:#}");
            std::process::exit(1)
        }
    }
}

/// Tells systemd (where it supervises the process) `state`; a failure is logged at debug.
pub fn notify(state: &[sd_notify::NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::debug!(error = %e, "sd_notify");
    }
}

/// Resolves on SIGTERM or SIGINT, having told systemd the process is stopping.
#[cfg(feature = "shutdown")]
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            std::future::pending::<()>().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: draining"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: draining"),
    }
    notify(&[sd_notify::NotifyState::Stopping]);
}

/// Calls `stop` from a thread of its own once [`shutdown_signal`] resolves: for programs whose
/// work runs on blocking threads.
#[cfg(feature = "shutdown")]
pub fn on_shutdown_signal(stop: impl FnOnce() + Send + 'static) {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            rt.block_on(shutdown_signal());
        }
        stop();
    });
}
