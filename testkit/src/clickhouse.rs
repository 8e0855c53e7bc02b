//! A real ClickHouse server per test (or shared by the tests running at once), in a temp dir.

use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::port::free_port;
use crate::skip::skip;

/// A ClickHouse server (Debian's `clickhouse-server`) in a temp dir on a loopback port.
#[derive(Debug)]
pub struct ClickHouse {
    pub port: u16,
    /// The HTTPS interface's port, on a server made by [`ClickHouse::start_tls`].
    pub https_port: Option<u16>,
    child: std::process::Child,
    dir: tempfile::TempDir,
}

/// The user with a password a [`ClickHouse::start_tls`] server also has.
pub const CLICKHOUSE_USER: (&str, &str) = ("ana", "s3cret-Pa55word");

impl ClickHouse {
    const BIN: &'static str = "/usr/sbin/clickhouse-server";

    /// Starts a fresh server, or says SKIPPED (with the reason) and returns `None` where
    /// ClickHouse is not installed (`scripts/test` installs it).
    pub fn start(test: &str) -> Option<ClickHouse> {
        Self::start_with(test, false)
    }

    /// A server that also serves HTTPS (`https_port`) with a certificate for 127.0.0.1 and
    /// `lh.test` from a test CA ([`ClickHouse::ca`]), and has the user [`CLICKHOUSE_USER`].
    pub fn start_tls(test: &str) -> Option<ClickHouse> {
        Self::start_with(test, true)
    }

    /// The test CA of a [`ClickHouse::start_tls`] server.
    pub fn ca(&self) -> std::path::PathBuf {
        self.dir.path().join("pki").join("ca.pem")
    }

    fn start_with(test: &str, tls: bool) -> Option<ClickHouse> {
        if !Path::new(Self::BIN).exists() {
            skip(
                test,
                "ClickHouse is not installed (apt-get install clickhouse-server)",
            );
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let port = free_port();
        let tcp = free_port();
        let https_port = tls.then(free_port);
        let https = match https_port {
            None => String::new(),
            Some(https) => {
                let pki = root.join("pki");
                crate::pki::ca_and_server(
                    &pki,
                    "lasthop ClickHouse test CA",
                    "DNS:lh.test,IP:127.0.0.1",
                    "lh.test",
                    "server.key",
                    "server.pem",
                );
                format!(
                    "<https_port>{https}</https_port>\n  <openSSL><server>\
                     <certificateFile>{pki}/server.pem</certificateFile>\
                     <privateKeyFile>{pki}/server.key</privateKeyFile>\
                     <verificationMode>none</verificationMode><loadDefaultCAFile>false</loadDefaultCAFile>\
                     <cacheSessions>true</cacheSessions><disableProtocols>sslv2,sslv3,tlsv1,tlsv1_1</disableProtocols>\
                     <preferServerCiphers>true</preferServerCiphers></server></openSSL>",
                    pki = pki.display()
                )
            }
        };
        let config = format!(
            r#"<?xml version="1.0"?>
<yandex>
  <logger><level>warning</level><log>{root}/server.log</log><errorlog>{root}/error.log</errorlog><console>0</console></logger>
  <http_port>{port}</http_port>
  {https}
  <tcp_port>{tcp}</tcp_port>
  <listen_host>127.0.0.1</listen_host>
  <path>{root}/data/</path>
  <tmp_path>{root}/tmp/</tmp_path>
  <user_files_path>{root}/user_files/</user_files_path>
  <format_schema_path>{root}/format_schemas/</format_schema_path>
  <users_config>users.xml</users_config>
  <default_profile>default</default_profile>
  <default_database>default</default_database>
  <mark_cache_size>67108864</mark_cache_size>
  <uncompressed_cache_size>0</uncompressed_cache_size>
  <max_concurrent_queries>100</max_concurrent_queries>
</yandex>
"#,
            root = root.display()
        );
        std::fs::write(root.join("config.xml"), config).expect("config.xml");
        std::fs::write(
            root.join("users.xml"),
            r#"<?xml version="1.0"?>
<yandex>
  <profiles><default></default></profiles>
  <users><default><password></password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></default><ana><password>s3cret-Pa55word</password><networks><ip>127.0.0.1</ip></networks><profile>default</profile><quota>default</quota></ana></users>
  <quotas><default></default></quotas>
</yandex>
"#,
        )
        .expect("users.xml");
        let mut server = ClickHouse {
            port,
            https_port,
            child: Self::spawn(root),
            dir,
        };
        server.wait_up();
        Some(server)
    }

    fn spawn(root: &Path) -> std::process::Child {
        Command::new(Self::BIN)
            .arg(format!(
                "--config-file={}",
                root.join("config.xml").display()
            ))
            .current_dir(root)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("clickhouse-server starts")
    }

    fn wait_up(&mut self) {
        let started = std::time::Instant::now();
        while self.try_query("SELECT 1").as_deref() != Ok("1\n") {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "clickhouse-server did not answer within 60 s: {}",
                std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// SIGKILLs the server (its data stays).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port and data, and waits until it answers.
    pub fn restart(&mut self) {
        self.child = Self::spawn(self.dir.path());
        self.wait_up();
    }

    /// One server for every test running at the same time (each uses its own database).
    pub fn shared(test: &str) -> Option<Arc<ClickHouse>> {
        static SHARED: Mutex<std::sync::Weak<ClickHouse>> = Mutex::new(std::sync::Weak::new());
        let mut slot = SHARED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(ch) = slot.upgrade() {
            return Some(ch);
        }
        let ch = Arc::new(ClickHouse::start(test)?);
        *slot = Arc::downgrade(&ch);
        Some(ch)
    }

    /// The `--clicks-store` URL of database `db` (created by the store on first use).
    pub fn url(&self, db: &str) -> String {
        format!("clickhouse://127.0.0.1:{}/{db}", self.port)
    }

    fn try_query(&self, sql: &str) -> Result<String, String> {
        ureq::post(&format!("http://127.0.0.1:{}/", self.port))
            .timeout(Duration::from_secs(30))
            .send_string(sql)
            .map_err(|e| e.to_string())?
            .into_string()
            .map_err(|e| e.to_string())
    }

    /// Runs SQL; its `TabSeparated` answer.
    pub fn query(&self, sql: &str) -> String {
        self.try_query(sql)
            .unwrap_or_else(|e| panic!("clickhouse {sql}: {e}"))
    }
}

impl Drop for ClickHouse {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
