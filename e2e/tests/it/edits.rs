//! Destination edits and tags (issue 43) at two engines over real sockets: an edit reaches both
//! within a second and the old destination is never served after it, not even by the origin
//! read-through that had it cached (fresh or stale-if-error); an edit to a listed host is
//! refused and the old destination kept; the host index follows the edit (a list naming the new
//! host takes the link down); `--hold-unverified` keeps the old destination until the new one's
//! first verdict, and a blocked one is refused; `--no-edits`; tags in the list and in summed stats.

use std::time::{Duration, Instant};

use lasthop_testkit::{
    curl, in_sync, location_of, spool_to, subscribed_engine, wait_until, Control, Engine, Site,
};
use serde_json::json;

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";

/// Status and `Location` of `GET /code` at `engine`.
fn get(engine: &Engine, code: &str) -> (u16, String) {
    location_of(&[&format!("http://{}/{code}", engine.addr)])
}

fn patch(control: &Control, code: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    control.call(
        "PATCH",
        &format!("/v1/links/{code}"),
        &control.key,
        Some(body),
    )
}

fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write list");
    std::fs::rename(&tmp, path).expect("rename list");
}

#[test]
fn an_edit_reaches_every_engine_and_the_old_destination_is_never_served_again() {
    let site = Site::new();
    let list = site.dir.path().join("list.txt");
    write_atomically(&list, "listed.example\n");
    // Hot-set snapshots of nothing: once one is published, engine B reads every link through
    // the origin and caches it.
    let mut control = Control::start(
        &site,
        &[
            "--snapshot-recent-days",
            "0",
            "--snapshot-max-links",
            "1000",
            "--reputation-list",
            list.to_str().unwrap(),
        ],
    );
    let code = control.create("https://old.example/page");
    let kept = control.create("https://kept.example/page");
    let a = subscribed_engine(&site, &control, &[]);
    let b = subscribed_engine(&site, &control, &[]);
    for e in [&a, &b] {
        wait_until(Duration::from_secs(15), "in sync", || in_sync(e));
    }
    control.publish_and_swap(&b);
    let origin_fetches = || {
        b.metric("lasthop_engine_answers_total{layer=\"origin\"}")
            .unwrap_or(0.0)
    };
    let before = origin_fetches();
    for _ in 0..3 {
        assert_eq!(get(&b, &code), (302, "https://old.example/page".into()));
    }
    assert!(
        origin_fetches() > before,
        "B reads the link through the origin"
    );

    // Refused: a listed host (403 with its reason), a URL that is none; the old one is kept.
    let (status, v) = patch(
        &control,
        &kept,
        json!({"long_url": "https://listed.example/x"}),
    );
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (403, Some("destination_blocked")),
        "{v}"
    );
    let (status, v) = patch(&control, &kept, json!({"long_url": "javascript:alert(1)"}));
    assert_eq!(status, 400, "{v}");
    for e in [&a, &b] {
        assert_eq!(get(e, &kept), (302, "https://kept.example/page".into()));
    }

    // The edit: both engines serve the new destination within a second, and only it after.
    let (status, v) = patch(
        &control,
        &code,
        json!({"long_url": "https://new.example/page"}),
    );
    let edited = Instant::now();
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["long_url"], "https://new.example/page");
    for e in [&a, &b] {
        loop {
            let (status, location) = get(e, &code);
            assert_eq!(status, 302);
            if location == "https://new.example/page" {
                break;
            }
            assert_eq!(location, "https://old.example/page");
            assert!(
                edited.elapsed() < Duration::from_secs(1),
                "the edit at {} within a second",
                e.addr
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    eprintln!("edit at both engines after {:?}", edited.elapsed());
    let new = (302, "https://new.example/page".to_string());
    for _ in 0..20 {
        for e in [&a, &b] {
            assert_eq!(get(e, &code), new);
        }
    }
    // A new snapshot (of nothing) drops the feed's entry at B: the read-through answers again,
    // and what it had cached before the edit is gone.
    control.publish_and_swap(&b);
    for _ in 0..10 {
        assert_eq!(get(&b, &code), new);
    }

    // History: the edit, with the destinations' hashes and never the URLs.
    let (status, v) = control.call(
        "GET",
        &format!("/v1/links/{code}/history"),
        &control.key,
        None,
    );
    assert_eq!(status, 200, "{v}");
    let history = v.to_string();
    assert!(history.contains("\"edit\""), "{history}");
    assert!(
        !history.contains("new.example") && !history.contains("old.example"),
        "{history}"
    );

    // The control plane gone: B's stale-if-error may serve what it fetched after the edit (or
    // 503), never the old destination.
    control.kill();
    for _ in 0..5 {
        let (status, location) = get(&b, &code);
        assert!(
            (status, location.as_str()) == (302, "https://new.example/page") || status == 503,
            "{status} {location}"
        );
    }
    control.restart();

    // The destination index follows the edit: a list naming the new host takes the link down.
    write_atomically(&list, "listed.example\nnew.example\n");
    wait_until(
        Duration::from_secs(30),
        "410 once the new host is listed",
        || get(&a, &code).0 == 410,
    );
    assert_eq!(get(&a, &kept).0, 302);
}

#[test]
fn hold_unverified_keeps_the_old_destination_until_the_new_ones_verdict() {
    let site = Site::new();
    let hook =
        lasthop_testkit::verdict_service(Duration::from_millis(1500), Some("blocked.example"));
    let control = Control::start(
        &site,
        &[
            "--hold-unverified",
            "--scan-webhook",
            &hook,
            "--scan-webhook-timeout-ms",
            "5000",
        ],
    );
    let e = subscribed_engine(&site, &control, &[]);
    wait_until(Duration::from_secs(10), "in sync", || in_sync(&e));
    let code = control.create("https://first.example/");
    wait_until(Duration::from_secs(10), "the first verdict", || {
        get(&e, &code) == (302, "https://first.example/".into())
    });

    // An edit waits for its verdict with the old destination served (not the interstitial).
    let (status, v) = patch(
        &control,
        &code,
        json!({"long_url": "https://second.example/"}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["long_url"], "https://first.example/");
    assert_eq!(v["pending_long_url"], "https://second.example/");
    let waited = Instant::now();
    let mut old_served = 0;
    loop {
        let (status, location) = get(&e, &code);
        assert_eq!(status, 302);
        if location == "https://second.example/" {
            break;
        }
        assert_eq!(location, "https://first.example/");
        old_served += 1;
        assert!(waited.elapsed() < Duration::from_secs(10), "the verdict");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        old_served > 5,
        "the old destination was served while the scan ran"
    );
    let (_, v) = control.call("GET", &format!("/v1/links/{code}"), &control.key, None);
    assert!(v["pending_long_url"].is_null(), "{v}");

    // A destination the scan blocks: refused, the current one kept, the history says so.
    let (status, _) = patch(
        &control,
        &code,
        json!({"long_url": "https://blocked.example/"}),
    );
    assert_eq!(status, 200);
    wait_until(
        Duration::from_secs(10),
        "the refusal in the history",
        || {
            let (_, v) = control.call(
                "GET",
                &format!("/v1/links/{code}/history"),
                &control.key,
                None,
            );
            v.to_string().contains("edit_refused")
        },
    );
    for _ in 0..10 {
        assert_eq!(get(&e, &code), (302, "https://second.example/".into()));
    }
    let (_, v) = control.call("GET", &format!("/v1/links/{code}"), &control.key, None);
    assert_eq!(
        (v["status"].as_str(), v["pending_long_url"].is_null()),
        (Some("active"), true),
        "{v}"
    );
}

#[test]
fn no_edits_refuses_edits_and_tags_sum_their_links_stats() {
    let site = Site::new();
    let control = Control::start(&site, &["--no-edits", "--clicks-flush-ms", "200"]);
    let spool = spool_to(&control);
    let spool: Vec<&str> = spool.iter().map(String::as_str).collect();
    let e = subscribed_engine(&site, &control, &spool);
    wait_until(Duration::from_secs(10), "in sync", || in_sync(&e));

    let made = |url: &str, tags: serde_json::Value| {
        let (status, v) = control.call(
            "POST",
            "/v1/links",
            &control.key,
            Some(json!({"long_url": url, "tags": tags})),
        );
        assert_eq!(status, 201, "{v}");
        v["code"].as_str().unwrap().to_string()
    };
    let spring = made("https://shop.example/spring", json!(["spring", "email"]));
    let summer = made("https://shop.example/summer", json!(["summer", "email"]));
    let plain = made("https://shop.example/plain", json!([]));
    for bad in [
        json!(["Spring"]),
        json!([""]),
        json!(["a".repeat(33)]),
        json!((0..11).map(|i| format!("t{i}")).collect::<Vec<_>>()),
    ] {
        let (status, v) = control.call(
            "POST",
            "/v1/links",
            &control.key,
            Some(json!({"long_url": "https://shop.example/", "tags": bad})),
        );
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("invalid_tags")),
            "{v}"
        );
    }

    // --no-edits: a destination edit is refused; the other settings (tags) are not.
    let (status, v) = patch(
        &control,
        &plain,
        json!({"long_url": "https://shop.example/other"}),
    );
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("edits_disabled")),
        "{v}"
    );
    let (status, v) = patch(&control, &plain, json!({"tags": ["email", "email"]}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["tags"], json!(["email"]));
    assert_eq!(get(&e, &plain), (302, "https://shop.example/plain".into()));

    let (status, v) = control.call("GET", "/v1/links?tag=email", &control.key, None);
    assert_eq!(status, 200, "{v}");
    let mut listed: Vec<&str> = v["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["code"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    let mut want = vec![spring.as_str(), summer.as_str(), plain.as_str()];
    want.sort_unstable();
    assert_eq!(listed, want);
    let (_, v) = control.call("GET", "/v1/links?tag=spring&limit=1", &control.key, None);
    assert_eq!(v["links"][0]["code"], spring.as_str(), "{v}");
    let (_, v) = control.call("GET", "/v1/tags", &control.key, None);
    assert_eq!(
        v["tags"],
        json!([{"tag": "email", "links": 3}, {"tag": "spring", "links": 1}, {"tag": "summer", "links": 1}])
    );

    // Clicks: 2 on spring, 3 on summer, 1 on plain; the tag's stats sum its links'.
    for (code, n) in [(&spring, 2), (&summer, 3), (&plain, 1)] {
        for _ in 0..n {
            let (status, _, _) = curl(&["-A", FIREFOX, &format!("http://{}/{code}", e.addr)]);
            assert_eq!(status, 302);
        }
    }
    wait_until(Duration::from_secs(30), "the clicks in the rollups", || {
        control.stats(&plain)["clicks"] == 1 && control.stats(&summer)["clicks"] == 3
    });
    let stats = |tag: &str| {
        control
            .call("GET", &format!("/v1/tags/{tag}/stats"), &control.key, None)
            .1
    };
    let email = stats("email");
    assert_eq!(
        (email["clicks"].as_u64(), email["links"].as_u64()),
        (Some(6), Some(3)),
        "{email}"
    );
    assert_eq!(stats("summer")["clicks"], 3);
    assert_eq!(stats("nothing")["clicks"], 0);
}
