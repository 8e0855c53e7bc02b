//! Snapshot swap under load, drain, and starting as a non-root user under a memlock limit.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lasthop_testkit::{Conn, Engine, Load, Site};

/// SIGHUP swaps in a new snapshot while keep-alive clients hammer the engine: no request fails,
/// every answer is one of the two snapshots' answers, and the new links appear.
#[test]
fn sighup_swaps_the_snapshot_under_load_without_losing_a_request() {
    let site = Site::new();
    let scheme = site.scheme();
    let codes: Vec<String> = (0..50).map(|n| scheme.encode_string(n).unwrap()).collect();
    let v1: Vec<_> = codes
        .iter()
        .map(|c| (c.clone(), format!("https://example.com/v1/{c}"), None))
        .collect();
    site.write_snapshot(1, 50, &v1);
    let engine = site.start(&[]);

    let load = Load::start(&engine.addr, &codes, 4, |code, r| {
        assert_eq!(r.status, 302, "request failed during swap");
        let loc = r.header("location").unwrap_or_default();
        assert!(
            loc == format!("https://example.com/v1/{code}")
                || loc == format!("https://example.com/v2/{code}"),
            "unexpected {loc}"
        );
    });
    // HTTP/2 streams multiplexed on two connections through the swap as well.
    let h2load = std::process::Command::new("h2load")
        .args(["-D", "3", "-c", "2", "-m", "10"])
        .arg(format!("http://{}/{}", engine.addr, codes[0]))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("h2load (scripts/test installs nghttp2-client)");
    std::thread::sleep(Duration::from_millis(300));

    let extra = scheme.encode_string(60).unwrap();
    let mut v2: Vec<_> = codes
        .iter()
        .map(|c| (c.clone(), format!("https://example.com/v2/{c}"), None))
        .collect();
    v2.push((extra.clone(), "https://example.com/new".into(), None));
    site.write_snapshot(2, 61, &v2);
    engine.signal("HUP");

    let deadline = Instant::now() + Duration::from_secs(10);
    let mut probe = Conn::open(&engine.addr);
    while probe.get(&format!("/{extra}")).status != 302 {
        assert!(Instant::now() < deadline, "new snapshot never served");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert!(load.finish() > 100, "too little load to mean anything");
    let h2 = h2load.wait_with_output().expect("h2load ends");
    let report = String::from_utf8_lossy(&h2.stdout);
    assert!(
        report.contains(" 0 failed, 0 errored"),
        "h2 through the swap: {report}"
    );
    assert!(
        report.contains(" 0 4xx, 0 5xx"),
        "h2 through the swap: {report}"
    );
    let r = probe.get(&format!("/{}", codes[0]));
    assert_eq!(
        r.header("location"),
        Some(format!("https://example.com/v2/{}", codes[0]).as_str())
    );

    // A corrupt replacement (renamed into place, as snapshots always are) is refused and the
    // current snapshot keeps serving.
    let tmp = site.dir.path().join("corrupt.tmp");
    std::fs::write(&tmp, b"not a snapshot").unwrap();
    std::fs::rename(&tmp, site.snapshot_path()).unwrap();
    engine.signal("HUP");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(probe.get(&format!("/{extra}")).status, 302);
}

/// SIGTERM: the engine stops accepting, lets open connections finish, and exits 0.
#[test]
fn sigterm_drains_and_exits_cleanly() {
    let site = Site::new();
    let code = site.scheme().encode_string(3).unwrap();
    site.write_snapshot(
        1,
        10,
        &[(code.clone(), "https://example.com/".into(), None)],
    );
    let mut engine = site.start(&[]);
    let mut conn = Conn::open(&engine.addr);
    assert_eq!(conn.get(&format!("/{code}")).status, 302);
    engine.signal("TERM");
    // The open connection is still answered while draining.
    assert_eq!(conn.get(&format!("/{code}")).status, 302);
    drop(conn);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(status) = engine.child.try_wait().unwrap() {
            assert!(status.success(), "exit status {status:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "engine did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A second engine started on a port the first one holds refuses to start, naming the
/// address, instead of joining the first one's SO_REUSEPORT group (same user, so the kernel
/// would let it) and taking a share of its connections; the first keeps every connection.
#[test]
fn a_second_engine_on_a_held_port_refuses_to_start() {
    let site = Site::new();
    let code = site.scheme().encode_string(3).unwrap();
    site.write_snapshot(
        1,
        10,
        &[(code.clone(), "https://example.com/first".into(), None)],
    );
    let engine = site.start(&[]);
    for listen in [
        engine.addr.clone(),
        format!("0.0.0.0:{}", port(&engine.addr)),
    ] {
        let mut second = Command::new(crate::harness::ENGINE)
            .args(["--snapshot", site.snapshot_path().to_str().unwrap()])
            .args(["--key-file", site.key_file().to_str().unwrap()])
            .args(["--listen", &listen, "--admin-listen", "127.0.0.1:0"])
            .args(["--cores", "1", "--io", "uring"])
            .arg("--data-dir")
            .arg(site.dir.path().join("second"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("second engine runs");
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(status) = second.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = second.kill();
                let _ = second.wait();
                panic!("a second engine on {listen} started and serves beside the first");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        second
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!status.success(), "a second engine on {listen} exited 0");
        assert!(
            err.contains(&format!("binding {listen}")) && err.contains("already in use"),
            "unclear refusal: {err}"
        );
    }
    // Every connection still reaches the first engine.
    for _ in 0..20 {
        let r = Conn::open(&engine.addr).get(&format!("/{code}"));
        assert_eq!(r.header("location"), Some("https://example.com/first"));
    }
}

fn port(addr: &str) -> &str {
    addr.rsplit(':').next().expect("host:port")
}

/// An operator's engine runs as a non-root user whose memlock limit is 8 MiB: it must start and
/// serve on io_uring (ring and buffer sizes are chosen for that).
#[test]
fn starts_as_non_root_under_an_8_mib_memlock_limit() {
    // SAFETY-free check of who we are: only root can drop to another user.
    let uid = Command::new("id").arg("-u").output().expect("id");
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        eprintln!("skipped: needs root to switch to the 'nobody' user");
        return;
    }
    if Command::new("setpriv").arg("--version").output().is_err()
        || Command::new("prlimit").arg("--version").output().is_err()
    {
        eprintln!("skipped: setpriv/prlimit (util-linux) not installed");
        return;
    }
    let site = Site::new();
    // The key as the package installs it (root:GROUP 0640): the engine reads it as a member of
    // the group; others could not.
    site.share_key_with_group("nogroup");
    let code = site.scheme().encode_string(3).unwrap();
    site.write_snapshot(
        1,
        10,
        &[(code.clone(), "https://example.com/np".into(), None)],
    );
    let mut cmd = Command::new("prlimit");
    cmd.args([
        "--memlock=8388608:8388608",
        "setpriv",
        "--reuid=nobody",
        "--regid=nogroup",
        "--clear-groups",
        "--",
        crate::harness::ENGINE,
        "--io",
        "uring",
    ]);
    let engine = Engine::start(cmd, &site, &[]);
    let mut conn = Conn::open(&engine.addr);
    let r = conn.get(&format!("/{code}"));
    assert_eq!(r.status, 302);
    assert_eq!(r.header("location"), Some("https://example.com/np"));
    // Its data dir belongs to root, so the click spool cannot be written: that costs the click
    // (counted), never the start or the redirect.
    lasthop_testkit::wait_until(Duration::from_secs(10), "the lost click counted", || {
        engine.metric("lasthop_engine_clicks_dropped_total{reason=\"sink\"}") == Some(1.0)
    });
}

/// A permutation key or a ticket key that other users can read stops the engine at start (and
/// `--check-config`), naming the file and the chmod that fixes it; group access does not.
#[test]
fn refuses_a_secret_file_others_can_read() {
    let site = Site::new();
    site.write_snapshot(1, 10, &[]);
    let run = |extra: &[&str]| {
        let out = Command::new(crate::harness::ENGINE)
            .arg("--check-config")
            .arg("--key-file")
            .arg(site.key_file())
            .arg("--snapshot")
            .arg(site.snapshot_path())
            .args(extra)
            .output()
            .expect("the engine runs");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&[]);
    assert!(ok, "{err}");
    lasthop_testkit::set_mode(&site.key_file(), 0o640);
    let (ok, err) = run(&[]);
    assert!(ok, "group access is the packaged layout: {err}");
    lasthop_testkit::set_mode(&site.key_file(), 0o644);
    let (ok, err) = run(&[]);
    let key = site.key_file().display().to_string();
    assert!(
        !ok && err.contains(&key) && err.contains(&format!("chmod o-rwx {key}")),
        "{err}"
    );
    lasthop_testkit::set_mode(&site.key_file(), 0o600);
    let tickets = site.dir.path().join("tickets.key");
    std::fs::write(&tickets, "42".repeat(32)).unwrap();
    lasthop_testkit::set_mode(&tickets, 0o644);
    let pki = lasthop_testkit::pki(&site, false);
    let (ok, err) = run(&[
        "--tls-listen",
        "127.0.0.1:0",
        "--cert",
        pki.cert.to_str().unwrap(),
        "--key",
        pki.key.to_str().unwrap(),
        "--tls-ticket-key-file",
        tickets.to_str().unwrap(),
    ]);
    assert!(
        !ok && err.contains("tickets.key") && err.contains("chmod o-rwx"),
        "{err}"
    );
}
