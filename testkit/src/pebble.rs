//! Let's Encrypt's test ACME server, Debian's `pebble`, with its DNS server
//! `pebble-challtestsrv`, on loopback: pebble resolves every name through the DNS server
//! (127.0.0.1 unless [`Pebble::add_a`] says otherwise) and validates HTTP-01 on
//! `http_port` and TLS-ALPN-01 on `tls_port` of that address, where the test's engines listen.
//! Its own HTTPS uses a certificate from a test CA ([`Pebble::ca_file`], what
//! `--acme-ca-file` trusts); the certificates it issues chain to a root made at each start,
//! fetched from its management API ([`Pebble::root`]).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{free_port, logs, skip, wait_until, KillOnDrop};

/// A running pebble and challtestsrv.
#[derive(Debug)]
pub struct Pebble {
    dir: tempfile::TempDir,
    _pebble: KillOnDrop,
    _dns: KillOnDrop,
    /// The ACME directory URL.
    pub directory: String,
    management: String,
    dns_management: String,
}

impl Pebble {
    /// Starts both, or says SKIPPED (and returns `None`) where pebble is not installed.
    pub fn start(test: &str, http_port: u16, tls_port: u16) -> Option<Pebble> {
        for bin in ["pebble", "pebble-challtestsrv"] {
            if Command::new(bin).arg("-h").output().is_err() {
                skip(
                    test,
                    &format!("{bin} is not installed (Debian's pebble package; scripts/test installs it)"),
                );
                return None;
            }
        }
        let dir = tempfile::tempdir().expect("a temp dir");
        crate::ca_and_server(
            dir.path(),
            "Pebble HTTPS test CA",
            "DNS:localhost,IP:127.0.0.1",
            "localhost",
            "pebble.key",
            "pebble.pem",
        );
        let (acme, management, dns, dns_management) =
            (free_port(), free_port(), free_port(), free_port());
        let dns_log = dir.path().join("challtestsrv.log");
        let dns_child = Command::new("pebble-challtestsrv")
            .args(["-dns01", &format!("127.0.0.1:{dns}")])
            .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
            .args(["-management", &format!("127.0.0.1:{dns_management}")])
            .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
            .stdout(logs::create(&dns_log))
            .stderr(logs::append(&dns_log))
            .spawn()
            .expect("pebble-challtestsrv starts");
        let dns_child = KillOnDrop(dns_child);
        let config = serde_json::json!({
            "pebble": {
                "listenAddress": format!("127.0.0.1:{acme}"),
                "managementListenAddress": format!("127.0.0.1:{management}"),
                "certificate": dir.path().join("pebble.pem"),
                "privateKey": dir.path().join("pebble.key"),
                "httpPort": http_port,
                "tlsPort": tls_port,
                "ocspResponderURL": "",
                "externalAccountBindingRequired": false,
            }
        });
        let config_path = dir.path().join("pebble.json");
        std::fs::write(&config_path, config.to_string()).expect("pebble's config");
        let log = dir.path().join("pebble.log");
        let pebble = Command::new("pebble")
            .arg("-config")
            .arg(&config_path)
            .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
            // No random sleeps before validating, no nonces refused for practice, and every
            // order validated afresh (no authorization reused).
            .env("PEBBLE_VA_NOSLEEP", "1")
            .env("PEBBLE_WFE_NONCEREJECT", "0")
            .env("PEBBLE_AUTHZREUSE", "0")
            .stdout(logs::create(&log))
            .stderr(logs::append(&log))
            .stdin(Stdio::null())
            .spawn()
            .expect("pebble starts");
        let p = Pebble {
            _pebble: KillOnDrop(pebble),
            _dns: dns_child,
            directory: format!("https://127.0.0.1:{acme}/dir"),
            management: format!("https://127.0.0.1:{management}"),
            dns_management: format!("http://127.0.0.1:{dns_management}"),
            dir,
        };
        wait_until(Duration::from_secs(20), "pebble answers", || {
            p.get(&p.directory).is_some_and(|d| d.contains("newOrder"))
        });
        wait_until(Duration::from_secs(20), "challtestsrv answers", || {
            ureq::post(&format!("{}/set-default-ipv4", p.dns_management))
                .send_string(r#"{"ip":"127.0.0.1"}"#)
                .is_ok()
        });
        Some(p)
    }

    /// The CA pebble's own HTTPS certificate chains to (for `--acme-ca-file`).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// `name` resolves to `addresses` (IPv4) from now on.
    pub fn add_a(&self, name: &str, addresses: &[&str]) {
        let body = serde_json::json!({"host": format!("{name}."), "addresses": addresses});
        ureq::post(&format!("{}/add-a", self.dns_management))
            .send_string(&body.to_string())
            .expect("challtestsrv's add-a");
    }

    /// The root the certificates pebble issues chain to, PEM, written to a file in its dir.
    pub fn root(&self) -> PathBuf {
        let pem = self
            .get(&format!("{}/roots/0", self.management))
            .expect("pebble's root");
        let path = self.dir.path().join("issuing-root.pem");
        std::fs::write(&path, pem).expect("the root's file");
        path
    }

    /// What pebble logged.
    pub fn log(&self) -> String {
        logs::read(&self.dir.path().join("pebble.log"))
    }

    /// A GET to pebble's HTTPS, trusting its test CA: the body.
    fn get(&self, url: &str) -> Option<String> {
        let out = Command::new("curl")
            .args(["-sf", "--max-time", "5", "--cacert"])
            .arg(self.ca_file())
            .arg(url)
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
