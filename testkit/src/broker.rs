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
        };
        t.up(topic);
        t
    }

    /// The bootstrap brokers for a Kafka client.
    pub fn brokers(&self) -> String {
        self.addr.clone()
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
        let child = Command::new(&self.bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
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
        self.down();
    }
}
