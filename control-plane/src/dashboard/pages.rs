//! The console's pages (maud templates: compiled into the binary, every interpolated value
//! escaped). They render what the public API answered; nothing here reads the store.

use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;

use super::chart;
use super::{Answer, Session};

/// A line above a page's content: what was done, or why not. An error of the create form
/// keeps what was typed.
pub struct Notice {
    ok: bool,
    text: String,
    form: Option<(String, String, String)>,
}

impl Notice {
    pub fn ok(text: String) -> Notice {
        Notice {
            ok: true,
            text,
            form: None,
        }
    }

    pub fn error(text: String) -> Notice {
        Notice {
            ok: false,
            text,
            form: None,
        }
    }

    pub fn error_with_form(text: String, url: &str, alias: &str, expires: &str) -> Notice {
        Notice {
            ok: false,
            text,
            form: Some((url.to_string(), alias.to_string(), expires.to_string())),
        }
    }
}

fn notice(n: &Option<Notice>) -> Markup {
    html! {
        @if let Some(n) = n {
            @if n.ok {
                p.notice role="status" { (n.text) }
            } @else {
                p.error role="alert" id="form-error" { (n.text) }
            }
        }
    }
}

/// A datetime-local value (`YYYY-MM-DDTHH:MM[:SS]`, read as UTC) as RFC 3339; an RFC 3339
/// value as it is; `None` for anything else.
pub fn expiry_input(s: &str) -> Option<String> {
    let s = s.trim();
    if chrono::DateTime::parse_from_rfc3339(s).is_ok() {
        return Some(s.to_string());
    }
    ["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| chrono::NaiveDateTime::parse_from_str(s, f).ok())
        .map(|t| t.and_utc().format("%Y-%m-%dT%H:%M:%SZ").to_string())
}

/// The page frame: the navigation (with the sign-out form) when signed in.
fn layout(title: &str, session: Option<&Session>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · lasthop" }
                link rel="stylesheet" href="/assets/app.css";
                script src="/assets/app.js" defer {}
            }
            body {
                header {
                    a.brand href="/links" { "lasthop" }
                    @if let Some(s) = session {
                        nav aria-label="Main" {
                            a href="/links" { "Links" }
                            a href="/domains" { "Domains" }
                            @if s.admin { a href="/ops" { "Operators" } }
                        }
                        span.muted { "Signed in as " strong { (s.owner) } @if s.admin { " (admin)" } }
                        form method="post" action="/signout" {
                            input type="hidden" name="csrf" value=(s.csrf);
                            button.secondary type="submit" { "Sign out" }
                        }
                    }
                }
                main { (content) }
            }
        }
    }
}

/// A page with a title and one paragraph.
pub fn message(session: Option<&Session>, title: &str, text: &str) -> Markup {
    layout(
        title,
        session,
        html! {
            h1 { (title) }
            p { (text) }
            p { a href="/links" { "Back to your links" } }
        },
    )
}

/// The sign-in form.
pub fn signin(csrf: &str, error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form method="post" action="/signin" {
                input type="hidden" name="csrf" value=(csrf);
                label for="key" { "API key" }
                input #key type="password" name="key" required autocomplete="current-password" autofocus;
                p.muted { "Your key stays on the server; the browser keeps only a session cookie." }
                button type="submit" { "Sign in" }
            }
        },
    )
}

fn status_badge(status: &str) -> Markup {
    html! { span class={"status status-" (status)} { (status.replace('_', " ")) } }
}

fn text<'a>(v: &'a Value, field: &str) -> &'a str {
    v[field].as_str().unwrap_or_default()
}

/// The owner's links with the search box, the create form and the pager.
pub fn links(
    session: &Session,
    links: &[Value],
    domains: &[String],
    q: &str,
    tag: &str,
    next: Option<&str>,
    n: Option<Notice>,
) -> Markup {
    let (url, alias, expires) = n.as_ref().and_then(|n| n.form.clone()).unwrap_or_default();
    layout(
        "Links",
        Some(session),
        html! {
            h1 { "Your links" }
            p { "Export every link: " a href="/export/links.csv" download { "CSV" } " (the import format: "
                code { "lasthop-control links import --from csv" } ") · "
                a href="/export/links.ndjson" download { "NDJSON" } }
            (notice(&n))
            form method="post" action="/links" aria-describedby=[n.as_ref().filter(|n| !n.ok).map(|_| "form-error")] {
                fieldset {
                    legend { "Shorten a link" }
                    input type="hidden" name="csrf" value=(session.csrf);
                    label for="long_url" { "Destination URL" }
                    input #long_url type="url" name="long_url" required value=(url) placeholder="https://example.com/page";
                    @if !domains.is_empty() {
                        label for="domain" { "Domain" }
                        select #domain name="domain" {
                            option value="" { "Default domain" }
                            @for d in domains { option value=(d) { (d) } }
                        }
                    }
                    label for="alias" { "Custom alias (optional)" }
                    input #alias type="text" name="alias" value=(alias) pattern="[A-Za-z0-9_-]*" placeholder="spring-sale";
                    label for="expires_at" { "Expires (optional, UTC)" }
                    input #expires_at type="datetime-local" name="expires_at" value=(expires);
                    p { button #create type="submit" { "Create" } }
                }
            }
            form method="get" action="/links" role="search" {
                label for="q" { "Search by code, alias or destination" }
                input #q type="search" name="q" value=(q);
                label for="tag" { "Tag" }
                input #tag type="text" name="tag" value=(tag) pattern="[a-z0-9_-]*" placeholder="spring";
                " " button.secondary type="submit" { "Search" }
            }
            @if links.is_empty() {
                p.muted { @if q.is_empty() && tag.is_empty() { "No links yet." } @else { "No link matches." } }
            } @else {
                table #links {
                    caption.visually-hidden { "Your links, newest first" }
                    thead { tr { th { "Code" } th { "Short URL" } th { "Destination" } th { "Status" } th { "Tags" } th { "Created" } th { "Expires" } } }
                    tbody {
                        @for l in links {
                            tr {
                                td { a href={"/links/" (text(l, "ref"))} { (text(l, "code")) } }
                                td.short { (text(l, "short_url")) }
                                td.dest { (text(l, "long_url")) }
                                td { (status_badge(text(l, "status"))) }
                                td.tags { @for t in l["tags"].as_array().into_iter().flatten() {
                                    @if let Some(t) = t.as_str() { a.tag href={"/links?tag=" (t)} { (t) } " " } } }
                                td { (text(l, "created_at")) }
                                td { (l["expires_at"].as_str().unwrap_or("never")) }
                            }
                        }
                    }
                }
            }
            @if let Some(next) = next {
                p { a rel="next" href={"/links?cursor=" (next) @if !tag.is_empty() { "&tag=" (tag) }} { "Older links →" } }
            }
        },
    )
}

/// The branded domains `GET /v1/domains` listed (the default domain first), with their state
/// and certificate, a delete button on each of the caller's, and the form that adds one.
pub fn domains(session: &Session, list: &[Value], n: Option<Notice>) -> Markup {
    layout(
        "Domains",
        Some(session),
        html! {
            h1 { "Domains" }
            (notice(&n))
            form #add-domain method="post" action="/domains" {
                fieldset {
                    legend { "Add a branded domain" }
                    input type="hidden" name="csrf" value=(session.csrf);
                    label for="domain" { "Domain" }
                    input #domain type="text" name="domain" required placeholder="go.example.com" autocomplete="off";
                    p.muted { "Point the name at the fleet. Where automatic certificates (ACME) are on, one is issued and renewed by itself; otherwise upload one (PUT /v1/domains/{domain}/certificate). Until then it is pending." }
                    p { button type="submit" { "Add" } }
                }
            }
            table #domains {
                caption.visually-hidden { "Domains" }
                thead { tr { th { "Domain" } th { "Owner" } th { "Status" } th { "Certificate" } th { span.visually-hidden { "Actions" } } } }
                tbody {
                    @for d in list {
                        @let name = text(d, "domain");
                        tr {
                            td.domain { (name) @if d["default"] == true { " " span.muted { "(default)" } } }
                            td { (d["owner"].as_str().unwrap_or("the fleet")) }
                            td { (status_badge(text(d, "status"))) }
                            td {
                                @if let Some(c) = d["certificate"].as_object() {
                                    (c.get("issuer").and_then(Value::as_str).unwrap_or_default())
                                    ", until "
                                    (c.get("not_after").and_then(Value::as_str).unwrap_or_default())
                                } @else if let Some(error) = d["acme"]["error"].as_str() {
                                    span.acme-error { (error) }
                                    @if let Some(retry) = d["acme"]["next_retry_at"].as_str() {
                                        " " span.muted { "(retried at " (retry) ")" }
                                    }
                                } @else {
                                    span.muted { "none" }
                                }
                            }
                            td {
                                @if d["default"] != true {
                                    form method="post" action={"/domains/" (name) "/delete"} {
                                        input type="hidden" name="csrf" value=(session.csrf);
                                        button.secondary type="submit" aria-label={"Delete " (name)} { "Delete" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// Everything the link page shows.
pub struct LinkPage<'a> {
    pub session: &'a Session,
    pub link: &'a Value,
    pub short: &'a str,
    pub qr: Option<&'a str>,
    pub stats: &'a Answer,
    pub history: &'a Answer,
    pub from: &'a str,
    pub to: &'a str,
    pub notice: Option<Notice>,
}

pub fn link(p: LinkPage<'_>) -> Markup {
    let l = p.link;
    let code = text(l, "code");
    // The console's path segment for the link: its key, encoded (`domain/code` when branded).
    let r = text(l, "ref");
    let status = text(l, "status");
    let s = p.session;
    layout(
        code,
        Some(s),
        html! {
            h1 { "Link " code { (code) } @if let Some(d) = l["domain"].as_str() { " on " (d) } }
            (notice(&p.notice))
            div.grid {
                div {
                    p { "Short URL" br; span.short #short-url { (p.short) } " "
                        button.secondary type="button" data-copy=(p.short) { "Copy" } }
                    p { "Destination" br; span.dest #destination { (l["long_url"].as_str().unwrap_or("(erased)")) }
                        @if let Some(pending) = l["pending_long_url"].as_str() {
                            br; span.muted #pending-destination { "Edited to " (pending) ", served once its safety check passes" } } }
                    p #tags { "Tags "
                        @if l["tags"].as_array().is_none_or(|t| t.is_empty()) { span.muted { "none" } }
                        @for t in l["tags"].as_array().into_iter().flatten() {
                            @if let Some(t) = t.as_str() { a.tag href={"/links?tag=" (t)} { (t) } " " } } }
                    p { "Status " (status_badge(status))
                        @if let Some(r) = l["takedown_reason"].as_str() { " — " (r) } }
                    p { "Created " (text(l, "created_at")) br;
                        "Expires " (l["expires_at"].as_str().unwrap_or("never")) }
                    p #options { "Redirect " (l["redirect_status"].as_u64().unwrap_or(302))
                        ", cached " (match l["cache_seconds"].as_u64() { Some(0) => "never".to_string(), Some(s) => format!("{s} s"), None => "300 s".to_string() })
                        @if l["forward_query"] == true { ", query forwarded (" (text(l, "query_precedence")) " first)" } }
                    p.muted { "Owner " (text(l, "owner")) }
                }
                div.qr {
                    @if let Some(svg) = p.qr {
                        figure {
                            // Generated here from the short URL by the qrcode crate.
                            (PreEscaped(svg))
                            figcaption { "QR code of " (p.short) }
                        }
                    }
                    p { "Download: "
                        @for size in [256, 512, 1024, 2048] {
                            a href={"/links/" (r) "/qr.png?size=" (size) "&download=1"} { "PNG " (size) } " · "
                        }
                        a href={"/links/" (r) "/qr.svg?size=1024&download=1"} { "SVG" }
                    }
                    form method="get" action={"/links/" (r) "/qr.png"} {
                        input type="hidden" name="download" value="1";
                        label for="qr-size" { "PNG of any size (64–2048 px)" }
                        input #qr-size type="number" name="size" min="64" max="2048" value="512";
                        " " button.secondary type="submit" { "Download" }
                    }
                }
            }
            (stats(r, p.stats, p.from, p.to))
            (actions(s, r, status, l))
            h2 { "History" }
            (history(p.history))
        },
    )
}

/// `counts` (an object of name → count) as a table, largest first.
fn counts(title: &str, counts: &Value) -> Markup {
    let mut rows: Vec<(&str, u64)> = counts
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.as_str(), v.as_u64().unwrap_or(0)))
                .collect()
        })
        .unwrap_or_default();
    rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    html! {
        div {
            h3 { (title) }
            @if rows.is_empty() { p.muted { "None." } } @else {
                table {
                    thead { tr { th { "Name" } th.num { "Clicks" } } }
                    tbody { @for (k, v) in rows { tr { td { (k) } td.num { (v) } } } }
                }
            }
        }
    }
}

/// The days from `from` to `to` (`YYYY-MM-DD`), each with its entry in `days` if any.
fn every_day<'a>(from: &str, to: &str, days: &'a [Value]) -> Vec<(String, Option<&'a Value>)> {
    let parse = |s: &str| chrono::NaiveDate::parse_from_str(s, "%Y-%m-%d").ok();
    let (Some(mut d), Some(end)) = (parse(from), parse(to)) else {
        return days
            .iter()
            .map(|v| (text(v, "day").to_string(), Some(v)))
            .collect();
    };
    let mut out = Vec::new();
    while d <= end && out.len() < 400 {
        let label = d.format("%Y-%m-%d").to_string();
        let found = days.iter().find(|v| text(v, "day") == label);
        out.push((label, found));
        match d.succ_opt() {
            Some(next) => d = next,
            None => break,
        }
    }
    out
}

fn stats(code: &str, stats: &Answer, from: &str, to: &str) -> Markup {
    html! {
        h2 { "Clicks" }
        form method="get" action={"/links/" (code)} {
            div.actions {
                div { label for="from" { "From" } input #from type="date" name="from" value=(from); }
                div { label for="to" { "To" } input #to type="date" name="to" value=(to); }
                div { button.secondary type="submit" { "Show" } }
            }
        }
        div #stats-live data-refresh="10" {
        @if !stats.ok() {
            p.error { "Stats unavailable: " (stats.error()) }
        } @else {
            @let v = &stats.body;
            @let days = v["days"].as_array().cloned().unwrap_or_default();
            @let all = every_day(text(v, "from"), text(v, "to"), &days);
            p.muted { "From " (text(v, "from")) " to " (text(v, "to")) " (UTC days)." }
            div.grid #figures {
                div.figure { div.value #human-clicks { (v["clicks"].as_u64().unwrap_or(0)) } div { "human clicks" } }
                div.figure { div.value #bot-clicks { (v["bot_clicks"].as_u64().unwrap_or(0)) } div { "bot clicks (not counted)" } }
                div.figure { div.value #visitor-days { (v["visitor_days"].as_u64().unwrap_or(0)) }
                    div { "visitor-days (each day's unique visitors, summed: a visitor on two days counts twice)" } }
            }
            @if let Some(regions) = v["regions"].as_object() {
                p.muted { "Regions counted: " (regions.get("answered").map(|a| a.to_string()).unwrap_or_default())
                    @if regions.get("unavailable").and_then(|u| u.as_array()).is_some_and(|u| !u.is_empty()) {
                        "; missing: " (regions["unavailable"].to_string())
                    }
                }
            }
            div.chart #chart {
                @let bars: Vec<chart::Bar<'_>> = all.iter().map(|(d, v)| chart::Bar {
                    label: d,
                    human: v.and_then(|v| v["clicks"].as_u64()).unwrap_or(0),
                    bot: v.and_then(|v| v["bot_clicks"].as_u64()).unwrap_or(0),
                }).collect();
                (chart::bars("Clicks by day, humans and bots", &bars))
                p.legend {
                    span { span.swatch.swatch-human {} "humans" }
                    span { span.swatch.swatch-bot {} "bots" }
                }
            }
            table #days {
                caption.visually-hidden { "Clicks by day" }
                thead { tr { th { "Day" } th.num { "Human clicks" } th.num { "Bot clicks" } th.num { "Unique visitors" } th { "State" } } }
                tbody {
                    @for d in &days {
                        tr {
                            td { (text(d, "day")) }
                            td.num { (d["clicks"].as_u64().unwrap_or(0)) }
                            td.num { (d["bot_clicks"].as_u64().unwrap_or(0)) }
                            td.num { (d["unique_visitors"].as_u64().unwrap_or(0)) }
                            td { (text(d, "state")) }
                        }
                    }
                }
            }
            div.grid {
                (counts("Countries", &v["countries"]))
                (counts("Referrers", &v["referrers"]))
                (counts("Devices", &v["devices"]))
                (counts("Browsers", &v["browsers"]))
                (counts("Operating systems", &v["os"]))
                (counts("Bot clicks by reason", &v["bot_reasons"]))
            }
        }
        }
    }
}

fn action_button(s: &Session, code: &str, action: &str, label: &str, class: &str) -> Markup {
    html! {
        form method="post" action={"/links/" (code) "/" (action)} {
            input type="hidden" name="csrf" value=(s.csrf);
            button class=(class) type="submit" { (label) }
        }
    }
}

fn actions(s: &Session, code: &str, status: &str, l: &Value) -> Markup {
    let current = l["redirect_status"].as_u64().unwrap_or(302);
    let cache = l["cache_seconds"].as_u64().unwrap_or(300);
    let request_first = l["query_precedence"] == "request";
    html! {
        @if status != "deleted" {
            h2 { "Change" }
            div.actions {
                @if status == "disabled" {
                    (action_button(s, code, "enable", "Enable", "secondary"))
                } @else {
                    (action_button(s, code, "disable", "Disable", "secondary"))
                }
                form method="post" action={"/links/" (code) "/expiry"} {
                    input type="hidden" name="csrf" value=(s.csrf);
                    label for="new-expiry" { "New expiry (UTC, empty: never)" }
                    input #new-expiry type="datetime-local" name="expires_at";
                    " " button.secondary type="submit" { "Set expiry" }
                }
                (action_button(s, code, "delete", "Delete", "danger"))
            }
            form #link-destination method="post" action={"/links/" (code) "/destination"} {
                fieldset {
                    legend { "Where it goes" }
                    input type="hidden" name="csrf" value=(s.csrf);
                    label for="new-destination" { "Destination (every engine serves it within a second, after the same checks as a new link's)" }
                    input #new-destination type="url" name="long_url" required value=(l["pending_long_url"].as_str().or(l["long_url"].as_str()).unwrap_or(""));
                    p { button.secondary #save-destination type="submit" { "Change destination" } }
                }
            }
            form #link-tags method="post" action={"/links/" (code) "/tags"} {
                fieldset {
                    legend { "Tags" }
                    input type="hidden" name="csrf" value=(s.csrf);
                    label for="tags-input" { "Up to 10, separated by commas (a-z, 0-9, _ and -)" }
                    input #tags-input type="text" name="tags" value=(l["tags"].as_array().map(|t| t.iter().filter_map(|t| t.as_str()).collect::<Vec<_>>().join(", ")).unwrap_or_default());
                    p { button.secondary #save-tags type="submit" { "Save tags" } }
                }
            }
            form #link-options method="post" action={"/links/" (code) "/options"} {
                fieldset {
                    legend { "How it redirects" }
                    input type="hidden" name="csrf" value=(s.csrf);
                    label for="redirect-status" { "Status" }
                    select #redirect-status name="redirect_status" {
                        @for (v, name) in [(302u64, "302 Found (default)"), (301, "301 Moved Permanently"), (307, "307 Temporary Redirect"), (308, "308 Permanent Redirect")] {
                            option value=(v) selected[v == current] { (name) }
                        }
                    }
                    label for="cache-seconds" { "Browsers may keep it (seconds; 0: never)" }
                    input #cache-seconds type="number" name="cache_seconds" min="0" max="31536000" value=(cache);
                    label { input #forward-query type="checkbox" name="forward_query" checked[l["forward_query"] == true]; " Forward the visitor's query" }
                    label for="query-precedence" { "A parameter in both keeps" }
                    select #query-precedence name="query_precedence" {
                        option value="destination" selected[!request_first] { "the destination's value" }
                        option value="request" selected[request_first] { "the visitor's value" }
                    }
                    p { button.secondary #save-options type="submit" { "Save" } }
                }
            }
            @if s.admin {
                h2 { "Trust and safety" }
                div.actions {
                    form method="post" action={"/links/" (code) "/takedown"} {
                        input type="hidden" name="csrf" value=(s.csrf);
                        label for="td-reason" { "Reason" }
                        input #td-reason type="text" name="reason" required placeholder="phishing";
                        " " button.danger type="submit" { "Take down" }
                    }
                    form method="post" action={"/links/" (code) "/warn"} {
                        input type="hidden" name="csrf" value=(s.csrf);
                        label for="warn-reason" { "Reason" }
                        input #warn-reason type="text" name="reason" required placeholder="suspicious";
                        " " button.secondary type="submit" { "Warn" }
                    }
                    (action_button(s, code, "restore", "Restore", "secondary"))
                }
            }
        }
    }
}

fn history(h: &Answer) -> Markup {
    html! {
        @if !h.ok() {
            p.error { "History unavailable: " (h.error()) }
        } @else {
            table #history {
                thead { tr { th { "When" } th { "Who" } th { "What" } th { "Why" } th { "Region" } } }
                tbody {
                    @for r in h.body["history"].as_array().cloned().unwrap_or_default() {
                        tr {
                            td { (text(&r, "at")) }
                            td { (text(&r, "actor")) }
                            td { (text(&r, "action")) @if let Some(u) = r["undid"].as_str() { " (lifted " (u) ")" } }
                            td { (r["reason"].as_str().unwrap_or("")) }
                            td { (r["origin"]["region"].as_u64().map(|n| n.to_string()).unwrap_or_default()) }
                        }
                    }
                }
            }
        }
    }
}

/// The operators' page.
pub fn ops(
    s: &Session,
    edges: &Answer,
    regions: &Answer,
    reports: &Answer,
    owners: &Answer,
    n: Option<Notice>,
) -> Markup {
    let mut engines = edges.body["edges"].as_array().cloned().unwrap_or_default();
    engines.sort_by(|a, b| {
        text(a, "pop")
            .cmp(text(b, "pop"))
            .then(text(a, "engine").cmp(text(b, "engine")))
    });
    let peers = regions.body["peers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    layout(
        "Operators",
        Some(s),
        html! {
            h1 { "Operators" }
            (notice(&n))
            form method="get" action="/ops/go" {
                label for="go-code" { "Open a link by code or short URL" }
                input #go-code type="text" name="code" required;
                " " button.secondary type="submit" { "Open" }
            }
            h2 { "Edge fleet" }
            @if !edges.ok() { p.error { (edges.error()) } }
            @else if engines.is_empty() { p.muted { "No engine has reported." } }
            @else {
                p.muted { "Change log head: " (edges.body["last_seq"].as_u64().unwrap_or(0)) }
                table #edges {
                    thead { tr { th { "PoP" } th { "Engine" } th { "State" } th.num { "Applied" } th.num { "Lag (changes)" } th.num { "Lag (s)" } th { "Feed" } th { "Safe mode" } } }
                    tbody { @for e in &engines { tr {
                        td { (text(e, "pop")) } td { (text(e, "engine")) } td { (text(e, "state")) }
                        td.num { (e["applied_seq"].as_u64().unwrap_or(0)) }
                        td.num { (e["lag_seq"].as_u64().unwrap_or(0)) }
                        td.num { (format!("{:.1}", e["lag_seconds"].as_f64().unwrap_or(0.0))) }
                        td { @if e["feed_connected"].as_bool().unwrap_or(false) { "connected" } @else { "lost" } }
                        td { @if e["safe_mode"].as_bool().unwrap_or(false) { strong { "SAFE MODE" } } @else { "no" } }
                    } } }
                }
            }
            @if !peers.is_empty() {
                h2 { "Regions" }
                p.muted { "This is region " (regions.body["region"].as_u64().unwrap_or(0)) " of " (regions.body["regions"].as_u64().unwrap_or(1)) "." }
                table #regions {
                    thead { tr { th { "Region" } th { "Connected" } th.num { "Applied" } th.num { "Head" } th.num { "Lag (changes)" } th.num { "Lag (s)" } th { "Alarm" } } }
                    tbody { @for p in &peers { tr {
                        td { (p["region"].as_u64().unwrap_or(0)) " " span.muted { (text(p, "url")) } }
                        td { @if p["connected"].as_bool().unwrap_or(false) { "yes" } @else { strong { "no" } } }
                        td.num { (p["applied_seq"].as_u64().unwrap_or(0)) }
                        td.num { (p["head_seq"].as_u64().unwrap_or(0)) }
                        td.num { (p["lag_changes"].as_u64().unwrap_or(0)) }
                        td.num { (format!("{:.1}", p["lag_seconds"].as_f64().unwrap_or(0.0))) }
                        td { @if p["alarm"].as_bool().unwrap_or(false) { strong { "ALARM" } } @else { "ok" } }
                    } } }
                }
            }
            h2 { "Review queue" }
            @if !reports.ok() { p.error { (reports.error()) } }
            @else {
                @let open = reports.body["reports"].as_array().cloned().unwrap_or_default();
                @if open.is_empty() { p.muted { "No open reports." } } @else {
                    table #reports {
                        thead { tr { th { "#" } th { "Link" } th { "Kind" } th { "Reason" } th { "Received" } th { "Resolve" } } }
                        tbody { @for r in &open {
                            @let id = r["id"].as_u64().unwrap_or(0);
                            tr {
                                td { (id) }
                                td { a href={"/links/" (text(r, "ref"))} { (text(r, "code")) @if let Some(d) = r["domain"].as_str() { " on " (d) } } }
                                td { (text(r, "kind")) }
                                td { (text(r, "reason")) @if let Some(d) = r["details"].as_str() { br; span.muted { (d) } } }
                                td { (text(r, "created_at")) }
                                td {
                                    form method="post" action={"/ops/reports/" (id)} {
                                        input type="hidden" name="csrf" value=(s.csrf);
                                        label for={"act-" (id)} class="visually-hidden" { "Action for report " (id) }
                                        select id={"act-" (id)} name="action" {
                                            option value="takedown" { "Take down" }
                                            option value="warn" { "Warn" }
                                            option value="restore" { "Restore" }
                                            option value="dismiss" { "Dismiss" }
                                        }
                                        label for={"why-" (id)} class="visually-hidden" { "Reason for report " (id) }
                                        input id={"why-" (id)} type="text" name="reason" placeholder="reason";
                                        " " button.secondary type="submit" { "Resolve" }
                                    }
                                }
                            }
                        } }
                    }
                }
            }
            h2 { "Owners" }
            @if !owners.ok() { p.error { (owners.error()) } }
            @else {
                @let list = owners.body["owners"].as_array().cloned().unwrap_or_default();
                @if list.is_empty() { p.muted { "No owner is flagged or suspended." } }
                @else {
                    table #owners {
                        thead { tr { th { "Owner" } th { "Flagged" } th { "Suspended" } th { "Act" } } }
                        tbody { @for o in &list {
                            @let name = text(o, "owner");
                            tr {
                                td { (name) }
                                td { @if o["flagged"] == true { (o["flag"]["reason"].as_str().unwrap_or("yes")) } @else { "no" } }
                                td { @if o["suspended"] == true { (o["suspension"]["reason"].as_str().unwrap_or("yes")) } @else { "no" } }
                                td { div.actions {
                                    @if o["suspended"] == true {
                                        form method="post" action={"/ops/owners/" (name) "/unsuspend"} {
                                            input type="hidden" name="csrf" value=(s.csrf);
                                            button.secondary type="submit" { "Unsuspend" }
                                        }
                                    } @else {
                                        form method="post" action={"/ops/owners/" (name) "/suspend"} {
                                            input type="hidden" name="csrf" value=(s.csrf);
                                            label for={"suspend-why-" (name)} class="visually-hidden" { "Reason to suspend " (name) }
                                            input id={"suspend-why-" (name)} type="text" name="reason" required placeholder="reason";
                                            input id={"suspend-links-" (name)} type="checkbox" name="takedown_links" value="1";
                                            label.inline for={"suspend-links-" (name)} { " their links too " }
                                            button.danger type="submit" { "Suspend" }
                                        }
                                    }
                                    @if o["flagged"] == true {
                                        form method="post" action={"/ops/owners/" (name) "/unflag"} {
                                            input type="hidden" name="csrf" value=(s.csrf);
                                            button.secondary type="submit" { "Clear flag" }
                                        }
                                    }
                                } }
                            }
                        } }
                    }
                }
            }
            h2 { "Suspend an owner" }
            form method="post" action="/ops/owners/_/suspend" #suspend-form {
                input type="hidden" name="csrf" value=(s.csrf);
                p.muted { "Their keys stop working at once in every region; with the box ticked, every link they made is taken down too (an unsuspension restores exactly those)." }
                label for="suspend-owner" { "Owner" }
                input #suspend-owner type="text" name="owner" required;
                label for="suspend-reason" { "Reason" }
                input #suspend-reason type="text" name="reason" required;
                p { input #suspend-takedown type="checkbox" name="takedown_links" value="1";
                    label.inline for="suspend-takedown" { " Take down their links" } }
                button.danger type="submit" { "Suspend" }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_inputs() {
        assert_eq!(
            expiry_input("2027-01-02T03:04").as_deref(),
            Some("2027-01-02T03:04:00Z")
        );
        assert_eq!(
            expiry_input("2027-01-02T03:04:05Z").as_deref(),
            Some("2027-01-02T03:04:05Z")
        );
        assert_eq!(expiry_input("tomorrow"), None);
    }

    #[test]
    fn every_day_fills_the_range() {
        let days = vec![serde_json::json!({"day": "2026-03-02", "clicks": 1})];
        let all = every_day("2026-03-01", "2026-03-03", &days);
        let labels: Vec<&str> = all.iter().map(|(d, _)| d.as_str()).collect();
        assert_eq!(labels, ["2026-03-01", "2026-03-02", "2026-03-03"]);
        assert!(all[1].1.is_some() && all[0].1.is_none());
    }
}
