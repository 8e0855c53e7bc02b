//! The client configuration lasthop's programs reach each other with: an engine its control
//! planes, a control plane its peer regions.

use std::path::Path;
use std::sync::Arc;

use rustls::ClientConfig;

use crate::error::Error;
use crate::pem::{certs, private_key, root_store};
use crate::protocol::{provider, VERSIONS};

/// What a client verifies the server's certificate against.
#[derive(Debug, Clone, Copy)]
pub enum Roots<'a> {
    /// Only the CA certificates in this PEM file (`--control-ca`, `--peer-ca`).
    CaFile(&'a Path),
    /// The public web PKI (Mozilla's roots as `webpki-roots` ships them, the ones ureq uses
    /// when given no configuration).
    WebPki,
    /// The system's trusted CAs (`/etc/ssl/certs` on Debian, read by `rustls-native-certs`):
    /// for a backend's certificate from the operator's own CA installed there (PostgreSQL's
    /// `sslrootcert=system`, ClickHouse without `--clicks-store-ca`).
    System,
}

/// The system's trusted CAs; an error when there are none (no ca-certificates).
pub fn system_roots() -> Result<rustls::RootCertStore, Error> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    if roots.is_empty() {
        return Err(Error::NoSystemRoots);
    }
    Ok(roots)
}

/// A client on [`provider`] and [`VERSIONS`] that verifies servers against `roots`; with
/// `identity` (a certificate chain and its key, PEM files), it presents that certificate to a
/// server that asks for one (mutual TLS: `--edge-client-ca` on the control plane).
pub fn client_config(
    roots: Roots<'_>,
    identity: Option<(&Path, &Path)>,
) -> Result<Arc<ClientConfig>, Error> {
    let roots = match roots {
        Roots::CaFile(path) => root_store(path)?,
        Roots::WebPki => rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        },
        Roots::System => system_roots()?,
    };
    let builder = ClientConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(VERSIONS)?
        .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(certs(cert)?, private_key(key)?)
            .map_err(|source| Error::Identity {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                source,
            })?,
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use rustls::pki_types::ServerName;
    use rustls::{CipherSuite, ClientConnection, ProtocolVersion, ServerConfig, ServerConnection};

    use super::*;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    /// Moves records between the two ends until neither has anything to send.
    fn handshake(client: &mut ClientConnection, server: &mut ServerConnection) {
        let mut buf = Vec::new();
        for _ in 0..10 {
            buf.clear();
            while client.wants_write() {
                client.write_tls(&mut buf).unwrap();
            }
            let mut from_client = &buf[..];
            while !from_client.is_empty() {
                server.read_tls(&mut from_client).unwrap();
                server.process_new_packets().unwrap();
            }
            let mut back = Vec::new();
            while server.wants_write() {
                server.write_tls(&mut back).unwrap();
            }
            let mut from_server = &back[..];
            while !from_server.is_empty() {
                client.read_tls(&mut from_server).unwrap();
                client.process_new_packets().unwrap();
            }
            if !client.is_handshaking() && !server.is_handshaking() {
                return;
            }
        }
        panic!("the handshake did not finish");
    }

    /// A server for the self-signed pair on the shared provider, speaking only `versions`.
    fn server(versions: &[&'static rustls::SupportedProtocolVersion]) -> ServerConnection {
        let config = ServerConfig::builder_with_provider(Arc::new(provider()))
            .with_protocol_versions(versions)
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                certs(&testdata("self-signed.pem")).unwrap(),
                private_key(&testdata("self-signed.key")).unwrap(),
            )
            .unwrap();
        ServerConnection::new(Arc::new(config)).unwrap()
    }

    #[test]
    fn verifies_against_the_ca_file_with_the_shared_versions_and_suites() {
        let cert = testdata("self-signed.pem");
        let client = client_config(Roots::CaFile(&cert), None).unwrap();
        // The server follows the client's order, whose first is ours; a server that speaks
        // only TLS 1.2 still finds it offered.
        for (versions, version, suite) in [
            (
                VERSIONS,
                ProtocolVersion::TLSv1_3,
                CipherSuite::TLS13_AES_128_GCM_SHA256,
            ),
            (
                &[&rustls::version::TLS12][..],
                ProtocolVersion::TLSv1_2,
                CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
            ),
        ] {
            let name = ServerName::try_from("lasthop.test").unwrap();
            let mut c = ClientConnection::new(Arc::clone(&client), name).unwrap();
            let mut s = server(versions);
            handshake(&mut c, &mut s);
            assert_eq!(c.protocol_version(), Some(version));
            assert_eq!(c.negotiated_cipher_suite().map(|s| s.suite()), Some(suite));
        }
    }

    #[test]
    fn refuses_a_server_its_roots_do_not_vouch_for() {
        let client = client_config(Roots::WebPki, None).unwrap();
        let name = ServerName::try_from("lasthop.test").unwrap();
        let mut c = ClientConnection::new(client, name).unwrap();
        let mut s = server(VERSIONS);
        let mut buf = Vec::new();
        c.write_tls(&mut buf).unwrap();
        s.read_tls(&mut &buf[..]).unwrap();
        s.process_new_packets().unwrap();
        let mut back = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut back).unwrap();
        }
        c.read_tls(&mut &back[..]).unwrap();
        let e = c.process_new_packets().unwrap_err();
        assert!(matches!(e, rustls::Error::InvalidCertificate(_)), "{e:?}");
    }

    #[test]
    fn presents_a_matching_identity_and_refuses_a_mismatched_one() {
        let cert = testdata("self-signed.pem");
        let good =
            client_config(Roots::WebPki, Some((&cert, &testdata("self-signed.key")))).unwrap();
        assert!(good.client_auth_cert_resolver.has_certs());
        let e =
            client_config(Roots::CaFile(&cert), Some((&cert, &testdata("other.key")))).unwrap_err();
        assert!(matches!(e, Error::Identity { .. }), "{e:?}");
        assert!(e.to_string().contains("other.key"), "{e}");
    }

    #[test]
    fn the_client_offers_the_shared_suites() {
        let config = client_config(Roots::WebPki, None).unwrap();
        assert_eq!(
            config
                .crypto_provider()
                .cipher_suites
                .iter()
                .map(|s| s.suite())
                .collect::<Vec<_>>(),
            crate::cipher_suites()
                .iter()
                .map(|s| s.suite())
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_ca_file_error_names_the_ca_bundle() {
        let e = client_config(Roots::CaFile(&testdata("self-signed.key")), None).unwrap_err();
        assert!(
            e.to_string().starts_with("CA bundle ")
                && e.to_string().contains("holds no certificate"),
            "{e}"
        );
    }
}
