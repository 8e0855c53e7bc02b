//! The trust-and-safety calls (README "Trust and safety"): anonymous reports and the review
//! queue, owners' appeals, a link's history, pinning, links by destination host and host
//! takedowns, flagged and suspended owners, API keys.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{ConnectInfo, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use lasthop_core::Hold;
use lasthop_trust::CanonicalHost;
use serde::Deserialize;
use serde_json::json;

use super::{
    blocking, check_code, checked_reason, fetch_visible, link_json, parse_json, read_body,
    require_admin, update_link, ApiError, AppState, Auth, LinkKey, DEFAULT_PAGE, MAX_PAGE,
};
use crate::clock::{now_ms, rfc3339};
use crate::safety::enforce;
use crate::store::{
    OwnerRecord, Report, ReportFilter, ReportKind, Resolution, StateUpdate, StoreError, Suspension,
};

/// Longest report details or appeal message, in characters.
pub const MAX_DETAILS_CHARS: usize = 2000;

/// The page a report form's 303 lands on (and every page here) may load nothing.
const PAGE_HEADERS: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'none'; style-src 'unsafe-inline'",
    ),
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
];

fn page_limit(q: &HashMap<String, String>) -> Result<usize, ApiError> {
    match q.get("limit") {
        None => Ok(DEFAULT_PAGE),
        Some(l) => l
            .parse::<usize>()
            .ok()
            .filter(|l| (1..=MAX_PAGE).contains(l))
            .ok_or_else(|| ApiError::bad("invalid_limit", format!("limit must be 1..={MAX_PAGE}"))),
    }
}

fn report_json(r: &Report) -> serde_json::Value {
    json!({
        "id": r.id,
        "kind": r.kind,
        "code": lasthop_core::split_key_str(&r.code).1,
        "domain": lasthop_core::split_key_str(&r.code).0,
        "reason": r.reason,
        "details": r.details,
        "by": r.by,
        "created_at": rfc3339(r.created_at_ms),
        "status": if r.resolution.is_some() { "resolved" } else { "open" },
        "resolution": r.resolution.as_ref().map(|res| json!({
            "action": res.action,
            "by": res.by,
            "at": rfc3339(res.at_ms),
        })),
    })
}

/// Free text from a stranger: at most `max` characters, control characters (newlines aside)
/// dropped.
fn clean_text(s: &str, max: usize) -> Result<String, ApiError> {
    if s.chars().count() > max {
        return Err(ApiError::bad(
            "details_too_long",
            format!("at most {max} characters"),
        ));
    }
    Ok(s.chars()
        .filter(|c| !c.is_control() || *c == '\n')
        .collect::<String>()
        .trim()
        .to_string())
}

/// `POST /v1/links/{code}/unpin` (admin): automatic verdicts apply to the link again.
pub async fn unpin_link(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    tracing::info!(%code, by = %who.key_id, "unpin");
    update_link(&state, &who, code, StateUpdate::Unpin).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AppealBody {
    message: String,
}

/// `POST /v1/links/{code}/appeal {"message"}` (the owner, or an admin): asks for a review of
/// a takedown, flag or hold; lands in the review queue.
pub async fn appeal(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
    body: Body,
) -> Result<Response, ApiError> {
    let parsed: AppealBody = parse_json(&read_body(body).await?)?;
    let message = clean_text(&parsed.message, MAX_DETAILS_CHARS)?;
    if message.is_empty() {
        return Err(ApiError::bad(
            "invalid_message",
            "message must not be empty",
        ));
    }
    let s = fetch_visible(&state, &who, code.clone()).await?;
    let st = &s.state;
    if st.deleted || !(st.takedown_reason.is_some() || st.warn || st.held.is_some()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_restricted",
            "this link is not taken down, flagged or held; there is nothing to appeal",
        ));
    }
    let report = Report {
        id: 0,
        kind: ReportKind::Appeal,
        code,
        reason: "appeal".to_string(),
        details: Some(message),
        created_at_ms: now_ms(),
        by: Some(who.owner.clone()),
        resolution: None,
    };
    let store = Arc::clone(&state.0.store);
    let filed = blocking(move || store.add_report(report)).await?;
    state.0.metrics.reports.with_label_values(&["appeal"]).inc();
    tracing::info!(code = %filed.code, id = filed.id, by = %who.key_id, "appeal filed");
    Ok((StatusCode::CREATED, Json(report_json(&filed))).into_response())
}

/// `GET /v1/links/{code}/history` (owner or admin): the link's audit records, oldest first.
pub async fn history(
    State(state): State<AppState>,
    Auth(who): Auth,
    LinkKey(code): LinkKey,
) -> Result<Response, ApiError> {
    let link = fetch_visible(&state, &who, code.clone()).await?;
    let store = Arc::clone(&state.0.store);
    let lookup = code.clone();
    let mut records = blocking(move || store.history(&lookup)).await?;
    // The creation is recorded only when it was held; otherwise it is the link's own facts.
    if records.first().is_none_or(|r| r.action != "created") {
        records.insert(
            0,
            crate::store::AuditRecord::new(
                link.link.created_at_ms,
                link.link.owner.clone(),
                "created",
                None,
            ),
        );
    }
    let history: Vec<_> = records
        .iter()
        .map(|r| {
            json!({
                "at": rfc3339(r.at_ms),
                "actor": r.actor,
                "action": r.action,
                "reason": r.reason,
                "undid": r.undid,
                "origin": r.origin,
            })
        })
        .collect();
    let (domain, bare) = lasthop_core::split_key_str(&code);
    Ok(Json(json!({"code": bare, "domain": domain, "history": history})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportBody {
    /// The code, or a branded link's key (`domain/code`, as the edge's pages send it).
    code: String,
    /// The code's branded domain, for a bare code (absent: the default domain).
    #[serde(default)]
    domain: Option<String>,
    reason: String,
    #[serde(default)]
    details: Option<String>,
}

/// The client's network for rate limiting: the /24 of an IPv4 address, the /48 of an IPv6
/// one; one bucket for callers whose address is unknown (the router tests).
fn client_network(addr: Option<SocketAddr>) -> String {
    match addr.map(|a| a.ip()) {
        Some(IpAddr::V4(ip)) => {
            let o = ip.octets();
            format!("{}.{}.{}.0/24", o[0], o[1], o[2])
        }
        Some(IpAddr::V6(ip)) => match ip.to_ipv4_mapped() {
            Some(v4) => client_network(Some(SocketAddr::new(IpAddr::V4(v4), 0))),
            None => {
                let s = ip.segments();
                format!("{:x}:{:x}:{:x}::/48", s[0], s[1], s[2])
            }
        },
        None => "unknown".to_string(),
    }
}

fn html_page(status: StatusCode, title: &str, text: &str) -> Response {
    let body = format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<meta name=\"robots\" content=\"noindex\"><title>{title}</title>\
<style>body{{font:16px/1.5 system-ui,sans-serif;max-width:40em;margin:3em auto;padding:0 1em}}</style>\
</head>\n<body><main><h1>{title}</h1>\n<p>{text}</p></main></body></html>\n",
        title = html_escape(title),
        text = html_escape(text)
    );
    let mut resp = (status, body).into_response();
    let headers = resp.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/html; charset=utf-8"),
    );
    for (name, value) in PAGE_HEADERS {
        headers.insert(name, HeaderValue::from_static(value));
    }
    resp
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `POST /v1/reports {"code", "reason", "details"?}`, no API key: files a report in the review
/// queue (201). An HTML form post (`application/x-www-form-urlencoded`, the edge pages' "report
/// this link" form) is answered with a 303 to the thank-you page, and its errors as pages.
/// Rate-limited per client network.
pub async fn report(State(state): State<AppState>, req: Request) -> Response {
    let connect = req
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let form = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.trim_start()
                .to_ascii_lowercase()
                .starts_with("application/x-www-form-urlencoded")
        });
    let network = client_network(connect);
    match file_report(&state, &network, form, req.into_body()).await {
        Ok(filed) if form => {
            let mut resp = StatusCode::SEE_OTHER.into_response();
            resp.headers_mut().insert(
                header::LOCATION,
                HeaderValue::from_static("/v1/reports/thanks"),
            );
            let _ = filed;
            resp
        }
        Ok(filed) => (StatusCode::CREATED, Json(report_json(&filed))).into_response(),
        Err(e) if form => {
            let status = e.status;
            let mut resp = html_page(status, "The report was not sent", &e.message);
            if let Some(secs) = e.retry_after {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            resp
        }
        Err(e) => e.into_response(),
    }
}

async fn file_report(
    state: &AppState,
    network: &str,
    form: bool,
    body: Body,
) -> Result<Report, ApiError> {
    // Everyone's bucket first: a flood from many networks (an IPv6 provider hands out
    // /48s by the thousand) is bounded before it can grow the per-network map.
    let now = std::time::Instant::now();
    if let Err(secs) = state
        .0
        .report_global
        .check("all", now)
        .and_then(|()| state.0.report_limiter.check(network, now))
    {
        return Err(ApiError {
            retry_after: Some(secs),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limited",
                "too many reports from this network; retry later",
            )
        });
    }
    let bytes = read_body(body).await?;
    let parsed: ReportBody = if form {
        serde_urlencoded::from_bytes(&bytes)
            .map_err(|e| ApiError::bad("invalid_form", format!("the form does not parse: {e}")))?
    } else {
        parse_json(&bytes)?
    };
    let code = parsed
        .code
        .trim()
        .trim_start_matches('/')
        .trim_end_matches('+');
    let code = if code.contains('/') {
        code.to_string()
    } else {
        lasthop_core::link_key(
            super::branded_domain(state, parsed.domain.as_deref()).as_deref(),
            code,
        )
    };
    check_code(&code)?;
    let reason = checked_reason(&parsed.reason)?;
    let details = parsed
        .details
        .as_deref()
        .map(|d| clean_text(d, MAX_DETAILS_CHARS))
        .transpose()?
        .filter(|d| !d.is_empty());
    let store = Arc::clone(&state.0.store);
    let lookup = code.clone();
    let exists = blocking(move || store.get(&lookup)).await?.is_some();
    if !exists {
        return Err(ApiError::not_found());
    }
    let report = Report {
        id: 0,
        kind: ReportKind::Report,
        code,
        reason,
        details,
        created_at_ms: now_ms(),
        by: None,
        resolution: None,
    };
    let store = Arc::clone(&state.0.store);
    let filed = blocking(move || store.add_report(report)).await?;
    state.0.metrics.reports.with_label_values(&["report"]).inc();
    tracing::info!(code = %filed.code, id = filed.id, reason = %filed.reason, "report filed");
    Ok(filed)
}

/// `GET /v1/reports/thanks`: where a report form lands.
pub async fn thanks() -> Response {
    html_page(
        StatusCode::OK,
        "Thank you",
        "Your report was received. Our trust and safety team reviews every report; links found \
         to be phishing, malware or spam stop working everywhere within seconds.",
    )
}

/// `GET /v1/admin/reports?status=open|resolved|all&cursor=&limit=` (admin): the review
/// queue, oldest first.
pub async fn list_reports(
    State(state): State<AppState>,
    Auth(who): Auth,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let limit = page_limit(&q)?;
    let status = q.get("status").map(String::as_str).unwrap_or("open");
    let filter = match status {
        "open" => ReportFilter::Open,
        "resolved" => ReportFilter::Resolved,
        "all" => ReportFilter::All,
        _ => {
            return Err(ApiError::bad(
                "invalid_status",
                "status must be open, resolved or all",
            ))
        }
    };
    let cursor = q.get("cursor").filter(|c| !c.is_empty()).cloned();
    let store = Arc::clone(&state.0.store);
    let page = blocking(move || store.reports(filter, cursor.as_deref(), limit)).await?;
    let reports: Vec<_> = page.reports.iter().map(report_json).collect();
    Ok(Json(json!({"reports": reports, "next_cursor": page.next_cursor})).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveBody {
    action: String,
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /v1/admin/reports/{id}/resolve {"action": "takedown"|"warn"|"restore"|"dismiss",
/// "reason"?}` (admin): acts on the reported link (through the feed) and closes the report.
pub async fn resolve_report(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(id): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let not_found = || ApiError::new(StatusCode::NOT_FOUND, "report_not_found", "no such report");
    let id: u64 = id.parse().map_err(|_| not_found())?;
    let parsed: ResolveBody = parse_json(&read_body(body).await?)?;
    let store = Arc::clone(&state.0.store);
    let report = blocking(move || store.report(id))
        .await?
        .ok_or_else(not_found)?;
    if report.resolution.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "report_resolved",
            "this report was already resolved",
        ));
    }
    let reason = match &parsed.reason {
        Some(r) => checked_reason(r)?,
        None => format!("report {id}: {}", report.reason),
    };
    let update = match parsed.action.as_str() {
        "takedown" => Some(StateUpdate::Takedown {
            reason,
            warn: false,
        }),
        "warn" => Some(StateUpdate::Takedown { reason, warn: true }),
        "restore" => Some(StateUpdate::Restore),
        "dismiss" => None,
        _ => {
            return Err(ApiError::bad(
                "invalid_action",
                "action must be takedown, warn, restore or dismiss",
            ))
        }
    };
    let link = match update {
        Some(update) => {
            let store = Arc::clone(&state.0.store);
            let (code, actor) = (report.code.clone(), who.actor());
            let link = blocking(move || store.update_state(&code, update, &actor)).await?;
            if parsed.action != "restore" {
                state
                    .0
                    .metrics
                    .safety_actions
                    .with_label_values(&["report"])
                    .inc();
            }
            link
        }
        None => None,
    };
    let resolution = Resolution {
        action: parsed.action.clone(),
        by: who.key_id.clone(),
        at_ms: now_ms(),
    };
    let store = Arc::clone(&state.0.store);
    let resolved = blocking(move || store.resolve_report(id, resolution))
        .await?
        .ok_or_else(not_found)?;
    let resolved = match resolved {
        Ok(r) => r,
        Err(_) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "report_resolved",
                "this report was already resolved",
            ))
        }
    };
    tracing::info!(id, code = %resolved.code, action = %parsed.action, by = %who.key_id, "report resolved");
    let now = now_ms();
    Ok(Json(json!({
        "report": report_json(&resolved),
        "link": link.as_ref().map(|l| link_json(&state, l, now)),
    }))
    .into_response())
}

fn parse_host(raw: &str) -> Result<CanonicalHost, ApiError> {
    let host = CanonicalHost::parse(raw)
        .map_err(|e| ApiError::bad("invalid_host", format!("{raw:?}: {e}")))?;
    if host.is_public_suffix() {
        return Err(ApiError::bad(
            "host_is_public_suffix",
            format!("{host} is a public suffix: it would cover a whole registry"),
        ));
    }
    Ok(host)
}

/// `GET /v1/admin/links?host=&cursor=&limit=` (admin): links whose destination is the host or
/// one of its subdomains, from the destination index.
pub async fn links_by_host(
    State(state): State<AppState>,
    Auth(who): Auth,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let raw = q
        .get("host")
        .ok_or_else(|| ApiError::bad("missing_host", "pass ?host="))?;
    let host = CanonicalHost::parse(raw)
        .map_err(|e| ApiError::bad("invalid_host", format!("{raw:?}: {e}")))?;
    let limit = page_limit(&q)?;
    let after = q.get("cursor").filter(|c| !c.is_empty()).cloned();
    let store = Arc::clone(&state.0.store);
    let lookup = host.clone();
    let (page, links) = blocking(move || {
        let page = store.codes_by_host(&lookup, true, after.as_deref(), limit)?;
        let mut links = Vec::with_capacity(page.entries.len());
        for e in &page.entries {
            if let Some(s) = store.get(&e.code)? {
                links.push(s);
            }
        }
        Ok::<_, StoreError>((page, links))
    })
    .await?;
    let now = now_ms();
    let links: Vec<_> = links.iter().map(|s| link_json(&state, s, now)).collect();
    Ok(Json(json!({
        "host": host.to_string(),
        "links": links,
        "next_cursor": page.next,
    }))
    .into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HostTakedownBody {
    reason: String,
}

/// `POST /v1/admin/hosts/{host}/takedown {"reason"}` (admin): takes down every link whose
/// destination is the host or one of its subdomains.
pub async fn takedown_host(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(raw): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let host = parse_host(&raw)?;
    let parsed: HostTakedownBody = parse_json(&read_body(body).await?)?;
    let reason = checked_reason(&parsed.reason)?;
    let store = Arc::clone(&state.0.store);
    let (lookup, actor) = (host.clone(), who.actor());
    let update = StateUpdate::Takedown {
        reason: reason.clone(),
        warn: false,
    };
    let (seen, changed) =
        blocking(move || enforce::update_host(store.as_ref(), &lookup, &update, &actor)).await?;
    state
        .0
        .metrics
        .safety_actions
        .with_label_values(&["host"])
        .inc_by(changed);
    tracing::warn!(host = %host, reason, links = seen, taken_down = changed, by = %who.key_id, "host takedown");
    Ok(
        Json(json!({"host": host.to_string(), "links": seen, "taken_down": changed}))
            .into_response(),
    )
}

fn owner_json(state: &AppState, r: &OwnerRecord, now: i64) -> serde_json::Value {
    json!({
        "owner": r.owner,
        "flagged": r.flagged.is_some(),
        "flag": r.flagged.as_ref().map(|f| json!({
            "at": rfc3339(f.at_ms),
            "reason": f.reason,
            "domains_last_hour": f.domains_last_hour,
            "limit": f.limit,
        })),
        "domains_last_hour": state.0.safety.domains_last_hour(&r.owner, now),
        "suspended": r.suspended.is_some(),
        "suspension": r.suspended.as_ref().map(|s| json!({
            "at": rfc3339(s.at_ms),
            "by": s.by,
            "reason": s.reason,
            "takedown_links": s.takedown_links,
        })),
    })
}

fn flag_param(q: &HashMap<String, String>, name: &str) -> Result<Option<bool>, ApiError> {
    match q.get(name).map(String::as_str) {
        None => Ok(None),
        Some("true") | Some("1") => Ok(Some(true)),
        Some("false") | Some("0") => Ok(Some(false)),
        Some(_) => Err(ApiError::bad(
            "invalid_query",
            format!("{name} must be true or false"),
        )),
    }
}

/// `GET /v1/admin/owners?flagged=true&suspended=` (admin): owners with a trust record, with
/// their figures.
pub async fn list_owners(
    State(state): State<AppState>,
    Auth(who): Auth,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let flagged = flag_param(&q, "flagged")?;
    let suspended = flag_param(&q, "suspended")?;
    let now = now_ms();
    let owners: Vec<_> = state
        .0
        .safety
        .owner_records()
        .iter()
        .filter(|r| flagged.is_none_or(|f| r.flagged.is_some() == f))
        .filter(|r| suspended.is_none_or(|s| r.suspended.is_some() == s))
        .map(|r| owner_json(&state, r, now))
        .collect();
    Ok(Json(json!({"owners": owners})).into_response())
}

fn checked_owner(owner: &str) -> Result<(), ApiError> {
    if crate::auth::valid_owner(owner) {
        Ok(())
    } else {
        Err(ApiError::bad(
            "invalid_owner",
            "owner must be 1-64 characters of A-Z a-z 0-9 . _ @ -",
        ))
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SuspendBody {
    reason: String,
    #[serde(default)]
    takedown_links: bool,
}

/// `POST /v1/admin/owners/{owner}/suspend {"reason", "takedown_links"}` (admin): the owner's
/// keys answer 401 `key_suspended` from now on; with `takedown_links`, every link it ever
/// created is taken down (and remembered, for the unsuspension). Again on a suspended owner:
/// 200 with `already_suspended`, the first suspension kept, its takedowns finished.
pub async fn suspend(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(owner): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    checked_owner(&owner)?;
    let parsed: SuspendBody = parse_json(&read_body(body).await?)?;
    let reason = checked_reason(&parsed.reason)?;
    let safety = Arc::clone(&state.0.safety);
    let proposed = Suspension {
        at_ms: now_ms(),
        by: who.key_id.clone(),
        reason: reason.clone(),
        takedown_links: parsed.takedown_links,
        takedown_reason: enforce::suspension_reason(&reason),
    };
    let actor = who.actor();
    let takedown = parsed.takedown_links;
    let name = owner.clone();
    let (suspension, already, taken_down) = blocking(move || {
        // Keys stop first: nothing new is created while the links go down. Suspending a
        // suspended owner keeps the first suspension and finishes its takedowns (one that a
        // failure or a crash interrupted, or one asked for only now).
        let (suspension, already) =
            safety.update_owner(&name, |record| match &record.suspended {
                Some(s) => (s.clone(), true),
                None => {
                    record.suspended = Some(proposed.clone());
                    (proposed, false)
                }
            })?;
        let taken_down = if takedown || suspension.takedown_links {
            enforce::takedown_owner(
                safety.store().as_ref(),
                &name,
                &suspension.takedown_reason,
                &actor,
            )?
        } else {
            0
        };
        Ok::<_, StoreError>((suspension, already, taken_down))
    })
    .await?;
    state
        .0
        .metrics
        .safety_actions
        .with_label_values(&["suspension"])
        .inc_by(taken_down);
    tracing::warn!(%owner, reason = %suspension.reason, already, taken_down, by = %who.key_id, "owner suspended");
    Ok(Json(json!({
        "owner": owner,
        "suspended": true,
        "already_suspended": already,
        "reason": suspension.reason,
        "taken_down": taken_down,
    }))
    .into_response())
}

/// `POST /v1/admin/owners/{owner}/unsuspend` (admin): the keys work again, and the takedowns
/// this suspension made (only those) are undone.
pub async fn unsuspend(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(owner): Path<String>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    checked_owner(&owner)?;
    let safety = Arc::clone(&state.0.safety);
    let suspension = safety
        .owner_record(&owner)
        .and_then(|r| r.suspended)
        .ok_or_else(not_suspended)?;
    let actor = who.actor();
    let name = owner.clone();
    let restored = blocking(move || {
        // The links first, then the keys: a failure part-way leaves the owner suspended, and
        // unsuspending again finishes the job.
        let restored = enforce::restore_owner(
            safety.store().as_ref(),
            &name,
            &suspension.takedown_reason,
            &actor,
            safety.lists(),
        )?;
        safety.update_owner(&name, |record| {
            record.suspended = None;
            record.unsuspended_at_ms = Some(now_ms());
        })?;
        Ok::<_, StoreError>(restored)
    })
    .await?;
    tracing::warn!(%owner, restored, by = %who.key_id, "owner unsuspended");
    Ok(Json(json!({"owner": owner, "suspended": false, "restored": restored})).into_response())
}

fn not_suspended() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "not_suspended",
        "this owner is not suspended",
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UnflagBody {
    #[serde(default = "yes")]
    release_held: bool,
}

fn yes() -> bool {
    true
}

/// `POST /v1/admin/owners/{owner}/unflag {"release_held"?}` (admin): clears a velocity flag;
/// by default the links it held are released too.
pub async fn unflag(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(owner): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    checked_owner(&owner)?;
    let bytes = read_body(body).await?;
    let parsed: UnflagBody = if bytes.iter().all(u8::is_ascii_whitespace) {
        UnflagBody { release_held: true }
    } else {
        parse_json(&bytes)?
    };
    let safety = Arc::clone(&state.0.safety);
    let actor = who.actor();
    let name = owner.clone();
    let release = parsed.release_held;
    let released = blocking(move || {
        let was_flagged = safety.update_owner(&name, |record| record.flagged.take().is_some())?;
        if !was_flagged {
            return Ok(None);
        }
        safety.forget_velocity(&name);
        if release {
            enforce::release_owner(safety.store().as_ref(), &name, Hold::Velocity, &actor).map(Some)
        } else {
            Ok(Some(0))
        }
    })
    .await?
    .ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "not_flagged",
            "this owner is not flagged",
        )
    })?;
    tracing::info!(%owner, released, by = %who.key_id, "owner unflagged");
    Ok(Json(json!({"owner": owner, "flagged": false, "released": released})).into_response())
}

/// `GET /v1/admin/apikeys?owner=` (admin): every key (or one owner's), never a secret.
pub async fn list_keys(
    State(state): State<AppState>,
    Auth(who): Auth,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let owner = q.get("owner").cloned();
    let st = state.clone();
    let keys = blocking(move || Ok::<_, StoreError>(st.0.keys.list(owner.as_deref()))).await?;
    Ok(Json(json!({"keys": keys})).into_response())
}

/// `DELETE /v1/admin/apikeys/{id}` (admin): the key answers 401 `key_revoked` from its next
/// request; 204 (also for a key already revoked), 404 for an unknown id.
pub async fn revoke_key(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let not_found = || ApiError::new(StatusCode::NOT_FOUND, "key_not_found", "no key has this id");
    if !crate::auth::valid_key_id(&id) {
        return Err(not_found());
    }
    let st = state.clone();
    let key_id = id.clone();
    let outcome = blocking(move || {
        let known = st.0.keys.list(None).into_iter().any(|k| k.id == key_id);
        if !known {
            return Ok(None);
        }
        st.0.keys
            .revoke(&key_id)
            .map(Some)
            .map_err(|e| StoreError::File {
                what: "revoking the API key",
                cause: e.into(),
            })
    })
    .await?;
    match outcome {
        None => Err(not_found()),
        Some(revoked) => {
            if revoked {
                tracing::warn!(key = %id, by = %who.key_id, "api key revoked");
            }
            Ok(StatusCode::NO_CONTENT.into_response())
        }
    }
}
