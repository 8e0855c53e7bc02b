//! The secured edge channel with real processes: the control plane's edge listener over TLS
//! (`--edge-tls-cert`, `--edge-tls-key`), engines verifying it against a CA made at test time
//! with the openssl CLI (`--control-ca`), mutual TLS in place of the token (`--edge-client-ca`,
//! `--control-client-cert`, `--control-client-key`), and signed snapshots
//! (`keygen --signing`, `--snapshot-signing-key`, `--snapshot-verify-key`). Each refusal (a
//! wrong CA, a client certificate another CA signed, a snapshot signed by an unpinned key) is
//! checked to be clean: a clear log line, a counter, no false 404, the engine still running.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use lasthop_testkit::{
    control_bin, engine_bin, in_sync, openssl, server_cert, status_of, wait_until, Control, Engine,
    Site,
};

/// A CA in `dir` (`ca.pem`, `ca.key`) and, signed by it, a certificate `<name>.pem` /
/// `<name>.key` for each name (SAN: lh.test and 127.0.0.1), P-256 keys.
pub(crate) fn ca_with(dir: &Path, cn: &str, names: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
    let subject = format!("/CN={cn}");
    let mut args = vec!["req", "-x509", "-nodes", "-days", "2", "-subj", &subject];
    args.extend_from_slice(&ec);
    args.extend_from_slice(&["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(dir, &args);
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=DNS:lh.test,IP:127.0.0.1\n",
    )
    .unwrap();
    for name in names {
        server_cert(
            dir,
            &ec,
            name,
            &format!("{name}.key"),
            &format!("{name}.pem"),
        );
    }
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// `lasthop-control keygen --signing --out FILE`: the key file and the public key file.
fn signing_key(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let key = dir.join(name);
    let out = Command::new(control_bin())
        .args(["keygen", "--signing", "--out", s(&key)])
        .output()
        .expect("keygen");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    let public = dir.join(format!("{name}.pub"));
    let hex = std::fs::read_to_string(&public).expect("keygen writes FILE.pub");
    assert!(
        printed.contains(hex.trim()) && hex.trim().len() == 64,
        "keygen prints the public key it wrote: {printed}"
    );
    (key, public)
}

/// A control plane serving its edge listener with `pki`'s `edge` certificate and signing
/// snapshots with `sign`.
fn signed_tls_control(site: &Site, pki: &Path, sign: &Path) -> Control {
    Control::start(
        site,
        &[
            "--edge-tls-cert",
            s(&pki.join("edge.pem")),
            "--edge-tls-key",
            s(&pki.join("edge.key")),
            "--snapshot-signing-key",
            s(sign),
        ],
    )
}

/// An engine subscribed to `control` with exactly these channel flags (no token unless given).
fn engine(site: &Site, control: &Control, flags: &[&str]) -> Engine {
    let mut args = vec!["--control", control.edge.as_str()];
    args.extend_from_slice(flags);
    Engine::launch(Command::new(engine_bin()), site, &args)
}

#[test]
fn feed_downloads_and_read_through_over_tls_with_signed_snapshots() {
    let site = Site::new();
    let pki = site.dir.path().join("pki");
    ca_with(&pki, "lasthop edge CA", &["edge"]);
    let (sign, public) = signing_key(site.dir.path(), "signing.key");
    let control = signed_tls_control(&site, &pki, &sign);
    assert!(control.edge.starts_with("https://"), "{}", control.edge);
    let token = control.token_file();
    let e = engine(
        &site,
        &control,
        &[
            "--edge-token-file",
            s(&token),
            "--control-ca",
            s(&pki.join("ca.pem")),
            "--snapshot-verify-key",
            s(&public),
        ],
    );
    // The snapshot came over TLS, its signature verified; the feed is subscribed over TLS.
    wait_until(Duration::from_secs(15), "in sync over TLS", || in_sync(&e));
    let code = control.create("https://example.com/over-tls");
    wait_until(
        Duration::from_secs(5),
        "the new link reaches the engine",
        || status_of(&e.addr, &format!("/{code}")) == 302,
    );
    // Read-through over TLS: only the origin may say 404 (unreachable, it would be 503).
    assert_eq!(status_of(&e.addr, "/never-created-alias"), 404);
    // A snapshot published now is signed, downloaded and swapped in too.
    let frame = control.snapshot_now();
    assert_eq!(
        frame["signature"].as_str().map(str::len),
        Some(128),
        "{frame}"
    );
    wait_until(
        Duration::from_secs(10),
        "the signed snapshot is swapped in",
        || {
            e.metric("lasthop_engine_snapshot_downloads_total")
                .is_some_and(|n| n >= 1.0)
                && e.metric("lasthop_engine_snapshot_sequence")
                    .is_some_and(|s| Some(s) == frame["seq"].as_f64())
        },
    );
    assert_eq!(
        e.metric("lasthop_engine_snapshot_signature_failures_total"),
        Some(0.0)
    );
    assert!(
        !e.log().contains("plain HTTP to a control plane"),
        "{}",
        e.log()
    );
}

#[test]
fn a_wrong_ca_or_an_unpinned_signing_key_is_refused_cleanly() {
    let site = Site::new();
    let pki = site.dir.path().join("pki");
    ca_with(&pki, "lasthop edge CA", &["edge"]);
    let other = site.dir.path().join("other");
    ca_with(&other, "someone else's CA", &[]);
    let (sign, _) = signing_key(site.dir.path(), "signing.key");
    let (_, unpinned) = signing_key(site.dir.path(), "another.key");
    let control = signed_tls_control(&site, &pki, &sign);
    let token = control.token_file();
    let code = control.create("https://example.com/kept-safe");

    // The control plane's certificate is not from the CA this engine trusts: nothing is
    // fetched, the log says why, and a code it cannot look up is 503, never 404.
    let wrong_ca = engine(
        &site,
        &control,
        &[
            "--edge-token-file",
            s(&token),
            "--control-ca",
            s(&other.join("ca.pem")),
        ],
    );
    wait_until(
        Duration::from_secs(10),
        "the certificate error is logged",
        || {
            let log = wrong_ca.log();
            log.contains("feed unreachable") && log.contains("UnknownIssuer")
        },
    );
    assert_eq!(status_of(&wrong_ca.addr, &format!("/{code}")), 503);
    assert_eq!(
        wrong_ca.metric("lasthop_engine_feed_connects_total"),
        Some(0.0)
    );

    // The right CA, but snapshots signed by a key this engine does not pin: the feed runs
    // (new links arrive) but no snapshot is downloaded, and each refusal is counted.
    let unpinned_engine = engine(
        &site,
        &control,
        &[
            "--edge-token-file",
            s(&token),
            "--control-ca",
            s(&pki.join("ca.pem")),
            "--snapshot-verify-key",
            s(&unpinned),
        ],
    );
    wait_until(Duration::from_secs(10), "the snapshot is refused", || {
        unpinned_engine
            .metric("lasthop_engine_snapshot_signature_failures_total")
            .is_some_and(|n| n >= 1.0)
    });
    assert!(
        unpinned_engine.log().contains("snapshot refused"),
        "{}",
        unpinned_engine.log()
    );
    assert_eq!(
        unpinned_engine.metric("lasthop_engine_snapshot_downloads_total"),
        Some(0.0)
    );
    assert_eq!(
        unpinned_engine.metric("lasthop_engine_snapshot_missing"),
        Some(1.0)
    );
    // Still serving: the link comes through the feed's overlay or the origin.
    wait_until(
        Duration::from_secs(5),
        "served without the snapshot",
        || status_of(&unpinned_engine.addr, &format!("/{code}")) == 302,
    );
}

#[test]
fn mutual_tls_stands_in_for_the_token() {
    let site = Site::new();
    let pki = site.dir.path().join("pki");
    ca_with(&pki, "lasthop edge CA", &["edge"]);
    let clients = site.dir.path().join("clients");
    ca_with(&clients, "lasthop engines CA", &["engine"]);
    let rogue = site.dir.path().join("rogue");
    ca_with(&rogue, "rogue CA", &["engine"]);
    let control = Control::start(
        &site,
        &[
            "--edge-tls-cert",
            s(&pki.join("edge.pem")),
            "--edge-tls-key",
            s(&pki.join("edge.key")),
            "--edge-client-ca",
            s(&clients.join("ca.pem")),
        ],
    );
    let code = control.create("https://example.com/mtls");
    let ca = pki.join("ca.pem");

    // A certificate from the engines' CA and no token: subscribed, served.
    let good = engine(
        &site,
        &control,
        &[
            "--control-ca",
            s(&ca),
            "--control-client-cert",
            s(&clients.join("engine.pem")),
            "--control-client-key",
            s(&clients.join("engine.key")),
        ],
    );
    wait_until(Duration::from_secs(15), "in sync with mutual TLS", || {
        in_sync(&good)
    });
    assert_eq!(status_of(&good.addr, &format!("/{code}")), 302);

    // A certificate another CA signed, or none: the handshake is refused; no subscription.
    let rogue_engine = engine(
        &site,
        &control,
        &[
            "--control-ca",
            s(&ca),
            "--control-client-cert",
            s(&rogue.join("engine.pem")),
            "--control-client-key",
            s(&rogue.join("engine.key")),
        ],
    );
    let anonymous = engine(&site, &control, &["--control-ca", s(&ca)]);
    for e in [&rogue_engine, &anonymous] {
        wait_until(
            Duration::from_secs(10),
            "the feed's failure is logged",
            || e.log().contains("feed unreachable"),
        );
        assert_eq!(
            e.metric("lasthop_engine_feed_connects_total"),
            Some(0.0),
            "{}",
            e.log()
        );
        assert_eq!(status_of(&e.addr, &format!("/{code}")), 503, "{}", e.log());
    }
}
