//! The web console in a real browser: Debian's Chromium, headless, driven over WebDriver
//! (chromedriver, fantoccini) against a real control plane (`--dashboard-listen`) and engine.
//! SKIPPED where chromium or chromium-driver is not installed (scripts/test installs both).
//! Screenshots of the main pages go to `target/tmp/console-screenshots/`.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};

use lasthop_testkit::{curl, free_port, spool_to, subscribed_engine, wait_until, Control, Site};

const FIREFOX: &str = "Mozilla/5.0 (X11; Linux x86_64; rv:133.0) Gecko/20100101 Firefox/133.0";
const IPHONE: &str = "Mozilla/5.0 (iPhone; CPU iPhone OS 17_5 like Mac OS X) AppleWebKit/605.1.15 (KHTML, like Gecko) Version/17.5 Mobile/15E148 Safari/604.1";
const GOOGLEBOT: &str = "Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html)";

/// chromedriver on a loopback port, killed when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn installed(bin: &str) -> Option<PathBuf> {
    ["/usr/bin", "/usr/local/bin"]
        .iter()
        .map(|d| Path::new(d).join(bin))
        .find(|p| p.exists())
}

impl Driver {
    fn start() -> Option<Driver> {
        let (Some(driver), Some(_)) = (installed("chromedriver"), installed("chromium")) else {
            lasthop_testkit::skip(
                "console::a_browser_signs_in_creates_and_reads_its_clicks",
                "chromium and chromium-driver are not installed \
                 (apt-get install chromium chromium-driver)",
            );
            return None;
        };
        let port = free_port();
        let child = Command::new(driver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let d = Driver { child, port };
        wait_until(Duration::from_secs(20), "chromedriver listening", || {
            TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        Some(d)
    }

    async fn browser(&self) -> Client {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                // As root Chromium needs --no-sandbox; headless, no GPU, no /dev/shm limits.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,2000"],
            }),
        );
        // Plain HTTP to chromedriver on loopback: no TLS stack needed.
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a Chromium session")
    }
}

fn shots_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Screenshots the page into the output folder, after checking that every field on it has a
/// label (a `<label for>` or an `aria-label`) for assistive technology.
async fn shot(c: &Client, name: &str) {
    let unlabelled = c
        .execute(
            "return Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea'))\
               .filter(e => e.labels.length === 0 && !e.getAttribute('aria-label'))\
               .map(e => e.name || e.id);",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        unlabelled,
        serde_json::json!([]),
        "fields without a label on {name}"
    );
    let png = c.screenshot().await.expect("screenshot");
    std::fs::write(shots_dir().join(format!("{name}.png")), png).unwrap();
}

/// The text of the element `css` finds, waiting up to 10 s for it to appear; found again when
/// the page replaced it meanwhile (a navigation, or the live refresh swapping the stats).
async fn text_of(c: &Client, css: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let found = c
            .wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(css))
            .await;
        let error = match found {
            Ok(el) => match el.text().await {
                Ok(text) => return text,
                Err(e) => e.to_string(),
            },
            Err(e) => e.to_string(),
        };
        assert!(start.elapsed() < Duration::from_secs(10), "{css}: {error}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (up to 10 s) until the text of the element `css` finds contains `want`: after a form
/// post the old page's element may still be there when the click returns.
async fn wait_text(c: &Client, css: &str, want: &str) {
    let start = std::time::Instant::now();
    loop {
        let now = text_of(c, css).await;
        if now.contains(want) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{css}: {now:?}, waiting for {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (up to 10 s) until the browser is at `path`: a form post's navigation may still be
/// under way when its click returns.
async fn wait_path(c: &Client, path: &str) {
    let start = std::time::Instant::now();
    loop {
        let now = c.current_url().await.unwrap();
        if now.path() == path {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "at {} waiting for {path}",
            now.path()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Types `text` into the element `css` finds.
async fn fill(c: &Client, css: &str, text: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .send_keys(text)
        .await
        .unwrap();
}

/// Clicks the element `css` finds.
async fn click(c: &Client, css: &str) {
    c.find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css}: {e}"))
        .click()
        .await
        .unwrap();
}

async fn sign_in(c: &Client, base: &str, key: &str) {
    c.goto(&format!("{base}/signin")).await.unwrap();
    fill(c, "#key", key).await;
    click(c, "main button[type=submit]").await;
    wait_path(c, "/links").await;
}

async fn sign_out(c: &Client) {
    click(c, "header form button").await;
    wait_path(c, "/signin").await;
}

/// Creates a link through the form; the page it lands on.
async fn create(c: &Client, base: &str, url: &str, alias: &str) {
    c.goto(&format!("{base}/links")).await.unwrap();
    fill(c, "#long_url", url).await;
    if !alias.is_empty() {
        fill(c, "#alias", alias).await;
    }
    click(c, "#create").await;
}

/// A form post with the session cookie: the status (redirects not followed).
fn post_with_cookie(base: &str, path: &str, cookie: &str, form: &[(&str, &str)]) -> u16 {
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let resp = agent
        .post(&format!("{base}{path}"))
        .set("Cookie", &format!("lh_session={cookie}"))
        .send_form(form);
    match resp {
        Ok(r) => r.status(),
        Err(ureq::Error::Status(s, _)) => s,
        Err(e) => panic!("{path}: {e}"),
    }
}

fn get_with_cookie(base: &str, path: &str, cookie: &str) -> (u16, String) {
    let agent = ureq::AgentBuilder::new().redirects(0).build();
    let resp = agent
        .get(&format!("{base}{path}"))
        .set("Cookie", &format!("lh_session={cookie}"))
        .call();
    match resp {
        Ok(r) => (r.status(), r.header("location").unwrap_or("").to_string()),
        Err(ureq::Error::Status(s, r)) => (s, r.header("location").unwrap_or("").to_string()),
        Err(e) => panic!("{path}: {e}"),
    }
}

#[test]
fn a_browser_signs_in_creates_and_reads_its_clicks() {
    let Some(driver) = Driver::start() else {
        return;
    };
    let site = Site::new();
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let control = Control::start(
        &site,
        &["--clicks-flush-ms", "200", "--dashboard-listen", &listen],
    );
    let spool = spool_to(&control);
    let spool: Vec<&str> = spool.iter().map(String::as_str).collect();
    let engine = subscribed_engine(&site, &control, &spool);
    let base = format!("http://{listen}");
    let other = {
        let out = Command::new(lasthop_testkit::control_bin())
            .args(["apikey", "create", "--owner", "mallory", "--data-dir"])
            .arg(&control.data)
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let code = rt.block_on(async {
        let c = driver.browser().await;
        c.goto(&format!("{base}/links")).await.unwrap();
        // Signed out, the console asks for a key.
        wait_path(&c, "/signin").await;
        shot(&c, "signin").await;
        // A wrong key is refused in place.
        fill(&c, "#key", "lh_not_a_key").await;
        click(&c, "main button[type=submit]").await;
        assert!(text_of(&c, ".error").await.contains("unknown api key"));
        sign_in(&c, &base, &control.key).await;

        // Create through the form; the link's page shows its short URL.
        create(&c, &base, "https://example.com/from-the-browser", "").await;
        let short = text_of(&c, "#short-url").await;
        let code = short.rsplit('/').next().unwrap().to_string();
        wait_path(&c, &format!("/links/{code}")).await;
        assert_eq!(
            text_of(&c, "#destination").await,
            "https://example.com/from-the-browser"
        );
        // How it redirects: 301, never cached, the visitor's query forwarded (issue 43).
        assert!(text_of(&c, "#options").await.contains("Redirect 302"));
        click(&c, "#redirect-status option[value='301']").await;
        let cache = c.find(Locator::Css("#cache-seconds")).await.unwrap();
        cache.clear().await.unwrap();
        cache.send_keys("0").await.unwrap();
        click(&c, "#forward-query").await;
        click(&c, "#save-options").await;
        wait_text(&c, ".notice", "Done: options").await;
        assert!(
            text_of(&c, "#options")
                .await
                .contains("Redirect 301, cached never, query forwarded"),
            "{}",
            text_of(&c, "#options").await
        );
        let (status, v) = control.call("GET", &format!("/v1/links/{code}"), &control.key, None);
        assert_eq!(status, 200);
        assert_eq!(
            (
                v["redirect_status"].as_u64(),
                v["cache_seconds"].as_u64(),
                v["forward_query"].as_bool()
            ),
            (Some(301), Some(0), Some(true)),
            "{v}"
        );
        // Back to a plain redirect for the clicks below.
        let (status, v) = control.call(
            "PATCH",
            &format!("/v1/links/{code}"),
            &control.key,
            Some(serde_json::json!({"redirect_status": 302, "cache_seconds": 300, "forward_query": false})),
        );
        assert_eq!(status, 200, "{v}");
        // Its destination edited and its tags set in the console (issue 43).
        c.goto(&format!("{base}/links/{code}")).await.unwrap();
        let dest = c.find(Locator::Css("#new-destination")).await.unwrap();
        dest.clear().await.unwrap();
        dest.send_keys("https://example.com/from-the-browser?edited=1")
            .await
            .unwrap();
        click(&c, "#save-destination").await;
        wait_text(&c, ".notice", "Done: destination").await;
        assert_eq!(
            text_of(&c, "#destination").await,
            "https://example.com/from-the-browser?edited=1"
        );
        let tags = c.find(Locator::Css("#tags-input")).await.unwrap();
        tags.clear().await.unwrap();
        tags.send_keys("spring, email").await.unwrap();
        click(&c, "#save-tags").await;
        wait_text(&c, ".notice", "Done: tags").await;
        assert!(text_of(&c, "#tags").await.contains("spring"));
        let (_, v) = control.call("GET", &format!("/v1/links/{code}"), &control.key, None);
        assert_eq!(
            (v["long_url"].as_str(), v["tags"].clone()),
            (
                Some("https://example.com/from-the-browser?edited=1"),
                serde_json::json!(["spring", "email"])
            ),
            "{v}"
        );
        c.goto(&format!("{base}/links?tag=spring")).await.unwrap();
        assert!(text_of(&c, "#links").await.contains(&code));
        // It is in the list, and the search finds it by destination.
        c.goto(&format!("{base}/links?q=FROM-THE-BROWSER"))
            .await
            .unwrap();
        assert!(text_of(&c, "#links").await.contains(&code));

        // Branded domains: the default one listed, one added (pending, no certificate yet),
        // a brand's name refused in place with the API's words, then the added one deleted.
        c.goto(&format!("{base}/domains")).await.unwrap();
        assert!(text_of(&c, "#domains").await.contains("(default)"));
        fill(&c, "#domain", "Go.Example.com").await;
        click(&c, "#add-domain button").await;
        wait_text(&c, ".notice", "go.example.com added").await;
        let listed = text_of(&c, "#domains").await;
        assert!(
            listed.contains("go.example.com") && listed.contains("pending"),
            "{listed}"
        );
        shot(&c, "domains").await;
        fill(&c, "#domain", "paypal-login.example").await;
        click(&c, "#add-domain button").await;
        wait_text(&c, ".error", "brand").await;
        // A link made on the branded domain through the form's domain choice: its page shows
        // the domain's short URL; the domain cannot be deleted while the link lives.
        c.goto(&format!("{base}/links")).await.unwrap();
        fill(&c, "#long_url", "https://example.com/branded").await;
        c.find(Locator::Css("select#domain"))
            .await
            .unwrap()
            .select_by_value("go.example.com")
            .await
            .unwrap();
        fill(&c, "#alias", "spring-sale").await;
        click(&c, "#create").await;
        wait_text(&c, "#short-url", "https://go.example.com/spring-sale").await;
        wait_path(&c, "/links/go.example.com%2Fspring-sale").await;
        shot(&c, "branded-link").await;
        c.goto(&format!("{base}/domains")).await.unwrap();
        click(&c, "form[action='/domains/go.example.com/delete'] button").await;
        wait_text(&c, ".error", "not deleted").await;
        c.goto(&format!("{base}/links/go.example.com%2Fspring-sale"))
            .await
            .unwrap();
        click(
            &c,
            "form[action='/links/go.example.com%2Fspring-sale/delete'] button",
        )
        .await;
        wait_text(&c, ".notice", "Done: delete").await;
        c.goto(&format!("{base}/domains")).await.unwrap();
        click(&c, "form[action='/domains/go.example.com/delete'] button").await;
        wait_text(&c, ".notice", "go.example.com deleted").await;
        assert!(!text_of(&c, "#domains").await.contains("go.example.com"));

        // The QR code on the page decodes to the short URL.
        c.goto(&format!("{base}/links/{code}")).await.unwrap();
        let qr = c
            .find(Locator::Css(".qr svg"))
            .await
            .unwrap()
            .screenshot()
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("qr.png");
        std::fs::write(&file, qr).unwrap();
        match Command::new("zbarimg")
            .args(["--raw", "-q"])
            .arg(&file)
            .output()
        {
            Ok(out) => assert_eq!(
                String::from_utf8_lossy(&out.stdout).trim(),
                short,
                "the QR code on the page"
            ),
            Err(_) => lasthop_testkit::skip(
                "console QR decoding",
                "zbarimg (zbar-tools) is not installed",
            ),
        }

        // Clicks at the engine with known user agents: 4 human, 2 bot.
        let at_engine = format!("http://{}/{code}", engine.addr);
        for ua in [FIREFOX, FIREFOX, FIREFOX, IPHONE, GOOGLEBOT, GOOGLEBOT] {
            assert_eq!(curl(&["-A", ua, &at_engine]).0, 302);
        }
        let mut counted = false;
        for _ in 0..60 {
            c.goto(&format!("{base}/links/{code}")).await.unwrap();
            if text_of(&c, "#human-clicks").await == "4" && text_of(&c, "#bot-clicks").await == "2"
            {
                counted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        assert!(counted, "the page counts 4 human and 2 bot clicks");
        assert_eq!(text_of(&c, "#visitor-days").await, "2");
        let days = text_of(&c, "#days").await;
        assert!(days.contains('4') && days.contains('2'), "{days}");
        let page = c.source().await.unwrap();
        assert!(
            page.contains("Firefox") && page.contains("Safari"),
            "browsers"
        );
        assert!(page.contains("user_agent"), "the bots' reason");
        assert!(
            c.find(Locator::Css("#chart svg rect")).await.is_ok(),
            "the chart"
        );
        shot(&c, "link").await;
        // Live refresh: one more click, and the open page shows it without a reload.
        assert_eq!(curl(&["-A", FIREFOX, &at_engine]).0, 302);
        let start = std::time::Instant::now();
        while text_of(&c, "#human-clicks").await != "5" {
            assert!(
                start.elapsed() < Duration::from_secs(40),
                "the page refreshes its clicks"
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }

        // A bad URL and a taken alias show the API's errors in place.
        create(&c, &base, "ftp://example.com/file", "").await;
        assert!(text_of(&c, "#form-error").await.contains("url_scheme"));
        create(&c, &base, "https://example.com/one", "spring-sale").await;
        wait_path(&c, "/links/spring-sale").await;
        create(&c, &base, "https://example.com/two", "spring-sale").await;
        assert!(text_of(&c, "#form-error").await.contains("alias_taken"));
        assert_eq!(
            c.find(Locator::Css("#long_url"))
                .await
                .unwrap()
                .prop("value")
                .await
                .unwrap()
                .as_deref(),
            Some("https://example.com/two"),
            "the form keeps what was typed"
        );
        c.goto(&format!("{base}/links")).await.unwrap();
        shot(&c, "links").await;

        // A form post without the CSRF token is refused; with it, accepted.
        let session = c
            .get_named_cookie("lh_session")
            .await
            .unwrap()
            .value()
            .to_string();
        assert_eq!(
            post_with_cookie(
                &base,
                "/links",
                &session,
                &[("long_url", "https://example.com/csrf")]
            ),
            403
        );
        assert_eq!(
            post_with_cookie(
                &base,
                &format!("/links/{code}/disable"),
                &session,
                &[("csrf", "0000")]
            ),
            403
        );
        // The export link: the caller's links as the generic import CSV.
        assert!(c.find(fantoccini::Locator::Css("a[href='/export/links.csv']")).await.is_ok());
        let agent = ureq::AgentBuilder::new().redirects(0).build();
        let export = agent
            .get(&format!("{base}/export/links.csv"))
            .set("Cookie", &format!("lh_session={session}"))
            .call()
            .unwrap();
        assert_eq!(export.status(), 200);
        assert!(export
            .header("content-disposition")
            .is_some_and(|d| d.contains("links.csv")));
        let csv = export.into_string().unwrap();
        assert!(csv.starts_with("code,long_url,created_at,tags,expires_at\n"), "{csv}");
        assert!(csv.contains(&format!("{code},")), "{csv}");
        // Sign out: the old cookie opens nothing.
        sign_out(&c).await;
        let (status, location) = get_with_cookie(&base, "/links", &session);
        assert_eq!((status, location.as_str()), (303, "/signin"));

        // Another owner cannot see the link.
        // Keyboard only: the key field has the focus on arrival, Enter submits.
        c.goto(&format!("{base}/signin")).await.unwrap();
        let focused = c.active_element().await.unwrap();
        focused
            .send_keys(&format!("{other}\u{E007}"))
            .await
            .unwrap();
        wait_path(&c, "/links").await;
        c.goto(&format!("{base}/links/{code}")).await.unwrap();
        assert_eq!(text_of(&c, "h1").await, "Not your link");
        sign_out(&c).await;

        // An operator sees the fleet and can take the link down.
        sign_in(&c, &base, &control.admin_key).await;
        c.goto(&format!("{base}/ops")).await.unwrap();
        assert!(text_of(&c, "#edges").await.contains("connected"));
        shot(&c, "ops").await;
        // Suspend an owner from the page, see it listed, lift it from its row.
        fill(&c, "#suspend-owner", "mallory").await;
        fill(&c, "#suspend-reason", "phishing kit").await;
        click(&c, "#suspend-form button").await;
        wait_text(&c, ".notice", "mallory: suspend").await;
        let owners = text_of(&c, "#owners").await;
        assert!(owners.contains("phishing kit"), "{owners}");
        click(&c, "form[action='/ops/owners/mallory/unsuspend'] button").await;
        wait_text(&c, ".notice", "mallory: unsuspend").await;
        // A report anyone filed is in the review queue and resolved from it.
        let filed = ureq::post(&format!("{}/v1/reports", control.api))
            .send_json(serde_json::json!({"code": code, "reason": "phishing"}));
        assert!(filed.is_ok(), "{filed:?}");
        c.goto(&format!("{base}/ops")).await.unwrap();
        assert!(text_of(&c, "#reports").await.contains(&code));
        click(&c, "#reports button").await;
        wait_text(&c, ".notice", "resolved (takedown)").await;
        c.goto(&format!("{base}/links/{code}")).await.unwrap();
        fill(&c, "#td-reason", "phishing").await;
        click(&c, "form[action$='/takedown'] button").await;
        let start = std::time::Instant::now();
        while !text_of(&c, ".status").await.contains("taken down") {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "the takedown shown"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        c.close().await.unwrap();
        code
    });
    // Sign-in attempts are limited per client address: a run of them ends in 429.
    let limited = (0..12).any(|_| {
        match ureq::post(&format!("{base}/signin")).send_form(&[("key", "x"), ("csrf", "y")]) {
            Err(ureq::Error::Status(429, r)) => r.header("retry-after").is_some(),
            _ => false,
        }
    });
    assert!(limited, "sign-ins are rate-limited");
    wait_until(Duration::from_secs(5), "the takedown at the engine", || {
        lasthop_testkit::status_of(&engine.addr, &format!("/{code}")) == 410
    });
    println!("console screenshots in {}", shots_dir().display());
}
