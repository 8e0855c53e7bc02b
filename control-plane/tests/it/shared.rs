//! Several control planes on one PostgreSQL store (SKIPPED where PostgreSQL is not installed):
//! the keys are shared, each leases its own counter blocks, an alias has one owner and an
//! idempotency key one link whichever control plane is asked, and the change log is gap-safe — writers on every control plane
//! creating and taking down at once, a feed subscriber on each, and every subscriber sees every
//! change exactly once, in the same order.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lasthop_core::feed::Frame;
use lasthop_testkit::{free_port, Postgres};

use crate::harness::{call, json, wait_until, FeedClient, Server, Site, BIN};

fn shared_site(test: &str) -> Option<(Arc<Postgres>, Site)> {
    let pg = Postgres::shared(test)?;
    let url = pg.database(&format!("s{}", std::process::id() ^ rand_u32()));
    let site = Site::shared(&url);
    Some((pg, site))
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    use std::io::Read as _;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .unwrap();
    u32::from_le_bytes(b)
}

fn control_planes(site: &Site, n: usize) -> Vec<Server> {
    (0..n)
        .map(|i| site.start_in(&format!("cp-{i}"), &["--scanner", "off"]))
        .collect()
}

#[test]
fn api_keys_are_shared_by_every_control_plane() {
    let Some((_pg, site)) = shared_site("shared::api_keys") else {
        return;
    };
    let cps = control_planes(&site, 2);
    let admin = site.new_key("ops", true);
    let fresh = site.new_key("carol", false);
    // A key made by the CLI works on every control plane on its first request.
    for cp in &cps {
        let (status, body) = call("GET", &cp.url("/v1/links"), Some(&fresh), None).unwrap();
        assert_eq!(status, 200, "{body}");
    }
    let id = |key: &str| {
        let out = std::process::Command::new(BIN)
            .args(["apikey", "list", "--json", "--owner", key])
            .args(["--store", site.store.as_deref().unwrap()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(!text.contains("lh_"), "never a secret: {text}");
        text.lines()
            .map(|l| json(l)["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let carol = id("carol");
    assert_eq!(carol.len(), 1);
    // Revoked through one control plane's admin API: the other refuses it within moments.
    let (status, _) = call(
        "DELETE",
        &cps[0].url(&format!("/v1/admin/apikeys/{}", carol[0])),
        Some(&admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 204);
    let (status, body) = call("GET", &cps[0].url("/v1/links"), Some(&fresh), None).unwrap();
    assert_eq!(
        (status, json(&body)["error"]["code"].clone()),
        (401, "key_revoked".into())
    );
    let took = wait_until(
        Duration::from_secs(5),
        "the revocation on the other",
        || {
            call("GET", &cps[1].url("/v1/links"), Some(&fresh), None)
                .unwrap()
                .0
                == 401
        },
    );
    println!("a revocation reached the other control plane in {took:?}");
    // Revoked by the CLI: both refuse it.
    let alice = id("alice");
    let out = std::process::Command::new(BIN)
        .args(["apikey", "revoke", &alice[0]])
        .args(["--store", site.store.as_deref().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    for cp in &cps {
        wait_until(Duration::from_secs(5), "the CLI's revocation", || {
            call("GET", &cp.url("/v1/links"), Some(&site.api_key), None)
                .unwrap()
                .0
                == 401
        });
    }
    // The admin key still works everywhere.
    for cp in &cps {
        assert_eq!(
            call("GET", &cp.url("/v1/admin/apikeys"), Some(&admin), None)
                .unwrap()
                .0,
            200
        );
    }
}

/// One event as a subscriber saw it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Seen {
    seq: u64,
    kind: &'static str,
    code: String,
}

/// Sends a create with an `Idempotency-Key`; the status and body.
fn create_once(cp: &Server, api_key: &str, key: &str, body: &str) -> (u16, String) {
    let resp = ureq::post(&cp.url("/v1/links"))
        .set("Authorization", &format!("Bearer {api_key}"))
        .set("Idempotency-Key", key)
        .set("Content-Type", "application/json")
        .send_string(body);
    match resp {
        Ok(r) => (r.status(), r.into_string().expect("body")),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().expect("body")),
        Err(e) => panic!("create: {e}"),
    }
}

#[test]
fn blocks_aliases_and_idempotency_keys_hold_across_control_planes() {
    let Some((_pg, site)) = shared_site("shared::aliases") else {
        return;
    };
    let cps = control_planes(&site, 3);
    // 12 concurrent claims of one alias, 4 through each control plane: exactly one wins.
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let claims: Vec<_> =
            (0..12)
                .map(|i| {
                    let url = cps[i % 3].url("/v1/links");
                    let key = site.api_key.clone();
                    s.spawn(move || {
                    let body = format!(
                        r#"{{"long_url":"https://example.com/claim/{i}","alias":"one-owner-only"}}"#
                    );
                    call("POST", &url, Some(&key), Some(&body)).expect("claim").0
                })
                })
                .collect();
        claims
            .into_iter()
            .map(|h| h.join().expect("claim"))
            .collect()
    });
    assert_eq!(
        statuses.iter().filter(|s| **s == 201).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 409).count(),
        11,
        "{statuses:?}"
    );

    // One Idempotency-Key and body through every control plane: one link; another body: 422.
    let body = r#"{"long_url":"https://example.com/exactly-once"}"#;
    let answers: Vec<(u16, String)> = cps
        .iter()
        .map(|cp| create_once(cp, &site.api_key, "retry-7", body))
        .collect();
    let codes: HashSet<String> = answers
        .iter()
        .map(|(status, b)| {
            assert!(matches!(status, 200 | 201), "{status} {b}");
            json(b)["code"].as_str().expect("code").to_string()
        })
        .collect();
    assert_eq!(codes.len(), 1, "one key, one link: {answers:?}");
    let (status, b) = create_once(
        &cps[2],
        &site.api_key,
        "retry-7",
        r#"{"long_url":"https://example.com/something-else"}"#,
    );
    assert_eq!(status, 422, "{b}");
    assert_eq!(json(&b)["error"]["code"], "idempotency_key_reused");

    // Each control plane mints from a block of its own.
    let scheme = site.scheme();
    let mut blocks: Vec<(u64, u64)> = Vec::new();
    for cp in &cps {
        let mut mine = Vec::new();
        for i in 0..5 {
            let (status, b) = call(
                "POST",
                &cp.url("/v1/links"),
                Some(&site.api_key),
                Some(&format!(
                    r#"{{"long_url":"https://example.com/block/{i}"}}"#
                )),
            )
            .expect("create");
            assert_eq!(status, 201, "{b}");
            let code = json(&b)["code"].as_str().expect("code").to_string();
            let n = scheme.decode(code.as_bytes()).expect("a generated code");
            mine.push(n);
        }
        let (lo, hi) = (*mine.iter().min().unwrap(), *mine.iter().max().unwrap());
        assert!(
            hi - lo < 10_000,
            "one control plane's creates come from one block: {mine:?}"
        );
        blocks.push((lo, hi));
    }
    blocks.sort();
    for w in blocks.windows(2) {
        assert!(
            w[0].1 < w[1].0,
            "the control planes' blocks overlap: {blocks:?}"
        );
    }
}

#[test]
fn the_change_log_is_gap_safe_across_control_planes() {
    let Some((_pg, site)) = shared_site("shared::gap_safe") else {
        return;
    };
    let cps = control_planes(&site, 3);
    let admin = site.new_key("ops", true);
    // One edge token, from the store, for every control plane.
    let token = site.edge_token_in("cp-0");
    for i in 1..cps.len() {
        assert_eq!(site.edge_token_in(&format!("cp-{i}")), token);
    }
    // A subscriber on every control plane, from the beginning.
    let mut feeds: Vec<FeedClient> = cps
        .iter()
        .enumerate()
        .map(|(i, cp)| {
            FeedClient::connect(
                &cp.edge_base,
                &token,
                &format!("after=0&engine=gap-{i}&pop=t"),
            )
        })
        .collect();

    // Four writers, spread over the control planes, creating and taking down at once.
    const CREATES: usize = 60;
    let created = Arc::new(Mutex::new(Vec::<String>::new()));
    let taken = Arc::new(Mutex::new(Vec::<String>::new()));
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let base = cps[w % cps.len()].base.clone();
            let (key, admin) = (site.api_key.clone(), admin.clone());
            let (created, taken) = (Arc::clone(&created), Arc::clone(&taken));
            std::thread::spawn(move || {
                for i in 0..CREATES {
                    let body = format!(r#"{{"long_url":"https://example.com/gap/{w}/{i}"}}"#);
                    let (status, resp) =
                        call("POST", &format!("{base}/v1/links"), Some(&key), Some(&body)).unwrap();
                    assert_eq!(status, 201, "{resp}");
                    let code = json(&resp)["code"].as_str().unwrap().to_string();
                    created.lock().unwrap().push(code.clone());
                    if i % 3 == 0 {
                        let (status, resp) = call(
                            "POST",
                            &format!("{base}/v1/links/{code}/takedown"),
                            Some(&admin),
                            Some(r#"{"reason":"phishing"}"#),
                        )
                        .unwrap();
                        assert_eq!(status, 200, "{resp}");
                        taken.lock().unwrap().push(code);
                    }
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    let created = created.lock().unwrap().clone();
    let taken = taken.lock().unwrap().clone();
    let expected = created.len() + taken.len();

    // Every subscriber reads until it has seen as many changes as were made.
    let logs: Vec<Vec<Seen>> = feeds
        .iter_mut()
        .map(|feed| {
            let mut seen = Vec::new();
            while seen.len() < expected {
                let (kind, frame) = match feed.next_event() {
                    Frame::LinkCreated(f) => ("created", f),
                    Frame::StateChanged(f) => ("changed", f),
                    _ => continue,
                };
                seen.push(Seen {
                    seq: frame.seq,
                    kind,
                    code: frame.code,
                });
            }
            // And nothing more: up to the next heartbeat, no further change arrives.
            loop {
                match feed.next() {
                    Frame::Heartbeat { last_seq, .. } => {
                        assert_eq!(last_seq, seen.last().map_or(0, |s: &Seen| s.seq));
                        break;
                    }
                    Frame::LinkCreated(f) | Frame::StateChanged(f) => {
                        panic!("a change beyond those made: {f:?}")
                    }
                    _ => {}
                }
            }
            seen
        })
        .collect();
    for (i, log) in logs.iter().enumerate() {
        assert_eq!(log, &logs[0], "subscriber {i} saw another order");
        for pair in log.windows(2) {
            assert_eq!(pair[1].seq, pair[0].seq + 1, "a gap or a repeat: {pair:?}");
        }
    }
    let once: HashSet<&Seen> = logs[0].iter().collect();
    assert_eq!(once.len(), expected, "every change exactly once");
    let mut kinds: HashMap<&str, HashSet<&str>> = HashMap::new();
    for s in &logs[0] {
        kinds.entry(s.kind).or_default().insert(s.code.as_str());
    }
    let created_set: HashSet<&str> = created.iter().map(String::as_str).collect();
    let taken_set: HashSet<&str> = taken.iter().map(String::as_str).collect();
    assert_eq!(created_set.len(), created.len(), "no code issued twice");
    assert_eq!(kinds["created"], created_set);
    assert_eq!(kinds["changed"], taken_set);
    // A takedown comes after its link's creation in the one order.
    let position: HashMap<(&str, &str), usize> = logs[0]
        .iter()
        .enumerate()
        .map(|(n, s)| ((s.kind, s.code.as_str()), n))
        .collect();
    for code in &taken {
        assert!(position[&("created", code.as_str())] < position[&("changed", code.as_str())]);
    }
    println!(
        "{} changes from 4 writers on 3 control planes, seen identically by 3 subscribers",
        expected
    );
}

/// One snapshot publisher at a time, any control plane serves the downloads; the fleet, the
/// owners' suspensions and the scanner are shared the same way.
#[test]
fn snapshots_fleet_suspensions_and_the_scanner_are_shared() {
    use lasthop_core::feed::SnapshotFrame;
    let Some((pg, site)) = shared_site("shared::snapshots") else {
        return;
    };
    let db = site.store.clone().unwrap();
    let db = db.rsplit('/').next().unwrap().to_string();
    let args = ["--snapshot-interval-secs", "1"];
    let cps: Vec<Server> = (0..3)
        .map(|i| site.start_in(&format!("cp-{i}"), &args))
        .collect();
    let admin = site.new_key("ops", true);
    let token = site.edge_token_in("cp-0");
    let mut made = Vec::new();
    for i in 0..20 {
        let body = format!(r#"{{"long_url":"https://example.com/snap/{i}"}}"#);
        let (status, resp) = call(
            "POST",
            &cps[i % 3].url("/v1/links"),
            Some(&site.api_key),
            Some(&body),
        )
        .unwrap();
        assert_eq!(status, 201, "{resp}");
        made.push(json(&resp)["code"].as_str().unwrap().to_string());
    }
    let last_seq: u64 = pg
        .psql_on(&db, "SELECT max(seq) FROM changes")
        .trim()
        .parse()
        .unwrap();
    // Every control plane comes to announce the same snapshot covering every change.
    let latest = |cp: &Server| {
        let (status, body) = call(
            "GET",
            &cp.edge_url("/edge/v1/snapshots/latest"),
            Some(&token),
            None,
        )
        .unwrap();
        (status == 200).then(|| serde_json::from_str::<SnapshotFrame>(&body).unwrap())
    };
    let took = wait_until(Duration::from_secs(20), "one snapshot everywhere", || {
        let frames: Vec<_> = cps.iter().map(latest).collect();
        frames
            .iter()
            .all(|f| f.as_ref().is_some_and(|f| f.seq >= last_seq))
            && frames.windows(2).all(|w| w[0] == w[1])
    });
    println!("every control plane announced the newest snapshot within {took:?}");
    let frame = latest(&cps[0]).unwrap();
    // Scheduled builds on three control planes made one snapshot per state of the log.
    let seqs = pg.psql_on(&db, "SELECT seq FROM snapshots ORDER BY seq");
    let seqs: Vec<&str> = seqs
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let distinct: HashSet<&&str> = seqs.iter().collect();
    assert_eq!(
        distinct.len(),
        seqs.len(),
        "two builds of one state: {seqs:?}"
    );
    // Each control plane serves the same bytes, and they verify.
    for cp in &cps {
        let (status, bytes, _) = crate::harness::get_bytes(&cp.edge_url(&frame.url), &token);
        assert_eq!(status, 200);
        use sha2::Digest as _;
        assert_eq!(hex::encode(sha2::Sha256::digest(&bytes)), frame.sha256);
        let snap = lasthop_snapshot::Snapshot::from_vec(bytes).expect("opens");
        snap.verify().expect("verifies");
    }
    // A control plane that never copied it (a fresh one) fetches it from the store on demand.
    let late = site.start_in("cp-late", &["--snapshot-interval-secs", "3600"]);
    let (status, bytes, _) = crate::harness::get_bytes(&late.edge_url(&frame.url), &token);
    assert_eq!(
        status,
        200,
        "{}; stored: {}",
        String::from_utf8_lossy(&bytes),
        pg.psql_on(&db, "SELECT id FROM snapshots ORDER BY seq")
    );
    assert_eq!(bytes.len() as u64, frame.size);

    // The fleet: an engine reporting to one control plane is listed by every other.
    let report = serde_json::json!({
        "engine": "edge-1", "pop": "ams", "applied_seq": last_seq,
        "snapshot_id": frame.id, "snapshot_seq": frame.seq,
        "feed_connected": true, "safe_mode": false, "time_ms": 1,
    });
    let (status, body) = call(
        "POST",
        &cps[0].edge_url("/edge/v1/status"),
        Some(&token),
        Some(&report.to_string()),
    )
    .unwrap();
    assert_eq!(status, 204, "{body}");
    for cp in &cps[1..] {
        let (status, body) = call("GET", &cp.url("/v1/edges"), Some(&admin), None).unwrap();
        assert_eq!(status, 200, "{body}");
        let edges = json(&body)["edges"].clone();
        assert_eq!(edges.as_array().map(Vec::len), Some(1), "{body}");
        assert_eq!(edges[0]["engine"], "edge-1");
    }

    // A suspension through one control plane stops the owner's keys on every other.
    let (status, body) = call(
        "POST",
        &cps[1].url("/v1/admin/owners/alice/suspend"),
        Some(&admin),
        Some(r#"{"reason":"phishing campaign"}"#),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    for cp in &cps {
        let took = wait_until(Duration::from_secs(5), "the suspension everywhere", || {
            let (status, body) =
                call("GET", &cp.url("/v1/links"), Some(&site.api_key), None).unwrap();
            status == 401 && json(&body)["error"]["code"] == "key_suspended"
        });
        println!("suspension seen in {took:?}");
    }

    // One scanner among the control planes; when its control plane goes, another takes over.
    let leaders = |cps: &[Server]| -> Vec<usize> {
        cps.iter()
            .enumerate()
            .filter(|(_, cp)| cp.metric("lasthop_scanner_leader") == Some(1.0))
            .map(|(i, _)| i)
            .collect()
    };
    let mut cps = cps;
    cps.push(late);
    wait_until(Duration::from_secs(10), "a scanner leader", || {
        leaders(&cps).len() == 1
    });
    let leader = leaders(&cps)[0];
    cps.remove(leader).kill();
    let took = wait_until(Duration::from_secs(15), "a new scanner leader", || {
        leaders(&cps).len() == 1
    });
    println!("the scanner moved to another control plane in {took:?}");
}

/// Two regions on PostgreSQL, each its own database: region 0 with two control planes (both
/// replicating region 1 at once), region 1 with one. A link made in region 1 is in region 0's
/// store once, whichever of its control planes applied it; a takedown issued in region 0 of
/// region 1's link reaches region 1 with its audit record; a restore issued in region 0 is
/// forwarded to region 1 and comes back; API keys made in region 0 work in region 1.
#[test]
fn regions_on_postgres_replicate_once_and_forward_to_the_home() {
    let Some(pg) = Postgres::shared("shared::regions_on_postgres") else {
        return;
    };
    let url_a = pg.database(&format!("ra{}", rand_u32()));
    let url_b = pg.database(&format!("rb{}", rand_u32()));
    let site_a = Site::shared(&url_a);
    let site_b = Site::shared(&url_b);
    // One permutation key for every region: any region decodes any code's counter.
    std::fs::copy(site_a.key_file(), site_b.key_file()).unwrap();
    let token = site_a.dir.path().join("peer.token");
    lasthop_testkit::write_secret(&token, "0123456789abcdef0123456789abcdef-peers\n");
    let token = token.to_str().unwrap().to_string();
    let (pa0, pa1, pb) = (free_port(), free_port(), free_port());
    let region = |site: &Site, name: &str, r: &str, edge: u16, peer: String| {
        let edge = format!("127.0.0.1:{edge}");
        site.start_in(
            name,
            &[
                "--scanner",
                "off",
                "--region",
                r,
                "--regions",
                "2",
                "--edge-listen",
                &edge,
                "--peer",
                &peer,
                "--peer-token-file",
                &token,
            ],
        )
    };
    let a0 = region(&site_a, "a0", "0", pa0, format!("1=http://127.0.0.1:{pb}"));
    let a1 = region(&site_a, "a1", "0", pa1, format!("1=http://127.0.0.1:{pb}"));
    let b = region(&site_b, "b", "1", pb, format!("0=http://127.0.0.1:{pa0}"));
    // Region 0's keys reach region 1 (copied each second).
    let admin = site_a.new_key("ops", true);
    let took = wait_until(
        Duration::from_secs(10),
        "region 0's keys at region 1",
        || {
            [&site_a.api_key, &admin]
                .iter()
                .all(|k| call("GET", &b.url("/v1/links"), Some(k), None).unwrap().0 == 200)
        },
    );
    println!("a key of region 0 worked in region 1 after {took:?}");
    let (status, body) = call(
        "POST",
        &b.url("/v1/links"),
        Some(&site_a.api_key),
        Some(r#"{"long_url":"https://example.com/made-in-1"}"#),
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let code = json(&body)["code"].as_str().unwrap().to_string();
    let status_at = |cp: &Server| {
        let (status, body) = call(
            "GET",
            &cp.url(&format!("/v1/links/{code}")),
            Some(&admin),
            None,
        )
        .unwrap();
        if status == 404 {
            return "not_here_yet".to_string();
        }
        assert_eq!(status, 200, "{body}");
        json(&body)["status"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    for cp in [&a0, &a1] {
        wait_until(
            Duration::from_secs(10),
            "region 1's link in region 0",
            || status_at(cp) == "active",
        );
    }
    // In region 0's own store (not only read through): replication caught up.
    wait_until(Duration::from_secs(10), "region 0 caught up", || {
        let (status, body) = call("GET", &a0.url("/v1/regions"), Some(&admin), None).unwrap();
        let peer = &json(&body)["peers"][0];
        status == 200 && peer["applied_seq"].as_u64() >= Some(1) && peer["lag_changes"] == 0
    });
    let (status, body) = call(
        "POST",
        &a1.url(&format!("/v1/links/{code}/takedown")),
        Some(&admin),
        Some(r#"{"reason":"phishing"}"#),
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let took = wait_until(
        Duration::from_secs(5),
        "region 0's takedown at region 1",
        || status_at(&b) == "taken_down",
    );
    println!("a takedown in region 0 reached region 1 (PostgreSQL) after {took:?}");
    let (status, body) = call(
        "GET",
        &b.url(&format!("/v1/links/{code}/history")),
        Some(&admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    let history = json(&body)["history"].clone();
    assert!(
        history
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["action"] == "takedown" && r["origin"]["region"] == 0),
        "{history}"
    );
    let (status, body) = call(
        "POST",
        &a0.url(&format!("/v1/links/{code}/restore")),
        Some(&admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "{body}");
    for cp in [&b, &a0, &a1] {
        wait_until(Duration::from_secs(5), "the restore everywhere", || {
            status_at(cp) == "active"
        });
    }
    // Two control planes pulled region 1 into one store: each of its changes is there once.
    let scheme = site_a.scheme();
    let store = lasthop_control::store::postgres::PgStore::open(
        lasthop_control::store::postgres::PgStoreConfig::new(url_a.clone(), scheme),
    )
    .unwrap();
    use lasthop_control::store::Store as _;
    let changes = store.changes_since(0, 10_000).unwrap();
    let created = changes
        .iter()
        .filter(|(_, c)| matches!(c, lasthop_core::Change::LinkCreated { link, .. } if link.code == code))
        .count();
    assert_eq!(created, 1, "{changes:?}");
}
