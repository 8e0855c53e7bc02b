//! Kernel TLS: the probe at start and the hand-off of a finished handshake's record layer.
//!
//! The kernel's side (the TLS ULP, the `tls12_crypto_info_*` structs and their `setsockopt`
//! calls) is `ktls-core`'s: it works on any descriptor, which is what the io_uring loop has (a
//! regular descriptor installed beside the fixed slot at accept). The `ktls` crate of the same
//! family was not taken: its set-up takes a `tokio_rustls` stream and brings tokio with it, and
//! our connections are neither (`engine/DESIGN.md`, "HTTPS").

use std::io;

use ktls_core::probe::{Compatibilities, Compatibility};
use ktls_core::tls::{ConnectionTrafficSecrets, ProtocolVersion};
use ktls_core::{setup_ulp, TlsCryptoInfoRx, TlsCryptoInfoTx};

/// What this kernel's TLS ULP takes, per version and cipher, in both directions as the probe
/// found them.
#[derive(Debug, Clone, Copy)]
pub struct KtlsSupport {
    tls12: Compatibility,
    tls13: Compatibility,
}

impl KtlsSupport {
    /// Whether a connection that negotiated `suite` can be handed to the kernel.
    pub fn takes(&self, tls13: bool, suite: rustls::CipherSuite) -> bool {
        use rustls::CipherSuite as C;
        let c = if tls13 { self.tls13 } else { self.tls12 };
        match suite {
            C::TLS13_AES_128_GCM_SHA256
            | C::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
            | C::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 => c.aes_128_gcm(),
            C::TLS13_AES_256_GCM_SHA384
            | C::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | C::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384 => c.aes_256_gcm(),
            C::TLS13_CHACHA20_POLY1305_SHA256
            | C::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
            | C::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256 => c.chacha20_poly1305(),
            _ => false,
        }
    }
}

/// Whether this kernel takes the TLS upper-layer protocol on a TCP socket (kTLS), and for which
/// versions and ciphers (kernels differ: ChaCha20 and TLS 1.3 came later than AES-GCM). Tried
/// once at start on loopback connections of its own, with zero keys: only the kernel's
/// acceptance is tested.
pub fn probe_ktls() -> io::Result<KtlsSupport> {
    match Compatibilities::probe()? {
        Some(c) => Ok(KtlsSupport {
            tls12: c.tls12,
            tls13: c.tls13,
        }),
        None => Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "the kernel does not take the TLS ULP (no CONFIG_TLS, or the tls module is not loaded)",
        )),
    }
}

/// Hands a connection's record layer to the kernel: the TLS ULP, then the transmit and receive
/// keys and sequence numbers rustls extracted once the handshake was done and every record it
/// had was sent. From then on the socket carries plaintext for us and records on the wire.
/// `tls13` selects the record version.
pub fn ktls_install(
    fd: &impl std::os::fd::AsFd,
    tls13: bool,
    secrets: rustls::ExtractedSecrets,
) -> io::Result<()> {
    let version = if tls13 {
        ProtocolVersion::TLSv1_3
    } else {
        ProtocolVersion::TLSv1_2
    };
    let (tx_seq, tx) = secrets.tx;
    let (rx_seq, rx) = secrets.rx;
    let tx = ConnectionTrafficSecrets::try_from(tx).map_err(io::Error::other)?;
    let rx = ConnectionTrafficSecrets::try_from(rx).map_err(io::Error::other)?;
    let tx = TlsCryptoInfoTx::new(version, tx, tx_seq).map_err(io::Error::other)?;
    let rx = TlsCryptoInfoRx::new(version, rx, rx_seq).map_err(io::Error::other)?;
    setup_ulp(fd).map_err(io::Error::other)?;
    tx.set(fd).map_err(io::Error::other)?;
    rx.set(fd).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ktls_probe_answers() {
        // Either way is fine; the point is that it answers without panicking, and that a
        // kernel without the ULP is told apart from a failure to probe.
        match probe_ktls() {
            Ok(s) => eprintln!("kTLS available: {s:?}"),
            Err(e) => eprintln!("kTLS unavailable: {e}"),
        }
    }
}
