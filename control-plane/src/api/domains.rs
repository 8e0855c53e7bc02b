//! Branded domains (README "API"): `POST`, `GET`, `PATCH` and `DELETE` on
//! `/v1/domains`, and an admin's suspension.
//!
//! A domain is held by one owner; the fleet's own short domain (`--short-base`'s host) is the
//! default domain, held by no one, listed first and never claimed. A name is refused unless it
//! is a host name of letters, digits and hyphens (IDN labels as punycode) under a registrable
//! domain of the Public Suffix List; an owner's name is refused too when a label before its
//! public suffix reads as a brand, staff or phishing bait (the alias lists,
//! `lasthop_core::alias`) or as an IDN look-alike (the scanner's heuristics): an admin may add
//! those for the brand's owner. Every write compares the record's revision, so two writers
//! never lose each other's change.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use lasthop_core::alias::Section;
use lasthop_trust::heuristics::{Heuristics, Signal};
use lasthop_trust::CanonicalHost;
use serde::Deserialize;
use serde_json::json;

use super::{
    blocking, checked_destination, checked_reason, parse_json, present, read_body, read_body_up_to,
    require_admin, ApiError, AppState, Auth,
};
use crate::auth::Principal;
use crate::clock::{now_ms, rfc3339};
use crate::store::{
    DomainCertificate, DomainRecord, DomainSettings, DomainSuspension, Hsts, Store,
};

/// Longest `max-age` a domain's HSTS may ask for: two years, as browsers cap it.
pub const HSTS_MAX_AGE_MAX: u32 = 63_072_000;
/// Shortest `max-age` the HSTS preload list accepts (hstspreload.org): one year.
pub const HSTS_PRELOAD_MIN: u32 = 31_536_000;
/// Writes retried when another writer changed the record in between.
const WRITE_TRIES: usize = 8;

/// Why a name cannot be a branded domain: 400 `invalid_domain` with this reason.
fn invalid(reason: &'static str, message: &str) -> ApiError {
    ApiError::bad("invalid_domain", message).with_reason(reason)
}

/// `raw` as a branded domain's canonical name (lowercase, IDN as punycode, no trailing dot),
/// or why not. `admin` skips the reserved-word and look-alike rules.
pub(crate) fn checked_domain(raw: &str, admin: bool) -> Result<String, ApiError> {
    let host = CanonicalHost::parse(raw).map_err(|_| {
        invalid(
            "not_a_hostname",
            "domain must be a host name such as go.example.com",
        )
    })?;
    let Some(name) = host.as_domain() else {
        return Err(invalid(
            "ip_address",
            "domain must be a name, not an IP address",
        ));
    };
    let ldh = |l: &str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    if !name.split('.').all(ldh) {
        return Err(invalid(
            "not_a_hostname",
            "each label of a domain is 1-63 letters, digits or hyphens, not starting or ending \
             with a hyphen",
        ));
    }
    if host.is_public_suffix() || host.labels() < 2 {
        return Err(invalid(
            "public_suffix",
            "domain is a public suffix (a TLD or a registry such as co.uk): use a name under it",
        ));
    }
    let Some(registrable) = host.registrable_domain() else {
        return Err(invalid(
            "public_suffix",
            "domain has no registrable name under its public suffix",
        ));
    };
    if !admin {
        let suffix_labels = registrable.split('.').count() - 1;
        let labels: Vec<&str> = name.split('.').collect();
        for label in &labels[..labels.len() - suffix_labels] {
            if let Some(hit) = lasthop_core::alias::reserved_word(label) {
                if !matches!(hit.section(), Section::Route) {
                    return Err(ApiError::bad(
                        "domain_reserved",
                        "this domain's name reads as a brand, staff, phishing bait or a blocked \
                         word; an admin can add it for its owner",
                    )
                    .with_reason(hit.reason()));
                }
            }
        }
        let url = url::Url::parse(&format!("https://{name}/")).map_err(|_| {
            invalid(
                "not_a_hostname",
                "domain must be a host name such as go.example.com",
            )
        })?;
        if let Some(dest) = lasthop_trust::Destination::of_url(&url) {
            let signal = heuristics().check(&url, &dest).into_iter().find(|s| {
                matches!(
                    s,
                    Signal::LookalikeIdn { .. }
                        | Signal::MixedScript
                        | Signal::BrandInSubdomain { .. }
                )
            });
            if let Some(signal) = signal {
                return Err(ApiError::bad(
                    "domain_reserved",
                    "this domain's name looks like a brand's; an admin can add it for its owner",
                )
                .with_reason(signal.reason()));
            }
        }
    }
    Ok(name.to_string())
}

/// What `/metrics` shows of the domains, read again when their generation moved or a minute
/// passed (statuses turn `expired` with time alone).
#[derive(Debug, Clone, Default)]
pub(crate) struct DomainSummary {
    generation: u64,
    read_at_ms: i64,
    by_status: [(&'static str, i64); 5],
    /// The nearest `not_after` of an unsuspended domain's certificate, expired ones included.
    nearest_not_after_ms: Option<i64>,
}

/// The summary `/metrics` sets its domain gauges from, from `cache` while it is current.
pub(crate) fn summary(
    store: &dyn Store,
    cache: &std::sync::Mutex<Option<DomainSummary>>,
) -> Result<DomainSummary, crate::store::StoreError> {
    let generation = store.domains_generation()?;
    let now = now_ms();
    if let Ok(c) = cache.lock() {
        if let Some(s) = c.as_ref() {
            if s.generation == generation && now - s.read_at_ms < 60_000 {
                return Ok(s.clone());
            }
        }
    }
    let mut by_status = [
        ("pending", 0),
        ("active", 0),
        ("expired", 0),
        ("suspended", 0),
        ("failed", 0),
    ];
    let mut nearest: Option<i64> = None;
    for d in store.domains()? {
        let st = status(&d, now);
        if let Some(slot) = by_status.iter_mut().find(|(name, _)| *name == st) {
            slot.1 += 1;
        }
        // Expired ones too (the gauge goes negative), so an alert on it stays firing past
        // the expiry instead of resolving as the status turns `expired`.
        if matches!(st, "active" | "expired") {
            if let Some(c) = &d.certificate {
                nearest = Some(nearest.map_or(c.not_after_ms, |n| n.min(c.not_after_ms)));
            }
        }
    }
    let summary = DomainSummary {
        generation,
        read_at_ms: now,
        by_status,
        nearest_not_after_ms: nearest,
    };
    if let Ok(mut c) = cache.lock() {
        *c = Some(summary.clone());
    }
    Ok(summary)
}

impl DomainSummary {
    /// Sets the domain gauges of `m`.
    pub(crate) fn set(&self, m: &crate::metrics::Metrics) {
        for (status, n) in self.by_status {
            m.domains.with_label_values(&[status]).set(n);
        }
        m.domain_certificate_expiry_seconds.set(
            self.nearest_not_after_ms
                .map_or(f64::INFINITY, |t| (t - now_ms()) as f64 / 1000.0),
        );
    }
}

fn heuristics() -> &'static Heuristics {
    static H: OnceLock<Heuristics> = OnceLock::new();
    H.get_or_init(|| Heuristics::new(lasthop_core::alias::brands().iter().copied()))
}

/// The default domain: `--short-base`'s host.
pub(crate) fn default_domain(state: &AppState) -> Option<String> {
    state.0.default_domain.clone()
}

/// The host of a short base URL, in the record's form.
pub(crate) fn host_of(short_base: &str) -> Option<String> {
    let base = url::Url::parse(short_base).ok()?;
    CanonicalHost::from_host(&base.host()?).map(|h| h.name())
}

/// `suspended` while an admin's suspension lasts, else `pending` until the domain has a
/// certificate (`failed` while its ACME attempts fail), `active` while it is valid, `expired`
/// once its `not_after` has passed.
fn status(r: &DomainRecord, now: i64) -> &'static str {
    match (&r.suspended, &r.certificate) {
        (Some(_), _) => "suspended",
        (None, None) if r.acme.as_ref().is_some_and(|a| a.failures > 0) => "failed",
        (None, None) => "pending",
        (None, Some(c)) if c.not_after_ms < now => "expired",
        (None, Some(_)) => "active",
    }
}

fn domain_json(r: &DomainRecord) -> serde_json::Value {
    json!({
        "domain": r.domain,
        "owner": r.owner,
        "default": false,
        "status": status(r, now_ms()),
        "certificate": r.certificate.as_ref().map(|c| json!({
            "not_before": rfc3339(c.not_before_ms),
            "not_after": rfc3339(c.not_after_ms),
            "issuer": c.issuer,
            "source": c.source,
            "stored_at": rfc3339(c.stored_at_ms),
        })),
        "created_at": rfc3339(r.created_at_ms),
        "settings": settings_json(&r.settings),
        "suspension": r.suspended.as_ref().map(|s| json!({
            "at": rfc3339(s.at_ms),
            "by": s.by,
            "reason": s.reason,
        })),
        "acme": acme_json(r),
    })
}

/// Where the domain's automatic certificate stands, once ACME has looked at it.
fn acme_json(r: &DomainRecord) -> Option<serde_json::Value> {
    let a = r.acme.as_ref()?;
    let now = now_ms();
    Some(json!({
        "ordering": a.lock.as_ref().is_some_and(|l| l.until_ms > now),
        "challenge": a.challenge.as_ref().map(|c| c.kind.clone()),
        "error": a.last_error,
        "failures": a.failures,
        "last_attempt_at": a.last_attempt_ms.map(rfc3339),
        "next_retry_at": a.next_attempt_ms.map(rfc3339),
        "renew_requested_at": a.renew_requested_ms.map(rfc3339),
        "renew_at": crate::acme::renewal_time(r).map(rfc3339),
    }))
}

fn settings_json(s: &DomainSettings) -> serde_json::Value {
    json!({
        "root_redirect": s.root_redirect,
        "not_found_redirect": s.not_found_redirect,
        "hsts": s.hsts.map(|h| json!({
            "max_age": h.max_age,
            "include_subdomains": h.include_subdomains,
            "preload": h.preload,
        })),
        "legacy_fallback": s.legacy_fallback,
    })
}

fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such domain")
}

fn taken() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "domain_taken",
        "this domain is already in use",
    )
}

pub(super) fn suspended() -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "domain_suspended",
        "this domain is suspended; only an admin can change it",
    )
}

/// The domain `who` may see: its own, or any for an admin; 404 otherwise (and for a name that
/// is not even a valid domain: nothing by that name exists).
pub(super) async fn fetch_visible(
    state: &AppState,
    who: &Principal,
    raw: &str,
) -> Result<DomainRecord, ApiError> {
    let name = checked_domain(raw, true).map_err(|_| not_found())?;
    let store = Arc::clone(&state.0.store);
    let record = blocking(move || store.domain(&name))
        .await?
        .ok_or_else(not_found)?;
    if record.owner != who.owner && !who.admin {
        return Err(not_found());
    }
    super::allowed_domain_name(who, &record.domain)?;
    Ok(record)
}

/// Whether `r` is still the claim `seen` (same owner, same creation): a domain deleted and
/// claimed again by someone else in between is not the one the caller was allowed to change.
fn same_claim(r: &DomainRecord, seen: &DomainRecord) -> bool {
    r.owner == seen.owner && r.created_at_ms == seen.created_at_ms
}

/// Reads `domain`, applies `change` and writes it back at the next revision (or, with
/// `remove`, deletes it), again from a fresh read when another writer came in between. `change`
/// may refuse (its error is the answer). With `claim`, the record must still be that claim (404
/// otherwise: the caller's right to it was checked on that one).
fn update(
    store: &dyn Store,
    domain: &str,
    claim: Option<&DomainRecord>,
    remove: bool,
    change: &dyn Fn(&mut DomainRecord) -> Result<(), ApiError>,
) -> Result<DomainRecord, ApiError> {
    for _ in 0..WRITE_TRIES {
        let Some(mut record) = store.domain(domain)? else {
            return Err(not_found());
        };
        if claim.is_some_and(|seen| !same_claim(&record, seen)) {
            return Err(not_found());
        }
        let expected = record.revision;
        change(&mut record)?;
        if store.write_domain(record.clone(), Some(expected), remove)? {
            record.revision = expected + 1;
            return Ok(record);
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "conflict",
        "this domain kept changing under the call; retry",
    ))
}

/// The owner's changes stop at a suspension; an admin's do not.
fn unless_suspended(r: &DomainRecord, admin: bool) -> Result<(), ApiError> {
    if r.suspended.is_some() && !admin {
        Err(suspended())
    } else {
        Ok(())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AddBody {
    domain: String,
    /// Admin only: the owner to add it for (default: the caller's).
    #[serde(default)]
    owner: Option<String>,
}

/// `POST /v1/domains {"domain", "owner"?}`: 201 and the domain; 400 `invalid_domain` or
/// `domain_reserved` (with a `reason`); 409 `domain_taken` (another owner's, this one's already,
/// or the default domain).
pub(super) async fn add(
    State(state): State<AppState>,
    Auth(who): Auth,
    body: Body,
) -> Result<Response, ApiError> {
    let parsed: AddBody = parse_json(&read_body(body).await?)?;
    let owner = match parsed.owner {
        Some(owner) if owner != who.owner => {
            require_admin(&who)?;
            if !crate::auth::valid_owner(&owner) {
                return Err(ApiError::bad(
                    "invalid_owner",
                    "owner must be 1-64 characters of A-Z a-z 0-9 . _ @ -",
                ));
            }
            owner
        }
        _ => who.owner.clone(),
    };
    let domain = checked_domain(&parsed.domain, who.admin)?;
    super::allowed_domain_name(&who, &domain)?;
    if let Some(fleet) = default_domain(&state) {
        if fleet == domain {
            return Err(taken());
        }
        // A name under the fleet's own domain would take over part of it (the engines would
        // serve its owner's certificate for it): the operators' to give.
        if !who.admin && domain.ends_with(&format!(".{fleet}")) {
            return Err(ApiError::bad(
                "domain_reserved",
                "names under the fleet's own short domain are the operators' to give",
            )
            .with_reason("fleet_domain"));
        }
    }
    let record = DomainRecord {
        domain,
        owner,
        created_at_ms: now_ms(),
        revision: 1,
        settings: DomainSettings::default(),
        suspended: None,
        certificate: None,
        acme: None,
    };
    let store = Arc::clone(&state.0.store);
    let written = record.clone();
    if !blocking(move || store.write_domain(written, None, false)).await? {
        return Err(taken());
    }
    tracing::info!(domain = %record.domain, owner = %record.owner, by = %who.key_id, "domain added");
    Ok((StatusCode::CREATED, Json(domain_json(&record))).into_response())
}

/// `GET /v1/domains` (`?owner=` for an admin): the default domain, then the caller's domains
/// (an admin's: everyone's), by name.
pub(super) async fn list(
    State(state): State<AppState>,
    Auth(who): Auth,
    Query(q): Query<HashMap<String, String>>,
) -> Result<Response, ApiError> {
    let owner = match q.get("owner") {
        Some(o) if *o != who.owner => {
            require_admin(&who)?;
            Some(o.clone())
        }
        Some(o) => Some(o.clone()),
        None if who.admin => None,
        None => Some(who.owner.clone()),
    };
    let store = Arc::clone(&state.0.store);
    let records = blocking(move || store.domains()).await?;
    let mut domains: Vec<serde_json::Value> = Vec::with_capacity(records.len() + 1);
    if let Some(d) = default_domain(&state) {
        domains.push(json!({
            "domain": d,
            "owner": null,
            "default": true,
            "status": "active",
            "certificate": null,
        }));
    }
    domains.extend(
        records
            .iter()
            .filter(|r| owner.as_deref().is_none_or(|o| r.owner == o))
            .filter(|r| who.domains.is_empty() || who.domains.contains(&r.domain))
            .map(domain_json),
    );
    Ok(Json(json!({ "domains": domains })).into_response())
}

/// `GET /v1/domains/{domain}` (owner or admin).
pub(super) async fn get_one(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(domain): Path<String>,
) -> Result<Response, ApiError> {
    let record = fetch_visible(&state, &who, &domain).await?;
    Ok(Json(domain_json(&record)).into_response())
}

/// `PATCH /v1/domains/{domain}`: an absent field is left alone, `null` clears it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PatchBody {
    #[serde(default, deserialize_with = "present")]
    root_redirect: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    not_found_redirect: Option<Option<String>>,
    #[serde(default, deserialize_with = "present")]
    hsts: Option<Option<Hsts>>,
    #[serde(default, deserialize_with = "present")]
    legacy_fallback: Option<Option<String>>,
}

/// A redirect a domain's settings name: a destination like any link's (scheme, host, lists,
/// shortener chains), normalised.
fn checked_redirect(state: &AppState, raw: Option<String>) -> Result<Option<String>, ApiError> {
    raw.map(|r| checked_destination(state, &r).map(|(url, _)| url))
        .transpose()
}

fn checked_hsts(hsts: Option<Hsts>) -> Result<Option<Hsts>, ApiError> {
    let Some(h) = hsts else { return Ok(None) };
    let bad = |m: String| ApiError::bad("invalid_hsts", m);
    if h.max_age > HSTS_MAX_AGE_MAX {
        return Err(bad(format!(
            "hsts max_age is at most {HSTS_MAX_AGE_MAX} seconds (two years)"
        )));
    }
    if h.preload && (h.max_age < HSTS_PRELOAD_MIN || !h.include_subdomains) {
        return Err(bad(format!(
            "hsts preload needs max_age of at least {HSTS_PRELOAD_MIN} seconds and \
             include_subdomains (the preload list's rules)"
        )));
    }
    Ok(Some(h))
}

pub(super) async fn patch(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(domain): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    // The body first: the caller's right to the domain is checked on the record written.
    let parsed: PatchBody = parse_json(&read_body(body).await?)?;
    let record = fetch_visible(&state, &who, &domain).await?;
    let root = parsed
        .root_redirect
        .map(|r| checked_redirect(&state, r))
        .transpose()?;
    let not_found_redirect = parsed
        .not_found_redirect
        .map(|r| checked_redirect(&state, r))
        .transpose()?;
    let hsts = parsed.hsts.map(checked_hsts).transpose()?;
    let fallback = parsed
        .legacy_fallback
        .map(|t| {
            t.map(|t| crate::legacy::check_template(&t))
                .transpose()
                .map_err(|e| ApiError::bad("invalid_legacy_fallback", e))
        })
        .transpose()?;
    let store = Arc::clone(&state.0.store);
    let admin = who.admin;
    let name = record.domain.clone();
    let updated = blocking(move || {
        update(store.as_ref(), &name, Some(&record), false, &|r| {
            unless_suspended(r, admin)?;
            if let Some(v) = &root {
                r.settings.root_redirect = v.clone();
            }
            if let Some(v) = &not_found_redirect {
                r.settings.not_found_redirect = v.clone();
            }
            if let Some(v) = hsts {
                r.settings.hsts = v;
            }
            if let Some(v) = &fallback {
                r.settings.legacy_fallback = v.clone();
            }
            Ok(())
        })
    })
    .await?;
    Ok(Json(domain_json(&updated)).into_response())
}

/// `DELETE /v1/domains/{domain}` (owner or admin): 204; 409 `domain_in_use` while links on it
/// are not deleted (their codes would answer again, from another owner, if the name were
/// claimed anew). A suspended domain is the admin's to delete (an owner's delete and re-add
/// would lift the suspension).
pub(super) async fn delete(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(domain): Path<String>,
) -> Result<Response, ApiError> {
    let record = fetch_visible(&state, &who, &domain).await?;
    let store = Arc::clone(&state.0.store);
    let name = record.domain.clone();
    let live = blocking(move || store.domain_links(&name, 1000)).await?;
    if live > 0 {
        let count = if live >= 1000 {
            "1000 or more".to_string()
        } else {
            live.to_string()
        };
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "domain_in_use",
            format!("{count} links on this domain are not deleted; delete them first"),
        ));
    }
    let store = Arc::clone(&state.0.store);
    let admin = who.admin;
    let (name, seen) = (record.domain.clone(), record.clone());
    blocking(move || {
        update(store.as_ref(), &name, Some(&seen), true, &|r| {
            unless_suspended(r, admin)
        })
    })
    .await?;
    tracing::info!(domain = %record.domain, by = %who.key_id, "domain deleted");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Largest certificate upload: a chain of [`lasthop_tls::certificate::MAX_CHAIN`] RSA-4096
/// certificates and its key fit.
pub const MAX_CERTIFICATE_BODY: usize = 64 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CertificateBody {
    certificate: String,
    key: String,
}

/// `PUT /v1/domains/{domain}/certificate {"certificate": "<PEM chain, leaf first>", "key":
/// "<PEM private key>"}` (owner or admin): checked (the key is the leaf's, the leaf names the
/// domain and is valid now for a TLS server, the chain links up) and stored in place of any
/// before; 200 and the domain, now `active`. 400 `invalid_certificate` with a `reason`
/// ([`lasthop_tls::certificate::CertificateError::code`]).
pub(super) async fn put_certificate(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(domain): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let parsed: CertificateBody = parse_json(&read_body_up_to(body, MAX_CERTIFICATE_BODY).await?)?;
    // After the body: the caller's right to the domain is checked on the record written.
    let record = fetch_visible(&state, &who, &domain).await?;
    let now = now_ms();
    let checked =
        lasthop_tls::certificate::check(&parsed.certificate, &parsed.key, &record.domain, now)
            .map_err(|e| {
                ApiError::bad("invalid_certificate", e.to_string()).with_reason(e.code())
            })?;
    let certificate = DomainCertificate {
        chain_pem: parsed.certificate,
        key_pem: parsed.key,
        not_before_ms: checked.not_before_ms,
        not_after_ms: checked.not_after_ms,
        issuer: checked.issuer,
        stored_at_ms: now,
        source: "upload".into(),
    };
    let store = Arc::clone(&state.0.store);
    let admin = who.admin;
    let name = record.domain.clone();
    let updated = blocking(move || {
        update(store.as_ref(), &name, Some(&record), false, &|r| {
            unless_suspended(r, admin)?;
            r.certificate = Some(certificate.clone());
            Ok(())
        })
    })
    .await?;
    tracing::info!(
        domain = %updated.domain,
        by = %who.key_id,
        not_after = %rfc3339(checked.not_after_ms),
        "domain certificate stored"
    );
    Ok(Json(domain_json(&updated)).into_response())
}

/// `POST /v1/domains/{domain}/renew` (admin): a new ACME certificate now, whatever the one in
/// place (an uploaded one too: ACME takes over its renewals), past any backoff; 202 and the
/// domain. 409 `acme_disabled` without `--acme-directory`, `domain_suspended` for a suspended
/// domain, 429 `acme_rate_limited` past the domain's orders per day.
pub(super) async fn renew(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(domain): Path<String>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let Some(acme) = state.0.acme.clone() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "acme_disabled",
            "automatic certificates are off (lasthop-control serve --acme-directory)",
        ));
    };
    let name = checked_domain(&domain, true).map_err(|_| not_found())?;
    let limit = acme.domain_orders_per_day();
    let store = Arc::clone(&state.0.store);
    let updated = blocking(move || {
        update(store.as_ref(), &name, None, false, &|r| {
            if r.suspended.is_some() {
                return Err(suspended());
            }
            let now = now_ms();
            let today = crate::acme::orders_today(r, now);
            if today >= limit {
                return Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "acme_rate_limited",
                    format!("{today} orders for this domain in the last day (--acme-domain-orders-per-day {limit})"),
                ));
            }
            r.acme
                .get_or_insert_with(Default::default)
                .renew_requested_ms
                .get_or_insert(now);
            Ok(())
        })
    })
    .await?;
    acme.wake();
    tracing::info!(domain = %updated.domain, by = %who.key_id, "ACME renewal requested");
    Ok((StatusCode::ACCEPTED, Json(domain_json(&updated))).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SuspendBody {
    reason: String,
}

/// `POST /v1/admin/domains/{domain}/suspend {"reason"}` (admin): the domain's record says so
/// (its owner can no longer change or delete it); suspending a suspended domain keeps the first
/// suspension. 200 and the domain.
pub(super) async fn suspend(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(domain): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let name = checked_domain(&domain, true).map_err(|_| not_found())?;
    let parsed: SuspendBody = parse_json(&read_body(body).await?)?;
    let reason = checked_reason(&parsed.reason)?;
    let proposed = DomainSuspension {
        at_ms: now_ms(),
        by: who.key_id.clone(),
        reason,
    };
    let store = Arc::clone(&state.0.store);
    let updated = blocking(move || {
        update(store.as_ref(), &name, None, false, &|r| {
            if r.suspended.is_none() {
                r.suspended = Some(proposed.clone());
            }
            Ok(())
        })
    })
    .await?;
    tracing::warn!(domain = %updated.domain, by = %who.key_id, "domain suspended");
    Ok(Json(domain_json(&updated)).into_response())
}

/// `POST /v1/admin/domains/{domain}/unsuspend` (admin): 200 and the domain.
pub(super) async fn unsuspend(
    State(state): State<AppState>,
    Auth(who): Auth,
    Path(domain): Path<String>,
) -> Result<Response, ApiError> {
    require_admin(&who)?;
    let name = checked_domain(&domain, true).map_err(|_| not_found())?;
    let store = Arc::clone(&state.0.store);
    let updated = blocking(move || {
        update(store.as_ref(), &name, None, false, &|r| {
            r.suspended = None;
            Ok(())
        })
    })
    .await?;
    tracing::info!(domain = %updated.domain, by = %who.key_id, "domain unsuspended");
    Ok(Json(domain_json(&updated)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(raw: &str, admin: bool) -> Option<String> {
        checked_domain(raw, admin)
            .err()
            .map(|e| format!("{}:{}", e.code, e.reason.unwrap_or_default()))
    }

    #[test]
    fn names_are_canonical_and_checked() {
        assert_eq!(
            checked_domain("Go.Example.COM.", false).unwrap(),
            "go.example.com"
        );
        assert_eq!(checked_domain("lh.example", false).unwrap(), "lh.example");
        assert_eq!(
            checked_domain("bücher.example", false).unwrap(),
            "xn--bcher-kva.example"
        );
        for (raw, want) in [
            ("", "invalid_domain:not_a_hostname"),
            ("exa mple.com", "invalid_domain:not_a_hostname"),
            ("a_b.example.com", "invalid_domain:not_a_hostname"),
            ("-go.example.com", "invalid_domain:not_a_hostname"),
            ("https://go.example.com/", "invalid_domain:not_a_hostname"),
            ("127.0.0.1", "invalid_domain:ip_address"),
            ("[::1]", "invalid_domain:ip_address"),
            ("com", "invalid_domain:public_suffix"),
            ("co.uk", "invalid_domain:public_suffix"),
            ("github.io", "invalid_domain:public_suffix"),
        ] {
            assert_eq!(reason(raw, false).as_deref(), Some(want), "{raw:?}");
            assert_eq!(reason(raw, true).as_deref(), Some(want), "{raw:?} (admin)");
        }
    }

    #[test]
    fn brands_and_lookalikes_need_an_admin() {
        for (raw, want) in [
            ("paypal-login.example", "domain_reserved:brand:paypal"),
            ("go.paypal.example", "domain_reserved:brand:paypal"),
            (
                "xn--pple-43d.example",
                "domain_reserved:heuristic:lookalike_idn:apple",
            ),
        ] {
            assert_eq!(reason(raw, false).as_deref(), Some(want), "{raw:?}");
            assert_eq!(reason(raw, true), None, "{raw:?} (admin)");
        }
        // Route words are paths, not names: a domain may say `api` or `go`.
        for ok in ["api.example.com", "go.example.com", "links.bigcorp.co.uk"] {
            assert_eq!(reason(ok, false), None, "{ok:?}");
        }
        // The public suffix itself is not the owner's word.
        assert_eq!(reason("lh.paypal", false), None);
    }

    proptest::proptest! {
        /// Any text is refused with a 400 or comes back canonical: checking the answer again
        /// gives it back unchanged.
        #[test]
        fn any_name_is_refused_or_canonical(raw in "\\PC{0,80}|[a-zA-Z0-9.-]{1,40}", admin: bool) {
            match checked_domain(&raw, admin) {
                Ok(name) => {
                    proptest::prop_assert_eq!(checked_domain(&name, admin).ok(), Some(name.clone()));
                    proptest::prop_assert!(name.len() <= 253 && !name.ends_with('.'));
                }
                Err(e) => proptest::prop_assert_eq!(e.status, StatusCode::BAD_REQUEST),
            }
        }
    }

    /// A write checked against one claim never lands on another claim of the same name.
    #[test]
    fn a_write_never_lands_on_a_new_claim_of_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let key = lasthop_core::PermutationKey::generate(16).unwrap();
        let scheme = lasthop_core::CodeScheme::new(&key).unwrap();
        let store = crate::store::embedded::EmbeddedStore::open(
            crate::store::embedded::EmbeddedStoreConfig::new(dir.path().join("s.redb"), scheme),
            None,
        )
        .unwrap();
        let claim = |owner: &str, at: i64| DomainRecord {
            domain: "go.example.com".into(),
            owner: owner.into(),
            created_at_ms: at,
            revision: 0,
            settings: DomainSettings::default(),
            suspended: None,
            certificate: None,
            acme: None,
        };
        assert!(store.write_domain(claim("alice", 1), None, false).unwrap());
        let seen = store.domain("go.example.com").unwrap().unwrap();
        let set_root = |r: &mut DomainRecord| {
            r.settings.root_redirect = Some("https://example.com/".into());
            Ok(())
        };
        // Still alice's claim: written.
        assert!(update(&store, "go.example.com", Some(&seen), false, &set_root).is_ok());
        // Deleted and claimed again by bob in between: refused (404), bob's record untouched.
        let now = store.domain("go.example.com").unwrap().unwrap();
        assert!(store
            .write_domain(now.clone(), Some(now.revision), true)
            .unwrap());
        assert!(store.write_domain(claim("bob", 2), None, false).unwrap());
        let err = update(&store, "go.example.com", Some(&seen), false, &set_root).unwrap_err();
        assert_eq!(err.status, StatusCode::NOT_FOUND);
        let bobs = store.domain("go.example.com").unwrap().unwrap();
        assert_eq!(
            (bobs.owner.as_str(), &bobs.settings),
            ("bob", &DomainSettings::default())
        );
        // An admin's call (no claim) reaches whoever holds it now.
        assert!(update(&store, "go.example.com", None, false, &set_root).is_ok());
        store.shutdown().unwrap();
    }

    #[test]
    fn hsts_follows_the_preload_rules() {
        let h = |max_age, include_subdomains, preload| Hsts {
            max_age,
            include_subdomains,
            preload,
        };
        assert!(checked_hsts(Some(h(300, false, false))).is_ok());
        assert!(checked_hsts(Some(h(HSTS_PRELOAD_MIN, true, true))).is_ok());
        assert!(checked_hsts(Some(h(HSTS_MAX_AGE_MAX + 1, false, false))).is_err());
        assert!(checked_hsts(Some(h(HSTS_PRELOAD_MIN - 1, true, true))).is_err());
        assert!(checked_hsts(Some(h(HSTS_PRELOAD_MIN, false, true))).is_err());
        assert!(checked_hsts(None).unwrap().is_none());
    }
}
