//! Read-through to a running control plane: links the snapshot does not have yet are served
//! from the origin, and only the origin says 404 (or 410) for them; over HTTP/1, HTTP/2 and
//! HTTP/3.

use std::time::Duration;

use lasthop_testkit::{wait_until, Conn, Control, Engine, Pki, Site};

/// One GET over HTTP/3 (the engine's aioquic test client): status and `location`.
fn h3_get(engine: &Engine, pki: &Pki, path: &str) -> (u64, Option<String>) {
    let r = lasthop_testkit::h3(engine, pki, path, &[]);
    let location = r["headers"].as_array().and_then(|h| {
        h.iter()
            .find(|h| h[0] == "location")
            .and_then(|h| h[1].as_str().map(String::from))
    });
    (r["status"].as_u64().unwrap(), location)
}

#[test]
fn misses_read_through_to_the_control_plane() {
    let site = Site::new();
    // An empty snapshot: nothing issued yet, every new code is inside the reserve.
    site.write_snapshot(0, 0, &[]);
    let control = Control::start(&site, &[]);
    let key = control.key.clone();
    let code = control.create("https://example.com/fresh");

    // `--snapshot` given and `--safe-mode off`: this test is about the read-through alone (the
    // feed, which also runs, has its own tests).
    let pki = lasthop_testkit::pki(&site, false);
    let mut args = control.engine_args();
    args.extend(["--safe-mode".into(), "off".into()]);
    // HTTPS and HTTP/3 beside the plain listener.
    args.extend(
        [
            "--tls-listen",
            "127.0.0.1:0",
            "--cert",
            pki.cert.to_str().unwrap(),
            "--key",
            pki.key.to_str().unwrap(),
            "--no-ktls",
        ]
        .map(String::from),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let engine = site.start(&args);
    let mut conn = Conn::open(&engine.addr);
    let r = conn.get(&format!("/{code}"));
    assert_eq!(r.status, 302, "served through the origin");
    assert_eq!(r.header("location"), Some("https://example.com/fresh"));
    assert_eq!(
        conn.get("/never-created-alias").status,
        404,
        "the origin says 404"
    );
    // What the read-through holds: the answer cached, its URL among it.
    let held = engine
        .metric("lasthop_engine_origin_cache_bytes")
        .expect("the origin cache's bytes");
    assert!(held >= "https://example.com/fresh".len() as f64, "{held}");
    // Over HTTP/2: two misses on one connection, each stream parked on its own code.
    let (one, two) = (
        control.create("https://example.com/h2-one"),
        control.create("https://example.com/h2-two"),
    );
    let out = std::process::Command::new("curl")
        .args([
            "-sv",
            "--http2-prior-knowledge",
            "--parallel",
            "--parallel-immediate",
        ])
        .args(["-o", "/dev/null", "-o", "/dev/null", "-o", "/dev/null"])
        .arg(format!("http://{}/{one}", engine.addr))
        .arg(format!("http://{}/{two}", engine.addr))
        .arg(format!("http://{}/never-created-h2", engine.addr))
        .output()
        .expect("curl");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("< location: https://example.com/h2-one"),
        "{err}"
    );
    assert!(
        err.contains("< location: https://example.com/h2-two"),
        "{err}"
    );
    assert_eq!(err.matches("< HTTP/2 404").count(), 1, "{err}");

    // Over HTTP/3: a miss parked on its QUIC stream until the origin replies; the origin's 404;
    // a takedown (the denylist, before any cache) turns the answer 410.
    if lasthop_testkit::aioquic("origin::misses_read_through over HTTP/3") {
        let three = control.create("https://example.com/h3-three");
        assert_eq!(
            h3_get(&engine, &pki, &format!("/{three}")),
            (302, Some("https://example.com/h3-three".into()))
        );
        let not_found = "lasthop_engine_origin_replies_total{outcome=\"not_found\"}";
        let before = engine.metric(not_found).unwrap();
        assert_eq!(h3_get(&engine, &pki, "/never-created-h3").0, 404);
        assert_eq!(
            engine.metric(not_found).unwrap(),
            before + 1.0,
            "the origin said it"
        );
        control.takedown(&three, "phishing");
        wait_until(
            Duration::from_secs(3),
            "a takedown answers 410 over h3",
            || h3_get(&engine, &pki, &format!("/{three}")).0 == 410,
        );
    }

    // Deleted at the control plane: 410 within moments (the feed's state change, or the origin
    // once its one-second fresh answer ages out), never a lasting stale redirect.
    let status = ureq::delete(&format!("{}/v1/links/{code}", control.api))
        .set("Authorization", &format!("Bearer {key}"))
        .call()
        .expect("delete")
        .status();
    assert_eq!(status, 204);
    wait_until(Duration::from_secs(3), "deleted link answers 410", || {
        conn.get(&format!("/{code}")).status == 410
    });

    // Origin gone and nothing stale for this code: 503, never a false 404.
    drop(control);
    let unknown = site.scheme().encode_string(5).unwrap();
    assert_eq!(conn.get(&format!("/{unknown}")).status, 503);
    assert_eq!(
        lasthop_testkit::h2_status(&engine.addr, &format!("/{unknown}")),
        503,
        "h2"
    );
    // A code the origin answered before is served stale.
    assert_eq!(conn.get(&format!("/{code}")).status, 410);
}

/// The read-through's client (`Origin`) against the real control plane, no engine in between:
/// found, deleted, never existed, and a missing edge token is a failure, never "not found".
#[test]
fn the_origin_client_reads_a_real_control_plane() {
    use std::sync::Arc;
    use std::time::Instant;

    use lasthop_core::LinkStatus;
    use lasthop_engine::control::ControlPlanes;
    use lasthop_engine::origin::{Origin, OriginAnswer, OriginConfig, OriginInbox};

    fn one(origin: &Origin, inbox: &OriginInbox, code: &[u8]) -> OriginAnswer {
        origin.submit(0, code, 1, true);
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while out.is_empty() {
            assert!(Instant::now() < deadline, "no reply for {code:?}");
            inbox.drain(&mut out);
            std::thread::sleep(Duration::from_millis(1));
        }
        let r = out.pop().expect("one reply");
        assert_eq!((r.token, &*r.code), (1, code));
        r.answer
    }

    let site = Site::new();
    let control = Control::start(&site, &[]);
    let code = control.create("https://example.com/real");
    let gone = control.create("https://example.com/gone");
    control.delete(&gone);
    let controls = || Arc::new(ControlPlanes::new([control.edge.as_str()]).expect("url"));
    let cfg = OriginConfig {
        timeout: Duration::from_secs(2),
        fresh_ttl: Duration::ZERO,
        breaker: Duration::ZERO,
        ..OriginConfig::default()
    };
    let (anonymous, inboxes) = Origin::start(controls(), cfg.clone(), 1).expect("origin");
    assert_eq!(
        one(&anonymous, &inboxes[0], code.as_bytes()),
        OriginAnswer::Unavailable,
        "401 without the edge token"
    );
    let token = std::fs::read_to_string(control.token_file()).expect("edge token");
    let with_token = OriginConfig {
        token: Some(token.trim().to_string()),
        ..cfg
    };
    let (origin, inboxes) = Origin::start(controls(), with_token, 1).expect("origin");
    let inbox = &inboxes[0];
    assert_eq!(
        one(&origin, inbox, code.as_bytes()),
        OriginAnswer::Found {
            url: (*b"https://example.com/real").into(),
            expires_at_ms: None,
            status: LinkStatus::Active,
            warn: false,
            options: Default::default(),
        }
    );
    assert_eq!(
        one(&origin, inbox, gone.as_bytes()),
        OriginAnswer::Found {
            url: Box::new([]),
            expires_at_ms: None,
            status: LinkStatus::Deleted,
            warn: false,
            options: Default::default(),
        }
    );
    assert_eq!(
        one(&origin, inbox, b"never-existed"),
        OriginAnswer::NotFound
    );
    assert_eq!(
        one(&origin, inbox, b"never-existed"),
        OriginAnswer::NotFound
    );
    assert_eq!(origin.stats().fetches(), 3);
    assert_eq!(origin.stats().negative_hits(), 1);
}
