//! The permutation key file.
//!
//! One line of hex (16, 24 or 32 bytes: AES-128/192/256); blank lines and `#` comments are
//! allowed. The key id is derived, not stored, so a file can never disagree with its id: the
//! first 4 bytes of SHA-256("lasthop-key-id\0" || key). Snapshots record it so an engine never
//! serves a snapshot built for another key.

use std::path::Path;

use sha2::{Digest, Sha256};

use crate::ff1::{Ff1, Ff1Error};

/// Why a key file could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    #[error("reading key file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("key file {path} holds no key line")]
    Empty { path: String },
    #[error("key file {path} is not hex")]
    NotHex { path: String },
    #[error("key file {path}: {source}")]
    Cipher { path: String, source: Ff1Error },
    #[error("generating a key: {0}")]
    Random(String),
    /// Others can read or write the file.
    #[error("key file {0}")]
    Loose(crate::secret::SecretError),
}

/// A loaded permutation key.
#[derive(Clone)]
pub struct PermutationKey {
    bytes: Vec<u8>,
    ff1: Ff1,
}

impl std::fmt::Debug for PermutationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PermutationKey {{ id: {:08x}, .. }}", self.id())
    }
}

impl PermutationKey {
    /// A key from raw bytes (16, 24 or 32).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, Ff1Error> {
        Ok(PermutationKey {
            ff1: Ff1::new(bytes)?,
            bytes: bytes.to_vec(),
        })
    }

    /// A fresh random key of `bytes` length (16, 24 or 32).
    pub fn generate(bytes: usize) -> Result<Self, KeyError> {
        let mut raw = vec![0u8; bytes];
        getrandom::getrandom(&mut raw).map_err(|e| KeyError::Random(e.to_string()))?;
        PermutationKey::from_bytes(&raw).map_err(|source| KeyError::Cipher {
            path: "<generated>".into(),
            source,
        })
    }

    /// Parses the text of a key file.
    pub fn parse(text: &str, path: &str) -> Result<Self, KeyError> {
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .ok_or_else(|| KeyError::Empty { path: path.into() })?;
        let bytes = hex::decode(line).map_err(|_| KeyError::NotHex { path: path.into() })?;
        PermutationKey::from_bytes(&bytes).map_err(|source| KeyError::Cipher {
            path: path.into(),
            source,
        })
    }

    /// Reads a key file, refused when users other than its owner and group can reach it.
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let shown = path.display().to_string();
        crate::secret::refuse_loose(path).map_err(KeyError::Loose)?;
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
            path: shown.clone(),
            source,
        })?;
        PermutationKey::parse(&text, &shown)
    }

    /// The file's text: a comment and the hex line.
    pub fn to_file_text(&self) -> String {
        format!(
            "# lasthop permutation key (AES-{}), id {:08x}. Secret: install on control-plane and PoP hosts only.\n{}\n",
            self.bytes.len() * 8,
            self.id(),
            hex::encode(&self.bytes)
        )
    }

    /// The derived key id.
    pub fn id(&self) -> u32 {
        let mut h = Sha256::new();
        h.update(b"lasthop-key-id\0");
        h.update(&self.bytes);
        let digest = h.finalize();
        u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]])
    }

    /// The FF1 instance under this key.
    pub fn ff1(&self) -> &Ff1 {
        &self.ff1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_file_others_can_read_is_refused_and_group_access_is_not() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        let k = PermutationKey::generate(16).unwrap();
        crate::secret::write(&path, k.to_file_text().as_bytes()).unwrap();
        assert_eq!(PermutationKey::load(&path).unwrap().id(), k.id());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(PermutationKey::load(&path).unwrap().id(), k.id());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = PermutationKey::load(&path).err().unwrap().to_string();
        let shown = path.display().to_string();
        assert!(
            e.starts_with(&format!("key file {shown} is a secret file"))
                && e.contains(&format!("chmod o-rwx {shown}")),
            "{e}"
        );
        // A file that is not there says so, not "loose".
        let e = PermutationKey::load(&dir.path().join("none"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.starts_with("reading key file"), "{e}");
    }

    #[test]
    fn parse_round_trip_and_id_is_stable() {
        let k = PermutationKey::generate(16).unwrap();
        let back = PermutationKey::parse(&k.to_file_text(), "t").unwrap();
        assert_eq!(k.id(), back.id());
        let fixed =
            PermutationKey::parse("# c\n\n000102030405060708090a0b0c0d0e0f\n", "t").unwrap();
        assert_eq!(fixed.id(), fixed.clone().id());
        assert_ne!(fixed.id(), k.id());
    }

    #[test]
    fn rejects_bad_files() {
        assert!(matches!(
            PermutationKey::parse("# only\n", "t"),
            Err(KeyError::Empty { .. })
        ));
        assert!(matches!(
            PermutationKey::parse("zz", "t"),
            Err(KeyError::NotHex { .. })
        ));
        assert!(matches!(
            PermutationKey::parse("0011", "t"),
            Err(KeyError::Cipher { .. })
        ));
    }
}
