//! Click recording: every answered redirect becomes a [`ClickEvent`] in its core's buffer, and a
//! flusher thread hands the buffers to a sink (the spool or Kafka) off the serving cores.
//!
//! The request path pays for building and encoding one event (~0.2 µs: a SipHash of address and
//! user agent, a few copies; [`lasthop_edge::click`]) and an uncontended lock on its own core's
//! buffer; it never waits on the sink. The lock is held by the flusher only for a `Vec` swap. A
//! full buffer drops the event and counts it; so does a failing sink. Analytics are lossy by design
//! (docs/ARCHITECTURE.md, "Overview": click counts may be approximate and late), redirects are not.
//!
//! What leaves the edge is in `core/EVENTS.md`. The client address does not: the event carries a
//! keyed hash of address and user agent under a salt that changes every UTC day (so one visitor
//! cannot be followed from day to day in the data at rest), and the address's /24 or /48.

use std::cell::RefCell;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lasthop_core::click::{Net, MAX_EVENT_LEN};
use lasthop_edge::click::{self, ClickBuilder};
use lasthop_edge::session::How;
use sha2::{Digest, Sha256};

use crate::http::Request;
use crate::metrics::prom::{family, sample};

#[cfg(feature = "kafka")]
pub mod kafka;
pub mod spool;

/// What every core's recorder shares.
#[derive(Debug)]
pub struct ClickSettings {
    /// This engine's PoP, carried in every event.
    pub pop: String,
    /// Secret from which each day's visitor salt derives (same on every engine, so one visitor
    /// counts once across PoPs).
    pub visitor_key: [u8; 32],
    /// Country lookup by address, when a MaxMind database is configured.
    pub geo: Option<Geo>,
    /// Bytes of encoded events a core may hold between flushes.
    pub buffer_bytes: usize,
}

/// Why click recording could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClickSetupError {
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} must hold at least 32 bytes (hex or raw)", path.display())]
    ShortKey { path: PathBuf },
    /// Others can read or write the visitor key file.
    #[error("visitor key {0}")]
    Loose(lasthop_core::secret::SecretError),
    #[error("no randomness for the visitor key: {0}")]
    Random(getrandom::Error),
    #[error("opening GeoIP database {}: {source}", path.display())]
    Geo {
        path: PathBuf,
        source: maxminddb::MaxMindDbError,
    },
    #[cfg(feature = "kafka")]
    #[error("creating the Kafka producer: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
}

fn io_err<'a>(
    op: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> ClickSetupError + 'a {
    move |source| ClickSetupError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// The visitor key: from `file` (32+ bytes, hex or raw), created there (random, mode 0600) if it
/// does not exist yet.
///
/// Whoever holds this key can recover a visitor's address from an archived event (the event
/// carries the /24, so 256 guesses), so it is as sensitive as the addresses themselves: it lives
/// on edge hosts only, never beside the archive (which is why it is not derived from the edge
/// token, which the control plane holds). Give every engine of a fleet the same file so one
/// visitor counts once across PoPs; an engine with a key of its own still counts correctly
/// within itself.
pub fn visitor_key(file: &Path) -> Result<[u8; 32], ClickSetupError> {
    let raw = match std::fs::read(file) {
        Ok(raw) => {
            lasthop_core::secret::refuse_loose(file).map_err(ClickSetupError::Loose)?;
            raw
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let random = random_visitor_key()?;
            let text = format!("{}\n", hex::encode(random));
            if let Some(dir) = file.parent() {
                std::fs::create_dir_all(dir).map_err(io_err("creating", dir))?;
            }
            let mut f = {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(file)
                    .map_err(io_err("creating", file))?
            };
            std::io::Write::write_all(&mut f, text.as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(io_err("writing", file))?;
            tracing::info!(file = %file.display(), "created a visitor key (copy it to every engine of the fleet)");
            text.into_bytes()
        }
        Err(e) => return Err(io_err("reading", file)(e)),
    };
    let text = String::from_utf8_lossy(&raw);
    let bytes = hex::decode(text.trim()).unwrap_or(raw);
    if bytes.len() < 32 {
        return Err(ClickSetupError::ShortKey {
            path: file.to_path_buf(),
        });
    }
    let mut h = Sha256::new();
    h.update(b"lasthop visitor key v1\0");
    h.update(&bytes);
    Ok(h.finalize().into())
}

/// A visitor key of this process alone.
pub fn random_visitor_key() -> Result<[u8; 32], ClickSetupError> {
    let mut random = [0u8; 32];
    getrandom::getrandom(&mut random).map_err(ClickSetupError::Random)?;
    Ok(random)
}

/// A MaxMind-format (GeoIP2/GeoLite2 Country or City) database.
pub struct Geo {
    reader: maxminddb::Reader<Vec<u8>>,
}

impl std::fmt::Debug for Geo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Geo").finish_non_exhaustive()
    }
}

impl Geo {
    /// Opens and checks a database file.
    pub fn open(path: &Path) -> Result<Geo, ClickSetupError> {
        let reader =
            maxminddb::Reader::open_readfile(path).map_err(|source| ClickSetupError::Geo {
                path: path.to_path_buf(),
                source,
            })?;
        Ok(Geo { reader })
    }

    /// The ISO country of `ip`, if the database knows it.
    pub fn country(&self, ip: IpAddr) -> Option<[u8; 2]> {
        let found = self.reader.lookup(ip).ok()?;
        let path = [
            maxminddb::PathElement::Key("country"),
            maxminddb::PathElement::Key("iso_code"),
        ];
        let code: &str = found.decode_path(&path).ok()??;
        click::iso_country(code.as_bytes())
    }
}

/// Events encoded back to back, waiting for the flusher.
#[derive(Debug, Default)]
struct Batch {
    bytes: Vec<u8>,
    count: u32,
}

/// One core's buffer and its counters (written by that core only, so no line is shared).
#[derive(Debug, Default)]
pub struct CoreBuffer {
    batch: Mutex<Batch>,
    recorded: AtomicU64,
    dropped_full: AtomicU64,
    no_peer: AtomicU64,
}

/// Counters of the flusher and its sink.
#[derive(Debug, Default)]
pub struct SinkStats {
    /// Events the sink took (spool: written; Kafka: acknowledged by the broker).
    pub sent: AtomicU64,
    /// Events lost at or after the sink (write error, Kafka queue full or delivery failed).
    pub dropped: AtomicU64,
    /// Sink errors (each may cover many events).
    pub errors: AtomicU64,
    /// 1 while the sink's last operation worked.
    pub up: AtomicU64,
    /// Batches handed to the sink.
    pub flushes: AtomicU64,
}

impl SinkStats {
    /// Counts events taken.
    pub fn sent(&self, n: u64) {
        self.sent.fetch_add(n, Ordering::Relaxed);
        self.up.store(1, Ordering::Relaxed);
    }

    /// Counts events lost to a sink failure.
    pub fn failed(&self, n: u64) {
        self.dropped.fetch_add(n, Ordering::Relaxed);
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.up.store(0, Ordering::Relaxed);
    }
}

/// A destination for batches of encoded events.
pub trait Sink: Send {
    /// Takes one batch: `count` events back to back in `events`. Never blocks for long; on
    /// failure it counts the loss in `stats`.
    fn send(&mut self, events: &[u8], count: u32, stats: &SinkStats);
    /// Called after every round of batches (fsync, roll, poll).
    fn tick(&mut self, stats: &SinkStats);
    /// Called once at shutdown: make what was taken durable or delivered, within a bound.
    fn close(&mut self, stats: &SinkStats);
    /// A name for logs and metrics.
    fn kind(&self) -> &'static str;
}

/// The process's click recording: per-core buffers, their settings and counters.
#[derive(Debug)]
pub struct Clicks {
    settings: Arc<ClickSettings>,
    buffers: Vec<Arc<CoreBuffer>>,
    /// The sink's counters.
    pub sink: Arc<SinkStats>,
    sink_kind: Mutex<&'static str>,
}

impl Clicks {
    /// Buffers for `cores` serving cores.
    pub fn new(cores: usize, settings: ClickSettings) -> Arc<Clicks> {
        let presized = || {
            Arc::new(CoreBuffer {
                batch: Mutex::new(Batch {
                    bytes: Vec::with_capacity(settings.buffer_bytes),
                    count: 0,
                }),
                ..CoreBuffer::default()
            })
        };
        let buffers = (0..cores).map(|_| presized()).collect();
        Arc::new(Clicks {
            settings: Arc::new(settings),
            buffers,
            sink: Arc::default(),
            sink_kind: Mutex::new("none"),
        })
    }

    /// The recorder core `core` keeps in its context.
    pub fn recorder(&self, core: usize) -> Option<Recorder> {
        let buf = Arc::clone(self.buffers.get(core)?);
        let mut nonce = [0u8; 8];
        // A weak nonce only risks colliding ids, which dedup would then merge; never fatal.
        if getrandom::getrandom(&mut nonce).is_err() {
            nonce = (std::process::id() as u64 ^ (core as u64) << 32).to_le_bytes();
        }
        Some(Recorder {
            buf,
            settings: Arc::clone(&self.settings),
            builder: RefCell::new(ClickBuilder::new(
                self.settings.visitor_key,
                u64::from_le_bytes(nonce),
            )),
            geo_cache: RefCell::new(hashbrown::HashMap::new()),
        })
    }

    /// Takes every core's pending batch (swapping in `spare` buffers to keep allocations).
    fn drain(&self, out: &mut Vec<(Vec<u8>, u32)>, spare: &mut Vec<Vec<u8>>) {
        for b in &self.buffers {
            let Ok(mut batch) = b.batch.lock() else {
                continue;
            };
            if batch.count == 0 {
                continue;
            }
            // Full size up front: a buffer that grew by doubling would copy megabytes under the
            // lock, on a redirect.
            let fresh = spare
                .pop()
                .unwrap_or_else(|| Vec::with_capacity(self.settings.buffer_bytes));
            let bytes = std::mem::replace(&mut batch.bytes, fresh);
            let count = std::mem::take(&mut batch.count);
            drop(batch);
            out.push((bytes, count));
        }
    }

    /// Starts the flusher thread: every `every`, the cores' batches go to `sink`.
    pub fn start(self: &Arc<Self>, mut sink: Box<dyn Sink>, every: Duration) -> Flusher {
        if let Ok(mut k) = self.sink_kind.lock() {
            *k = sink.kind();
        }
        let stop = Arc::new(AtomicBool::new(false));
        let clicks = Arc::clone(self);
        let stopping = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("lasthop-clicks".into())
            .spawn(move || {
                let mut batches = Vec::new();
                let mut spare = Vec::new();
                loop {
                    let started = Instant::now();
                    let last = stopping.load(Ordering::Acquire);
                    clicks.drain(&mut batches, &mut spare);
                    for (mut bytes, count) in batches.drain(..) {
                        sink.send(&bytes, count, &clicks.sink);
                        clicks.sink.flushes.fetch_add(1, Ordering::Relaxed);
                        bytes.clear();
                        spare.push(bytes);
                    }
                    sink.tick(&clicks.sink);
                    if last {
                        sink.close(&clicks.sink);
                        return;
                    }
                    if let Some(rest) = every.checked_sub(started.elapsed()) {
                        std::thread::park_timeout(rest);
                    }
                }
            })
            .map_err(|e| {
                tracing::error!(error = %e, "no click flusher thread: click events will be dropped and counted")
            })
            .ok();
        Flusher { stop, handle }
    }

    /// Appends the click metrics.
    pub fn render(&self, out: &mut String) {
        let sum = |f: fn(&CoreBuffer) -> &AtomicU64| {
            self.buffers
                .iter()
                .map(|b| f(b).load(Ordering::Relaxed))
                .fold(0u64, u64::wrapping_add)
        };
        family(
            out,
            "lasthop_engine_clicks_recorded_total",
            "counter",
            "Click events recorded into the per-core buffers.",
        );
        sample(
            out,
            "lasthop_engine_clicks_recorded_total",
            "",
            sum(|b| &b.recorded),
        );
        family(
            out,
            "lasthop_engine_clicks_dropped_total",
            "counter",
            "Click events lost: buffer full (the sink fell behind) or sink failure.",
        );
        sample(
            out,
            "lasthop_engine_clicks_dropped_total",
            "reason=\"buffer_full\"",
            sum(|b| &b.dropped_full),
        );
        sample(
            out,
            "lasthop_engine_clicks_dropped_total",
            "reason=\"sink\"",
            self.sink.dropped.load(Ordering::Relaxed),
        );
        family(
            out,
            "lasthop_engine_clicks_without_peer_total",
            "counter",
            "Click events recorded before the connection's peer address was known.",
        );
        sample(
            out,
            "lasthop_engine_clicks_without_peer_total",
            "",
            sum(|b| &b.no_peer),
        );
        let kind = self.sink_kind.lock().map(|k| *k).unwrap_or("none");
        family(
            out,
            "lasthop_engine_clicks_sent_total",
            "counter",
            "Click events the sink took (spool: written; kafka: acknowledged).",
        );
        sample(
            out,
            "lasthop_engine_clicks_sent_total",
            &format!("sink=\"{kind}\""),
            self.sink.sent.load(Ordering::Relaxed),
        );
        family(
            out,
            "lasthop_engine_clicks_sink_errors_total",
            "counter",
            "Sink failures (each may lose a batch).",
        );
        sample(
            out,
            "lasthop_engine_clicks_sink_errors_total",
            "",
            self.sink.errors.load(Ordering::Relaxed),
        );
        family(
            out,
            "lasthop_engine_clicks_sink_up",
            "gauge",
            "1 while the sink's last operation worked.",
        );
        sample(
            out,
            "lasthop_engine_clicks_sink_up",
            "",
            self.sink.up.load(Ordering::Relaxed),
        );
    }
}

/// The flusher thread; [`stop`](Self::stop) flushes what is left and closes the sink.
#[derive(Debug)]
pub struct Flusher {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Flusher {
    /// Last flush, sink close, join.
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}

/// A core's handle on its buffer: builds and encodes events on the request path (the event
/// itself is [`lasthop_edge::click`]'s; this adds the GeoIP lookup and the buffer).
#[derive(Debug)]
pub struct Recorder {
    buf: Arc<CoreBuffer>,
    settings: Arc<ClickSettings>,
    builder: RefCell<ClickBuilder>,
    /// Country by network, so the database is walked once per /24 (or /48) per core.
    geo_cache: RefCell<hashbrown::HashMap<Net, Option<[u8; 2]>>>,
}

/// Networks a core remembers the country of before it starts over.
const GEO_CACHE: usize = 65_536;

impl Recorder {
    /// The country of `peer` from the GeoIP database, if one is configured.
    fn country(&self, peer: Option<IpAddr>) -> Option<[u8; 2]> {
        let (geo, ip) = (self.settings.geo.as_ref()?, peer?);
        let net = Net::of(ip);
        let mut cache = self.geo_cache.try_borrow_mut().ok()?;
        if let Some(c) = cache.get(&net) {
            return *c;
        }
        if cache.len() >= GEO_CACHE {
            cache.clear();
        }
        let c = geo.country(ip);
        cache.insert(net, c);
        c
    }

    /// Records one answered redirect of `code` on `domain` (never blocks; a full buffer drops
    /// and counts). `domain` is the branded domain as the link's key has it, empty for the
    /// default domain ([`ClickBuilder::encode`]; an ill-shaped one records nothing).
    pub fn record(
        &self,
        req: &Request<'_>,
        code: &[u8],
        domain: &[u8],
        peer: Option<IpAddr>,
        how: How,
        now_ms: i64,
    ) {
        let peer = peer.map(click::unmapped);
        if peer.is_none() {
            self.buf.no_peer.fetch_add(1, Ordering::Relaxed);
        }
        // A trusted country header wins over the database (the builder prefers it).
        let country = if req.country.is_empty() {
            self.country(peer)
        } else {
            None
        };
        let from = click::Origin {
            peer,
            country,
            https: how.https,
            protocol: how.proto,
            early: how.early,
        };
        let Ok(mut builder) = self.builder.try_borrow_mut() else {
            return;
        };
        let Ok(mut batch) = self.buf.batch.lock() else {
            self.buf.dropped_full.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if batch.bytes.len() + MAX_EVENT_LEN > self.settings.buffer_bytes {
            drop(batch);
            self.buf.dropped_full.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if builder.encode(
            req,
            code,
            domain,
            &self.settings.pop,
            from,
            now_ms,
            &mut batch.bytes,
        ) {
            batch.count += 1;
            drop(batch);
            self.buf.recorded.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::{parse, Limits, Parse};
    use lasthop_core::click::{self, Method, Protocol};

    #[test]
    fn the_visitor_key_is_created_0600_and_a_loose_one_refused() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state/visitor.key");
        let made = visitor_key(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(
            visitor_key(&path).unwrap(),
            made,
            "read back, not made again"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(visitor_key(&path).unwrap(), made);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = visitor_key(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("visitor key {}", path.display())) && e.contains("chmod o-rwx"),
            "{e}"
        );
    }

    fn settings(buffer_bytes: usize) -> ClickSettings {
        ClickSettings {
            pop: "fra1".into(),
            visitor_key: [7; 32],
            geo: None,
            buffer_bytes,
        }
    }

    /// Over TLS; the HTTP/2 request came in early data.
    fn how(proto: Protocol) -> How {
        How {
            early: proto == Protocol::H2,
            https: true,
            proto,
        }
    }

    fn req(raw: &'static [u8]) -> Request<'static> {
        let limits = Limits {
            country_header: crate::http::HeaderName::new("cf-ipcountry").ok(),
            ..Limits::default()
        };
        match parse(raw, &limits) {
            Parse::Complete { req, .. } => req,
            other => panic!("{other:?}"),
        }
    }

    #[derive(Default)]
    struct Collect(Vec<u8>, u32);
    impl Sink for Arc<Mutex<Collect>> {
        fn send(&mut self, events: &[u8], count: u32, stats: &SinkStats) {
            let mut c = self.lock().unwrap();
            c.0.extend_from_slice(events);
            c.1 += count;
            stats.sent(u64::from(count));
        }
        fn tick(&mut self, _: &SinkStats) {}
        fn close(&mut self, _: &SinkStats) {}
        fn kind(&self) -> &'static str {
            "test"
        }
    }

    #[test]
    fn records_what_the_request_says_and_hashes_the_visitor() {
        let clicks = Clicks::new(1, settings(1 << 20));
        let rec = clicks.recorder(0).unwrap();
        let r = req(b"HEAD /Ab3dE9x HTTP/1.1\r\nHost: s.example\r\nUser-Agent: Mozilla/5.0 Test\r\nReferer: https://User@News.Example.COM:8443/a?b\r\nCF-IPCountry: de\r\n\r\n");
        let peer: IpAddr = "203.0.113.9".parse().unwrap();
        rec.record(
            &r,
            b"Ab3dE9x",
            b"",
            Some(peer),
            how(Protocol::H2),
            1_764_504_000_000,
        );
        rec.record(
            &r,
            b"Ab3dE9x",
            b"go.example.com",
            Some(peer),
            how(Protocol::H1),
            1_764_504_000_001,
        );
        // A domain no link key has is not recorded.
        rec.record(
            &r,
            b"Ab3dE9x",
            b"Go.Example.com",
            Some(peer),
            how(Protocol::H1),
            1_764_504_000_001,
        );
        // The same visitor the next day hashes differently (the salt rotates).
        rec.record(
            &r,
            b"Ab3dE9x",
            b"",
            Some(peer),
            how(Protocol::H1),
            1_764_504_000_000 + 86_400_000,
        );
        let sink = Arc::new(Mutex::new(Collect::default()));
        let flusher = clicks.start(Box::new(Arc::clone(&sink)), Duration::from_millis(10));
        flusher.stop();
        let c = sink.lock().unwrap();
        assert_eq!(c.1, 3);
        let events: Vec<_> = click::spool::events(&c.0).map(Result::unwrap).collect();
        let e = events[0];
        assert_eq!(e.code, "Ab3dE9x");
        assert_eq!((e.domain, events[1].domain), ("", "go.example.com"));
        assert_eq!(events[1].link_key(), "go.example.com/Ab3dE9x");
        assert_eq!(e.pop, "fra1");
        assert_eq!(e.country, Some(*b"DE"));
        assert_eq!(e.method, Method::Head);
        assert!(e.tls);
        assert_eq!(e.protocol, Protocol::H2);
        assert_eq!(events[1].protocol, Protocol::H1);
        assert!(e.early && !events[1].early);
        assert_eq!(e.net, Some(Net::V4([203, 0, 113])));
        assert_eq!(e.referrer_host, "news.example.com");
        assert_eq!(e.user_agent, "Mozilla/5.0 Test");
        assert_ne!(events[0].id, events[1].id);
        assert_eq!(events[0].visitor, events[1].visitor);
        assert_ne!(events[0].visitor, events[2].visitor);
        let text = {
            let mut s = String::new();
            clicks.render(&mut s);
            s
        };
        assert!(
            text.contains("lasthop_engine_clicks_recorded_total 3"),
            "{text}"
        );
        assert!(text.contains("lasthop_engine_clicks_sent_total{sink=\"test\"} 3"));
    }

    #[test]
    fn a_full_buffer_drops_and_counts() {
        // Room for one event of the largest size: the first fits, the rest are dropped.
        let clicks = Clicks::new(1, settings(MAX_EVENT_LEN + 1));
        let rec = clicks.recorder(0).unwrap();
        let r = req(b"GET /Ab3dE9x HTTP/1.1\r\nHost: a\r\n\r\n");
        for i in 0..10 {
            rec.record(
                &r,
                b"Ab3dE9x",
                b"",
                None,
                How {
                    early: false,
                    https: false,
                    proto: Protocol::H1,
                },
                i,
            );
        }
        let b = &clicks.buffers[0];
        assert_eq!(b.recorded.load(Ordering::Relaxed), 1);
        assert_eq!(b.dropped_full.load(Ordering::Relaxed), 9);
        assert_eq!(b.no_peer.load(Ordering::Relaxed), 10);
    }
}
