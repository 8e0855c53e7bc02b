//! TLS at the edge: the rustls server configuration (ring provider, with aws-lc-rs' post-quantum
//! hybrid key exchange), session tickets whose keys can be shared between processes, the
//! kernel-TLS probe, and the TLS counters.
//!
//! - TLS 1.3, and 1.2 with the ring provider's suites only (all ECDHE + AEAD), SHA-256 suites
//!   first: `lasthop-tls`' versions and suites, which the control plane and this engine's
//!   client to it use too (as they do its PEM readers); ALPN `h2` and `http/1.1`.
//! - Key exchange (`--tls-groups`): X25519MLKEM768 (aws-lc-rs; ring 0.17 has no ML-KEM), then
//!   ring's X25519, P-256 and P-384; the client's preference picks among them.
//! - The certificate chain compressed for clients that ask (RFC 8879: brotli, zlib), once per
//!   chain and algorithm (`config::CERT_COMPRESSION_CACHE`); `--no-tls-cert-compression`.
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
//! - kTLS ([`ktls`]): [`probe_ktls`] tries the TLS ULP on loopback sockets once at start. This
//!   kernel class (no `CONFIG_TLS`) refuses it, so connections are served through userspace
//!   rustls; the engine says so in its log and in `lasthop_engine_ktls_available`.
//!
//! Modules: [`config`] (the `ServerConfig`), [`tickets`] (the shared ticket keys), [`conn`] (one
//! connection on rustls, driven by any I/O loop), [`ktls`] (the probe and the hand-off), and
//! here the counters.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::prom::{family, sample};

pub mod config;
pub mod conn;
pub mod coverage;
pub mod ktls;
pub mod sessions;
pub mod sni;
pub mod tickets;

pub use config::{server_config, TlsError, TlsSettings, SESSION_CACHE};
pub use coverage::CertCoverage;
pub use ktls::{ktls_install, probe_ktls, KtlsSupport};
pub use tickets::FileTicketer;

/// What a core serves its HTTPS connections with, whichever loop accepts them.
pub struct TlsServe {
    /// The configuration new connections get (SIGHUP replaces it; live connections keep theirs).
    pub config: std::sync::Arc<std::sync::Mutex<std::sync::Arc<rustls::ServerConfig>>>,
    pub stats: std::sync::Arc<TlsStats>,
    /// Most connections of this core in their handshake at once; more are refused at accept.
    pub max_handshakes: usize,
    /// A handshake not finished in this long is dropped.
    pub handshake_timeout_ms: i64,
    /// What the kernel's TLS ULP takes (None: no kTLS): a connection whose suite it takes is
    /// handed to it after the handshake.
    pub ktls: Option<KtlsSupport>,
}

impl std::fmt::Debug for TlsServe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsServe")
            .field("max_handshakes", &self.max_handshakes)
            .finish_non_exhaustive()
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
    /// Completed handshakes by key exchange group, in [`config::KxGroup::DEFAULT`]'s order,
    /// then resumptions without one (psk_ke) and any other group.
    groups: [AtomicU64; 6],
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

    /// A completed handshake's key exchange group (`None`: a resumption without one).
    pub fn key_exchange(&self, group: Option<rustls::NamedGroup>) {
        let i = match group {
            Some(g) => config::KxGroup::DEFAULT
                .iter()
                .position(|d| d.provider_group().name() == g)
                .unwrap_or(5),
            None => 4,
        };
        self.groups[i].fetch_add(1, Ordering::Relaxed);
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
        let name = "lasthop_engine_tls_key_exchanges_total";
        family(
            o,
            name,
            "counter",
            "Completed TLS handshakes by key exchange group (none: a resumption without one).",
        );
        let names = config::KxGroup::DEFAULT.map(config::KxGroup::name);
        for (i, group) in names.iter().chain(&["none", "other"]).enumerate() {
            sample(
                o,
                name,
                &format!("group=\"{group}\""),
                self.groups[i].load(Ordering::Relaxed),
            );
        }
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
