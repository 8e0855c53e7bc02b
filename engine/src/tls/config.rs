//! The rustls server configuration: certificates, versions, ALPN, resumption and 0-RTT (the
//! module docs of [`crate::tls`] say which mode does what).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::ServerConfig;

use super::tickets::{FileTicketer, TicketKeyError};

/// Sessions kept by the stateful cache (beside tickets).
pub const SESSION_CACHE: usize = 16_384;

/// A key exchange group `--tls-groups` names (RFC 8446 §4.2.7 and the IANA TLS Supported
/// Groups registry's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum KxGroup {
    /// The hybrid of X25519 and ML-KEM-768 (draft-ietf-tls-ecdhe-mlkem): what Chrome (131 on)
    /// and Apple's systems (26) offer first. From aws-lc-rs: ring has no ML-KEM.
    #[value(name = "X25519MLKEM768")]
    X25519Mlkem768,
    #[value(name = "X25519")]
    X25519,
    #[value(name = "secp256r1")]
    Secp256r1,
    #[value(name = "secp384r1")]
    Secp384r1,
}

impl KxGroup {
    /// `--tls-groups`' default: the hybrid, then what ring offered before it.
    pub const DEFAULT: [KxGroup; 4] = [
        KxGroup::X25519Mlkem768,
        KxGroup::X25519,
        KxGroup::Secp256r1,
        KxGroup::Secp384r1,
    ];

    /// The group's implementation: ring's for the classical ones, aws-lc-rs' hybrid.
    pub fn provider_group(self) -> &'static dyn rustls::crypto::SupportedKxGroup {
        use rustls::crypto::{aws_lc_rs, ring};
        match self {
            KxGroup::X25519Mlkem768 => aws_lc_rs::kx_group::X25519MLKEM768,
            KxGroup::X25519 => ring::kx_group::X25519,
            KxGroup::Secp256r1 => ring::kx_group::SECP256R1,
            KxGroup::Secp384r1 => ring::kx_group::SECP384R1,
        }
    }

    /// The registry name, as `--tls-groups` and `/metrics` spell it.
    pub fn name(self) -> &'static str {
        match self {
            KxGroup::X25519Mlkem768 => "X25519MLKEM768",
            KxGroup::X25519 => "X25519",
            KxGroup::Secp256r1 => "secp256r1",
            KxGroup::Secp384r1 => "secp384r1",
        }
    }
}

/// The server's provider: the shared one ([`lasthop_tls::provider`]: ring for suites in
/// [`lasthop_tls::cipher_suites`]' order, which the server applies, signatures, randomness,
/// tickets) with `groups` as its key exchanges, duplicates dropped. rustls takes the first of
/// the client's `supported_groups` that is also here, so the client's order chooses and a
/// client that sent a key share for it never gets a HelloRetryRequest.
pub fn server_provider(groups: &[KxGroup]) -> rustls::crypto::CryptoProvider {
    let mut kx_groups: Vec<&'static dyn rustls::crypto::SupportedKxGroup> = Vec::new();
    for g in groups {
        let g = g.provider_group();
        if !kx_groups.iter().any(|k| k.name() == g.name()) {
            kx_groups.push(g);
        }
    }
    rustls::crypto::CryptoProvider {
        kx_groups,
        ..lasthop_tls::provider()
    }
}

/// Compressed certificate chains kept (RFC 8879), the most recently used: each chain served
/// (the default one, the one a SIGHUP brings, the branded domains') in two algorithms (brotli,
/// zlib); a handshake with a cached one costs no compression. 32,768 entries hold 16,000
/// domains' chains in both (about 1 KiB each, so at most ~32 MiB, allocated as clients ask);
/// past that the least recent are compressed again when next asked for.
pub const CERT_COMPRESSION_CACHE: usize = 32_768;

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
    /// Send what answers early data in the server's first flight (TLS 1.3 0.5-RTT data),
    /// before the client's Finished (`--tls-early-answer`).
    pub early_answer: bool,
    /// Let connections export their traffic secrets after the handshake (for kTLS).
    pub ktls: bool,
    /// ALPN protocols offered, in order of preference (`h2`, `http/1.1`).
    pub alpn: Vec<Vec<u8>>,
    /// The key exchange groups offered (`--tls-groups`); empty takes [`KxGroup::DEFAULT`].
    pub groups: Vec<KxGroup>,
    /// Compress the certificate chain for clients that ask (RFC 8879: brotli, zlib).
    pub cert_compression: bool,
    /// The branded domains' certificates, chosen by SNI before `cert` (one set per process,
    /// shared by every configuration built from these settings).
    pub branded: Arc<super::sni::Branded>,
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A certificate or key file (the message names it and what was wrong).
    #[error(transparent)]
    Pem(#[from] lasthop_tls::Error),
    #[error("certificate and key: {0}")]
    Rustls(#[from] rustls::Error),
    #[error(transparent)]
    TicketKey(#[from] TicketKeyError),
}

/// Builds the server configuration from the PEM files (ECDSA P-256, Ed25519 and RSA keys work).
pub fn server_config(s: &TlsSettings) -> Result<Arc<ServerConfig>, TlsError> {
    build(s, false)
}

/// The configuration of the QUIC listener: the same certificate, groups and certificate
/// compression as TCP, TLS 1.3 only, ALPN `h3`, and 0-RTT with `max_early_data_size` at
/// `u32::MAX` as QUIC requires (RFC 9001 §4.6.1: the transport's flow control bounds it) unless
/// `--tls-max-early-data 0` or a ticket key file turns 0-RTT off. One configuration serves
/// every core, so its session store (rustls' single-use replay guard) is shared: a resumed
/// Initial may land on any core.
pub fn quic_server_config(s: &TlsSettings) -> Result<Arc<ServerConfig>, TlsError> {
    build(s, true)
}

static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

fn build(s: &TlsSettings, quic: bool) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = lasthop_tls::certs(&s.cert)?;
    let key = lasthop_tls::private_key(&s.key)?;
    let groups = if s.groups.is_empty() {
        &KxGroup::DEFAULT[..]
    } else {
        &s.groups[..]
    };
    let provider = Arc::new(server_provider(groups));
    let default = rustls::sign::CertifiedKey::from_der(certs, key, &provider)?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(if quic {
            TLS13_ONLY
        } else {
            lasthop_tls::VERSIONS
        })?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(super::sni::SniResolver::new(
            Arc::new(default),
            Arc::clone(&s.branded),
        )));
    config.alpn_protocols = if quic {
        vec![b"h3".to_vec()]
    } else if s.alpn.is_empty() {
        vec![b"http/1.1".to_vec()]
    } else {
        s.alpn.clone()
    };
    if !quic {
        // Last, so no client that offers anything else is given it: only an ACME validator
        // (offering it alone) negotiates it, and is answered by the resolver's challenge
        // certificate; its connection closes after the handshake (`conn::input`).
        config
            .alpn_protocols
            .push(super::sni::ACME_TLS_ALPN.to_vec());
    }
    config.ignore_client_order = true;
    // rustls compresses a chain once per algorithm and keeps it (CompressionLevel::Amortized:
    // brotli's and zlib's best), so the handshake pays a cache lookup, not a compression.
    config.cert_compressors = if s.cert_compression {
        rustls::compress::default_cert_compressors().to_vec()
    } else {
        Vec::new()
    };
    config.cert_compression_cache = Arc::new(rustls::compress::CompressionCache::new(
        CERT_COMPRESSION_CACHE,
    ));
    config.session_storage = Arc::new(super::sessions::SessionStore::new(SESSION_CACHE));
    // rustls takes 0-RTT only on stateful resumption, whose single-use cache entries are its
    // replay guard; a stateless ticket could be replayed anywhere. So: with a ticket key file,
    // stateless tickets (any process holding the file resumes) and no 0-RTT; without one,
    // resumption through the process-wide session cache, with 0-RTT when configured.
    match &s.ticket_key_file {
        Some(path) => {
            config.ticketer = Arc::new(FileTicketer::load(path, s.ticket_lifetime)?);
            config.max_early_data_size = 0;
        }
        None if s.max_early_data > 0 => {
            config.max_early_data_size = if quic { u32::MAX } else { s.max_early_data }
        }
        None => config.ticketer = rustls::crypto::ring::Ticketer::new()?,
    }
    // 0.5-RTT data: what answers early data (a GET or HEAD, whose replay changes nothing but a
    // click the processor de-duplicates) rides the server's first flight, so a returning visitor
    // has the redirect one round trip after the TCP handshake. Off, answers wait for the
    // client's Finished. A full handshake has nothing to send early but HTTP/2's SETTINGS,
    // which then go in the first flight as well (rustls never sends early when it asks for a
    // client certificate, which the engine does not).
    config.send_half_rtt_data = s.early_answer;
    config.enable_secret_extraction = s.ktls && !quic;
    Ok(Arc::new(config))
}
