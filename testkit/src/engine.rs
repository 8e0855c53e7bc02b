//! An engine site (key, snapshot) and the engine as a real process on it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use lasthop_core::{CodeScheme, HighWater, PermutationKey};
use lasthop_snapshot::{SnapshotMeta, SnapshotWriter};

use crate::binary::engine_bin;
use crate::http::curl;
use crate::{logs, metrics, process};

/// A directory (world-readable, so a non-root engine can read it) with a key file (0600: a
/// secret file; [`Site::share_key_with_group`] gives a non-root engine the packaged layout).
#[derive(Debug)]
pub struct Site {
    pub dir: tempfile::TempDir,
    pub key: PermutationKey,
}

impl Site {
    #[allow(clippy::new_without_default)] // a test fixture, made explicitly
    pub fn new() -> Site {
        let dir = tempfile::tempdir().expect("tempdir");
        set_mode(dir.path(), 0o755);
        let key = PermutationKey::from_bytes(&[9u8; 16]).expect("key");
        let path = dir.path().join("key");
        write_secret(&path, key.to_file_text());
        Site { dir, key }
    }

    /// The key file as the package installs it: owned by root and `group`, mode 0640, for an
    /// engine that runs as a user of that group.
    pub fn share_key_with_group(&self, group: &str) {
        let ok = Command::new("chown")
            .arg(format!("root:{group}"))
            .arg(self.key_file())
            .status()
            .expect("chown")
            .success();
        assert!(ok, "chown root:{group} the key file");
        set_mode(&self.key_file(), 0o640);
    }

    pub fn scheme(&self) -> CodeScheme {
        CodeScheme::new(&self.key).expect("scheme")
    }

    pub fn key_file(&self) -> PathBuf {
        self.dir.path().join("key")
    }

    pub fn snapshot_path(&self) -> PathBuf {
        self.dir.path().join("links.snap")
    }

    /// Writes a snapshot (temp name, rename) with `links` of (key, url, expires_at_ms), region 0
    /// marked as issued up to `mark`.
    pub fn write_snapshot(
        &self,
        sequence: u64,
        mark: u64,
        links: &[(String, String, Option<i64>)],
    ) {
        let mut hw = HighWater::new(1, 1_000).expect("high water");
        hw.raise(0, mark).expect("raise");
        let meta = SnapshotMeta::new(sequence, self.key.id(), hw);
        let mut w = SnapshotWriter::create(self.snapshot_path(), meta).expect("writer");
        for (k, u, e) in links {
            w.add(k.as_bytes(), u.as_bytes(), *e).expect("add");
        }
        w.seal().expect("seal");
        set_mode(&self.snapshot_path(), 0o644);
    }

    /// Starts the engine ([`engine_bin`]) on this site's snapshot with `extra` flags.
    pub fn start(&self, extra: &[&str]) -> Engine {
        Engine::start(Command::new(engine_bin()), self, extra)
    }
}

/// Writes a secret file a test hands a program (a key, a token): mode 0600, which every
/// program requires of one (`lasthop_core::secret::check`).
pub fn write_secret(path: &Path, body: impl AsRef<[u8]>) {
    std::fs::write(path, body).expect("write a secret file");
    set_mode(path, 0o600);
}

pub fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A running engine: its listeners as it printed them, and its log.
#[derive(Debug)]
pub struct Engine {
    pub child: Child,
    pub addr: String,
    pub admin: String,
    pub log: PathBuf,
    /// The HTTPS listener, when started with `--tls-listen`.
    pub tls: Option<String>,
    /// The QUIC (HTTP/3) listener, when the engine serves one (`--tls-listen` without
    /// `--no-quic`, or `--quic-listen`; on io_uring and epoll).
    pub quic: Option<String>,
}

static ENGINES: AtomicUsize = AtomicUsize::new(0);

impl Engine {
    pub fn start(cmd: Command, site: &Site, extra: &[&str]) -> Engine {
        let mut args = vec![
            "--snapshot",
            site.snapshot_path().to_str().expect("utf-8 path"),
        ]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Engine::launch(cmd, site, &args)
    }

    /// Starts the engine with exactly `extra` beside the common flags (no `--snapshot`
    /// unless `extra` has one). Its log goes to `site/engine-N.log`; a `--data-dir` under the
    /// site is added unless `extra` has one, and so are `--listen 127.0.0.1:0`,
    /// `--admin-listen 127.0.0.1:0` and `--cores 2`.
    pub fn launch(mut cmd: Command, site: &Site, extra: &[&str]) -> Engine {
        let n = ENGINES.fetch_add(1, Ordering::Relaxed);
        let log = site.dir.path().join(format!("engine-{n}.log"));
        let stderr = logs::create(&log);
        if !extra.contains(&"--data-dir") {
            let data = site.dir.path().join(format!("engine-{n}"));
            cmd.arg("--data-dir").arg(data);
        }
        for (flag, value) in [
            ("--listen", "127.0.0.1:0"),
            ("--admin-listen", "127.0.0.1:0"),
            ("--cores", "2"),
        ] {
            if !extra.contains(&flag) {
                cmd.args([flag, value]);
            }
        }
        let mut child = cmd
            .arg("--key-file")
            .arg(site.key_file())
            .args([
                // Count every redirect in /debug/top, so a test's few requests show there.
                "--top-sample",
                "1",
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("engine starts");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut first = String::new();
        let mut second = String::new();
        out.read_line(&mut first).expect("read");
        out.read_line(&mut second).expect("read");
        if first.is_empty() {
            let _ = child.wait();
            panic!("engine did not start: {}", logs::read(&log));
        }
        let addr = first
            .split("http://")
            .nth(1)
            .and_then(|s| s.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected line {first:?}"))
            .to_string();
        let admin = second
            .trim()
            .strip_prefix("admin listening on http://")
            .unwrap_or_else(|| panic!("unexpected line {second:?}"))
            .to_string();
        let tls = if extra.contains(&"--tls-listen") {
            let mut third = String::new();
            out.read_line(&mut third).expect("read");
            Some(
                third
                    .trim()
                    .strip_prefix("tls listening on https://")
                    .unwrap_or_else(|| panic!("unexpected line {third:?}"))
                    .to_string(),
            )
        } else {
            None
        };
        // With TLS the engine says where QUIC is, or that it serves none; with `--quic-listen`
        // alone, where QUIC is.
        let quic = if tls.is_some() || extra.contains(&"--quic-listen") {
            let mut fourth = String::new();
            out.read_line(&mut fourth).expect("read");
            fourth
                .trim()
                .strip_prefix("quic listening on udp://")
                .map(str::to_string)
        } else {
            None
        };
        Engine {
            child,
            addr,
            admin,
            log,
            tls,
            quic,
        }
    }

    /// The engine's log so far (for assertion messages).
    pub fn log(&self) -> String {
        logs::read(&self.log)
    }

    /// The admin listener's `/metrics` value of the sample `name` (with its labels), if
    /// present.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (status, _, body) = curl(&["-m", "2", &format!("http://{}/metrics", self.admin)]);
        if status != 200 {
            return None;
        }
        metrics::sample(&body, name)
    }

    pub fn signal(&self, sig: &str) {
        process::signal(&self.child, sig);
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // A failed test shows what each of its engines logged.
        logs::show_if_failing(&format!("the engine on {}", self.addr), &self.log);
    }
}

/// Subscribed, caught up, and serving a snapshot (the control plane publishes one at start; an
/// engine that started before it existed downloads it when the feed announces it).
pub fn in_sync(e: &Engine) -> bool {
    e.metric("lasthop_engine_feed_in_sync") == Some(1.0)
        && e.metric("lasthop_engine_snapshot_missing") == Some(0.0)
}
