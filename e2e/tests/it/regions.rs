//! Two regions on loopback, each a control plane (its own embedded store) with an engine,
//! replicating each other (`--peer`, `--peer-token-file`): what one region creates or takes
//! down reaches the other's engine through the other's own store and feed.

use std::time::Duration;

use lasthop_testkit::{in_sync, status_of, subscribed_engine, wait_until, Control, Engine, Site};

struct Region {
    site: Site,
    control: Control,
    engine: Engine,
}

/// The peer token file every region of a test shares, written in `site`; its path.
fn peer_token(site: &Site) -> String {
    let token = site.dir.path().join("peer.token");
    lasthop_testkit::write_secret(&token, "0123456789abcdef0123456789abcdef-peers\n");
    token.to_string_lossy().into_owned()
}

/// Regions 0 and 1, each peering with the other, each with an engine in sync.
fn two_regions() -> (Region, Region, String) {
    regions_of_two(false)
}

/// [`two_regions`], with `clicks`: each engine spools its clicks to its region's processor.
fn regions_of_two(clicks: bool) -> (Region, Region, String) {
    if !clicks {
        return regions_with(&[], &|_| Vec::new());
    }
    regions_with(&["--clicks-flush-ms", "200"], &lasthop_testkit::spool_to)
}

/// [`two_regions`] with `extra` flags for both control planes and `engine_extra` for the
/// engine of each.
fn regions_with(
    extra: &[&str],
    engine_extra: &dyn Fn(&Control) -> Vec<String>,
) -> (Region, Region, String) {
    let (site_a, site_b) = (Site::new(), Site::new());
    let token = peer_token(&site_a);
    // A first alone (its edge port is needed by B), then B peering with A, then A again on
    // the same ports peering with B.
    let mut a_first = vec!["--region", "0", "--regions", "2"];
    a_first.extend(extra);
    let mut a = Control::start(&site_a, &a_first);
    let b_flags = mesh_flags(1, &[a.edge.clone(), String::new()], &token, extra);
    let b_args: Vec<&str> = b_flags.iter().map(String::as_str).collect();
    let b = Control::start(&site_b, &b_args);
    let a_flags = mesh_flags(0, &[String::new(), b.edge.clone()], &token, extra);
    let a_args: Vec<&str> = a_flags.iter().map(String::as_str).collect();
    a.restart_with(&a_args);
    let (ea, eb) = (engine_extra(&a), engine_extra(&b));
    let ea: Vec<&str> = ea.iter().map(String::as_str).collect();
    let eb: Vec<&str> = eb.iter().map(String::as_str).collect();
    let engine_a = subscribed_engine(&site_a, &a, &ea);
    let engine_b = subscribed_engine(&site_b, &b, &eb);
    for e in [&engine_a, &engine_b] {
        wait_until(Duration::from_secs(15), "engine in sync", || in_sync(e));
    }
    (
        Region {
            site: site_a,
            control: a,
            engine: engine_a,
        },
        Region {
            site: site_b,
            control: b,
            engine: engine_b,
        },
        token,
    )
}

fn regions_view(c: &Control) -> serde_json::Value {
    let (status, v) = c.call("GET", "/v1/regions", &c.admin_key, None);
    assert_eq!(status, 200, "{v}");
    v
}

#[test]
fn a_link_made_in_one_region_is_served_by_the_other_and_takedowns_cross() {
    let (a, b, _) = two_regions();
    let code = b.control.create("https://example.com/made-in-b");
    let took = wait_until(Duration::from_secs(10), "B's link served at A", || {
        status_of(&a.engine.addr, &format!("/{code}")) == 302
    });
    println!("a link created in region 1 answered 302 at region 0's engine after {took:?}");
    // A takedown in the link's home region reaches the other region's engine.
    b.control.takedown(&code, "phishing");
    let took = wait_until(Duration::from_secs(5), "B's takedown at A", || {
        status_of(&a.engine.addr, &format!("/{code}")) == 410
    });
    println!("a takedown in region 1 answered 410 at region 0's engine after {took:?}");
    // A takedown issued in the other region applies there at once and reaches the home.
    let other = b.control.create("https://example.com/also-made-in-b");
    wait_until(Duration::from_secs(10), "second link at A", || {
        status_of(&a.engine.addr, &format!("/{other}")) == 302
    });
    a.control.takedown(&other, "malware");
    wait_until(Duration::from_secs(2), "A's own takedown at A", || {
        status_of(&a.engine.addr, &format!("/{other}")) == 410
    });
    let took = wait_until(Duration::from_secs(5), "A's takedown at B", || {
        status_of(&b.engine.addr, &format!("/{other}")) == 410
    });
    println!("a takedown in region 0 of a region-1 link answered 410 at region 1's engine after {took:?}");
    // A restore issued in A for B's link is B's to apply: forwarded there, it takes effect
    // at both engines.
    a.control.restore(&other);
    for (e, name) in [(&a.engine, "A"), (&b.engine, "B")] {
        wait_until(
            Duration::from_secs(5),
            &format!("restore at {name}"),
            || status_of(&e.addr, &format!("/{other}")) == 302,
        );
    }
    // And A's own links reach B.
    let mine = a.control.create("https://example.com/made-in-a");
    wait_until(Duration::from_secs(10), "A's link at B", || {
        status_of(&b.engine.addr, &format!("/{mine}")) == 302
    });
    // Both sides see the other connected and caught up.
    for (c, peer) in [(&a.control, 1), (&b.control, 0)] {
        wait_until(Duration::from_secs(5), "caught up", || {
            let v = regions_view(c);
            let p = &v["peers"][0];
            p["region"] == peer && p["connected"] == true && p["lag_changes"] == 0
        });
    }
    let _ = (&a.site, &b.site);
}

#[test]
fn a_region_down_and_back_loses_and_doubles_nothing() {
    let (a, mut b, _) = two_regions();
    let before = b.control.create("https://example.com/before-the-outage");
    wait_until(Duration::from_secs(10), "replicated", || {
        status_of(&a.engine.addr, &format!("/{before}")) == 302
    });
    // A code of B's range that B never issued: B says so through A's read-through (404);
    // while B is down, A cannot know, and says 503, never 404.
    let never = a
        .site
        .scheme()
        .encode_string(lasthop_core::region_range(1, 2).unwrap().start + 9_999)
        .unwrap();
    assert_eq!(status_of(&a.engine.addr, &format!("/{never}")), 404);
    b.control.kill();
    // A keeps creating and serving, B's links it has included.
    let during = a.control.create("https://example.com/during-the-outage");
    assert_eq!(status_of(&a.engine.addr, &format!("/{before}")), 302);
    wait_until(Duration::from_secs(10), "A's own link", || {
        status_of(&a.engine.addr, &format!("/{during}")) == 302
    });
    wait_until(Duration::from_secs(10), "B shown disconnected", || {
        regions_view(&a.control)["peers"][0]["connected"] == false
    });
    let unseen = a
        .site
        .scheme()
        .encode_string(lasthop_core::region_range(1, 2).unwrap().start + 9_998)
        .unwrap();
    assert_eq!(status_of(&a.engine.addr, &format!("/{unseen}")), 503);
    b.control.restart();
    let after: Vec<String> = (0..20)
        .map(|i| b.control.create(&format!("https://example.com/after/{i}")))
        .collect();
    for code in &after {
        wait_until(Duration::from_secs(15), "B's new links at A", || {
            status_of(&a.engine.addr, &format!("/{code}")) == 302
        });
    }
    // Everything B made, once each, in A's change log: B's head equals what A applied.
    wait_until(Duration::from_secs(10), "A caught up with B", || {
        let p = &regions_view(&a.control)["peers"][0];
        p["connected"] == true && p["lag_changes"] == 0 && p["applied_seq"] == p["head_seq"]
    });
    let (status, listed) = a
        .control
        .call("GET", "/v1/links?limit=100", &a.control.key, None);
    assert_eq!(status, 200, "{listed}");
    let codes: Vec<&str> = listed["links"]
        .as_array()
        .expect("links")
        .iter()
        .filter_map(|l| l["code"].as_str())
        .collect();
    for code in after.iter().chain([&before]) {
        assert_eq!(
            codes.iter().filter(|c| **c == code.as_str()).count(),
            1,
            "{code} in {codes:?}"
        );
    }
    // And B got A's link made while it was down.
    wait_until(Duration::from_secs(10), "A's link at B", || {
        status_of(&b.engine.addr, &format!("/{during}")) == 302
    });
}

#[test]
fn an_alias_has_one_home_region() {
    let (mut a, b, _) = two_regions();
    // Claimed in both regions at the same moment: the home (region 0) decides, once.
    for i in 0..20 {
        let alias = format!("race-{i}-sale");
        let body =
            serde_json::json!({"long_url": format!("https://example.com/{i}"), "alias": alias});
        let (sa, sb) = std::thread::scope(|s| {
            let ta = s.spawn(|| {
                a.control
                    .call("POST", "/v1/links", &a.control.key, Some(body.clone()))
            });
            let tb = s.spawn(|| {
                b.control
                    .call("POST", "/v1/links", &b.control.key, Some(body.clone()))
            });
            (ta.join().unwrap(), tb.join().unwrap())
        });
        let mut statuses = [sa.0, sb.0];
        statuses.sort();
        assert_eq!(statuses, [201, 409], "{alias}: {} / {}", sa.1, sb.1);
        let loser = if sa.0 == 409 { &sa.1 } else { &sb.1 };
        assert_eq!(loser["error"]["code"], "alias_taken", "{loser}");
    }
    for e in [&a.engine, &b.engine] {
        wait_until(
            Duration::from_secs(10),
            "the alias served in both regions",
            || status_of(&e.addr, "/race-7-sale") == 302,
        );
    }
    // The alias home down: aliases wait (503), generated codes do not.
    a.control.kill();
    let (status, v) = b.control.call(
        "POST",
        "/v1/links",
        &b.control.key,
        Some(
            serde_json::json!({"long_url": "https://example.com/x", "alias": "while-home-is-down"}),
        ),
    );
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("home_region_unavailable")),
        "{v}"
    );
    b.control
        .create("https://example.com/generated-while-home-is-down");
}

/// `--region r --regions n` and a `--peer` for every other region, at `urls[peer]`.
fn mesh_flags(r: usize, urls: &[String], token: &str, extra: &[&str]) -> Vec<String> {
    let mut f = vec![
        "--region".to_string(),
        r.to_string(),
        "--regions".into(),
        urls.len().to_string(),
        "--peer-token-file".into(),
        token.into(),
    ];
    for (peer, url) in urls.iter().enumerate() {
        if peer != r {
            f.push("--peer".into());
            f.push(format!("{peer}={url}"));
        }
    }
    f.extend(extra.iter().map(|s| s.to_string()));
    f
}

fn peer_of(c: &Control, region: u64) -> serde_json::Value {
    let v = regions_view(c);
    v["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .find(|p| p["region"] == region)
        .cloned()
        .unwrap_or_default()
}

/// Three regions in a full mesh (no relaying) with the link from region 0 to region 2 through
/// a proxy that is cut: region 0's lag alarm names region 2 (and only it), and everything
/// catches up once the link is back.
#[test]
fn three_regions_a_cut_link_is_named_and_catches_up() {
    let sites: Vec<Site> = (0..3).map(|_| Site::new()).collect();
    let token = peer_token(&sites[0]);
    let mut controls: Vec<Control> = sites
        .iter()
        .enumerate()
        .map(|(r, s)| Control::start(s, &["--region", &r.to_string(), "--regions", "3"]))
        .collect();
    let edges: Vec<String> = controls.iter().map(|c| c.edge.clone()).collect();
    let proxy = crate::harness::Proxy::start(&edges[2], Duration::ZERO);
    for (r, c) in controls.iter_mut().enumerate() {
        let mut urls = edges.clone();
        if r == 0 {
            urls[2] = proxy.url();
        }
        let f = mesh_flags(r, &urls, &token, &["--peer-lag-alarm-secs", "1"]);
        let args: Vec<&str> = f.iter().map(String::as_str).collect();
        c.restart_with(&args);
    }
    let engine0 = subscribed_engine(&sites[0], &controls[0], &[]);
    wait_until(Duration::from_secs(15), "engine in sync", || {
        in_sync(&engine0)
    });
    let first = controls[2].create("https://example.com/from-c");
    wait_until(Duration::from_secs(10), "C's link at A", || {
        status_of(&engine0.addr, &format!("/{first}")) == 302
    });
    proxy.cut();
    let during: Vec<String> = (0..5)
        .map(|i| controls[2].create(&format!("https://example.com/from-c/{i}")))
        .collect();
    let from_b = controls[1].create("https://example.com/from-b");
    wait_until(Duration::from_secs(10), "the alarm names region 2", || {
        let (cut, fine) = (peer_of(&controls[0], 2), peer_of(&controls[0], 1));
        cut["alarm"] == true && cut["connected"] == false && fine["alarm"] == false
    });
    let (_, _, metrics) = lasthop_testkit::curl(&[&format!("{}/metrics", controls[0].api)]);
    assert!(
        metrics.contains("lasthop_region_peer_lag_alarm{region=\"2\"} 1")
            && metrics.contains("lasthop_region_peer_lag_alarm{region=\"1\"} 0"),
        "{metrics}"
    );
    // B's links still arrive; C's wait for the link (no relaying through B), and a C code A
    // has not seen answers 503 meanwhile, never 404.
    wait_until(Duration::from_secs(10), "B's link at A", || {
        status_of(&engine0.addr, &format!("/{from_b}")) == 302
    });
    assert_eq!(status_of(&engine0.addr, &format!("/{}", during[0])), 503);
    proxy.mend();
    for code in &during {
        wait_until(
            Duration::from_secs(15),
            "C's links at A after the cut",
            || status_of(&engine0.addr, &format!("/{code}")) == 302,
        );
    }
    wait_until(Duration::from_secs(10), "alarm cleared", || {
        let p = peer_of(&controls[0], 2);
        p["alarm"] == false && p["connected"] == true && p["lag_changes"] == 0
    });
}

/// A WAN between two regions: a proxy holding every byte `rtt / 2` each way. Prints the
/// read-through latency at the far engine (a code of the other region, asked of its home) and
/// how long a takedown in one region takes to answer 410 at the other's engine, against the
/// goals (read-through within one round trip + 5 ms, a takedown within the one-way delay +
/// 10 ms), with a round trip of 0 first: the floor of this host (the takedown's own commit,
/// the other region's commit, its feed to the engine). Measured, not asserted.
#[test]
fn a_wan_between_regions_costs_one_round_trip() {
    for rtt_ms in [0u64, 50, 150] {
        let one_way = Duration::from_millis(rtt_ms / 2);
        let (site_a, site_b) = (Site::new(), Site::new());
        let token = peer_token(&site_a);
        let mut a = Control::start(&site_a, &["--region", "0", "--regions", "2"]);
        let mut b = Control::start(&site_b, &["--region", "1", "--regions", "2"]);
        let (to_b, to_a) = (
            crate::harness::Proxy::start(&b.edge, one_way),
            crate::harness::Proxy::start(&a.edge, one_way),
        );
        let fa = mesh_flags(0, &[String::new(), to_b.url()], &token, &[]);
        let fb = mesh_flags(1, &[to_a.url(), String::new()], &token, &[]);
        a.restart_with(&fa.iter().map(String::as_str).collect::<Vec<_>>());
        b.restart_with(&fb.iter().map(String::as_str).collect::<Vec<_>>());
        let engine_a = subscribed_engine(&site_a, &a, &[]);
        wait_until(Duration::from_secs(15), "engine in sync", || {
            in_sync(&engine_a)
        });
        wait_until(Duration::from_secs(10), "replicating", || {
            peer_of(&a, 1)["connected"] == true
        });
        // Read-through: codes of B's range A does not have (B says 404), each asked once.
        let start = lasthop_core::region_range(1, 2).unwrap().start;
        let mut reads: Vec<f64> = (0..9)
            .map(|i| {
                let code = site_a.scheme().encode_string(start + 50_000 + i).unwrap();
                let t = std::time::Instant::now();
                assert_eq!(status_of(&engine_a.addr, &format!("/{code}")), 404);
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        reads.sort_by(f64::total_cmp);
        // Takedowns in B, timed to 410 at A's engine (the poll parked at B first).
        let mut takedowns: Vec<f64> = (0..5)
            .map(|i| {
                let code = b.create(&format!("https://example.com/wan/{i}"));
                wait_until(Duration::from_secs(10), "replicated", || {
                    status_of(&engine_a.addr, &format!("/{code}")) == 302
                });
                std::thread::sleep(Duration::from_millis(rtt_ms * 2));
                let t = std::time::Instant::now();
                b.takedown(&code, "phishing");
                // Polled every millisecond (wait_until's 10 ms would blur the number).
                while status_of(&engine_a.addr, &format!("/{code}")) != 410 {
                    assert!(t.elapsed() < Duration::from_secs(10), "takedown at A");
                    std::thread::sleep(Duration::from_millis(1));
                }
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        takedowns.sort_by(f64::total_cmp);
        println!(
            "WAN rtt {rtt_ms} ms: read-through at the far engine median {:.1} ms (goal <= {} ms), \
             takedown to 410 at the far engine median {:.1} ms (goal <= {} ms; includes the \
             takedown call itself)",
            reads[reads.len() / 2],
            rtt_ms + 5,
            takedowns[takedowns.len() / 2],
            rtt_ms / 2 + 10
        );
    }
}

/// A peer region out of touch keeps minting: its codes past the mark this region last heard
/// of (plus the reserve) are asked of the origin, 503 while the peer cannot answer, never
/// rejected by arithmetic; the control plane widens that region's window in its feed by the
/// peer's mint rate × the time since it last answered.
#[test]
fn a_region_out_of_touch_widens_its_window() {
    let (site_a, site_b) = (Site::new(), Site::new());
    let token = peer_token(&site_a);
    // A small reserve and small blocks, so a few dozen links pass the known mark + reserve.
    let small = ["--reserve", "5", "--block-size", "10"];
    // (From the first start: the snapshot published then carries the reserve.)
    let mut a = Control::start(
        &site_a,
        &[&["--region", "0", "--regions", "2"][..], &small].concat(),
    );
    let mut b = Control::start(
        &site_b,
        &[&["--region", "1", "--regions", "2"][..], &small].concat(),
    );
    let to_b = crate::harness::Proxy::start(&b.edge, Duration::ZERO);
    let fa = mesh_flags(0, &[String::new(), to_b.url()], &token, &small);
    let fb = mesh_flags(1, &[a.edge.clone(), String::new()], &token, &small);
    a.restart_with(&fa.iter().map(String::as_str).collect::<Vec<_>>());
    b.restart_with(&fb.iter().map(String::as_str).collect::<Vec<_>>());
    let engine_a = subscribed_engine(&site_a, &a, &[]);
    wait_until(Duration::from_secs(15), "engine in sync", || {
        in_sync(&engine_a)
    });
    let first = b.create("https://example.com/before");
    wait_until(
        Duration::from_secs(15),
        "replicated (not read through)",
        || {
            let p = peer_of(&a, 1);
            p["connected"] == true && p["applied_seq"].as_u64() > Some(0)
        },
    );
    assert_eq!(status_of(&engine_a.addr, &format!("/{first}")), 302);
    to_b.cut();
    wait_until(Duration::from_secs(10), "B out of touch", || {
        peer_of(&a, 1)["connected"] == false
    });
    let minted: Vec<String> = (0..40)
        .map(|i| b.create(&format!("https://example.com/cut/{i}")))
        .collect();
    let last = minted.last().unwrap();
    wait_until(
        Duration::from_secs(5),
        "B's new code asked of the origin",
        || status_of(&engine_a.addr, &format!("/{last}")) == 503,
    );
    to_b.mend();
    wait_until(Duration::from_secs(15), "served once B is back", || {
        status_of(&engine_a.addr, &format!("/{last}")) == 302
    });
}

/// A key made in one region works in every region, and its revocation anywhere reaches
/// every region.
#[test]
fn api_keys_and_revocations_cross_regions() {
    let (a, b, _) = two_regions();
    let key = key_of(&b.control, "carol");
    let create_at_a = || {
        a.control.call(
            "POST",
            "/v1/links",
            &key,
            Some(serde_json::json!({"long_url": "https://example.com/carol"})),
        )
    };
    let took = wait_until(Duration::from_secs(10), "B's key accepted at A", || {
        create_at_a().0 == 201
    });
    println!("a key made in region 1 worked in region 0 after {took:?}");
    let (status, listed) = b.control.call(
        "GET",
        "/v1/admin/apikeys?owner=carol",
        &b.control.admin_key,
        None,
    );
    assert_eq!(status, 200, "{listed}");
    let id = listed["keys"][0]["id"]
        .as_str()
        .expect("key id")
        .to_string();
    let (status, v) = b.control.call(
        "DELETE",
        &format!("/v1/admin/apikeys/{id}"),
        &b.control.admin_key,
        None,
    );
    assert_eq!(status, 204, "{v}");
    wait_until(Duration::from_secs(10), "the revocation at A", || {
        create_at_a().0 == 401
    });
}

/// An API key of `owner`, made in `c`'s region.
fn key_of(c: &Control, owner: &str) -> String {
    let out = std::process::Command::new(lasthop_testkit::control_bin())
        .args(["apikey", "create", "--owner", owner, "--data-dir"])
        .arg(&c.data)
        .output()
        .expect("apikey create");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";
const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1";

/// Stats stay where the clicks were counted, and either region's stats API merges every
/// region's (saying which answered); an action's audit record reaches the other region's
/// history with its origin; an owner suspended (with takedown) in one region is suspended in
/// the other, its links there down too, and its unsuspension lifts both.
#[test]
fn stats_history_and_suspensions_cross_regions() {
    let (a, mut b, _) = regions_of_two(true);
    let dave = key_of(&b.control, "dave");
    let create = |c: &Control, url: &str| {
        let body = serde_json::json!({"long_url": url});
        let (status, v) = c.call("POST", "/v1/links", &dave, Some(body));
        (status, v["code"].as_str().unwrap_or_default().to_string())
    };
    let (status, code) = create(&b.control, "https://example.com/dave");
    assert_eq!(status, 201);
    wait_until(Duration::from_secs(10), "dave's link at A", || {
        status_of(&a.engine.addr, &format!("/{code}")) == 302
    });
    // Three clicks counted in A, two in B, by two visitors.
    for (engine, ua, n) in [(&a.engine, FIREFOX, 3), (&b.engine, IPHONE, 2)] {
        for _ in 0..n {
            let url = format!("http://{}/{code}", engine.addr);
            assert_eq!(lasthop_testkit::curl(&["-A", ua, &url]).0, 302);
        }
    }
    let stats = |c: &Control| {
        let (status, v) = c.call(
            "GET",
            &format!("/v1/links/{code}/stats"),
            &c.admin_key,
            None,
        );
        assert_eq!(status, 200, "{v}");
        v
    };
    for c in [&a.control, &b.control] {
        let mut last = serde_json::Value::Null;
        wait_until(
            Duration::from_secs(30),
            "both regions' clicks merged",
            || {
                last = stats(c);
                last["clicks"] == 5
            },
        );
        assert_eq!(last["visitor_days"], 2, "{last}");
        assert_eq!(last["browsers"]["Firefox"], 3, "{last}");
        assert_eq!(last["browsers"]["Safari"], 2, "{last}");
        assert_eq!(
            last["regions"]["answered"],
            serde_json::json!([0, 1]),
            "{last}"
        );
        assert_eq!(last["days"][0]["clicks"], 5, "{last}");
    }
    // A takedown issued in A: B's history of its link shows A's record, tagged with A.
    a.control.takedown(&code, "phishing");
    wait_until(Duration::from_secs(5), "A's record in B's history", || {
        let (_, h) = b.control.call(
            "GET",
            &format!("/v1/links/{code}/history"),
            &b.control.admin_key,
            None,
        );
        h["history"].as_array().is_some_and(|h| {
            h.iter()
                .any(|r| r["action"] == "takedown" && r["origin"]["region"] == 0)
        })
    });
    a.control.restore(&code);
    wait_until(Duration::from_secs(5), "restored at B", || {
        status_of(&b.engine.addr, &format!("/{code}")) == 302
    });
    // Suspended in A with takedown: B suspends dave too and takes down what it has of his,
    // including a link A may not have yet.
    let (status, late) = create(&b.control, "https://example.com/dave-late");
    assert_eq!(status, 201);
    let (status, v) = a.control.call(
        "POST",
        "/v1/admin/owners/dave/suspend",
        &a.control.admin_key,
        Some(serde_json::json!({"reason": "phishing kit", "takedown_links": true})),
    );
    assert_eq!(status, 200, "{v}");
    let took = wait_until(Duration::from_secs(10), "the suspension at B", || {
        [&code, &late]
            .iter()
            .all(|c| status_of(&b.engine.addr, &format!("/{c}")) == 410)
    });
    println!("a suspension in region 0 took dave's links down at region 1 after {took:?}");
    let took = wait_until(Duration::from_secs(5), "dave's key suspended at B", || {
        let (status, v) = b.control.call(
            "POST",
            "/v1/links",
            &dave,
            Some(serde_json::json!({"long_url": "https://example.com/more"})),
        );
        status == 401 && v["error"]["code"] == "key_suspended"
    });
    println!("dave's key answered key_suspended at region 1 after {took:?} more");
    let (status, v) = a.control.call(
        "POST",
        "/v1/admin/owners/dave/unsuspend",
        &a.control.admin_key,
        None,
    );
    assert_eq!(status, 200, "{v}");
    wait_until(
        Duration::from_secs(10),
        "the unsuspension everywhere",
        || {
            [&a.engine, &b.engine].iter().all(|e| {
                [&code, &late]
                    .iter()
                    .all(|c| status_of(&e.addr, &format!("/{c}")) == 302)
            })
        },
    );
    // The owner's state replicates apart from its links' (as the suspension above waits for
    // key_suspended at B): B's API takes dave's key again soon after, not at the same moment.
    wait_until(
        Duration::from_secs(5),
        "dave's key taken again at B",
        || create(&b.control, "https://example.com/again").0 == 201,
    );
    // Deleted in A, B's link is erased in B too: gone at its engine, its URL nowhere.
    let (status, gone) = create(&b.control, "https://example.com/erase-me-everywhere");
    assert_eq!(status, 201);
    wait_until(Duration::from_secs(10), "the link at A", || {
        status_of(&a.engine.addr, &format!("/{gone}")) == 302
    });
    let (status, v) = a
        .control
        .call("DELETE", &format!("/v1/links/{gone}"), &dave, None);
    assert!(status == 204 || status == 200, "{status} {v}");
    wait_until(Duration::from_secs(5), "the erasure at B", || {
        status_of(&b.engine.addr, &format!("/{gone}")) == 410
    });
    let (status, v) = b.control.call(
        "GET",
        &format!("/v1/links/{gone}"),
        &b.control.admin_key,
        None,
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "deleted", "{v}");
    assert!(
        !v.to_string().contains("erase-me-everywhere"),
        "the URL is erased in the home region too: {v}"
    );
    // B down: A's stats say so and keep A's own clicks.
    b.control.kill();
    let v = stats(&a.control);
    assert_eq!(v["clicks"], 3, "{v}");
    assert_eq!(v["regions"]["answered"], serde_json::json!([0]), "{v}");
    assert_eq!(v["regions"]["unavailable"][0]["region"], 1, "{v}");
}

/// Regions over mutual TLS: every edge listener serves TLS and asks for a client certificate
/// (`--edge-client-ca`); each region verifies its peers (`--peer-ca`) and presents its own
/// certificate (`--peer-client-cert`), as its engines do. Links and takedowns cross.
#[test]
fn regions_replicate_over_mutual_tls() {
    use crate::channel::{ca_with, s};
    let pki = tempfile::tempdir().unwrap();
    let servers = pki.path().join("servers");
    ca_with(&servers, "lasthop edge CA", &["edge"]);
    let clients = pki.path().join("clients");
    ca_with(&clients, "lasthop clients CA", &["region", "engine"]);
    let p = |dir: &std::path::Path, f: &str| s(&dir.join(f)).to_string();
    let flags = [
        "--edge-tls-cert".to_string(),
        p(&servers, "edge.pem"),
        "--edge-tls-key".into(),
        p(&servers, "edge.key"),
        "--edge-client-ca".into(),
        p(&clients, "ca.pem"),
        "--peer-ca".into(),
        p(&servers, "ca.pem"),
        "--peer-client-cert".into(),
        p(&clients, "region.pem"),
        "--peer-client-key".into(),
        p(&clients, "region.key"),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let engine_flags = |_: &Control| {
        vec![
            "--control-ca".to_string(),
            p(&servers, "ca.pem"),
            "--control-client-cert".into(),
            p(&clients, "engine.pem"),
            "--control-client-key".into(),
            p(&clients, "engine.key"),
        ]
    };
    let (a, b, _) = regions_with(&flags, &engine_flags);
    assert!(a.control.edge.starts_with("https://"), "{}", a.control.edge);
    let code = b.control.create("https://example.com/over-mtls");
    wait_until(Duration::from_secs(10), "B's link served at A", || {
        status_of(&a.engine.addr, &format!("/{code}")) == 302
    });
    a.control.takedown(&code, "phishing");
    wait_until(Duration::from_secs(5), "A's takedown at B", || {
        status_of(&b.engine.addr, &format!("/{code}")) == 410
    });
    // Both directions replicate over mutual TLS. B's first contact may have met A's first
    // process as the harness restarted it (a reset), and B then retries after its backoff.
    for (c, peer) in [(&a.control, 1), (&b.control, 0)] {
        wait_until(Duration::from_secs(10), "the peer connected", || {
            peer_of(c, peer)["connected"] == true
        });
        let p = peer_of(c, peer);
        assert_eq!(p["last_error"], serde_json::Value::Null, "{p}");
    }
}

/// A change issued in one region for a link of another that it may not have replicated yet
/// (issued the moment the link is made): read through and forwarded to the home, it answers
/// as for a local link and reaches both engines; so does a deletion.
#[test]
fn a_change_issued_before_replication_reaches_the_home() {
    let (a, b, _) = two_regions();
    for i in 0..10 {
        let taken = b.control.create(&format!("https://example.com/early/{i}"));
        let (status, v) = a.control.call(
            "POST",
            &format!("/v1/links/{taken}/takedown"),
            &a.control.admin_key,
            Some(serde_json::json!({"reason": "phishing"})),
        );
        assert_eq!(
            (status, v["status"].as_str()),
            (200, Some("taken_down")),
            "{v}"
        );
        let gone = b
            .control
            .create(&format!("https://example.com/early-gone/{i}"));
        let (status, v) = a.control.call(
            "DELETE",
            &format!("/v1/links/{gone}"),
            &a.control.admin_key,
            None,
        );
        assert_eq!(status, 204, "{v}");
        for e in [&a.engine, &b.engine] {
            wait_until(Duration::from_secs(5), "both at both engines", || {
                status_of(&e.addr, &format!("/{taken}")) == 410
                    && status_of(&e.addr, &format!("/{gone}")) == 410
            });
        }
    }
}

/// Issue 44 across regions: an import through either region claims each code in its home (a
/// 7-character code's counter region, the alias home for a legacy code), every code answers at
/// both regions' engines, also from their own snapshots (the legacy set travels with the
/// replicated link), and a re-run through the other region imports nothing.
#[test]
fn imports_are_claimed_in_each_codes_home_region() {
    let (a, b, _) = two_regions();
    let key = lasthop_core::PermutationKey::load(&a.site.key_file()).unwrap();
    let scheme = lasthop_core::CodeScheme::new(&key).unwrap();
    let half = lasthop_core::CODE_SPACE / 2;
    let rows = [
        ("ab1".to_string(), "https://old.example/legacy"),
        (
            scheme.encode_string(half + 4_321).unwrap(),
            "https://old.example/region-1",
        ),
        (
            scheme.encode_string(987_654_321).unwrap(),
            "https://old.example/region-0",
        ),
    ];
    let file = b.site.dir.path().join("old.csv");
    let csv: String = std::iter::once("code,long_url\n".to_string())
        .chain(rows.iter().map(|(c, u)| format!("{c},{u}\n")))
        .collect();
    std::fs::write(&file, csv).unwrap();
    let import = |c: &Control| {
        let out = std::process::Command::new(lasthop_testkit::control_bin())
            .args(["links", "import", "--from", "csv"])
            .arg(&file)
            .args([
                "--owner",
                "mover",
                "--api",
                &c.api,
                "--api-key",
                &c.admin_key,
            ])
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{text}");
        text
    };
    let text = import(&b.control);
    assert!(
        text.starts_with("3 imported, 0 already there, 0 refused"),
        "{text}"
    );
    for (code, _) in &rows {
        for e in [&a.engine, &b.engine] {
            wait_until(
                Duration::from_secs(10),
                "the import at both regions",
                || status_of(&e.addr, &format!("/{code}")) == 302,
            );
        }
    }
    for r in [&a, &b] {
        r.control.publish_and_swap(&r.engine);
    }
    for (code, _) in &rows {
        for e in [&a.engine, &b.engine] {
            assert_eq!(
                status_of(&e.addr, &format!("/{code}")),
                302,
                "{code} from a snapshot"
            );
        }
    }
    let text = import(&a.control);
    assert!(
        text.starts_with("0 imported, 3 already there, 0 refused"),
        "{text}"
    );
}
