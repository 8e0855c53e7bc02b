//! Branded domains at the edge: links made on a domain answer on that domain alone (the same
//! alias on two domains, two destinations; a code on the wrong domain, 404; any other `Host`,
//! the default domain), and each domain's certificate is uploaded to the control plane, fetched
//! by every engine through the feed, chosen by SNI (curl with `--resolve` and the branded CA
//! only), the default certificate for any other name, a replacement under a client loop at two
//! engines, and a restart with the control plane down serving the set kept sealed on disk.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use lasthop_testkit::{ca_and_server, signed_cert, wait_until, Control, Engine, Pki, Site, P256};
use serde_json::json;

/// One HTTPS GET of `path` on `name` (resolved to the engine's TLS port) trusting only `ca`:
/// the status (0 when the handshake or the verification failed), the HTTP version, and the
/// served certificate's subject.
fn get(engine: &Engine, name: &str, ca: &Path, path: &str, http2: bool) -> (u16, String, String) {
    let (status, version, subject, _) = curl(engine, name, Some(ca), path, http2);
    (status, version, subject)
}

/// [`get`]'s status and `Location`.
fn location(engine: &Engine, name: &str, ca: &Path, path: &str, http2: bool) -> (u16, String) {
    let (status, _, _, location) = curl(engine, name, Some(ca), path, http2);
    (status, location)
}

/// [`get`] trusting `ca`, or anything (`-k`) with `None`.
fn curl_get(
    engine: &Engine,
    name: &str,
    ca: Option<&Path>,
    path: &str,
    http2: bool,
) -> (u16, String, String) {
    let (status, version, subject, _) = curl(engine, name, ca, path, http2);
    (status, version, subject)
}

/// [`curl_get`] with the redirect's `Location` too.
fn curl(
    engine: &Engine,
    name: &str,
    ca: Option<&Path>,
    path: &str,
    http2: bool,
) -> (u16, String, String, String) {
    let tls = engine.tls.as_deref().expect("the engine serves TLS");
    let port = tls.rsplit(':').next().unwrap();
    let trust: Vec<std::ffi::OsString> = match ca {
        Some(ca) => vec!["--cacert".into(), ca.into()],
        None => vec!["-k".into()],
    };
    let out = Command::new("curl")
        .args([
            "-sv",
            "--max-time",
            "10",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{http_version} %{redirect_url}",
        ])
        .arg(if http2 { "--http2" } else { "--http1.1" })
        .arg("--resolve")
        .arg(format!("{name}:{port}:127.0.0.1"))
        .args(trust)
        .arg(format!("https://{name}:{port}{path}"))
        .output()
        .expect("curl");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let subject = stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("*  subject: "))
        .unwrap_or_default()
        .to_string();
    let mut parts = stdout.split_whitespace();
    let status = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
    if status == 0 {
        eprintln!("curl gave no status for {name}{path} (h2 {http2}): {stdout} {stderr}");
    }
    (
        status,
        parts.next().unwrap_or_default().to_string(),
        subject,
        parts.next().unwrap_or_default().to_string(),
    )
}

fn metric(engine: &Engine, name: &str) -> f64 {
    let text = ureq::get(&format!("http://{}/metrics", engine.admin))
        .call()
        .map(|r| r.into_string().unwrap_or_default())
        .unwrap_or_default();
    lasthop_testkit::metrics::sample(&text, name).unwrap_or(-1.0)
}

/// A certificate for `name`, signed by the branded CA in `dir` (`ca.pem`), as `<file>.pem` and
/// `<file>.key`, with `cn` as its subject.
fn issue(dir: &Path, name: &str, cn: &str, file: &str) {
    let ext = format!("{file}.ext");
    std::fs::write(dir.join(&ext), format!("subjectAltName=DNS:{name}\n")).unwrap();
    signed_cert(
        dir,
        P256,
        cn,
        &format!("{file}.key"),
        &format!("{file}.pem"),
        &ext,
    );
}

fn upload(control: &Control, dir: &Path, domain: &str, file: &str) {
    let read = |f: String| std::fs::read_to_string(dir.join(f)).unwrap();
    let (status, v) = control.call(
        "PUT",
        &format!("/v1/domains/{domain}/certificate"),
        &control.key,
        Some(
            json!({"certificate": read(format!("{file}.pem")), "key": read(format!("{file}.key"))}),
        ),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "active");
}

/// A link on `domain` (with `alias` if given): its code.
fn create_on(control: &Control, domain: &str, url: &str, alias: Option<&str>) -> String {
    let mut body = json!({"long_url": url, "domain": domain});
    if let Some(alias) = alias {
        body["alias"] = json!(alias);
    }
    let (status, v) = control.call("POST", "/v1/links", &control.key, Some(body));
    assert_eq!(status, 201, "{v}");
    assert_eq!(v["domain"], domain);
    v["code"].as_str().unwrap().to_string()
}

fn tls_engine(site: &Site, pki: &Pki, control: &Control, data: &Path) -> Engine {
    let args: Vec<String> = [
        "--tls-listen",
        "127.0.0.1:0",
        "--cert",
        pki.cert.to_str().unwrap(),
        "--key",
        pki.key.to_str().unwrap(),
        "--no-ktls",
        "--no-quic",
        "--data-dir",
        data.to_str().unwrap(),
    ]
    .map(String::from)
    .into_iter()
    .chain(lasthop_testkit::spool_to(control))
    .collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    lasthop_testkit::subscribed_engine(site, control, &args)
}

#[test]
fn branded_certificates_are_chosen_by_sni_at_every_engine() {
    let site = Site::new();
    let mut control = Control::start(&site, &["--clicks-flush-ms", "200"]);
    let code = control.create("https://example.com/branded");
    let branded = site.dir.path().join("branded");
    ca_and_server(
        &branded,
        "Branded CA",
        "DNS:go.test",
        "go.test",
        "go.key",
        "go.pem",
    );
    issue(&branded, "two.test", "two.test", "two");
    let ca = branded.join("ca.pem");
    for (domain, file) in [("go.test", "go"), ("two.test", "two")] {
        let (status, v) = control.call(
            "POST",
            "/v1/domains",
            &control.key,
            Some(json!({"domain": domain})),
        );
        assert_eq!(status, 201, "{v}");
        upload(&control, &branded, domain, file);
    }
    // Each domain's namespace: its own generated code and the same alias on both.
    let go_code = create_on(&control, "go.test", "https://example.com/go", None);
    for domain in ["go.test", "two.test"] {
        create_on(
            &control,
            domain,
            &format!("https://{domain}.example/spring"),
            Some("spring-sale"),
        );
    }
    let default_alias = control.call(
        "POST",
        "/v1/links",
        &control.key,
        Some(json!({"long_url": "https://example.com/default-spring", "alias": "spring-sale"})),
    );
    assert_eq!(default_alias.0, 201, "{}", default_alias.1);

    let pki = lasthop_testkit::pki(&site, false);
    let data_a = site.dir.path().join("engine-a");
    let a = tls_engine(&site, &pki, &control, &data_a);
    let b = tls_engine(&site, &pki, &control, &site.dir.path().join("engine-b"));
    for e in [&a, &b] {
        wait_until(
            Duration::from_secs(10),
            "both certificates at the engine",
            || metric(e, "lasthop_engine_certificates") == 2.0,
        );
    }
    // Each name gets its own certificate (verified against the branded CA alone), over
    // HTTP/1.1 and HTTP/2; its short links answer, each domain's `spring-sale` its own.
    for (name, cn) in [("go.test", "CN=go.test"), ("two.test", "CN=two.test")] {
        for http2 in [false, true] {
            let (status, version, subject) = get(&a, name, &ca, "/spring-sale", http2);
            assert_eq!(status, 302, "{name} (h2 {http2})");
            assert_eq!(version, if http2 { "2" } else { "1.1" });
            assert!(subject.contains(cn), "{name}: {subject}");
            assert_eq!(
                location(&a, name, &ca, "/spring-sale", http2),
                (302, format!("https://{name}.example/spring"))
            );
        }
    }
    for e in [&a, &b] {
        assert_eq!(
            location(e, "go.test", &ca, &format!("/{go_code}"), false),
            (302, "https://example.com/go".to_string())
        );
        // A code on the wrong domain: 404 (the default domain's code on go.test, go.test's
        // on two.test and on the default domain).
        assert_eq!(get(e, "go.test", &ca, &format!("/{code}"), false).0, 404);
        assert_eq!(get(e, "two.test", &ca, &format!("/{go_code}"), true).0, 404);
        assert_eq!(
            get(e, "lh.test", &pki.ca, &format!("/{go_code}"), false).0,
            404
        );
        // A Host that is no branded domain is the default domain.
        assert_eq!(
            location(e, "lh.test", &pki.ca, "/spring-sale", false),
            (302, "https://example.com/default-spring".to_string())
        );
    }
    // Stats per domain stay apart: `spring-sale` was followed 5 times on go.test (4 above and
    // this one), 4 on two.test and twice on the default domain.
    assert_eq!(get(&a, "go.test", &ca, "/spring-sale", false).0, 302);
    for (query, want) in [("?domain=go.test", 5), ("?domain=two.test", 4), ("", 2)] {
        let mut last = serde_json::Value::Null;
        lasthop_testkit::wait_until_every(
            Duration::from_millis(200),
            Duration::from_secs(30),
            &format!("spring-sale{query}'s clicks counted"),
            || {
                let (status, v) = control.call(
                    "GET",
                    &format!("/v1/links/spring-sale/stats{query}"),
                    &control.key,
                    None,
                );
                assert_eq!(status, 200, "{v}");
                let total =
                    v["clicks"].as_u64().unwrap_or(0) + v["bot_clicks"].as_u64().unwrap_or(0);
                last = v;
                total == want
            },
        );
        assert_eq!(last["code"], "spring-sale");
    }
    // Any other name gets the default certificate (lh.test), which the branded CA did not sign.
    let (status, _, _) = get(&a, "other.test", &ca, &format!("/{code}"), false);
    assert_eq!(status, 0, "the default certificate is not the branded CA's");
    let (status, _, subject) = curl_get(&a, "other.test", None, &format!("/{code}"), false);
    assert_eq!(status, 302);
    assert!(subject.contains("CN=lh.test"), "{subject}");
    let (status, _, subject) = get(&a, "lh.test", &pki.ca, &format!("/{code}"), false);
    assert_eq!(status, 302);
    assert!(subject.contains("CN=lh.test"), "{subject}");

    // A new certificate for go.test while a client loop runs at both engines: no failed
    // handshake, and both serve the new one within a second of its upload.
    issue(&branded, "go.test", "go.test renewed", "go2");
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (failures, renewed_after) = std::thread::scope(|s| {
        let loops: Vec<_> = [&a, &b]
            .into_iter()
            .map(|e| {
                let (stop, ca, code) = (&stop, &ca, &go_code);
                s.spawn(move || {
                    let mut failures = Vec::new();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let (status, _, subject) =
                            get(e, "go.test", ca, &format!("/{code}"), false);
                        if status != 302 {
                            failures.push(format!("{status} {subject}"));
                        }
                    }
                    failures
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(500));
        let uploaded = Instant::now();
        upload(&control, &branded, "go.test", "go2");
        let renewed = |e: &Engine| {
            get(e, "go.test", &ca, &format!("/{go_code}"), false)
                .2
                .contains("renewed")
        };
        while !(renewed(&a) && renewed(&b)) {
            assert!(
                uploaded.elapsed() < Duration::from_secs(10),
                "the new certificate at both engines"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let renewed_after = uploaded.elapsed();
        std::thread::sleep(Duration::from_millis(300));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let failures: Vec<String> = loops.into_iter().flat_map(|l| l.join().unwrap()).collect();
        (failures, renewed_after)
    });
    assert!(
        failures.is_empty(),
        "handshakes failed during the replacement: {failures:?}"
    );
    assert!(
        renewed_after < Duration::from_secs(2),
        "served after {renewed_after:?}"
    );
    println!("the new certificate at both engines {renewed_after:?} after its upload");

    // Restarted while the control plane is down, engine A serves the set it kept, sealed.
    let sealed = std::fs::read(data_a.join("certificates.enc")).unwrap();
    assert!(
        !sealed.windows(11).any(|w| w == b"PRIVATE KEY"),
        "no key in clear on disk"
    );
    drop(a);
    control.kill();
    let a = tls_engine(&site, &pki, &control, &data_a);
    wait_until(
        Duration::from_secs(10),
        "the kept certificates served",
        || metric(&a, "lasthop_engine_certificates") == 2.0,
    );
    let (status, _, subject) = get(&a, "go.test", &ca, "/healthz", false);
    assert_ne!(
        status, 0,
        "the handshake verifies with the kept certificate"
    );
    assert!(subject.contains("renewed"), "{subject}");
}
