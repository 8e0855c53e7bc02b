//! An HTTP/3 load generator for `perf/h3.sh`: quinn (QUIC, rustls on ring) and hyperium's h3
//! over it, on one current-thread tokio runtime (the script pins it to one core), against ADDR
//! for SECS seconds. Three modes:
//!
//! - `requests`: CONNS long-lived connections, each with STREAMS requests in flight (h2load's
//!   `-c`/`-m`): a finished request is replaced at once by the next `GET` of the URL list,
//!   round-robin over all connections; with `--lockstep`, each connection sends its STREAMS
//!   requests together and the next STREAMS once all are answered, as h2load `-m` does over
//!   TCP (one write of M requests, their answers in one read), so they share datagrams;
//! - `full`: CONNS connections in flight, each a full handshake (resumption off), one `GET`,
//!   and a close; a finished one is replaced at once;
//! - `zero-rtt`: the same, each connection resuming with a ticket of its slot's previous
//!   connection and sending its `GET` in 0-RTT (`Connecting::into_0rtt`). The server answers it
//!   in its first flight; the connection then waits for the handshake (quinn's
//!   `ZeroRttAccepted`: whether the server took the early data) and for a fresh ticket (the
//!   server sends its tickets once it has the client's Finished; rustls' server store is single
//!   use, so each resumption spends one; none within 500 ms is a failure), then closes. A
//!   slot's first connection, with no ticket yet, is a full handshake (`full_handshakes=`, which
//!   in `full` mode counts them all).
//!
//! Like `tls_load`, it checks nothing about the certificate (`NoCheck`), so one client core
//! can keep a server core busy; it offers X25519 alone (what the engine and Caddy both take
//! first, no HelloRetryRequest) and ALPN `h3` alone. NAME (default `lh.test`, the name of
//! perf/lib.sh's certificate) is the SNI and every request's `:authority`. Path MTU discovery is
//! off on the client (its probes would be extra packets on every short connection).
//!
//! URLS is a file of one URL path a line (`/CODE`), or of whole URLs as h2load's `-i` takes
//! them (`https://HOST:PORT/CODE`: the path is kept).
//!
//! Prints a final line of `key=value` pairs: `mode`, `alpn` (`h3` when every connection
//! negotiated it), `conns`, `streams`, `secs` (the run's length), `requests` (answers
//! received), `connections` (connections that got their answer), `rate` (answers a second in
//! `requests` mode, connections a second otherwise), `3xx`, `other` (answers that were not a
//! 3xx), `failed` (requests or connections that ended in an error), `full_handshakes`,
//! `zero_rtt` (0-RTT accepted), `zero_rtt_rejected`, `statuses` (`CODE:COUNT,...`). Errors and
//! answers other than 3xx are listed on stderr. Exits 1 when any answer was not a 3xx, anything
//! failed, nothing was answered, or (`zero-rtt`) 0-RTT was never accepted.
//!
//! `cargo run --release -p lasthop-benches --example h3_load -- --addr 127.0.0.1:8443 \
//!    --urls urls --mode requests --conns 64 --streams 10 --secs 8`

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use quinn::crypto::rustls::{HandshakeData, QuicClientConfig};
use quinn::{ClientConfig, Endpoint, TransportConfig, VarInt};
use rustls::client::{
    ClientSessionStore, Resumption, Tls12ClientSessionValue, Tls13ClientSessionValue,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::NamedGroup;
use tokio::sync::Notify;

/// H3_NO_ERROR (RFC 9114 §8.1): how a finished connection is closed.
const H3_NO_ERROR: u32 = 0x100;

/// How long after SECS the run stops waiting for tasks still in flight.
const HARD_DEADLINE: Duration = Duration::from_secs(10);

/// How long a `zero-rtt` connection waits for its ticket before closing without one.
const TICKET_WAIT: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// Long-lived connections, STREAMS requests in flight on each.
    Requests,
    /// A full handshake and one request per connection.
    Full,
    /// A resumption with the request in 0-RTT per connection.
    ZeroRtt,
}

#[derive(Debug, Parser)]
#[command(about = "HTTP/3 load generator (quinn + h3)")]
struct Args {
    /// The server's UDP address.
    #[arg(long)]
    addr: SocketAddr,
    /// The file of URL paths (or h2load-style whole URLs), one a line.
    #[arg(long)]
    urls: PathBuf,
    #[arg(long, value_enum, default_value = "requests")]
    mode: Mode,
    /// Connections (`requests`), or connections in flight (`full`, `zero-rtt`).
    #[arg(long, default_value_t = 64)]
    conns: usize,
    /// Requests in flight per connection (`requests`).
    #[arg(long, default_value_t = 10)]
    streams: usize,
    /// `requests` mode in rounds: each connection sends its STREAMS requests together and
    /// waits for all their answers before the next round (what h2load `-m` does over TCP).
    #[arg(long)]
    lockstep: bool,
    /// Seconds of load.
    #[arg(long, default_value_t = 8)]
    secs: u64,
    /// SNI and `:authority`.
    #[arg(long, default_value = "lh.test")]
    name: String,
}

/// What the run counted (one thread: cells).
#[derive(Debug, Default)]
struct Stats {
    requests: Cell<u64>,
    connections: Cell<u64>,
    redirects: Cell<u64>,
    other: Cell<u64>,
    failed: Cell<u64>,
    full_handshakes: Cell<u64>,
    zero_rtt: Cell<u64>,
    zero_rtt_rejected: Cell<u64>,
    not_h3: Cell<u64>,
    statuses: RefCell<BTreeMap<u16, u64>>,
    errors: RefCell<BTreeMap<String, u64>>,
}

impl Stats {
    fn answer(&self, status: http::StatusCode) {
        self.requests.set(self.requests.get() + 1);
        if status.is_redirection() {
            self.redirects.set(self.redirects.get() + 1);
        } else {
            self.other.set(self.other.get() + 1);
        }
        *self
            .statuses
            .borrow_mut()
            .entry(status.as_u16())
            .or_default() += 1;
    }

    fn fail(&self, what: &str, e: impl std::fmt::Display) {
        self.failed.set(self.failed.get() + 1);
        *self
            .errors
            .borrow_mut()
            .entry(format!("{what}: {e}"))
            .or_default() += 1;
    }

    fn alpn(&self, conn: &quinn::Connection) {
        let h3 = conn
            .handshake_data()
            .and_then(|d| d.downcast::<HandshakeData>().ok())
            .is_some_and(|d| d.protocol.as_deref() == Some(b"h3"));
        if !h3 {
            self.not_h3.set(self.not_h3.get() + 1);
        }
    }
}

/// A slot's TLS 1.3 tickets (rustls' `ClientSessionMemoryCache` keeps them too, but cannot say
/// when one arrives): up to 8, newest last, and a count of those received.
#[derive(Debug, Default)]
struct Tickets {
    tls13: Mutex<Vec<Tls13ClientSessionValue>>,
    kx_hint: Mutex<Option<NamedGroup>>,
    received: AtomicU64,
    arrived: Notify,
}

impl Tickets {
    /// Waits (at most `TICKET_WAIT`) until more than `seen` tickets have been received.
    async fn wait_past(&self, seen: u64) -> bool {
        let wait = async {
            loop {
                let arrived = self.arrived.notified();
                if self.received.load(Ordering::Relaxed) > seen {
                    return;
                }
                arrived.await;
            }
        };
        tokio::time::timeout(TICKET_WAIT, wait).await.is_ok()
    }
}

impl ClientSessionStore for Tickets {
    fn set_kx_hint(&self, _: ServerName<'static>, group: NamedGroup) {
        *self.kx_hint.lock().expect("not poisoned") = Some(group);
    }
    fn kx_hint(&self, _: &ServerName<'_>) -> Option<NamedGroup> {
        *self.kx_hint.lock().expect("not poisoned")
    }
    fn set_tls12_session(&self, _: ServerName<'static>, _: Tls12ClientSessionValue) {}
    fn tls12_session(&self, _: &ServerName<'_>) -> Option<Tls12ClientSessionValue> {
        None
    }
    fn remove_tls12_session(&self, _: &ServerName<'static>) {}
    fn insert_tls13_ticket(&self, _: ServerName<'static>, value: Tls13ClientSessionValue) {
        let mut tickets = self.tls13.lock().expect("not poisoned");
        if tickets.len() == 8 {
            tickets.remove(0);
        }
        tickets.push(value);
        drop(tickets);
        self.received.fetch_add(1, Ordering::Relaxed);
        self.arrived.notify_one();
    }
    fn take_tls13_ticket(&self, _: &ServerName<'static>) -> Option<Tls13ClientSessionValue> {
        self.tls13.lock().expect("not poisoned").pop()
    }
}

/// What every task shares.
struct Load {
    endpoint: Endpoint,
    addr: SocketAddr,
    name: String,
    uris: Vec<http::Uri>,
    next: Cell<usize>,
    until: Instant,
    stats: Stats,
}

impl Load {
    fn next_request(&self) -> http::Request<()> {
        let i = self.next.get();
        self.next.set((i + 1) % self.uris.len());
        http::Request::get(self.uris[i].clone())
            .body(())
            .expect("a GET of a valid URI")
    }

    fn running(&self) -> bool {
        Instant::now() < self.until
    }
}

type Err = Box<dyn std::error::Error>;

/// One request on an h3 connection: its status, the body read to its end.
async fn get<T>(
    send: &mut h3::client::SendRequest<T, Bytes>,
    req: http::Request<()>,
) -> Result<http::StatusCode, Err>
where
    T: h3::quic::OpenStreams<Bytes>,
{
    let mut stream = send.send_request(req).await?;
    stream.finish().await?;
    let status = stream.recv_response().await?.status();
    while stream.recv_data().await?.is_some() {}
    Ok(status)
}

/// `requests --lockstep`: rounds of `streams` requests on one connection, all written in one
/// poll of this task (so quinn's driver, woken once, sends them together), the next round once
/// every answer of this one is in. Stops at the first failure.
async fn rounds<T>(load: Rc<Load>, send: h3::client::SendRequest<T, Bytes>, streams: usize)
where
    T: h3::quic::OpenStreams<Bytes> + Clone + 'static,
{
    type Get = Pin<Box<dyn Future<Output = Result<http::StatusCode, Err>>>>;
    while load.running() {
        let mut round: Vec<Option<Get>> = (0..streams)
            .map(|_| {
                let mut send = send.clone();
                let req = load.next_request();
                Some(Box::pin(async move { get(&mut send, req).await }) as Get)
            })
            .collect();
        let mut failed = false;
        poll_fn(|cx| {
            let mut pending = false;
            for slot in round.iter_mut() {
                let Some(fut) = slot else { continue };
                match fut.as_mut().poll(cx) {
                    Poll::Ready(Ok(status)) => {
                        load.stats.answer(status);
                        *slot = None;
                    }
                    Poll::Ready(Err(e)) => {
                        load.stats.fail("request", e);
                        failed = true;
                        *slot = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
            if pending {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        })
        .await;
        if failed {
            return;
        }
    }
}

/// `requests` mode: one long-lived connection, `streams` requests in flight until the end
/// (each replaced as it finishes, or in rounds with `lockstep`).
async fn long_lived(load: Rc<Load>, config: ClientConfig, streams: usize, lockstep: bool) {
    let connecting = match load.endpoint.connect_with(config, load.addr, &load.name) {
        Ok(c) => c,
        Err(e) => return load.stats.fail("connect", e),
    };
    let conn = match connecting.await {
        Ok(c) => c,
        Err(e) => return load.stats.fail("connect", e),
    };
    load.stats.connections.set(load.stats.connections.get() + 1);
    load.stats.alpn(&conn);
    let (mut driver, send) = match h3::client::new(h3_quinn::Connection::new(conn.clone())).await {
        Ok(h) => h,
        Err(e) => return load.stats.fail("h3 setup", e),
    };
    let workers: Vec<_> = (0..if lockstep { 0 } else { streams })
        .map(|_| {
            let load = Rc::clone(&load);
            let mut send = send.clone();
            tokio::task::spawn_local(async move {
                while load.running() {
                    let req = load.next_request();
                    match get(&mut send, req).await {
                        Ok(status) => load.stats.answer(status),
                        Err(e) => {
                            load.stats.fail("request", e);
                            return;
                        }
                    }
                }
            })
        })
        .collect();
    let lockstep = lockstep.then(|| {
        let load = Rc::clone(&load);
        tokio::task::spawn_local(rounds(load, send.clone(), streams))
    });
    drop(send);
    let workers = async {
        for w in workers.into_iter().chain(lockstep) {
            w.await.expect("a request task");
        }
    };
    // h3 closes the connection (H3_NO_ERROR) once the last request task drops its sender, and
    // its driver then ends: anything else is a failure.
    let driver = async {
        let e = poll_fn(|cx| driver.poll_close(cx)).await;
        if !e.is_h3_no_error() {
            load.stats.fail("connection", e);
        }
    };
    // The driver runs beside the requests; it has until 5 s after the run's end to close.
    let close_by = tokio::time::Instant::from_std(load.until + Duration::from_secs(5));
    let ((), ended) = tokio::join!(workers, async {
        tokio::time::timeout_at(close_by, driver).await
    });
    if ended.is_err() {
        load.stats.fail("connection", "did not close");
    }
    conn.close(VarInt::from_u32(H3_NO_ERROR), b"");
}

/// `full` and `zero-rtt` modes: one slot's connections, one after another, until the end.
async fn slot(load: Rc<Load>, config: ClientConfig, tickets: Option<Arc<Tickets>>) {
    while load.running() {
        if let Err(e) = one_connection(&load, config.clone(), tickets.as_deref()).await {
            load.stats.fail("connection", e);
        }
    }
}

/// A connection (resumed with 0-RTT if `tickets` has one), one GET, its answer, and a close.
async fn one_connection(
    load: &Load,
    config: ClientConfig,
    tickets: Option<&Tickets>,
) -> Result<(), Err> {
    let seen = tickets.map(|t| t.received.load(Ordering::Relaxed));
    let connecting = load.endpoint.connect_with(config, load.addr, &load.name)?;
    // `into_0rtt` fails only without a ticket: then a full handshake.
    let attempt = match tickets {
        Some(_) => connecting.into_0rtt(),
        None => Err(connecting),
    };
    let (conn, accepted) = match attempt {
        Ok((conn, accepted)) => (conn, Some(accepted)),
        Err(connecting) => {
            let full = &load.stats.full_handshakes;
            full.set(full.get() + 1);
            (connecting.await?, None)
        }
    };
    let result = async {
        let (mut driver, mut send) =
            h3::client::new(h3_quinn::Connection::new(conn.clone())).await?;
        let req = load.next_request();
        let status = tokio::select! {
            s = get(&mut send, req) => s?,
            e = poll_fn(|cx| driver.poll_close(cx)) => return Err(Box::new(e) as Err),
        };
        load.stats.answer(status);
        if let Some(accepted) = accepted {
            if accepted.await {
                load.stats.zero_rtt.set(load.stats.zero_rtt.get() + 1);
            } else {
                load.stats
                    .zero_rtt_rejected
                    .set(load.stats.zero_rtt_rejected.get() + 1);
            }
        }
        if let (Some(tickets), Some(seen)) = (tickets, seen) {
            if !tickets.wait_past(seen).await {
                return Err("no session ticket within 500 ms".into());
            }
        }
        Ok(())
    }
    .await;
    if result.is_ok() {
        load.stats.connections.set(load.stats.connections.get() + 1);
        load.stats.alpn(&conn);
    }
    conn.close(VarInt::from_u32(H3_NO_ERROR), b"");
    result
}

/// `https://NAME` + each path of the file (whole URLs keep their path).
fn read_uris(path: &PathBuf, name: &str) -> std::io::Result<Vec<http::Uri>> {
    let text = std::fs::read_to_string(path)?;
    let mut uris = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = match line.split_once("://") {
            Some((_, rest)) => rest.find('/').map_or("/", |i| &rest[i..]),
            None => line,
        };
        let uri = format!("https://{name}{path}")
            .parse()
            .map_err(|e| std::io::Error::other(format!("{line}: {e}")))?;
        uris.push(uri);
    }
    Ok(uris)
}

fn client_config(tickets: Option<Arc<Tickets>>) -> ClientConfig {
    let provider = Arc::new(CryptoProvider {
        kx_groups: vec![rustls::crypto::ring::kx_group::X25519],
        ..rustls::crypto::ring::default_provider()
    });
    let mut tls = lasthop_benches::NoCheck::tls13_client(provider, b"h3");
    match tickets {
        Some(store) => {
            tls.resumption = Resumption::store(store);
            tls.enable_early_data = true;
        }
        None => tls.resumption = Resumption::disabled(),
    }
    let quic = QuicClientConfig::try_from(tls).expect("a QUIC-capable TLS configuration");
    let mut transport = TransportConfig::default();
    transport.mtu_discovery_config(None);
    // A server that never answers fails the connection after this, not quinn's 30 s.
    transport.max_idle_timeout(Duration::from_secs(5).try_into().ok());
    let mut config = ClientConfig::new(Arc::new(quic));
    config.transport_config(Arc::new(transport));
    config
}

fn main() {
    let args = Args::parse();
    let uris = match read_uris(&args.urls, &args.name) {
        Ok(u) if !u.is_empty() => u,
        Ok(_) => {
            eprintln!("h3_load: no URLs in {}", args.urls.display());
            std::process::exit(2);
        }
        Err(e) => {
            eprintln!("h3_load: {}: {e}", args.urls.display());
            std::process::exit(2);
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let local = tokio::task::LocalSet::new();
    let (load, elapsed) = local.block_on(&runtime, async {
        let bind: SocketAddr = if args.addr.is_ipv4() {
            "0.0.0.0:0"
        } else {
            "[::]:0"
        }
        .parse()
        .expect("an address");
        let endpoint = Endpoint::client(bind).expect("a UDP socket");
        let start = Instant::now();
        let load = Rc::new(Load {
            endpoint,
            addr: args.addr,
            name: args.name.clone(),
            uris,
            next: Cell::new(0),
            until: start + Duration::from_secs(args.secs),
            stats: Stats::default(),
        });
        let mut tasks = Vec::new();
        for _ in 0..args.conns.max(1) {
            let load = Rc::clone(&load);
            tasks.push(match args.mode {
                Mode::Requests => tokio::task::spawn_local(long_lived(
                    load,
                    client_config(None),
                    args.streams.max(1),
                    args.lockstep,
                )),
                Mode::Full => tokio::task::spawn_local(slot(load, client_config(None), None)),
                Mode::ZeroRtt => {
                    let tickets = Arc::new(Tickets::default());
                    let config = client_config(Some(Arc::clone(&tickets)));
                    tokio::task::spawn_local(slot(load, config, Some(tickets)))
                }
            });
        }
        // Bounded: a task still waiting this long after the end is abandoned, and counted.
        let hard = load.until + HARD_DEADLINE;
        for t in tasks {
            match tokio::time::timeout_at(hard.into(), t).await {
                Ok(done) => done.expect("a load task"),
                Err(_) => load.stats.fail("run", "still running 10 s after the end"),
            }
        }
        let elapsed = start.elapsed();
        // Let the closes go out.
        let _ = tokio::time::timeout(Duration::from_secs(2), load.endpoint.wait_idle()).await;
        (load, elapsed)
    });
    let s = &load.stats;
    let secs = elapsed.as_secs_f64();
    let done = if args.mode == Mode::Requests {
        s.requests.get()
    } else {
        s.connections.get()
    };
    let statuses = s
        .statuses
        .borrow()
        .iter()
        .map(|(c, n)| format!("{c}:{n}"))
        .collect::<Vec<_>>()
        .join(",");
    for (e, n) in s.errors.borrow().iter() {
        eprintln!("h3_load: {n} x {e}");
    }
    let mode = match args.mode {
        Mode::Requests => "requests",
        Mode::Full => "full",
        Mode::ZeroRtt => "zero-rtt",
    };
    println!(
        "mode={mode} alpn={} conns={} streams={} secs={secs:.2} requests={} connections={} \
         rate={:.0} 3xx={} other={} failed={} full_handshakes={} zero_rtt={} \
         zero_rtt_rejected={} statuses={}",
        if s.not_h3.get() == 0 && s.connections.get() > 0 {
            "h3"
        } else {
            "other"
        },
        args.conns,
        if args.mode == Mode::Requests {
            args.streams
        } else {
            1
        },
        s.requests.get(),
        s.connections.get(),
        done as f64 / secs,
        s.redirects.get(),
        s.other.get(),
        s.failed.get(),
        s.full_handshakes.get(),
        s.zero_rtt.get(),
        s.zero_rtt_rejected.get(),
        if statuses.is_empty() {
            "none"
        } else {
            &statuses
        },
    );
    let mut bad = Vec::new();
    if s.redirects.get() == 0 {
        bad.push("no 3xx answer".to_string());
    }
    if s.other.get() > 0 {
        bad.push(format!("{} answers not a 3xx ({statuses})", s.other.get()));
    }
    if s.failed.get() > 0 {
        bad.push(format!("{} failed", s.failed.get()));
    }
    if s.not_h3.get() > 0 {
        bad.push(format!("{} connections without ALPN h3", s.not_h3.get()));
    }
    if args.mode == Mode::ZeroRtt && s.zero_rtt.get() == 0 {
        bad.push("0-RTT never accepted".to_string());
    }
    if !bad.is_empty() {
        eprintln!("h3_load: {}", bad.join("; "));
        std::process::exit(1);
    }
}
