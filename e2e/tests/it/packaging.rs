//! What operators install and run: config files under the flags (`--config`, `--check-config`),
//! SIGHUP re-reading the config under load, the Debian package (built by `scripts/package
//! --debug`, inspected with `dpkg-deb`, extracted and run from its installed paths against its
//! shipped configs, its units verified by `systemd-analyze`), and the dashboards' and alert
//! rules' metrics checked against what the programs export.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use lasthop_testkit::{
    control_bin, curl, engine_bin, status_of, subscribed_engine, wait_until, Control, Engine, Site,
};

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("runs")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn write(path: &Path, body: &str) {
    std::fs::write(path, body).expect("write");
}

/// Links of a snapshot: the codes of `counters`, each to `https://example.com/{tag}/{n}`.
fn links(
    site: &Site,
    tag: &str,
    counters: std::ops::Range<u64>,
) -> Vec<(String, String, Option<i64>)> {
    let scheme = site.scheme();
    counters
        .map(|n| {
            (
                scheme.encode_string(n).expect("code"),
                format!("https://example.com/{tag}/{n}"),
                None,
            )
        })
        .collect()
}

#[test]
fn config_files_sit_under_flags_and_check_config_says_so() {
    let site = Site::new();
    site.write_snapshot(1, 100, &links(&site, "a", 0..10));
    let dir = site.dir.path();
    let config = dir.join("engine.toml");
    let key = site.key_file();
    let snapshot = site.snapshot_path();
    write(
        &config,
        &format!(
            "# an engine\nkey-file = {key:?}\nsnapshot = {snapshot:?}\nlisten = \"127.0.0.1:0\"\n\
             admin-listen = \"127.0.0.1:0\"\ncores = 1\ndata-dir = {:?}\n",
            dir.join("engine-data")
        ),
    );
    let check = |config: &Path| {
        run(Command::new(engine_bin())
            .arg("--config")
            .arg(config)
            .arg("--check-config"))
    };
    let ok = check(&config);
    assert!(ok.status.success(), "{}", text(&ok));
    assert!(text(&ok).contains("configuration OK"), "{}", text(&ok));
    // The environment names the file as well as the flag does.
    let ok = run(Command::new(engine_bin())
        .env("LASTHOP_CONFIG", &config)
        .arg("--check-config"));
    assert!(ok.status.success(), "{}", text(&ok));

    // A typo: where it is and what was meant, exit status 1.
    let typo = dir.join("typo.toml");
    let body = std::fs::read_to_string(&config).unwrap() + "idle-timout = 5\n";
    write(&typo, &body);
    let bad = check(&typo);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(
        text(&bad).contains(&format!(
            "{}:8:1: unknown key `idle-timout`; the nearest valid key is `idle-timeout`",
            typo.display()
        )),
        "{}",
        text(&bad)
    );
    // A value clap refuses, reported as for the flag.
    write(
        &typo,
        &(std::fs::read_to_string(&config).unwrap() + "idle-timeout = \"soon\"\n"),
    );
    let bad = check(&typo);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(
        text(&bad).contains("invalid value 'soon' for '--idle-timeout"),
        "{}",
        text(&bad)
    );
    // A file it names that is not there: the check reads it as the start would.
    write(
        &typo,
        &std::fs::read_to_string(&config)
            .unwrap()
            .replace("links.snap", "nope.snap"),
    );
    let bad = check(&typo);
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(text(&bad).contains("nope.snap"), "{}", text(&bad));

    // The file alone starts an engine (the harness adds only its ports, key and data dir):
    // the snapshot comes from it.
    let engine = Engine::launch(
        Command::new(engine_bin()),
        &site,
        &["--config", config.to_str().unwrap()],
    );
    let code = site.scheme().encode_string(3).unwrap();
    assert_eq!(status_of(&engine.addr, &format!("/{code}")), 302);
    // A flag wins over the file: --cores 2 from the harness, cores = 1 in the file.
    assert_eq!(engine.metric("lasthop_engine_cores"), Some(2.0));

    // The control plane's `serve` reads its own keys the same way.
    let control = dir.join("control.toml");
    write(
        &control,
        &format!(
            "data-dir = {:?}\nkey-file = {key:?}\napi-listen = \"127.0.0.1:0\"\nedge-listen = \"127.0.0.1:0\"\n",
            dir.join("control-data")
        ),
    );
    let ok = run(Command::new(control_bin())
        .args(["serve", "--check-config", "--config"])
        .arg(&control));
    assert!(ok.status.success(), "{}", text(&ok));
    // Running from it, SIGHUP re-reads it: a change is named as waiting for a restart, a
    // broken file is refused, and the API answers throughout.
    let running = Control::start(&site, &["--config", control.to_str().unwrap()]);
    write(
        &control,
        &(std::fs::read_to_string(&control).unwrap() + "create-rate = 7\n"),
    );
    running.signal("HUP");
    wait_until(Duration::from_secs(5), "the change named", || {
        running.log().contains("need a restart") && running.log().contains("\"create-rate\"")
    });
    write(&control, "create-rate = \"many\"\n");
    running.signal("HUP");
    wait_until(Duration::from_secs(5), "the broken file refused", || {
        running
            .log()
            .contains("SIGHUP: keeping the running configuration")
    });
    running.create("https://example.com/after-two-reloads");
    write(
        &control,
        &format!(
            "data-dir = {:?}\nkey-file = {key:?}\napi-listen = \"127.0.0.1:0\"\nedge-listen = \"127.0.0.1:0\"\n",
            dir.join("control-data")
        ),
    );
    write(
        &control,
        &(std::fs::read_to_string(&control).unwrap() + "api-lisen = \"x\"\n"),
    );
    let bad = run(Command::new(control_bin())
        .args(["serve", "--check-config", "--config"])
        .arg(&control));
    assert_eq!(bad.status.code(), Some(1), "{}", text(&bad));
    assert!(
        text(&bad).contains(":5:1: unknown key `api-lisen`; the nearest valid key is `api-listen`"),
        "{}",
        text(&bad)
    );
}

/// SIGHUP with a broken config file under wrk load: not one request fails, the running config
/// stays; then a good one: `snapshot` applies at once, `idle-timeout` is named as needing a
/// restart.
#[test]
fn sighup_rereads_the_config_and_a_broken_one_drops_nothing() {
    let site = Site::new();
    let dir = site.dir.path();
    let first = dir.join("first.snap");
    site.write_snapshot(1, 100, &links(&site, "first", 0..50));
    std::fs::rename(site.snapshot_path(), &first).unwrap();
    let second = dir.join("second.snap");
    site.write_snapshot(2, 200, &links(&site, "second", 0..150));
    std::fs::rename(site.snapshot_path(), &second).unwrap();
    let config = dir.join("engine.toml");
    let good =
        |snapshot: &Path, idle: u32| format!("snapshot = {snapshot:?}\nidle-timeout = {idle}\n");
    write(&config, &good(&first, 60));
    let engine = Engine::launch(
        Command::new(engine_bin()),
        &site,
        &["--config", config.to_str().unwrap()],
    );
    let code = site.scheme().encode_string(7).unwrap();
    let new_code = site.scheme().encode_string(120).unwrap();
    assert_eq!(status_of(&engine.addr, &format!("/{new_code}")), 404);

    let url = format!("http://{}/{code}", engine.addr);
    let wrk = std::thread::spawn(move || {
        run(Command::new("wrk").args(["-t1", "-c8", "-d3s", "--latency", &url]))
    });
    std::thread::sleep(Duration::from_millis(700));
    write(&config, "lisen = 1\nidle-timeout = 60\n");
    engine.signal("HUP");
    std::thread::sleep(Duration::from_millis(700));
    write(&config, &good(&second, 30));
    engine.signal("HUP");
    let out = wrk.join().expect("wrk");
    let report = text(&out);
    assert!(out.status.success(), "{report}");
    assert!(!report.contains("Socket errors"), "{report}");
    assert!(!report.contains("Non-2xx or 3xx"), "{report}");
    let requests: u64 = report
        .lines()
        .find_map(|l| {
            l.trim()
                .split_once(" requests in ")
                .map(|(n, _)| n.parse().unwrap_or(0))
        })
        .unwrap_or(0);
    assert!(requests > 1_000, "{report}");
    println!("wrk across two SIGHUPs (one with a broken config): {requests} requests, none failed");

    wait_until(
        Duration::from_secs(5),
        "the new snapshot from the re-read config",
        || status_of(&engine.addr, &format!("/{new_code}")) == 302,
    );
    let log = engine.log();
    assert!(
        log.contains("SIGHUP: keeping the running configuration"),
        "{log}"
    );
    assert!(log.contains("unknown key `lisen`"), "{log}");
    assert!(
        log.contains("configuration changes applied") && log.contains("\"snapshot\""),
        "{log}"
    );
    assert!(
        log.contains("need a restart") && log.contains("\"idle-timeout\""),
        "{log}"
    );
}

/// `scripts/package --debug`: the package's contents, its metadata, its units and configs, and
/// the programs run from where it installs them against the configs it ships.
#[test]
fn the_package_installs_and_runs_from_its_paths() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let built = run(Command::new(root.join("scripts/package")).arg("--debug"));
    assert!(built.status.success(), "{}", text(&built));
    let deb = PathBuf::from(String::from_utf8_lossy(&built.stdout).trim().to_string());
    let name = deb.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with("lasthop_0.") && name.ends_with(".deb"),
        "{name}"
    );

    let listing = text(&run(Command::new("dpkg-deb").arg("-c").arg(&deb)));
    for path in [
        "./usr/bin/lasthop-engine",
        "./usr/bin/lasthop-control",
        "./usr/bin/lasthop-snapshot",
        "./usr/bin/lasthop-clicks",
        "./etc/lasthop/engine.toml",
        "./etc/lasthop/control.toml",
        "./usr/lib/systemd/system/lasthop-engine.service",
        "./usr/lib/systemd/system/lasthop-control.service",
        "./usr/share/lasthop/systemd/xdp.conf",
        "./usr/share/man/man1/lasthop-engine.1.gz",
        "./usr/share/man/man1/lasthop-control-serve.1.gz",
        "./usr/share/bash-completion/completions/lasthop-engine",
        "./usr/share/zsh/vendor-completions/_lasthop-control",
        "./usr/share/fish/vendor_completions.d/lasthop-engine.fish",
        "./usr/share/lasthop/grafana/lasthop-engine.json",
        "./usr/share/lasthop/prometheus/lasthop-alerts.yml",
        "./usr/share/doc/lasthop/OPERATIONS.md",
        "./usr/share/doc/lasthop/copyright",
    ] {
        assert!(
            listing.contains(&format!(" {path}\n")),
            "{path} missing:\n{listing}"
        );
    }
    assert!(listing.contains("root/root"), "owned by root:\n{listing}");
    let info = text(&run(Command::new("dpkg-deb").arg("-I").arg(&deb)));
    for field in [
        "Package: lasthop",
        "Architecture: ",
        "Depends: ",
        "adduser",
        "libc6",
        "postinst",
        "conffiles",
    ] {
        assert!(info.contains(field), "{field}:\n{info}");
    }

    let tmp = tempfile::tempdir().unwrap();
    let at = tmp.path().join("root");
    let x = run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&at));
    assert!(x.status.success(), "{}", text(&x));
    // The maintainer scripts (they create the user and directories on a real install, which
    // this test never does): valid sh, executable.
    let control = tmp.path().join("DEBIAN");
    let e = run(Command::new("dpkg-deb").arg("-e").arg(&deb).arg(&control));
    assert!(e.status.success(), "{}", text(&e));
    for script in ["postinst", "prerm", "postrm"] {
        let path = control.join(script);
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).unwrap().permissions(),
        );
        assert_eq!(mode & 0o111, 0o111, "{script} is executable");
        let n = run(Command::new("sh").arg("-n").arg(&path));
        assert!(n.status.success(), "{script}: {}", text(&n));
    }
    let postinst = std::fs::read_to_string(control.join("postinst")).unwrap();
    assert!(postinst.contains("adduser --system") && postinst.contains("/var/lib/lasthop/engine"));
    let bin = |p: &str| at.join("usr/bin").join(p);
    let etc = |p: &str| at.join("etc/lasthop").join(p);

    // The units, with ExecStart pointing at the extracted binaries: no complaint at all.
    let units = tmp.path().join("units");
    std::fs::create_dir_all(&units).unwrap();
    for u in ["lasthop-engine.service", "lasthop-control.service"] {
        let body = std::fs::read_to_string(at.join("usr/lib/systemd/system").join(u)).unwrap();
        assert!(
            body.contains("Type=notify") && body.contains("ExecReload="),
            "{u}"
        );
        let local = body.replace("/usr/bin/", &format!("{}/", at.join("usr/bin").display()));
        write(&units.join(u), &local);
    }
    if Path::new("/usr/bin/systemd-analyze").exists() {
        let v = run(Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(units.join("lasthop-engine.service"))
            .arg(units.join("lasthop-control.service")));
        assert!(
            v.status.success() && text(&v).trim().is_empty(),
            "{}",
            text(&v)
        );
    } else {
        println!("SKIPPED systemd-analyze verify: systemd is not installed");
    }
    // The man pages are roff; the completions name their program.
    let man = run(Command::new("zcat").arg(at.join("usr/share/man/man1/lasthop-engine.1.gz")));
    assert!(
        text(&man).contains(".TH lasthop-engine 1"),
        "{}",
        text(&man)
    );
    let bash =
        std::fs::read_to_string(at.join("usr/share/bash-completion/completions/lasthop-control"))
            .unwrap();
    assert!(
        bash.contains("lasthop-control") && bash.contains("--api-listen"),
        "completions"
    );
    // Every key of each program is in its shipped config, set or commented.
    for (conf, probe) in [
        ("engine.toml", "#snapshot-memory = \"map\""),
        ("control.toml", "#reputation-list = []"),
    ] {
        let body = std::fs::read_to_string(etc(conf)).unwrap();
        assert!(body.contains(probe), "{conf}: {probe}");
    }

    // From the installed paths with the shipped configs, adjusted for this machine by flags
    // (keys, state and loopback ports): a control plane, then an engine subscribed to it.
    let site = Site::new();
    let data = tmp.path().join("control");
    let checked = run(Command::new(bin("lasthop-control"))
        .args(["serve", "--check-config", "--config"])
        .arg(etc("control.toml"))
        .arg("--key-file")
        .arg(site.key_file())
        .arg("--data-dir")
        .arg(&data));
    assert!(checked.status.success(), "{}", text(&checked));
    let running = Control::start_from(
        &bin("lasthop-control"),
        &site,
        &data,
        &["--config", etc("control.toml").to_str().unwrap()],
    );
    let code = running.create("https://example.com/from-the-package");
    let engine_checked = run(Command::new(bin("lasthop-engine"))
        .arg("--config")
        .arg(etc("engine.toml"))
        .arg("--key-file")
        .arg(site.key_file())
        .arg("--check-config"));
    assert!(engine_checked.status.success(), "{}", text(&engine_checked));
    let mut engine_args = running.engine_args();
    engine_args.extend([
        "--config".into(),
        etc("engine.toml").to_string_lossy().into_owned(),
    ]);
    let engine_args: Vec<&str> = engine_args.iter().map(String::as_str).collect();
    let engine = Engine::launch(Command::new(bin("lasthop-engine")), &site, &engine_args);
    wait_until(
        Duration::from_secs(10),
        "the link served by the packaged engine",
        || status_of(&engine.addr, &format!("/{code}")) == 302,
    );
}

/// Every metric a shipped dashboard panel or alert rule names is one the programs export
/// (scraped from an engine serving TLS and a control plane with a peer region).
#[test]
fn dashboards_and_alerts_name_only_exported_metrics() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging");
    let mut named = std::collections::BTreeSet::new();
    for file in [
        "grafana/lasthop-engine.json",
        "grafana/lasthop-control.json",
        "prometheus/lasthop-alerts.yml",
    ] {
        let body = std::fs::read_to_string(root.join(file)).unwrap();
        if file.ends_with(".json") {
            serde_json::from_str::<serde_json::Value>(&body).expect("dashboards are JSON");
        }
        let mut rest = body.as_str();
        while let Some(at) = rest.find("lasthop_") {
            let name: String = rest[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            rest = &rest[at + name.len()..];
            named.insert(name);
        }
    }
    assert!(named.len() > 20, "{named:?}");

    let site = Site::new();
    let token = site.dir.path().join("peer.token");
    lasthop_testkit::write_secret(&token, "a-peer-token-of-enough-length-0123456789\n");
    let control = Control::start(
        &site,
        &[
            "--region",
            "0",
            "--regions",
            "2",
            "--peer",
            "1=http://127.0.0.1:9",
            "--peer-token-file",
            token.to_str().unwrap(),
        ],
    );
    let pki = lasthop_testkit::pki(&site, false);
    let engine = subscribed_engine(
        &site,
        &control,
        &[
            "--no-ktls",
            "--tls-listen",
            "127.0.0.1:0",
            "--cert",
            pki.cert.to_str().unwrap(),
            "--key",
            pki.key.to_str().unwrap(),
        ],
    );
    // Families with labels show once something was counted: an API call, a redirect (and its
    // click, flushed by the processor), a read-through.
    let code = control.create("https://example.com/metrics");
    let missing = |named: &std::collections::BTreeSet<String>| -> Vec<String> {
        let (_, _, e) = curl(&[&format!("http://{}/metrics", engine.admin)]);
        let (_, _, c) = curl(&[&format!("{}/metrics", control.api)]);
        let exported = format!("{e}\n{c}");
        named
            .iter()
            .filter(|n| {
                !exported.lines().any(|l| {
                    l.strip_prefix(n.as_str())
                        .is_some_and(|r| r.starts_with([' ', '{']))
                })
            })
            .cloned()
            .collect()
    };
    let mut left = Vec::new();
    for _ in 0..50 {
        status_of(&engine.addr, &format!("/{code}"));
        left = missing(&named);
        if left.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(left.is_empty(), "named but not exported: {left:?}");

    let promtool = Path::new("/usr/bin/promtool");
    if promtool.exists() {
        let checked = run(Command::new(promtool)
            .args(["check", "rules"])
            .arg(root.join("prometheus/lasthop-alerts.yml")));
        assert!(checked.status.success(), "{}", text(&checked));
    } else {
        println!("SKIPPED promtool check rules: promtool (prometheus) is not installed");
    }
}
