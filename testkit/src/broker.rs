//! A Kafka-protocol broker for the click pipeline's Kafka tests: `tansu`, its storage in memory,
//! on a loopback port.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::logs;
use crate::port::free_port;
use crate::skip::skip;
use crate::wait::wait_until;

/// A running `tansu` broker. `scripts/test` installs tansu (`cargo install --locked tansu
/// --features dynostore`); without it the tests that need one say SKIPPED.
#[derive(Debug)]
pub struct Tansu {
    bin: PathBuf,
    pub port: u16,
    /// `127.0.0.1:PORT`, what a Kafka client takes as its bootstrap brokers.
    pub addr: String,
    partitions: u32,
    child: Option<Child>,
    dir: tempfile::TempDir,
    /// With [`Tansu::start_tls`]: the TLS front (socat) every client reaches the broker
    /// through, and its port (what the broker advertises).
    tls: Option<(Child, u16)>,
}

impl Tansu {
    /// The broker binary, if installed: `$LASTHOP_TANSU`, else `tansu` on `PATH` or in
    /// `~/.cargo/bin`.
    pub fn find() -> Option<PathBuf> {
        if let Ok(p) = std::env::var("LASTHOP_TANSU") {
            return Some(PathBuf::from(p));
        }
        let home = std::env::var("HOME").unwrap_or_default();
        std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .map(PathBuf::from)
            .chain([PathBuf::from(home).join(".cargo/bin")])
            .map(|d| d.join("tansu"))
            .find(|p| p.is_file())
    }

    /// Starts a broker with `topic` created (two partitions), or `None` (after saying
    /// `SKIPPED <test>: ...`) when tansu is not installed.
    pub fn start(test: &str, topic: &str) -> Option<Tansu> {
        let Some(bin) = Tansu::find() else {
            skip(
                test,
                "no Kafka-protocol broker (tansu) installed; scripts/test installs it \
                 with `cargo install --locked tansu --features dynostore`",
            );
            return None;
        };
        Some(Tansu::on(&bin, topic, 2))
    }

    /// A broker reached over TLS only: tansu (which speaks plaintext alone) behind a TLS
    /// front (`socat OPENSSL-LISTEN`, a certificate for 127.0.0.1 from the test CA
    /// [`Tansu::ca`]) on the port it advertises, so bootstrap and every later connection a
    /// client makes go through TLS. `None` (SKIPPED) without tansu or socat.
    pub fn start_tls(test: &str, topic: &str) -> Option<Tansu> {
        let mut t = Tansu::start(test, topic)?;
        if Command::new("socat").arg("-V").output().is_err() {
            skip(test, "socat is not installed (apt-get install socat)");
            return None;
        }
        let pki = t.dir.path().join("pki");
        crate::pki::ca_and_server(
            &pki,
            "tansu test CA",
            "IP:127.0.0.1",
            "127.0.0.1",
            "srv.key",
            "srv.pem",
        );
        let front = free_port();
        let listen = format!(
            "OPENSSL-LISTEN:{front},bind=127.0.0.1,reuseaddr,fork,cert={},key={},verify=0",
            pki.join("srv.pem").display(),
            pki.join("srv.key").display()
        );
        let child = Command::new("socat")
            .arg(listen)
            .arg(format!("TCP:127.0.0.1:{}", t.port))
            .stdout(logs::append(&t.log_path()))
            .stderr(logs::append(&t.log_path()))
            .spawn()
            .expect("socat starts");
        t.tls = Some((child, front));
        wait_until(Duration::from_secs(10), "the TLS front listening", || {
            std::net::TcpStream::connect(("127.0.0.1", front)).is_ok()
        });
        // The broker again, now advertising the TLS front.
        t.down();
        t.up(topic);
        Some(t)
    }

    /// The test CA of a [`Tansu::start_tls`] broker's certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("pki").join("ca.pem")
    }

    /// Starts the broker `bin` on a free loopback port with `topic` created with
    /// `partitions` partitions.
    pub fn on(bin: &Path, topic: &str, partitions: u32) -> Tansu {
        let port = free_port();
        let mut t = Tansu {
            bin: bin.to_path_buf(),
            port,
            addr: format!("127.0.0.1:{port}"),
            partitions,
            child: None,
            dir: tempfile::tempdir().expect("tempdir"),
            tls: None,
        };
        t.up(topic);
        t
    }

    /// The bootstrap brokers for a Kafka client (the TLS front's, on a [`Tansu::start_tls`]
    /// broker).
    pub fn brokers(&self) -> String {
        match &self.tls {
            Some((_, front)) => format!("127.0.0.1:{front}"),
            None => self.addr.clone(),
        }
    }

    /// What the broker logged so far (every start of it).
    pub fn log(&self) -> String {
        logs::read(&self.log_path())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("tansu.log")
    }

    /// (Re)starts the broker (empty: its storage is in memory) and creates `topic`.
    pub fn up(&mut self, topic: &str) {
        let url = format!("tcp://{}", self.addr);
        let advertised = format!("tcp://{}", self.brokers());
        let child = Command::new(&self.bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &advertised,
            ])
            .args(["--storage-engine", "memory://tansu/"])
            .stdout(logs::append(&self.log_path()))
            .stderr(logs::append(&self.log_path()))
            .spawn()
            .expect("tansu starts");
        self.child = Some(child);
        wait_until(Duration::from_secs(30), "tansu listening", || {
            std::net::TcpStream::connect(&self.addr).is_ok()
        });
        // A broker that just started listening may still refuse a topic: try again for a while.
        let started = Instant::now();
        loop {
            let out = Command::new(&self.bin)
                .args(["topic", "create", topic, "--broker", &url])
                .args(["--partitions", &self.partitions.to_string()])
                .output()
                .expect("tansu topic create");
            if out.status.success() {
                break;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "creating topic {topic}: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the broker (SIGKILL: a crash, not a goodbye).
    pub fn down(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        if let Some((mut front, _)) = self.tls.take() {
            let _ = front.kill();
            let _ = front.wait();
        }
        self.down();
    }
}
