//! Certificates, keys and CA bundles read from PEM files.
//!
//! A file is read whole (they are a few KiB) so that an unreadable file, an empty one, bad PEM
//! and PEM without the wanted section each get their own [`Error`].

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::RootCertStore;

use crate::error::{Error, FileKind};

/// The file's bytes, refused when empty.
fn read(kind: FileKind, path: &Path) -> Result<Vec<u8>, Error> {
    let bytes = std::fs::read(path).map_err(|source| Error::Read {
        kind,
        path: path.to_path_buf(),
        source,
    })?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Error::Empty {
            kind,
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

/// Every `T` section in the file, at least one; sections of other kinds are skipped.
fn sections<T: PemObject>(kind: FileKind, path: &Path) -> Result<Vec<T>, Error> {
    let bytes = read(kind, path)?;
    let items = T::pem_slice_iter(&bytes)
        .collect::<Result<Vec<T>, _>>()
        .map_err(|source| Error::BadPem {
            kind,
            path: path.to_path_buf(),
            source,
        })?;
    if items.is_empty() {
        return Err(missing(kind, path));
    }
    Ok(items)
}

fn missing(kind: FileKind, path: &Path) -> Error {
    Error::Missing {
        kind,
        path: path.to_path_buf(),
    }
}

/// The certificate chain in a PEM file, leaf first (at least one certificate).
pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, Error> {
    sections(FileKind::CertificateChain, path)
}

/// The private key in a PEM file (PKCS#8, PKCS#1 or SEC1; the first if there are several).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, Error> {
    let kind = FileKind::PrivateKey;
    sections(kind, path)?
        .into_iter()
        .next()
        .ok_or_else(|| missing(kind, path))
}

/// The CA certificates in a PEM file as trust anchors; one rustls cannot use fails the whole
/// file rather than being skipped (a bundle that trusts less than it says is a silent outage).
pub fn root_store(path: &Path) -> Result<RootCertStore, Error> {
    let mut roots = RootCertStore::empty();
    for cert in sections::<CertificateDer<'static>>(FileKind::CaBundle, path)? {
        roots.add(cert).map_err(|source| Error::Rejected {
            kind: FileKind::CaBundle,
            path: path.to_path_buf(),
            source,
        })?;
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn testdata(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name)
    }

    fn file(dir: &tempfile::TempDir, name: &str, contents: &[u8]) -> PathBuf {
        let path = dir.path().join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[test]
    fn a_missing_file_is_named_with_what_it_was_read_as() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nope.pem");
        let e = certs(&path).unwrap_err();
        assert!(
            matches!(&e, Error::Read { kind: FileKind::CertificateChain, path: p, source }
                if *p == path && source.kind() == std::io::ErrorKind::NotFound),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(text.starts_with("reading certificate chain "), "{text}");
        assert!(text.contains("nope.pem"), "{text}");
        assert!(matches!(
            private_key(&path),
            Err(Error::Read {
                kind: FileKind::PrivateKey,
                ..
            })
        ));
    }

    #[test]
    fn an_empty_file_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        for contents in [&b""[..], b"\n \n"] {
            let path = file(&dir, "empty.pem", contents);
            let e = root_store(&path).unwrap_err();
            assert!(
                matches!(&e, Error::Empty { kind: FileKind::CaBundle, path: p } if *p == path),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                format!("CA bundle {} is empty", path.display())
            );
            assert!(matches!(private_key(&path), Err(Error::Empty { .. })));
        }
    }

    #[test]
    fn bad_pem_is_bad_pem() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(
            &dir,
            "cut.pem",
            b"-----BEGIN CERTIFICATE-----\nMIIB\n", // no end marker
        );
        let e = certs(&path).unwrap_err();
        assert!(matches!(e, Error::BadPem { .. }), "{e:?}");
        assert!(e.to_string().contains(": bad PEM: "), "{e}");
    }

    #[test]
    fn a_key_is_not_a_certificate() {
        let key = testdata("self-signed.key");
        let e = certs(&key).unwrap_err();
        assert!(
            matches!(&e, Error::Missing { kind: FileKind::CertificateChain, path } if *path == key),
            "{e:?}"
        );
        assert!(e.to_string().contains("holds no certificate"), "{e}");
        let e = private_key(&testdata("self-signed.pem")).unwrap_err();
        assert!(e.to_string().contains("holds no private key"), "{e}");
    }

    #[test]
    fn text_without_pem_holds_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = file(&dir, "notes.txt", b"not a certificate\n");
        assert!(matches!(certs(&path), Err(Error::Missing { .. })));
    }

    #[test]
    fn a_self_signed_pair_reads() {
        let chain = certs(&testdata("self-signed.pem")).unwrap();
        assert_eq!(chain.len(), 1);
        let key = private_key(&testdata("self-signed.key")).unwrap();
        assert!(matches!(key, PrivateKeyDer::Pkcs8(_)));
        assert_eq!(root_store(&testdata("self-signed.pem")).unwrap().len(), 1);
    }

    #[test]
    fn a_combined_file_gives_each_its_part() {
        // One file holding key and certificate (as some tools write them): each reader skips
        // the other's section.
        let dir = tempfile::tempdir().unwrap();
        let mut both = std::fs::read(testdata("self-signed.key")).unwrap();
        both.extend(std::fs::read(testdata("self-signed.pem")).unwrap());
        let path = file(&dir, "both.pem", &both);
        assert_eq!(certs(&path).unwrap().len(), 1);
        assert!(private_key(&path).is_ok());
    }
}
