//! Snapshot signatures (`lasthop-control keygen --signing --out FILE`, `serve
//! --snapshot-signing-key FILE`): every snapshot frame the control plane announces carries an
//! Ed25519 signature of [`SnapshotFrame::signed_message`] (its id, sequence, size and SHA-256),
//! and engines that pin the public key (`--snapshot-verify-key`) refuse a snapshot whose frame
//! does not verify. The file's SHA-256, which the engine checks after the download, ties the
//! bytes to the signed frame, so neither a tampered file nor a forged snapshot frame is served,
//! whatever the channel. Only snapshots are signed: the feed's link and state frames and the
//! read-through's answers are as trustworthy as the channel, which is why it should be TLS
//! (`--edge-tls-cert`, engines' `--control-ca`). A signature has no expiry: an old, validly
//! signed snapshot can be replayed to an engine starting without one (it then catches up from
//! the feed, and marks never go down).
//!
//! The key file is PKCS#8 in PEM (`-----BEGIN PRIVATE KEY-----`), as `openssl genpkey
//! -algorithm ed25519` writes it too; the public key is 32 bytes, shown and pinned as 64 hex
//! digits.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use lasthop_core::feed::SnapshotFrame;
use ring::rand::SystemRandom;
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivatePkcs8KeyDer;

/// Why a signing key could not be made or loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SigningError {
    #[error("{} exists; pass --force to replace it (engines pinning its public key will refuse new snapshots)", .0.display())]
    Exists(PathBuf),
    #[error("writing {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("reading {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{} is not an Ed25519 PKCS#8 key: {reason}", path.display())]
    NotEd25519 { path: PathBuf, reason: String },
    #[error("generating a key: the system's random source failed")]
    Random,
    /// Others can read or write the key file.
    #[error("snapshot signing key {0}")]
    Loose(lasthop_core::secret::SecretError),
}

/// The control plane's snapshot signing key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &self.public_hex())
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Generates a key and writes it to `path` (mode 0600, refusing to replace a file unless
    /// `force`); returns it.
    pub fn generate(path: &Path, force: bool) -> Result<SigningKey, SigningError> {
        if path.exists() && !force {
            return Err(SigningError::Exists(path.to_path_buf()));
        }
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new())
            .map_err(|_| SigningError::Random)?;
        let b64 = base64::engine::general_purpose::STANDARD.encode(pkcs8.as_ref());
        let mut pem = String::from("-----BEGIN PRIVATE KEY-----\n");
        for line in b64.as_bytes().chunks(64) {
            pem.push_str(&String::from_utf8_lossy(line));
            pem.push('\n');
        }
        pem.push_str("-----END PRIVATE KEY-----\n");
        lasthop_core::secret::write(path, pem.as_bytes()).map_err(|source| {
            SigningError::Write {
                path: path.to_path_buf(),
                source,
            }
        })?;
        SigningKey::load(path)
    }

    /// Loads the key in `path` (PKCS#8 PEM, v1 or v2).
    pub fn load(path: &Path) -> Result<SigningKey, SigningError> {
        lasthop_core::secret::refuse_loose(path).map_err(SigningError::Loose)?;
        let der = PrivatePkcs8KeyDer::from_pem_file(path).map_err(|source| SigningError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let pair =
            Ed25519KeyPair::from_pkcs8_maybe_unchecked(der.secret_pkcs8_der()).map_err(|e| {
                SigningError::NotEd25519 {
                    path: path.to_path_buf(),
                    reason: e.to_string(),
                }
            })?;
        Ok(SigningKey { pair })
    }

    /// The public key, 64 hex digits: what engines pin.
    pub fn public_hex(&self) -> String {
        hex::encode(self.pair.public_key().as_ref())
    }

    /// `frame` with its signature.
    pub fn sign(&self, mut frame: SnapshotFrame) -> SnapshotFrame {
        let sig = self.pair.sign(&frame.signed_message());
        frame.signature = Some(hex::encode(sig.as_ref()));
        frame
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, ED25519};

    fn frame() -> SnapshotFrame {
        SnapshotFrame {
            id: "0000000000000007-0123abcd".into(),
            seq: 7,
            size: 1234,
            sha256: "0123abcd".repeat(8),
            url: "/edge/v1/snapshots/0000000000000007-0123abcd".into(),
            signature: None,
        }
    }

    #[test]
    fn a_signing_key_others_can_read_is_refused_naming_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signing.key");
        SigningKey::generate(&path, false).unwrap();
        assert!(SigningKey::load(&path).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = SigningKey::load(&path).err().unwrap().to_string();
        assert!(
            e.starts_with("snapshot signing key ") && e.contains("chmod o-rwx"),
            "{e}"
        );
    }

    #[test]
    fn signs_what_the_public_key_verifies() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("signing.key");
        let key = SigningKey::generate(&path, false).unwrap();
        assert!(matches!(
            SigningKey::generate(&path, false),
            Err(SigningError::Exists(_))
        ));
        let again = SigningKey::load(&path).unwrap();
        assert_eq!(key.public_hex(), again.public_hex());
        let signed = again.sign(frame());
        let public = UnparsedPublicKey::new(&ED25519, hex::decode(key.public_hex()).unwrap());
        let sig = hex::decode(signed.signature.as_deref().unwrap()).unwrap();
        assert!(public.verify(&signed.signed_message(), &sig).is_ok());
        let mut forged = signed.clone();
        forged.sha256 = "f".repeat(64);
        assert!(public.verify(&forged.signed_message(), &sig).is_err());
        let mode = std::fs::metadata(&path).unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        assert_eq!(mode.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn refuses_what_is_not_an_ed25519_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("k");
        lasthop_core::secret::write(&path, b"not a key").unwrap();
        assert!(matches!(
            SigningKey::load(&path),
            Err(SigningError::Read { .. })
        ));
    }
}
