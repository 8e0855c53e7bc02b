//! A link's own serving options (issue 43) at two engines over real sockets: its redirect
//! status and cache lifetime, the request's query forwarded into its destination, UTM
//! parameters written at creation, a `PATCH` of them reaching both engines within a second, and
//! the same answers once a snapshot is published (snapshot format version 4 carries them).

use std::time::{Duration, Instant};

use lasthop_testkit::{curl, Control, Engine, Site};
use serde_json::json;

fn create(control: &Control, body: serde_json::Value) -> serde_json::Value {
    let (status, v) = control.call("POST", "/v1/links", &control.key, Some(body));
    assert_eq!(status, 201, "{v}");
    v
}

/// Status, `Location` and `Cache-Control` of `GET path` at `engine`.
fn answer(engine: &Engine, path: &str) -> (u16, String, String) {
    let (status, headers, _) = curl(&[&format!("http://{}{path}", engine.addr)]);
    let header = |name: &str| {
        headers
            .lines()
            .find_map(|l| {
                let (n, v) = l.split_once(':')?;
                n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
            })
            .unwrap_or_default()
    };
    (status, header("location"), header("cache-control"))
}

#[test]
fn a_links_status_cache_lifetime_and_query_forwarding_reach_every_engine() {
    let site = Site::new();
    let control = Control::start(&site, &[]);
    // Engine A serves HTTPS and HTTP/3 too: the answers must be alike on every protocol.
    let pki = lasthop_testkit::pki(&site, false);
    let a = lasthop_testkit::subscribed_engine(
        &site,
        &control,
        &[
            "--tls-listen",
            "127.0.0.1:0",
            "--cert",
            pki.cert.to_str().unwrap(),
            "--key",
            pki.key.to_str().unwrap(),
            "--no-ktls",
        ],
    );
    let b = lasthop_testkit::subscribed_engine(&site, &control, &[]);

    // Refused: a status that is no redirect, a year and a second, a precedence of neither.
    for bad in [
        json!({"long_url": "https://example.com/", "redirect_status": 303}),
        json!({"long_url": "https://example.com/", "cache_seconds": 31_536_001}),
        json!({"long_url": "https://example.com/", "query_precedence": "both"}),
    ] {
        let (status, v) = control.call("POST", "/v1/links", &control.key, Some(bad));
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (400, Some("invalid_options")),
            "{v}"
        );
    }
    let permanent = create(
        &control,
        json!({"long_url": "https://example.com/p", "redirect_status": 301, "cache_seconds": 3600}),
    );
    assert_eq!(permanent["redirect_status"], 301);
    let uncached = create(
        &control,
        json!({"long_url": "https://example.com/u", "redirect_status": 308, "cache_seconds": 0}),
    );
    let forwarding = create(
        &control,
        json!({"long_url": "https://example.com/f?a=1#top", "forward_query": true}),
    );
    let utm = create(
        &control,
        json!({"long_url": "https://example.com/c?utm_source=old&x=1",
               "utm": {"source": "newsletter", "campaign": "spring sale"}}),
    );
    assert_eq!(
        utm["long_url"],
        "https://example.com/c?x=1&utm_source=newsletter&utm_campaign=spring+sale"
    );
    let plain = create(&control, json!({"long_url": "https://example.com/plain"}));
    let path = |v: &serde_json::Value| format!("/{}", v["code"].as_str().unwrap());

    let check = |e: &Engine, status: u16, cache: &str| {
        assert_eq!(
            answer(e, &format!("{}?q=1", path(&permanent))),
            (status, "https://example.com/p".into(), cache.to_string())
        );
        assert_eq!(
            answer(e, &path(&uncached)),
            (308, "https://example.com/u".into(), "no-store".into())
        );
        // Tricky queries: an encoded `&` and `#` stay encoded, a name already there keeps the
        // destination's value, an `@host` changes nothing but the query.
        assert_eq!(
            answer(
                e,
                &format!("{}?a=9&q=x%26y%23z&@evil.example", path(&forwarding))
            )
            .1,
            "https://example.com/f?a=1&q=x%26y%23z&@evil.example#top"
        );
        assert_eq!(
            answer(e, &format!("{}?utm_x=1", path(&plain))),
            (
                302,
                "https://example.com/plain".into(),
                "private, max-age=300".into()
            )
        );
    };
    for e in [&a, &b] {
        lasthop_testkit::wait_until(Duration::from_secs(10), "the links at the engine", || {
            answer(e, &path(&plain)).0 == 302
        });
        check(e, 301, "private, max-age=3600");
        // HEAD answers alike.
        let (status, headers, _) = curl(&["-I", &format!("http://{}{}", e.addr, path(&permanent))]);
        assert_eq!(status, 301, "{headers}");
        // The preview shows the destination a visitor would get.
        let (status, _, body) = curl(&[&format!("http://{}{}+", e.addr, path(&forwarding))]);
        assert_eq!(status, 200);
        assert!(body.contains("https://example.com/f?a=1#top"), "{body}");
    }
    // HTTP/2 and HTTP/3 answer as HTTP/1 does: status, Location (the query merged) and
    // Cache-Control.
    let (status, headers, _) = curl(&[
        "--http2-prior-knowledge",
        &format!("http://{}{}?q=1", a.addr, path(&permanent)),
    ]);
    assert_eq!(status, 301, "{headers}");
    assert!(
        headers.contains("cache-control: private, max-age=3600"),
        "{headers}"
    );
    let (status, headers, _) = curl(&[
        "--http2-prior-knowledge",
        &format!("http://{}{}?a=9&b=2", a.addr, path(&forwarding)),
    ]);
    assert_eq!(status, 302, "{headers}");
    assert!(
        headers.contains("location: https://example.com/f?a=1&b=2#top"),
        "{headers}"
    );
    if lasthop_testkit::aioquic("options over HTTP/3") {
        let h3 = |p: &str| {
            let r = lasthop_testkit::h3(&a, &pki, p, &[]);
            let header = |name: &str| {
                r["headers"].as_array().and_then(|h| {
                    h.iter()
                        .find(|h| h[0] == name)
                        .and_then(|h| h[1].as_str().map(String::from))
                })
            };
            (
                r["status"].as_u64().unwrap(),
                header("location"),
                header("cache-control"),
            )
        };
        assert_eq!(
            h3(&path(&uncached)),
            (
                308,
                Some("https://example.com/u".into()),
                Some("no-store".into())
            )
        );
        assert_eq!(
            h3(&format!("{}?a=9&b=2", path(&forwarding))).1.as_deref(),
            Some("https://example.com/f?a=1&b=2#top")
        );
    }

    // A PATCH of the options reaches both engines within a second.
    let (status, v) = control.call(
        "PATCH",
        &format!("/v1/links{}", path(&permanent)),
        &control.key,
        Some(json!({"redirect_status": 302, "cache_seconds": 60})),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        (v["redirect_status"].as_u64(), v["cache_seconds"].as_u64()),
        (Some(302), Some(60))
    );
    let patched = Instant::now();
    for e in [&a, &b] {
        while answer(e, &path(&permanent)).0 != 302 {
            assert!(
                patched.elapsed() < Duration::from_secs(1),
                "the edit at the engine"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(answer(e, &path(&permanent)).2, "private, max-age=60");
    }
    // Its history says what changed.
    let (status, v) = control.call(
        "GET",
        &format!("/v1/links{}/history", path(&permanent)),
        &control.key,
        None,
    );
    assert_eq!(status, 200, "{v}");
    assert!(v.to_string().contains("\"options\""), "{v}");

    // A snapshot published: links with options are served from it (format version 4), alike.
    let (status, v) = control.call("POST", "/v1/admin/snapshots", &control.admin_key, None);
    assert!(
        status == 200 || status == 201 || status == 202,
        "{status} {v}"
    );
    std::thread::sleep(Duration::from_secs(2));
    for e in [&a, &b] {
        check(e, 302, "private, max-age=60");
    }
}
