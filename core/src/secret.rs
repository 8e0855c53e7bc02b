//! Secret files (the permutation key, the snapshot signing key, the edge token): written so that
//! no other user can ever read a byte of them. The file is made under a temporary name in the
//! same directory, with mode 0600 from its creation (`O_CREAT|O_EXCL` with the mode, then
//! `fchmod` in case a umask took more), filled, synced, and renamed over the final name, then
//! the directory is synced: a reader sees the old file or the whole new one, and a replaced
//! file's looser mode never carries over to the new bytes.

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
    fn a_directory_that_is_not_there_is_an_error_and_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        assert!(write(&dir.path().join("missing/key"), b"x").is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
