//! The edge token (core/FEED.md): the shared secret every request to the edge listener
//! carries as `Authorization: Bearer <token>`.
//!
//! `serve` writes a random 256-bit token, 64 lowercase hex characters and a newline, to
//! `DATA_DIR/edge.token` on first start (mode 0600, temp file, fsync, rename) and keeps it across
//! restarts; operators copy the file to PoP hosts. Presented tokens are compared in constant time:
//! both sides are hashed to 32 bytes first, so neither the position of the first differing byte
//! nor the presented length shows in the timing. The token never appears in `Debug` or logs.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The token file's name in the data directory.
pub const TOKEN_FILE: &str = "edge.token";
/// The token's name among a shared store's secrets.
pub const SECRET_NAME: &str = "edge_token";
/// Random bytes in a token (256 bits).
const TOKEN_BYTES: usize = 32;

/// Why the edge token could not be read, written or made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EdgeTokenError {
    /// Others can read or write the token file.
    #[error("edge token {0}")]
    Loose(lasthop_core::secret::SecretError),
    /// The token file exists but could not be read.
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The token file does not hold a token.
    #[error("reading {}", path.display())]
    Malformed {
        path: PathBuf,
        #[source]
        source: MalformedToken,
    },
    /// The token the shared store holds is not one.
    #[error("the store's edge token")]
    MalformedShared(#[source] MalformedToken),
    /// A new token could not be written to the missing token file.
    #[error("writing a new edge token to {}", path.display())]
    WriteNew {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The shared store's token could not be written to the token file.
    #[error("writing the shared edge token to {}", path.display())]
    WriteShared {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The system's random source failed. (getrandom 0.2 without its `std` feature does not
    /// implement [`std::error::Error`], so the cause is only in the message.)
    #[error("random: {0}")]
    Random(getrandom::Error),
}

/// A token that is not 64 lowercase hex characters.
#[derive(Debug, thiserror::Error)]
#[error(
    "the edge token must be {} lowercase hex characters (delete the file to get a new one)",
    2 * TOKEN_BYTES
)]
#[non_exhaustive]
pub struct MalformedToken;

/// The edge token, held only as its SHA-256.
#[derive(Clone)]
pub struct EdgeToken {
    digest: [u8; 32],
}

impl std::fmt::Debug for EdgeToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EdgeToken(..)")
    }
}

impl EdgeToken {
    /// A token from its text (tests and embedders; `serve` uses [`EdgeToken::load_or_create`]).
    pub fn new(token: &str) -> EdgeToken {
        EdgeToken {
            digest: Sha256::digest(token.as_bytes()).into(),
        }
    }

    /// Reads `DATA_DIR/edge.token`, writing a new random token there first if it is missing.
    pub fn load_or_create(data_dir: &Path) -> Result<EdgeToken, EdgeTokenError> {
        let path = data_dir.join(TOKEN_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                lasthop_core::secret::refuse_loose(&path).map_err(EdgeTokenError::Loose)?;
                parse(&text).map_err(|source| EdgeTokenError::Malformed { path, source })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let token = generate()?;
                if let Err(source) = write_new(&path, &token) {
                    return Err(EdgeTokenError::WriteNew { path, source });
                }
                tracing::info!(path = %path.display(), "wrote a new edge token");
                Ok(EdgeToken::new(&token))
            }
            Err(source) => Err(EdgeTokenError::Read { path, source }),
        }
    }

    /// The token a shared store holds (the same for every control plane on it), also written
    /// to `DATA_DIR/edge.token` for the engines on this host when the file is missing or holds
    /// another.
    pub fn from_shared(data_dir: &Path, token: &str) -> Result<EdgeToken, EdgeTokenError> {
        let shared = parse(token).map_err(EdgeTokenError::MalformedShared)?;
        let path = data_dir.join(TOKEN_FILE);
        let on_disk = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| parse(&t).ok());
        if on_disk.as_ref().is_some_and(|t| t.digest == shared.digest) {
            lasthop_core::secret::refuse_loose(&path).map_err(EdgeTokenError::Loose)?;
        }
        if on_disk.is_none_or(|t| t.digest != shared.digest) {
            if let Err(source) = write_new(&path, token.trim_end()) {
                return Err(EdgeTokenError::WriteShared { path, source });
            }
            tracing::info!(path = %path.display(), "wrote the store's edge token");
        }
        Ok(shared)
    }

    /// Whether `presented` is the token, in time independent of where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        use subtle::ConstantTimeEq as _;
        let other: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        self.digest.ct_eq(&other).into()
    }
}

fn parse(text: &str) -> Result<EdgeToken, MalformedToken> {
    let token = text.trim_end_matches(['\n', '\r']);
    let well_formed = token.len() == 2 * TOKEN_BYTES
        && token
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    if !well_formed {
        return Err(MalformedToken);
    }
    Ok(EdgeToken::new(token))
}

fn generate() -> Result<String, EdgeTokenError> {
    let mut raw = [0u8; TOKEN_BYTES];
    getrandom::getrandom(&mut raw).map_err(EdgeTokenError::Random)?;
    Ok(hex::encode(raw))
}

/// A new random token's text, for a shared store to keep if it has none yet.
pub fn generate_text() -> Result<String, crate::store::StoreError> {
    generate().map_err(|e| crate::store::StoreError::File {
        what: "edge token",
        cause: Box::new(e),
    })
}

/// A secret file (0600 from its first byte, renamed into place), in a directory made first.
fn write_new(path: &Path, token: &str) -> std::io::Result<()> {
    std::fs::create_dir_all(path.parent().unwrap_or(Path::new(".")))?;
    lasthop_core::secret::write(path, format!("{token}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn created_once_then_kept() {
        let dir = tempfile::tempdir().unwrap();
        let token = EdgeToken::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(TOKEN_FILE);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.len(), 65);
        assert!(text.ends_with('\n'));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(token.matches(text.trim_end()));
        assert!(!token.matches(""));
        assert!(!token.matches(&text[..63]));
        assert!(!format!("{token:?}").contains(&text[..8]));

        let again = EdgeToken::load_or_create(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
        assert!(again.matches(text.trim_end()));
        // Nothing left beside it.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_token_file_others_can_read_is_refused_naming_it_and_group_access_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let token = EdgeToken::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(TOKEN_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(EdgeToken::load_or_create(dir.path()).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = EdgeToken::load_or_create(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&path.display().to_string()) && e.contains("chmod o-rwx"),
            "{e}"
        );
        // The store's token over a loose file of the same token: refused too.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(token.matches(text.trim_end()));
        assert!(EdgeToken::from_shared(dir.path(), text.trim_end()).is_err());
    }

    #[test]
    fn a_malformed_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(TOKEN_FILE), "short\n").unwrap();
        std::fs::set_permissions(
            dir.path().join(TOKEN_FILE),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let err = EdgeToken::load_or_create(dir.path()).unwrap_err();
        assert!(
            matches!(&err, EdgeTokenError::Malformed { path, .. } if path.ends_with(TOKEN_FILE)),
            "{err:?}"
        );
        let line = crate::error_chain::ErrorChain(&err).to_string();
        assert!(line.contains("64 lowercase hex"), "{line}");
    }
}
