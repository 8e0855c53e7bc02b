//! What the criterion suites in `benches/` (and the loops in `examples/`) share: the key, the
//! synthetic snapshot files they build once and reuse (the `snapshot` and `request` suites read
//! the same file), the generator that picks codes, and the request path's fixtures (the
//! requests clients send, the tables with their denylist, one request served).

use std::path::PathBuf;
use std::sync::Arc;

use lasthop_core::region::DEFAULT_RESERVE;
use lasthop_core::{CodeScheme, HighWater, PermutationKey};
use lasthop_edge::answer::decide;
use lasthop_edge::denylist::{Deny, Denylist};
use lasthop_edge::http::{parse, Limits, Parse};
use lasthop_edge::tables::Tables;
use lasthop_snapshot::{Layout, Snapshot, SnapshotMeta, SnapshotWriter, Synth};

/// Hash seed of every bench snapshot (fixed, so files are reproducible and reusable).
pub const HASH_SEED: u64 = 0x5eed;
/// Seed of the synthetic links.
pub const DATA_SEED: u64 = 1;

/// The benches' permutation key and scheme.
pub fn scheme() -> (PermutationKey, CodeScheme) {
    let key = PermutationKey::from_bytes(&[0x5a; 16]).expect("16 bytes is an AES-128 key");
    let scheme = CodeScheme::new(&key).expect("radix 62, length 7 is a valid FF1 domain");
    (key, scheme)
}

/// `$CARGO_TARGET_DIR/lasthop-bench` (or `target/lasthop-bench`), created if missing.
pub fn bench_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("lasthop-bench");
    std::fs::create_dir_all(&dir).expect("create the bench data directory");
    dir
}

/// The snapshot of `count` synthetic codes (plus count/100 aliases) under [`scheme`], region 0
/// marked issued up to `count`, in the default (compact) layout; built once, reused while its
/// link count and key match.
pub fn snapshot_file(count: u64, label: &str) -> PathBuf {
    snapshot_file_in(count, label, Layout::default())
}

/// [`snapshot_file`] in `layout`.
pub fn snapshot_file_in(count: u64, label: &str, layout: Layout) -> PathBuf {
    let shape = match layout {
        Layout::Paged => "-paged",
        _ => "",
    };
    let path = bench_dir().join(format!(
        "synth-{label}-v{}{shape}.snap",
        lasthop_snapshot::FORMAT_VERSION
    ));
    let (key, scheme) = scheme();
    let mut synth = Synth::new(scheme, count, DATA_SEED);
    let reusable = Snapshot::open(&path)
        .map(|s| {
            s.links() == synth.total()
                && s.key_id() == key.id()
                && (s.page_len() == 64) == (layout == Layout::Compact)
        })
        .unwrap_or(false);
    if !reusable {
        eprintln!("building {} ({label} links, once)", path.display());
        let mut hw = HighWater::new(1, DEFAULT_RESERVE).expect("one region");
        hw.raise(0, count).expect("region 0 exists");
        let meta = SnapshotMeta::new(1, key.id(), hw)
            .with_hash_seed(HASH_SEED)
            .with_layout(layout);
        let mut w = SnapshotWriter::create(&path, meta).expect("create");
        w.reserve(synth.total() as usize);
        while let Some(l) = synth.next_link() {
            w.add(l.key, l.url, l.expires_at_ms)
                .expect("synthetic links are valid");
        }
        w.seal().expect("seal");
    }
    path
}

/// SplitMix64, for picking codes.
pub fn rng(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Links in the request path's snapshot (`snapshot_file(REQUEST_LINKS, "1M")`).
pub const REQUEST_LINKS: u64 = 1_000_000;

/// The request path's clock: before every synthetic expiry (they start at 1.8e12), so hits
/// redirect.
pub const NOW_MS: i64 = 1_700_000_000_000;

/// What curl sends, `{}` where the code goes.
pub const CURL: &str =
    "GET /{} HTTP/1.1\r\nHost: lh.example\r\nUser-Agent: curl/8.5.0\r\nAccept: */*\r\n\r\n";
/// What wrk sends.
pub const WRK: &str = "GET /{} HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n\r\n";
/// What a browser sends (~500 bytes).
pub const BROWSER: &str = "GET /{} HTTP/1.1\r\nHost: lh.example\r\n\
User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n\
Accept: text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8\r\n\
Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n\
Referer: https://news.example.com/article/12345\r\nConnection: keep-alive\r\n\
Upgrade-Insecure-Requests: 1\r\nSec-Fetch-Dest: document\r\nSec-Fetch-Mode: navigate\r\n\
Sec-Fetch-Site: cross-site\r\nSec-Fetch-User: ?1\r\nPriority: u=0, i\r\n\r\n";

/// A `Date` line as the engine's cores keep it (formatted once a second).
pub const DATE: &[u8] = b"Date: Tue, 01 Dec 2026 14:00:00 GMT\r\n";

/// The request path's tables: the 1M-link snapshot, mapped in place as the engine serves it by
/// default (`--snapshot-memory map`), and a denylist of 10,000 codes above the mark (none a
/// bench asks for), so its check is a real hash probe, not the empty-list shortcut. Draws the
/// denylist from `state`.
pub fn request_tables(state: &mut u64) -> Tables {
    request_tables_in(state, Snapshot::open)
}

/// [`request_tables`] with the snapshot opened by `open` (`Snapshot::load` for the engine's
/// `--snapshot-memory huge`).
pub fn request_tables_in(
    state: &mut u64,
    open: fn(PathBuf) -> Result<Snapshot, lasthop_snapshot::SnapshotError>,
) -> Tables {
    request_tables_with(state, open, Layout::default())
}

/// [`request_tables_in`] over the snapshot in `layout`.
pub fn request_tables_with(
    state: &mut u64,
    open: fn(PathBuf) -> Result<Snapshot, lasthop_snapshot::SnapshotError>,
    layout: Layout,
) -> Tables {
    let (_, scheme) = scheme();
    let file = snapshot_file_in(REQUEST_LINKS, "1M", layout);
    let snapshot = Arc::new(open(file).expect("open the bench snapshot"));
    let deny: Denylist = (0..10_000)
        .map(|_| {
            let n = REQUEST_LINKS + DEFAULT_RESERVE + rng(state) % (1 << 30);
            (scheme.encode(n).expect("in domain"), Deny::Gone)
        })
        .collect();
    Tables::from_snapshot(scheme, snapshot, false)
        .expect("same key")
        .with_denylist(Arc::new(deny))
}

/// One request through the whole pure path as a connection's session serves it (the snapshot
/// prefetch as the bytes arrive, parse, decide, render with the `Date` line every answer
/// carries); returns the response length. `pf` is the connection's prefetch state: one per
/// bench case, as one client's connection.
#[inline]
pub fn serve(
    buf: &[u8],
    limits: &Limits,
    t: &Tables,
    out: &mut Vec<u8>,
    pf: &mut lasthop_edge::answer::Prefetcher,
) -> usize {
    out.clear();
    pf.prefetch(buf, t);
    match parse(buf, limits) {
        Parse::Complete { req, .. } => {
            let (answer, layer) = decide(&req, t, NOW_MS);
            pf.answered(layer);
            std::hint::black_box(layer);
            lasthop_edge::render::render_with(
                &answer,
                &req,
                DATE,
                &lasthop_edge::render::NO_PAGES,
                out,
            );
        }
        _ => unreachable!("bench requests are complete"),
    }
    out.len()
}

/// Distinct codes of the cold cases (`request/hit_curl*`): each lookup a cache miss.
pub const COLD_CODES: usize = 1 << 16;
/// Distinct codes of the hot case (`request/hit_hot_curl`): the head of the cold ones.
pub const HOT_CODES: usize = 1 << 10;

/// `n` codes of links in the request path's snapshot, drawn from `state` (the same draws, in
/// the same order, wherever the request path is timed).
pub fn hit_codes(scheme: &CodeScheme, state: &mut u64, n: usize) -> Codes {
    Codes::new((0..n).map(|_| {
        scheme
            .encode(rng(state) % REQUEST_LINKS)
            .expect("in domain")
            .to_vec()
    }))
}

/// Codes stored back to back (no pointer per code to chase).
#[derive(Debug)]
pub struct Codes {
    bytes: Vec<u8>,
    ends: Vec<usize>,
}

impl Codes {
    pub fn new<I: IntoIterator<Item = Vec<u8>>>(codes: I) -> Codes {
        let mut c = Codes {
            bytes: Vec::new(),
            ends: Vec::new(),
        };
        for code in codes {
            c.bytes.extend_from_slice(&code);
            c.ends.push(c.bytes.len());
        }
        c
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }
}

/// A random cycle through every slot of an anonymous map (Sattolo's shuffle), optionally on
/// transparent huge pages: each step one dependent load no cache holds.
#[derive(Debug)]
pub struct Chase {
    map: memmap2::MmapMut,
}

impl Chase {
    pub fn new(slots: usize, huge: bool) -> Chase {
        let mut map = memmap2::MmapOptions::new()
            .len(slots * 4)
            .map_anon()
            .expect("anonymous map");
        if huge {
            // Advisory, as in `Snapshot::load`.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        let mut next: Vec<u32> = (0..slots as u32).collect();
        let mut st = 99;
        for i in (1..slots).rev() {
            let j = (rng(&mut st) % i as u64) as usize;
            next.swap(i, j);
        }
        for (slot, n) in map.chunks_exact_mut(4).zip(next) {
            slot.copy_from_slice(&n.to_le_bytes());
        }
        Chase { map }
    }

    #[inline]
    pub fn next(&self, at: u32) -> u32 {
        let i = at as usize * 4;
        u32::from_le_bytes(self.map[i..i + 4].try_into().expect("four bytes"))
    }
}

/// Writes request `i` of a case into `inbuf`, as recv would: a hot buffer, fresh bytes.
#[inline]
pub fn receive(inbuf: &mut Vec<u8>, template: (&str, &str), codes: &Codes, i: usize) {
    inbuf.clear();
    inbuf.extend_from_slice(template.0.as_bytes());
    inbuf.extend_from_slice(codes.get(i));
    inbuf.extend_from_slice(template.1.as_bytes());
}

/// A request template cut at its `{}`, where the code goes.
pub fn split(template: &str) -> (&str, &str) {
    template.split_once("{}").expect("templates hold {}")
}

/// A TLS client's certificate check that accepts any certificate and signature: the handshake
/// load generator (`examples/tls_load.rs`) and the in-memory client of the handshake bench's
/// `rustls_server_full` measure the server, not themselves (wrk checks nothing either).
#[derive(Debug)]
pub struct NoCheck(pub Vec<rustls::SignatureScheme>);

impl NoCheck {
    /// A TLS 1.3-only client on `provider` that checks nothing (the load generators'), offering
    /// `alpn`.
    pub fn tls13_client(
        provider: Arc<rustls::crypto::CryptoProvider>,
        alpn: &[u8],
    ) -> rustls::ClientConfig {
        let schemes = provider
            .signature_verification_algorithms
            .supported_schemes();
        let mut tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])
            .expect("TLS 1.3")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoCheck(schemes)))
            .with_no_client_auth();
        tls.alpn_protocols = vec![alpn.to_vec()];
        tls
    }
}

impl rustls::client::danger::ServerCertVerifier for NoCheck {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.clone()
    }
}

/// The key exchange group of a registry name, as the engine's `--tls-groups` spells it: the
/// hybrid from aws-lc-rs (as the engine has it), the others from ring.
pub fn kx_group(name: &str) -> Option<&'static dyn rustls::crypto::SupportedKxGroup> {
    use rustls::crypto::{aws_lc_rs, ring};
    Some(match name {
        "X25519MLKEM768" => aws_lc_rs::kx_group::X25519MLKEM768,
        "X25519" => ring::kx_group::X25519,
        "secp256r1" => ring::kx_group::SECP256R1,
        "secp384r1" => ring::kx_group::SECP384R1,
        _ => return None,
    })
}
