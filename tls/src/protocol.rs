//! The protocol versions and cipher suites every lasthop TLS configuration uses.

use rustls::crypto::ring::cipher_suite as cs;
use rustls::crypto::CryptoProvider;
use rustls::{SupportedCipherSuite, SupportedProtocolVersion};

/// TLS 1.3, then 1.2 (for clients that have nothing newer; its suites are all ECDHE + AEAD).
pub static VERSIONS: &[&SupportedProtocolVersion] =
    &[&rustls::version::TLS13, &rustls::version::TLS12];

/// The cipher suites in order of preference: the ring provider's (all ECDHE + AEAD, nothing
/// that rustls calls unsafe), the SHA-256 ones first.
///
/// A suite's hash runs the whole key schedule (some thirty HMACs a handshake), and ring's
/// SHA-384 has no vector code on many x86 CPUs, so a client that lists AES-256-GCM-SHA384 first
/// (OpenSSL's and rustls' default order) cost the engine about a fifth of a full handshake's CPU
/// in that hash alone (perf, `perf/tls.sh` full-conc). A redirect's records are a few hundred
/// bytes, so the bulk cipher's speed hardly matters; AES-128-GCM and ChaCha20-Poly1305 are both
/// strong. AES-256 stays for peers that offer nothing else. The engine's server applies this
/// order (`ignore_client_order`); a client offers it.
pub fn cipher_suites() -> Vec<SupportedCipherSuite> {
    vec![
        cs::TLS13_AES_128_GCM_SHA256,
        cs::TLS13_CHACHA20_POLY1305_SHA256,
        cs::TLS13_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
        cs::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        cs::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ]
}

/// ring for everything (signatures, randomness, key exchange: X25519, P-256, P-384) with
/// [`cipher_suites`]; build configurations on it with [`VERSIONS`].
pub fn provider() -> CryptoProvider {
    CryptoProvider {
        cipher_suites: cipher_suites(),
        ..rustls::crypto::ring::default_provider()
    }
}

#[cfg(test)]
mod tests {
    use rustls::{CipherSuite, ProtocolVersion};

    use super::*;

    #[test]
    fn tls13_then_tls12() {
        let versions: Vec<ProtocolVersion> = VERSIONS.iter().map(|v| v.version).collect();
        assert_eq!(
            versions,
            [ProtocolVersion::TLSv1_3, ProtocolVersion::TLSv1_2]
        );
    }

    #[test]
    fn sha256_suites_first_and_all_of_rings() {
        let suites: Vec<CipherSuite> = cipher_suites().iter().map(|s| s.suite()).collect();
        assert_eq!(
            suites,
            [
                CipherSuite::TLS13_AES_128_GCM_SHA256,
                CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
                CipherSuite::TLS13_AES_256_GCM_SHA384,
                CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
                CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
                CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
            ]
        );
        // The same set as ring's defaults: only the order is ours.
        let mut ours = suites.clone();
        let mut rings: Vec<CipherSuite> = rustls::crypto::ring::DEFAULT_CIPHER_SUITES
            .iter()
            .map(|s| s.suite())
            .collect();
        ours.sort_by_key(|s| u16::from(*s));
        rings.sort_by_key(|s| u16::from(*s));
        assert_eq!(ours, rings);
        assert_eq!(
            provider()
                .cipher_suites
                .iter()
                .map(|s| s.suite())
                .collect::<Vec<_>>(),
            suites
        );
    }
}
