//! `lasthop_tls::certificate::check` on certificates the openssl CLI makes: a test CA, a
//! server certificate it signs for `go.test`, and the ways an upload goes wrong.

use std::path::Path;

use lasthop_testkit::{ca_and_server, openssl, signed_cert, test_ca, P256};
use lasthop_tls::certificate::{check, CertificateError};

fn read(dir: &Path, f: &str) -> String {
    std::fs::read_to_string(dir.join(f)).unwrap()
}

fn now_ms() -> i64 {
    i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

#[test]
fn a_chain_its_key_and_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ca_and_server(
        d,
        "Upload Test CA",
        "DNS:go.test",
        "go.test",
        "srv.key",
        "srv.pem",
    );
    let (leaf, key, ca) = (read(d, "srv.pem"), read(d, "srv.key"), read(d, "ca.pem"));
    let chain = format!("{leaf}{ca}");
    let now = now_ms();

    // The chain with its CA, and the leaf alone.
    let ok = check(&chain, &key, "go.test", now).unwrap();
    assert_eq!(ok.chain().len(), 2);
    assert_eq!(ok.issuer, "CN=Upload Test CA");
    assert!(ok.not_before_ms <= now && now < ok.not_after_ms);
    // openssl's -days 2.
    assert!(
        (ok.not_after_ms - now - 2 * 86_400_000).abs() < 120_000,
        "{}",
        ok.not_after_ms - now
    );
    assert_eq!(check(&leaf, &key, "go.test", now).unwrap().chain().len(), 1);

    let err =
        |chain: &str, key: &str, name: &str, at: i64| check(chain, key, name, at).unwrap_err();
    assert_eq!(
        err(&chain, &key, "other.test", now),
        CertificateError::WrongName("other.test".into())
    );
    assert_eq!(
        err(&chain, &key, "go.test", now + 3 * 86_400_000),
        CertificateError::NotValidNow
    );
    assert_eq!(
        err(&chain, &key, "go.test", now - 86_400_000),
        CertificateError::NotValidNow
    );
    assert_eq!(
        err("", &key, "go.test", now),
        CertificateError::NoCertificate
    );
    assert_eq!(
        err("not pem", &key, "go.test", now),
        CertificateError::NoCertificate
    );
    assert_eq!(err(&chain, "", "go.test", now), CertificateError::NoKey);
    assert_eq!(err(&chain, &leaf, "go.test", now), CertificateError::NoKey);
    assert_eq!(
        err(&leaf.repeat(9), &key, "go.test", now),
        CertificateError::ChainTooLong
    );

    // Another key: refused, whoever's it is.
    let other = d.join("other");
    std::fs::create_dir(&other).unwrap();
    ca_and_server(
        &other,
        "Other CA",
        "DNS:go.test",
        "go.test",
        "o.key",
        "o.pem",
    );
    let other_key = read(&other, "o.key");
    assert_eq!(
        err(&chain, &other_key, "go.test", now),
        CertificateError::KeyMismatch
    );
    assert_eq!(
        err(&chain, &read(d, "ca.key"), "go.test", now),
        CertificateError::KeyMismatch
    );

    // A chain that does not link up: the leaf with another CA.
    let wrong_ca = format!("{leaf}{}", read(&other, "ca.pem"));
    assert_eq!(err(&wrong_ca, &key, "go.test", now).code(), "bad_chain");
    // The chain in the wrong order: the CA first is no server's leaf.
    let reversed = format!("{ca}{leaf}");
    assert_eq!(
        err(&reversed, &read(d, "ca.key"), "go.test", now).code(),
        "not_a_leaf"
    );

    // A CA certificate that names the domain is still no server's leaf.
    std::fs::write(
        d.join("caleaf.ext"),
        "subjectAltName=DNS:go.test\nbasicConstraints=critical,CA:TRUE\n",
    )
    .unwrap();
    signed_cert(d, P256, "go.test", "caleaf.key", "caleaf.pem", "caleaf.ext");
    assert_eq!(
        err(
            &read(d, "caleaf.pem"),
            &read(d, "caleaf.key"),
            "go.test",
            now
        ),
        CertificateError::NotALeaf
    );
    // A leaf for clients only, alone or with its CA.
    std::fs::write(
        d.join("client.ext"),
        "subjectAltName=DNS:go.test\nextendedKeyUsage=clientAuth\n",
    )
    .unwrap();
    signed_cert(d, P256, "go.test", "client.key", "client.pem", "client.ext");
    let client = read(d, "client.pem");
    assert_eq!(
        err(&client, &read(d, "client.key"), "go.test", now),
        CertificateError::NotForServers
    );
    assert_eq!(
        err(
            &format!("{client}{ca}"),
            &read(d, "client.key"),
            "go.test",
            now
        )
        .code(),
        "not_for_servers"
    );
}

#[test]
fn wildcards_and_intermediates() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // root → intermediate (a CA) → a wildcard leaf.
    test_ca(d, "Root", "root");
    std::fs::write(
        d.join("ca.ext"),
        "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n",
    )
    .unwrap();
    openssl(
        d,
        &[
            "req",
            "-nodes",
            "-subj",
            "/CN=Intermediate",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-keyout",
            "ca.key",
            "-out",
            "int.csr",
        ],
    );
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "int.csr",
            "-CA",
            "root.pem",
            "-CAkey",
            "root.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "ca.ext",
            "-out",
            "ca.pem",
        ],
    );
    std::fs::write(d.join("san.ext"), "subjectAltName=DNS:*.brand.test\n").unwrap();
    signed_cert(d, P256, "*.brand.test", "leaf.key", "leaf.pem", "san.ext");
    let chain = format!(
        "{}{}{}",
        read(d, "leaf.pem"),
        read(d, "ca.pem"),
        read(d, "root.pem")
    );
    let key = read(d, "leaf.key");
    let now = now_ms();
    let ok = check(&chain, &key, "go.brand.test", now).unwrap();
    assert_eq!(
        (ok.chain().len(), ok.issuer.as_str()),
        (3, "CN=Intermediate")
    );
    // Without the root, the intermediate anchors it.
    let to_int = format!("{}{}", read(d, "leaf.pem"), read(d, "ca.pem"));
    assert!(check(&to_int, &key, "go.brand.test", now).is_ok());
    // A wildcard covers one label, not the apex or two.
    assert!(check(&chain, &key, "brand.test", now).is_err());
    assert!(check(&chain, &key, "a.b.brand.test", now).is_err());
    // The intermediate left out between the leaf and the root: no link.
    let gap = format!("{}{}", read(d, "leaf.pem"), read(d, "root.pem"));
    assert_eq!(
        check(&gap, &key, "go.brand.test", now).unwrap_err().code(),
        "bad_chain"
    );
}

proptest::proptest! {
    /// Whatever an upload holds, the check answers (an error, for all this junk) and never
    /// panics: PEM-looking armour around random bytes included.
    #[test]
    fn junk_is_refused_without_a_panic(
        body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600),
        armour: bool,
        name in "[a-z.]{0,20}",
    ) {
        use base64_free::encode;
        let text = if armour {
            format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", encode(&body))
        } else {
            String::from_utf8_lossy(&body).into_owned()
        };
        let key = format!("-----BEGIN PRIVATE KEY-----\n{}\n-----END PRIVATE KEY-----\n", encode(&body));
        proptest::prop_assert!(check(&text, &key, &name, now_ms()).is_err());
    }
}

/// Standard base64 without a dependency (the test's PEM armour only).
mod base64_free {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

    pub fn encode(bytes: &[u8]) -> String {
        let mut out = String::new();
        for chunk in bytes.chunks(3) {
            let b = [
                chunk[0],
                *chunk.get(1).unwrap_or(&0),
                *chunk.get(2).unwrap_or(&0),
            ];
            let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
            for i in 0..4 {
                if i <= chunk.len() {
                    out.push(char::from(ALPHABET[(n >> (18 - 6 * i)) as usize & 63]));
                } else {
                    out.push('=');
                }
            }
        }
        out
    }
}

/// What identifies a certificate to its CA's renewal information (RFC 9773 §4.1): the leaf's
/// authority key identifier (the CA's subject key identifier) and its serial, as openssl reads
/// them.
#[test]
fn the_renewal_information_identifier_is_the_leafs_aki_and_serial() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ca_and_server(
        d,
        "ARI Test CA",
        "DNS:go.test",
        "go.test",
        "srv.key",
        "srv.pem",
    );
    let (aki, serial) = lasthop_tls::certificate::ari_identifier(&read(d, "srv.pem")).unwrap();
    let text = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_uppercase()
    };
    let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02X}")).collect::<String>();
    let srv = d.join("srv.pem");
    let ca = d.join("ca.pem");
    let serial_text = text(&["x509", "-in", srv.to_str().unwrap(), "-noout", "-serial"]);
    assert_eq!(
        serial_text.trim().trim_start_matches("SERIAL="),
        hex(&serial).trim_start_matches("00")
    );
    let ski = text(&[
        "x509",
        "-in",
        ca.to_str().unwrap(),
        "-noout",
        "-ext",
        "subjectKeyIdentifier",
    ]);
    assert!(
        ski.replace(':', "").contains(&hex(&aki)),
        "{ski} {}",
        hex(&aki)
    );
    // Not a certificate: none.
    assert!(lasthop_tls::certificate::ari_identifier("not PEM").is_none());
}

/// A TLS-ALPN-01 challenge certificate is served only with its own key.
#[test]
fn a_challenge_certificate_needs_its_own_key() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    ca_and_server(
        d,
        "Other CA",
        "DNS:go.test",
        "go.test",
        "srv.key",
        "srv.pem",
    );
    let (leaf, key, ca_key) = (read(d, "srv.pem"), read(d, "srv.key"), read(d, "ca.key"));
    assert!(lasthop_tls::certificate::challenge_key(&leaf, &key).is_ok());
    assert_eq!(
        lasthop_tls::certificate::challenge_key(&leaf, &ca_key).unwrap_err(),
        CertificateError::KeyMismatch
    );
    assert!(lasthop_tls::certificate::challenge_key("x", &key).is_err());
}
