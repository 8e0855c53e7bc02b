//! The console (`serve --dashboard-listen ADDR`): server-rendered pages for link owners and
//! operators, on a listener of its own (docs/ARCHITECTURE.md, "Listeners and API").
//!
//! Every page is HTML rendered here (maud: templates compiled into the binary, every value
//! escaped); the one script (`/assets/app.js`) only adds a copy button and refreshes a link's
//! clicks every 10 s, so everything but that refresh works with JavaScript off. The console holds no data and no rules of its own: each page calls the public
//! API in-process (the same router, with the signed-in key as `Authorization`), so it shows
//! exactly what the API allows and its errors (alias taken, blocked destination, rate limited)
//! as the API words them.
//!
//! SESSIONS: signing in posts an API key; it is checked with `GET /v1/me` and kept server-side,
//! the browser getting only a random session id in an `HttpOnly; SameSite=Strict` cookie
//! (`Secure` when the request came over HTTPS, `X-Forwarded-Proto: https`). Sessions end after
//! [`SESSION_TTL_MS`], on sign-out, and as soon as the key stops authenticating (revoked, its
//! owner suspended): every page re-checks it. Every form carries a CSRF token (the session's;
//! the sign-in form's is a double-submit cookie), compared in constant time; a post without it
//! is refused (403). Sign-in attempts are rate-limited per client address. Every answer carries
//! a strict Content-Security-Policy (no inline script or style, nothing from elsewhere),
//! `X-Frame-Options: DENY`, `Referrer-Policy: no-referrer` and `Cache-Control: no-store`.

mod chart;
mod pages;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use serde_json::{json, Value};
use tower::ServiceExt as _;

use crate::api::AppState;
use crate::clock::now_ms;
use crate::ratelimit::RateLimiter;

/// How long a session lasts from sign-in.
pub const SESSION_TTL_MS: i64 = 8 * 3600 * 1000;
/// Most live sessions kept (the oldest go first past it).
const MAX_SESSIONS: usize = 10_000;
/// The session cookie and the sign-in form's CSRF cookie.
const SESSION_COOKIE: &str = "lh_session";
const SIGNIN_COOKIE: &str = "lh_signin";
/// Largest form body.
const FORM_MAX: usize = 16 * 1024;
/// Sign-in attempts per client address: a burst of 5, then one every 6 seconds.
const SIGNIN_RATE: f64 = 1.0 / 6.0;
const SIGNIN_BURST: f64 = 5.0;
/// Links per page of the list; links searched at most per search.
const PAGE: usize = 25;
const SEARCH_SCAN: usize = 5_000;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/// Who is signed in.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    key: String,
    pub(crate) owner: String,
    pub(crate) admin: bool,
    pub(crate) csrf: String,
    expires_ms: i64,
}

struct Inner {
    api: Router,
    /// Base of the short URLs (`--short-base`).
    short_base: String,
    /// The default domain's name (`--short-base`'s host).
    default_domain: Option<String>,
    sessions: Mutex<HashMap<String, Session>>,
    signins: RateLimiter,
}

/// The console's state.
#[derive(Clone)]
pub struct Dashboard(Arc<Inner>);

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard").finish_non_exhaustive()
    }
}

/// The console's router over the public API of `state`, showing short URLs under
/// `short_base`. Serve it with connect info (sign-ins are limited per client address).
pub fn router(state: AppState, short_base: String) -> Router {
    let dash = Dashboard(Arc::new(Inner {
        api: crate::api::router(state),
        default_domain: crate::api::domains::host_of(&short_base),
        short_base,
        sessions: Mutex::new(HashMap::new()),
        signins: RateLimiter::new(SIGNIN_RATE, SIGNIN_BURST),
    }));
    Router::new()
        .route("/", get(|| async { Redirect::to("/links") }))
        .route("/signin", get(signin_page).post(signin))
        .route("/signout", post(signout))
        .route("/links", get(links).post(create))
        .route("/links/{code}", get(link))
        .route("/export/{file}", get(export))
        .route("/links/{code}/qr.svg", get(qr_svg))
        .route("/links/{code}/qr.png", get(qr_png))
        .route("/links/{code}/{action}", post(link_action))
        .route("/domains", get(domains).post(add_domain))
        .route("/domains/{domain}/delete", post(delete_domain))
        .route("/ops", get(ops))
        .route("/ops/reports/{id}", post(resolve_report))
        .route("/ops/owners/{owner}/{action}", post(owner_action))
        .route("/ops/go", get(go_to_code))
        .route("/assets/app.css", get(css))
        .route("/assets/app.js", get(js))
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(not_found)
        .layer(axum::middleware::from_fn(security_headers))
        .with_state(dash)
}

/// The headers every answer carries.
async fn security_headers(req: Request, next: Next) -> Response {
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", include_str!("assets/app.css"))
}

async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/app.js"),
    )
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("public, max-age=3600"),
            ),
        ],
        body,
    )
        .into_response()
}

async fn not_found() -> Response {
    html(
        StatusCode::NOT_FOUND,
        pages::message(None, "Not found", "There is no such page."),
    )
}

fn html(status: StatusCode, markup: maud::Markup) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        markup.into_string(),
    )
        .into_response()
}

/// 32 random bytes, hex.
fn token() -> String {
    let mut b = [0u8; 32];
    // Without the OS's randomness no session can be made safely: fail loudly.
    getrandom::getrandom(&mut b).expect("the OS random number generator failed");
    hex::encode(b)
}

/// Whether `a` and `b` are equal, in time independent of where they differ.
fn same(a: &str, b: &str) -> bool {
    use subtle::ConstantTimeEq as _;
    a.as_bytes().ct_eq(b.as_bytes()).into()
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|c| c.trim().split_once('='))
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v)
}

/// Whether the browser reached us over HTTPS (directly behind a TLS-terminating proxy).
fn over_https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn set_cookie(name: &str, value: &str, max_age_s: i64, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{name}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={max_age_s}{secure}"
    ))
    .unwrap_or_else(|_| HeaderValue::from_static("lh_invalid=; Max-Age=0"))
}

fn to_signin() -> Response {
    Redirect::to("/signin").into_response()
}

/// A form body, decoded; `None` when it is not one.
fn form<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Option<T> {
    serde_urlencoded::from_bytes(bytes).ok()
}

async fn body_of(req: Request) -> Option<Bytes> {
    axum::body::to_bytes(req.into_body(), FORM_MAX).await.ok()
}

fn client(req: &Request) -> Option<SocketAddr> {
    req.extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0)
}

/// An answer of the API, as the console reads it.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Value,
}

impl Answer {
    pub(crate) fn ok(&self) -> bool {
        self.status.is_success()
    }

    /// The API's error message, with its code.
    pub(crate) fn error(&self) -> String {
        let e = &self.body["error"];
        match (e["message"].as_str(), e["code"].as_str()) {
            (Some(m), Some(c)) => format!("{m} ({c})"),
            _ => format!("the request failed ({})", self.status),
        }
    }
}

impl Dashboard {
    /// One request to the public API as `key`, in process.
    async fn call_raw(
        &self,
        method: Method,
        path: &str,
        key: &str,
        body: Option<Value>,
        peer: Option<SocketAddr>,
    ) -> (StatusCode, HeaderMap, Bytes) {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::AUTHORIZATION, format!("Bearer {key}"));
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let Ok(mut req) = req.body(match body {
            Some(b) => Body::from(b.to_string()),
            None => Body::empty(),
        }) else {
            return (StatusCode::BAD_REQUEST, HeaderMap::new(), Bytes::new());
        };
        if let Some(peer) = peer {
            req.extensions_mut().insert(ConnectInfo(peer));
        }
        let Ok(resp) = self.0.api.clone().oneshot(req).await;
        let (parts, body) = resp.into_parts();
        let bytes = axum::body::to_bytes(body, 64 * 1024 * 1024)
            .await
            .unwrap_or_default();
        (parts.status, parts.headers, bytes)
    }

    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        session: &Session,
        body: Option<Value>,
    ) -> Answer {
        let (status, _, bytes) = self.call_raw(method, path, &session.key, body, None).await;
        Answer {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        }
    }

    /// The session behind the request's cookie, if it is live and its key still works.
    async fn session(&self, headers: &HeaderMap) -> Option<Session> {
        let id = cookie(headers, SESSION_COOKIE)?;
        let found = {
            let mut sessions = self.0.sessions.lock().ok()?;
            let now = now_ms();
            match sessions.get(id) {
                Some(s) if s.expires_ms > now => Some(s.clone()),
                Some(_) => {
                    sessions.remove(id);
                    None
                }
                None => None,
            }
        }?;
        // The key may have been revoked, or its owner suspended, since: ask the API again.
        let me = self.call(Method::GET, "/v1/me", &found, None).await;
        if me.ok() {
            Some(found)
        } else {
            if let Ok(mut sessions) = self.0.sessions.lock() {
                sessions.remove(id);
            }
            None
        }
    }

    fn start_session(&self, key: String, owner: String, admin: bool) -> String {
        let id = token();
        let session = Session {
            key,
            owner,
            admin,
            csrf: token(),
            expires_ms: now_ms() + SESSION_TTL_MS,
        };
        if let Ok(mut sessions) = self.0.sessions.lock() {
            let now = now_ms();
            sessions.retain(|_, s| s.expires_ms > now);
            if sessions.len() >= MAX_SESSIONS {
                if let Some(oldest) = sessions
                    .iter()
                    .min_by_key(|(_, s)| s.expires_ms)
                    .map(|(k, _)| k.clone())
                {
                    sessions.remove(&oldest);
                }
            }
            sessions.insert(id.clone(), session);
        }
        id
    }

    /// A link's short URL by its key: the short base, or `https://DOMAIN/CODE` on a branded
    /// domain (as the API's `short_url`).
    fn short_url(&self, key: &str) -> String {
        match lasthop_core::split_key_str(key) {
            (Some(domain), code) => format!("https://{domain}/{code}"),
            (None, code) => format!("{}/{code}", self.0.short_base),
        }
    }

    /// A link's key from the API's view of it (`code`, `domain`): `domain/code` on a branded
    /// domain, the code on the default one. The console's `/links/{key}` names links by it.
    fn key_of(&self, l: &Value) -> String {
        let code = l["code"].as_str().unwrap_or_default();
        match l["domain"].as_str() {
            Some(d) if !d.is_empty() && Some(d) != self.0.default_domain.as_deref() => {
                lasthop_core::link_key(Some(d), code)
            }
            _ => code.to_string(),
        }
    }

    /// Adds `ref` (the link's key, encoded for a console path) to each link value.
    fn with_refs(&self, links: &mut [Value]) {
        for l in links {
            let key = self.key_of(l);
            l["ref"] = json!(urlencode(&key));
        }
    }

    /// The branded domains the signed-in key may make links on, by name (active or pending).
    async fn domain_names(&self, session: &Session) -> Vec<String> {
        let answer = self.call(Method::GET, "/v1/domains", session, None).await;
        answer.body["domains"]
            .as_array()
            .map(|ds| {
                ds.iter()
                    .filter(|d| d["status"] != "suspended" && d["default"] != true)
                    .filter_map(|d| d["domain"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }
}

async fn signin_page(headers: HeaderMap) -> Response {
    signin_form(&headers, StatusCode::OK, None)
}

/// The sign-in form with a fresh double-submit CSRF token (and `error` above it).
fn signin_form(headers: &HeaderMap, status: StatusCode, error: Option<&str>) -> Response {
    let csrf = token();
    let mut resp = html(status, pages::signin(&csrf, error));
    resp.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(SIGNIN_COOKIE, &csrf, 3600, over_https(headers)),
    );
    resp
}

#[derive(Deserialize)]
struct SigninForm {
    key: String,
    csrf: String,
}

async fn signin(State(dash): State<Dashboard>, req: Request) -> Response {
    let peer = client(&req);
    let headers = req.headers().clone();
    let where_from = peer.map_or_else(|| "unknown".to_string(), |p| p.ip().to_string());
    if let Err(wait) = dash.0.signins.check(&where_from, Instant::now()) {
        tracing::warn!(client = %where_from, "console sign-in rate-limited");
        let mut resp = signin_form(
            &headers,
            StatusCode::TOO_MANY_REQUESTS,
            Some(&format!(
                "Too many sign-in attempts from your address; try again in {wait} s."
            )),
        );
        if let Ok(v) = HeaderValue::from_str(&wait.to_string()) {
            resp.headers_mut().insert(header::RETRY_AFTER, v);
        }
        return resp;
    }
    let Some(f) = body_of(req).await.and_then(|b| form::<SigninForm>(&b)) else {
        return signin_form(&headers, StatusCode::BAD_REQUEST, Some("Enter an API key."));
    };
    let expected = cookie(&headers, SIGNIN_COOKIE).unwrap_or_default();
    if expected.is_empty() || !same(expected, &f.csrf) {
        return forbidden();
    }
    let key = f.key.trim().to_string();
    let (status, _, bytes) = dash.call_raw(Method::GET, "/v1/me", &key, None, peer).await;
    let me: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    if !status.is_success() {
        let answer = Answer { status, body: me };
        return signin_form(
            &headers,
            StatusCode::UNAUTHORIZED,
            Some(&format!("That key does not sign in: {}", answer.error())),
        );
    }
    let owner = me["owner"].as_str().unwrap_or_default().to_string();
    let admin = me["admin"].as_bool().unwrap_or(false);
    tracing::info!(%owner, admin, key_id = me["key_id"].as_str().unwrap_or_default(), "console sign-in");
    let id = dash.start_session(key, owner, admin);
    let secure = over_https(&headers);
    let mut resp = Redirect::to("/links").into_response();
    let h = resp.headers_mut();
    h.append(
        header::SET_COOKIE,
        set_cookie(SESSION_COOKIE, &id, SESSION_TTL_MS / 1000, secure),
    );
    h.append(header::SET_COOKIE, set_cookie(SIGNIN_COOKIE, "", 0, secure));
    resp
}

fn forbidden() -> Response {
    html(
        StatusCode::FORBIDDEN,
        pages::message(
            None,
            "Refused",
            "This form was not sent from the console page it belongs to (its security token is missing or wrong). Go back, reload the page and try again.",
        ),
    )
}

#[derive(Deserialize)]
struct CsrfForm {
    csrf: String,
}

/// The session of a form post whose CSRF token is the session's, or the answer to send.
async fn posted<T: serde::de::DeserializeOwned>(
    dash: &Dashboard,
    req: Request,
) -> Result<(Session, T), Response> {
    let headers = req.headers().clone();
    let Some(session) = dash.session(&headers).await else {
        return Err(to_signin());
    };
    let Some(bytes) = body_of(req).await else {
        return Err(forbidden());
    };
    let Some(token) = form::<CsrfForm>(&bytes) else {
        return Err(forbidden());
    };
    if !same(&token.csrf, &session.csrf) {
        tracing::warn!(owner = %session.owner, "console form without its CSRF token refused");
        return Err(forbidden());
    }
    let Some(parsed) = form::<T>(&bytes) else {
        return Err(html(
            StatusCode::BAD_REQUEST,
            pages::message(
                Some(&session),
                "Bad form",
                "The form's fields are malformed.",
            ),
        ));
    };
    Ok((session, parsed))
}

async fn signout(State(dash): State<Dashboard>, req: Request) -> Response {
    let headers = req.headers().clone();
    let secure = over_https(&headers);
    let Ok((session, _)) = posted::<CsrfForm>(&dash, req).await else {
        return to_signin();
    };
    if let Ok(mut sessions) = dash.0.sessions.lock() {
        sessions.retain(|_, s| s.csrf != session.csrf);
    }
    tracing::info!(owner = %session.owner, "console sign-out");
    let mut resp = Redirect::to("/signin").into_response();
    resp.headers_mut().append(
        header::SET_COOKIE,
        set_cookie(SESSION_COOKIE, "", 0, secure),
    );
    resp
}

#[derive(Deserialize, Default)]
struct ListQuery {
    #[serde(default)]
    q: Option<String>,
    #[serde(default)]
    cursor: Option<String>,
    /// Only links with this tag.
    #[serde(default)]
    tag: Option<String>,
}

/// The owner's links, newest first, a page at a time; with `q`, those whose code or
/// destination contains it (case-insensitive), among the newest [`SEARCH_SCAN`].
async fn links(
    State(dash): State<Dashboard>,
    Query(q): Query<ListQuery>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = dash.session(&headers).await else {
        return to_signin();
    };
    links_page(&dash, &session, q, None, StatusCode::OK).await
}

async fn links_page(
    dash: &Dashboard,
    session: &Session,
    q: ListQuery,
    notice: Option<pages::Notice>,
    status: StatusCode,
) -> Response {
    let search =
        q.q.as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_lowercase);
    let mut shown: Vec<Value> = Vec::new();
    let mut cursor = q.cursor.clone().filter(|c| !c.is_empty());
    let mut next = None;
    let mut scanned = 0;
    let tag = q.tag.as_deref().map(str::trim).filter(|t| !t.is_empty());
    loop {
        let limit = if search.is_some() { 100 } else { PAGE };
        let mut path = format!("/v1/links?limit={limit}");
        if let Some(t) = &tag {
            path.push_str(&format!("&tag={}", urlencode(t)));
        }
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={}", urlencode(c)));
        }
        let page = dash.call(Method::GET, &path, session, None).await;
        if !page.ok() {
            return html(
                page.status,
                pages::message(Some(session), "Links unavailable", &page.error()),
            );
        }
        let batch = page.body["links"].as_array().cloned().unwrap_or_default();
        scanned += batch.len();
        cursor = page.body["next_cursor"].as_str().map(str::to_string);
        match &search {
            None => {
                shown = batch;
                next = cursor;
                break;
            }
            Some(s) => {
                shown.extend(batch.into_iter().filter(|l| {
                    ["code", "long_url"].iter().any(|f| {
                        l[*f]
                            .as_str()
                            .is_some_and(|v| v.to_lowercase().contains(s.as_str()))
                    })
                }));
                if shown.len() >= PAGE * 2 || cursor.is_none() || scanned >= SEARCH_SCAN {
                    shown.truncate(PAGE * 2);
                    break;
                }
            }
        }
    }
    dash.with_refs(&mut shown);
    let domains = dash.domain_names(session).await;
    html(
        status,
        pages::links(
            session,
            &shown,
            &domains,
            q.q.as_deref().unwrap_or_default(),
            tag.unwrap_or_default(),
            next.as_deref(),
            notice,
        ),
    )
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// The API path of the link with key `key`: `/v1/links/{code}{suffix}`, `?domain=` naming a
/// branded one, then `query` (pairs already encoded, without `?`).
fn api_link(key: &str, suffix: &str, query: &str) -> String {
    let (domain, code) = lasthop_core::split_key_str(key);
    let mut path = format!("/v1/links/{}{suffix}", urlencode(code));
    let mut sep = '?';
    if let Some(domain) = domain {
        path.push_str(&format!("?domain={}", urlencode(domain)));
        sep = '&';
    }
    if !query.is_empty() {
        path.push(sep);
        path.push_str(query);
    }
    path
}

#[derive(Deserialize)]
struct CreateForm {
    long_url: String,
    #[serde(default)]
    alias: String,
    /// A branded domain, or empty for the default domain.
    #[serde(default)]
    domain: String,
    /// `YYYY-MM-DDTHH:MM` (a datetime-local input, UTC) or empty.
    #[serde(default)]
    expires_at: String,
}

/// Creates a link through `POST /v1/links`; the API's error is shown above the form, with the
/// form as it was sent.
async fn create(State(dash): State<Dashboard>, req: Request) -> Response {
    let (session, f) = match posted::<CreateForm>(&dash, req).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let mut body = json!({"long_url": f.long_url.trim()});
    if !f.alias.trim().is_empty() {
        body["alias"] = json!(f.alias.trim());
    }
    if !f.domain.trim().is_empty() {
        body["domain"] = json!(f.domain.trim());
    }
    if !f.expires_at.trim().is_empty() {
        match pages::expiry_input(&f.expires_at) {
            Some(at) => body["expires_at"] = json!(at),
            None => {
                let notice = pages::Notice::error_with_form(
                    "The expiry must be a date and time (UTC).".into(),
                    &f.long_url,
                    &f.alias,
                    &f.expires_at,
                );
                return links_page(
                    &dash,
                    &session,
                    ListQuery::default(),
                    Some(notice),
                    StatusCode::BAD_REQUEST,
                )
                .await;
            }
        }
    }
    let answer = dash
        .call(Method::POST, "/v1/links", &session, Some(body))
        .await;
    if answer.ok() {
        let key = dash.key_of(&answer.body);
        return Redirect::to(&format!("/links/{}?created=1", urlencode(&key))).into_response();
    }
    let notice =
        pages::Notice::error_with_form(answer.error(), &f.long_url, &f.alias, &f.expires_at);
    links_page(
        &dash,
        &session,
        ListQuery::default(),
        Some(notice),
        answer.status,
    )
    .await
}

#[derive(Deserialize, Default)]
struct LinkQuery {
    #[serde(default)]
    from: Option<String>,
    #[serde(default)]
    to: Option<String>,
    #[serde(default)]
    created: Option<String>,
    #[serde(default)]
    done: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// One link: its facts, short URL and QR code, its clicks for a range, its history, and what
/// the signed-in key may do to it.
async fn link(
    State(dash): State<Dashboard>,
    Path(code): Path<String>,
    Query(q): Query<LinkQuery>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = dash.session(&headers).await else {
        return to_signin();
    };
    let mut found = dash
        .call(Method::GET, &api_link(&code, "", ""), &session, None)
        .await;
    if !found.ok() {
        let title = match found.status {
            StatusCode::NOT_FOUND => "No such link",
            StatusCode::FORBIDDEN => "Not your link",
            _ => "Link unavailable",
        };
        return html(
            found.status,
            pages::message(Some(&session), title, &found.error()),
        );
    }
    found.body["ref"] = json!(urlencode(&code));
    let mut range = String::new();
    for (name, v) in [("from", &q.from), ("to", &q.to)] {
        if let Some(v) = v.as_deref().filter(|v| !v.is_empty()) {
            if !range.is_empty() {
                range.push('&');
            }
            range.push_str(&format!("{name}={}", urlencode(v)));
        }
    }
    let stats = dash
        .call(
            Method::GET,
            &api_link(&code, "/stats", &range),
            &session,
            None,
        )
        .await;
    let history = dash
        .call(
            Method::GET,
            &api_link(&code, "/history", ""),
            &session,
            None,
        )
        .await;
    let short = dash.short_url(&code);
    let qr = crate::qr::svg(&short, 192).ok();
    let notice = if q.created.is_some() {
        Some(pages::Notice::ok("Link created.".into()))
    } else if let Some(done) = q.done.as_deref() {
        Some(pages::Notice::ok(format!("Done: {done}.")))
    } else {
        q.error.as_deref().map(|e| pages::Notice::error(e.into()))
    };
    html(
        StatusCode::OK,
        pages::link(pages::LinkPage {
            session: &session,
            link: &found.body,
            short: &short,
            qr: qr.as_deref(),
            stats: &stats,
            history: &history,
            from: q
                .from
                .as_deref()
                .filter(|f| !f.is_empty())
                .or(stats.body["from"].as_str())
                .unwrap_or_default(),
            to: q
                .to
                .as_deref()
                .filter(|t| !t.is_empty())
                .or(stats.body["to"].as_str())
                .unwrap_or_default(),
            notice,
        }),
    )
}

#[derive(Deserialize, Default)]
struct QrQuery {
    #[serde(default)]
    size: Option<String>,
    #[serde(default)]
    download: Option<String>,
}

async fn qr_svg(
    State(dash): State<Dashboard>,
    Path(code): Path<String>,
    Query(q): Query<QrQuery>,
    headers: HeaderMap,
) -> Response {
    qr(dash, code, q, headers, "svg").await
}

async fn qr_png(
    State(dash): State<Dashboard>,
    Path(code): Path<String>,
    Query(q): Query<QrQuery>,
    headers: HeaderMap,
) -> Response {
    qr(dash, code, q, headers, "png").await
}

/// The caller's links as a file (`links.csv`, the generic import format, or `links.ndjson`):
/// the API's `GET /v1/exports/links`.
async fn export(
    State(dash): State<Dashboard>,
    Path(file): Path<String>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = dash.session(&headers).await else {
        return to_signin();
    };
    let format = match file.as_str() {
        "links.csv" => "csv",
        "links.ndjson" => "ndjson",
        _ => return StatusCode::NOT_FOUND.into_response(),
    };
    let (status, resp_headers, bytes) = dash
        .call_raw(
            Method::GET,
            &format!("/v1/exports/links?format={format}"),
            &session.key,
            None,
            None,
        )
        .await;
    let mut resp = (status, bytes).into_response();
    for name in [header::CONTENT_TYPE, header::CONTENT_DISPOSITION] {
        if let Some(v) = resp_headers.get(&name) {
            resp.headers_mut().insert(name, v.clone());
        }
    }
    resp
}

/// The API's QR image of `code`, as a download when asked.
async fn qr(dash: Dashboard, code: String, q: QrQuery, headers: HeaderMap, ext: &str) -> Response {
    let Some(session) = dash.session(&headers).await else {
        return to_signin();
    };
    let size = q
        .size
        .as_deref()
        .map(urlencode)
        .unwrap_or_else(|| "512".into());
    let (status, resp_headers, bytes) = dash
        .call_raw(
            Method::GET,
            &api_link(&code, &format!("/qr.{ext}"), &format!("size={size}")),
            &session.key,
            None,
            None,
        )
        .await;
    let mut resp = (status, bytes).into_response();
    for name in [header::CONTENT_TYPE, header::CACHE_CONTROL] {
        if let Some(v) = resp_headers.get(&name) {
            resp.headers_mut().insert(name, v.clone());
        }
    }
    if status.is_success() && q.download.is_some() {
        let name = format!(
            "attachment; filename=\"{}-{size}.{ext}\"",
            code.replace('/', "-")
        );
        if let Ok(v) = HeaderValue::from_str(&name) {
            resp.headers_mut().insert(header::CONTENT_DISPOSITION, v);
        }
    }
    resp
}

#[derive(Deserialize)]
struct ActionForm {
    #[serde(default)]
    reason: String,
    /// A datetime-local value (UTC), or empty for "never".
    #[serde(default)]
    expires_at: String,
    /// `options`: the redirect's status, cache lifetime and query forwarding.
    #[serde(default)]
    redirect_status: String,
    #[serde(default)]
    cache_seconds: String,
    /// A checkbox: present ("on") when ticked.
    #[serde(default)]
    forward_query: Option<String>,
    #[serde(default)]
    query_precedence: String,
    /// `destination`: the new destination.
    #[serde(default)]
    long_url: String,
    /// `tags`: comma-separated.
    #[serde(default)]
    tags: String,
}

/// A change to one link: `delete`, `disable`, `enable`, `expiry`, `options`, `destination`,
/// `tags`, and for admins `takedown`,
/// `warn`, `restore`; back to the link's page saying what happened (or the API's error).
async fn link_action(
    State(dash): State<Dashboard>,
    Path((code, action)): Path<(String, String)>,
    req: Request,
) -> Response {
    let (session, f) = match posted::<ActionForm>(&dash, req).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let path = api_link(&code, "", "");
    let (method, path, body) = match action.as_str() {
        "delete" => (Method::DELETE, path, None),
        "disable" => (Method::PATCH, path, Some(json!({"disabled": true}))),
        "enable" => (Method::PATCH, path, Some(json!({"disabled": false}))),
        "expiry" => {
            let at = if f.expires_at.trim().is_empty() {
                Value::Null
            } else {
                match pages::expiry_input(&f.expires_at) {
                    Some(at) => json!(at),
                    None => {
                        return back(&code, Err("the expiry must be a date and time (UTC)"));
                    }
                }
            };
            (Method::PATCH, path, Some(json!({"expires_at": at})))
        }
        "options" => {
            let (Ok(status), Ok(cache)) = (
                f.redirect_status.trim().parse::<u16>(),
                f.cache_seconds.trim().parse::<u32>(),
            ) else {
                return back(
                    &code,
                    Err("the status and the cache lifetime must be numbers"),
                );
            };
            let precedence = match f.query_precedence.as_str() {
                "request" => "request",
                _ => "destination",
            };
            (
                Method::PATCH,
                path,
                Some(json!({
                    "redirect_status": status,
                    "cache_seconds": cache,
                    "forward_query": f.forward_query.is_some(),
                    "query_precedence": precedence,
                })),
            )
        }
        "destination" => (
            Method::PATCH,
            path,
            Some(json!({"long_url": f.long_url.trim()})),
        ),
        "tags" => {
            let tags: Vec<&str> = f
                .tags
                .split(',')
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .collect();
            (Method::PATCH, path, Some(json!({ "tags": tags })))
        }
        "takedown" | "warn" => (
            Method::POST,
            api_link(&code, "/takedown", ""),
            Some(json!({"reason": f.reason.trim(), "warn": action == "warn"})),
        ),
        "restore" => (Method::POST, api_link(&code, "/restore", ""), None),
        _ => return not_found().await,
    };
    let answer = dash.call(method, &path, &session, body).await;
    if answer.ok() {
        tracing::info!(%code, action, owner = %session.owner, "console action");
        back(&code, Ok(&action))
    } else {
        back(&code, Err(&answer.error()))
    }
}

/// Back to the link's page, saying what was done or why not.
fn back(code: &str, outcome: Result<&str, &str>) -> Response {
    let q = match outcome {
        Ok(done) => format!("done={}", urlencode(done)),
        Err(e) => format!("error={}", urlencode(e)),
    };
    Redirect::to(&format!("/links/{}?{q}", urlencode(code))).into_response()
}

/// The operators' page (admin keys): the edge fleet, the regions, the review queue and the
/// owners with a trust record.
async fn ops(
    State(dash): State<Dashboard>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = dash.session(&headers).await else {
        return to_signin();
    };
    if !session.admin {
        return html(
            StatusCode::FORBIDDEN,
            pages::message(
                Some(&session),
                "Operators only",
                "This page needs an admin key.",
            ),
        );
    }
    let (edges, regions, mut reports, owners) = tokio::join!(
        dash.call(Method::GET, "/v1/edges", &session, None),
        dash.call(Method::GET, "/v1/regions", &session, None),
        dash.call(
            Method::GET,
            "/v1/admin/reports?status=open&limit=100",
            &session,
            None
        ),
        dash.call(Method::GET, "/v1/admin/owners", &session, None),
    );
    if let Some(list) = reports.body["reports"].as_array_mut() {
        dash.with_refs(list);
    }
    let notice = q
        .get("done")
        .map(|d| pages::Notice::ok(format!("Done: {d}.")))
        .or_else(|| q.get("error").map(|e| pages::Notice::error(e.clone())));
    html(
        StatusCode::OK,
        pages::ops(&session, &edges, &regions, &reports, &owners, notice),
    )
}

#[derive(Deserialize)]
struct GoForm {
    code: String,
}

/// The operators' "open a link by code".
async fn go_to_code(State(dash): State<Dashboard>, Query(f): Query<GoForm>) -> Response {
    let given = f.code.trim();
    // A short URL names its domain: a branded one's link is `domain/code`.
    let key = match url::Url::parse(given) {
        Ok(u) => {
            let code = u.path().trim_matches('/').trim_end_matches('+');
            let host = u.host_str().unwrap_or_default().to_ascii_lowercase();
            if Some(&host) == dash.0.default_domain.as_ref() || host.is_empty() {
                code.to_string()
            } else {
                lasthop_core::link_key(Some(&host), code)
            }
        }
        Err(_) => given.trim_start_matches('/').to_string(),
    };
    Redirect::to(&format!("/links/{}", urlencode(&key))).into_response()
}

#[derive(Deserialize)]
struct ResolveForm {
    action: String,
    #[serde(default)]
    reason: String,
}

async fn resolve_report(
    State(dash): State<Dashboard>,
    Path(id): Path<u64>,
    req: Request,
) -> Response {
    let (session, f) = match posted::<ResolveForm>(&dash, req).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let mut body = json!({"action": f.action});
    if !f.reason.trim().is_empty() {
        body["reason"] = json!(f.reason.trim());
    }
    let answer = dash
        .call(
            Method::POST,
            &format!("/v1/admin/reports/{id}/resolve"),
            &session,
            Some(body),
        )
        .await;
    ops_back(if answer.ok() {
        Ok(format!("report {id} resolved ({})", f.action))
    } else {
        Err(answer.error())
    })
}

#[derive(Deserialize)]
struct OwnerForm {
    /// The owner, for the suspend form (whose path names `_`).
    #[serde(default)]
    owner: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    takedown_links: Option<String>,
}

async fn owner_action(
    State(dash): State<Dashboard>,
    Path((owner, action)): Path<(String, String)>,
    req: Request,
) -> Response {
    let (session, f) = match posted::<OwnerForm>(&dash, req).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let owner = if owner == "_" {
        f.owner.trim().to_string()
    } else {
        owner
    };
    let path = format!("/v1/admin/owners/{}", urlencode(&owner));
    let (path, body) = match action.as_str() {
        "suspend" => (
            format!("{path}/suspend"),
            Some(json!({"reason": f.reason.trim(), "takedown_links": f.takedown_links.is_some()})),
        ),
        "unsuspend" => (format!("{path}/unsuspend"), None),
        "unflag" => (format!("{path}/unflag"), None),
        _ => return not_found().await,
    };
    let answer = dash.call(Method::POST, &path, &session, body).await;
    ops_back(if answer.ok() {
        Ok(format!("{owner}: {action}"))
    } else {
        Err(answer.error())
    })
}

/// The caller's branded domains (an admin's: everyone's) with their state, and the form that
/// adds one; `done`/`error` say what the last form did.
async fn domains(
    State(dash): State<Dashboard>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let Some(session) = dash.session(&headers).await else {
        return to_signin();
    };
    let notice = match (q.get("done"), q.get("error")) {
        (_, Some(e)) => Some(pages::Notice::error(e.clone())),
        (Some(d), None) => Some(pages::Notice::ok(d.clone())),
        (None, None) => None,
    };
    domains_page(&dash, &session, notice, StatusCode::OK).await
}

async fn domains_page(
    dash: &Dashboard,
    session: &Session,
    notice: Option<pages::Notice>,
    status: StatusCode,
) -> Response {
    let answer = dash.call(Method::GET, "/v1/domains", session, None).await;
    if !answer.ok() {
        return html(
            answer.status,
            pages::message(Some(session), "Domains unavailable", &answer.error()),
        );
    }
    let list = answer.body["domains"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    html(status, pages::domains(session, &list, notice))
}

#[derive(Deserialize)]
struct DomainForm {
    domain: String,
}

/// Adds a domain through `POST /v1/domains`; the API's refusal is shown above the form.
async fn add_domain(State(dash): State<Dashboard>, req: Request) -> Response {
    let (session, f) = match posted::<DomainForm>(&dash, req).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let answer = dash
        .call(
            Method::POST,
            "/v1/domains",
            &session,
            Some(json!({"domain": f.domain.trim()})),
        )
        .await;
    if answer.ok() {
        let name = answer.body["domain"].as_str().unwrap_or_default();
        tracing::info!(domain = name, owner = %session.owner, "console added a domain");
        return Redirect::to(&format!(
            "/domains?done={}",
            urlencode(&format!("{name} added"))
        ))
        .into_response();
    }
    domains_page(
        &dash,
        &session,
        Some(pages::Notice::error(answer.error())),
        answer.status,
    )
    .await
}

/// Deletes a domain through `DELETE /v1/domains/{domain}`.
async fn delete_domain(
    State(dash): State<Dashboard>,
    Path(domain): Path<String>,
    req: Request,
) -> Response {
    let (session, _) = match posted::<CsrfForm>(&dash, req).await {
        Ok(p) => p,
        Err(resp) => return resp,
    };
    let answer = dash
        .call(
            Method::DELETE,
            &format!("/v1/domains/{}", urlencode(&domain)),
            &session,
            None,
        )
        .await;
    let q = if answer.ok() {
        format!("done={}", urlencode(&format!("{domain} deleted")))
    } else {
        format!("error={}", urlencode(&answer.error()))
    };
    Redirect::to(&format!("/domains?{q}")).into_response()
}

fn ops_back(outcome: Result<String, String>) -> Response {
    let q = match outcome {
        Ok(done) => format!("done={}", urlencode(&done)),
        Err(e) => format!("error={}", urlencode(&e)),
    };
    Redirect::to(&format!("/ops?{q}")).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cookies_are_found_by_name_only() {
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; lh_session=abc; lh_session_x=no"),
        );
        assert_eq!(cookie(&h, SESSION_COOKIE), Some("abc"));
        assert_eq!(cookie(&h, "b"), None);
        let c = set_cookie(SESSION_COOKIE, "v", 60, true);
        let c = c.to_str().unwrap();
        assert!(c.contains("HttpOnly") && c.contains("SameSite=Strict") && c.ends_with("; Secure"));
        assert!(!set_cookie(SESSION_COOKIE, "v", 60, false)
            .to_str()
            .unwrap()
            .contains("Secure"));
    }

    #[test]
    fn tokens_compare_whole() {
        let t = token();
        assert_eq!(t.len(), 64);
        assert!(same(&t, &t.clone()));
        assert!(!same(&t, &t[..63]));
        assert!(!same(&t, &token()));
    }
}
