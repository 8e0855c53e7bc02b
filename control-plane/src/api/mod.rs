//! The public HTTP API (docs/ARCHITECTURE.md, "The control plane").
//!
//! Every answer is JSON (but the report form's thank-you page); every failure is [`ApiError`]:
//! a status, a machine-readable `code`, for some a `reason`, and a human message, never
//! internals. Malformed input of any kind is a 400, never a 500.
//!
//! [`safety`] holds the trust-and-safety calls: reports, appeals, history, the review queue,
//! owners, keys, hosts.

pub(crate) mod domains;
pub mod imports;
mod safety;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, MatchedPath, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use lasthop_core::{
    normalize_destination, validate_alias, LinkState, LinkStatus, UrlError, UrlPolicy,
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::auth::{ApiKeys, AuthError, Principal};
use crate::clicks::{ClicksHandle, Day, RecomputeError};
use crate::clock::{now_ms, parse_rfc3339, rfc3339};
use crate::error_chain::ErrorChain;
use crate::fleet::{summarize, Fleet};
use crate::metrics::Metrics;
use crate::publish::Publisher;
use crate::ratelimit::RateLimiter;
pub use crate::reply::ApiError;
use crate::reply::{blocking, offload};
use crate::safety::Safety;
use crate::store::{
    Actor, CreateOutcome, CreateRequest, DeleteOutcome, IdempotencyClaim, StateUpdate, Store,
    StoreError, StoredLink,
};

/// Largest request body accepted.
pub const MAX_BODY: usize = 16 * 1024;
/// Most codes in one `POST /v1/resolve`.
pub const MAX_RESOLVE: usize = 100;
/// Largest page of `GET /v1/links`.
pub const MAX_PAGE: usize = 1000;
const DEFAULT_PAGE: usize = 50;
/// Longest takedown reason, in characters.
pub const MAX_REASON_CHARS: usize = 200;

/// Default `--max-mint-rate`: creates per second a region accepts, all owners together.
pub const DEFAULT_MAX_MINT_RATE: u64 = 10_000;

/// API settings.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Base of `short_url`, e.g. `https://lh.example`; no trailing slash.
    pub short_base: String,
    pub url_policy: UrlPolicy,
    /// Creates per second per owner (0: unlimited) and the bucket size.
    pub create_rate: f64,
    pub create_burst: f64,
    /// Creates per second for everyone together (0: unbounded), with a bucket of one second's
    /// worth: the bound the feed announces (`mint_rate`) and engines that lost their feed widen
    /// their marks by.
    pub max_mint_rate: u64,
    /// `lasthop_edge_lag_alarm` is 1 while an engine is more than this many seconds behind.
    pub edge_lag_alarm_secs: f64,
    /// Anonymous reports a second per client network (/24, /48), and the bucket size.
    pub report_rate: f64,
    pub report_burst: f64,
    /// Anonymous reports a second from everyone together, and the bucket size: the bound on
    /// what a flood from many networks can write.
    pub report_global_rate: f64,
    pub report_global_burst: f64,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            short_base: "http://127.0.0.1:8080".into(),
            url_policy: UrlPolicy::default(),
            create_rate: 100.0,
            create_burst: 1000.0,
            max_mint_rate: DEFAULT_MAX_MINT_RATE,
            edge_lag_alarm_secs: 30.0,
            report_rate: 0.1,
            report_burst: 10.0,
            report_global_rate: 5.0,
            report_global_burst: 100.0,
        }
    }
}

struct Inner {
    store: Arc<dyn Store>,
    keys: ApiKeys,
    config: ApiConfig,
    limiter: RateLimiter,
    /// Every create, whoever makes it (`max_mint_rate`).
    mint_limiter: RateLimiter,
    metrics: Metrics,
    fleet: Arc<Fleet>,
    snapshots: Option<Arc<Publisher>>,
    clicks: Option<ClicksHandle>,
    /// Replication between regions, with `--peer`.
    peers: Option<Arc<crate::peers::Peers>>,
    safety: Arc<Safety>,
    report_limiter: RateLimiter,
    report_global: RateLimiter,
    /// What `/metrics` last read of the domains.
    domain_summary: std::sync::Mutex<Option<domains::DomainSummary>>,
    /// The default domain's name: `--short-base`'s host.
    default_domain: Option<String>,
    acme: Option<Arc<crate::acme::Acme>>,
}

/// Shared state of every handler.
#[derive(Clone)]
pub struct AppState(Arc<Inner>);

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState").finish_non_exhaustive()
    }
}

/// Every part of the API's state, each built once by the server's composition root and handed
/// over here whole.
pub struct ApiParts {
    pub store: Arc<dyn Store>,
    pub keys: ApiKeys,
    pub config: ApiConfig,
    pub metrics: Metrics,
    /// The engines `GET /v1/edges` and the lag gauges show.
    pub fleet: Arc<Fleet>,
    /// Publishing on demand (`POST /v1/admin/snapshots`; without one, 503).
    pub snapshots: Option<Arc<Publisher>>,
    pub safety: Arc<Safety>,
    /// The click processor behind stats and recompute (without one, both answer 503).
    pub clicks: Option<ClicksHandle>,
    /// Replication between regions (`GET /v1/regions`, read-through, merged stats).
    pub peers: Option<Arc<crate::peers::Peers>>,
    /// Automatic certificates (`POST /v1/domains/{domain}/renew`; without, 409).
    pub acme: Option<Arc<crate::acme::Acme>>,
}

impl std::fmt::Debug for ApiParts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiParts").finish_non_exhaustive()
    }
}

impl ApiParts {
    /// A store, its keys and settings; no engines, no publisher, trust and safety on defaults
    /// (no lists), no click processor, no peer regions.
    pub fn new(store: Arc<dyn Store>, keys: ApiKeys, config: ApiConfig, metrics: Metrics) -> Self {
        let safety = Arc::new(Safety::with_defaults(Arc::clone(&store), metrics.clone()));
        ApiParts {
            store,
            keys,
            config,
            metrics,
            fleet: Arc::new(Fleet::new()),
            snapshots: None,
            safety,
            clicks: None,
            peers: None,
            acme: None,
        }
    }
}

impl AppState {
    /// The store the API writes.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.0.store
    }

    /// Wires a store, the keys file and settings together, with no engines and no snapshot
    /// publisher (`POST /v1/admin/snapshots` then answers 503).
    pub fn new(store: Arc<dyn Store>, keys: ApiKeys, config: ApiConfig, metrics: Metrics) -> Self {
        AppState::from_parts(ApiParts::new(store, keys, config, metrics))
    }

    /// As [`AppState::new`], showing the engines in `fleet` (`GET /v1/edges`, the lag gauges)
    /// and publishing on demand through `snapshots`; trust and safety on defaults (no lists).
    pub fn with_edges(
        store: Arc<dyn Store>,
        keys: ApiKeys,
        config: ApiConfig,
        metrics: Metrics,
        fleet: Arc<Fleet>,
        snapshots: Option<Arc<Publisher>>,
    ) -> Self {
        AppState::from_parts(ApiParts {
            fleet,
            snapshots,
            ..ApiParts::new(store, keys, config, metrics)
        })
    }

    /// Every part given: the full server.
    pub fn from_parts(parts: ApiParts) -> Self {
        let ApiParts {
            store,
            keys,
            config,
            metrics,
            fleet,
            snapshots,
            safety,
            clicks,
            peers,
            acme,
        } = parts;
        let limiter = RateLimiter::new(config.create_rate, config.create_burst);
        let rate = config.max_mint_rate as f64;
        let mint_limiter = RateLimiter::new(rate, rate);
        let report_limiter = RateLimiter::new(config.report_rate, config.report_burst);
        let report_global = RateLimiter::new(config.report_global_rate, config.report_global_burst);
        let default_domain = domains::host_of(&config.short_base);
        AppState(Arc::new(Inner {
            store,
            keys,
            config,
            limiter,
            mint_limiter,
            metrics,
            fleet,
            snapshots,
            clicks,
            peers,
            safety,
            report_limiter,
            report_global,
            domain_summary: std::sync::Mutex::new(None),
            default_domain,
            acme,
        }))
    }

    /// The trust-and-safety state.
    pub fn safety(&self) -> &Arc<Safety> {
        &self.0.safety
    }

    /// The click processor's rollups, where this server runs one (peer regions read them to
    /// merge a link's stats).
    pub fn rollups(&self) -> Option<Arc<crate::clicks::RollupStore>> {
        self.0.clicks.as_ref().map(|c| Arc::clone(c.store()))
    }

    /// The metrics registry.
    pub fn metrics(&self) -> &Metrics {
        &self.0.metrics
    }
}

/// The authenticated caller.
struct Auth(Principal);

impl FromRequestParts<AppState> for Auth {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let unauthorized =
            |msg: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", msg.to_string());
        let value = parts
            .headers
            .get(header::AUTHORIZATION)
            .ok_or_else(|| unauthorized("missing Authorization: Bearer <api key>"))?;
        let key = value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or_else(|| unauthorized("Authorization must be Bearer <api key>"))?;
        let answer = match state.0.keys.authenticate_cached(key) {
            Some(answer) => answer,
            None => {
                // The key is not in memory: look it up in the shared store off the async
                // threads.
                let st = state.clone();
                let key = key.to_string();
                offload("authenticating a key", move || st.0.keys.authenticate(&key))
                    .await
                    .unwrap_or(Err(AuthError::Unavailable))
            }
        };
        let who = match answer {
            Ok(p) => p,
            Err(AuthError::Unknown) => return Err(unauthorized("unknown api key")),
            Err(AuthError::Unavailable) => return Err(ApiError::unavailable()),
            Err(AuthError::Revoked) => {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "key_revoked",
                    "this api key was revoked",
                ))
            }
        };
        if state.0.safety.suspended(&who.owner) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "key_suspended",
                "this account is suspended",
            ));
        }
        Ok(Auth(who))
    }
}

impl Principal {
    /// The audit trail's actor for this caller.
    fn actor(&self) -> Actor {
        Actor::Key(self.key_id.clone())
    }
}

/// The link a code route names: its `{code}` and `?domain=` (absent, or the default domain's
/// name: the default domain), as its key ([`lasthop_core::link_key`]).
pub(crate) struct LinkKey(pub String);

impl FromRequestParts<AppState> for LinkKey {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Path(code) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|_| ApiError::not_found())?;
        let domain = parts.uri.query().and_then(|q| {
            url::form_urlencoded::parse(q.as_bytes())
                .find(|(k, _)| k == "domain")
                .map(|(_, v)| v.into_owned())
        });
        Ok(LinkKey(key_of(state, domain.as_deref(), &code)?))
    }
}

/// A domain name as a caller spells it, in the record's form: trimmed, lower case, no trailing
/// dot (`?domain=`, a create's `domain`, `apikey create --domain`).
pub fn domain_name(raw: &str) -> String {
    raw.trim().trim_end_matches('.').to_ascii_lowercase()
}

/// A branded domain as a request names it (`?domain=`, `"domain"`), in the record's form:
/// lower case, no trailing dot; `None` for the default domain (named, or empty).
pub(crate) fn branded_domain(state: &AppState, raw: Option<&str>) -> Option<String> {
    let d = domain_name(raw?);
    if d.is_empty() || Some(&d) == state.0.default_domain.as_ref() {
        return None;
    }
    Some(d)
}

/// The key of `code` on the domain a request names; 404 for what no namespace holds.
fn key_of(state: &AppState, domain: Option<&str>, code: &str) -> Result<String, ApiError> {
    let key = lasthop_core::link_key(branded_domain(state, domain).as_deref(), code);
    if !lasthop_core::plausible_key(key.as_bytes()) || lasthop_core::split_key_str(&key).1 != code {
        return Err(ApiError::not_found());
    }
    Ok(key)
}

/// A link's domain as responses name it: the branded one, or the default domain's name.
fn domain_of<'a>(state: &'a AppState, key: &'a str) -> Option<&'a str> {
    match lasthop_core::split_key_str(key).0 {
        Some(d) => Some(d),
        None => state.0.default_domain.as_deref(),
    }
}

/// 403 `domain_not_allowed` unless `who`'s key may act on `domain` (a key limited to some
/// domains: `apikey create --domain D`).
pub(crate) fn allowed_domain(state: &AppState, who: &Principal, key: &str) -> Result<(), ApiError> {
    if who.domains.is_empty() {
        return Ok(());
    }
    allowed_domain_name(who, domain_of(state, key).unwrap_or_default())
}

/// [`allowed_domain`] by the domain's name.
pub(crate) fn allowed_domain_name(who: &Principal, domain: &str) -> Result<(), ApiError> {
    if who.domains.is_empty() || who.domains.iter().any(|d| d == domain) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "domain_not_allowed",
        format!("this api key is limited to {}", who.domains.join(", ")),
    ))
}

async fn read_body(body: Body) -> Result<Bytes, ApiError> {
    read_body_up_to(body, MAX_BODY).await
}

/// A request body of at most `limit` bytes; 400 `body_too_large` past it.
async fn read_body_up_to(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    axum::body::to_bytes(body, limit).await.map_err(|_| {
        ApiError::bad(
            "body_too_large",
            format!("request body is larger than {limit} bytes"),
        )
    })
}

fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => ApiError::bad("invalid_field", e.to_string()),
        _ => ApiError::bad("invalid_json", format!("body is not valid JSON: {e}")),
    })
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    long_url: String,
    #[serde(default)]
    alias: Option<String>,
    /// A branded domain (absent or the default domain's name: the default domain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    domain: Option<String>,
    #[serde(default)]
    expires_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    redirect_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cache_seconds: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    forward_query: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    query_precedence: Option<String>,
    /// UTM parameters written into the destination's query at creation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    utm: Option<Utm>,
    /// The owner's tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tags: Option<Vec<String>>,
}

/// `tags` as a create or an edit gives them: at most [`lasthop_core::TAGS_MAX`] names of
/// 1–32 of `[a-z0-9_-]`, kept in the order given with repeats dropped (400 `invalid_tags`).
fn checked_tags(tags: &[String]) -> Result<Vec<String>, ApiError> {
    let mut out: Vec<String> = Vec::with_capacity(tags.len());
    for t in tags {
        if !lasthop_core::tag_ok(t) {
            return Err(ApiError::bad(
                "invalid_tags",
                format!("{t:?} is no tag: tags are 1-32 of a-z, 0-9, _ and -"),
            ));
        }
        if !out.contains(t) {
            out.push(t.clone());
        }
    }
    if out.len() > lasthop_core::TAGS_MAX {
        return Err(ApiError::bad(
            "invalid_tags",
            format!("a link has at most {} tags", lasthop_core::TAGS_MAX),
        ));
    }
    Ok(out)
}

/// A link's serving options as the API spells them (issue 43); absent fields are left alone
/// (a create's: the defaults).
#[derive(Debug, Default)]
struct OptionFields {
    redirect_status: Option<u16>,
    cache_seconds: Option<u32>,
    forward_query: Option<bool>,
    /// `destination` (default) or `request`: which value a name in both queries keeps.
    query_precedence: Option<String>,
}

impl OptionFields {
    /// The patch these fields make, checked (400 `invalid_options` with the field's reason).
    fn patch(&self) -> Result<lasthop_core::OptionsPatch, ApiError> {
        let request_precedence = match self.query_precedence.as_deref() {
            None => None,
            Some("destination") => Some(false),
            Some("request") => Some(true),
            Some(_) => {
                return Err(ApiError::bad(
                    "invalid_options",
                    "query_precedence must be \"destination\" or \"request\"",
                ))
            }
        };
        let patch = lasthop_core::OptionsPatch {
            redirect_status: self.redirect_status,
            cache_seconds: self.cache_seconds,
            forward_query: self.forward_query,
            request_precedence,
        };
        patch
            .apply(lasthop_core::LinkOptions::default())
            .validate()
            .map_err(|e| ApiError::bad("invalid_options", e.to_string()))?;
        Ok(patch)
    }
}

/// `utm`: the campaign parameters written into a destination.
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Utm {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    medium: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    campaign: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    term: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    content: Option<String>,
}

impl Utm {
    /// `url` with `utm_<name>=<value>` set for each given field (a parameter of that name
    /// already there is replaced), by the URL standard's form encoding.
    fn apply(&self, url: &str) -> Result<String, ApiError> {
        let mut parsed = url::Url::parse(url)
            .map_err(|_| ApiError::bad("invalid_utm", "the destination does not parse"))?;
        let fields = [
            ("utm_source", &self.source),
            ("utm_medium", &self.medium),
            ("utm_campaign", &self.campaign),
            ("utm_term", &self.term),
            ("utm_content", &self.content),
        ];
        for (name, value) in fields {
            if let Some(v) = value {
                if v.is_empty() || v.len() > 200 {
                    return Err(ApiError::bad(
                        "invalid_utm",
                        format!("{name} must be 1-200 characters"),
                    ));
                }
            }
        }
        let kept: Vec<(String, String)> = parsed
            .query_pairs()
            .filter(|(k, _)| !fields.iter().any(|(n, v)| v.is_some() && k == n))
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        {
            let mut q = parsed.query_pairs_mut();
            q.clear();
            for (k, v) in &kept {
                q.append_pair(k, v);
            }
            for (name, value) in fields {
                if let Some(v) = value {
                    q.append_pair(name, v);
                }
            }
        }
        Ok(parsed.to_string())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TakedownBody {
    reason: String,
    #[serde(default)]
    warn: bool,
}

/// `PATCH /v1/links/{code}`: an absent field is left alone; `"expires_at": null` clears it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchBody {
    #[serde(default, deserialize_with = "present")]
    expires_at: Option<Option<String>>,
    #[serde(default)]
    disabled: Option<bool>,
    #[serde(default)]
    redirect_status: Option<u16>,
    #[serde(default)]
    cache_seconds: Option<u32>,
    #[serde(default)]
    forward_query: Option<bool>,
    #[serde(default)]
    query_precedence: Option<String>,
    /// A destination edit (issue 43).
    #[serde(default)]
    long_url: Option<String>,
    /// UTM parameters written into the new destination (or, without `long_url`, the current
    /// one: an edit too).
    #[serde(default)]
    utm: Option<Utm>,
    /// All of the link's tags (`[]` clears them).
    #[serde(default)]
    tags: Option<Vec<String>>,
}

/// Tells a field that is present (even as `null`, which becomes `Some(None)`) from an absent one
/// (`None`, through `#[serde(default)]`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    codes: Vec<String>,
}

/// A link's short URL: the short base and its code, or `https://DOMAIN/CODE` on a branded
/// domain (whose certificate the engines serve).
fn short_url(state: &AppState, key: &str) -> String {
    match lasthop_core::split_key_str(key) {
        (Some(domain), code) => format!("https://{domain}/{code}"),
        (None, code) => format!("{}/{}", state.0.config.short_base, code),
    }
}

/// The create answer (and its idempotent replay).
fn created_json(state: &AppState, s: &StoredLink) -> serde_json::Value {
    json!({
        "code": lasthop_core::split_key_str(&s.link.code).1,
        "domain": domain_of(state, &s.link.code),
        "short_url": short_url(state, &s.link.code),
        "long_url": s.state.url(&s.link),
        "created_at": rfc3339(s.link.created_at_ms),
        "expires_at": s.state.expires_at_ms.map(rfc3339),
        "redirect_status": s.state.options.redirect_status,
        "cache_seconds": s.state.options.cache_seconds,
        "forward_query": s.state.options.forward_query,
        "query_precedence": precedence_name(&s.state.options),
        "tags": s.state.tags,
    })
}

fn precedence_name(o: &lasthop_core::LinkOptions) -> &'static str {
    if o.request_precedence {
        "request"
    } else {
        "destination"
    }
}

/// The full view of a link, with its state.
fn link_json(state: &AppState, s: &StoredLink, now: i64) -> serde_json::Value {
    let status = s.state.status(now);
    json!({
        "code": lasthop_core::split_key_str(&s.link.code).1,
        "domain": domain_of(state, &s.link.code),
        "short_url": short_url(state, &s.link.code),
        "long_url": if status == LinkStatus::Deleted { None } else { Some(s.state.url(&s.link)) },
        "owner": s.link.owner,
        "created_at": rfc3339(s.link.created_at_ms),
        "expires_at": s.state.expires_at_ms.map(rfc3339),
        "status": api_status(&s.state, now),
        "takedown_reason": s.state.takedown_reason,
        "flagged": s.state.warn,
        "held": s.state.held.map(|h| h.as_str()),
        "pinned": s.state.pinned,
        "redirect_status": s.state.options.redirect_status,
        "cache_seconds": s.state.options.cache_seconds,
        "forward_query": s.state.options.forward_query,
        "query_precedence": precedence_name(&s.state.options),
        "pending_long_url": s.state.pending_destination,
        "tags": s.state.tags,
    })
}

/// The API's status: [`LinkStatus`], with a live link that is held shown as `held`.
fn api_status(state: &LinkState, now: i64) -> &'static str {
    match state.status(now) {
        LinkStatus::Active if state.held.is_some() => "held",
        other => other.as_str(),
    }
}

fn idempotency_claim(
    headers: &HeaderMap,
    body: &CreateBody,
) -> Result<Option<IdempotencyClaim>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| (1..=255).contains(&k.len()) && k.bytes().all(|b| (0x21..0x7f).contains(&b)))
        .ok_or_else(|| {
            ApiError::bad(
                "invalid_idempotency_key",
                "Idempotency-Key must be 1-255 visible ASCII characters",
            )
        })?;
    // Canonical form: the parsed body re-serialised, so spacing and field order don't matter.
    let canonical =
        serde_json::to_vec(body).map_err(|e| ApiError::bad("invalid_json", e.to_string()))?;
    Ok(Some(IdempotencyClaim {
        key: key.to_string(),
        body_hash: Sha256::digest(&canonical).into(),
    }))
}

async fn create_link(
    State(state): State<AppState>,
    Auth(who): Auth,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    if let Err(secs) = state.0.limiter.check(&who.owner, started) {
        return Err(ApiError {
            retry_after: Some(secs),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many creates for this owner; retry later",
            )
        });
    }
    if let Err(secs) = state.0.mint_limiter.check("", started) {
        return Err(ApiError {
            retry_after: Some(secs),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "this region is creating links at its --max-mint-rate; retry later",
            )
        });
    }
    let bytes = read_body(body).await?;
    let mut parsed: CreateBody = parse_json(&bytes)?;
    // The domain in its record's form, so a replay spelled otherwise is the same request.
    parsed.domain = parsed.domain.map(|d| domain_name(&d));
    let claim = idempotency_claim(&headers, &parsed)?;
    let domain = branded_domain(&state, parsed.domain.as_deref());
    allowed_domain(
        &state,
        &who,
        &lasthop_core::link_key(domain.as_deref(), "-"),
    )?;
    if let Some(d) = &domain {
        // Links are made on the owner's own domains (an admin's on any), never a suspended one.
        let record = domains::fetch_visible(&state, &who, d).await?;
        if record.suspended.is_some() {
            return Err(domains::suspended());
        }
    }
    let options = OptionFields {
        redirect_status: parsed.redirect_status,
        cache_seconds: parsed.cache_seconds,
        forward_query: parsed.forward_query,
        query_precedence: parsed.query_precedence.clone(),
    }
    .patch()?
    .apply(lasthop_core::LinkOptions::default());
    let requested_url = match &parsed.utm {
        Some(utm) => utm.apply(&parsed.long_url)?,
        None => parsed.long_url.clone(),
    };
    let (long_url, dest) = checked_destination(&state, &requested_url)?;
    let tags = checked_tags(parsed.tags.as_deref().unwrap_or_default())?;
    if let Some(alias) = &parsed.alias {
        validate_alias(alias).map_err(|e| {
            let err = ApiError::bad(e.code(), e.to_string());
            match e.reason() {
                Some(reason) => err.with_reason(reason),
                None => err,
            }
        })?;
    }
    let now = now_ms();
    let expires_at_ms = parsed
        .expires_at
        .as_deref()
        .map(|s| future_time(s, now))
        .transpose()?;
    let safety = Arc::clone(&state.0.safety);
    let actor = who.actor();
    let owner = who.owner;
    let scan = safety.scans();
    let req_alias = parsed.alias;
    // Aliases have one home region: a create of one anywhere else is forwarded there.
    let forward = match (&req_alias, state.0.peers.as_ref()) {
        (Some(_), Some(peers)) => peers
            .alias_home_elsewhere()
            .map(|home| (Arc::clone(peers), home)),
        _ => None,
    };
    let store = Arc::clone(&state.0.store);
    let outcome = blocking(move || {
        // Velocity is counted where the create happens: flagging an owner is a store write.
        let hold = safety.hold_for(&owner, &dest, now)?;
        let req = CreateRequest {
            owner,
            long_url,
            domain,
            alias: req_alias,
            expires_at_ms,
            idempotency: claim,
            now_ms: now,
            hold,
            options,
            tags,
            actor,
            destination: Some(dest),
            imported: None,
        };
        let outcome = match &forward {
            Some((peers, home)) => match peers.forward_create(*home, &req) {
                Ok(outcome) => outcome,
                Err(e) => return Ok(Err((*home, e))),
            },
            None => store.create(req)?,
        };
        if let (Some(hold), CreateOutcome::Created(_)) = (hold, &outcome) {
            safety.count_hold(hold);
        }
        Ok::<_, StoreError>(Ok(outcome))
    })
    .await?;
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err((home, e)) => {
            tracing::warn!(error = %e, "forwarding an alias create to its home region failed");
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "home_region_unavailable",
                format!(
                    "aliases are created in region {home} (--alias-home-region), which cannot \
                     be reached; retry later (generated codes are not affected)"
                ),
            ));
        }
    };
    if scan && matches!(outcome, CreateOutcome::Created(_)) {
        state.0.safety.wake_scanner();
    }
    let resp = match outcome {
        CreateOutcome::Created(s) => {
            (StatusCode::CREATED, Json(created_json(&state, &s))).into_response()
        }
        CreateOutcome::Replayed(s) => {
            let mut r = (StatusCode::CREATED, Json(created_json(&state, &s))).into_response();
            r.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
            r
        }
        CreateOutcome::AliasTaken => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "alias_taken",
                "this alias is already claimed",
            ))
        }
        CreateOutcome::IdempotencyMismatch => {
            return Err(ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                "this Idempotency-Key was used with a different body",
            ))
        }
        CreateOutcome::Collision(why) => {
            return Err(ApiError::new(StatusCode::CONFLICT, "code_collision", why))
        }
    };
    state
        .0
        .metrics
        .create_latency
        .observe(started.elapsed().as_secs_f64());
    Ok(resp)
}

/// Validates and normalises a destination and runs the create-time trust checks, in the order
/// that says the most: a URL that is no URL at all is a 400; a listed destination is a 403
/// `destination_blocked` even when it also carries credentials or names a private host (the
/// list is the better reason); then those 400s; then chained shorteners.
fn checked_destination(
    state: &AppState,
    raw: &str,
) -> Result<(String, lasthop_trust::Destination), ApiError> {
    let safety = &state.0.safety;
    let blocked = |refusal: crate::safety::Refusal| {
        safety.count_refusal(&refusal);
        let message = match &refusal {
            crate::safety::Refusal::List(_) => {
                "this destination is on a reputation list (phishing or malware)"
            }
            crate::safety::Refusal::ShortenerChain => {
                "this destination is another short link; shorten the final destination instead"
            }
        };
        ApiError::new(StatusCode::FORBIDDEN, "destination_blocked", message)
            .with_reason(refusal.reason())
    };
    let normalized = normalize_destination(raw, &state.0.config.url_policy);
    if let Err(UrlError::Credentials | UrlError::ForbiddenHost) = &normalized {
        if let Some(hit) = safety.listed(raw) {
            return Err(blocked(crate::safety::Refusal::List(hit.list)));
        }
    }
    let long_url = normalized.map_err(|e| ApiError::bad(e.code(), e.to_string()))?;
    let url = url::Url::parse(&long_url)
        .map_err(|e| ApiError::bad("url_invalid", format!("url does not parse: {e}")))?;
    // A normalised destination is an http(s) URL with a host, so this always exists.
    let dest = lasthop_trust::Destination::of_url(&url)
        .ok_or_else(|| ApiError::bad("url_invalid", "url has no host"))?;
    safety.check_destination(&url, &dest).map_err(blocked)?;
    Ok((long_url, dest))
}

/// An `expires_at` value: RFC 3339 and after `now`.
fn future_time(s: &str, now: i64) -> Result<i64, ApiError> {
    let at = parse_rfc3339(s).ok_or_else(|| {
        ApiError::bad(
            "invalid_expires_at",
            "expires_at must be an RFC 3339 timestamp",
        )
    })?;
    if at <= now {
        return Err(ApiError::bad(
            "expires_in_past",
            "expires_at must be in the future",
        ));
    }
    Ok(at)
}

/// A code no namespace can hold never existed: 404 without touching the store. `code` is a
/// link key: the code, or `domain/code` on a branded domain (`%2F` in a path).
fn check_code(code: &str) -> Result<(), ApiError> {
    if !lasthop_core::plausible_key(code.as_bytes()) {
        return Err(ApiError::not_found());
    }
    Ok(())
}

/// The link behind `code` if `who` may see it: its owner or an admin (404 never existed, 403
/// another owner's).
async fn fetch_visible(
    state: &AppState,
    who: &Principal,
    code: String,
) -> Result<StoredLink, ApiError> {
    Ok(fetch_anywhere(state, who, code).await?.0)
}

/// [`fetch_visible`], read through to the code's home region when this region does not have
/// it (yet): the link, and whether it is in this region's store. 503
/// `home_region_unavailable` when the home cannot say.
async fn fetch_anywhere(
    state: &AppState,
    who: &Principal,
    code: String,
) -> Result<(StoredLink, bool), ApiError> {
    check_code(&code)?;
    let store = Arc::clone(&state.0.store);
    let c = code.clone();
    let found = match blocking(move || store.get(&c)).await? {
        Some(s) => Some((s, true)),
        None => match state.0.peers.as_ref().cloned() {
            Some(peers) => match peers.home_elsewhere(&code) {
                Some(home) => {
                    let asked =
                        blocking(move || Ok::<_, StoreError>(peers.fetch_link(home, &code)))
                            .await?;
                    match asked {
                        Ok(link) => link.map(|s| (s, false)),
                        Err(e) => {
                            tracing::warn!(error = %e, "reading through to the home region failed");
                            return Err(ApiError::home_unavailable(home));
                        }
                    }
                }
                None => None,
            },
            None => None,
        },
    };
    let (s, local) = found.ok_or_else(ApiError::not_found)?;
    if !(who.admin || who.owner == s.link.owner) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "this link belongs to another owner",
        ));
    }
    allowed_domain(state, who, &s.link.code)?;
    Ok((s, local))
}

async fn get_link(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
) -> Result<Response, ApiError> {
    let s = fetch_visible(&state, &who, code).await?;
    Ok(Json(link_json(&state, &s, now_ms())).into_response())
}

async fn list_links(
    State(state): State<AppState>,
    Auth(who): Auth,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let limit = match q.get("limit") {
        None => DEFAULT_PAGE,
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=MAX_PAGE).contains(l))
            .ok_or_else(|| {
                ApiError::bad("invalid_limit", format!("limit must be 1..={MAX_PAGE}"))
            })?,
    };
    let cursor = q.get("cursor").filter(|c| !c.is_empty()).cloned();
    let store = Arc::clone(&state.0.store);
    let owner = who.owner.clone();
    let page = match q.get("tag") {
        None => blocking(move || store.list(&owner, cursor.as_deref(), limit)).await?,
        Some(tag) => {
            if !lasthop_core::tag_ok(tag) {
                return Err(ApiError::bad(
                    "invalid_tags",
                    "tag must be 1-32 of a-z, 0-9, _ and -",
                ));
            }
            let tag = tag.clone();
            blocking(move || tagged_page(&*store, &owner, &tag, cursor, limit)).await?
        }
    };
    let now = now_ms();
    // A key limited to domains sees its domains' links alone (a page may come back short).
    let links: Vec<_> = page
        .links
        .iter()
        .filter(|s| allowed_domain(&state, &who, &s.link.code).is_ok())
        .map(|s| link_json(&state, s, now))
        .collect();
    Ok(Json(json!({"links": links, "next_cursor": page.next_cursor})).into_response())
}

/// Links scanned, at most, for one page of `GET /v1/links?tag=`: a page of a rare tag may come
/// back short (with a cursor) rather than walk all of an owner's links at once.
const TAG_SCAN_MAX: usize = 20_000;

/// One page of `owner`'s links tagged `tag`, newest first: up to `limit` of them, from
/// `cursor`, scanning at most [`TAG_SCAN_MAX`] links (the cursor then continues the scan).
fn tagged_page(
    store: &dyn Store,
    owner: &str,
    tag: &str,
    mut cursor: Option<String>,
    limit: usize,
) -> Result<crate::store::LinkPage, StoreError> {
    let mut links = Vec::new();
    let mut scanned = 0;
    loop {
        let page = store.list(owner, cursor.as_deref(), MAX_PAGE)?;
        for s in page.links {
            scanned += 1;
            let seq = s.seq;
            if s.state.tags.iter().any(|t| t == tag) {
                links.push(s);
            }
            if links.len() == limit || scanned == TAG_SCAN_MAX {
                return Ok(crate::store::LinkPage {
                    links,
                    next_cursor: Some(store.list_cursor_after(seq)),
                });
            }
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => {
                return Ok(crate::store::LinkPage {
                    links,
                    next_cursor: None,
                })
            }
        }
    }
}

/// Every one of `owner`'s links that has tags: (link key, tags).
fn tagged_links(store: &dyn Store, owner: &str) -> Result<Vec<(String, Vec<String>)>, StoreError> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let page = store.list(owner, cursor.as_deref(), MAX_PAGE)?;
        out.extend(
            page.links
                .into_iter()
                .filter(|s| !s.state.deleted && !s.state.tags.is_empty())
                .map(|s| (s.link.code, s.state.tags)),
        );
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(out),
        }
    }
}

/// `GET /v1/tags`: the caller's tags, each with how many of its live links carry it, most
/// used first (a key limited to domains counts its domains' links alone).
async fn list_tags(State(state): State<AppState>, Auth(who): Auth) -> Result<Response, ApiError> {
    let store = Arc::clone(&state.0.store);
    let owner = who.owner.clone();
    let tagged = blocking(move || tagged_links(&*store, &owner)).await?;
    let mut counts: HashMap<String, u64> = HashMap::new();
    for (key, tags) in tagged {
        if allowed_domain(&state, &who, &key).is_ok() {
            for t in tags {
                *counts.entry(t).or_default() += 1;
            }
        }
    }
    let mut tags: Vec<(String, u64)> = counts.into_iter().collect();
    tags.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let tags: Vec<_> = tags
        .into_iter()
        .map(|(tag, links)| json!({"tag": tag, "links": links}))
        .collect();
    Ok(Json(json!({"tags": tags})).into_response())
}

/// `GET /v1/tags/{tag}/stats?from=&to=`: the stats of the caller's links tagged `tag`, summed
/// (this region's clicks; unique visitors merged as sketches, so a visitor of two of the links
/// counts once a day).
async fn tag_stats(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(tag): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    if !lasthop_core::tag_ok(&tag) {
        return Err(ApiError::bad(
            "invalid_tags",
            "tag must be 1-32 of a-z, 0-9, _ and -",
        ));
    }
    let clicks = clicks(&state)?;
    let (from, to) = crate::clicks::stats::range(
        q.get("from").map(String::as_str),
        q.get("to").map(String::as_str),
        Day::today(),
    )
    .map_err(|e| ApiError::bad(e.code(), e.to_string()))?;
    let store = Arc::clone(&state.0.store);
    let owner = who.owner.clone();
    let tagged = blocking(move || tagged_links(&*store, &owner)).await?;
    let keys: Vec<String> = tagged
        .into_iter()
        .filter(|(key, tags)| tags.contains(&tag) && allowed_domain(&state, &who, key).is_ok())
        .map(|(key, _)| key)
        .collect();
    let rollups = Arc::clone(clicks.store());
    let n = keys.len();
    let days = blocking(move || {
        let mut days = Vec::new();
        for key in &keys {
            crate::clicks::stats::merge(&mut days, rollups.range(key, from, to)?);
        }
        Ok::<_, crate::clicks::store::StoreError>(days)
    })
    .await?;
    let mut body = crate::clicks::stats::render(&tag, from, to, &days);
    if let Some(o) = body.as_object_mut() {
        o.remove("code");
    }
    body["tag"] = json!(tag);
    body["links"] = json!(n);
    Ok(Json(body).into_response())
}

async fn delete_link(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
) -> Result<Response, ApiError> {
    let (_, local) = fetch_anywhere(&state, &who, code.clone()).await?;
    let actor = who.actor();
    if !local {
        // Not replicated here yet: the home deletes it, and the deletion comes back.
        let peers = state.0.peers.as_ref().cloned();
        if let Some((peers, home)) = peers.and_then(|p| p.home_elsewhere(&code).map(|h| (p, h))) {
            let who = actor.to_string();
            let forwarded =
                blocking(move || Ok::<_, StoreError>(peers.forward_delete(home, &code, &who)))
                    .await?;
            return match forwarded {
                Ok(Some(_)) => Ok(StatusCode::NO_CONTENT.into_response()),
                Ok(None) => Err(ApiError::not_found()),
                Err(e) => {
                    tracing::warn!(error = %e, "forwarding a deletion to the home region failed");
                    Err(ApiError::home_unavailable(home))
                }
            };
        }
    }
    let store = Arc::clone(&state.0.store);
    match blocking(move || store.delete(&code, &actor)).await? {
        DeleteOutcome::Deleted | DeleteOutcome::AlreadyDeleted => {
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        DeleteOutcome::NotFound => Err(ApiError::not_found()),
    }
}

fn require_admin(who: &Principal) -> Result<(), ApiError> {
    if who.admin {
        Ok(())
    } else {
        Err(ApiError::forbidden("this call needs an admin key"))
    }
}

/// Applies `update` to a link `who` may see and answers with the link as `GET` shows it.
/// A deleted link's state is final: 409.
async fn update_link(
    state: &AppState,
    who: &Principal,
    code: String,
    update: StateUpdate,
) -> Result<Response, ApiError> {
    let (current, local) = fetch_anywhere(state, who, code.clone()).await?;
    if current.state.deleted {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "link_deleted",
            "this link was deleted; its state can no longer change",
        ));
    }
    let actor = who.actor();
    // A change that lifts a restriction (or sets an expiry, a pin) is the link's home region's
    // to apply: forwarded there, it comes back here by replication. One that only restricts
    // applies here at once, and reaches the home the same way; unless this region has not
    // replicated the link yet, when the home applies it too.
    if let Some(peers) = state.0.peers.as_ref() {
        let home = peers.home_elsewhere(&code);
        let forward = !local || !update.restricts_only(&current.state, &actor);
        if let (Some(home), true) = (home, forward) {
            let peers = Arc::clone(peers);
            let who = actor.to_string();
            let forwarded = blocking(move || {
                Ok::<_, StoreError>(peers.forward_update(home, &code, &update, &who))
            })
            .await?;
            return match forwarded {
                Ok(Some(updated)) => Ok(Json(link_json(state, &updated, now_ms())).into_response()),
                Ok(None) => Err(ApiError::not_found()),
                Err(e) => {
                    tracing::warn!(error = %e, "forwarding a change to the home region failed");
                    Err(ApiError::home_unavailable(home))
                }
            };
        }
    }
    let store = Arc::clone(&state.0.store);
    let updated = blocking(move || store.update_state(&code, update, &actor))
        .await?
        .ok_or_else(ApiError::not_found)?;
    Ok(Json(link_json(state, &updated, now_ms())).into_response())
}

/// A reason an operator gives: 1–200 characters after trimming, no control characters.
fn checked_reason(raw: &str) -> Result<String, ApiError> {
    let reason = raw.trim();
    if !(1..=MAX_REASON_CHARS).contains(&reason.chars().count())
        || reason.chars().any(char::is_control)
    {
        return Err(ApiError::bad(
            "invalid_reason",
            format!("reason must be 1-{MAX_REASON_CHARS} characters, no control characters"),
        ));
    }
    Ok(reason.to_string())
}

async fn takedown_link(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    check_code(&code)?;
    let parsed: TakedownBody = parse_json(&read_body(body).await?)?;
    let reason = checked_reason(&parsed.reason)?;
    tracing::info!(%code, reason, warn = parsed.warn, by = %who.key_id, "takedown");
    let update = StateUpdate::Takedown {
        reason,
        warn: parsed.warn,
    };
    update_link(&state, &who, code, update).await
}

async fn restore_link(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    tracing::info!(%code, by = %who.key_id, "restore");
    update_link(&state, &who, code, StateUpdate::Restore).await
}

async fn patch_link(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
    body: Body,
) -> Result<Response, ApiError> {
    check_code(&code)?;
    let parsed: PatchBody = parse_json(&read_body(body).await?)?;
    let now = now_ms();
    let expires_at_ms = match parsed.expires_at {
        None => None,
        Some(None) => Some(None),
        Some(Some(s)) => Some(Some(future_time(&s, now)?)),
    };
    let options = OptionFields {
        redirect_status: parsed.redirect_status,
        cache_seconds: parsed.cache_seconds,
        forward_query: parsed.forward_query,
        query_precedence: parsed.query_precedence,
    }
    .patch()?;
    let tags = parsed.tags.as_deref().map(checked_tags).transpose()?;
    let update = StateUpdate::Settings {
        disabled: parsed.disabled,
        expires_at_ms,
        options: (!options.is_empty()).then_some(options),
        tags,
    };
    if parsed.long_url.is_none() && parsed.utm.is_none() {
        return update_link(&state, &who, code, update).await;
    }
    // A destination edit: every check a create's destination gets, before anything changes.
    if state.0.safety.config().no_edits {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "edits_disabled",
            "destination edits are turned off on this fleet (--no-edits)",
        ));
    }
    let (current, _) = fetch_anywhere(&state, &who, code.clone()).await?;
    if current.state.deleted {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "link_deleted",
            "this link was deleted; its state can no longer change",
        ));
    }
    let from = current.state.url(&current.link).to_string();
    let base = parsed.long_url.as_deref().unwrap_or(&from);
    let requested = match &parsed.utm {
        Some(utm) => utm.apply(base)?,
        None => base.to_string(),
    };
    let (long_url, dest) = checked_destination(&state, &requested)?;
    let settings_change = matches!(
        &update,
        StateUpdate::Settings { disabled, expires_at_ms, options, tags }
            if disabled.is_some() || expires_at_ms.is_some() || options.is_some() || tags.is_some()
    );
    let settled = if settings_change {
        Some(update_link(&state, &who, code.clone(), update).await?)
    } else {
        None
    };
    if long_url == from && current.state.pending_destination.is_none() {
        // The destination it already has: nothing to edit; the link as the settings left it.
        return Ok(
            settled.unwrap_or_else(|| Json(link_json(&state, &current, now_ms())).into_response())
        );
    }
    // Velocity counts an edit as it counts a create, against the link's owner.
    let safety = Arc::clone(&state.0.safety);
    let owner = current.link.owner.clone();
    let now = now_ms();
    let hold = blocking(move || safety.hold_for(&owner, &dest, now)).await?;
    if let Some(hold) = hold {
        state.0.safety.count_hold(hold);
    }
    let edit = StateUpdate::Edit {
        from: crate::store::destination_hash(&from),
        to: crate::store::destination_hash(&long_url),
        long_url,
        hold,
    };
    tracing::info!(%code, by = %who.key_id, held = ?hold, "destination edit");
    let answer = update_link(&state, &who, code, edit).await?;
    if state.0.safety.scans() {
        state.0.safety.wake_scanner();
    }
    Ok(answer)
}

/// How far back `GET /v1/links/{code}/enforcement` looks for a link's last change.
pub const ENFORCEMENT_WINDOW: u64 = 200_000;

/// The most recent change to `code` among the last `window` changes of the log (up to
/// `last_seq`): `(seq, state change?)`, or `None` when there is none in the window.
fn last_change_of(
    store: &dyn Store,
    code: &str,
    last_seq: u64,
    window: u64,
) -> Result<Option<(u64, bool)>, StoreError> {
    let mut found = None;
    crate::store::walk_changes(
        store,
        last_seq.saturating_sub(window),
        last_seq,
        1_000,
        &mut |seq, change| match change {
            lasthop_core::Change::StateChanged { code: c, .. } if c == code => {
                found = Some((seq, true))
            }
            lasthop_core::Change::LinkCreated { link, .. } if link.code == code => {
                found = Some((seq, false))
            }
            _ => {}
        },
    )?;
    Ok(found)
}

/// `GET /v1/links/{code}/enforcement` (admin): "is the takedown we issued enforced?" For the
/// link's last change (a state change, else its creation), the engines whose reported
/// sequence has reached it and those whose has not (missing ones included: nobody knows what
/// they serve). A change older than the last [`ENFORCEMENT_WINDOW`] changes is not located
/// exactly; then `change_seq` is null, `at_or_before` bounds it, and an engine counts as having
/// applied it when it reached that bound.
async fn enforcement(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let store = Arc::clone(&state.0.store);
    let fleet = Arc::clone(&state.0.fleet);
    let lookup = code.clone();
    let (link, last_seq, change) = blocking(move || {
        fleet.refresh(now_ms())?;
        let Some(link) = store.get(&lookup)? else {
            return Ok::<_, StoreError>(None);
        };
        let last_seq = store.last_seq()?;
        let change = last_change_of(&*store, &lookup, last_seq, ENFORCEMENT_WINDOW)?;
        Ok(Some((link, last_seq, change)))
    })
    .await?
    .ok_or_else(ApiError::not_found)?;
    // Not in the window: the creation if that is inside it's impossible (it would have been
    // found), so the change lies at or before the window's start.
    let window_start = last_seq.saturating_sub(ENFORCEMENT_WINDOW).max(link.seq);
    let (need, change_seq, kind) = match change {
        Some((seq, true)) => (seq, Some(seq), "state_changed"),
        Some((seq, false)) => (seq, Some(seq), "created"),
        None => (window_start, None, "before_window"),
    };
    let now = now_ms();
    let edges = state
        .0
        .fleet
        .view(last_seq, now, state.0.config.edge_lag_alarm_secs);
    let entry = |e: &crate::fleet::EdgeView| json!({"engine": e.engine, "pop": e.pop, "state": e.state, "applied_seq": e.applied_seq});
    let (applied, pending): (Vec<_>, Vec<_>) = edges.iter().partition(|e| e.applied_seq >= need);
    Ok(Json(json!({
        "code": lasthop_core::split_key_str(&code).1,
        "domain": domain_of(&state, &code),
        "status": api_status(&link.state, now),
        "change": kind,
        "change_seq": change_seq,
        "at_or_before": if change_seq.is_none() { Some(need) } else { None },
        "last_seq": last_seq,
        "enforced": pending.is_empty(),
        "applied": applied.into_iter().map(entry).collect::<Vec<_>>(),
        "pending": pending.into_iter().map(entry).collect::<Vec<_>>(),
    }))
    .into_response())
}

/// `DELETE /v1/edges/{engine}`: an admin takes an engine off the fleet (decommissioned): 204,
/// or 404 `unknown_engine`. It stops counting for the lag alarm.
async fn remove_edge(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(engine): Path<String>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let fleet = Arc::clone(&state.0.fleet);
    let name = engine.clone();
    let known = blocking(move || fleet.remove(&name, now_ms())).await?;
    if !known {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "unknown_engine",
            "no engine by that id on the fleet",
        ));
    }
    tracing::info!(%engine, by = %who.owner, "engine removed from the fleet");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/regions`: this region and each peer region's replication (applied position, lag in
/// changes and seconds, connected or not, the alarm). Without `--peer`: this region alone.
async fn list_regions(
    State(state): State<AppState>,
    Auth(who): Auth,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let body = match state.0.peers.as_ref() {
        Some(peers) => peers.view(now_ms()),
        None => json!({"peers": []}),
    };
    Ok(Json(body).into_response())
}

/// `GET /v1/me`: who the presented key is (`{owner, admin, key_id}`), so a client (the
/// console's sign-in) can check a key and learn its role.
async fn me(Auth(who): Auth) -> Response {
    Json(json!({"owner": who.owner, "admin": who.admin, "key_id": who.key_id})).into_response()
}

/// `GET /v1/edges`: every engine on the fleet, with its state (core/FEED.md).
async fn list_edges(State(state): State<AppState>, Auth(who): Auth) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let store = Arc::clone(&state.0.store);
    let fleet = Arc::clone(&state.0.fleet);
    let last_seq = blocking(move || {
        // Engines that report to other control planes on the store, as of now.
        fleet.refresh(now_ms())?;
        store.last_seq()
    })
    .await?;
    let edges = state
        .0
        .fleet
        .view(last_seq, now_ms(), state.0.config.edge_lag_alarm_secs);
    Ok(Json(json!({"last_seq": last_seq, "edges": edges})).into_response())
}

/// `POST /v1/admin/snapshots`: build and publish a snapshot now; 201 with its frame.
async fn publish_snapshot(
    State(state): State<AppState>,
    Auth(who): Auth,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let publisher = state.0.snapshots.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "snapshots_unavailable",
            "this server does not publish snapshots",
        )
    })?;
    match publisher.publish().await {
        Ok(frame) => {
            tracing::info!(id = %frame.id, seq = frame.seq, by = %who.owner, "published a snapshot on demand");
            Ok((StatusCode::CREATED, Json(frame)).into_response())
        }
        Err(e) => {
            tracing::error!(error = %ErrorChain(&e), "on-demand snapshot failed");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "snapshot_failed",
                "the snapshot build failed; see the server log",
            ))
        }
    }
}

fn clicks(state: &AppState) -> Result<ClicksHandle, ApiError> {
    state.0.clicks.as_ref().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "stats_unavailable",
            "this server runs no click processor (--clicks off)",
        )
    })
}

/// `GET /v1/links/{code}/stats?from=&to=`: the owner's (or an admin's) view of a link's clicks,
/// bots beside humans. With peer regions (`--peer`), each is asked for its clicks of the link
/// (they stay where they were counted) and the answers are merged; `regions` says which
/// regions' numbers are in it (`answered`) and which could not be asked (`unavailable`, with
/// why): a region that does not answer leaves its clicks out, never the whole answer.
async fn link_stats(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let clicks = clicks(&state)?;
    let link = fetch_visible(&state, &who, code.clone()).await?;
    // What the link's previous shortener counted (an import's `--with-clicks`), apart.
    let imported_clicks = link.state.imported_clicks;
    let (from, to) = crate::clicks::stats::range(
        q.get("from").map(String::as_str),
        q.get("to").map(String::as_str),
        Day::today(),
    )
    .map_err(|e| ApiError::bad(e.code(), e.to_string()))?;
    let store = Arc::clone(clicks.store());
    let c = code.clone();
    let mut days = blocking(move || store.range(&c, from, to)).await?;
    // The answer names the code and its domain (`render` keys by the link key).
    let named = |mut body: serde_json::Value| {
        body["code"] = json!(lasthop_core::split_key_str(&code).1);
        body["domain"] = json!(domain_of(&state, &code));
        if let Some(n) = imported_clicks {
            body["imported_clicks"] = json!(n);
        }
        body
    };
    let Some(peers) = state.0.peers.as_ref().cloned() else {
        let body = named(crate::clicks::stats::render(&code, from, to, &days));
        return Ok(Json(body).into_response());
    };
    // Every region asked at once.
    let asks = peers.regions().into_iter().map(|region| {
        let (peers, code) = (Arc::clone(&peers), code.clone());
        async move {
            let ask = offload("asking a peer region for stats", move || {
                peers.stats(region, &code, from, to)
            });
            (region, ask.await)
        }
    });
    let asked = futures_util::future::join_all(asks).await;
    let mut answered = vec![peers.region()];
    let mut unavailable = Vec::new();
    for (region, ask) in asked {
        let theirs = match ask {
            Ok(Ok(wire)) => crate::clicks::stats::from_wire(wire),
            Ok(Err(e)) => Err(e.to_string()),
            Err(e) => Err(format!("the request failed: {}", e.source)),
        };
        match theirs {
            Ok(theirs) => {
                crate::clicks::stats::merge(&mut days, theirs);
                answered.push(region);
            }
            Err(error) => {
                tracing::warn!(region, %code, %error, "a peer region's stats are missing from an answer");
                unavailable.push(json!({"region": region, "error": error}));
            }
        }
    }
    answered.sort_unstable();
    let mut body = named(crate::clicks::stats::render(&code, from, to, &days));
    body["regions"] = json!({"answered": answered, "unavailable": unavailable});
    Ok(Json(body).into_response())
}

/// `GET /v1/links/{code}/qr.svg?size=N`: the short URL as a QR code, an SVG document of N×N
/// pixels (64–2048, default 512), for the link's owner or an admin.
async fn link_qr_svg(
    state: State<AppState>,
    who: Auth,
    code: LinkKey,
    q: Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    link_qr(state, who, code, q, false).await
}

/// `GET /v1/links/{code}/qr.png?size=N`: the short URL as a QR code, a PNG of exactly N×N
/// pixels (64–2048, default 512), for the link's owner or an admin.
async fn link_qr_png(
    state: State<AppState>,
    who: Auth,
    code: LinkKey,
    q: Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    link_qr(state, who, code, q, true).await
}

/// The QR image of a link's short URL, PNG or SVG.
async fn link_qr(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
    Query(q): Query<HashMap<String, String>>,
    png: bool,
) -> Result<Response, ApiError> {
    let size = crate::qr::size(q.get("size").map(String::as_str))?;
    let s = fetch_visible(&state, &who, code).await?;
    let url = short_url(&state, &s.link.code);
    Ok(if png {
        let png = blocking(move || crate::qr::png(&url, size)).await?;
        qr_response("image/png", png)
    } else {
        qr_response("image/svg+xml", crate::qr::svg(&url, size)?.into_bytes())
    })
}

impl From<crate::qr::QrError> for ApiError {
    fn from(e: crate::qr::QrError) -> ApiError {
        match e {
            crate::qr::QrError::BadSize => ApiError::bad("invalid_size", e.to_string()),
            crate::qr::QrError::TooSmall { .. } => ApiError::bad("size_too_small", e.to_string()),
            _ => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "qr_failed",
                e.to_string(),
            ),
        }
    }
}

/// A QR image: its type, cacheable by the caller alone for a day (the short URL never changes).
fn qr_response(content_type: &'static str, body: Vec<u8>) -> Response {
    (
        [
            (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
            (
                header::CACHE_CONTROL,
                HeaderValue::from_static("private, max-age=86400"),
            ),
            (
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            ),
        ],
        body,
    )
        .into_response()
}

impl From<crate::clicks::RollupStoreError> for ApiError {
    fn from(e: crate::clicks::RollupStoreError) -> ApiError {
        tracing::error!(error = %e, "reading stats");
        match e {
            crate::clicks::RollupStoreError::Corrupt { .. } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "corrupt_rollup",
                "a stored rollup of this link is unreadable; recomputing its day repairs it (see the server log)",
            ),
            _ => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "storage_unavailable",
                "stats are unavailable, retry later",
            ),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecomputeBody {
    day: String,
}

/// `POST /v1/admin/clicks/recompute {"day":"YYYY-MM-DD"}`: rebuild a day from the archive with
/// the current rules, replacing its streaming numbers.
async fn recompute_clicks(
    State(state): State<AppState>,
    Auth(who): Auth,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let parsed: RecomputeBody = parse_json(&read_body(body).await?)?;
    let day = Day::parse(&parsed.day)
        .ok_or_else(|| ApiError::bad("invalid_date", "day must be a date, YYYY-MM-DD"))?;
    let clicks = clicks(&state)?;
    tracing::info!(%day, by = %who.owner, "recompute requested");
    match clicks.recompute(day).await {
        Ok(report) => Ok(Json(report).into_response()),
        Err(e @ RecomputeError::NoArchive(_)) => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "no_archive",
            e.to_string(),
        )),
        Err(e @ RecomputeError::ArchiveIncomplete(_)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "archive_incomplete",
            e.to_string(),
        )),
        Err(e @ RecomputeError::DayOpen(_)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "day_open",
            e.to_string(),
        )),
        Err(e) => {
            tracing::error!(error = %e, %day, "recompute failed");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "recompute_failed",
                "the recompute failed; see the server log",
            ))
        }
    }
}

async fn resolve(
    State(state): State<AppState>,
    Auth(_who): Auth,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = read_body(body).await?;
    let parsed: ResolveBody = parse_json(&bytes)?;
    if parsed.codes.len() > MAX_RESOLVE {
        return Err(ApiError::bad(
            "too_many_codes",
            format!("at most {MAX_RESOLVE} codes per call"),
        ));
    }
    let store = Arc::clone(&state.0.store);
    let found = blocking(move || {
        parsed
            .codes
            .into_iter()
            .map(|code| {
                // A code, or a branded link's key (`domain/code`).
                let s = if !lasthop_core::plausible_key(code.as_bytes()) {
                    None
                } else {
                    store.get(&code)?
                };
                Ok((code, s))
            })
            .collect::<Result<Vec<_>, StoreError>>()
    })
    .await?;
    let now = now_ms();
    let results: Vec<_> = found
        .into_iter()
        .map(|(code, s)| match s {
            None => json!({"code": code, "status": "not_found", "long_url": null}),
            Some(s) => {
                let status = s.state.status(now);
                json!({
                    "code": code,
                    "status": api_status(&s.state, now),
                    "long_url": (status == LinkStatus::Active).then(|| s.state.url(&s.link)),
                })
            }
        })
        .collect();
    Ok(Json(json!({"results": results})).into_response())
}

async fn metrics(State(state): State<AppState>) -> Response {
    // Lag grows with time alone, so the edge gauges are computed at each scrape.
    let last_seq = *state.0.store.commits().borrow();
    let summary = summarize(&state.0.fleet.view(
        last_seq,
        now_ms(),
        state.0.config.edge_lag_alarm_secs,
    ));
    let m = &state.0.metrics;
    let cache = state.0.store.cache_bytes().unwrap_or(0);
    m.store_cache_bytes
        .set(i64::try_from(cache).unwrap_or(i64::MAX));
    m.edge_engines
        .set(i64::try_from(summary.engines).unwrap_or(i64::MAX));
    m.edge_worst_lag_seconds.set(summary.worst_lag_seconds);
    m.edge_worst_lag_sequences
        .set(i64::try_from(summary.worst_lag_seq).unwrap_or(i64::MAX));
    m.edge_lag_alarm.set(i64::from(
        summary.worst_lag_seconds > state.0.config.edge_lag_alarm_secs,
    ));
    let (store, st) = (Arc::clone(&state.0.store), state.clone());
    match offload("reading the domains", move || {
        domains::summary(store.as_ref(), &st.0.domain_summary)
    })
    .await
    {
        Ok(Ok(summary)) => summary.set(m),
        Ok(Err(e)) => tracing::warn!(error = %e, "metrics: the domains could not be read"),
        Err(_) => {}
    }
    if let Some(peers) = state.0.peers.as_ref() {
        for p in peers.status(now_ms()) {
            let region = p.region.to_string();
            m.peer_connected
                .with_label_values(&[&region])
                .set(i64::from(p.connected));
            m.peer_lag_changes
                .with_label_values(&[&region])
                .set(i64::try_from(p.lag_changes).unwrap_or(i64::MAX));
            m.peer_lag_seconds
                .with_label_values(&[&region])
                .set(p.lag_seconds);
            m.peer_lag_alarm
                .with_label_values(&[&region])
                .set(i64::from(p.alarm));
        }
    }
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4"),
        )],
        state.0.metrics.render(),
    )
        .into_response()
}

async fn fallback() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "no_route", "no such endpoint")
}

async fn record(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "unmatched".into());
    let started = Instant::now();
    let resp = next.run(req).await;
    let m = &state.0.metrics;
    m.requests
        .with_label_values(&[route.as_str(), resp.status().as_str()])
        .inc();
    m.latency
        .with_label_values(&[route.as_str()])
        .observe(started.elapsed().as_secs_f64());
    resp
}

/// The API router.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/links", post(create_link).get(list_links))
        .route(
            "/v1/links/{code}",
            get(get_link).delete(delete_link).patch(patch_link),
        )
        .route("/v1/links/{code}/takedown", post(takedown_link))
        .route("/v1/links/{code}/restore", post(restore_link))
        .route("/v1/links/{code}/unpin", post(safety::unpin_link))
        .route("/v1/links/{code}/appeal", post(safety::appeal))
        .route("/v1/links/{code}/history", get(safety::history))
        .route("/v1/links/{code}/enforcement", get(enforcement))
        .route("/v1/links/{code}/stats", get(link_stats))
        .route("/v1/tags", get(list_tags))
        .route("/v1/imports/links", post(imports::import_links))
        .route("/v1/exports/links", get(imports::export_links))
        .route("/v1/tags/{tag}/stats", get(tag_stats))
        .route("/v1/links/{code}/qr.svg", get(link_qr_svg))
        .route("/v1/links/{code}/qr.png", get(link_qr_png))
        .route("/v1/reports", post(safety::report))
        .route("/v1/reports/thanks", get(safety::thanks))
        .route("/v1/admin/reports", get(safety::list_reports))
        .route(
            "/v1/admin/reports/{id}/resolve",
            post(safety::resolve_report),
        )
        .route("/v1/admin/links", get(safety::links_by_host))
        .route(
            "/v1/admin/hosts/{host}/takedown",
            post(safety::takedown_host),
        )
        .route("/v1/admin/owners", get(safety::list_owners))
        .route("/v1/admin/owners/{owner}/suspend", post(safety::suspend))
        .route(
            "/v1/admin/owners/{owner}/unsuspend",
            post(safety::unsuspend),
        )
        .route("/v1/admin/owners/{owner}/unflag", post(safety::unflag))
        .route("/v1/admin/apikeys", get(safety::list_keys))
        .route(
            "/v1/admin/apikeys/{id}",
            axum::routing::delete(safety::revoke_key),
        )
        .route("/v1/domains", post(domains::add).get(domains::list))
        .route(
            "/v1/domains/{domain}",
            get(domains::get_one)
                .patch(domains::patch)
                .delete(domains::delete),
        )
        .route(
            "/v1/domains/{domain}/certificate",
            axum::routing::put(domains::put_certificate),
        )
        .route("/v1/domains/{domain}/renew", post(domains::renew))
        .route("/v1/admin/domains/{domain}/suspend", post(domains::suspend))
        .route(
            "/v1/admin/domains/{domain}/unsuspend",
            post(domains::unsuspend),
        )
        .route("/v1/me", get(me))
        .route("/v1/resolve", post(resolve))
        .route("/v1/edges", get(list_edges))
        .route("/v1/regions", get(list_regions))
        .route("/v1/edges/{engine}", axum::routing::delete(remove_edge))
        .route("/v1/admin/snapshots", post(publish_snapshot))
        .route("/v1/admin/clicks/recompute", post(recompute_clicks))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(fallback)
        .layer(axum::middleware::from_fn_with_state(state.clone(), record))
        .with_state(state)
}
