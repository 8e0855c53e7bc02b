//! The real binary over real sockets.

use std::collections::{HashMap, HashSet};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use crate::harness::{call, json, Site};

fn create(base: &str, key: &str, body: &str) -> Result<(u16, String), String> {
    call("POST", &format!("{base}/v1/links"), Some(key), Some(body))
}

/// curl, the client operators use, creates a link and reads it back.
#[test]
fn curl_create_and_get() {
    let site = Site::new();
    let server = site.start(&[]);
    let out = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code}", "-X", "POST"])
        .arg(server.url("/v1/links"))
        .args(["-H", &format!("Authorization: Bearer {}", site.api_key)])
        .args(["-H", "Content-Type: application/json"])
        .args(["-d", r#"{"long_url":"https://example.com/from-curl"}"#])
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let (body, status) = text.rsplit_once('\n').expect("status line");
    assert_eq!(status, "201", "{text}");
    let created = json(body);
    let code = created["code"].as_str().expect("code");
    assert_eq!(code.len(), 7);
    assert_eq!(
        created["short_url"].as_str(),
        Some(format!("http://127.0.0.1:8080/{code}").as_str())
    );
    let out = Command::new("curl")
        .args(["-sS", "-f"])
        .arg(server.url(&format!("/v1/links/{code}")))
        .args(["-H", &format!("Authorization: Bearer {}", site.api_key)])
        .output()
        .expect("curl runs");
    assert!(out.status.success());
    let got = json(&String::from_utf8_lossy(&out.stdout));
    assert_eq!(got["long_url"], "https://example.com/from-curl");
    assert_eq!(got["status"], "active");
}

/// Two simultaneous claims of one alias: exactly one 201 and one 409, for every alias tried.
#[test]
fn concurrent_alias_claims_have_one_winner() {
    let site = Site::new();
    let server = site.start(&[]);
    let rounds = 25;
    let barrier = Arc::new(Barrier::new(2));
    let results = Arc::new(Mutex::new(HashMap::<String, Vec<u16>>::new()));
    let threads: Vec<_> = (0..2)
        .map(|t| {
            let barrier = Arc::clone(&barrier);
            let results = Arc::clone(&results);
            let base = server.base.clone();
            let key = site.api_key.clone();
            std::thread::spawn(move || {
                for r in 0..rounds {
                    let alias = format!("race-alias-{r:03}");
                    let body = format!(
                        r#"{{"long_url":"https://example.com/claimant/{t}","alias":"{alias}"}}"#
                    );
                    barrier.wait();
                    let (status, _) = create(&base, &key, &body).expect("request");
                    results
                        .lock()
                        .unwrap()
                        .entry(alias)
                        .or_default()
                        .push(status);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("claimant thread");
    }
    let results = results.lock().unwrap();
    assert_eq!(results.len(), rounds);
    for (alias, statuses) in results.iter() {
        let mut s = statuses.clone();
        s.sort();
        assert_eq!(s, vec![201, 409], "alias {alias}");
    }
}

fn counter_of(site: &Site, code: &str) -> u64 {
    site.scheme()
        .decode(code.as_bytes())
        .expect("a generated code")
}

fn create_code(base: &str, key: &str, url: &str) -> String {
    let (status, body) = create(base, key, &format!(r#"{{"long_url":"{url}"}}"#)).expect("request");
    assert_eq!(status, 201, "{body}");
    json(&body)["code"].as_str().expect("code").to_string()
}

/// SIGTERM hands the unused counter block back (the next code continues the sequence);
/// SIGKILL burns it (the next code comes from a fresh block).
#[test]
fn graceful_shutdown_returns_the_block_and_a_crash_burns_it() {
    blocks_across_restarts(None);
}

/// The same on the PostgreSQL store.
#[test]
fn graceful_shutdown_returns_the_block_and_a_crash_burns_it_on_postgres() {
    if let Some((_pg, url)) = postgres_store("process::graceful_shutdown_on_postgres") {
        blocks_across_restarts(Some(&url));
    }
}

/// A database on the shared PostgreSQL test server, with its server kept alive.
fn postgres_store(test: &str) -> Option<(Arc<lasthop_testkit::Postgres>, String)> {
    lasthop_testkit::Postgres::fresh_database(test)
}

fn blocks_across_restarts(store: Option<&str>) {
    let site = Site::for_store(store);
    let block = 1000u64;
    let args = ["--block-size", "1000"];
    let server = site.start(&args);
    let first = counter_of(
        &site,
        &create_code(&server.base, &site.api_key, "https://example.com/1"),
    );
    server.terminate();

    let server = site.start(&args);
    let second = counter_of(
        &site,
        &create_code(&server.base, &site.api_key, "https://example.com/2"),
    );
    assert_eq!(
        second,
        first + 1,
        "returned block is reused after a graceful stop"
    );
    server.kill();

    let server = site.start(&args);
    let third = counter_of(
        &site,
        &create_code(&server.base, &site.api_key, "https://example.com/3"),
    );
    assert!(
        third >= first + block,
        "after SIGKILL the rest of the block is burnt: {first} then {third}"
    );
    // Everything created before either restart still reads back.
    for (n, url) in [(first, 1), (second, 2), (third, 3)] {
        let code = site.scheme().encode_string(n).unwrap();
        let (status, body) = crate::harness::call(
            "GET",
            &server.url(&format!("/v1/links/{code}")),
            Some(&site.api_key),
            None,
        )
        .unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            json(&body)["long_url"],
            format!("https://example.com/{url}")
        );
    }
}

/// The crash test: clients create links concurrently, the control plane is SIGKILLed mid-load
/// and restarted; every link that got a 201 resolves to its exact URL, and no code was handed
/// out twice across the restart.
#[test]
fn sigkill_mid_load_loses_no_acknowledged_link() {
    crash_mid_load(None);
}

/// The same on the PostgreSQL store.
#[test]
fn sigkill_mid_load_loses_no_acknowledged_link_on_postgres() {
    if let Some((_pg, url)) = postgres_store("process::sigkill_mid_load_on_postgres") {
        crash_mid_load(Some(&url));
    }
}

fn crash_mid_load(store: Option<&str>) {
    let site = Site::for_store(store);
    let server = site.start(&[]);
    let acked = Arc::new(Mutex::new(Vec::<(String, String)>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..8)
        .map(|c| {
            let acked = Arc::clone(&acked);
            let stop = Arc::clone(&stop);
            let base = server.base.clone();
            let key = site.api_key.clone();
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let url = format!("https://example.com/crash/{c}/{i}");
                    match create(&base, &key, &format!(r#"{{"long_url":"{url}"}}"#)) {
                        Ok((201, body)) => {
                            let code = json(&body)["code"].as_str().unwrap().to_string();
                            acked.lock().unwrap().push((code, url));
                        }
                        Ok((status, body)) => panic!("unexpected {status}: {body}"),
                        Err(_) => break, // the server died under us
                    }
                }
            })
        })
        .collect();
    // Let load build up, then pull the plug while requests are in flight.
    let started = Instant::now();
    while acked.lock().unwrap().len() < 300 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(20));
    }
    server.kill();
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.join().expect("client thread");
    }
    let before: Vec<(String, String)> = acked.lock().unwrap().clone();
    assert!(before.len() >= 300, "load too small: {}", before.len());

    let server = site.start(&[]);
    let mut after = Vec::new();
    for i in 0..200 {
        let url = format!("https://example.com/after/{i}");
        after.push((create_code(&server.base, &site.api_key, &url), url));
    }
    // Every acknowledged link, before and after the crash, resolves to its exact URL.
    let all: Vec<&(String, String)> = before.iter().chain(after.iter()).collect();
    for chunk in all.chunks(100) {
        let codes: Vec<&str> = chunk.iter().map(|(c, _)| c.as_str()).collect();
        let body = serde_json::json!({ "codes": codes }).to_string();
        let (status, resp) = call(
            "POST",
            &server.url("/v1/resolve"),
            Some(&site.api_key),
            Some(&body),
        )
        .unwrap();
        assert_eq!(status, 200, "{resp}");
        let results = json(&resp)["results"].as_array().unwrap().clone();
        for ((code, url), r) in chunk.iter().zip(results) {
            assert_eq!(r["code"], code.as_str());
            assert_eq!(r["status"], "active", "{code} lost after crash");
            assert_eq!(r["long_url"], url.as_str(), "{code} changed after crash");
        }
    }
    // No code (hence no counter) was handed out twice.
    let unique: HashSet<&str> = all.iter().map(|(c, _)| c.as_str()).collect();
    assert_eq!(unique.len(), all.len(), "a code was issued twice");
}

/// `snapshot build` writes every link of the store into an edge snapshot the reader accepts:
/// live links with their URL, deleted ones with none (the engine answers those 410 locally).
#[test]
fn snapshot_build_from_the_store() {
    let site = Site::new();
    let server = site.start(&[]);
    let live = create_code(&server.base, &site.api_key, "https://example.com/snap-live");
    let (s, body) = create(
        &server.base,
        &site.api_key,
        r#"{"long_url":"https://example.com/snap-alias","alias":"snapshot-alias"}"#,
    )
    .unwrap();
    assert_eq!(s, 201, "{body}");
    let gone = create_code(&server.base, &site.api_key, "https://example.com/snap-gone");
    let (s, _) = call(
        "DELETE",
        &server.url(&format!("/v1/links/{gone}")),
        Some(&site.api_key),
        None,
    )
    .unwrap();
    assert_eq!(s, 204);
    server.terminate();

    let out = site.dir.path().join("edge.snap");
    let status = Command::new(crate::harness::BIN)
        .args(["snapshot", "build", "--data-dir"])
        .arg(site.dir.path().join("data"))
        .arg("--key-file")
        .arg(site.key_file())
        .arg("--out")
        .arg(&out)
        .status()
        .expect("snapshot build runs");
    assert!(status.success());
    let snap = lasthop_snapshot::Snapshot::open(&out).expect("snapshot opens");
    snap.verify().expect("checksums");
    assert_eq!(snap.links(), 3);
    assert_eq!(snap.key_id(), site.scheme().key_id());
    assert_eq!(
        snap.lookup(live.as_bytes()).expect("live").url(),
        b"https://example.com/snap-live"
    );
    assert_eq!(
        snap.lookup(b"snapshot-alias").expect("alias").url(),
        b"https://example.com/snap-alias"
    );
    assert_eq!(snap.lookup(gone.as_bytes()).expect("tombstone").url(), b"");
    let n = site.scheme().decode(live.as_bytes()).unwrap();
    assert!(snap.high_water().may_be_issued(n));
}

/// The secret files `keygen` writes (the permutation key, and with `--signing` the snapshot
/// signing key; its `.pub` beside it is public) are 0600 from their first byte, a
/// world-readable file replaced with `--force` included: the new key never lives under the old
/// file's mode.
#[test]
fn keygen_writes_its_keys_0600_even_over_a_loose_file() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    let keygen = |args: &[&str]| {
        let out = Command::new(crate::harness::BIN)
            .arg("keygen")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "keygen {args:?}: {out:?}");
    };
    for (name, signing) in [("ff1.key", false), ("signing.key", true)] {
        let path = dir.path().join(name);
        let p = path.to_str().unwrap();
        let mut args = vec!["--out", p];
        if signing {
            args.push("--signing");
        }
        keygen(&args);
        assert_eq!(mode(&path), 0o600, "{name}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let before = std::fs::read(&path).unwrap();
        args.push("--force");
        keygen(&args);
        assert_eq!(mode(&path), 0o600, "{name} replaced");
        assert_ne!(std::fs::read(&path).unwrap(), before, "{name}: a new key");
    }
    // Nothing left but the keys and the signing key's public half.
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["ff1.key", "signing.key", "signing.key.pub"]);
}
