//! The control plane as a real process for an engine site: its keys, its API as a test calls
//! it, restarts on the same ports and data, and engines subscribed to its feed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::binary::{control_bin, engine_bin};
use crate::engine::{Engine, Site};
use crate::{logs, process};

/// A running control plane (the real binary) with an owner key and an admin key.
#[derive(Debug)]
pub struct Control {
    bin: PathBuf,
    child: Option<Child>,
    pub api: String,
    pub edge: String,
    pub data: PathBuf,
    key_file: PathBuf,
    pub key: String,
    pub admin_key: String,
    extra: Vec<String>,
}

fn api_key(bin: &Path, data: &Path, owner: &str, admin: bool) -> String {
    let mut cmd = Command::new(bin);
    cmd.args(["apikey", "create", "--owner", owner, "--data-dir"])
        .arg(data);
    if admin {
        cmd.arg("--admin");
    }
    let out = cmd.output().expect("apikey");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl Control {
    /// Starts a control plane for `site` (its key) on loopback ports of its choosing.
    pub fn start(site: &Site, extra: &[&str]) -> Control {
        Control::start_from(
            &control_bin(),
            site,
            &site.dir.path().join("control"),
            extra,
        )
    }

    /// [`Control::start`] with the binary at `bin` (an installed one) and its state in `data`.
    pub fn start_from(bin: &Path, site: &Site, data: &Path, extra: &[&str]) -> Control {
        let bin = bin.to_path_buf();
        let data = data.to_path_buf();
        let key = api_key(&bin, &data, "t", false);
        let admin_key = api_key(&bin, &data, "ops", true);
        let mut c = Control {
            bin,
            child: None,
            api: "127.0.0.1:0".into(),
            edge: "127.0.0.1:0".into(),
            data,
            key_file: site.key_file(),
            key,
            admin_key,
            extra: extra.iter().map(|s| s.to_string()).collect(),
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let strip = |s: &str| {
            let s = s.strip_prefix("https://").unwrap_or(s);
            s.trim_start_matches("http://").to_string()
        };
        let mut child = Command::new(&self.bin)
            .arg("serve")
            .arg("--data-dir")
            .arg(&self.data)
            .arg("--key-file")
            .arg(&self.key_file)
            .args(["--api-listen", &strip(&self.api)])
            .args(["--edge-listen", &strip(&self.edge)])
            .args(&self.extra)
            .stdout(Stdio::piped())
            .stderr(logs::append(&self.log_path()))
            .spawn()
            .expect("control plane starts");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let (mut a, mut e) = (String::new(), String::new());
        out.read_line(&mut a).expect("api line");
        out.read_line(&mut e).expect("edge line");
        self.api = a
            .trim()
            .strip_prefix("api listening on ")
            .unwrap_or_else(|| panic!("control plane did not start: {a:?}\n{}", self.log()))
            .to_string();
        self.edge = e
            .trim()
            .strip_prefix("edge listening on ")
            .unwrap_or_else(|| panic!("unexpected line {e:?}"))
            .to_string();
        // Keep reading stdout so the pipe never fills.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while out.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
        self.child = Some(child);
    }

    /// Sends `sig` (`HUP`, `TERM`, ...) to the control plane.
    pub fn signal(&self, sig: &str) {
        process::signal(self.child.as_ref().expect("running"), sig);
    }

    /// What the control plane logged so far (every start of it, in one file beside its data).
    pub fn log(&self) -> String {
        logs::read(&self.log_path())
    }

    fn log_path(&self) -> PathBuf {
        self.data.with_extension("log")
    }

    /// SIGKILLs the control plane (engines lose their feed).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Starts it again on the same ports and data with `extra` in place of its flags.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.extra = extra.iter().map(|s| s.to_string()).collect();
        self.restart();
    }

    pub fn token_file(&self) -> PathBuf {
        self.data.join("edge.token")
    }

    /// Engine flags that subscribe to this control plane.
    pub fn engine_args(&self) -> Vec<String> {
        vec![
            "--control".into(),
            self.edge.clone(),
            "--edge-token-file".into(),
            self.token_file().to_string_lossy().into_owned(),
        ]
    }

    /// One API call: (status, JSON body or null).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        key: &str,
        body: Option<serde_json::Value>,
    ) -> (u16, serde_json::Value) {
        let req = ureq::request(method, &format!("{}{path}", self.api))
            .set("Authorization", &format!("Bearer {key}"));
        let res = match body {
            Some(b) => req.send_json(b),
            None => req.call(),
        };
        let resp = match res {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{method} {path}: {e}"),
        };
        let status = resp.status();
        let text = resp.into_string().unwrap_or_default();
        (
            status,
            serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
        )
    }

    /// Creates a link as the owner; returns its code.
    pub fn create(&self, url: &str) -> String {
        let (status, v) = self.call(
            "POST",
            "/v1/links",
            &self.key,
            Some(serde_json::json!({"long_url": url})),
        );
        assert_eq!(status, 201, "{v}");
        v["code"].as_str().expect("code").to_string()
    }

    pub fn takedown(&self, code: &str, reason: &str) {
        let (status, v) = self.call(
            "POST",
            &format!("/v1/links/{code}/takedown"),
            &self.admin_key,
            Some(serde_json::json!({"reason": reason})),
        );
        assert_eq!(status, 200, "{v}");
    }

    pub fn restore(&self, code: &str) {
        let (status, v) = self.call(
            "POST",
            &format!("/v1/links/{code}/restore"),
            &self.admin_key,
            None,
        );
        assert_eq!(status, 200, "{v}");
    }

    pub fn delete(&self, code: &str) {
        let (status, v) = self.call("DELETE", &format!("/v1/links/{code}"), &self.key, None);
        assert_eq!(status, 204, "{v}");
    }

    /// Publishes a snapshot now; returns its frame.
    pub fn snapshot_now(&self) -> serde_json::Value {
        let (status, v) = self.call("POST", "/v1/admin/snapshots", &self.admin_key, None);
        assert_eq!(status, 201, "{v}");
        v
    }

    /// Publishes a snapshot now and waits until `e` serves it; returns its link count.
    pub fn publish_and_swap(&self, e: &Engine) -> f64 {
        let before = e
            .metric("lasthop_engine_snapshot_swaps_total")
            .unwrap_or(0.0);
        self.snapshot_now();
        crate::wait_until(
            std::time::Duration::from_secs(10),
            "the engine swaps the snapshot in",
            || {
                e.metric("lasthop_engine_snapshot_swaps_total")
                    .is_some_and(|n| n > before)
            },
        );
        e.metric("lasthop_engine_snapshot_links").unwrap_or(0.0)
    }

    /// `GET /v1/links/{code}/stats` as the owner (today's numbers by default).
    pub fn stats(&self, code: &str) -> serde_json::Value {
        let (status, v) = self.call("GET", &format!("/v1/links/{code}/stats"), &self.key, None);
        assert_eq!(status, 200, "{v}");
        v
    }

    /// `GET /v1/edges`.
    pub fn edges(&self) -> serde_json::Value {
        let (status, v) = self.call("GET", "/v1/edges", &self.admin_key, None);
        assert_eq!(status, 200, "{v}");
        v
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        self.kill();
    }
}

/// An engine (the real binary) subscribed to `control`'s feed, with `extra` flags and no
/// snapshot of its own (it downloads the control plane's).
pub fn subscribed_engine(site: &Site, control: &Control, extra: &[&str]) -> Engine {
    let mut args = control.engine_args();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Engine::launch(Command::new(engine_bin()), site, &args)
}

/// The flags that make an engine spool its clicks to `control`'s processor
/// (`DATA_DIR/clicks/spool`), flushed every 50 ms.
pub fn spool_to(control: &Control) -> Vec<String> {
    vec![
        "--click-spool".into(),
        control
            .data
            .join("clicks")
            .join("spool")
            .to_string_lossy()
            .into_owned(),
        "--click-flush-ms".into(),
        "50".into(),
    ]
}
