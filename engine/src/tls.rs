//! TLS at the edge: the rustls server configuration (ring provider), session tickets whose keys
//! can be shared between processes, the kernel-TLS probe, and the TLS counters.
//!
//! - TLS 1.3, and 1.2 with the ring provider's suites only (all ECDHE + AEAD); ALPN `http/1.1`.
//! - Resumption. One `ServerConfig` (behind an `Arc`) serves every core, so whatever resumes a
//!   session is shared by the whole process. rustls accepts 0-RTT only on stateful resumption
//!   (the single-use session-cache entry is its replay guard), so there are two modes:
//!   - default: the bounded session cache (`SESSION_CACHE` entries), with 0-RTT
//!     (`--tls-max-early-data`, 16 KiB; 0 turns it off and switches to rustls' rotating
//!     in-memory tickets);
//!   - `--tls-ticket-key-file`: stateless tickets whose keys derive from a 32-byte master in
//!     that file (HKDF-SHA256 per time period, AES-256-GCM), so every process holding the file
//!     issues and accepts the same tickets and a restart or a second process on the host still
//!     resumes. Keys rotate every `--tls-ticket-lifetime-secs`; a ticket of the previous period
//!     is still accepted, older ones are not (their key is never derived again). No 0-RTT.
//! - 0-RTT: the session answers GET and HEAD in early data and 425 Too Early to anything else
//!   (a replayed GET changes nothing but a click we may count twice).
//! - kTLS: [`probe_ktls`] tries the TLS ULP on a loopback socket once at start. This kernel class
//!   (no `CONFIG_TLS`) refuses it, so connections are served through userspace rustls; the
//!   engine says so in its log and in `lasthop_engine_ktls_available`.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ProducesTickets, ServerSessionMemoryCache};
use rustls::ServerConfig;

use crate::metrics::{family, sample};

/// Sessions kept by the stateful cache (beside tickets).
pub const SESSION_CACHE: usize = 16_384;

/// What `--tls-*` configure.
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// 32+ random bytes shared by the processes that should resume each other's sessions.
    pub ticket_key_file: Option<PathBuf>,
    /// Ticket key rotation period (and the tickets' advertised lifetime).
    pub ticket_lifetime: Duration,
    /// Most early-data bytes accepted per connection (0 turns 0-RTT off).
    pub max_early_data: u32,
    /// Let connections export their traffic secrets after the handshake (for kTLS).
    pub ktls: bool,
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Pem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{path} holds no certificate")]
    NoCertificate { path: PathBuf },
    #[error("certificate and key: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("ticket key file {path}: {why}")]
    TicketKey { path: PathBuf, why: String },
}

/// Builds the server configuration from the PEM files (ECDSA P-256, Ed25519 and RSA keys work).
pub fn server_config(s: &TlsSettings) -> Result<Arc<ServerConfig>, TlsError> {
    fn pem(path: &Path) -> impl Fn(rustls::pki_types::pem::Error) -> TlsError + '_ {
        move |source| TlsError::Pem {
            path: path.to_path_buf(),
            source,
        }
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&s.cert)
        .map_err(pem(&s.cert))?
        .collect::<Result<_, _>>()
        .map_err(pem(&s.cert))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: s.cert.clone(),
        });
    }
    let key = PrivateKeyDer::from_pem_file(&s.key).map_err(pem(&s.key))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE);
    // rustls takes 0-RTT only on stateful resumption, whose single-use cache entries are its
    // replay guard; a stateless ticket could be replayed anywhere. So: with a ticket key file,
    // stateless tickets (any process holding the file resumes) and no 0-RTT; without one,
    // resumption through the process-wide session cache, with 0-RTT when configured.
    match &s.ticket_key_file {
        Some(path) => {
            config.ticketer = Arc::new(FileTicketer::load(path, s.ticket_lifetime)?);
            config.max_early_data_size = 0;
        }
        None if s.max_early_data > 0 => config.max_early_data_size = s.max_early_data,
        None => config.ticketer = rustls::crypto::ring::Ticketer::new()?,
    }
    // Answers to early data wait for the client's Finished: nothing is sent on the strength of
    // a replayable flight alone.
    config.send_half_rtt_data = false;
    config.enable_secret_extraction = s.ktls;
    Ok(Arc::new(config))
}

/// Session-ticket keys derived from a master secret in a file: see the module docs.
pub struct FileTicketer {
    master: hkdf::Prk,
    lifetime: u64,
    rng: SystemRandom,
}

impl std::fmt::Debug for FileTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTicketer")
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

/// Bytes before the sealed ticket: the period it was sealed in, then the nonce.
const TICKET_HEADER: usize = 8 + NONCE_LEN;

impl FileTicketer {
    /// Reads the master (at least 32 bytes; hex or raw) from `path`.
    pub fn load(path: &Path, lifetime: Duration) -> Result<FileTicketer, TlsError> {
        let err = |why: String| TlsError::TicketKey {
            path: path.to_path_buf(),
            why,
        };
        let raw = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        let text = String::from_utf8_lossy(&raw);
        let bytes = hex::decode(text.trim()).unwrap_or(raw);
        if bytes.len() < 32 {
            return Err(err(format!(
                "{} bytes; need at least 32 random bytes (e.g. `openssl rand -hex 32`)",
                bytes.len()
            )));
        }
        Ok(FileTicketer::new(&bytes, lifetime))
    }

    /// A ticketer over `master` with keys rotating every `lifetime`.
    pub fn new(master: &[u8], lifetime: Duration) -> FileTicketer {
        FileTicketer {
            master: hkdf::Salt::new(hkdf::HKDF_SHA256, b"lasthop ticket keys").extract(master),
            lifetime: lifetime.as_secs().max(60),
            rng: SystemRandom::new(),
        }
    }

    fn period_now(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        now / self.lifetime
    }

    fn key(&self, period: u64) -> Option<LessSafeKey> {
        let info = period.to_be_bytes();
        let info = [&info[..]];
        let okm = self.master.expand(&info, &AES_256_GCM).ok()?;
        let mut key = [0u8; 32];
        okm.fill(&mut key).ok()?;
        Some(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).ok()?))
    }

    fn seal(&self, period: u64, plain: &[u8]) -> Option<Vec<u8>> {
        let key = self.key(period)?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(TICKET_HEADER + plain.len() + 16);
        out.extend_from_slice(&period.to_be_bytes());
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&out[..8]),
            &mut body,
        )
        .ok()?;
        out.extend_from_slice(&body);
        Some(out)
    }

    fn open(&self, now_period: u64, cipher: &[u8]) -> Option<Vec<u8>> {
        let period = u64::from_be_bytes(cipher.get(..8)?.try_into().ok()?);
        // This period's key or the previous one's; anything else has been rotated out.
        if period != now_period && period.checked_add(1) != Some(now_period) {
            return None;
        }
        let nonce: [u8; NONCE_LEN] = cipher.get(8..TICKET_HEADER)?.try_into().ok()?;
        let mut body = cipher.get(TICKET_HEADER..)?.to_vec();
        let key = self.key(period)?;
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&cipher[..8]),
                &mut body,
            )
            .ok()?;
        Some(plain.to_vec())
    }
}

impl ProducesTickets for FileTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        u32::try_from(self.lifetime).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal(self.period_now(), plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open(self.period_now(), cipher)
    }
}

/// What this kernel's TLS ULP takes: (TLS 1.3?, kernel cipher type) pairs that accepted both
/// directions.
#[derive(Debug, Clone, Default)]
pub struct KtlsSupport {
    suites: Vec<(bool, u16)>,
}

impl KtlsSupport {
    /// Whether a connection that negotiated `suite` can be handed to the kernel.
    pub fn takes(&self, tls13: bool, suite: rustls::CipherSuite) -> bool {
        kernel_cipher(suite).is_some_and(|c| self.suites.contains(&(tls13, c)))
    }
}

/// The kernel cipher type for a rustls suite (the ring provider's suites are all AEAD).
fn kernel_cipher(suite: rustls::CipherSuite) -> Option<u16> {
    use rustls::CipherSuite as C;
    match suite {
        C::TLS13_AES_128_GCM_SHA256
        | C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
        | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => Some(TLS_CIPHER_AES_GCM_128),
        C::TLS13_AES_256_GCM_SHA384
        | C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
        | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => Some(TLS_CIPHER_AES_GCM_256),
        C::TLS13_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
        | C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => Some(TLS_CIPHER_CHACHA20_POLY1305),
        _ => None,
    }
}

fn loopback_pair() -> io::Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let client = TcpStream::connect(listener.local_addr()?)?;
    let (server, _) = listener.accept()?;
    Ok((client, server))
}

/// Whether this kernel takes the TLS upper-layer protocol on a TCP socket (kTLS), and for which
/// versions and ciphers in both directions (kernels differ: ChaCha20 and TLS 1.3 receive came
/// later than AES-GCM transmit). Tried once at start on loopback connections of our own, with
/// zero keys: only the kernel's acceptance is tested.
pub fn probe_ktls() -> io::Result<KtlsSupport> {
    let (client, _server) = loopback_pair()?;
    set_tls_ulp(client.as_raw_fd())?;
    let mut support = KtlsSupport::default();
    for tls13 in [true, false] {
        let version = if tls13 {
            TLS_1_3_VERSION
        } else {
            TLS_1_2_VERSION
        };
        for cipher in [
            TLS_CIPHER_AES_GCM_128,
            TLS_CIPHER_AES_GCM_256,
            TLS_CIPHER_CHACHA20_POLY1305,
        ] {
            let ok = loopback_pair().and_then(|(c, _s)| {
                let fd = c.as_raw_fd();
                set_tls_ulp(fd)?;
                set_zero_crypto(fd, TLS_TX, version, cipher)?;
                set_zero_crypto(fd, TLS_RX, version, cipher)
            });
            if ok.is_ok() {
                support.suites.push((tls13, cipher));
            }
        }
    }
    if support.suites.is_empty() {
        return Err(io::Error::other(
            "the TLS ULP loads but takes none of our ciphers",
        ));
    }
    Ok(support)
}

fn set_zero_crypto(
    fd: std::os::fd::RawFd,
    direction: libc::c_int,
    version: u16,
    cipher_type: u16,
) -> io::Result<()> {
    let key_len = if cipher_type == TLS_CIPHER_AES_GCM_128 {
        16
    } else {
        32
    };
    set_crypto_info(
        fd,
        direction,
        version,
        cipher_type,
        &[0; 32][..key_len],
        &[0; 12],
        0,
    )
}

#[allow(unsafe_code)]
fn set_tls_ulp(fd: std::os::fd::RawFd) -> io::Result<()> {
    let name = b"tls";
    // SAFETY: setsockopt(2) reads `name.len()` bytes from a live slice; `fd` is a socket we
    // own for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_TCP,
            libc::TCP_ULP,
            name.as_ptr().cast(),
            name.len() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `setsockopt` level and names of the kernel's TLS ULP (`uapi/linux/tls.h`).
const SOL_TLS: libc::c_int = 282;
const TLS_TX: libc::c_int = 1;
const TLS_RX: libc::c_int = 2;
const TLS_1_2_VERSION: u16 = 0x0303;
const TLS_1_3_VERSION: u16 = 0x0304;
const TLS_CIPHER_AES_GCM_128: u16 = 51;
const TLS_CIPHER_AES_GCM_256: u16 = 52;
const TLS_CIPHER_CHACHA20_POLY1305: u16 = 54;

/// `struct tls12_crypto_info_aes_gcm_128`.
#[repr(C)]
struct CryptoGcm128 {
    version: u16,
    cipher_type: u16,
    iv: [u8; 8],
    key: [u8; 16],
    salt: [u8; 4],
    rec_seq: [u8; 8],
}

/// `struct tls12_crypto_info_aes_gcm_256`.
#[repr(C)]
struct CryptoGcm256 {
    version: u16,
    cipher_type: u16,
    iv: [u8; 8],
    key: [u8; 32],
    salt: [u8; 4],
    rec_seq: [u8; 8],
}

/// `struct tls12_crypto_info_chacha20_poly1305` (no salt).
#[repr(C)]
struct CryptoChacha {
    version: u16,
    cipher_type: u16,
    iv: [u8; 12],
    key: [u8; 32],
    rec_seq: [u8; 8],
}

/// Hands a connection's record layer to the kernel (kTLS): the TLS ULP, then the transmit and
/// receive keys and sequence numbers rustls extracted once the handshake was done and every
/// record it had was sent. From then on the socket carries plaintext for us and records on the
/// wire. `tls13` selects the record version.
pub fn ktls_install(
    fd: std::os::fd::RawFd,
    tls13: bool,
    secrets: rustls::ExtractedSecrets,
) -> io::Result<()> {
    let version = if tls13 {
        TLS_1_3_VERSION
    } else {
        TLS_1_2_VERSION
    };
    set_tls_ulp(fd)?;
    set_crypto(fd, TLS_TX, version, secrets.tx)?;
    set_crypto(fd, TLS_RX, version, secrets.rx)
}

fn copy<const N: usize>(src: &[u8]) -> io::Result<[u8; N]> {
    src.try_into()
        .map_err(|_| io::Error::other("kTLS: unexpected secret length"))
}

fn set_crypto(
    fd: std::os::fd::RawFd,
    direction: libc::c_int,
    version: u16,
    (seq, secrets): (u64, rustls::ConnectionTrafficSecrets),
) -> io::Result<()> {
    use rustls::ConnectionTrafficSecrets as S;
    let (cipher_type, key, iv) = match &secrets {
        S::Aes128Gcm { key, iv } => (TLS_CIPHER_AES_GCM_128, key, iv),
        S::Aes256Gcm { key, iv } => (TLS_CIPHER_AES_GCM_256, key, iv),
        S::Chacha20Poly1305 { key, iv } => (TLS_CIPHER_CHACHA20_POLY1305, key, iv),
        _ => {
            return Err(io::Error::other(
                "kTLS: cipher suite the kernel does not take",
            ))
        }
    };
    set_crypto_info(
        fd,
        direction,
        version,
        cipher_type,
        key.as_ref(),
        iv.as_ref(),
        seq,
    )
}

/// Sets one direction's `tls12_crypto_info_*` for `cipher_type`. `iv` is the 12-byte nonce
/// base rustls keeps: for AES-GCM the kernel takes its first 4 bytes as the salt and the last
/// 8 as the IV; for ChaCha20-Poly1305 all 12 are the IV. `seq` is the next record's number.
fn set_crypto_info(
    fd: std::os::fd::RawFd,
    direction: libc::c_int,
    version: u16,
    cipher_type: u16,
    key: &[u8],
    iv: &[u8],
    seq: u64,
) -> io::Result<()> {
    let rec_seq = seq.to_be_bytes();
    let salt = iv.get(..4).unwrap_or_default();
    let explicit = iv.get(4..12).unwrap_or_default();
    match cipher_type {
        TLS_CIPHER_AES_GCM_128 => setsockopt_struct(
            fd,
            direction,
            &CryptoGcm128 {
                version,
                cipher_type,
                iv: copy(explicit)?,
                key: copy(key)?,
                salt: copy(salt)?,
                rec_seq,
            },
        ),
        TLS_CIPHER_AES_GCM_256 => setsockopt_struct(
            fd,
            direction,
            &CryptoGcm256 {
                version,
                cipher_type,
                iv: copy(explicit)?,
                key: copy(key)?,
                salt: copy(salt)?,
                rec_seq,
            },
        ),
        _ => setsockopt_struct(
            fd,
            direction,
            &CryptoChacha {
                version,
                cipher_type,
                iv: copy(iv)?,
                key: copy(key)?,
                rec_seq,
            },
        ),
    }
}

#[allow(unsafe_code)]
fn setsockopt_struct<T>(fd: std::os::fd::RawFd, name: libc::c_int, value: &T) -> io::Result<()> {
    // SAFETY: setsockopt(2) reads size_of::<T>() bytes from a live, properly aligned `#[repr(C)]`
    // value laid out as the kernel's uapi struct for `name`; `fd` is a socket we hold open.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            SOL_TLS,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Handshake failure reasons, as labelled in `/metrics`.
pub const FAILURES: [&str; 5] = ["alert", "timeout", "handshake_cap", "io", "ktls"];

/// Process-wide TLS counters.
#[derive(Debug, Default)]
pub struct TlsStats {
    pub ktls_available: std::sync::atomic::AtomicBool,
    full: AtomicU64,
    resumed: AtomicU64,
    early_data: AtomicU64,
    too_early: AtomicU64,
    userspace_conns: AtomicU64,
    ktls_conns: AtomicU64,
    failures: [AtomicU64; 5],
}

/// A finished handshake's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake {
    Full,
    Resumed,
}

impl TlsStats {
    pub fn handshake(&self, kind: Handshake) {
        let c = match kind {
            Handshake::Full => &self.full,
            Handshake::Resumed => &self.resumed,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection's early data was accepted and read.
    pub fn early_data(&self) {
        self.early_data.fetch_add(1, Ordering::Relaxed);
    }

    /// A request in early data was not GET/HEAD and got 425.
    pub fn too_early(&self) {
        self.too_early.fetch_add(1, Ordering::Relaxed);
    }

    /// A TLS connection accepted (served through userspace rustls).
    pub fn userspace_conn(&self) {
        self.userspace_conns.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection was handed to kernel TLS.
    pub fn ktls_conn(&self) {
        self.ktls_conns.fetch_add(1, Ordering::Relaxed);
    }

    /// A handshake failed; `reason` indexes [`FAILURES`].
    pub fn failure(&self, reason: usize) {
        if let Some(c) = self.failures.get(reason) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn render(&self, o: &mut String) {
        let name = "lasthop_engine_ktls_available";
        family(
            o,
            name,
            "gauge",
            "1 when the kernel takes the TLS ULP (kTLS offload).",
        );
        sample(
            o,
            name,
            "",
            u64::from(self.ktls_available.load(Ordering::Relaxed)),
        );
        let name = "lasthop_engine_tls_connections_total";
        family(
            o,
            name,
            "counter",
            "TLS connections: accepted (userspace rustls), and handed to kernel TLS after the handshake.",
        );
        sample(
            o,
            name,
            "path=\"userspace\"",
            self.userspace_conns.load(Ordering::Relaxed),
        );
        sample(
            o,
            name,
            "path=\"ktls\"",
            self.ktls_conns.load(Ordering::Relaxed),
        );
        let name = "lasthop_engine_tls_handshakes_total";
        family(o, name, "counter", "Completed TLS handshakes by kind.");
        sample(o, name, "kind=\"full\"", self.full.load(Ordering::Relaxed));
        sample(
            o,
            name,
            "kind=\"resumed\"",
            self.resumed.load(Ordering::Relaxed),
        );
        sample(
            o,
            name,
            "kind=\"early_data\"",
            self.early_data.load(Ordering::Relaxed),
        );
        let name = "lasthop_engine_tls_too_early_total";
        family(
            o,
            name,
            "counter",
            "Requests in 0-RTT early data answered 425 (not GET/HEAD).",
        );
        sample(o, name, "", self.too_early.load(Ordering::Relaxed));
        let name = "lasthop_engine_tls_handshake_failures_total";
        family(o, name, "counter", "TLS handshakes that failed, by reason.");
        for (i, reason) in FAILURES.iter().enumerate() {
            sample(
                o,
                name,
                &format!("reason=\"{reason}\""),
                self.failures[i].load(Ordering::Relaxed),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_tickets_are_shared_between_instances_and_rotate_out() {
        let a = FileTicketer::new(&[7u8; 32], Duration::from_secs(3600));
        let b = FileTicketer::new(&[7u8; 32], Duration::from_secs(3600));
        let other = FileTicketer::new(&[8u8; 32], Duration::from_secs(3600));
        let now = a.period_now();
        let t = a.seal(now, b"session state").unwrap();
        assert_eq!(
            b.open(now, &t).unwrap(),
            b"session state",
            "another process"
        );
        assert_eq!(
            b.open(now + 1, &t).unwrap(),
            b"session state",
            "previous period"
        );
        assert!(b.open(now + 2, &t).is_none(), "rotated out");
        assert!(other.open(now, &t).is_none(), "another master");
        let mut tampered = t.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(a.open(now, &tampered).is_none());
        assert!(a.open(now, &t[..10]).is_none());
        assert!(a.open(now, &[]).is_none());
        // The period is authenticated: moving a ticket to another period fails.
        let mut moved = t.clone();
        moved[..8].copy_from_slice(&(now + 1).to_be_bytes());
        assert!(a.open(now + 1, &moved).is_none());
    }

    #[test]
    fn short_ticket_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, "abcd").unwrap();
        assert!(FileTicketer::load(&p, Duration::from_secs(60)).is_err());
        std::fs::write(&p, hex::encode([1u8; 32])).unwrap();
        assert!(FileTicketer::load(&p, Duration::from_secs(60)).is_ok());
    }

    #[test]
    fn ktls_probe_answers() {
        // Either way is fine; the point is that it answers without panicking.
        match probe_ktls() {
            Ok(s) => eprintln!("kTLS available: {s:?}"),
            Err(e) => eprintln!("kTLS unavailable: {e}"),
        }
    }
}
