//! TLS on the edge listener (`serve --edge-tls-cert FILE --edge-tls-key FILE`), optionally
//! with client certificates (`--edge-client-ca FILE`): the channel that carries every
//! destination, every takedown and every snapshot to the engines.
//!
//! rustls with ring, TLS 1.3 and 1.2 with the engine's suites ([`lasthop_tls`], which also reads
//! the PEM files and builds the peers' client configuration), `http/1.1` over ALPN. Handshakes
//! run in tasks of their own (each bounded by [`HANDSHAKE_TIMEOUT`], at most [`MAX_HANDSHAKES`]
//! at once) so a slow or hostile client never holds up the accept loop; finished ones are
//! handed to `axum::serve` through [`TlsListener`]. A failed handshake (a client that does not
//! trust our certificate, a client certificate our CA did not sign, a port scanner) is logged
//! with its peer and reason and counts nothing else.
//!
//! With `--edge-client-ca`, a client certificate signed by that CA is required to complete the
//! handshake, and it replaces the edge token (the mutual-TLS alternative): the router then
//! admits requests without `Authorization`. Without it, the token is checked as on plain HTTP.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// The longest a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes in progress at once: past it, new connections wait in the kernel's accept
/// queue, so a flood of idle connections cannot use up descriptors and memory.
pub const MAX_HANDSHAKES: usize = 256;

/// Why the edge listener's TLS could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EdgeTlsError {
    /// A certificate, key or CA file (the message names it and what was wrong).
    #[error(transparent)]
    Pem(#[from] lasthop_tls::Error),
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("client CA {}: {source}", path.display())]
    ClientCa {
        path: PathBuf,
        source: rustls::server::VerifierBuilderError,
    },
}

/// The edge listener's TLS settings.
#[derive(Clone)]
pub struct EdgeTls {
    acceptor: TlsAcceptor,
    client_auth: bool,
}

impl std::fmt::Debug for EdgeTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EdgeTls")
            .field("client_auth", &self.client_auth)
            .finish_non_exhaustive()
    }
}

impl EdgeTls {
    /// Serves `cert` (a PEM chain, leaf first) with `key`; with `client_ca`, requires client
    /// certificates signed by one of the CAs in that PEM file.
    pub fn load(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
    ) -> Result<EdgeTls, EdgeTlsError> {
        let provider = Arc::new(lasthop_tls::provider());
        let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_protocol_versions(lasthop_tls::VERSIONS)?;
        let builder = match client_ca {
            Some(path) => {
                let roots = lasthop_tls::root_store(path)?;
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|source| EdgeTlsError::ClientCa {
                            path: path.to_path_buf(),
                            source,
                        })?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_single_cert(lasthop_tls::certs(cert)?, lasthop_tls::private_key(key)?)?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(EdgeTls {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            client_auth: client_ca.is_some(),
        })
    }

    /// Clients must present a certificate our client CA signed (and then need no token).
    pub fn client_auth(&self) -> bool {
        self.client_auth
    }

    /// Accepts on `tcp` and hands out connections whose handshake completed.
    pub fn listen(self, tcp: TcpListener) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (tx, rx) = mpsc::channel(64);
        tokio::spawn(accept_loop(tcp, self.acceptor, tx));
        Ok(TlsListener { rx, local })
    }
}

async fn accept_loop(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let permit = tokio::select! {
            () = tx.closed() => return,
            permit = Arc::clone(&handshakes).acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            // The server stopped and dropped its end: stop accepting.
            () = tx.closed() => return,
            accepted = tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    // Out of descriptors and the like: wait rather than spin.
                    tracing::warn!(error = %e, "edge listener: accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "edge listener: TLS handshake refused");
                }
                Err(_) => tracing::warn!(%peer, "edge listener: TLS handshake timed out"),
            }
        });
    }
}

/// Connections of the TLS edge listener, for `axum::serve`.
#[derive(Debug)]
pub struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(conn) => conn,
            // The accept loop only ends once this end is dropped, so this never happens; a
            // listener that has nothing more to give waits forever, as a closed socket would.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
