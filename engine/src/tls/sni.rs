//! Certificates chosen by SNI: the branded domains' certificates (from the control plane,
//! `feed::certificates`) by exact name, and `--cert`/`--key` for no SNI or any other name.
//!
//! One [`Branded`] set per process, shared by every configuration built from it (TCP and QUIC,
//! before and after a SIGHUP reload of the default certificate), swapped whole when the control
//! plane's certificates change: a handshake reads the set under a read lock (one uncontended
//! atomic, against the ~100 µs of a full handshake's crypto) and takes an `Arc` of the entry,
//! so a swap never waits on a handshake and a handshake never sees half a set.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// The ALPN protocol of ACME's TLS-ALPN-01 validation (RFC 8737 §6.2).
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

/// The branded domains' certificates and TLS-ALPN-01 challenge certificates, by lowercase
/// name.
#[derive(Debug, Default)]
pub struct Branded {
    set: RwLock<Arc<Certs>>,
}

#[derive(Debug, Default)]
struct Certs {
    served: HashMap<String, Arc<CertifiedKey>>,
    acme: HashMap<String, Arc<CertifiedKey>>,
}

impl Branded {
    /// Serves `served` (and `acme` to ACME validators) from the next handshake on.
    pub fn replace(
        &self,
        served: HashMap<String, Arc<CertifiedKey>>,
        acme: HashMap<String, Arc<CertifiedKey>>,
    ) {
        let set = Arc::new(Certs { served, acme });
        match self.set.write() {
            Ok(mut s) => *s = set,
            Err(poisoned) => *poisoned.into_inner() = set,
        }
    }

    fn current(&self) -> Arc<Certs> {
        match self.set.read() {
            Ok(s) => Arc::clone(&s),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// The certificate of `name` (lowercase), if a branded domain has one.
    pub fn get(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.current().served.get(name).cloned()
    }

    /// The TLS-ALPN-01 challenge certificate of `name` (lowercase), while one is published.
    pub fn acme(&self, name: &str) -> Option<Arc<CertifiedKey>> {
        self.current().acme.get(name).cloned()
    }
}

/// The resolver of one `ServerConfig`: a branded domain's certificate for its name, the
/// default one otherwise.
#[derive(Debug)]
pub struct SniResolver {
    default: Arc<CertifiedKey>,
    branded: Arc<Branded>,
}

impl SniResolver {
    pub fn new(default: Arc<CertifiedKey>, branded: Arc<Branded>) -> SniResolver {
        SniResolver { default, branded }
    }
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // An ACME validator offers `acme-tls/1` alone (RFC 8737 §3): it gets the challenge
        // certificate of its name or no handshake at all, never a certificate for browsers.
        let mut alpn = hello.alpn().into_iter().flatten();
        if let (Some(ACME_TLS_ALPN), None) = (alpn.next(), alpn.next()) {
            let name = hello.server_name()?.to_ascii_lowercase();
            return self.branded.acme(&name);
        }
        // rustls hands over the SNI as sent (a DNS name, never an address); names compare
        // without case.
        let branded = hello.server_name().and_then(|name| {
            if name.bytes().any(|b| b.is_ascii_uppercase()) {
                self.branded.get(&name.to_ascii_lowercase())
            } else {
                self.branded.get(name)
            }
        });
        Some(branded.unwrap_or_else(|| Arc::clone(&self.default)))
    }
}
