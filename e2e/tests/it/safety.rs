//! Trust and safety reaching the edge: a real control plane, real engines, real clients. A
//! reputation-list reload takes existing links down at a running engine; an owner's
//! suspension reaches two engines and its undoing brings the links back; `--hold-unverified`
//! serves the interstitial until the first verdict, then the 302; the pages' report form posts
//! to the control plane.

use std::time::Duration;

use lasthop_testkit::{
    curl, in_sync, status_of, subscribed_engine as engine, wait_until, Conn, Control, Site,
};

fn write_atomically(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write list");
    std::fs::rename(&tmp, path).expect("rename list");
}

/// The time-bomb defence end to end: a link that passed every check at creation answers 410
/// at a running engine within seconds of a list update naming its host.
#[test]
fn a_list_reload_takes_links_down_at_a_running_engine() {
    let site = Site::new();
    let list = site.dir.path().join("feed.txt");
    write_atomically(&list, "# nothing yet\nother-bad.example\n");
    let control = Control::start(
        &site,
        &[
            "--reputation-list",
            list.to_str().expect("utf-8"),
            "--reputation-poll-secs",
            "1",
            "--scanner",
            "off",
        ],
    );
    let e = engine(&site, &control, &[]);
    wait_until(Duration::from_secs(10), "engine in sync", || in_sync(&e));
    let code = control.create("https://promo.timebomb.example/spring");
    let clean = control.create("https://clean.example/");
    wait_until(Duration::from_secs(5), "302", || {
        status_of(&e.addr, &format!("/{code}")) == 302
    });
    write_atomically(&list, "other-bad.example\ntimebomb.example\n");
    let took = wait_until(Duration::from_secs(10), "410 after the list update", || {
        status_of(&e.addr, &format!("/{code}")) == 410
    });
    eprintln!("list update to 410 at the engine: {took:?}");
    assert_eq!(status_of(&e.addr, &format!("/{clean}")), 302);
    assert_eq!(
        lasthop_testkit::h2_status(&e.addr, &format!("/{code}")),
        410,
        "h2"
    );
    assert_eq!(
        lasthop_testkit::h2_status(&e.addr, &format!("/{clean}")),
        302,
        "h2"
    );
    let (status, l) = control.call("GET", &format!("/v1/links/{code}"), &control.key, None);
    assert_eq!(status, 200);
    assert_eq!(l["takedown_reason"], "list:feed");
}

/// Suspending an owner with `takedown_links` reaches every engine; unsuspending brings back
/// the links the suspension took down, and only those.
#[test]
fn a_suspension_with_takedown_reaches_two_engines() {
    let site = Site::new();
    let control = Control::start(&site, &["--scanner", "off"]);
    let engines = [engine(&site, &control, &[]), engine(&site, &control, &[])];
    for e in &engines {
        wait_until(Duration::from_secs(10), "engine in sync", || in_sync(e));
    }
    let codes: Vec<String> = (0..5)
        .map(|i| control.create(&format!("https://campaign{i}.example/")))
        .collect();
    control.takedown(&codes[0], "malware");
    for e in &engines {
        for c in &codes[1..] {
            wait_until(Duration::from_secs(5), "302", || {
                status_of(&e.addr, &format!("/{c}")) == 302
            });
        }
    }
    let (status, v) = control.call(
        "POST",
        "/v1/admin/owners/t/suspend",
        &control.admin_key,
        Some(serde_json::json!({"reason": "phishing campaign", "takedown_links": true})),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["taken_down"], 4);
    let (status, v) = control.call("GET", "/v1/links", &control.key, None);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("key_suspended"))
    );
    for e in &engines {
        let took = wait_until(Duration::from_secs(5), "410 everywhere", || {
            codes
                .iter()
                .all(|c| status_of(&e.addr, &format!("/{c}")) == 410)
        });
        eprintln!("suspension to 410 at {}: {took:?}", e.addr);
    }
    let (status, v) = control.call(
        "POST",
        "/v1/admin/owners/t/unsuspend",
        &control.admin_key,
        None,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["restored"], 4);
    for e in &engines {
        wait_until(Duration::from_secs(5), "302 again", || {
            codes[1..]
                .iter()
                .all(|c| status_of(&e.addr, &format!("/{c}")) == 302)
        });
        assert_eq!(status_of(&e.addr, &format!("/{}", codes[0])), 410);
    }
}

/// `--hold-unverified`: every edge serves the interstitial until the link's first verdict,
/// then the 302, switched by one feed frame.
#[test]
fn a_held_link_shows_the_interstitial_until_its_first_verdict() {
    let site = Site::new();
    let hook = lasthop_testkit::verdict_service(Duration::from_millis(1500), None);
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
    let e = engine(&site, &control, &[]);
    wait_until(Duration::from_secs(10), "engine in sync", || in_sync(&e));
    let code = control.create("https://new-shop.example/opening");
    let took = wait_until(Duration::from_secs(2), "the interstitial", || {
        status_of(&e.addr, &format!("/{code}")) == 200
    });
    let mut conn = Conn::open(&e.addr);
    let page = conn.get(&format!("/{code}"));
    assert_eq!(page.status, 200);
    assert!(page.header("location").is_none(), "no redirect while held");
    // The interstitial over HTTP/2 too.
    let (status, headers, body) = curl(&[
        "--http2-prior-knowledge",
        &format!("http://{}/{code}", e.addr),
    ]);
    assert_eq!(status, 200, "h2: {headers}");
    assert!(!headers.contains("location:"), "h2: {headers}");
    assert!(body.contains("safety check"), "h2: {body}");
    let body = String::from_utf8_lossy(&page.body);
    assert!(body.contains("https://new-shop.example/opening"), "{body}");
    assert!(body.contains("safety check"), "{body}");
    let (_, l) = control.call("GET", &format!("/v1/links/{code}"), &control.key, None);
    assert_eq!(l["status"], "held");
    // Each core swaps in the new tables at its next turn: poll the kept-alive connection
    // (its core) until it redirects too, then check where to.
    let released = wait_until(Duration::from_secs(10), "the 302 after the verdict", || {
        status_of(&e.addr, &format!("/{code}")) == 302
    });
    let resp = (0..200)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            conn.get(&format!("/{code}"))
        })
        .find(|r| r.status == 302)
        .expect("the kept-alive connection redirects too");
    eprintln!("interstitial after {took:?}, 302 after {released:?} more");
    assert_eq!(
        resp.header("location"),
        Some("https://new-shop.example/opening")
    );
    let (_, l) = control.call("GET", &format!("/v1/links/{code}"), &control.key, None);
    assert_eq!(l["status"], "active");
}

/// With `--report-url`, the preview and interstitial pages carry a report form; posting it
/// (as a browser would) files a report with the control plane.
#[test]
fn the_pages_report_form_posts_to_the_control_plane() {
    let site = Site::new();
    let control = Control::start(&site, &["--scanner", "off"]);
    let e = engine(&site, &control, &["--report-url", &control.api]);
    wait_until(Duration::from_secs(10), "engine in sync", || in_sync(&e));
    let code = control.create("https://suspicious.example/");
    let flagged = control.create("https://flagged.example/");
    let (status, _) = control.call(
        "POST",
        &format!("/v1/links/{flagged}/takedown"),
        &control.admin_key,
        Some(serde_json::json!({"reason": "looks odd", "warn": true})),
    );
    assert_eq!(status, 200);
    wait_until(Duration::from_secs(5), "the interstitial", || {
        status_of(&e.addr, &format!("/{flagged}")) == 200
    });
    let action = format!("action=\"{}/v1/reports\"", control.api);
    for path in [format!("/{code}+"), format!("/{flagged}")] {
        let (status, headers, body) = curl(&[&format!("http://{}{path}", e.addr)]);
        assert_eq!(status, 200, "{path}");
        assert!(body.contains(&action), "{path}: {body}");
        assert!(
            headers
                .to_ascii_lowercase()
                .contains(&format!("form-action {}", control.api)),
            "{headers}"
        );
    }
    // Without the flag, no form (and the CSP allows none).
    let plain = engine(&site, &control, &[]);
    wait_until(Duration::from_secs(10), "engine in sync", || {
        in_sync(&plain)
    });
    let (_, headers, body) = curl(&[&format!("http://{}/{code}+", plain.addr)]);
    assert!(!body.contains("<form"));
    assert!(headers.contains("form-action 'none'"), "{headers}");

    // What the browser sends when the form is submitted.
    let (status, headers, _) = curl(&[
        "--data-urlencode",
        &format!("code={flagged}"),
        "--data-urlencode",
        "reason=phishing",
        "--data-urlencode",
        "details=asked for my password",
        &format!("{}/v1/reports", control.api),
    ]);
    assert_eq!(status, 303, "{headers}");
    assert!(headers.contains("/v1/reports/thanks"), "{headers}");
    let (status, v) = control.call(
        "GET",
        "/v1/admin/reports?status=open",
        &control.admin_key,
        None,
    );
    assert_eq!(status, 200);
    assert_eq!(v["reports"][0]["code"], flagged.as_str());
    assert_eq!(v["reports"][0]["reason"], "phishing");
}
