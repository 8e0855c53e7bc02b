//! Replication between regions (docs/ARCHITECTURE.md, "Regions").
//!
//! A region is the control planes on one store and the engines subscribed to them. Every
//! region mints from its own counter range, so links never conflict: each region tails every
//! other region's change log (`GET /peer/v1/changes` on the peer's edge listener, with the
//! peer token) from the position it last applied, kept in its own store in the same
//! transaction as what it applied, and writes what that region originated into its own store,
//! and so into its own feed. A region serves only the changes it originated, so nothing loops,
//! and applying a page twice changes nothing (a link we have is skipped, a state we have is not
//! written again).
//!
//! The rule for state: a link's state is its **home** region's (the region whose range holds
//! its counter; for an alias, `--alias-home-region`). From its home, a state change replaces
//! ours. From any other region only what it restricts applies (a takedown, a flag, a
//! disablement, a deletion issued there is in force here too); lifting one is the home's
//! decision, which then flows here like any other of its changes.
//!
//! One thread per peer: a long poll (`wait_ms`), then one store transaction per page. While a
//! peer is unreachable its thread retries with backoff and `GET /v1/regions` shows it
//! disconnected, with the lag in changes (its last known head) and in seconds (since we last
//! had everything it had).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lasthop_core::code::{classify, CodeKind};
use lasthop_core::CodeScheme;
use serde::{Deserialize, Serialize};

use crate::clock::now_ms;
use crate::store::{peer_position, Replicated, ReplicatedChange, Store, StoreError, StoredLink};

/// Changes asked for per page, and how long the peer may hold a request with none.
const PAGE: usize = 1_000;
const WAIT_MS: u64 = 10_000;
/// Retry delays after a failure: doubling from the first to the last.
const BACKOFF_FIRST: Duration = Duration::from_millis(200);
const BACKOFF_LAST: Duration = Duration::from_secs(5);

/// `--peer REGION=URL`: another region's edge listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSpec {
    pub region: u32,
    pub url: String,
}

impl std::str::FromStr for PeerSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (region, url) = s
            .split_once('=')
            .ok_or_else(|| format!("{s:?}: expected REGION=URL (e.g. 1=https://cp.eu:8081)"))?;
        let region = region
            .trim()
            .parse()
            .map_err(|_| format!("{s:?}: the region must be a number"))?;
        let url = url.trim().trim_end_matches('/').to_string();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(format!(
                "{s:?}: the URL must start with http:// or https://"
            ));
        }
        Ok(PeerSpec { region, url })
    }
}

/// Everything replication needs.
#[derive(Debug, Clone)]
pub struct PeersConfig {
    /// This region, of `regions`.
    pub region: u32,
    pub regions: u32,
    /// The region aliases belong to.
    pub alias_home: u32,
    pub peers: Vec<PeerSpec>,
    /// The token every region presents to the others.
    pub token: String,
    /// A lag past this many seconds raises the alarm.
    pub lag_alarm_secs: f64,
    /// The API keys that take every peer's keys and revocations (the data directory's file,
    /// or the shared store's table); `None`: keys are not copied.
    pub keys: Option<Arc<crate::auth::ApiKeys>>,
}

/// Bad replication settings.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeersError {
    #[error("--peer {0}: that is this region (--region)")]
    Myself(u32),
    #[error("--peer {region}: regions are numbered below --regions {regions}")]
    OutOfRange { region: u32, regions: u32 },
    #[error("--peer {0} is named twice")]
    Twice(u32),
    #[error("the peer token file {path}: {cause}")]
    Token { path: String, cause: String },
    #[error("starting the replication thread: {0}")]
    Thread(std::io::Error),
}

/// Reads `--peer-token-file`: the secret every region presents to the others (at least 32
/// characters; one file copied to every region).
pub fn read_token(path: &std::path::Path) -> Result<String, PeersError> {
    let bad = |cause: String| PeersError::Token {
        path: path.display().to_string(),
        cause,
    };
    lasthop_core::secret::refuse_loose(path).map_err(|e| bad(e.to_string()))?;
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let token = text.trim();
    if token.len() < 32 || token.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(bad(
            "the token must be at least 32 printable characters, without spaces".into(),
        ));
    }
    Ok(token.to_string())
}

/// One peer as `GET /v1/regions` shows it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PeerStatus {
    pub region: u32,
    pub url: String,
    /// Its change-log sequence we have applied everything up to.
    pub applied_seq: u64,
    /// Its change-log head when we last heard from it.
    pub head_seq: u64,
    /// Changes of its log not applied here yet (as of its last known head).
    pub lag_changes: u64,
    /// Seconds since we last had everything it had (0 while we do).
    pub lag_seconds: f64,
    pub connected: bool,
    /// The lag is past the alarm.
    pub alarm: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

#[derive(Debug, Default)]
struct Track {
    applied: u64,
    head: u64,
    connected: bool,
    /// When we last had everything it had (ms); `None` before the first contact.
    caught_up_ms: Option<i64>,
    /// When it last answered (ms), and the most codes a second it said it mints.
    contact_ms: Option<i64>,
    mint_rate: Option<u64>,
    last_error: Option<String>,
}

struct Peer {
    spec: PeerSpec,
    track: Mutex<Track>,
}

/// The running replication: one thread per peer.
pub struct Peers {
    config: PeersConfig,
    started_ms: i64,
    peers: Vec<Arc<Peer>>,
    stop: Arc<AtomicBool>,
    home: Home,
    agent: ureq::Agent,
}

/// Why a peer region could not answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PeerError {
    #[error("no --peer names region {0}")]
    Unknown(u32),
    #[error("region {region} ({url}): {detail}")]
    Failed {
        region: u32,
        url: String,
        detail: String,
    },
}

/// How often each peer region's API keys are copied.
const KEYS_EVERY: Duration = Duration::from_secs(1);

/// How long a stats answer waits for a peer region: past it, the answer leaves that region's
/// clicks out and says so.
const STATS_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a request to a peer region may take (read-through and forwarded changes; the
/// caller waits for it).
const ASK_TIMEOUT: Duration = Duration::from_secs(5);

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers")
            .field("region", &self.config.region)
            .field("peers", &self.peers.len())
            .finish_non_exhaustive()
    }
}

impl Peers {
    /// Checks the settings and starts replicating from every peer into `store`; `agent` is
    /// the HTTP client (with the peers' CA, `--peer-ca`).
    /// With `safety`, every peer's suspensions are copied as well (each second, with the keys).
    pub fn start(
        config: PeersConfig,
        store: Arc<dyn Store>,
        scheme: CodeScheme,
        agent: ureq::Agent,
        safety: Option<Arc<crate::safety::Safety>>,
    ) -> Result<Arc<Peers>, PeersError> {
        let mut seen = std::collections::HashSet::new();
        for p in &config.peers {
            if p.region == config.region {
                return Err(PeersError::Myself(p.region));
            }
            if p.region >= config.regions {
                return Err(PeersError::OutOfRange {
                    region: p.region,
                    regions: config.regions,
                });
            }
            if !seen.insert(p.region) {
                return Err(PeersError::Twice(p.region));
            }
        }
        let peers: Vec<Arc<Peer>> = config
            .peers
            .iter()
            .map(|spec| {
                Arc::new(Peer {
                    spec: spec.clone(),
                    track: Mutex::new(Track::default()),
                })
            })
            .collect();
        let home = Home {
            scheme,
            regions: config.regions,
            alias_home: config.alias_home,
        };
        let this = Arc::new(Peers {
            started_ms: now_ms(),
            peers,
            stop: Arc::new(AtomicBool::new(false)),
            config,
            home,
            agent,
        });
        for peer in &this.peers {
            let (peers, pulled, store) = (Arc::clone(&this), Arc::clone(peer), Arc::clone(&store));
            std::thread::Builder::new()
                .name(format!("peer-{}", peer.spec.region))
                .spawn(move || peers.pull(&pulled, &*store))
                .map_err(PeersError::Thread)?;
            let keys = this.config.keys.clone();
            if keys.is_some() || safety.is_some() {
                let (peers, peer, safety) = (Arc::clone(&this), Arc::clone(peer), safety.clone());
                std::thread::Builder::new()
                    .name(format!("peer-keys-{}", peer.spec.region))
                    .spawn(move || peers.copy_accounts(&peer, keys.as_deref(), safety.as_deref()))
                    .map_err(PeersError::Thread)?;
            }
        }
        Ok(this)
    }

    /// This region.
    pub fn region(&self) -> u32 {
        self.config.region
    }

    /// The home region of `code` (see the module's rule) when it is another region; `None`
    /// for one of ours, or a code no namespace holds.
    pub fn home_elsewhere(&self, code: &str) -> Option<u32> {
        self.home.of(code).filter(|&h| h != self.config.region)
    }

    fn peer(&self, region: u32) -> Result<&Peer, PeerError> {
        self.peers
            .iter()
            .find(|p| p.spec.region == region)
            .map(|p| &**p)
            .ok_or(PeerError::Unknown(region))
    }

    /// A failure of a request to region `region`.
    fn failed(&self, region: u32, detail: String) -> PeerError {
        PeerError::Failed {
            region,
            url: self
                .peer(region)
                .map(|p| p.spec.url.clone())
                .unwrap_or_default(),
            detail,
        }
    }

    /// One request to region `region` (a GET, or a POST of `body`) under `path`: its JSON
    /// answer, `None` for a 404 `not_found` (the one answer that says "no such link"). Blocking,
    /// at most [`ASK_TIMEOUT`].
    fn ask<T: serde::de::DeserializeOwned>(
        &self,
        region: u32,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Option<T>, PeerError> {
        self.ask_within(region, path, body, ASK_TIMEOUT)
    }

    /// [`Peers::ask`] with its own time limit (a long poll's).
    fn ask_within<T: serde::de::DeserializeOwned>(
        &self,
        region: u32,
        path: &str,
        body: Option<serde_json::Value>,
        timeout: Duration,
    ) -> Result<Option<T>, PeerError> {
        let peer = self.peer(region)?;
        let failed = |detail: String| self.failed(region, detail);
        let url = format!("{}{path}", peer.spec.url);
        let auth = format!("Bearer {}", self.config.token);
        let sent = match body {
            None => self
                .agent
                .get(&url)
                .set("Authorization", &auth)
                .timeout(timeout)
                .call(),
            Some(body) => self
                .agent
                .post(&url)
                .set("Authorization", &auth)
                .timeout(timeout)
                .send_json(body),
        };
        match sent {
            Ok(resp) => resp
                .into_json::<T>()
                .map(Some)
                .map_err(|e| failed(format!("reading the answer: {e}"))),
            Err(ureq::Error::Status(404, resp)) => {
                let body: serde_json::Value = resp.into_json().unwrap_or_default();
                if body["error"]["code"] == "not_found" {
                    Ok(None)
                } else {
                    Err(failed(format!("404 {body}")))
                }
            }
            Err(ureq::Error::Status(code, resp)) => Err(failed(format!(
                "{code}: {}",
                resp.into_string().unwrap_or_default()
            ))),
            Err(e) => Err(failed(e.to_string())),
        }
    }

    /// Every peer region, in order.
    pub fn regions(&self) -> Vec<u32> {
        let mut regions: Vec<u32> = self.peers.iter().map(|p| p.spec.region).collect();
        regions.sort_unstable();
        regions
    }

    /// Asks region `region` for its clicks of `code` from `from` to `to` (`GET
    /// /peer/v1/stats/{code}`), at most [`STATS_TIMEOUT`]: none when it has none. Blocking.
    /// `code` is a link key; a branded one's `/` travels as `%2F`, one path segment.
    pub fn stats(
        &self,
        region: u32,
        code: &str,
        from: crate::clicks::Day,
        to: crate::clicks::Day,
    ) -> Result<Vec<crate::clicks::stats::WireDay>, PeerError> {
        let path = format!("/peer/v1/stats/{}?from={from}&to={to}", path_key(code));
        Ok(self
            .ask_within(region, &path, None, STATS_TIMEOUT)?
            .unwrap_or_default())
    }

    /// Asks region `region` for a link (`GET /peer/v1/links/{code}`): `Ok(None)` only when
    /// that region says it never existed. Blocking.
    pub fn fetch_link(&self, region: u32, code: &str) -> Result<Option<StoredLink>, PeerError> {
        self.ask(region, &format!("/peer/v1/links/{}", path_key(code)), None)
    }

    /// The region aliases belong to, when it is another: alias creates go there.
    pub fn alias_home_elsewhere(&self) -> Option<u32> {
        (self.config.alias_home != self.config.region).then_some(self.config.alias_home)
    }

    /// Has the alias home region create `req` (`POST /peer/v1/aliases`), synchronously: the
    /// one place an alias is claimed, so the same alias claimed in two regions at once gets
    /// exactly one link. Blocking.
    pub fn forward_create(
        &self,
        region: u32,
        req: &crate::store::CreateRequest,
    ) -> Result<crate::store::CreateOutcome, PeerError> {
        use crate::store::CreateOutcome;
        let body = serde_json::to_value(ForwardedCreate::of(req)).unwrap_or_default();
        let answer: Option<CreateAnswer> = self.ask(region, "/peer/v1/aliases", Some(body))?;
        let unexpected = |what: String| self.failed(region, what);
        let answer = answer.ok_or_else(|| unexpected("404 not_found".into()))?;
        match (answer.outcome.as_str(), answer.link) {
            ("created", Some(link)) => Ok(CreateOutcome::Created(link)),
            ("replayed", Some(link)) => Ok(CreateOutcome::Replayed(link)),
            ("alias_taken", _) => Ok(CreateOutcome::AliasTaken),
            ("idempotency_mismatch", _) => Ok(CreateOutcome::IdempotencyMismatch),
            ("collision", _) => {
                Ok(CreateOutcome::Collision(answer.why.unwrap_or_else(|| {
                    "refused by the code's home region".into()
                })))
            }
            (other, _) => Err(unexpected(format!("unexpected outcome {other:?}"))),
        }
    }

    /// Has region `region` (the link's home) apply `update` as `actor` would
    /// (`POST /peer/v1/links/{code}/state`): the link as the home now has it, `None` if the
    /// home does not have the code. Blocking.
    pub fn forward_update(
        &self,
        region: u32,
        code: &str,
        update: &crate::store::StateUpdate,
        actor: &str,
    ) -> Result<Option<StoredLink>, PeerError> {
        let body = serde_json::json!({"update": update, "actor": actor});
        self.ask(
            region,
            &format!("/peer/v1/links/{}/state", path_key(code)),
            Some(body),
        )
    }

    /// Asks region `region`, the home of `code`, to delete it as `actor` did here (a link this
    /// region has not replicated yet); the link as it now is there, `None` when it has no
    /// such link. Blocking.
    pub fn forward_delete(
        &self,
        region: u32,
        code: &str,
        actor: &str,
    ) -> Result<Option<StoredLink>, PeerError> {
        let body = serde_json::json!({"delete": true, "actor": actor});
        self.ask(
            region,
            &format!("/peer/v1/links/{}/state", path_key(code)),
            Some(body),
        )
    }

    /// Every peer's replication as of `now_ms`.
    pub fn status(&self, now_ms: i64) -> Vec<PeerStatus> {
        self.peers
            .iter()
            .map(|p| {
                let t = p.track.lock().unwrap_or_else(|e| e.into_inner());
                let behind = t.applied < t.head || !t.connected;
                let since = t.caught_up_ms.unwrap_or(self.started_ms);
                let lag_seconds = if behind {
                    (now_ms - since).max(0) as f64 / 1000.0
                } else {
                    0.0
                };
                PeerStatus {
                    region: p.spec.region,
                    url: p.spec.url.clone(),
                    applied_seq: t.applied,
                    head_seq: t.head,
                    lag_changes: t.head.saturating_sub(t.applied),
                    lag_seconds,
                    connected: t.connected,
                    alarm: lag_seconds > self.config.lag_alarm_secs,
                    last_error: t.last_error.clone(),
                }
            })
            .collect()
    }

    /// `GET /v1/regions`' body.
    pub fn view(&self, now_ms: i64) -> serde_json::Value {
        serde_json::json!({
            "region": self.config.region,
            "regions": self.config.regions,
            "alias_home_region": self.config.alias_home,
            "peers": self.status(now_ms),
        })
    }

    /// The windows this region's engines should widen (feed `widen`): for each peer out of
    /// touch whose mint rate is known, its rate × the time since it last answered, so links it
    /// mints meanwhile are asked of the origin (503 while the peer cannot answer), never
    /// rejected by arithmetic.
    pub fn windows(&self, now_ms: i64) -> Vec<lasthop_core::feed::Window> {
        self.peers
            .iter()
            .filter_map(|p| {
                let t = p.track.lock().unwrap_or_else(|e| e.into_inner());
                if t.connected {
                    return None;
                }
                let (rate, since) = (t.mint_rate?, t.contact_ms?);
                let ms = u64::try_from(now_ms - since).unwrap_or(0);
                Some(lasthop_core::feed::Window {
                    region: p.spec.region,
                    extra: rate.saturating_mul(ms) / 1000,
                })
            })
            .collect()
    }

    /// Copies `peer`'s API keys into `keys` and its suspensions through `safety`, every
    /// [`KEYS_EVERY`], until stopped: keys we lack are added (with their revocation, if any),
    /// and a key live here but revoked there is revoked here.
    fn copy_accounts(
        &self,
        peer: &Peer,
        keys: Option<&crate::auth::ApiKeys>,
        safety: Option<&crate::safety::Safety>,
    ) {
        let region = peer.spec.region;
        let mut failing = false;
        while !self.stop.load(Ordering::Relaxed) {
            let keys = keys.map_or(Ok((0, 0)), |keys| self.copy_keys_once(region, keys));
            let owners = safety.map_or(Ok(0), |safety| self.copy_owners_once(region, safety));
            match keys.and_then(|k| owners.map(|o| (k, o))) {
                Ok(((added, revoked), owners)) => {
                    failing = false;
                    if added + revoked + owners > 0 {
                        tracing::info!(
                            peer = region,
                            added,
                            revoked,
                            owners,
                            "copied API keys and suspensions from a peer region"
                        );
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(peer = region, error = %e, "copying API keys and suspensions from a peer region failed; retrying");
                    }
                    failing = true;
                }
            }
            std::thread::sleep(KEYS_EVERY);
        }
    }

    /// Copies the suspensions and unsuspensions of `region` newer than ours; how many.
    fn copy_owners_once(
        &self,
        region: u32,
        safety: &crate::safety::Safety,
    ) -> Result<usize, String> {
        let theirs: Vec<crate::store::OwnerRecord> = self
            .ask(region, "/peer/v1/owners", None)
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let mut copied = 0;
        for record in &theirs {
            let done = crate::safety::enforce::copy_suspension(safety, record, region)
                .map_err(|e| format!("copying the suspension of {}: {e}", record.owner))?;
            if let Some(what) = done {
                tracing::warn!(owner = %record.owner, peer = region, what, "copied an owner's suspension from a peer region");
                copied += 1;
            }
        }
        Ok(copied)
    }

    fn copy_keys_once(
        &self,
        region: u32,
        keys: &crate::auth::ApiKeys,
    ) -> Result<(usize, usize), String> {
        let lines: Vec<crate::store::transfer::KeyLine> = self
            .ask(region, "/peer/v1/keys", None)
            .map_err(|e| e.to_string())?
            .unwrap_or_default();
        let theirs = lines
            .iter()
            .map(|l| l.to_record())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        keys.copy_from(&theirs).map_err(|e| e.to_string())
    }

    /// Stops the threads after their current request (a long poll ends within `WAIT_MS`).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A link key as one path segment: a branded key's `/` percent-encoded (the route's `{code}`
/// decodes it back).
pub(crate) fn path_key(key: &str) -> std::borrow::Cow<'_, str> {
    if key.contains('/') {
        key.replace('/', "%2F").into()
    } else {
        key.into()
    }
}

/// An alias create forwarded to the alias home region: the caller's owner (trusted through
/// the peer token), what it asked, and what the forwarding region decided (its velocity hold).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ForwardedCreate {
    pub owner: String,
    pub long_url: String,
    pub alias: String,
    /// The alias's branded domain (absent: the default domain).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    #[serde(default)]
    pub expires_at_ms: Option<i64>,
    pub now_ms: i64,
    #[serde(default)]
    pub hold: Option<lasthop_core::Hold>,
    /// How its redirect is served (absent at the defaults).
    #[serde(default, skip_serializing_if = "lasthop_core::LinkOptions::is_default")]
    pub options: lasthop_core::LinkOptions,
    /// Its tags.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The creator as the forwarding region's audit trail names it.
    pub actor: String,
    /// `Idempotency-Key` and the SHA-256 of the request body (hex), when one was presented.
    #[serde(default)]
    pub idempotency: Option<(String, String)>,
    /// An import's row (issue 44): the old code, of any legacy shape, claimed where the
    /// code's home is (its counter's region for a 7-character code, the alias home else).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported: Option<ForwardedImport>,
}

/// [`crate::store::Imported`] on the wire.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct ForwardedImport {
    #[serde(default)]
    pub created_at_ms: Option<i64>,
    #[serde(default)]
    pub clicks: Option<u64>,
}

impl ForwardedCreate {
    fn of(req: &crate::store::CreateRequest) -> ForwardedCreate {
        ForwardedCreate {
            owner: req.owner.clone(),
            long_url: req.long_url.clone(),
            alias: req.alias.clone().unwrap_or_default(),
            domain: req.domain.clone(),
            expires_at_ms: req.expires_at_ms,
            now_ms: req.now_ms,
            hold: req.hold,
            options: req.options,
            tags: req.tags.clone(),
            actor: req.actor.to_string(),
            idempotency: req
                .idempotency
                .as_ref()
                .map(|c| (c.key.clone(), hex::encode(c.body_hash))),
            imported: req.imported.map(|i| ForwardedImport {
                created_at_ms: i.created_at_ms,
                clicks: i.clicks,
            }),
        }
    }

    /// The create the alias home performs, or why the body is refused.
    pub fn request(self) -> Result<crate::store::CreateRequest, String> {
        match (classify(self.alias.as_bytes()), &self.imported) {
            (CodeKind::Alias, _) => {}
            (CodeKind::Generated | CodeKind::Legacy, Some(_)) => {}
            _ => return Err(format!("{:?} is not an alias", self.alias)),
        }
        if let Some(domain) = &self.domain {
            if !lasthop_core::code::domain_shape(domain.as_bytes()) {
                return Err(format!("{domain:?} is not a domain name"));
            }
        }
        self.options.validate().map_err(|e| e.to_string())?;
        if self.tags.len() > lasthop_core::TAGS_MAX
            || !self.tags.iter().all(|t| lasthop_core::tag_ok(t))
        {
            return Err("tags: at most 10, each 1-32 of [a-z0-9_-]".into());
        }
        if self.owner.is_empty() || self.owner.len() > 200 || self.actor.len() > 200 {
            return Err("owner and actor: 1-200 characters".into());
        }
        let idempotency = match self.idempotency {
            None => None,
            Some((key, hash)) => {
                let mut body_hash = [0u8; 32];
                hex::decode_to_slice(&hash, &mut body_hash)
                    .map_err(|_| "idempotency: the body hash must be 64 hex digits".to_string())?;
                Some(crate::store::IdempotencyClaim { key, body_hash })
            }
        };
        Ok(crate::store::CreateRequest {
            owner: self.owner,
            long_url: self.long_url,
            domain: self.domain,
            alias: Some(self.alias),
            expires_at_ms: self.expires_at_ms,
            idempotency,
            now_ms: self.now_ms,
            hold: self.hold,
            options: self.options,
            tags: self.tags,
            actor: crate::store::Actor::Forwarded(self.actor),
            destination: None,
            imported: self.imported.map(|i| crate::store::Imported {
                created_at_ms: i.created_at_ms,
                clicks: i.clicks,
            }),
        })
    }
}

/// The alias home's answer to a forwarded create.
#[derive(Debug, Serialize, Deserialize)]
pub struct CreateAnswer {
    /// `created`, `replayed`, `alias_taken`, `idempotency_mismatch` or `collision` (an
    /// import's claim refused, `why` says why).
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<StoredLink>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Whose a link's state is.
struct Home {
    scheme: CodeScheme,
    regions: u32,
    alias_home: u32,
}

impl Home {
    /// The home region of `code`: the region whose range holds its counter, or the alias home.
    fn of(&self, code: &str) -> Option<u32> {
        // A branded link's home is its code's, as on the default domain.
        let (_, code) = lasthop_core::split_key_str(code);
        match classify(code.as_bytes()) {
            CodeKind::Generated => self
                .scheme
                .decode(code.as_bytes())
                .and_then(|n| lasthop_core::region::region_of(n, self.regions)),
            // A legacy code is named, as an alias is: it lives in the alias home.
            CodeKind::Alias | CodeKind::Legacy => Some(self.alias_home),
            CodeKind::Invalid => None,
        }
    }
}

/// One page of `GET /peer/v1/changes`.
#[derive(Debug, Deserialize)]
struct Page {
    region: u32,
    head: u64,
    high_water: u64,
    upto: u64,
    changes: Vec<crate::store::OwnChange>,
    /// The peer's `--max-mint-rate`.
    #[serde(default)]
    mint_rate: Option<u64>,
}

impl Peers {
    /// Replicates from `peer` into `store` until stopped: a long poll, then one store
    /// transaction per page; failures retry with backoff.
    fn pull(&self, peer: &Peer, store: &dyn Store) {
        let region = peer.spec.region;
        let mut backoff = BACKOFF_FIRST;
        while !self.stop.load(Ordering::Relaxed) {
            match self.pull_once(peer, store) {
                Ok(()) => backoff = BACKOFF_FIRST,
                Err(e) => {
                    let mut t = peer.track.lock().unwrap_or_else(|e| e.into_inner());
                    if t.connected || t.last_error.is_none() {
                        tracing::warn!(peer = region, url = %peer.spec.url, error = %e, "replication from a peer region failed; retrying");
                    }
                    t.connected = false;
                    t.last_error = Some(e);
                    drop(t);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(BACKOFF_LAST);
                }
            }
        }
    }

    /// One long poll and the store transaction for what it brought.
    fn pull_once(&self, peer: &Peer, store: &dyn Store) -> Result<(), String> {
        let region = peer.spec.region;
        let after = store
            .position(&peer_position(region))
            .map_err(|e| format!("reading the position: {e}"))?
            .and_then(|p| p.parse::<u64>().ok())
            .unwrap_or(0);
        // Not connected yet (a start, after a failure): ask without waiting, so the contact
        // shows at once; then long-poll.
        let connected = peer.track.lock().map(|t| t.connected).unwrap_or(false);
        let wait = if connected { WAIT_MS } else { 0 };
        let path = format!("/peer/v1/changes?after={after}&limit={PAGE}&wait_ms={wait}");
        let page: Page = self
            .ask_within(region, &path, None, Duration::from_millis(wait + 10_000))
            .map_err(|e| e.to_string())?
            .ok_or("404 not_found")?;
        if page.region != region {
            return Err(format!(
                "the peer says it is region {}, not {region} (check --peer)",
                page.region
            ));
        }
        if page.upto > after || !page.changes.is_empty() {
            let changes = page
                .changes
                .into_iter()
                .map(|c| {
                    let authoritative = self.home.of(c.change.code()) == Some(region);
                    // The records are that region's, written with this change: say so, whatever
                    // they claim.
                    let origin = Some(crate::store::Origin { region, seq: c.seq });
                    let audit = c
                        .audit
                        .into_iter()
                        .map(|r| crate::store::AuditRecord { origin, ..r })
                        .collect();
                    ReplicatedChange {
                        seq: c.seq,
                        authoritative,
                        change: c.change,
                        audit,
                    }
                })
                .collect();
            let outcome = store
                .replicate(Replicated {
                    region,
                    changes,
                    high_water: page.high_water,
                    position: page.upto.max(after),
                })
                .map_err(|e: StoreError| format!("applying the page: {e}"))?;
            if outcome.applied > 0 {
                tracing::debug!(
                    peer = region,
                    applied = outcome.applied,
                    upto = page.upto,
                    "replicated"
                );
            }
        }
        let mut t = peer.track.lock().unwrap_or_else(|e| e.into_inner());
        if !t.connected {
            tracing::info!(peer = region, url = %peer.spec.url, "replicating from the peer region");
        }
        let now = now_ms();
        t.connected = true;
        t.last_error = None;
        t.contact_ms = Some(now);
        t.mint_rate = page.mint_rate;
        t.applied = page.upto.max(after);
        t.head = page.head;
        if t.applied >= t.head {
            t.caught_up_ms = Some(now);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_token_others_can_read_is_refused_naming_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("peer.token");
        lasthop_core::secret::write(&path, b"0123456789abcdef0123456789abcdef-peers\n").unwrap();
        assert!(read_token(&path).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = read_token(&path).unwrap_err().to_string();
        assert!(
            e.contains("other users can read and write") && e.contains("chmod o-rwx"),
            "{e}"
        );
    }

    #[test]
    fn peer_flags_parse_or_say_why() {
        assert_eq!(
            "1=https://cp.eu:8081/".parse::<PeerSpec>(),
            Ok(PeerSpec {
                region: 1,
                url: "https://cp.eu:8081".into()
            })
        );
        for bad in ["1", "x=http://a", "1=ftp://a", "=http://a"] {
            assert!(bad.parse::<PeerSpec>().is_err(), "{bad}");
        }
    }
}
