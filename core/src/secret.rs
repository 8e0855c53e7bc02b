//! Secret files (the permutation key, the snapshot signing key, the edge token): written so that
//! no other user can ever read a byte of them. The file is made under a temporary name in the
//! same directory, with mode 0600 from its creation (`O_CREAT|O_EXCL` with the mode, then
//! `fchmod` in case a umask took more), filled, synced, and renamed over the final name, then
//! the directory is synced: a reader sees the old file or the whole new one, and a replaced
//! file's looser mode never carries over to the new bytes.
//!
//! Every program refuses to start on a secret file that users other than its owner and group
//! can read, write or run (`mode & 0o007 != 0`), as OpenSSH refuses a loose private key:
//! [`check`] names the file, its mode and the `chmod` that fixes it. Group access stays
//! allowed: the package installs keys as `root:lasthop` 0640 for the units' `lasthop` user.

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mode every secret file is created with.
pub const MODE: u32 = 0o600;

/// Writes `bytes` to `path` as a secret file (see the module's doc), replacing any file there.
pub fn write(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "a secret file needs a name"))?
        .to_string_lossy()
        .into_owned();
    let mut nonce = [0u8; 8];
    getrandom::getrandom(&mut nonce).map_err(|e| io::Error::other(e.to_string()))?;
    let temp = dir.join(format!(".{name}.tmp.{}", hex::encode(nonce)));
    let result = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(MODE)
            .open(&temp)?;
        file.set_permissions(std::fs::Permissions::from_mode(MODE))?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        File::open(&dir)?.sync_all()
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Bits of a secret file's mode no one but its owner and group may have.
pub const OTHERS: u32 = 0o007;

/// A secret file others can reach.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "{path} is a secret file that other users can {access} (mode {mode:04o}): refusing to \
         use it; `chmod o-rwx {path}` fixes it (0600, or 0640 with a group for the service)"
    )]
    Loose {
        path: String,
        mode: u32,
        access: &'static str,
    },
    #[error("{path}: {source}")]
    Io { path: String, source: io::Error },
}

/// Refuses `path` when others (not its owner or its group) have any access to it.
pub fn check(path: &Path) -> Result<(), SecretError> {
    let meta = std::fs::metadata(path).map_err(|source| SecretError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o7777;
    if mode & OTHERS == 0 {
        return Ok(());
    }
    let access = match (mode & 0o004 != 0, mode & 0o002 != 0) {
        (true, true) => "read and write",
        (true, false) => "read",
        (false, true) => "write",
        (false, false) => "execute",
    };
    Err(SecretError::Loose {
        path: path.display().to_string(),
        mode,
        access,
    })
}

/// [`check`]'s refusal alone: `Ok` for a file that cannot be read, for the caller's own read to
/// report as it always has.
pub fn refuse_loose(path: &Path) -> Result<(), SecretError> {
    match check(path) {
        Err(e @ SecretError::Loose { .. }) => Err(e),
        _ => Ok(()),
    }
}

/// A secret file's bytes, after [`check`].
pub fn read(path: &Path) -> Result<Vec<u8>, SecretError> {
    check(path)?;
    std::fs::read(path).map_err(|source| SecretError::Io {
        path: path.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn created_0600_and_a_loose_file_replaced_not_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        write(&path, b"one\n").unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"one\n");
        // An existing world-readable file: the new bytes never live under its mode.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        write(&path, b"two\n").unwrap();
        assert_eq!(mode(&path), 0o600);
        assert_eq!(std::fs::read(&path).unwrap(), b"two\n");
        // Nothing left behind but the file.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn others_access_is_refused_with_the_fix_and_group_access_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        write(&path, b"k").unwrap();
        check(&path).unwrap();
        // The packaged layout: root:lasthop 0640.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        check(&path).unwrap();
        assert_eq!(read(&path).unwrap(), b"k");
        for (m, access) in [
            (0o644, "read"),
            (0o602, "write"),
            (0o666, "read and write"),
            (0o601, "execute"),
        ] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(m)).unwrap();
            let e = read(&path).unwrap_err().to_string();
            let p = path.display().to_string();
            assert!(
                e.starts_with(&p)
                    && e.contains(&format!("other users can {access} (mode {m:04o})"))
                    && e.contains(&format!("`chmod o-rwx {p}`")),
                "{e}"
            );
        }
        let e = check(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn a_directory_that_is_not_there_is_an_error_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write(&dir.path().join("missing/key"), b"x").is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
