//! A test PKI made with the openssl CLI at test time: a CA, and server certificates for
//! `lh.test` and 127.0.0.1 that it signs.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::engine::{set_mode, Site};

/// A test CA and a server certificate for `lh.test` and 127.0.0.1 (files in the site's dir).
#[derive(Debug)]
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Runs `openssl args` in `dir`, and checks it succeeded.
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (scripts/test installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A server certificate for `/CN=<cn>` (SAN from `san.ext`: lh.test and 127.0.0.1), signed by
/// the test CA in `dir`, with its key of algorithm `alg`.
pub fn server_cert(dir: &Path, alg: &[&str], cn: &str, key: &str, cert: &str) {
    signed_cert(dir, alg, cn, key, cert, "san.ext");
}

/// A certificate for `/CN=<cn>` with the extensions in `dir/ext` (they also make it X.509 v3,
/// which webpki requires), signed by the test CA `ca.pem` in `dir`, and its key of algorithm
/// `alg`.
pub fn signed_cert(dir: &Path, alg: &[&str], cn: &str, key: &str, cert: &str, ext: &str) {
    let subject = format!("/CN={cn}");
    let mut csr = vec!["req", "-nodes", "-subj", &subject];
    csr.extend_from_slice(alg);
    csr.extend_from_slice(&["-keyout", key, "-out", "srv.csr"]);
    openssl(dir, &csr);
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "srv.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            ext,
            "-out",
            cert,
        ],
    );
}

/// The P-256 key of the test PKIs (openssl's `-newkey` arguments).
pub const P256: &[&str] = &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];

/// A self-signed P-256 test CA with subject `/CN=<cn>` in `dir`: `NAME.pem` (returned) and its
/// key `NAME.key`.
pub fn test_ca(dir: &Path, cn: &str, name: &str) -> PathBuf {
    ca_of(dir, P256, cn, name)
}

/// A self-signed test CA with a key of algorithm `alg`: `NAME.pem` (returned), `NAME.key`.
fn ca_of(dir: &Path, alg: &[&str], cn: &str, name: &str) -> PathBuf {
    let subject = format!("/CN={cn}");
    let (key, pem) = (format!("{name}.key"), format!("{name}.pem"));
    let mut args = vec!["req", "-x509", "-nodes", "-days", "2", "-subj", &subject];
    args.extend_from_slice(alg);
    args.extend_from_slice(&["-keyout", &key, "-out", &pem]);
    openssl(dir, &args);
    dir.join(pem)
}

/// A P-256 test CA `ca.pem` (subject `/CN=<ca_cn>`) in `dir` and a server certificate it signs,
/// `cert` with its key `key`, for `/CN=<cn>` and subjectAltName `san` (`DNS:lh.test,IP:...`).
pub fn ca_and_server(dir: &Path, ca_cn: &str, san: &str, cn: &str, key: &str, cert: &str) {
    std::fs::create_dir_all(dir).expect("the PKI's dir");
    test_ca(dir, ca_cn, "ca");
    std::fs::write(dir.join("san.ext"), format!("subjectAltName={san}\n")).expect("san.ext");
    server_cert(dir, P256, cn, key, cert);
}

/// A CA and a server certificate (RSA 2048 when `rsa`, else P-256) in `site`'s dir, readable
/// by a non-root engine.
pub fn pki(site: &Site, rsa: bool) -> Pki {
    let dir = site.dir.path();
    let alg: &[&str] = if rsa { &["-newkey", "rsa:2048"] } else { P256 };
    ca_of(dir, alg, "lasthop test CA", "ca");
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:lh.test,IP:127.0.0.1\n",
    )
    .unwrap();
    server_cert(dir, alg, "lh.test", "srv.key", "srv.pem");
    for f in ["srv.pem", "srv.key", "ca.pem"] {
        set_mode(&dir.join(f), 0o644);
    }
    Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("srv.pem"),
        key: dir.join("srv.key"),
    }
}
