//! The one error of this crate: which file, read as what, and what was wrong with it.

use std::path::PathBuf;

/// What a PEM file was read as; error messages name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum FileKind {
    /// A certificate chain, leaf first (a server's, or a client's identity).
    CertificateChain,
    /// A private key (PKCS#8, PKCS#1 or SEC1).
    PrivateKey,
    /// The CA certificates a peer's certificate must chain to.
    CaBundle,
}

impl FileKind {
    /// What the file must hold at least one of.
    fn item(self) -> &'static str {
        match self {
            FileKind::CertificateChain | FileKind::CaBundle => {
                "certificate (`-----BEGIN CERTIFICATE-----`)"
            }
            FileKind::PrivateKey => {
                "private key (unencrypted PKCS#8 `PRIVATE KEY`, PKCS#1 `RSA PRIVATE KEY` or SEC1 `EC PRIVATE KEY`)"
            }
        }
    }
}

impl std::fmt::Display for FileKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FileKind::CertificateChain => "certificate chain",
            FileKind::PrivateKey => "private key",
            FileKind::CaBundle => "CA bundle",
        })
    }
}

/// Why a PEM file or a TLS configuration built from PEM files could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No CA file was given and the system has no trusted CAs.
    #[error(
        "the system has no trusted CAs (install ca-certificates, or give the CA file that signed \
         the server's certificate)"
    )]
    NoSystemRoots,
    /// The file could not be read (missing, not permitted, a directory).
    #[error("reading {kind} {}: {source}", path.display())]
    Read {
        kind: FileKind,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The file is empty (or only white space).
    #[error("{kind} {} is empty", path.display())]
    Empty { kind: FileKind, path: PathBuf },
    /// The file is not well-formed PEM.
    #[error("{kind} {}: bad PEM: {source}", path.display())]
    BadPem {
        kind: FileKind,
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    /// The file is PEM but holds nothing of the kind wanted (a key given as the certificate).
    #[error("{kind} {} holds no {}", path.display(), kind.item())]
    Missing { kind: FileKind, path: PathBuf },
    /// A CA certificate rustls cannot use as a trust anchor.
    #[error("{kind} {}: {source}", path.display())]
    Rejected {
        kind: FileKind,
        path: PathBuf,
        source: rustls::Error,
    },
    /// A client certificate and key rustls refused together (the key does not match, or its
    /// algorithm is not supported).
    #[error("client certificate {} and key {}: {source}", cert.display(), key.display())]
    Identity {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    /// rustls refused the configuration itself.
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}
