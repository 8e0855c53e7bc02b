//! Which host names the served certificate is valid for, as rustls' own verifier (webpki)
//! judges them: HTTP/2 answers 421 for a name on a coalesced connection that neither the
//! client's SNI nor the certificate covers (RFC 9113 §9.1.2).

use std::path::Path;
use std::sync::RwLock;

use rustls::pki_types::{CertificateDer, ServerName};

use super::TlsError;

/// The leaf certificate of `--cert`, replaced when SIGHUP reloads it.
#[derive(Debug)]
pub struct CertCoverage {
    leaf: RwLock<CertificateDer<'static>>,
}

impl CertCoverage {
    /// The leaf (first) certificate of a PEM chain.
    pub fn load(path: &Path) -> Result<CertCoverage, TlsError> {
        Ok(CertCoverage {
            leaf: RwLock::new(leaf(path)?),
        })
    }

    /// Takes the reloaded certificate's names.
    pub fn reload(&self, path: &Path) -> Result<(), TlsError> {
        let next = leaf(path)?;
        if let Ok(mut l) = self.leaf.write() {
            *l = next;
        }
        Ok(())
    }
}

fn leaf(path: &Path) -> Result<CertificateDer<'static>, TlsError> {
    // `lasthop_tls::certs` refuses a file without a certificate, so the first exists.
    let mut certs = lasthop_tls::certs(path)?;
    Ok(certs.swap_remove(0))
}

impl lasthop_edge::session::Coverage for CertCoverage {
    fn covers(&self, host: &[u8]) -> bool {
        let Ok(host) = std::str::from_utf8(host) else {
            return false;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let Ok(name) = ServerName::try_from(host) else {
            return false;
        };
        let Ok(leaf) = self.leaf.read() else {
            return false;
        };
        webpki::EndEntityCert::try_from(&*leaf)
            .and_then(|c| c.verify_is_valid_for_subject_name(&name))
            .is_ok()
    }
}
