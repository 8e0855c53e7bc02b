//! Automatic certificates against a real ACME server (Debian's `pebble`, with
//! `pebble-challtestsrv` answering its DNS): a branded domain goes `pending` → `active` with a
//! certificate pebble issued after validating the engines' HTTP-01 answer (a domain whose
//! challenges cannot be answered ends `failed` with the CA's reason), TLS-ALPN-01 where HTTP-01
//! cannot be answered, a renewal at two engines under a client loop with no failed handshake,
//! and two control planes on one PostgreSQL store placing one order per domain.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use lasthop_testkit::{free_port, wait_until, Control, Engine, Pebble, Pki, Site};
use serde_json::json;

/// `serve`'s flags for `pebble`, looking the domains over every second.
fn acme_flags(pebble: &Pebble) -> Vec<String> {
    [
        "--acme-directory",
        &pebble.directory,
        "--acme-ca-file",
        pebble.ca_file().to_str().unwrap(),
        "--acme-contact",
        "mailto:ops@lh.test",
        "--acme-interval-secs",
        "1",
        "--acme-publish-wait-secs",
        "10",
        "--acme-order-timeout-secs",
        "30",
    ]
    .map(String::from)
    .to_vec()
}

/// An engine subscribed to `control`, serving TLS, its listeners on `ports` (plain, TLS) when
/// given.
fn engine(
    site: &Site,
    pki: &Pki,
    control: &Control,
    ports: (Option<u16>, Option<u16>),
    extra: &[&str],
) -> Engine {
    let listen = ports
        .0
        .map_or("127.0.0.1:0".to_string(), |p| format!("127.0.0.1:{p}"));
    let tls = ports
        .1
        .map_or("127.0.0.1:0".to_string(), |p| format!("127.0.0.1:{p}"));
    let mut args: Vec<String> = [
        "--listen",
        &listen,
        "--tls-listen",
        &tls,
        "--cert",
        pki.cert.to_str().unwrap(),
        "--key",
        pki.key.to_str().unwrap(),
        "--no-ktls",
        "--no-quic",
    ]
    .map(String::from)
    .to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    lasthop_testkit::subscribed_engine(site, control, &args)
}

fn add_domain(control: &Control, domain: &str) {
    let (status, v) = control.call(
        "POST",
        "/v1/domains",
        &control.key,
        Some(json!({"domain": domain})),
    );
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["status"], "pending", "{v}");
}

fn domain(control: &Control, name: &str) -> serde_json::Value {
    let (status, v) = control.call("GET", &format!("/v1/domains/{name}"), &control.key, None);
    assert_eq!(status, 200, "{v}");
    v
}

/// Waits until `name`'s status is `want`; every status seen on the way, in order.
fn wait_status(control: &Control, name: &str, want: &str, within: Duration) -> Vec<String> {
    let started = Instant::now();
    let mut seen: Vec<String> = Vec::new();
    loop {
        let v = domain(control, name);
        let status = v["status"].as_str().unwrap_or_default().to_string();
        if seen.last() != Some(&status) {
            seen.push(status.clone());
        }
        if status == want {
            return seen;
        }
        assert!(
            started.elapsed() < within,
            "{name} never became {want}: {v}\n{}",
            control.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The leaf certificate an engine's TLS port serves for `name` (PEM), as `openssl s_client`
/// sees it.
fn served_leaf(engine: &Engine, name: &str) -> String {
    let tls = engine.tls.as_deref().expect("TLS");
    let out = Command::new("openssl")
        .args(["s_client", "-connect", tls, "-servername", name])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("openssl s_client");
    let text = String::from_utf8_lossy(&out.stdout);
    let begin = text.find("-----BEGIN CERTIFICATE-----").unwrap_or(0);
    let end = text
        .find("-----END CERTIFICATE-----")
        .map_or(0, |e| e + "-----END CERTIFICATE-----".len());
    text.get(begin..end).unwrap_or_default().to_string()
}

/// An HTTPS GET of `path` on `name` at `engine`, trusting `root` only: status and `Location`
/// (status 0: the handshake or its verification failed).
fn get(engine: &Engine, name: &str, root: &Path, path: &str) -> (u16, String) {
    let tls = engine.tls.as_deref().expect("TLS");
    let port = tls.rsplit(':').next().unwrap();
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-o", "/dev/null"])
        .args(["-w", "%{http_code} %{redirect_url}", "--resolve"])
        .arg(format!("{name}:{port}:127.0.0.1"))
        .arg("--cacert")
        .arg(root)
        .arg(format!("https://{name}:{port}{path}"))
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut parts = text.split_whitespace();
    (
        parts.next().and_then(|s| s.parse().ok()).unwrap_or(0),
        parts.next().unwrap_or_default().to_string(),
    )
}

/// A control plane's metric (summed over the series whose labels contain `labels`).
fn metric(control: &Control, name: &str, labels: &str) -> f64 {
    let text = ureq::get(&format!("{}/metrics", control.api))
        .call()
        .map(|r| r.into_string().unwrap_or_default())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn create_on(control: &Control, domain: &str, url: &str) -> String {
    let (status, v) = control.call(
        "POST",
        "/v1/links",
        &control.key,
        Some(json!({"long_url": url, "domain": domain})),
    );
    assert_eq!(status, 201, "{v}");
    v["code"].as_str().unwrap().to_string()
}

#[test]
fn a_domain_gets_its_certificate_over_http_01_and_renews_at_two_engines() {
    // TLS-ALPN-01 made unavailable: pebble validates it on a port nothing listens on.
    let (http, tls, dead) = (free_port(), free_port(), free_port());
    let Some(pebble) = Pebble::start("acme::http_01", http, dead) else {
        return;
    };
    // A domain pointing nowhere the fleet listens.
    pebble.add_a("fail.test", &["127.0.0.2"]);
    let site = Site::new();
    let flags = acme_flags(&pebble);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let control = Control::start(&site, &flags);
    let pki = lasthop_testkit::pki(&site, false);
    // Engine A is where the domain points; its plain listener sends everyone to HTTPS but the
    // CA's validation.
    let a = engine(
        &site,
        &pki,
        &control,
        (Some(http), Some(tls)),
        &["--redirect-http-to-https"],
    );
    let b = engine(&site, &pki, &control, (None, None), &[]);

    add_domain(&control, "go.test");
    let code = create_on(&control, "go.test", "https://example.com/acme");
    let seen = wait_status(&control, "go.test", "active", Duration::from_secs(60));
    assert_eq!(
        seen.first().map(String::as_str),
        Some("pending"),
        "{seen:?}"
    );
    let v = domain(&control, "go.test");
    assert_eq!(v["certificate"]["source"], "acme", "{v}");
    assert!(v["acme"]["error"].is_null(), "{v}");
    assert!(v["acme"]["renew_at"].is_string(), "{v}");
    let root = pebble.root();
    for e in [&a, &b] {
        wait_until(
            Duration::from_secs(10),
            "the certificate at the engine",
            || get(e, "go.test", &root, &format!("/{code}")).0 == 302,
        );
        assert_eq!(
            get(e, "go.test", &root, &format!("/{code}")),
            (302, "https://example.com/acme".to_string())
        );
    }
    // Nothing of the challenge stays published.
    let plain = ureq::get(&format!("http://{}/.well-known/acme-challenge/x", a.addr))
        .set("Host", "go.test")
        .call();
    assert!(
        matches!(plain, Err(ureq::Error::Status(404, _))),
        "{plain:?}"
    );
    // The account key is a secret file.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(control.data.join("acme-account.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");

    // A domain the CA cannot reach at the fleet: `failed`, with its reason and a retry time.
    add_domain(&control, "fail.test");
    wait_status(&control, "fail.test", "failed", Duration::from_secs(60));
    let v = domain(&control, "fail.test");
    let error = v["acme"]["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("http-01") && error.contains("acme:error:connection"),
        "{v}"
    );
    assert!(v["acme"]["next_retry_at"].is_string(), "{v}");
    assert!(metric(&control, "lasthop_acme_orders_total", "result=\"issued\"") >= 1.0);
    assert!(metric(&control, "lasthop_acme_orders_total", "result=\"failed\"") >= 1.0);
    assert!(
        metric(
            &control,
            "lasthop_acme_last_error_timestamp_seconds",
            "domain=\"fail.test\",problem=\"connection\""
        ) > 0.0
    );
    // Renewing is an admin's.
    let (status, _) = control.call("POST", "/v1/domains/go.test/renew", &control.key, None);
    assert_eq!(status, 403);

    // A renewal ordered now, under a client loop at both engines: each swaps to the new
    // certificate with no failed handshake.
    let before = [served_leaf(&a, "go.test"), served_leaf(&b, "go.test")];
    assert!(before.iter().all(|c| c.contains("BEGIN")), "{before:?}");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let failures = std::thread::scope(|s| {
        let loops: Vec<_> = [&a, &b]
            .into_iter()
            .map(|e| {
                let (stop, root, code) = (&stop, &root, &code);
                s.spawn(move || {
                    let mut failures = Vec::new();
                    let mut n = 0;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let (status, _) = get(e, "go.test", root, &format!("/{code}"));
                        n += 1;
                        if status != 302 {
                            failures.push(status);
                        }
                    }
                    (failures, n)
                })
            })
            .collect();
        let (status, v) = control.call(
            "POST",
            "/v1/domains/go.test/renew",
            &control.admin_key,
            None,
        );
        assert_eq!(status, 202, "{v}");
        let asked = Instant::now();
        for (e, old) in [(&a, &before[0]), (&b, &before[1])] {
            while served_leaf(e, "go.test") == *old {
                assert!(
                    asked.elapsed() < Duration::from_secs(60),
                    "the renewed certificate at the engine\n{}",
                    control.log()
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        println!("renewed at both engines {:?} after asking", asked.elapsed());
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        loops
            .into_iter()
            .map(|l| l.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (f, n) in &failures {
        assert!(
            f.is_empty() && *n > 0,
            "failed requests during the renewal: {failures:?}"
        );
    }
    assert_eq!(domain(&control, "go.test")["status"], "active");
}

#[test]
fn tls_alpn_01_answers_where_http_01_cannot() {
    // HTTP-01 made unavailable: pebble validates it on a port nothing listens on.
    let (dead, tls) = (free_port(), free_port());
    let Some(pebble) = Pebble::start("acme::tls_alpn_01", dead, tls) else {
        return;
    };
    let site = Site::new();
    let flags = acme_flags(&pebble);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let control = Control::start(&site, &flags);
    let pki = lasthop_testkit::pki(&site, false);
    let e = engine(&site, &pki, &control, (None, Some(tls)), &[]);
    add_domain(&control, "alpn.test");
    let code = create_on(&control, "alpn.test", "https://example.com/alpn");
    wait_status(&control, "alpn.test", "active", Duration::from_secs(90));
    let v = domain(&control, "alpn.test");
    assert!(v["acme"]["error"].is_null(), "{v}");
    // One attempt: HTTP-01's order failed, TLS-ALPN-01's issued.
    assert_eq!(
        metric(&control, "lasthop_acme_orders_total", "result=\"issued\""),
        1.0
    );
    assert!(
        control.log().contains("http-01") && control.log().contains("ACME: the order failed"),
        "{}",
        control.log()
    );
    let root = pebble.root();
    wait_until(
        Duration::from_secs(10),
        "the certificate at the engine",
        || get(&e, "alpn.test", &root, &format!("/{code}")).0 == 302,
    );
    // A client offering `acme-tls/1` for a name with no challenge published gets no
    // certificate at all (never the one for browsers).
    let out = Command::new("openssl")
        .args(["s_client", "-connect", e.tls.as_deref().unwrap()])
        .args(["-servername", "alpn.test", "-alpn", "acme-tls/1"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("BEGIN CERTIFICATE"), "{text}");
}

#[test]
fn two_control_planes_on_one_store_place_one_order_per_domain() {
    let test = "acme::two_control_planes";
    let (http, dead) = (free_port(), free_port());
    let Some(pebble) = Pebble::start(test, http, dead) else {
        return;
    };
    let Some((_pg, url)) = lasthop_testkit::Postgres::fresh_database(test) else {
        return;
    };
    let site = Site::new();
    let mut flags = acme_flags(&pebble);
    flags.extend(["--store".to_string(), url.clone()]);
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let bin: PathBuf = lasthop_testkit::control_bin();
    let mut one = Control::start_from(&bin, &site, &site.dir.path().join("one"), &flags);
    let two = Control::start_from(&bin, &site, &site.dir.path().join("two"), &flags);
    // With a shared store the keys live in it.
    let key = |owner: &str, admin: bool| {
        let mut cmd = Command::new(&bin);
        cmd.args(["apikey", "create", "--owner", owner, "--store", &url]);
        if admin {
            cmd.arg("--admin");
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    one.key = key("t", false);
    one.admin_key = key("ops", true);
    let pki = lasthop_testkit::pki(&site, false);
    let e = engine(&site, &pki, &one, (Some(http), None), &[]);
    add_domain(&one, "shared.test");
    wait_status(&one, "shared.test", "active", Duration::from_secs(60));
    let issued = || {
        metric(&one, "lasthop_acme_orders_total", "result=\"issued\"")
            + metric(&two, "lasthop_acme_orders_total", "result=\"issued\"")
    };
    // Both looked the domain over every second; one placed the order.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(issued(), 1.0);
    let before = served_leaf(&e, "shared.test");
    let (status, v) = one.call(
        "POST",
        "/v1/domains/shared.test/renew",
        &one.admin_key,
        None,
    );
    assert_eq!(status, 202, "{v}");
    wait_until(Duration::from_secs(60), "the renewal", || issued() == 2.0);
    wait_until(
        Duration::from_secs(10),
        "the renewed certificate served",
        || served_leaf(&e, "shared.test") != before,
    );
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(issued(), 2.0, "one order per renewal");
    let failed = metric(&one, "lasthop_acme_orders_total", "result=\"failed\"")
        + metric(&two, "lasthop_acme_orders_total", "result=\"failed\"");
    assert_eq!(failed, 0.0);
}
