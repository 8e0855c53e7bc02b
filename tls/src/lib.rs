//! `lasthop-tls`: the TLS rules the engine and the control plane share, so the two ends of a
//! connection between them are set up by one piece of code.
//!
//! - [`certs`], [`private_key`], [`root_store`]: a certificate chain, a private key and a CA
//!   bundle read from PEM files, with one [`Error`] that names the file, what it was read as
//!   ([`FileKind`]) and what was wrong (unreadable, empty, bad PEM, nothing of the right kind).
//! - [`VERSIONS`], [`cipher_suites`], [`provider`]: TLS 1.3 and 1.2, the ring provider's
//!   ECDHE + AEAD suites with the SHA-256 ones first; every client and server configuration of
//!   both programs is built on them (the engine's server swaps in its own key exchange groups).
//! - [`client_config`]: how an engine reaches a control plane (`--control-ca`,
//!   `--control-client-cert`) and a control plane its peers (`--peer-ca`,
//!   `--peer-client-cert`): the server verified against a CA file or the public web PKI
//!   ([`Roots`]), optionally presenting a client certificate.
//!
//! - [`certificate::check`]: a branded domain's certificate and key as an owner uploads them,
//!   checked (key, name, validity, chain) before the control plane stores them.
//!
//! ring only, no async runtime: the engine's post-quantum key exchange (aws-lc-rs) and each
//! program's listener stay with the program.

pub mod certificate;
mod client;
mod error;
mod pem;
mod protocol;

pub use client::{client_config, system_roots, Roots};
pub use error::{Error, FileKind};
pub use pem::{certs, private_key, root_store};
pub use protocol::{cipher_suites, provider, VERSIONS};
