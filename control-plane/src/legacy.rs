//! The lazy fallback to an old shortener (issue 44): a domain can point at lasthop before its
//! links are moved. A code the fleet does not know on a domain with `legacy_fallback` (a URL
//! template such as `https://old.example/{code}`; `serve --legacy-fallback` for the default
//! domain) is asked of the old provider when an engine reads it through: a `GET` that does not
//! follow redirects, whose `Location` is the destination. That destination goes through every
//! create-time check and the link is imported with its code as `links import` would (a legacy
//! code, owned by the domain's owner), then answered. Bounded: a timeout on each ask, a rate
//! per domain, the old provider's 404s remembered for a while, one ask at a time per code;
//! never for a code of a generated code's shape (the generator may still issue it: only an
//! import claims one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::api::imports::{import_batch, ImportBatch, ImportLink};
use crate::auth::Principal;
use crate::ratelimit::RateLimiter;
use crate::reply::ApiError;
use crate::store::{Actor, StoredLink};
use crate::AppState;

/// Where a template puts the code.
pub const CODE_PLACEHOLDER: &str = "{code}";
/// The most not-founds remembered (the oldest are dropped past it).
const MISSES_MAX: usize = 100_000;

/// Checks a `legacy_fallback` template: an absolute `http`/`https` URL with a host and
/// [`CODE_PLACEHOLDER`] in it, at most 2048 bytes. Returns it as given.
pub fn check_template(template: &str) -> Result<String, String> {
    if template.len() > 2048 {
        return Err("a legacy_fallback template is at most 2048 bytes".into());
    }
    if !template.contains(CODE_PLACEHOLDER) {
        return Err(format!(
            "a legacy_fallback template names where the code goes with {CODE_PLACEHOLDER}, e.g. \
             https://old.example/{CODE_PLACEHOLDER}"
        ));
    }
    let sample = template.replace(CODE_PLACEHOLDER, "abc");
    match url::Url::parse(&sample) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {
            Ok(template.to_string())
        }
        _ => Err("a legacy_fallback template is an http or https URL".into()),
    }
}

/// How the fallback asks.
#[derive(Debug, Clone)]
pub struct FallbackConfig {
    /// The default domain's template (`--legacy-fallback`), checked.
    pub default_template: Option<String>,
    /// Who owns the links the default domain's fallback imports.
    pub default_owner: String,
    /// One ask's limit.
    pub timeout: Duration,
    /// Asks a second per domain (and the burst).
    pub rate: f64,
    /// How long an old provider's "no such code" is remembered.
    pub miss_ttl: Duration,
}

impl Default for FallbackConfig {
    fn default() -> Self {
        FallbackConfig {
            default_template: None,
            default_owner: "legacy".into(),
            timeout: Duration::from_millis(250),
            rate: 20.0,
            miss_ttl: Duration::from_secs(60),
        }
    }
}

/// The fallback of one control plane.
pub struct LegacyFallback {
    api: AppState,
    config: FallbackConfig,
    agent: ureq::Agent,
    limiter: RateLimiter,
    misses: Mutex<HashMap<String, Instant>>,
    /// Codes being asked now: a second read-through of one waits for the first's answer.
    asking: tokio::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    metrics: crate::metrics::Metrics,
}

impl std::fmt::Debug for LegacyFallback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LegacyFallback")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// What one ask of the old provider gave.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Asked {
    /// A redirect to this destination.
    Destination(String),
    /// It has no such code (404 or 410): remembered.
    NotThere,
    /// No answer to go by (a timeout, an error, another status): not remembered.
    Failed(String),
}

impl LegacyFallback {
    pub fn new(api: AppState, config: FallbackConfig, metrics: crate::metrics::Metrics) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout(config.timeout)
            .redirects(0)
            .user_agent("lasthop-legacy-fallback")
            .build();
        LegacyFallback {
            api,
            limiter: RateLimiter::new(config.rate, config.rate.max(1.0)),
            config,
            agent,
            misses: Mutex::new(HashMap::new()),
            asking: tokio::sync::Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// Whether the default domain has a fallback (engines ask their origin about its unknown
    /// legacy-shaped codes then).
    pub fn default_domain(&self) -> bool {
        self.config.default_template.is_some()
    }

    /// The link `key` (not in the store) from the old provider of its domain, imported; `None`
    /// when its domain has no fallback, the code is not one to ask about, or the provider has
    /// none (or gave no usable answer).
    pub async fn resolve(&self, key: &str) -> Result<Option<StoredLink>, ApiError> {
        let (domain, code) = lasthop_core::split_key_str(key);
        if !matches!(
            lasthop_core::classify(code.as_bytes()),
            lasthop_core::CodeKind::Alias | lasthop_core::CodeKind::Legacy
        ) {
            return Ok(None);
        }
        let store = Arc::clone(self.api.store());
        let (template, owner) = match domain {
            None => match &self.config.default_template {
                Some(t) => (t.clone(), self.config.default_owner.clone()),
                None => return Ok(None),
            },
            Some(d) => {
                let name = d.to_string();
                let record = crate::reply::blocking(move || store.domain(&name)).await?;
                match record {
                    Some(r) if r.suspended.is_none() => match r.settings.legacy_fallback {
                        Some(t) => (t, r.owner),
                        None => return Ok(None),
                    },
                    _ => return Ok(None),
                }
            }
        };
        if self.remembered_miss(key) {
            self.count("remembered");
            return Ok(None);
        }
        // One ask a code at a time: the others wait, then find the link (or the miss).
        let gate = {
            let mut asking = self.asking.lock().await;
            Arc::clone(asking.entry(key.to_string()).or_default())
        };
        let _held = gate.lock().await;
        let answer = self
            .resolve_held(key, code, domain, &template, &owner)
            .await;
        let mut asking = self.asking.lock().await;
        if Arc::strong_count(&gate) <= 2 {
            asking.remove(key);
        }
        answer
    }

    async fn resolve_held(
        &self,
        key: &str,
        code: &str,
        domain: Option<&str>,
        template: &str,
        owner: &str,
    ) -> Result<Option<StoredLink>, ApiError> {
        // Another ask may have imported it (or learned it is not there) while this one waited.
        let store = Arc::clone(self.api.store());
        let k = key.to_string();
        if let Some(s) = crate::reply::blocking(move || store.get(&k)).await? {
            return Ok(Some(s));
        }
        if self.remembered_miss(key) {
            self.count("remembered");
            return Ok(None);
        }
        let bucket = domain.unwrap_or("");
        if self.limiter.check(bucket, Instant::now()).is_err() {
            self.count("rate_limited");
            return Ok(None);
        }
        let url = template.replace(CODE_PLACEHOLDER, code);
        let agent = self.agent.clone();
        let asked = tokio::task::spawn_blocking(move || ask(&agent, &url))
            .await
            .unwrap_or_else(|e| Asked::Failed(e.to_string()));
        let destination = match asked {
            Asked::Destination(d) => d,
            Asked::NotThere => {
                self.count("not_there");
                self.remember_miss(key);
                return Ok(None);
            }
            Asked::Failed(why) => {
                self.count("failed");
                tracing::warn!(%key, %why, "legacy fallback: the old provider gave no answer");
                return Ok(None);
            }
        };
        let batch = ImportBatch {
            owner: owner.to_string(),
            domain: domain.map(str::to_string),
            dry_run: false,
            with_clicks: false,
            links: vec![ImportLink {
                line: 1,
                code: code.to_string(),
                long_url: destination,
                created_at_ms: None,
                expires_at_ms: None,
                tags: Vec::new(),
                clicks: None,
            }],
        };
        let who = Principal {
            owner: "legacy-fallback".into(),
            admin: true,
            key_id: "legacy-fallback".into(),
            domains: Vec::new(),
        };
        let report = import_batch(&self.api, &who, Actor::System, batch).await?;
        if let Some(r) = report.refused.first() {
            // A destination the create-time checks refuse is never served: remembered as a
            // miss, so the provider is not asked again for a while.
            self.count("refused");
            tracing::warn!(%key, reason = %r.reason, detail = ?r.detail, "legacy fallback: the old destination was refused");
            self.remember_miss(key);
            return Ok(None);
        }
        self.count("imported");
        tracing::info!(%key, "legacy fallback: imported from the old provider");
        let store = Arc::clone(self.api.store());
        let k = key.to_string();
        crate::reply::blocking(move || store.get(&k)).await
    }

    fn count(&self, outcome: &str) {
        self.metrics
            .legacy_fallback
            .with_label_values(&[outcome])
            .inc();
    }

    fn remembered_miss(&self, key: &str) -> bool {
        let Ok(mut misses) = self.misses.lock() else {
            return false;
        };
        match misses.get(key) {
            Some(&until) if Instant::now() < until => true,
            Some(_) => {
                misses.remove(key);
                false
            }
            None => false,
        }
    }

    fn remember_miss(&self, key: &str) {
        let Ok(mut misses) = self.misses.lock() else {
            return;
        };
        let now = Instant::now();
        if misses.len() >= MISSES_MAX {
            misses.retain(|_, until| *until > now);
            if misses.len() >= MISSES_MAX {
                misses.clear();
            }
        }
        misses.insert(key.to_string(), now + self.config.miss_ttl);
    }
}

/// One `GET` of the old provider, redirects not followed.
fn ask(agent: &ureq::Agent, url: &str) -> Asked {
    let response = match agent.get(url).call() {
        Ok(r) => r,
        Err(ureq::Error::Status(404 | 410, _)) => return Asked::NotThere,
        Err(ureq::Error::Status(status, _)) => return Asked::Failed(format!("status {status}")),
        Err(e) => return Asked::Failed(e.to_string()),
    };
    match response.status() {
        301 | 302 | 303 | 307 | 308 => {}
        other => return Asked::Failed(format!("status {other}, not a redirect")),
    }
    let Some(location) = response.header("location") else {
        return Asked::Failed("a redirect without Location".into());
    };
    // A relative Location is resolved against the URL asked (RFC 9110 §10.2.2).
    match url::Url::parse(url).and_then(|base| base.join(location.trim())) {
        Ok(destination) => Asked::Destination(destination.to_string()),
        Err(e) => Asked::Failed(format!("Location {location:?}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates() {
        assert!(check_template("https://old.example/{code}").is_ok());
        assert!(check_template("http://old.example/r?c={code}").is_ok());
        assert!(check_template("https://old.example/").is_err());
        assert!(check_template("ftp://old.example/{code}").is_err());
        assert!(check_template("{code}").is_err());
        assert!(
            check_template(&format!("https://old.example/{}{{code}}", "a".repeat(2050))).is_err()
        );
    }
}
