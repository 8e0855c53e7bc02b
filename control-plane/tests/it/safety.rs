//! Trust and safety in the real binary over real sockets: reputation lists in every spelling
//! and format, reloads that take existing links down, chained shorteners, the scanner and a
//! real verdict webhook (answering, hanging, talking garbage), holds, velocity, suspension,
//! key ids and revocation, reports and the review queue, appeals, history, hosts, aliases.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{call, json, wait_until, Hook, Server, Site, WebhookServer, BIN};

/// The parts of a test: a site, an admin key, helpers to call the API.
struct T {
    site: Site,
    admin: String,
}

impl T {
    fn new() -> T {
        let site = Site::new();
        let admin = Site::create_key(site.dir.path(), "ops", true);
        T { site, admin }
    }

    fn list_path(&self, name: &str) -> std::path::PathBuf {
        self.site.dir.path().join(name)
    }

    /// Writes a list file atomically (temp name, rename), as an updater should.
    fn write_list(&self, name: &str, text: &str) -> String {
        let path = self.list_path(name);
        let tmp = self.list_path(&format!(".{name}.tmp"));
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
        path.to_string_lossy().into_owned()
    }
}

fn post(s: &Server, path: &str, key: Option<&str>, body: &str) -> (u16, Value) {
    let (status, text) = call("POST", &s.url(path), key, Some(body)).expect("POST");
    (
        status,
        if text.is_empty() {
            Value::Null
        } else {
            json(&text)
        },
    )
}

fn get(s: &Server, path: &str, key: &str) -> (u16, Value) {
    let (status, text) = call("GET", &s.url(path), Some(key), None).expect("GET");
    (status, json(&text))
}

fn create(s: &Server, key: &str, url: &str) -> (u16, Value) {
    post(
        s,
        "/v1/links",
        Some(key),
        &serde_json::json!({ "long_url": url }).to_string(),
    )
}

fn created(s: &Server, key: &str, url: &str) -> String {
    let (status, body) = create(s, key, url);
    assert_eq!(status, 201, "{url}: {body}");
    body["code"].as_str().unwrap().to_string()
}

fn link(s: &Server, key: &str, code: &str) -> Value {
    let (status, body) = get(s, &format!("/v1/links/{code}"), key);
    assert_eq!(status, 200, "{body}");
    body
}

fn blocked_reason(s: &Server, key: &str, url: &str) -> String {
    let (status, body) = create(s, key, url);
    assert_eq!(status, 403, "{url} was not refused: {body}");
    assert_eq!(body["error"]["code"], "destination_blocked", "{body}");
    body["error"]["reason"].as_str().unwrap().to_string()
}

/// A host entry covers the host and its subdomains in every spelling; a URL entry exactly its
/// page; a look-alike nothing; a public-suffix entry is refused; nothing is written.
#[test]
fn listed_destinations_are_refused_in_every_spelling() {
    let t = T::new();
    let list = t.write_list(
        "phish.txt",
        "# operator's own list\n\
         evil.example\n\
         b\u{fc}cher.example  # IDN, in Unicode\n\
         192.0.2.1\n\
         https://drive.example.com/file/d/123/view\n\
         co.uk\n\
         not a host at all\n",
    );
    let s = t.site.start(&["--reputation-list", &list]);
    let key = &t.site.api_key;
    for spelling in [
        "https://evil.example/",
        "https://EVIL.Example/login",
        "https://evil.example./",
        "https://www.evil.example/",
        "https://a.b.c.evil.example/x?y=1#z",
        "https://%65vil.example/",
        "https://evil.example:443/",
        "http://evil.example:80/",
        "https://paypal.com@evil.example/",
        "https://user:pass@evil.example/",
        "https://xn--bcher-kva.example/",
        "https://B\u{dc}CHER.example/",
        "http://192.0.2.1/bin.sh",
        "http://3221225985/",
        "http://0xc0000201/",
        "http://0300.0.2.1/",
        "http://[::ffff:192.0.2.1]/",
        "https://drive.example.com/file/d/123/view",
        "https://DRIVE.example.com:443/file/d/123/view#frag",
    ] {
        assert_eq!(
            blocked_reason(&s, key, spelling),
            "list:phish",
            "{spelling}"
        );
    }
    // Look-alikes, other pages of a URL entry's host, and a public suffix's other domains pass.
    for fine in [
        "https://notevil.example/",
        "https://evil-example.com/",
        "https://evil.example.attacker.test/",
        "https://drive.example.com/file/d/456/view",
        "https://anything.co.uk/",
        "http://192.0.2.2/",
    ] {
        let (status, body) = create(&s, key, fine);
        assert_eq!(status, 201, "{fine}: {body}");
    }
    let (_, mine) = get(&s, "/v1/links", key);
    assert_eq!(
        mine["links"].as_array().unwrap().len(),
        6,
        "refusals write nothing"
    );
    assert_eq!(
        s.metric("lasthop_reputation_list_entries{list=\"phish\"}"),
        Some(4.0)
    );
    assert_eq!(
        s.metric("lasthop_reputation_list_malformed_lines{list=\"phish\"}"),
        Some(2.0),
        "the public suffix and the garbage line"
    );
    assert_eq!(
        s.metric("lasthop_creates_blocked_total{reason=\"list:phish\"}"),
        Some(19.0)
    );
    let log = s.log();
    assert!(
        log.contains("line=6") && log.contains("public suffix"),
        "{log}"
    );
}

/// The feeds operators actually use, in their own export formats.
#[test]
fn feed_exports_are_read_in_their_own_formats() {
    let t = T::new();
    let urlhaus = t.write_list(
        "urlhaus.csv",
        "################################################################\n\
         # abuse.ch URLhaus Database Dump (CSV)                         #\n\
         ################################################################\n\
         #\n\
         # id,dateadded,url,url_status,last_online,threat,tags,urlhaus_link,reporter\n\
         \"3012345\",\"2026-11-30 10:11:12\",\"http://198.51.100.7/bin.sh\",\"online\",\"2026-11-30 10:11:12\",\"malware_download\",\"elf,mozi\",\"https://urlhaus.abuse.ch/url/3012345/\",\"someone\"\n\
         \"3012346\",\"2026-11-30 10:11:13\",\"https://files.example.net/a/payload.exe\",\"offline\",\"\",\"malware_download\",\"exe\",\"https://urlhaus.abuse.ch/url/3012346/\",\"other\"\n\
         broken,row\n",
    );
    let phishtank = t.write_list(
        "phishtank.csv",
        "phish_id,url,phish_detail_url,submission_time,verified,verification_time,online,target\n\
         8001,https://login.bank.example/verify,http://www.phishtank.com/phish_detail.php?phish_id=8001,2026-11-30T00:00:00+00:00,yes,2026-11-30T01:00:00+00:00,yes,Other\n\
         8002,\"https://sites.example.org/x,y\",http://www.phishtank.com/phish_detail.php?phish_id=8002,2026-11-30T00:00:00+00:00,yes,2026-11-30T01:00:00+00:00,yes,Other\n",
    );
    let hosts = t.write_list(
        "hosts",
        "# a blocklist in hosts-file form\n127.0.0.1 localhost\n0.0.0.0 malware.example tracker.example # two names\n",
    );
    let openphish = t.write_list(
        "openphish.txt",
        "https://secure-login.example/account\nhttp://pay.example/step2\n",
    );
    let s = t.site.start(&[
        "--reputation-list",
        &format!("{urlhaus},{phishtank}"),
        "--reputation-list",
        &hosts,
        "--reputation-list",
        &openphish,
    ]);
    let key = &t.site.api_key;
    assert_eq!(
        blocked_reason(&s, key, "http://198.51.100.7/bin.sh"),
        "list:urlhaus"
    );
    assert_eq!(
        blocked_reason(&s, key, "https://files.example.net/a/payload.exe"),
        "list:urlhaus"
    );
    assert_eq!(
        blocked_reason(&s, key, "http://login.bank.example/verify"),
        "list:phishtank"
    );
    assert_eq!(
        blocked_reason(&s, key, "https://sites.example.org/x,y"),
        "list:phishtank"
    );
    assert_eq!(
        blocked_reason(&s, key, "https://www.malware.example/"),
        "list:hosts"
    );
    assert_eq!(
        blocked_reason(&s, key, "https://tracker.example/"),
        "list:hosts"
    );
    assert_eq!(
        blocked_reason(&s, key, "https://secure-login.example/account"),
        "list:openphish"
    );
    // URL entries on a shared host block that page only.
    for fine in [
        "https://files.example.net/a/other.pdf",
        "https://login.bank.example/",
        "https://sites.example.org/",
        "https://secure-login.example/",
    ] {
        let (status, body) = create(&s, key, fine);
        assert_eq!(status, 201, "{fine}: {body}");
    }
    for (list, entries) in [
        ("urlhaus", 2.0),
        ("phishtank", 2.0),
        ("hosts", 2.0),
        ("openphish", 2.0),
    ] {
        assert_eq!(
            s.metric(&format!(
                "lasthop_reputation_list_entries{{list=\"{list}\"}}"
            )),
            Some(entries),
            "{list}"
        );
    }
    assert_eq!(
        s.metric("lasthop_reputation_list_malformed_lines{list=\"urlhaus\"}"),
        Some(1.0)
    );
}

/// The time-bomb defence: an entry a reload adds takes the links it matches down within
/// seconds (a pinned one stays up), as the list; a list that vanishes keeps its last version.
#[test]
fn a_list_reload_takes_down_existing_links_and_a_lost_list_keeps_its_last_version() {
    let t = T::new();
    let list = t.write_list("feed.txt", "already-bad.example\n");
    let s = t.site.start(&[
        "--reputation-list",
        &list,
        "--reputation-poll-secs",
        "1",
        "--scanner",
        "off",
    ]);
    let key = &t.site.api_key;
    let a = created(&s, key, "https://timebomb.example/promo");
    let b = created(&s, key, "https://cdn.timebomb.example/x.js");
    let pinned = created(&s, key, "https://timebomb.example/pinned");
    let other = created(&s, key, "https://fine.example/");
    let page = created(&s, key, "https://shared.example/one/bad/page");
    // An admin restore pins a link against automatic verdicts.
    let (status, _) = post(
        &s,
        &format!("/v1/links/{pinned}/restore"),
        Some(&t.admin),
        "",
    );
    assert_eq!(status, 200);
    assert_eq!(link(&s, key, &pinned)["pinned"], true);

    t.write_list(
        "feed.txt",
        "already-bad.example\ntimebomb.example\nhttps://shared.example/one/bad/page\n",
    );
    let took = wait_until(Duration::from_secs(10), "the reload's takedowns", || {
        [&a, &b, &page]
            .iter()
            .all(|c| link(&s, key, c)["status"] == "taken_down")
    });
    eprintln!("reload to takedown: {took:?}");
    for c in [&a, &b, &page] {
        let l = link(&s, key, c);
        assert_eq!(l["takedown_reason"], "list:feed", "{l}");
        let (_, h) = get(&s, &format!("/v1/links/{c}/history"), key);
        let last = h["history"].as_array().unwrap().last().unwrap().clone();
        assert_eq!(last["actor"], "list:feed", "{h}");
        assert_eq!(last["action"], "takedown", "{h}");
    }
    assert_eq!(link(&s, key, &pinned)["status"], "active", "pinned");
    assert_eq!(link(&s, key, &other)["status"], "active");
    assert_eq!(
        blocked_reason(&s, key, "https://timebomb.example/new"),
        "list:feed"
    );

    // The file disappears (a failed download): the last version stays loaded and says so.
    std::fs::remove_file(t.list_path("feed.txt")).unwrap();
    wait_until(Duration::from_secs(10), "the stale flag", || {
        s.metric("lasthop_reputation_list_stale{list=\"feed\"}") == Some(1.0)
    });
    assert_eq!(
        blocked_reason(&s, key, "https://timebomb.example/again"),
        "list:feed"
    );
    assert!(
        s.log().contains("keeping its previous version"),
        "{}",
        s.log()
    );
    // A truncated file (no entries at all) is refused the same way.
    t.write_list("feed.txt", "");
    s.signal("HUP");
    wait_until(Duration::from_secs(10), "a failed reload", || {
        s.metric("lasthop_reputation_list_load_failures_total{list=\"feed\"}") >= Some(2.0)
    });
    assert_eq!(
        blocked_reason(&s, key, "https://timebomb.example/again"),
        "list:feed"
    );
    // A good version clears it; SIGHUP re-reads at once.
    let late = created(&s, key, "https://late.example/");
    t.write_list("feed.txt", "timebomb.example\nlate.example\n");
    s.signal("HUP");
    wait_until(Duration::from_secs(5), "the SIGHUP reload", || {
        link(&s, key, &late)["status"] == "taken_down"
    });
    assert_eq!(
        s.metric("lasthop_reputation_list_stale{list=\"feed\"}"),
        Some(0.0)
    );
}

/// Links made before a list named their host are taken down when the server starts with it:
/// by looking each entry up when the store is the bigger side, by walking the links otherwise.
#[test]
fn lists_present_at_start_take_down_older_links() {
    for (entries, links) in [(1usize, 3usize), (40, 2)] {
        let t = T::new();
        let s = t.site.start(&["--scanner", "off"]);
        let key = &t.site.api_key;
        let doomed = created(&s, key, "https://www.was-fine.example/");
        let others: Vec<_> = (1..links)
            .map(|i| created(&s, key, &format!("https://other{i}.example/")))
            .collect();
        drop(s);
        let mut text = String::from("was-fine.example\n");
        for i in 1..entries {
            text.push_str(&format!("unrelated{i}.example\n"));
        }
        let list = t.write_list("late.txt", &text);
        let s = t
            .site
            .start(&["--scanner", "off", "--reputation-list", &list]);
        wait_until(Duration::from_secs(10), "the takedown at start", || {
            link(&s, key, &doomed)["status"] == "taken_down"
        });
        assert_eq!(link(&s, key, &doomed)["takedown_reason"], "list:late");
        for c in &others {
            assert_eq!(link(&s, key, c)["status"], "active");
        }
    }
}

/// Another shortener's links and our own are refused unless chains are allowed.
#[test]
fn chained_shorteners_are_refused_unless_allowed() {
    let t = T::new();
    let s = t.site.start(&["--short-base", "https://lh.example"]);
    let key = &t.site.api_key;
    for chain in [
        "https://bit.ly/3abcdef",
        "https://www.tinyurl.com/xyz",
        "https://t.co/abc",
        "https://lh.example/abcdefg",
        "https://LH.example./some-alias",
    ] {
        assert_eq!(blocked_reason(&s, key, chain), "shortener_chain", "{chain}");
    }
    created(&s, key, "https://bitly.example.org/not-a-shortener");
    assert_eq!(
        s.metric("lasthop_creates_blocked_total{reason=\"shortener_chain\"}"),
        Some(5.0)
    );
    drop(s);
    let s = t.site.start(&[
        "--short-base",
        "https://lh.example",
        "--allow-shortener-chains",
    ]);
    created(&s, key, "https://bit.ly/3abcdef");
    created(&s, key, "https://lh.example/abcdefg");
}

/// The verdict webhook decides: block → taken down, warn → flagged, clean → untouched; the
/// re-scan asks again on schedule and catches a page that turned bad later.
#[test]
fn scanner_applies_webhook_verdicts_and_rescans_catch_time_bombs() {
    let turned = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook = {
        let turned = std::sync::Arc::clone(&turned);
        WebhookServer::start(move |url| {
            let verdict = if url.contains("/block") {
                r#"{"verdict":"block","reason":"phishing kit"}"#
            } else if url.contains("/warn") {
                r#"{"verdict":"warn","reason":"new domain"}"#
            } else if url.contains("/later") && turned.load(std::sync::atomic::Ordering::Relaxed) {
                r#"{"verdict":"block","reason":"turned malicious"}"#
            } else {
                r#"{"verdict":"clean"}"#
            };
            Hook::Reply(200, verdict.to_string())
        })
    };
    let t = T::new();
    let s = t
        .site
        .start(&["--scan-webhook", &hook.url, "--rescan-interval", "1s"]);
    let key = &t.site.api_key;
    let blocked = created(&s, key, "https://a.example/block");
    let warned = created(&s, key, "https://b.example/warn");
    let clean = created(&s, key, "https://c.example/fine");
    let later = created(&s, key, "https://d.example/later");
    wait_until(Duration::from_secs(10), "first verdicts", || {
        link(&s, key, &blocked)["status"] == "taken_down"
            && link(&s, key, &warned)["flagged"] == true
    });
    assert_eq!(
        link(&s, key, &blocked)["takedown_reason"],
        "webhook:phishing kit"
    );
    assert_eq!(link(&s, key, &clean)["status"], "active");
    assert_eq!(link(&s, key, &later)["status"], "active");
    let (_, h) = get(&s, &format!("/v1/links/{blocked}/history"), key);
    let actions: Vec<_> = h["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["actor"].as_str().unwrap().to_string(),
                r["action"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        actions[1],
        ("scanner".to_string(), "takedown".to_string()),
        "{h}"
    );
    assert!(hook
        .asked()
        .contains(&"https://a.example/block".to_string()));

    // The page behind `later` turns bad; the next re-scan takes it down.
    turned.store(true, std::sync::atomic::Ordering::Relaxed);
    wait_until(Duration::from_secs(15), "the re-scan", || {
        link(&s, key, &later)["status"] == "taken_down"
    });
    assert_eq!(
        link(&s, key, &later)["takedown_reason"],
        "webhook:turned malicious"
    );
    // Under load the webhook may have timed out on `later`'s first scan, whose retry can then
    // be what took it down; the re-scan runs either way.
    wait_until(Duration::from_secs(15), "a re-scan check", || {
        s.metric("lasthop_rescan_checked_total") >= Some(1.0)
    });
    let (_, metrics) = call("GET", &s.url("/metrics"), None, None).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("lasthop_scan_verdicts_total{")
                && l.contains("pass=\"new\"")
                && l.contains("verdict=\"block\"")),
        "{metrics}"
    );
}

/// A verdict service that hangs or answers garbage never blocks a create and never keeps a
/// held link held: the local checks decide, and the failures are counted.
#[test]
fn a_failing_webhook_never_blocks_creation_or_keeps_a_hold() {
    for (name, hook) in [
        ("hanging", WebhookServer::start(|_| Hook::Hang)),
        (
            "garbage",
            WebhookServer::start(|_| Hook::Reply(200, "<html>not json".into())),
        ),
        (
            "5xx",
            WebhookServer::start(|_| Hook::Reply(503, r#"{"error":"down"}"#.into())),
        ),
        (
            "unknown verdict",
            WebhookServer::start(|_| Hook::Reply(200, r#"{"verdict":"maybe"}"#.into())),
        ),
    ] {
        let t = T::new();
        let s = t.site.start(&[
            "--scan-webhook",
            &hook.url,
            "--scan-webhook-timeout-ms",
            "300",
            "--scan-webhook-retries",
            "1",
            "--hold-unverified",
        ]);
        let key = &t.site.api_key;
        let started = Instant::now();
        let code = created(&s, key, "https://fine.example/page");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{name}: the create waited"
        );
        assert_eq!(link(&s, key, &code)["status"], "held", "{name}");
        let took = wait_until(Duration::from_secs(10), "the release", || {
            link(&s, key, &code)["status"] == "active"
        });
        eprintln!("{name}: held for {took:?}");
        assert!(!hook.asked().is_empty(), "{name}: the service was asked");
        let errors: f64 = ["timeout", "connect", "status", "garbage"]
            .iter()
            .filter_map(|k| {
                s.metric(&format!(
                    "lasthop_scan_webhook_errors_total{{kind=\"{k}\"}}"
                ))
            })
            .sum();
        assert!(
            errors >= 2.0,
            "{name}: errors counted, with the retry: {errors}"
        );
        // Local checks still apply without the service.
        let ip = created(&s, key, "https://198.51.100.9/login");
        wait_until(Duration::from_secs(10), "the heuristic", || {
            let l = link(&s, key, &ip);
            l["status"] == "active" && l["flagged"] == true
        });
    }
}

/// `--hold-unverified`: a new link is `held` until its first verdict, then becomes what the
/// verdict says.
#[test]
fn held_links_switch_on_their_first_verdict() {
    let hook = WebhookServer::start(|url| {
        Hook::Reply(
            200,
            if url.contains("bad") {
                r#"{"verdict":"block","reason":"malware"}"#.into()
            } else {
                r#"{"verdict":"clean"}"#.into()
            },
        )
    });
    let t = T::new();
    let s = t
        .site
        .start(&["--scan-webhook", &hook.url, "--hold-unverified"]);
    let key = &t.site.api_key;
    let (status, body) = create(&s, key, "https://good.example/");
    assert_eq!(status, 201);
    let good = body["code"].as_str().unwrap().to_string();
    let bad = created(&s, key, "https://bad.example/");
    wait_until(Duration::from_secs(10), "verdicts", || {
        link(&s, key, &good)["status"] == "active" && link(&s, key, &bad)["status"] == "taken_down"
    });
    let (_, h) = get(&s, &format!("/v1/links/{good}/history"), key);
    let records = h["history"].as_array().unwrap();
    assert_eq!(records[0]["action"], "created");
    assert_eq!(records[0]["reason"], "held: unverified");
    assert_eq!(records[1]["action"], "release");
    assert_eq!(records[1]["actor"], "scanner");
    assert_eq!(records[1]["undid"], "held: unverified");
    assert!(s.metric("lasthop_scan_first_verdict_seconds_count") >= Some(2.0));
}

/// Too many distinct destination domains in an hour: the owner is flagged and its new links
/// are held; an admin sees the figures, unflags it and releases the held links.
#[test]
fn velocity_flags_an_owner_and_holds_its_links() {
    let t = T::new();
    let s = t
        .site
        .start(&["--velocity-domains-per-hour", "3", "--scanner", "off"]);
    let key = &t.site.api_key;
    let mut codes = Vec::new();
    for (i, domain) in [
        "one.example",
        "two.example",
        "sub.two.example",
        "three.co.uk",
    ]
    .iter()
    .enumerate()
    {
        codes.push(created(&s, key, &format!("https://{domain}/{i}")));
    }
    // sub.two.example is the same registrable domain as two.example: 3 so far.
    assert!(codes.iter().all(|c| link(&s, key, c)["status"] == "active"));
    let fourth = created(&s, key, "https://four.example/");
    assert_eq!(link(&s, key, &fourth)["status"], "held");
    assert_eq!(link(&s, key, &fourth)["held"], "velocity");
    // Flagged: even a known domain is held now.
    let fifth = created(&s, key, "https://one.example/again");
    assert_eq!(link(&s, key, &fifth)["status"], "held");
    let bob = Site::create_key(t.site.dir.path(), "bob", false);
    let bobs = created(&s, &bob, "https://five.example/");
    assert_eq!(
        link(&s, &bob, &bobs)["status"],
        "active",
        "owners are apart"
    );

    let (status, owners) = get(&s, "/v1/admin/owners?flagged=true", &t.admin);
    assert_eq!(status, 200);
    let list = owners["owners"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{owners}");
    assert_eq!(list[0]["owner"], "alice");
    assert_eq!(list[0]["flag"]["domains_last_hour"], 4);
    assert_eq!(list[0]["flag"]["limit"], 3);
    assert!(list[0]["domains_last_hour"].as_u64().unwrap() >= 4);
    assert_eq!(s.metric("lasthop_owners_flagged"), Some(1.0));
    let (status, _) = get(&s, "/v1/admin/owners?flagged=true", key);
    assert_eq!(status, 403);

    let (status, body) = post(&s, "/v1/admin/owners/alice/unflag", Some(&t.admin), "{}");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["released"], 2);
    assert_eq!(link(&s, key, &fourth)["status"], "active");
    assert_eq!(link(&s, key, &fifth)["status"], "active");
    let (_, owners) = get(&s, "/v1/admin/owners?flagged=true", &t.admin);
    assert_eq!(owners["owners"].as_array().unwrap().len(), 0);
    let (status, _) = post(&s, "/v1/admin/owners/alice/unflag", Some(&t.admin), "{}");
    assert_eq!(status, 409, "no longer flagged");
}

/// Suspension: the keys stop at once; with takedown_links every link goes down; unsuspending
/// brings back exactly the links the suspension took down.
#[test]
fn suspension_takes_down_and_unsuspension_restores_only_its_own() {
    let t = T::new();
    let list = t.write_list("campaign.txt", "unrelated.example\n");
    let serve = [
        "--scanner",
        "off",
        "--reputation-list",
        list.as_str(),
        "--reputation-poll-secs",
        "1",
    ];
    let s = t.site.start(&serve);
    let key = &t.site.api_key;
    let codes: Vec<_> = (0..7)
        .map(|i| created(&s, key, &format!("https://site{i}.example/")))
        .collect();
    // One taken down before, for its own reason: it stays down after the unsuspension.
    let (status, _) = post(
        &s,
        &format!("/v1/links/{}/takedown", codes[0]),
        Some(&t.admin),
        r#"{"reason":"malware"}"#,
    );
    assert_eq!(status, 200);
    // One flagged: it comes back flagged.
    let (status, _) = post(
        &s,
        &format!("/v1/links/{}/takedown", codes[1]),
        Some(&t.admin),
        r#"{"reason":"odd","warn":true}"#,
    );
    assert_eq!(status, 200);
    let (status, body) = post(
        &s,
        "/v1/admin/owners/alice/suspend",
        Some(&t.admin),
        r#"{"reason":"phishing campaign","takedown_links":true}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["taken_down"], 6);
    let (status, body) = get(&s, "/v1/links", key);
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "key_suspended");
    for c in &codes[1..] {
        let l = link(&s, &t.admin, c);
        assert_eq!(l["status"], "taken_down");
        assert_eq!(l["takedown_reason"], "account suspended: phishing campaign");
    }
    let (_, owners) = get(&s, "/v1/admin/owners?suspended=true", &t.admin);
    assert_eq!(
        owners["owners"][0]["suspension"]["reason"],
        "phishing campaign"
    );
    // Again: the first suspension stands, its takedowns are finished (nothing left to do).
    let (status, body) = post(
        &s,
        "/v1/admin/owners/alice/suspend",
        Some(&t.admin),
        r#"{"reason":"again"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["already_suspended"], true);
    assert_eq!(body["reason"], "phishing campaign");
    assert_eq!(body["taken_down"], 0);

    // The suspension survives a restart.
    drop(s);
    let s = t.site.start(&serve);
    let (status, _) = get(&s, "/v1/links", key);
    assert_eq!(status, 401);
    // Meanwhile a list names one of the links: the unsuspension must not bring it back.
    t.write_list("campaign.txt", "unrelated.example\nsite6.example\n");
    wait_until(Duration::from_secs(10), "the list reload", || {
        s.metric("lasthop_reputation_list_entries{list=\"campaign\"}") == Some(2.0)
    });

    let (status, body) = post(&s, "/v1/admin/owners/alice/unsuspend", Some(&t.admin), "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["restored"], 6);
    let (status, _) = get(&s, "/v1/links", key);
    assert_eq!(status, 200);
    assert_eq!(link(&s, key, &codes[0])["takedown_reason"], "malware");
    for c in &codes[1..6] {
        assert_eq!(link(&s, key, c)["status"], "active");
    }
    assert_eq!(
        link(&s, key, &codes[1])["flagged"],
        true,
        "the flag survives"
    );
    let listed = link(&s, key, &codes[6]);
    assert_eq!(
        (
            listed["status"].as_str(),
            listed["takedown_reason"].as_str()
        ),
        (Some("taken_down"), Some("list:campaign"))
    );
    let (status, _) = post(&s, "/v1/admin/owners/alice/unsuspend", Some(&t.admin), "");
    assert_eq!(status, 409);
}

/// Keys get a public id at creation; `apikey list` and the admin API show them without
/// secrets; revoking (CLI or API) takes effect on the next request, no restart.
#[test]
fn keys_have_ids_and_revocation_is_immediate() {
    let t = T::new();
    let s = t.site.start(&[]);
    let data = t.site.dir.path().join("data");
    let out = Command::new(BIN)
        .args([
            "apikey",
            "create",
            "--json",
            "--owner",
            "carol",
            "--data-dir",
        ])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success());
    let made = json(&String::from_utf8_lossy(&out.stdout));
    let (carol, carol_id) = (
        made["key"].as_str().unwrap().to_string(),
        made["id"].as_str().unwrap().to_string(),
    );
    assert!(
        carol_id.starts_with("lhk_") && carol_id.len() == 20,
        "{made}"
    );
    let (status, _) = get(&s, "/v1/links", &carol);
    assert_eq!(status, 200);

    let out = Command::new(BIN)
        .args(["apikey", "list", "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.contains(&carol_id) && listing.contains("carol"),
        "{listing}"
    );
    assert!(
        !listing.contains(&carol) && !listing.contains("lh_"),
        "no secrets: {listing}"
    );

    let out = Command::new(BIN)
        .args(["apikey", "revoke", &carol_id, "--data-dir"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let (status, body) = get(&s, "/v1/links", &carol);
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "key_revoked");

    // The admin API: list one owner's keys, revoke alice's.
    let (status, keys) = get(&s, "/v1/admin/apikeys?owner=alice", &t.admin);
    assert_eq!(status, 200);
    let keys = keys["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 1);
    for field in ["id", "owner", "admin", "created_at", "revoked"] {
        assert!(keys[0].get(field).is_some(), "{field}");
    }
    assert_eq!(keys[0]["revoked"], false);
    let alice_id = keys[0]["id"].as_str().unwrap().to_string();
    let (status, _) = get(&s, "/v1/admin/apikeys", &t.site.api_key);
    assert_eq!(status, 403);
    let (status, _) = call(
        "DELETE",
        &s.url(&format!("/v1/admin/apikeys/{alice_id}")),
        Some(&t.admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 204);
    let (status, body) = get(&s, "/v1/links", &t.site.api_key);
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (401, Some("key_revoked"))
    );
    let (status, _) = call(
        "DELETE",
        &s.url("/v1/admin/apikeys/lhk_0000000000000000"),
        Some(&t.admin),
        None,
    )
    .unwrap();
    assert_eq!(status, 404);
    let (_, all) = get(&s, "/v1/admin/apikeys", &t.admin);
    let all = all["keys"].as_array().unwrap();
    assert!(all
        .iter()
        .any(|k| k["id"] == carol_id && k["revoked"] == true));
    assert!(!all.iter().any(|k| k.to_string().contains("lh_")));
}

/// Anyone may report a link (JSON or a form post, rate-limited per network); admins work the
/// queue; resolving acts on the link through the feed.
#[test]
fn reports_and_the_review_queue() {
    let t = T::new();
    let s = t
        .site
        .start(&["--report-burst", "4", "--report-rate", "0.01"]);
    let key = &t.site.api_key;
    let code = created(&s, key, "https://reported.example/");
    let other = created(&s, key, "https://also-reported.example/");
    let (status, body) = post(
        &s,
        "/v1/reports",
        None,
        &serde_json::json!({"code": code, "reason": "phishing", "details": "asks for my bank password"})
            .to_string(),
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["status"], "open");
    let first = body["id"].as_u64().unwrap();
    // The edge pages' form: a urlencoded post, answered with a 303 to a thank-you page.
    let out = Command::new("curl")
        .args([
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
        ])
        .args(["--data-urlencode", &format!("code={other}")])
        .args(["--data-urlencode", "reason=malware"])
        .args(["--data-urlencode", "details=downloads an .exe"])
        .arg(s.url("/v1/reports"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.starts_with("303 ") && text.ends_with("/v1/reports/thanks"),
        "{text}"
    );
    let out = Command::new("curl")
        .args(["-sS", "-i"])
        .arg(s.url("/v1/reports/thanks"))
        .output()
        .unwrap();
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains("200") && page.contains("Thank you"), "{page}");
    assert!(page
        .to_ascii_lowercase()
        .contains("content-security-policy: default-src 'none'"));
    let (status, body) = post(
        &s,
        "/v1/reports",
        None,
        r#"{"code":"nosuchcod","reason":"spam"}"#,
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let (status, _) = post(&s, "/v1/reports", None, r#"{"code":"x"}"#);
    assert_eq!(status, 400);
    // The fifth report from this network in a row is over the burst.
    let (status, body) = post(
        &s,
        "/v1/reports",
        None,
        &format!(r#"{{"code":"{code}","reason":"spam"}}"#),
    );
    assert_eq!(status, 429, "{body}");

    let (status, queue) = get(&s, "/v1/admin/reports?status=open", &t.admin);
    assert_eq!(status, 200);
    let open = queue["reports"].as_array().unwrap();
    assert_eq!(open.len(), 2, "{queue}");
    assert_eq!(open[0]["code"], code.as_str());
    assert_eq!(open[0]["details"], "asks for my bank password");
    assert!(
        !queue.to_string().contains("reported.example"),
        "reports never name the URL"
    );
    let (status, _) = get(&s, "/v1/admin/reports", key);
    assert_eq!(status, 403);

    let (status, body) = post(
        &s,
        &format!("/v1/admin/reports/{first}/resolve"),
        Some(&t.admin),
        r#"{"action":"takedown"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["report"]["status"], "resolved");
    assert_eq!(body["link"]["status"], "taken_down");
    assert_eq!(
        link(&s, key, &code)["takedown_reason"],
        "report 1: phishing"
    );
    let (status, _) = post(
        &s,
        &format!("/v1/admin/reports/{first}/resolve"),
        Some(&t.admin),
        r#"{"action":"dismiss"}"#,
    );
    assert_eq!(status, 409);
    let second = open[1]["id"].as_u64().unwrap();
    let (status, _) = post(
        &s,
        &format!("/v1/admin/reports/{second}/resolve"),
        Some(&t.admin),
        r#"{"action":"ignore"}"#,
    );
    assert_eq!(status, 400);
    let (status, body) = post(
        &s,
        &format!("/v1/admin/reports/{second}/resolve"),
        Some(&t.admin),
        r#"{"action":"dismiss"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(link(&s, key, &other)["status"], "active");
    let (_, queue) = get(&s, "/v1/admin/reports?status=open", &t.admin);
    assert_eq!(queue["reports"].as_array().unwrap().len(), 0);
    let (_, resolved) = get(&s, "/v1/admin/reports?status=resolved&limit=1", &t.admin);
    assert_eq!(resolved["reports"].as_array().unwrap().len(), 1);
    assert!(resolved["next_cursor"].is_string());
}

/// Every state change leaves an audit record: who, what, why; a restore keeps what it undid.
#[test]
fn history_shows_who_did_what_and_what_a_restore_undid() {
    let t = T::new();
    let s = t.site.start(&["--scanner", "off"]);
    let key = &t.site.api_key;
    let (_, keys) = get(&s, "/v1/admin/apikeys", &t.admin);
    let id_of = |owner: &str| {
        keys["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["owner"] == owner)
            .unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (alice, ops) = (id_of("alice"), id_of("ops"));
    let code = created(&s, key, "https://history.example/secret-path");
    post(
        &s,
        &format!("/v1/links/{code}/takedown"),
        Some(&t.admin),
        r#"{"reason":"phishing"}"#,
    );
    post(&s, &format!("/v1/links/{code}/restore"), Some(&t.admin), "");
    post(&s, &format!("/v1/links/{code}/unpin"), Some(&t.admin), "");
    post(
        &s,
        &format!("/v1/links/{code}/takedown"),
        Some(&t.admin),
        r#"{"reason":"odd","warn":true}"#,
    );
    call(
        "PATCH",
        &s.url(&format!("/v1/links/{code}")),
        Some(key),
        Some(r#"{"disabled":true}"#),
    )
    .unwrap();
    call(
        "DELETE",
        &s.url(&format!("/v1/links/{code}")),
        Some(key),
        None,
    )
    .unwrap();
    let (status, h) = get(&s, &format!("/v1/links/{code}/history"), key);
    assert_eq!(status, 200);
    let got: Vec<(String, String, Value, Value)> = h["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["at"].as_str().unwrap().ends_with('Z'));
            (
                r["actor"].as_str().unwrap().to_string(),
                r["action"].as_str().unwrap().to_string(),
                r["reason"].clone(),
                r["undid"].clone(),
            )
        })
        .collect();
    let s_ = |v: &str| Value::String(v.to_string());
    assert_eq!(
        got,
        vec![
            ("alice".into(), "created".into(), Value::Null, Value::Null),
            (ops.clone(), "takedown".into(), s_("phishing"), Value::Null),
            (
                ops.clone(),
                "restore".into(),
                Value::Null,
                s_("takedown: phishing")
            ),
            (ops.clone(), "unpin".into(), Value::Null, Value::Null),
            (ops.clone(), "warn".into(), s_("odd"), Value::Null),
            (alice.clone(), "disable".into(), Value::Null, Value::Null),
            (alice, "delete".into(), Value::Null, Value::Null),
        ]
    );
    assert!(
        !h.to_string().contains("history.example"),
        "history never names the URL"
    );
    let bob = Site::create_key(t.site.dir.path(), "bob", false);
    let (status, _) = get(&s, &format!("/v1/links/{code}/history"), &bob);
    assert_eq!(status, 403);
    let (status, _) = get(&s, "/v1/links/nosuchco/history", key);
    assert_eq!(status, 404);
}

/// Owners appeal a takedown into the review queue; an admin restores it from there.
#[test]
fn appeals_land_in_the_review_queue() {
    let t = T::new();
    let s = t.site.start(&["--scanner", "off"]);
    let key = &t.site.api_key;
    let code = created(&s, key, "https://appeal.example/");
    let (status, body) = post(
        &s,
        &format!("/v1/links/{code}/appeal"),
        Some(key),
        r#"{"message":"it is fine"}"#,
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (409, Some("not_restricted"))
    );
    post(
        &s,
        &format!("/v1/links/{code}/takedown"),
        Some(&t.admin),
        r#"{"reason":"spam"}"#,
    );
    let bob = Site::create_key(t.site.dir.path(), "bob", false);
    let (status, _) = post(
        &s,
        &format!("/v1/links/{code}/appeal"),
        Some(&bob),
        r#"{"message":"mine"}"#,
    );
    assert_eq!(status, 403);
    let (status, body) = post(
        &s,
        &format!("/v1/links/{code}/appeal"),
        Some(key),
        r#"{"message":"This is our product page, not spam."}"#,
    );
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["kind"], "appeal");
    let id = body["id"].as_u64().unwrap();
    let (_, queue) = get(&s, "/v1/admin/reports?status=open", &t.admin);
    assert_eq!(queue["reports"][0]["kind"], "appeal");
    assert_eq!(queue["reports"][0]["by"], "alice");
    let (status, body) = post(
        &s,
        &format!("/v1/admin/reports/{id}/resolve"),
        Some(&t.admin),
        r#"{"action":"restore"}"#,
    );
    assert_eq!(status, 200, "{body}");
    let l = link(&s, key, &code);
    assert_eq!(
        (l["status"].as_str(), l["pinned"].as_bool()),
        (Some("active"), Some(true))
    );
}

/// Operators find and take down every link on a host (subdomains included) from the
/// destination index.
#[test]
fn links_by_host_and_host_takedowns() {
    let t = T::new();
    let s = t.site.start(&["--scanner", "off"]);
    let key = &t.site.api_key;
    let on_host = [
        created(&s, key, "https://bad-host.example/a"),
        created(&s, key, "https://www.bad-host.example/b"),
        created(&s, key, "https://x.y.bad-host.example/c"),
    ];
    let elsewhere = created(&s, key, "https://bad-host-not.example/");
    let deleted = created(&s, key, "https://bad-host.example/deleted");
    call(
        "DELETE",
        &s.url(&format!("/v1/links/{deleted}")),
        Some(key),
        None,
    )
    .unwrap();
    let mut seen = Vec::new();
    let mut cursor = String::new();
    loop {
        let (status, page) = get(
            &s,
            &format!("/v1/admin/links?host=BAD-HOST.example.&limit=2&cursor={cursor}"),
            &t.admin,
        );
        assert_eq!(status, 200, "{page}");
        for l in page["links"].as_array().unwrap() {
            seen.push(l["code"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => cursor = c.to_string(),
            None => break,
        }
    }
    seen.sort();
    let mut want = on_host.to_vec();
    want.sort();
    assert_eq!(seen, want, "a deleted link leaves the index with its URL");
    let (status, body) = post(
        &s,
        "/v1/admin/hosts/bad-host.example/takedown",
        Some(&t.admin),
        r#"{"reason":"phishing host"}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (body["links"].as_u64(), body["taken_down"].as_u64()),
        (Some(3), Some(3))
    );
    for c in &on_host {
        assert_eq!(link(&s, key, c)["takedown_reason"], "phishing host");
    }
    assert_eq!(link(&s, key, &elsewhere)["status"], "active");
    let (status, body) = post(
        &s,
        "/v1/admin/hosts/co.uk/takedown",
        Some(&t.admin),
        r#"{"reason":"x"}"#,
    );
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (400, Some("host_is_public_suffix"))
    );
    let (status, _) = post(
        &s,
        "/v1/admin/hosts/bad-host.example/takedown",
        Some(key),
        r#"{"reason":"x"}"#,
    );
    assert_eq!(status, 403);
}

/// Brand impersonation in aliases is refused with the reason.
#[test]
fn aliases_name_why_they_are_reserved() {
    let t = T::new();
    let s = t.site.start(&[]);
    let key = &t.site.api_key;
    for (alias, reason) in [
        ("paypa1-login", "brand:paypal"),
        ("pay-pal-secure", "brand:paypal"),
        ("admin-panel", "route:admin"),
    ] {
        let (status, body) = post(
            &s,
            "/v1/links",
            Some(key),
            &serde_json::json!({"long_url": "https://example.com/", "alias": alias}).to_string(),
        );
        assert_eq!(status, 400, "{alias}: {body}");
        assert_eq!(body["error"]["code"], "alias_reserved");
        assert_eq!(body["error"]["reason"], reason, "{alias}");
    }
    let (status, _) = post(
        &s,
        "/v1/links",
        Some(key),
        r#"{"long_url":"https://example.com/","alias":"purchase-order"}"#,
    );
    assert_eq!(status, 201);
}
