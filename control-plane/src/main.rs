//! `lasthop-control`: the operator's entry point to the control plane.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use lasthop_control::edge::EdgeState;
use lasthop_control::edge_token::EdgeToken;
use lasthop_control::feed::Feed;
use lasthop_control::fleet::Fleet;
use lasthop_control::publish::{PublishConfig, Publisher};
use lasthop_control::store::embedded::CommitObserver;
use lasthop_control::{
    metrics::Metrics, router, ApiConfig, ApiKeys, AppState, EmbeddedStore, EmbeddedStoreConfig,
    Store,
};
use lasthop_core::{CodeScheme, PermutationKey, UrlPolicy};

#[derive(Parser)]
#[command(name = "lasthop-control", version, about = "lasthop control plane")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a new permutation key file (secret; install it on control-plane and PoP hosts).
    Keygen {
        #[arg(long)]
        out: PathBuf,
        /// AES key size: 128 (default, fastest decode at the edge) or 256.
        #[arg(long, default_value_t = 128)]
        bits: usize,
        /// Replace an existing file (every code minted under the old key becomes unreadable).
        #[arg(long)]
        force: bool,
    },
    /// Manage API keys.
    Apikey {
        #[command(subcommand)]
        command: ApikeyCommand,
    },
    /// Serve the API.
    Serve(ServeArgs),
    /// Edge snapshots.
    Snapshot {
        #[command(subcommand)]
        command: SnapshotCommand,
    },
}

#[derive(Subcommand)]
enum SnapshotCommand {
    /// Build a snapshot of every link in the store (run while `serve` is stopped: the store
    /// file has one owner at a time).
    Build {
        #[arg(long, env = "LASTHOP_DATA_DIR")]
        data_dir: PathBuf,
        #[arg(long, env = "LASTHOP_KEY_FILE")]
        key_file: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, env = "LASTHOP_REGIONS", default_value_t = 1)]
        regions: u32,
        /// Counters above a region's mark that an edge still treats as possibly issued.
        #[arg(long, default_value_t = lasthop_core::region::DEFAULT_RESERVE)]
        reserve: u64,
    },
}

#[derive(Subcommand)]
enum ApikeyCommand {
    /// Print a new API key for OWNER (stored hashed; a lost key is replaced, never recovered).
    Create {
        #[arg(long, env = "LASTHOP_DATA_DIR")]
        data_dir: PathBuf,
        #[arg(long)]
        owner: String,
        /// May take down and restore any link.
        #[arg(long)]
        admin: bool,
    },
}

#[derive(Parser)]
struct ServeArgs {
    /// Directory of the store, the API keys file, the edge token (`edge.token`, written on first
    /// start) and published snapshots (`snapshots/`).
    #[arg(long, env = "LASTHOP_DATA_DIR")]
    data_dir: PathBuf,
    /// Permutation key file.
    #[arg(long, env = "LASTHOP_KEY_FILE")]
    key_file: PathBuf,
    /// Public API listener.
    #[arg(long, env = "LASTHOP_API_LISTEN", default_value = "127.0.0.1:8081")]
    api_listen: SocketAddr,
    /// Internal edge listener for engines: origin lookups, the feed, snapshot downloads, status
    /// reports. Requires the edge token; keep it off the public network all the same.
    #[arg(long, env = "LASTHOP_EDGE_LISTEN", default_value = "127.0.0.1:8082")]
    edge_listen: SocketAddr,
    /// Base of every short_url.
    #[arg(
        long,
        env = "LASTHOP_SHORT_BASE",
        default_value = "http://127.0.0.1:8080"
    )]
    short_base: String,
    /// This writer's region and the number of regions.
    #[arg(long, env = "LASTHOP_REGION", default_value_t = 0)]
    region: u32,
    #[arg(long, env = "LASTHOP_REGIONS", default_value_t = 1)]
    regions: u32,
    /// Counters leased at a time.
    #[arg(long, env = "LASTHOP_BLOCK_SIZE", default_value_t = 10_000)]
    block_size: u64,
    /// Creates per second per owner (0: unlimited).
    #[arg(long, env = "LASTHOP_CREATE_RATE", default_value_t = 100.0)]
    create_rate: f64,
    /// Burst of creates per owner.
    #[arg(long, env = "LASTHOP_CREATE_BURST", default_value_t = 1000.0)]
    create_burst: f64,
    /// Longest destination URL in bytes.
    #[arg(long, env = "LASTHOP_MAX_URL_LEN", default_value_t = 4096)]
    max_url_len: usize,
    /// Accept loopback/private/link-local destinations (test set-ups only).
    #[arg(long, env = "LASTHOP_ALLOW_PRIVATE_HOSTS")]
    allow_private_hosts: bool,
    /// Feed heartbeat: the longest silence on an idle feed stream, in milliseconds.
    #[arg(long, env = "LASTHOP_FEED_HEARTBEAT_MS", default_value_t = 1000)]
    feed_heartbeat_ms: u64,
    /// Publish a snapshot at least this often (seconds) when there were changes.
    #[arg(long, env = "LASTHOP_SNAPSHOT_INTERVAL_SECS", default_value_t = 300)]
    snapshot_interval_secs: u64,
    /// Publish a snapshot as soon as more changes than this accumulated since the last one
    /// (the overlay every engine holds in memory until then).
    #[arg(long, env = "LASTHOP_SNAPSHOT_MAX_OVERLAY", default_value_t = 100_000)]
    snapshot_max_overlay: u64,
    /// Counters above a region's mark that snapshots tell edges may still be issued.
    #[arg(long, env = "LASTHOP_RESERVE", default_value_t = lasthop_core::region::DEFAULT_RESERVE)]
    reserve: u64,
    /// Raise `lasthop_edge_lag_alarm` while any engine is more than this many seconds behind.
    #[arg(long, env = "LASTHOP_EDGE_LAG_ALARM_SECS", default_value_t = 30.0)]
    edge_lag_alarm_secs: f64,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Keygen { out, bits, force } => {
            anyhow::ensure!(
                force || !out.exists(),
                "{} exists; pass --force to replace it (codes minted under it become unreadable)",
                out.display()
            );
            anyhow::ensure!(
                matches!(bits, 128 | 192 | 256),
                "--bits must be 128, 192 or 256"
            );
            let key = PermutationKey::generate(bits / 8)?;
            std::fs::write(&out, key.to_file_text())
                .with_context(|| format!("writing {}", out.display()))?;
            restrict_permissions(&out)?;
            println!("wrote {} (key id {:08x})", out.display(), key.id());
            Ok(())
        }
        Command::Apikey {
            command:
                ApikeyCommand::Create {
                    data_dir,
                    owner,
                    admin,
                },
        } => {
            let key = lasthop_control::auth::create_key(&data_dir, &owner, admin)?;
            println!("{key}");
            Ok(())
        }
        Command::Serve(args) => serve(args),
        Command::Snapshot {
            command:
                SnapshotCommand::Build {
                    data_dir,
                    key_file,
                    out,
                    regions,
                    reserve,
                },
        } => {
            let key = PermutationKey::load(&key_file)?;
            let config =
                EmbeddedStoreConfig::new(data_dir.join("links.redb"), CodeScheme::new(&key)?);
            let store = EmbeddedStore::open(config, None)
                .with_context(|| format!("opening the store in {}", data_dir.display()))?;
            let (seq, info) = lasthop_control::snapshot::build_snapshot(
                &store,
                key.id(),
                regions,
                reserve,
                &out,
            )?;
            store.shutdown()?;
            println!("wrote {} (seq {seq}, {info:?})", out.display());
            Ok(())
        }
    }
}

fn restrict_permissions(path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let key = PermutationKey::load(&args.key_file)?;
    let scheme = CodeScheme::new(&key)?;
    let metrics = Metrics::new()?;
    let observer: CommitObserver = {
        let m = metrics.clone();
        Arc::new(move |ops, secs| {
            m.commit_batch.observe(ops as f64);
            m.commit_seconds.observe(secs);
        })
    };
    let mut config = EmbeddedStoreConfig::new(args.data_dir.join("links.redb"), scheme);
    config.region = args.region;
    config.regions = args.regions;
    config.block_size = args.block_size;
    let store = Arc::new(
        EmbeddedStore::open(config, Some(observer))
            .with_context(|| format!("opening the store in {}", args.data_dir.display()))?,
    );
    let api = ApiConfig {
        short_base: args.short_base.trim_end_matches('/').to_string(),
        url_policy: UrlPolicy {
            max_len: args.max_url_len,
            allow_private_hosts: args.allow_private_hosts,
        },
        create_rate: args.create_rate,
        create_burst: args.create_burst,
        edge_lag_alarm_secs: args.edge_lag_alarm_secs,
    };
    // After the store is open: its lock keeps a second `serve` on this data dir from racing us.
    let token = EdgeToken::load_or_create(&args.data_dir)?;
    let dyn_store = Arc::clone(&store) as Arc<dyn Store>;
    let fleet = Arc::new(Fleet::new());
    let publisher = Publisher::new(
        Arc::clone(&dyn_store),
        Arc::clone(&fleet),
        PublishConfig {
            dir: args.data_dir.join("snapshots"),
            key_id: key.id(),
            regions: args.regions,
            reserve: args.reserve,
            interval: Duration::from_secs(args.snapshot_interval_secs.max(1)),
            max_overlay: args.snapshot_max_overlay,
        },
    )?;
    let state = AppState::with_edges(
        Arc::clone(&dyn_store),
        ApiKeys::open(&args.data_dir),
        api,
        metrics,
        Arc::clone(&fleet),
        Some(Arc::clone(&publisher)),
    );
    let heartbeat = Duration::from_millis(args.feed_heartbeat_ms.max(1));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("api")
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.api_listen)
            .await
            .with_context(|| format!("binding {}", args.api_listen))?;
        let edge_listener = tokio::net::TcpListener::bind(args.edge_listen)
            .await
            .with_context(|| format!("binding {}", args.edge_listen))?;
        let addr = listener.local_addr()?;
        let edge_addr = edge_listener.local_addr()?;
        tracing::info!(api = %addr, edge = %edge_addr, key_id = format_args!("{:08x}", key.id()), "control plane serving");
        // Machine-readable lines on stdout, so scripts and tests can use --api-listen :0 and
        // --edge-listen :0. The api line stays first; both go in one write, so a reader that
        // takes only the first line and closes the pipe cannot fail the second.
        {
            use std::io::Write as _;
            let mut out = std::io::stdout().lock();
            out.write_all(
                format!("api listening on http://{addr}\nedge listening on http://{edge_addr}\n")
                    .as_bytes(),
            )?;
            out.flush()?;
        }
        // One shutdown signal drains both listeners, ends feed streams (they never end by
        // themselves, and draining waits for open responses) and stops the publisher.
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            let _ = stop_tx.send(true);
        });
        let feed = Feed::new(Arc::clone(&dyn_store), heartbeat)
            .with_snapshots(publisher.subscribe())
            .with_stop(stop_rx.clone());
        let edge_state = EdgeState::new(dyn_store, token, feed, fleet, Some(Arc::clone(&publisher)));
        tokio::spawn(Arc::clone(&publisher).start(stop_rx.clone()));
        let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
            // An Err means the sender is gone, which only happens after the signal.
            let _ = rx.wait_for(|stop| *stop).await;
        };
        let api = axum::serve(listener, router(state)).with_graceful_shutdown(stopped(stop_rx.clone()));
        let edge = axum::serve(edge_listener, lasthop_control::edge::router(edge_state))
            .with_graceful_shutdown(stopped(stop_rx));
        tokio::try_join!(async { api.await }, async { edge.await })?;
        anyhow::Ok(())
    })?;
    // Requests are drained; hand the unused counter block back.
    store.shutdown()?;
    tracing::info!("stopped cleanly");
    Ok(())
}

async fn shutdown_signal() {
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
}
