//! Read-through to a running control plane: links the snapshot does not have yet are served
//! from the origin, and only the origin says 404 (or 410) for them.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::harness::{Conn, Site};

fn control_bin() -> PathBuf {
    if let Ok(p) = std::env::var("LASTHOP_CONTROL_BIN") {
        return PathBuf::from(p);
    }
    let dir = PathBuf::from(crate::harness::ENGINE)
        .parent()
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("lasthop-control");
    if !bin.exists() {
        // A workspace test run builds it; `cargo test -p lasthop-engine` alone may not have.
        // (Building it unconditionally would resolve `-p lasthop-control`'s own feature set and
        // rebuild much of the dependency tree on every run.)
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let ok = Command::new(cargo)
            .args(["build", "-q", "-p", "lasthop-control"])
            .status()
            .expect("cargo build")
            .success();
        assert!(ok, "building lasthop-control");
    }
    bin
}

struct Control {
    child: Child,
    api: String,
    edge: String,
}

impl Drop for Control {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_control(site: &Site) -> (Control, String) {
    let bin = control_bin();
    let data = site.dir.path().join("control");
    let out = Command::new(&bin)
        .args(["apikey", "create", "--owner", "t", "--data-dir"])
        .arg(&data)
        .output()
        .expect("apikey");
    assert!(out.status.success());
    let key = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut child = Command::new(&bin)
        .arg("serve")
        .arg("--data-dir")
        .arg(&data)
        .arg("--key-file")
        .arg(site.key_file())
        .args([
            "--api-listen",
            "127.0.0.1:0",
            "--edge-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("control plane starts");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let (mut a, mut e) = (String::new(), String::new());
    out.read_line(&mut a).expect("api line");
    out.read_line(&mut e).expect("edge line");
    let api = a
        .trim()
        .strip_prefix("api listening on ")
        .expect("api line")
        .to_string();
    let edge = e
        .trim()
        .strip_prefix("edge listening on ")
        .expect("edge line")
        .to_string();
    (Control { child, api, edge }, key)
}

#[test]
fn misses_read_through_to_the_control_plane() {
    let site = Site::new();
    // An empty snapshot: nothing issued yet, every new code is inside the reserve.
    site.write_snapshot(0, 0, &[]);
    let (control, key) = start_control(&site);
    let created: serde_json::Value = ureq::post(&format!("{}/v1/links", control.api))
        .set("Authorization", &format!("Bearer {key}"))
        .send_json(serde_json::json!({"long_url": "https://example.com/fresh"}))
        .expect("create")
        .into_json()
        .expect("json");
    let code = created["code"].as_str().expect("code").to_string();

    let engine = site.start(&["--control", &control.edge]);
    let mut conn = Conn::open(&engine.addr);
    let r = conn.get(&format!("/{code}"));
    assert_eq!(r.status, 302, "served through the origin");
    assert_eq!(r.header("location"), Some("https://example.com/fresh"));
    assert_eq!(
        conn.get("/never-created-alias").status,
        404,
        "the origin says 404"
    );

    // Deleted at the origin: 410, not a stale redirect (no fresh positive cache).
    let status = ureq::delete(&format!("{}/v1/links/{code}", control.api))
        .set("Authorization", &format!("Bearer {key}"))
        .call()
        .expect("delete")
        .status();
    assert_eq!(status, 204);
    assert_eq!(conn.get(&format!("/{code}")).status, 410);

    // Origin gone and nothing stale for this code: 503, never a false 404.
    drop(control);
    let unknown = site.scheme().encode_string(5).unwrap();
    assert_eq!(conn.get(&format!("/{unknown}")).status, 503);
    // A code the origin answered before is served stale.
    assert_eq!(conn.get(&format!("/{code}")).status, 410);
}
