//! The edge feed end to end: a real control plane and several real engines on loopback, each
//! engine started with no snapshot of its own (it downloads the control plane's), subscribed
//! with the edge token. Also an engine given several control planes (`--control` repeated or a
//! list), one of them unreachable: with today's embedded store two live control planes cannot
//! share one, so failover is tested against a dead URL and a killed, restarted control plane.

use std::time::Duration;

use lasthop_testkit::{
    engine_bin, in_sync, status_of, subscribed_engine as engine, wait_until, Conn, Control, Engine,
    Load, Site,
};

/// Nothing listens on port 1 (privileged, unassigned): connections are refused at once.
const DEAD_CONTROL: &str = "http://127.0.0.1:1";

/// An engine with these `--control` values (each may be a comma-separated list), the edge token
/// of `control`, and `extra`.
fn engine_with_controls(
    site: &Site,
    control: &Control,
    controls: &[&str],
    extra: &[&str],
) -> Engine {
    let token = control.token_file().to_string_lossy().into_owned();
    let mut args: Vec<&str> = controls.iter().flat_map(|c| ["--control", *c]).collect();
    args.extend(["--edge-token-file", &token]);
    args.extend(extra);
    Engine::launch(std::process::Command::new(engine_bin()), site, &args)
}

fn failovers(e: &Engine) -> f64 {
    e.metric("lasthop_engine_control_failovers_total")
        .unwrap_or(-1.0)
}

fn wait_status(engines: &[Engine], path: &str, want: u16, what: &str) -> Duration {
    let mut worst = Duration::ZERO;
    for e in engines {
        let took = wait_until(Duration::from_secs(5), what, || {
            status_of(&e.addr, path) == want
        });
        worst = worst.max(took);
    }
    worst
}

#[test]
fn links_and_takedowns_reach_every_engine() {
    let site = Site::new();
    let control = Control::start(&site, &[]);
    let before = control.create("https://example.com/before-start");
    let engines: Vec<Engine> = (0..3).map(|_| engine(&site, &control, &[])).collect();
    for e in &engines {
        wait_until(Duration::from_secs(10), "engine in sync", || in_sync(e));
    }
    wait_status(
        &engines,
        &format!("/{before}"),
        302,
        "a link older than the engines",
    );

    // A new link redirects everywhere; a takedown turns it into 410 everywhere, within a
    // second of the API's answer; a restore brings the redirect back.
    let code = control.create("https://example.com/fresh");
    let took = wait_status(&engines, &format!("/{code}"), 302, "new link");
    assert!(took < Duration::from_secs(1), "creation took {took:?}");
    control.takedown(&code, "phishing");
    let took = wait_status(&engines, &format!("/{code}"), 410, "takedown");
    assert!(took < Duration::from_secs(1), "takedown took {took:?}");
    control.restore(&code);
    wait_status(&engines, &format!("/{code}"), 302, "restore");
    let mut conn = Conn::open(&engines[0].addr);
    assert_eq!(
        conn.get(&format!("/{code}")).header("location"),
        Some("https://example.com/fresh")
    );

    // A link older than the engines' snapshot, taken down and restored, and one deleted.
    control.takedown(&before, "malware");
    wait_status(
        &engines,
        &format!("/{before}"),
        410,
        "takedown of a snapshot link",
    );
    control.restore(&before);
    wait_status(
        &engines,
        &format!("/{before}"),
        302,
        "restore of a snapshot link",
    );
    control.delete(&code);
    wait_status(&engines, &format!("/{code}"), 410, "delete");

    // Every engine reported in, with no lag once caught up; the first-redirect metric counted.
    wait_until(Duration::from_secs(5), "three engines in /v1/edges", || {
        let v = control.edges();
        let edges = v["edges"].as_array().cloned().unwrap_or_default();
        edges.len() == 3 && edges.iter().all(|e| e["lag_seq"] == 0)
    });
    assert!(
        engines[0]
            .metric("lasthop_engine_first_redirect_seconds_count")
            .unwrap_or(0.0)
            >= 1.0
    );
}

#[test]
fn a_restarted_engine_catches_up_from_its_own_snapshot() {
    let site = Site::new();
    let mut control = Control::start(&site, &[]);
    let kept = control.create("https://example.com/kept");
    let data = site.dir.path().join("engine-restart");
    let data_arg = data.to_string_lossy().into_owned();
    let first = engine(&site, &control, &["--data-dir", &data_arg]);
    wait_until(Duration::from_secs(10), "in sync", || in_sync(&first));
    // A snapshot holding `kept` reaches its disk. (One more change first, so this snapshot is
    // newer than whatever the control plane published at start, which may already hold `kept`
    // when its start-up build ran late.)
    control.create("https://example.com/bump");
    control.snapshot_now();
    wait_until(Duration::from_secs(10), "snapshot downloaded", || {
        first
            .metric("lasthop_engine_snapshot_downloads_total")
            .unwrap_or(0.0)
            >= 1.0
    });
    drop(first); // SIGKILL

    // While it is down: a new link, a takedown, and a snapshot it has not seen.
    let fresh = control.create("https://example.com/while-down");
    control.takedown(&kept, "spam");
    control.snapshot_now();

    // It comes back while the control plane is down too: it serves from the snapshot it kept
    // (redirects do not depend on the control plane), unconfirmed and counted.
    control.kill();
    let second = engine(&site, &control, &["--data-dir", &data_arg]);
    assert!(
        second
            .log()
            .contains("starting from the newest local snapshot"),
        "{}",
        second.log()
    );
    assert_eq!(status_of(&second.addr, &format!("/{kept}")), 302);
    assert_eq!(second.metric("lasthop_engine_safe_mode"), Some(1.0));
    control.restart();
    wait_until(Duration::from_secs(10), "in sync again", || {
        in_sync(&second)
    });
    let e = [second];
    wait_status(&e, &format!("/{fresh}"), 302, "link created while down");
    wait_status(&e, &format!("/{kept}"), 410, "takedown issued while down");
    wait_until(
        Duration::from_secs(10),
        "the newer snapshot downloaded",
        || {
            e[0].metric("lasthop_engine_snapshot_downloads_total")
                .unwrap_or(0.0)
                >= 1.0
        },
    );
}

#[test]
fn a_lost_feed_means_safe_mode_and_takedowns_meanwhile_apply_before_it_ends() {
    let site = Site::new();
    let mut control = Control::start(&site, &[]);
    let live = control.create("https://example.com/live");
    let doomed = control.create("https://example.com/doomed");
    let engines: Vec<Engine> = (0..2)
        .map(|_| engine(&site, &control, &["--feed-timeout-ms", "1000"]))
        .collect();
    for e in &engines {
        wait_until(Duration::from_secs(10), "in sync", || in_sync(e));
    }

    control.kill();
    for e in &engines {
        wait_until(Duration::from_secs(5), "feed loss noticed", || {
            e.metric("lasthop_engine_safe_mode") == Some(1.0)
        });
        let (status, _, body) =
            lasthop_testkit::curl(&["-m", "2", &format!("http://{}/readyz", e.admin)]);
        assert_eq!(status, 200, "still serving");
        assert!(body.contains("degraded"), "{body}");
        // Redirect availability comes first: served unconfirmed, and counted.
        assert_eq!(status_of(&e.addr, &format!("/{live}")), 302);
        assert!(
            e.metric("lasthop_engine_safe_mode_unconfirmed_total")
                .unwrap_or(0.0)
                >= 1.0
        );
    }

    // The control plane comes back with its edge listener elsewhere (the engines still cannot
    // reach it) and a takedown is issued; then the edge listener returns to its address.
    let edge = control.edge.clone();
    control.edge = "127.0.0.1:0".into();
    control.restart();
    control.takedown(&doomed, "phishing");
    control.edge = edge;
    control.restart();
    for e in &engines {
        // Safe mode ends only once the engine has replayed everything up to the control
        // plane's sequence at reconnection, so the takedown is in force by then.
        wait_until(Duration::from_secs(10), "back in sync", || in_sync(e));
        assert_eq!(
            status_of(&e.addr, &format!("/{doomed}")),
            410,
            "{}",
            e.log()
        );
        assert_eq!(e.metric("lasthop_engine_safe_mode"), Some(0.0));
        assert_eq!(status_of(&e.addr, &format!("/{doomed}")), 410);
        assert_eq!(status_of(&e.addr, &format!("/{live}")), 302);
    }
}

#[test]
fn a_snapshot_swap_under_load_loses_no_request() {
    let site = Site::new();
    let control = Control::start(&site, &[]);
    let codes: Vec<String> = (0..20)
        .map(|i| control.create(&format!("https://example.com/{i}")))
        .collect();
    let e = engine(&site, &control, &[]);
    wait_until(Duration::from_secs(10), "in sync", || in_sync(&e));

    let load = Load::start(&e.addr, &codes, 4, |_, r| {
        assert_eq!(r.status, 302, "request failed during a swap");
    });
    // wrk too, on its own connections, for the whole time the swaps take.
    let wrk = std::process::Command::new("wrk")
        .args([
            "-t1",
            "-c8",
            "-d4s",
            &format!("http://{}/{}", e.addr, codes[0]),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("wrk (scripts/test installs it)");
    let swaps = |e: &Engine| {
        e.metric("lasthop_engine_snapshot_downloads_total")
            .unwrap_or(0.0)
    };
    let before = swaps(&e);
    for round in 1..=2 {
        control.create(&format!("https://example.com/round-{round}"));
        control.snapshot_now();
        wait_until(Duration::from_secs(10), "snapshot swapped in", || {
            swaps(&e) >= before + f64::from(round)
        });
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(load.finish() > 100, "too little load to mean anything");
    let out = wrk.wait_with_output().expect("wrk runs");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    // wrk counts 3xx as success; any error or other status shows in these lines.
    assert!(!report.contains("Non-2xx or 3xx"), "{report}");
    assert!(!report.contains("Socket errors"), "{report}");
    assert!(report.contains("requests in"), "{report}");
    // The overlay shrank to what the last snapshot does not cover.
    assert_eq!(
        e.metric("lasthop_engine_overlay_links"),
        Some(0.0),
        "{}",
        e.log()
    );
}

#[test]
fn the_feed_refuses_engines_without_the_token() {
    let site = Site::new();
    let control = Control::start(&site, &[]);
    let wrong = site.dir.path().join("wrong.token");
    lasthop_testkit::write_secret(&wrong, "0".repeat(64));
    let wrong_arg = wrong.to_string_lossy().into_owned();
    let e = Engine::launch(
        std::process::Command::new(engine_bin()),
        &site,
        &["--control", &control.edge, "--edge-token-file", &wrong_arg],
    );
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(e.metric("lasthop_engine_feed_connected"), Some(0.0));
    assert_eq!(e.metric("lasthop_engine_snapshot_missing"), Some(1.0));
    assert!(e.log().contains("401"), "{}", e.log());
}

#[test]
fn an_unreachable_first_control_plane_is_skipped() {
    let site = Site::new();
    let control = Control::start(&site, &[]);
    let before = control.create("https://example.com/before-the-failover");
    let list = format!("{DEAD_CONTROL},{}", control.edge);
    let e = engine_with_controls(&site, &control, &[&list], &[]);
    wait_until(
        Duration::from_secs(10),
        "in sync through the second control plane",
        || in_sync(&e),
    );
    assert_eq!(e.metric("lasthop_engine_control_planes"), Some(2.0));
    assert_eq!(e.metric("lasthop_engine_control_current"), Some(1.0));
    let moved = failovers(&e);
    assert!(moved >= 1.0, "{}", e.log());
    assert!(e.log().contains("failing over"), "{}", e.log());
    assert_eq!(status_of(&e.addr, &format!("/{before}")), 302);

    // It stays on the one that works: new links and takedowns reach it as with one.
    let code = control.create("https://example.com/after-the-failover");
    let engines = [e];
    wait_status(&engines, &format!("/{code}"), 302, "new link");
    control.takedown(&code, "phishing");
    let took = wait_status(&engines, &format!("/{code}"), 410, "takedown");
    assert!(took < Duration::from_secs(1), "takedown took {took:?}");
    let e = &engines[0];
    assert_eq!(e.metric("lasthop_engine_control_current"), Some(1.0));
    assert_eq!(failovers(e), moved, "no rotation while it works");
}

#[test]
fn with_a_list_a_killed_control_plane_means_safe_mode_until_it_is_back() {
    let site = Site::new();
    let mut control = Control::start(&site, &[]);
    let live = control.create("https://example.com/live");
    let edge = control.edge.clone();
    let e = engine_with_controls(
        &site,
        &control,
        &[&edge, DEAD_CONTROL],
        &["--feed-timeout-ms", "1000"],
    );
    wait_until(Duration::from_secs(10), "in sync", || in_sync(&e));
    assert_eq!(e.metric("lasthop_engine_control_current"), Some(0.0));
    assert_eq!(failovers(&e), 0.0, "the first answered");

    // Both control planes down: safe mode as with one, redirects served unconfirmed.
    control.kill();
    wait_until(Duration::from_secs(5), "feed loss noticed", || {
        e.metric("lasthop_engine_safe_mode") == Some(1.0)
    });
    let (status, _, body) =
        lasthop_testkit::curl(&["-m", "2", &format!("http://{}/readyz", e.admin)]);
    assert_eq!(status, 200, "still serving");
    assert!(body.contains("degraded"), "{body}");
    assert_eq!(status_of(&e.addr, &format!("/{live}")), 302);
    assert!(
        e.metric("lasthop_engine_safe_mode_unconfirmed_total")
            .unwrap_or(0.0)
            >= 1.0
    );
    // It goes round the list (backing off between rounds).
    wait_until(Duration::from_secs(10), "round the list", || {
        failovers(&e) >= 2.0
    });

    // Back on the same ports: the engine returns to it, resumes, and leaves safe mode.
    control.restart();
    wait_until(Duration::from_secs(15), "back in sync", || in_sync(&e));
    assert_eq!(e.metric("lasthop_engine_safe_mode"), Some(0.0));
    wait_until(Duration::from_secs(5), "the first in use again", || {
        e.metric("lasthop_engine_control_current") == Some(0.0)
    });
    let code = control.create("https://example.com/after-the-restart");
    let engines = [e];
    wait_status(
        &engines,
        &format!("/{code}"),
        302,
        "link created after the restart",
    );
    control.takedown(&code, "spam");
    wait_status(
        &engines,
        &format!("/{code}"),
        410,
        "takedown after the restart",
    );
    assert_eq!(status_of(&engines[0].addr, &format!("/{live}")), 302);
}

/// Honest partitions: with the feed and the origin both lost, the engine widens every region's
/// window by the announced mint rate × the time unconfirmed, so a code minted meanwhile is
/// answered 503 (ask again), never 404; a scanner's code far above is still 404 by arithmetic,
/// and `lasthop_engine_unconfirmed_seconds` says for how long. Back in sync, the window is
/// the truthful one again.
#[test]
fn a_lost_feed_widens_the_marks_by_the_mint_rate() {
    let site = Site::new();
    // Small numbers so the widening shows within seconds: a 100-counter reserve, 100-counter
    // blocks, at most 1,000 codes a second.
    let mut control = Control::start(
        &site,
        &[
            "--reserve",
            "100",
            "--block-size",
            "100",
            "--max-mint-rate",
            "1000",
        ],
    );
    let code = control.create("https://example.com/before");
    let e = engine(&site, &control, &[]);
    wait_until(Duration::from_secs(15), "in sync", || in_sync(&e));
    assert_eq!(status_of(&e.addr, &format!("/{code}")), 302);
    assert_eq!(e.metric("lasthop_engine_unconfirmed_seconds"), Some(0.0));
    let scheme = site.scheme();
    // Counter 1,500: far above the mark (at most 200 after one block) and its reserve.
    let minted_meanwhile = scheme.encode_string(1_500).unwrap();
    let scanner = scheme.encode_string(1_000_000_000).unwrap();
    assert_eq!(
        status_of(&e.addr, &format!("/{minted_meanwhile}")),
        404,
        "in sync: never issued"
    );

    control.kill();
    // 1,000 codes/s: after 1.5 s or so counter 1,500 may have been minted.
    wait_until(Duration::from_secs(10), "the window widens", || {
        status_of(&e.addr, &format!("/{minted_meanwhile}")) == 503
    });
    assert_eq!(
        status_of(&e.addr, &format!("/{scanner}")),
        404,
        "still arithmetic"
    );
    assert_eq!(
        status_of(&e.addr, &format!("/{code}")),
        302,
        "redirects outrank freshness"
    );
    let unconfirmed = e.metric("lasthop_engine_unconfirmed_seconds").unwrap();
    assert!(unconfirmed >= 1.0, "{unconfirmed}");

    control.restart();
    wait_until(Duration::from_secs(15), "back in sync", || in_sync(&e));
    wait_until(Duration::from_secs(5), "the truthful window again", || {
        status_of(&e.addr, &format!("/{minted_meanwhile}")) == 404
    });
    assert_eq!(e.metric("lasthop_engine_unconfirmed_seconds"), Some(0.0));
}

/// The fleet the control plane expects survives its restart (embedded store: `fleet.json`),
/// and only an admin's `DELETE /v1/edges/{engine}` takes an engine off it.
#[test]
fn the_fleet_list_survives_a_control_plane_restart() {
    let site = Site::new();
    let mut control = Control::start(&site, &[]);
    let e = engine(
        &site,
        &control,
        &["--engine-id", "pop1-host7", "--pop", "ams"],
    );
    let listed = |c: &Control| -> Vec<(String, String)> {
        c.edges()["edges"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| {
                (
                    x["engine"].as_str().unwrap().to_string(),
                    x["state"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    wait_until(Duration::from_secs(15), "the engine reports", || {
        listed(&control) == [("pop1-host7".to_string(), "connected".to_string())]
    });
    drop(e);
    control.restart();
    let after = listed(&control);
    assert_eq!(after.len(), 1, "{after:?}");
    assert_eq!(after[0].0, "pop1-host7");
    let (status, v) = control.call(
        "DELETE",
        "/v1/edges/pop1-host7",
        &control.admin_key.clone(),
        None,
    );
    assert_eq!(status, 204, "{v}");
    control.restart();
    assert!(listed(&control).is_empty(), "removed for good");
}

/// "Is the takedown we issued enforced?": `GET /v1/links/{code}/enforcement` lists the engines
/// whose reported sequence reached the link's last change and those whose has not, a stopped
/// engine among the latter.
#[test]
fn enforcement_names_the_engines_that_have_not_applied_a_takedown() {
    let site = Site::new();
    let control = Control::start(&site, &[]);
    let code = control.create("https://example.com/phish");
    let a = engine(&site, &control, &["--engine-id", "ams-1", "--pop", "ams"]);
    let b = engine(&site, &control, &["--engine-id", "fra-1", "--pop", "fra"]);
    wait_until(Duration::from_secs(15), "both in sync", || {
        in_sync(&a) && in_sync(&b)
    });
    let enforcement = || {
        let (status, v) = control.call(
            "GET",
            &format!("/v1/links/{code}/enforcement"),
            &control.admin_key,
            None,
        );
        assert_eq!(status, 200, "{v}");
        v
    };
    let names = |v: &serde_json::Value, key: &str| -> Vec<String> {
        v[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["engine"].as_str().unwrap().to_string())
            .collect()
    };
    wait_until(Duration::from_secs(5), "both report the creation", || {
        let v = enforcement();
        v["change"] == "created" && names(&v, "applied").len() == 2
    });

    drop(b);
    control.takedown(&code, "phishing");
    wait_until(Duration::from_secs(5), "ams-1 applied the takedown", || {
        let v = enforcement();
        v["change"] == "state_changed" && names(&v, "applied") == ["ams-1"]
    });
    let v = enforcement();
    assert_eq!(v["status"], "taken_down");
    assert_eq!(names(&v, "pending"), ["fra-1"], "{v}");
    assert_eq!(v["enforced"], false);
    assert!(v["change_seq"].as_u64().unwrap() <= v["last_seq"].as_u64().unwrap());
    assert_eq!(status_of(&a.addr, &format!("/{code}")), 410);

    // Decommissioned: off the fleet, and the takedown counts as enforced everywhere it runs.
    let (status, _) = control.call("DELETE", "/v1/edges/fra-1", &control.admin_key, None);
    assert_eq!(status, 204);
    assert_eq!(enforcement()["enforced"], true);
    let (status, v) = control.call(
        "GET",
        &format!("/v1/links/{code}/enforcement"),
        &control.key,
        None,
    );
    assert_eq!(status, 403, "admins only: {v}");
}
