//! Automatic certificates (README "Automatic certificates"): every branded domain without a
//! certificate of its own gets one from an ACME CA (RFC 8555, through `instant-acme`), and every
//! ACME certificate is renewed at two thirds of its lifetime (or when the CA's renewal
//! information, RFC 9773, says so).
//!
//! - **State in the domain's record** ([`DomainAcme`]): the order's lock (a lease: holder and
//!   expiry, taken by a compare-and-swap on the record's revision, so several control planes on
//!   one store place one order per domain), the challenge answer being published, the last
//!   error, the failures in a row and the next attempt, the orders of the last day.
//! - **Challenges**: HTTP-01, then TLS-ALPN-01 (`--acme-challenges`). The answer is written to
//!   the record; that moves the domains' generation, which the feed's `certificates` frames
//!   announce, and every engine fetches it with the certificates (`GET
//!   /edge/v1/certificates`: HTTP-01 answers at `/.well-known/acme-challenge/TOKEN` on the plain
//!   listener, TLS-ALPN-01 certificates for `acme-tls/1`). The CA is told to validate once every
//!   engine that reported in the last ten seconds says it serves that generation (or after
//!   `--acme-publish-wait-secs`), since the CA may reach any of them.
//! - **Pacing**: failures back off from `--acme-retry-secs`, doubling to a day, jittered; at most
//!   `--acme-domain-orders-per-day` orders per domain and `--acme-orders-per-hour` for the
//!   fleet (counted from every record, so every control plane on the store shares them).
//! - **Renewal** at two thirds of the lifetime less up to a twentieth of it (a jitter derived
//!   from the name and the expiry, the same on every control plane), so a fleet's certificates
//!   issued together are not renewed together.
//!
//! The account key is `DATA_DIR/acme-account.key` (PKCS#8 PEM, a secret file, 0600), made on
//! first use; the account is found again from it (`onlyReturnExisting` is not needed: a
//! `newAccount` with a known key answers the existing account).

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AuthorizationStatus, ChallengeType, Identifier, Key, NewOrder, OrderStatus,
    RetryPolicy,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::clock::now_ms;
use crate::fleet::Fleet;
use crate::metrics::Metrics;
use crate::reply::offload;
use crate::store::{AcmeChallenge, AcmeLock, DomainCertificate, DomainRecord, Store, StoreError};

/// A certificate's `source` when ACME issued it.
pub const SOURCE: &str = "acme";
/// How long an order's lock holds without its holder finishing (longer than any order).
pub const LOCK_MS: i64 = 10 * 60 * 1000;
/// The longest backoff after failures.
pub const RETRY_MAX_MS: i64 = 24 * 3600 * 1000;
const HOUR_MS: i64 = 3600 * 1000;
const DAY_MS: i64 = 24 * HOUR_MS;
/// Engines heard from within this long must serve a challenge before the CA is told.
const ENGINE_RECENT_MS: i64 = 10_000;

/// A challenge type this control plane answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Challenge {
    Http01,
    TlsAlpn01,
}

impl Challenge {
    /// Its name in ACME and in `--acme-challenges`.
    pub fn name(self) -> &'static str {
        match self {
            Challenge::Http01 => "http-01",
            Challenge::TlsAlpn01 => "tls-alpn-01",
        }
    }

    pub fn parse(s: &str) -> Option<Challenge> {
        match s {
            "http-01" => Some(Challenge::Http01),
            "tls-alpn-01" => Some(Challenge::TlsAlpn01),
            _ => None,
        }
    }

    fn acme(self) -> ChallengeType {
        match self {
            Challenge::Http01 => ChallengeType::Http01,
            Challenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        }
    }
}

/// `serve`'s ACME settings.
#[derive(Debug, Clone)]
pub struct AcmeConfig {
    /// The CA's directory URL (`--acme-directory`).
    pub directory: String,
    /// `mailto:` contacts for the account (`--acme-contact`).
    pub contacts: Vec<String>,
    /// A PEM CA certificate to trust for the directory's HTTPS (`--acme-ca-file`).
    pub ca_file: Option<PathBuf>,
    /// `DATA_DIR/acme-account.key`.
    pub account_key: PathBuf,
    /// Tried in this order, each with an order of its own.
    pub challenges: Vec<Challenge>,
    /// How often the domains are looked over.
    pub interval: Duration,
    /// The first backoff after a failure.
    pub retry: Duration,
    /// Orders per domain per rolling day.
    pub domain_orders_per_day: usize,
    /// Orders per rolling hour, the fleet's.
    pub orders_per_hour: usize,
    /// Longest wait for the engines to serve a challenge answer.
    pub publish_wait: Duration,
    /// Longest wait for the CA to validate, then to issue.
    pub order_timeout: Duration,
}

/// Why a domain is due an order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Due {
    /// No certificate yet (or none of ACME's and an admin asked).
    Issue,
    /// Its ACME certificate reached its renewal time.
    Renew,
    /// An admin asked (`POST /v1/domains/{domain}/renew`).
    Requested,
}

/// When an ACME certificate valid from `not_before_ms` to `not_after_ms` of `domain` is
/// renewed: two thirds of its lifetime, less a jitter of up to a twentieth of it.
pub fn renew_at(domain: &str, not_before_ms: i64, not_after_ms: i64) -> i64 {
    let life = (not_after_ms - not_before_ms).max(0);
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (domain, not_after_ms).hash(&mut h);
    let spread = u64::try_from(life / 20).unwrap_or(0);
    let jitter = if spread == 0 { 0 } else { h.finish() % spread };
    not_before_ms + life * 2 / 3 - i64::try_from(jitter).unwrap_or(0)
}

/// The time `r`'s current certificate is renewed, if ACME keeps it.
pub fn renewal_time(r: &DomainRecord) -> Option<i64> {
    let c = r.certificate.as_ref().filter(|c| c.source == SOURCE)?;
    let planned = renew_at(&r.domain, c.not_before_ms, c.not_after_ms);
    Some(
        r.acme
            .as_ref()
            .and_then(|a| a.ari_renew_at_ms)
            .map_or(planned, |ari| ari.min(planned)),
    )
}

/// Whether `r` is due an order at `now_ms`, and why. A domain whose own (uploaded)
/// certificate is in place is its owner's to renew, unless an admin asks.
pub fn due(r: &DomainRecord, now_ms: i64) -> Option<Due> {
    if r.suspended.is_some() {
        return None;
    }
    let acme = r.acme.clone().unwrap_or_default();
    if acme.lock.as_ref().is_some_and(|l| l.until_ms > now_ms) {
        return None;
    }
    if acme.renew_requested_ms.is_some() {
        return Some(Due::Requested);
    }
    if acme.next_attempt_ms.is_some_and(|t| t > now_ms) {
        return None;
    }
    match &r.certificate {
        None => Some(Due::Issue),
        Some(c) if c.source != SOURCE => None,
        Some(_) => renewal_time(r)
            .filter(|&at| at <= now_ms)
            .map(|_| Due::Renew),
    }
}

/// The backoff after `failures` failures in a row: `first` doubled each time, at most a day,
/// less up to a tenth (jitter, from `seed`).
pub fn backoff_ms(first: Duration, failures: u32, seed: u64) -> i64 {
    let first = i64::try_from(first.as_millis())
        .unwrap_or(RETRY_MAX_MS)
        .max(1);
    let shift = failures.saturating_sub(1).min(30);
    let base = first.saturating_mul(1 << shift).min(RETRY_MAX_MS);
    let spread = u64::try_from(base / 10).unwrap_or(0);
    base - i64::try_from(if spread == 0 { 0 } else { seed % spread }).unwrap_or(0)
}

/// Orders placed in the day before `now_ms` for `record`'s domain (the per-domain limit).
pub fn orders_today(record: &DomainRecord, now_ms: i64) -> usize {
    orders_within(std::slice::from_ref(record), now_ms, DAY_MS)
}

/// Orders placed within `window_ms` before `now_ms` in `records`' histories.
fn orders_within(records: &[DomainRecord], now_ms: i64, window_ms: i64) -> usize {
    records
        .iter()
        .filter_map(|r| r.acme.as_ref())
        .flat_map(|a| a.orders_ms.iter())
        .filter(|&&t| t > now_ms - window_ms)
        .count()
}

/// The certificate manager: one per control plane, looking over every domain of the store.
pub struct Acme {
    cfg: AcmeConfig,
    store: Arc<dyn Store>,
    fleet: Arc<Fleet>,
    metrics: Metrics,
    /// This control plane's name in order locks.
    holder: String,
    account: tokio::sync::Mutex<Option<Account>>,
    wake: tokio::sync::Notify,
}

impl std::fmt::Debug for Acme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acme")
            .field("directory", &self.cfg.directory)
            .field("holder", &self.holder)
            .finish_non_exhaustive()
    }
}

/// What one attempt came to.
type Attempt = Result<DomainCertificate, String>;

impl Acme {
    pub fn new(
        cfg: AcmeConfig,
        store: Arc<dyn Store>,
        fleet: Arc<Fleet>,
        metrics: Metrics,
    ) -> Arc<Acme> {
        let mut seed = [0u8; 6];
        let _ = getrandom::getrandom(&mut seed);
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_default();
        Arc::new(Acme {
            cfg,
            store,
            fleet,
            metrics,
            holder: format!("{host}/{}/{}", std::process::id(), hex::encode(seed)),
            account: tokio::sync::Mutex::new(None),
            wake: tokio::sync::Notify::new(),
        })
    }

    /// `--acme-domain-orders-per-day`.
    pub fn domain_orders_per_day(&self) -> usize {
        self.cfg.domain_orders_per_day
    }

    /// Looks the domains over at once (an admin asked for a renewal).
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Runs until `stop` says so: a look over the domains every interval, or when woken.
    pub async fn run(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        tracing::info!(directory = %self.cfg.directory, "ACME certificates on");
        loop {
            Arc::clone(&self).scan().await;
            tokio::select! {
                () = tokio::time::sleep(self.cfg.interval) => {}
                () = self.wake.notified() => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// One look over the domains: every one due an order, within the rate limits, gets one
    /// (one at a time: orders are seconds, renewals spread over weeks).
    async fn scan(self: Arc<Self>) {
        let store = Arc::clone(&self.store);
        let records = match offload("acme: reading domains", move || store.domains()).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "ACME: the domains could not be read; retried");
                return;
            }
            Err(_) => return,
        };
        let now = now_ms();
        let mut fleet_orders = orders_within(&records, now, HOUR_MS);
        for r in &records {
            let Some(why) = due(r, now) else { continue };
            if fleet_orders >= self.cfg.orders_per_hour {
                tracing::warn!(
                    limit = self.cfg.orders_per_hour,
                    "ACME: the fleet's order limit per hour is reached; the rest wait"
                );
                return;
            }
            if orders_today(r, now) >= self.cfg.domain_orders_per_day {
                tracing::debug!(domain = %r.domain, "ACME: the domain's order limit per day is reached");
                continue;
            }
            // Its own task: a panic in an order ends that order (its lock lapses), not the
            // manager.
            let (me, domain) = (Arc::clone(&self), r.domain.clone());
            fleet_orders += tokio::spawn(async move { me.order(&domain, why).await })
                .await
                .unwrap_or_else(|e| {
                    tracing::error!(domain = %r.domain, error = %e, "ACME: the order's task failed; its lock lapses in ten minutes");
                    1
                });
        }
    }

    /// Orders a certificate for `domain` if its lock can be taken; returns the orders placed.
    async fn order(&self, domain: &str, why: Due) -> usize {
        let holder = self.holder.clone();
        let name = domain.to_string();
        let locked = self
            .write(domain, move |r, now| {
                if due(r, now).is_none() {
                    return false;
                }
                let acme = r.acme.get_or_insert_with(Default::default);
                acme.lock = Some(AcmeLock {
                    holder: holder.clone(),
                    until_ms: now + LOCK_MS,
                });
                acme.renew_requested_ms = None;
                acme.challenge = None;
                acme.orders_ms.retain(|&t| t > now - DAY_MS);
                true
            })
            .await;
        if !matches!(locked, Ok(true)) {
            return 0;
        }
        tracing::info!(domain = %name, reason = ?why, "ACME: ordering a certificate");
        let mut errors = Vec::new();
        let mut placed = 0;
        let mut issued = None;
        for &kind in &self.cfg.challenges {
            placed += 1;
            let _ = self
                .write(domain, |r, now| {
                    r.acme
                        .get_or_insert_with(Default::default)
                        .orders_ms
                        .push(now);
                    true
                })
                .await;
            let attempt = tokio::time::timeout(
                self.cfg.publish_wait + self.cfg.order_timeout * 2 + Duration::from_secs(30),
                self.attempt(domain, kind),
            )
            .await
            .unwrap_or_else(|_| Err("the order took too long".to_string()));
            match attempt {
                Ok(cert) => {
                    issued = Some(cert);
                    break;
                }
                Err(e) => {
                    tracing::warn!(domain = %name, challenge = kind.name(), error = %e, "ACME: the order failed");
                    errors.push(format!("{}: {e}", kind.name()));
                    // The failed order's answer comes down before the next is published.
                    let _ = self
                        .write(domain, |r, _| {
                            r.acme.get_or_insert_with(Default::default).challenge = None;
                            true
                        })
                        .await;
                }
            }
        }
        let result = if issued.is_some() { "issued" } else { "failed" };
        self.metrics.acme_orders.with_label_values(&[result]).inc();
        let error = errors.join("; ");
        let seed = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (domain, now_ms()).hash(&mut h);
            h.finish()
        };
        let retry = self.cfg.retry;
        let problem = problem_kind(&error);
        let ari = match &issued {
            Some(cert) => self.ari_renew_at(cert).await,
            None => None,
        };
        let holder = self.holder.clone();
        let done = self
            .write(domain, move |r, now| {
                let acme = r.acme.get_or_insert_with(Default::default);
                if acme.lock.as_ref().is_some_and(|l| l.holder != holder) {
                    // Our lease lapsed and another took it: its outcome is the one kept.
                    return false;
                }
                acme.lock = None;
                acme.challenge = None;
                acme.last_attempt_ms = Some(now);
                match &issued {
                    Some(cert) => {
                        r.certificate = Some(cert.clone());
                        acme.failures = 0;
                        acme.last_error = None;
                        acme.next_attempt_ms = None;
                        acme.ari_renew_at_ms = ari;
                    }
                    None => {
                        acme.failures = acme.failures.saturating_add(1);
                        acme.last_error = Some(error.clone());
                        acme.next_attempt_ms = Some(now + backoff_ms(retry, acme.failures, seed));
                    }
                }
                true
            })
            .await;
        if let Err(e) = done {
            tracing::warn!(domain = %name, error = %e, "ACME: the outcome could not be stored; the lock lapses in ten minutes");
        }
        match result {
            "issued" => {
                for p in PROBLEMS {
                    let _ = self
                        .metrics
                        .acme_last_error
                        .remove_label_values(&[domain, p]);
                }
                tracing::info!(domain = %name, "ACME: certificate issued");
            }
            _ => self
                .metrics
                .acme_last_error
                .with_label_values(&[domain, problem])
                .set(now_ms() as f64 / 1000.0),
        }
        placed
    }

    /// One order with one challenge type, to the certificate.
    async fn attempt(&self, domain: &str, kind: Challenge) -> Attempt {
        let account = self.account().await?;
        let ids = [Identifier::Dns(domain.to_string())];
        let mut order = account
            .new_order(&NewOrder::new(&ids))
            .await
            .map_err(|e| format!("placing the order: {e}"))?;
        if order.state().status == OrderStatus::Pending {
            let mut authorizations = order.authorizations();
            while let Some(authz) = authorizations.next().await {
                let mut authz = authz.map_err(|e| format!("reading the authorization: {e}"))?;
                match authz.status {
                    AuthorizationStatus::Pending => {}
                    AuthorizationStatus::Valid => continue,
                    other => return Err(format!("the authorization is {other:?}")),
                }
                let mut challenge = authz
                    .challenge(kind.acme())
                    .ok_or_else(|| format!("the CA offers no {} challenge", kind.name()))?;
                let key_authorization = challenge.key_authorization();
                let answer = match kind {
                    Challenge::Http01 => AcmeChallenge {
                        kind: kind.name().into(),
                        token: challenge.token.clone(),
                        key_authorization: key_authorization.as_str().to_string(),
                        certificate_pem: None,
                        key_pem: None,
                    },
                    Challenge::TlsAlpn01 => {
                        let (cert, key) =
                            alpn_certificate(domain, key_authorization.digest().as_ref())?;
                        AcmeChallenge {
                            kind: kind.name().into(),
                            token: challenge.token.clone(),
                            key_authorization: key_authorization.as_str().to_string(),
                            certificate_pem: Some(cert),
                            key_pem: Some(key),
                        }
                    }
                };
                let generation = self.publish(domain, answer).await?;
                self.wait_served(generation).await;
                challenge
                    .set_ready()
                    .await
                    .map_err(|e| format!("telling the CA the challenge is ready: {e}"))?;
            }
            let retry = RetryPolicy::new()
                .initial_delay(Duration::from_millis(250))
                .backoff(1.5)
                .timeout(self.cfg.order_timeout);
            let status = order.poll_ready(&retry).await;
            if !matches!(status, Ok(OrderStatus::Ready)) {
                let why = self.validation_error(&mut order).await;
                return Err(match (status, why) {
                    (_, Some(why)) => why,
                    (Err(e), None) => format!("validation: {e}"),
                    (Ok(s), None) => format!("the order is {s:?}"),
                });
            }
        }
        let key_pem = order
            .finalize()
            .await
            .map_err(|e| format!("finalizing the order: {e}"))?;
        let retry = RetryPolicy::new().timeout(self.cfg.order_timeout);
        let chain_pem = order
            .poll_certificate(&retry)
            .await
            .map_err(|e| format!("fetching the certificate: {e}"))?;
        let now = now_ms();
        let checked = lasthop_tls::certificate::check(&chain_pem, &key_pem, domain, now)
            .map_err(|e| format!("the CA's certificate does not check: {e}"))?;
        Ok(DomainCertificate {
            chain_pem,
            key_pem,
            not_before_ms: checked.not_before_ms,
            not_after_ms: checked.not_after_ms,
            issuer: checked.issuer,
            stored_at_ms: now,
            source: SOURCE.into(),
        })
    }

    /// The CA's reason an order's challenge failed, from its authorizations.
    async fn validation_error(&self, order: &mut instant_acme::Order) -> Option<String> {
        let mut authorizations = order.authorizations();
        while let Some(Ok(mut authz)) = authorizations.next().await {
            let state = authz.refresh().await.ok()?;
            if let Some(problem) = state.challenges.iter().find_map(|c| c.error.as_ref()) {
                return Some(format!(
                    "{} ({})",
                    problem.detail.as_deref().unwrap_or("validation failed"),
                    problem.r#type.as_deref().unwrap_or("no type")
                ));
            }
        }
        None
    }

    /// Writes the challenge answer into the record; the domains' generation after it.
    async fn publish(&self, domain: &str, answer: AcmeChallenge) -> Result<u64, String> {
        let holder = self.holder.clone();
        let written = self
            .write(domain, move |r, _| {
                let acme = r.acme.get_or_insert_with(Default::default);
                if acme.lock.as_ref().is_none_or(|l| l.holder != holder) {
                    return false;
                }
                acme.challenge = Some(answer.clone());
                true
            })
            .await
            .map_err(|e| format!("publishing the challenge: {e}"))?;
        if !written {
            return Err("the order's lock was lost".into());
        }
        let store = Arc::clone(&self.store);
        offload("acme: generation", move || store.domains_generation())
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// Waits until every engine heard from lately serves `generation`, at most
    /// `--acme-publish-wait-secs`.
    async fn wait_served(&self, generation: u64) {
        let deadline = tokio::time::Instant::now() + self.cfg.publish_wait;
        loop {
            let fleet = Arc::clone(&self.fleet);
            let behind = offload("acme: fleet", move || {
                let now = now_ms();
                let _ = fleet.refresh(now);
                fleet.behind_certificates(generation, now, ENGINE_RECENT_MS)
            })
            .await
            .unwrap_or_default();
            if behind.is_empty() {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(engines = ?behind, "ACME: engines do not serve the challenge yet; the CA is told anyway");
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// When the CA's renewal information says to renew `cert`, where the directory offers it
    /// (a time inside its suggested window).
    async fn ari_renew_at(&self, cert: &DomainCertificate) -> Option<i64> {
        let (aki, serial) = lasthop_tls::certificate::ari_identifier(&cert.chain_pem)?;
        let account = self.account().await.ok()?;
        let id = instant_acme::CertificateIdentifier::new(
            rustls::pki_types::Der::from_slice(&aki),
            rustls::pki_types::Der::from_slice(&serial),
        );
        let (info, _) = account.renewal_info(&id).await.ok()?;
        let start = info.suggested_window.start.unix_timestamp() * 1000;
        let end = info.suggested_window.end.unix_timestamp() * 1000;
        let spread = u64::try_from(end - start).ok().filter(|&s| s > 0)?;
        let mut h = std::collections::hash_map::DefaultHasher::new();
        cert.chain_pem.hash(&mut h);
        Some(start + i64::try_from(h.finish() % spread).ok()?)
    }

    /// The ACME account: from `DATA_DIR/acme-account.key`, made on first use.
    async fn account(&self) -> Result<Account, String> {
        let mut held = self.account.lock().await;
        if let Some(a) = held.as_ref() {
            return Ok(a.clone());
        }
        let path = self.cfg.account_key.clone();
        let pem = offload("acme: account key", move || account_key(&path))
            .await
            .map_err(|e| e.to_string())??;
        let der = PrivatePkcs8KeyDer::from_pem_slice(pem.as_bytes())
            .map_err(|e| format!("{}: {e}", self.cfg.account_key.display()))?;
        let key = Key::from_pkcs8_der(der.clone_key())
            .map_err(|e| format!("{}: {e}", self.cfg.account_key.display()))?;
        // hyper-rustls builds its client on the process' default provider: ring, as every
        // TLS client of this program.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let builder = match &self.cfg.ca_file {
            Some(ca) => Account::builder_with_root(ca),
            None => Account::builder(),
        }
        .map_err(|e| format!("the ACME client: {e}"))?;
        let (account, _) = builder
            .create_from_key((key, PrivateKeyDer::Pkcs8(der)), self.cfg.directory.clone())
            .await
            .map_err(|e| format!("the ACME account at {}: {e}", self.cfg.directory))?;
        if !self.cfg.contacts.is_empty() {
            let contacts: Vec<&str> = self.cfg.contacts.iter().map(String::as_str).collect();
            if let Err(e) = account.update_contacts(&contacts).await {
                tracing::warn!(error = %e, "ACME: the account's contacts could not be set");
            }
        }
        tracing::info!(account = %account.id(), "ACME account ready");
        *held = Some(account.clone());
        Ok(account)
    }

    /// Reads `domain`'s record, applies `change` (false: leave it) and writes it at the next
    /// revision, again from a fresh read when another writer came in between. Ok(false) when
    /// `change` declined or the domain is gone.
    async fn write(
        &self,
        domain: &str,
        change: impl Fn(&mut DomainRecord, i64) -> bool + Send + 'static,
    ) -> Result<bool, StoreError> {
        let store = Arc::clone(&self.store);
        let domain = domain.to_string();
        let done = offload("acme: writing a domain", move || {
            for _ in 0..8 {
                let Some(mut record) = store.domain(&domain)? else {
                    return Ok(false);
                };
                let expected = record.revision;
                if !change(&mut record, now_ms()) {
                    return Ok(false);
                }
                if store.write_domain(record, Some(expected), false)? {
                    return Ok(true);
                }
            }
            Ok(false)
        })
        .await;
        done.unwrap_or(Ok(false))
    }
}

/// The kinds of failure the `acme_last_error` metric names.
const PROBLEMS: [&str; 9] = [
    "connection",
    "dns",
    "unauthorized",
    "incorrectResponse",
    "tls",
    "rateLimited",
    "caa",
    "timeout",
    "other",
];

/// The ACME problem type (`urn:ietf:params:acme:error:TYPE`) an error names, or `timeout` or
/// `other`: a bounded label.
fn problem_kind(error: &str) -> &'static str {
    PROBLEMS
        .iter()
        .copied()
        .find(|p| error.contains(&format!("acme:error:{p}")))
        .unwrap_or(
            if error.contains("too long") || error.contains("timed out") {
                "timeout"
            } else {
                "other"
            },
        )
}

/// TLS-ALPN-01's certificate for `domain` (RFC 8737 §3): self-signed, the name as its only
/// subjectAltName, the key authorization's SHA-256 in the critical `acmeIdentifier`
/// extension; with its fresh key, both PEM.
pub fn alpn_certificate(domain: &str, digest: &[u8]) -> Result<(String, String), String> {
    if digest.len() != 32 {
        return Err("the key authorization's digest is not SHA-256".into());
    }
    let mut params = rcgen::CertificateParams::new(vec![domain.to_string()])
        .map_err(|e| format!("the challenge certificate: {e}"))?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest)];
    let key = rcgen::KeyPair::generate().map_err(|e| format!("the challenge key: {e}"))?;
    let cert = params
        .self_signed(&key)
        .map_err(|e| format!("the challenge certificate: {e}"))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The account key's PEM: read (a secret file), or made (ECDSA P-256, PKCS#8) and written.
fn account_key(path: &std::path::Path) -> Result<String, String> {
    match std::fs::metadata(path) {
        Ok(_) => lasthop_core::secret::read(path)
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = rcgen::KeyPair::generate().map_err(|e| format!("a new account key: {e}"))?;
            let pem = key.serialize_pem();
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            }
            lasthop_core::secret::write(path, pem.as_bytes())
                .map_err(|e| format!("{}: {e}", path.display()))?;
            tracing::info!(path = %path.display(), "created the ACME account key");
            Ok(pem)
        }
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{DomainAcme, DomainSettings};

    fn record(cert: Option<(i64, i64, &str)>, acme: Option<DomainAcme>) -> DomainRecord {
        DomainRecord {
            domain: "go.example.com".into(),
            owner: "alice".into(),
            created_at_ms: 0,
            revision: 1,
            settings: DomainSettings::default(),
            suspended: None,
            certificate: cert.map(|(nb, na, source)| DomainCertificate {
                chain_pem: String::new(),
                key_pem: String::new(),
                not_before_ms: nb,
                not_after_ms: na,
                issuer: String::new(),
                stored_at_ms: nb,
                source: source.into(),
            }),
            acme: acme.map(Box::new),
        }
    }

    #[test]
    fn what_is_due_and_when() {
        let day = DAY_MS;
        // No certificate: issue now.
        assert_eq!(due(&record(None, None), 0), Some(Due::Issue));
        // An ACME certificate of 90 days: not before two thirds less a twentieth...
        let r = record(Some((0, 90 * day, SOURCE)), None);
        let at = renewal_time(&r).unwrap();
        assert!((60 * day - 90 * day / 20..=60 * day).contains(&at), "{at}");
        assert_eq!(due(&r, at - 1), None);
        assert_eq!(due(&r, at), Some(Due::Renew));
        // ... the same everywhere, and different for another name.
        assert_eq!(at, renew_at("go.example.com", 0, 90 * day));
        let others: std::collections::HashSet<i64> = (0..20)
            .map(|i| renew_at(&format!("d{i}.example"), 0, 90 * day))
            .collect();
        assert!(others.len() > 10, "jittered: {others:?}");
        // An uploaded certificate is its owner's, even past its renewal time ...
        let uploaded = record(Some((0, 90 * day, "upload")), None);
        assert_eq!(due(&uploaded, 89 * day), None);
        // ... unless an admin asks.
        let asked = record(
            Some((0, 90 * day, "upload")),
            Some(DomainAcme {
                renew_requested_ms: Some(1),
                ..DomainAcme::default()
            }),
        );
        assert_eq!(due(&asked, 1), Some(Due::Requested));
        // A backoff holds it; a held lock holds it until it lapses.
        let failing = record(
            None,
            Some(DomainAcme {
                failures: 2,
                next_attempt_ms: Some(1000),
                ..DomainAcme::default()
            }),
        );
        assert_eq!(due(&failing, 999), None);
        assert_eq!(due(&failing, 1000), Some(Due::Issue));
        let locked = record(
            None,
            Some(DomainAcme {
                lock: Some(AcmeLock {
                    holder: "other".into(),
                    until_ms: 500,
                }),
                renew_requested_ms: Some(1),
                ..DomainAcme::default()
            }),
        );
        assert_eq!(due(&locked, 499), None);
        assert_eq!(due(&locked, 500), Some(Due::Requested));
        // The CA's renewal information brings it forward.
        let ari = record(
            Some((0, 90 * day, SOURCE)),
            Some(DomainAcme {
                ari_renew_at_ms: Some(10 * day),
                ..DomainAcme::default()
            }),
        );
        assert_eq!(due(&ari, 10 * day), Some(Due::Renew));
        // Suspended: nothing.
        let mut suspended = record(None, None);
        suspended.suspended = Some(crate::store::DomainSuspension {
            at_ms: 0,
            by: "admin".into(),
            reason: "abuse".into(),
        });
        assert_eq!(due(&suspended, 0), None);
    }

    #[test]
    fn backoff_doubles_to_a_day_with_jitter() {
        let first = Duration::from_secs(60);
        assert!((54_000..=60_000).contains(&backoff_ms(first, 1, 7)));
        assert!((108_000..=120_000).contains(&backoff_ms(first, 2, 7)));
        assert!(backoff_ms(first, 40, 7) <= RETRY_MAX_MS);
        assert!(backoff_ms(first, 40, 7) >= RETRY_MAX_MS - RETRY_MAX_MS / 10);
        assert_ne!(backoff_ms(first, 3, 1), backoff_ms(first, 3, 12_345));
    }

    #[test]
    fn problems_are_a_bounded_label() {
        assert_eq!(
            problem_kind("http-01: Connection refused (urn:ietf:params:acme:error:connection)"),
            "connection"
        );
        assert_eq!(problem_kind("the order took too long"), "timeout");
        assert_eq!(problem_kind("anything"), "other");
    }

    #[test]
    fn the_alpn_certificate_carries_the_digest_and_the_name() {
        let digest = [7u8; 32];
        let (cert, key) = alpn_certificate("go.example.com", &digest).unwrap();
        let served = lasthop_tls::certificate::challenge_key(&cert, &key).unwrap();
        let der = served.cert[0].as_ref();
        // The acmeIdentifier OID (1.3.6.1.5.5.7.1.31) and the digest as an OCTET STRING.
        let oid = [0x06, 0x08, 0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x01, 0x1f];
        assert!(der.windows(oid.len()).any(|w| w == oid));
        let mut octets = vec![0x04, 0x20];
        octets.extend_from_slice(&digest);
        assert!(der.windows(octets.len()).any(|w| w == octets));
        assert!(der.windows(14).any(|w| w == b"go.example.com"));
        assert!(alpn_certificate("go.example.com", &[1; 20]).is_err());
    }

    #[test]
    fn the_account_key_is_a_secret_file_made_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("acme-account.key");
        let first = account_key(&path).unwrap();
        assert!(first.contains("PRIVATE KEY"));
        assert_eq!(account_key(&path).unwrap(), first);
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "{mode:o}");
    }
}
