//! The edge feed, snapshot publishing and status reports over real sockets against the real
//! binary (core/FEED.md): frames read off the wire with a hand-rolled chunked decoder
//! and parsed with the engine's own parser.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use lasthop_core::feed::{DenyEntry, DenyKind, Frame, LinkFrame, SnapshotFrame};
use sha2::{Digest, Sha256};

use crate::harness::{call, get_bytes, json, FeedClient, Server, Site};

fn create(server: &Server, key: &str, url: &str) -> String {
    let body = format!(r#"{{"long_url":"{url}"}}"#);
    let (status, resp) = call("POST", &server.url("/v1/links"), Some(key), Some(&body)).unwrap();
    assert_eq!(status, 201, "{resp}");
    json(&resp)["code"].as_str().unwrap().to_string()
}

fn admin_post(server: &Server, key: &str, path: &str, body: &str) -> serde_json::Value {
    let (status, resp) = call("POST", &server.url(path), Some(key), Some(body)).unwrap();
    assert!(status == 200 || status == 201, "{path}: {status} {resp}");
    json(&resp)
}

fn link_frame(frame: Frame, want: &str) -> LinkFrame {
    match (want, frame) {
        ("link_created", Frame::LinkCreated(l)) | ("state_changed", Frame::StateChanged(l)) => l,
        (_, other) => panic!("expected {want}, got {other:?}"),
    }
}

/// Waits (up to a generous timeout) for the startup snapshot, so a new subscription's third frame
/// is deterministic.
fn wait_for_snapshot(server: &Server, token: &str) -> SnapshotFrame {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = call(
            "GET",
            &server.edge_url("/edge/v1/snapshots/latest"),
            Some(token),
            None,
        )
        .unwrap();
        if status == 200 {
            return serde_json::from_str(&body).expect("a snapshot frame");
        }
        assert_eq!(json(&body)["error"]["code"], "no_snapshot");
        assert!(Instant::now() < deadline, "no startup snapshot");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Token: 401 without it or with a wrong one, 200 with it, `/healthz` open; the file is 64 hex
/// characters, mode 0600, and the same after a restart.
#[test]
fn edge_token_guards_the_edge_listener_and_survives_restart() {
    use std::os::unix::fs::PermissionsExt as _;
    let site = Site::new();
    let server = site.start(&[]);
    let token = site.edge_token();
    assert_eq!(token.len(), 64);
    assert!(token
        .bytes()
        .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    let path = site.dir.path().join("data/edge.token");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);

    let code = create(&server, &site.api_key, "https://example.com/token");
    let url = server.edge_url(&format!("/edge/v1/links/{code}"));
    for (key, what) in [
        (None, "no token"),
        (Some(site.api_key.as_str()), "an API key"),
        (Some(&token[..63]), "a truncated token"),
    ] {
        let (status, body) = call("GET", &url, key, None).unwrap();
        assert_eq!(status, 401, "{what}: {body}");
        assert_eq!(json(&body)["error"]["code"], "edge_unauthorized", "{what}");
    }
    // Every edge route, known or not, wants the token.
    for path in [
        "/edge/v1/feed?engine=e&pop=p",
        "/edge/v1/snapshots/latest",
        "/nothing-here",
    ] {
        let (status, _) = call("GET", &server.edge_url(path), None, None).unwrap();
        assert_eq!(status, 401, "{path}");
    }
    let (status, body) = call("GET", &url, Some(&token), None).unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        call("GET", &server.edge_url("/healthz"), None, None).unwrap(),
        (200, "ok\n".to_string())
    );
    server.terminate();

    let text = std::fs::read_to_string(&path).unwrap();
    let server = site.start(&[]);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    let (status, body) = call(
        "GET",
        &server.edge_url(&format!("/edge/v1/links/{code}")),
        Some(&token),
        None,
    )
    .unwrap();
    assert_eq!(status, 200, "the same token works after a restart: {body}");
}

/// A subscription gets hello, the standing denylist, the newest snapshot and the change log in
/// order; then live changes (a takedown within 200 ms), heartbeats when idle, and a resumed
/// subscription replays only later changes. SIGTERM ends open streams and exits cleanly.
#[test]
fn feed_streams_the_log_then_live_changes() {
    let site = Site::new();
    let admin = Site::create_key(site.dir.path(), "ops", true);
    let server = site.start(&[]);
    let token = site.edge_token();
    let snapshot = wait_for_snapshot(&server, &token);

    let live = create(&server, &site.api_key, "https://example.com/live");
    let blocked = create(&server, &site.api_key, "https://example.com/blocked");
    let warned = create(&server, &site.api_key, "https://example.com/warned");
    let restored = create(&server, &site.api_key, "https://example.com/restored");
    let takedown = |code: &str, body: &str| {
        admin_post(&server, &admin, &format!("/v1/links/{code}/takedown"), body)
    };
    takedown(&blocked, r#"{"reason":"phishing"}"#);
    let v = takedown(&warned, r#"{"reason":"suspicious","warn":true}"#);
    assert_eq!(
        (v["status"].as_str(), v["flagged"].as_bool()),
        (Some("active"), Some(true))
    );
    takedown(&restored, r#"{"reason":"mistake"}"#);
    admin_post(
        &server,
        &admin,
        &format!("/v1/links/{restored}/restore"),
        "",
    );

    let mut feed = FeedClient::connect(&server.edge_base, &token, "after=0&engine=test-1&pop=ams");
    let Frame::Hello { last_seq, .. } = feed.next() else {
        panic!("hello first")
    };
    assert_eq!(last_seq, 8, "4 creates, 3 takedowns, 1 restore");
    let Frame::Denylist { seq, entries, .. } = feed.next() else {
        panic!("denylist second")
    };
    assert_eq!(seq, 8);
    let mut entries: Vec<(String, DenyKind)> = entries
        .into_iter()
        .map(|DenyEntry { code, deny }| (code, deny))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut want = vec![
        (blocked.clone(), DenyKind::Gone),
        (warned.clone(), DenyKind::Warn),
    ];
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        entries, want,
        "taken down and warned; not restored, not live"
    );
    assert_eq!(
        feed.next(),
        Frame::Snapshot(snapshot),
        "the newest snapshot third"
    );
    assert_eq!(
        feed.next(),
        Frame::Certificates { generation: 0 },
        "the domains' generation fourth"
    );

    let created: Vec<LinkFrame> = (0..4)
        .map(|_| link_frame(feed.next_event(), "link_created"))
        .collect();
    let codes: Vec<&str> = created.iter().map(|l| l.code.as_str()).collect();
    assert_eq!(codes, [&live, &blocked, &warned, &restored]);
    assert_eq!(
        created.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [1, 2, 3, 4]
    );
    assert_eq!(created[0].long_url, "https://example.com/live");
    assert!(created[0].created_at_ms.is_some());
    let changed: Vec<LinkFrame> = (0..4)
        .map(|_| link_frame(feed.next_event(), "state_changed"))
        .collect();
    assert_eq!(
        changed.iter().map(|l| l.seq).collect::<Vec<_>>(),
        [5, 6, 7, 8]
    );
    assert_eq!(
        (
            changed[0].code.as_str(),
            changed[0].takedown_reason.as_deref()
        ),
        (blocked.as_str(), Some("phishing"))
    );
    assert_eq!(changed[0].long_url, "https://example.com/blocked");
    assert!(changed[1].warn && changed[1].takedown_reason.is_none());
    assert_eq!(changed[3].code, restored);
    assert!(!changed[3].gone() && !changed[3].warn);

    // Live: a create, then a takedown that must arrive within 200 ms of being asked for.
    let fresh = create(&server, &site.api_key, "https://example.com/fresh");
    let l = link_frame(feed.next_event(), "link_created");
    assert_eq!((l.seq, l.code.as_str()), (9, fresh.as_str()));
    let asked = Instant::now();
    takedown(&fresh, r#"{"reason":"malware"}"#);
    let l = link_frame(feed.next_event(), "state_changed");
    let latency = asked.elapsed();
    assert_eq!((l.seq, l.takedown_reason.as_deref()), (10, Some("malware")));
    assert!(
        latency < Duration::from_millis(200),
        "takedown took {latency:?}"
    );

    admin_post(&server, &admin, &format!("/v1/links/{fresh}/restore"), "");
    let l = link_frame(feed.next_event(), "state_changed");
    assert_eq!(
        (l.seq, l.takedown_reason.as_deref(), l.gone()),
        (11, None, false)
    );

    let patch = |body: &str| {
        let (status, resp) = call(
            "PATCH",
            &server.url(&format!("/v1/links/{fresh}")),
            Some(&site.api_key),
            Some(body),
        )
        .unwrap();
        assert_eq!(status, 200, "{resp}");
    };
    patch(r#"{"expires_at":"2100-01-01T00:00:00Z"}"#);
    let l = link_frame(feed.next_event(), "state_changed");
    assert_eq!((l.seq, l.expires_at_ms), (12, Some(4_102_444_800_000)));
    patch(r#"{"disabled":true}"#);
    let l = link_frame(feed.next_event(), "state_changed");
    assert!(l.disabled && l.gone() && l.expires_at_ms.is_some(), "{l:?}");
    let (status, _) = call(
        "DELETE",
        &server.url(&format!("/v1/links/{fresh}")),
        Some(&site.api_key),
        None,
    )
    .unwrap();
    assert_eq!(status, 204);
    let l = link_frame(feed.next_event(), "state_changed");
    assert_eq!((l.seq, l.deleted, l.long_url.as_str()), (14, true, ""));

    // Idle: heartbeats, at most 1.5 s apart, carrying the last sequence.
    let mut last = Instant::now();
    for _ in 0..3 {
        match feed.next() {
            Frame::Heartbeat { last_seq, .. } => assert_eq!(last_seq, 14),
            other => panic!("expected a heartbeat, got {other:?}"),
        }
        let gap = last.elapsed();
        assert!(gap <= Duration::from_millis(1500), "heartbeat gap {gap:?}");
        last = Instant::now();
    }

    // Resuming after 10 replays 11..=14 only.
    let mut resumed =
        FeedClient::connect(&server.edge_base, &token, "after=10&engine=test-1&pop=ams");
    assert!(matches!(resumed.next(), Frame::Hello { last_seq: 14, .. }));
    let Frame::Denylist { entries, .. } = resumed.next() else {
        panic!("denylist")
    };
    assert!(
        !entries.iter().any(|e| e.code == fresh),
        "deleted links are not listed"
    );
    assert!(matches!(resumed.next(), Frame::Snapshot(_)));
    assert!(matches!(resumed.next(), Frame::Certificates { .. }));
    let seqs: Vec<u64> = (0..4)
        .map(|_| link_frame(resumed.next_event(), "state_changed").seq)
        .collect();
    assert_eq!(seqs, [11, 12, 13, 14]);
    assert!(matches!(
        resumed.next(),
        Frame::Heartbeat { last_seq: 14, .. }
    ));

    // Bad subscriptions are refused before streaming.
    for query in [
        "after=0&pop=ams",
        "after=0&engine=a%20b&pop=ams",
        "after=x&engine=e&pop=p",
    ] {
        let (status, body) = call(
            "GET",
            &server.edge_url(&format!("/edge/v1/feed?{query}")),
            Some(&token),
            None,
        )
        .unwrap();
        assert_eq!(status, 400, "{query}: {body}");
    }

    // Graceful shutdown ends open streams instead of waiting for them forever.
    server.terminate();
    while feed.read_chunk().is_some() {}
}

/// On-demand publishing announces the snapshot on a connected feed; the download has the
/// advertised size and hash, verifies, and holds a link created before it; old snapshots are
/// garbage-collected except the newest two and any an engine reported.
#[test]
fn snapshots_publish_download_and_collect() {
    let site = Site::new();
    let admin = Site::create_key(site.dir.path(), "ops", true);
    let server = site.start(&[]);
    let token = site.edge_token();
    let startup = wait_for_snapshot(&server, &token);
    let code = create(&server, &site.api_key, "https://example.com/in-snapshot");

    let mut feed = FeedClient::connect(&server.edge_base, &token, "after=0&engine=snap-1&pop=ams");
    assert!(matches!(feed.next(), Frame::Hello { .. }));
    assert!(matches!(feed.next(), Frame::Denylist { .. }));
    assert_eq!(feed.next(), Frame::Snapshot(startup.clone()));
    assert!(matches!(feed.next(), Frame::Certificates { .. }));
    link_frame(feed.next_event(), "link_created");

    let (status, body) = call(
        "POST",
        &server.url("/v1/admin/snapshots"),
        Some(&site.api_key),
        None,
    )
    .unwrap();
    assert_eq!(status, 403, "{body}");
    let (status, body) = call(
        "POST",
        &server.url("/v1/admin/snapshots"),
        Some(&admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 201, "{body}");
    let published: SnapshotFrame = serde_json::from_str(&body).unwrap();
    assert_eq!(published.seq, 1);
    assert_eq!(feed.next_event(), Frame::Snapshot(published.clone()));
    let (status, body) = call(
        "GET",
        &server.edge_url("/edge/v1/snapshots/latest"),
        Some(&token),
        None,
    )
    .unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<SnapshotFrame>(&body).unwrap(),
        published
    );

    let (status, bytes, len) = get_bytes(&server.edge_url(&published.url), &token);
    assert_eq!(status, 200);
    assert_eq!(len, Some(published.size.to_string()));
    assert_eq!(bytes.len() as u64, published.size);
    assert_eq!(hex::encode(Sha256::digest(&bytes)), published.sha256);
    // The zstd copy decompresses to the same bytes; both answer a Range.
    let (status, packed, _) =
        get_bytes(&format!("{}.zst", server.edge_url(&published.url)), &token);
    assert_eq!(status, 200);
    assert!(
        packed.len() < bytes.len(),
        "{} of {}",
        packed.len(),
        bytes.len()
    );
    assert_eq!(zstd::decode_all(&packed[..]).expect("a zstd stream"), bytes);
    let ranged = |suffix: &str, range: &str| {
        let resp = ureq::get(&format!("{}{suffix}", server.edge_url(&published.url)))
            .set("Authorization", &format!("Bearer {token}"))
            .set("Range", range)
            .call();
        let resp = match resp {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{e}"),
        };
        let status = resp.status();
        let content_range = resp.header("Content-Range").map(str::to_owned);
        let mut body = Vec::new();
        std::io::Read::read_to_end(&mut resp.into_reader(), &mut body).unwrap();
        (status, content_range, body)
    };
    let (status, content_range, tail) = ranged("", "bytes=100-");
    assert_eq!(status, 206);
    assert_eq!(
        content_range,
        Some(format!("bytes 100-{}/{}", bytes.len() - 1, bytes.len()))
    );
    assert_eq!(tail, bytes[100..]);
    let (status, _, part) = ranged(".zst", "bytes=10-19");
    assert_eq!((status, part.as_slice()), (206, &packed[10..20]));
    let (status, content_range, _) = ranged("", &format!("bytes={}-", bytes.len()));
    assert_eq!(status, 416);
    assert_eq!(content_range, Some(format!("bytes */{}", bytes.len())));
    let snap = lasthop_snapshot::Snapshot::from_vec(bytes).expect("snapshot opens");
    snap.verify().expect("snapshot verifies");
    assert_eq!(snap.sequence(), 1);
    assert_eq!(
        snap.lookup(code.as_bytes()).expect("the link").url(),
        b"https://example.com/in-snapshot"
    );

    // An engine reports the startup snapshot: it survives collection, unlike the one between.
    let report = serde_json::json!({
        "engine": "snap-1", "pop": "ams", "applied_seq": 1,
        "snapshot_id": startup.id, "snapshot_seq": startup.seq,
        "feed_connected": true, "safe_mode": false, "time_ms": 1,
    });
    let (status, body) = call(
        "POST",
        &server.edge_url("/edge/v1/status"),
        Some(&token),
        Some(&report.to_string()),
    )
    .unwrap();
    assert_eq!(status, 204, "{body}");
    let mut newest = Vec::new();
    for i in 0..3 {
        // A change before each, so every snapshot has its own sequence.
        create(
            &server,
            &site.api_key,
            &format!("https://example.com/later/{i}"),
        );
        let (status, body) = call(
            "POST",
            &server.url("/v1/admin/snapshots"),
            Some(&admin),
            None,
        )
        .unwrap();
        assert_eq!(status, 201, "{body}");
        newest.push(serde_json::from_str::<SnapshotFrame>(&body).unwrap().id);
    }
    let on_disk: HashSet<String> = std::fs::read_dir(site.dir.path().join("data/snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    // Each kept snapshot with its zstd copy; a collected one's copy goes with it.
    let want: HashSet<String> = [&startup.id, &newest[1], &newest[2]]
        .iter()
        .flat_map(|id| [format!("{id}.snap"), format!("{id}.snap.zst")])
        .collect();
    assert_eq!(on_disk, want);
    for gone in [&published.id, &newest[0]] {
        for suffix in ["", ".zst"] {
            let (status, body) = call(
                "GET",
                &server.edge_url(&format!("/edge/v1/snapshots/{gone}{suffix}")),
                Some(&token),
                None,
            )
            .unwrap();
            assert_eq!(
                (status, json(&body)["error"]["code"].as_str()),
                (404, Some("unknown_snapshot"))
            );
        }
    }
    let (status, body) = call(
        "GET",
        &server.edge_url("/edge/v1/snapshots/NOT-AN-ID"),
        Some(&token),
        None,
    )
    .unwrap();
    assert_eq!(
        (status, json(&body)["error"]["code"].as_str()),
        (404, Some("unknown_snapshot"))
    );
}

/// Status reports: shown in `GET /v1/edges` with their lag, refused when malformed, counted in
/// the metrics.
#[test]
fn status_reports_show_in_edges_and_metrics() {
    let site = Site::new();
    let admin = Site::create_key(site.dir.path(), "ops", true);
    let server = site.start(&[]);
    let token = site.edge_token();
    for i in 0..3 {
        create(&server, &site.api_key, &format!("https://example.com/{i}"));
    }
    let post = |body: &str, key: Option<&str>| {
        call("POST", &server.edge_url("/edge/v1/status"), key, Some(body)).unwrap()
    };
    let report = |engine: &str, applied: u64| {
        serde_json::json!({
            "engine": engine, "pop": "ams", "applied_seq": applied, "snapshot_id": null,
            "snapshot_seq": 0, "feed_connected": true, "safe_mode": false, "time_ms": 1,
        })
        .to_string()
    };
    assert_eq!(post(&report("pop1-host3:8080", 1), Some(&token)).0, 204);
    assert_eq!(post(&report("pop1-host3:8080", 1), None).0, 401);
    for (body, code) in [
        (report("bad engine", 1), "invalid_engine"),
        (report(&"e".repeat(65), 1), "invalid_engine"),
        (r#"{"engine":"e"}"#.to_string(), "invalid_report"),
        (
            report("e", 1).replace("\"pop\"", "\"extra\":1,\"pop\""),
            "invalid_report",
        ),
        (
            format!("{{\"pad\":\"{}\"}}", "x".repeat(5000)),
            "body_too_large",
        ),
    ] {
        let (status, resp) = post(&body, Some(&token));
        assert_eq!(
            (status, json(&resp)["error"]["code"].as_str()),
            (400, Some(code)),
            "{body:.80}"
        );
    }

    let (status, _) = call("GET", &server.url("/v1/edges"), Some(&site.api_key), None).unwrap();
    assert_eq!(status, 403);
    let (status, body) = call("GET", &server.url("/v1/edges"), Some(&admin), None).unwrap();
    assert_eq!(status, 200, "{body}");
    let v = json(&body);
    assert_eq!(v["last_seq"], 3);
    let edges = v["edges"].as_array().unwrap();
    assert_eq!(edges.len(), 1, "{v}");
    assert_eq!(edges[0]["engine"], "pop1-host3:8080");
    assert_eq!(edges[0]["pop"], "ams");
    assert_eq!(edges[0]["applied_seq"], 1);
    assert_eq!(edges[0]["lag_seq"], 2);
    assert!(edges[0]["lag_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(edges[0]["feed_connected"], true);

    let (status, text) = call("GET", &server.url("/metrics"), None, None).unwrap();
    assert_eq!(status, 200);
    for line in [
        "lasthop_edge_engines 1",
        "lasthop_edge_worst_lag_sequences 2",
        "lasthop_edge_lag_alarm 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(text.contains("lasthop_edge_worst_lag_seconds "), "{text}");
}

/// Polls `latest` until its sequence is at least `seq` (generous timeout).
fn wait_for_snapshot_at(server: &Server, token: &str, seq: u64) -> SnapshotFrame {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let latest = wait_for_snapshot(server, token);
        if latest.seq >= seq {
            return latest;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot at {seq}: {latest:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The schedule: a snapshot once the overlay passes `--snapshot-max-overlay`, one at start when
/// the newest is behind the change log, and one per `--snapshot-interval-secs` with changes.
#[test]
fn snapshots_follow_the_schedule() {
    let site = Site::new();
    let server = site.start(&[
        "--snapshot-max-overlay",
        "2",
        "--snapshot-interval-secs",
        "3600",
    ]);
    let token = site.edge_token();
    assert_eq!(
        wait_for_snapshot(&server, &token).seq,
        0,
        "published at start"
    );
    let mut feed = FeedClient::connect(&server.edge_base, &token, "after=0&engine=sched&pop=ams");
    assert!(matches!(feed.next(), Frame::Hello { .. }));
    assert!(matches!(feed.next(), Frame::Denylist { .. }));
    assert!(matches!(
        feed.next(),
        Frame::Snapshot(SnapshotFrame { seq: 0, .. })
    ));
    assert!(matches!(feed.next(), Frame::Certificates { .. }));
    for i in 0..3 {
        create(
            &server,
            &site.api_key,
            &format!("https://example.com/s/{i}"),
        );
    }
    let snap = loop {
        match feed.next_event() {
            Frame::LinkCreated(_) => continue,
            Frame::Snapshot(s) => break s,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert!(snap.seq >= 3, "past the overlay limit: {snap:?}");
    create(&server, &site.api_key, "https://example.com/s/last");
    server.terminate();

    let server = site.start(&["--snapshot-interval-secs", "1"]);
    assert_eq!(
        wait_for_snapshot_at(&server, &token, 4).seq,
        4,
        "caught up at start"
    );
    create(&server, &site.api_key, "https://example.com/s/interval");
    assert_eq!(
        wait_for_snapshot_at(&server, &token, 5).seq,
        5,
        "the interval publishes"
    );
}
