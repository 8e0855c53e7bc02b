//! The branded domains at this engine (their namespaces and settings, for the request path's
//! `Host` routing: `lasthop_edge::domains`) and their certificates: fetched from the control plane when a
//! `certificates` frame announces a generation the engine does not hold
//! (`GET /edge/v1/certificates`), each checked again here (`lasthop_tls::certificate::check`:
//! key, name, validity, chain) before it is served, and kept on disk encrypted so that a
//! restart serves the last good set at once, before any control plane answers.
//!
//! AT REST: `DATA_DIR/certificates.enc` holds the control plane's answer (its JSON, keys
//! included) sealed with AES-256-GCM under `DATA_DIR/certificates.key` (32 random bytes, hex; a
//! secret file, 0600, made on first use, refused when others can read it): `LHCERTS1` ‖ a
//! random 96-bit nonce ‖ ciphertext and tag, written under a temporary name, synced and
//! renamed. A file that does not open (another key, torn, tampered with) is ignored with a
//! warning, and the next fetch replaces it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use lasthop_core::feed::CERTIFICATES_PATH;
use lasthop_edge::domains::{AcmeAnswer, Domain, Domains};
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use rustls::sign::CertifiedKey;
use serde::Deserialize;

use super::FeedConfig;

/// The sealed file's first bytes.
const MAGIC: &[u8; 8] = b"LHCERTS1";
/// Additional data every seal covers.
const AAD: &[u8] = b"lasthop certificates v1";
/// Longest answer taken: 10,000 domains of a few KiB each, with room.
pub const MAX_BODY: u64 = 256 << 20;

/// The control plane's answer.
#[derive(Debug, Deserialize)]
struct Answer {
    generation: u64,
    /// Every branded domain (absent in answers from before namespaces: none).
    #[serde(default)]
    domains: Vec<DomainEntry>,
    certificates: Vec<Entry>,
    /// ACME challenge answers to publish while certificates are ordered.
    #[serde(default)]
    challenges: Vec<Challenge>,
    /// The default domain's lazy fallback to an old shortener (issue 44).
    #[serde(default)]
    default_legacy_fallback: bool,
}

/// An ACME challenge answer (core/FEED.md): HTTP-01's key authorization for a token, or
/// TLS-ALPN-01's certificate and key. Its `Debug` leaves the key out.
#[derive(Deserialize)]
struct Challenge {
    domain: String,
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    token: String,
    #[serde(default)]
    key_authorization: String,
    #[serde(default)]
    certificate: Option<String>,
    #[serde(default)]
    key: Option<String>,
}

impl std::fmt::Debug for Challenge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Challenge")
            .field("domain", &self.domain)
            .field("type", &self.kind)
            .finish_non_exhaustive()
    }
}

/// An HTTP-01 token and key authorization are base64url and a `.` (RFC 8555 §8.1, §8.3):
/// nothing else is published, so nothing else reaches a response body.
fn acme_text(s: &str) -> bool {
    (1..=256).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// One branded domain as the request path applies it.
#[derive(Debug, Deserialize)]
struct DomainEntry {
    domain: String,
    #[serde(default)]
    suspended: bool,
    #[serde(default)]
    root_redirect: Option<String>,
    #[serde(default)]
    not_found_redirect: Option<String>,
    #[serde(default)]
    hsts: Option<Hsts>,
    #[serde(default)]
    legacy_fallback: bool,
}

#[derive(Debug, Deserialize)]
struct Hsts {
    max_age: u32,
    #[serde(default)]
    include_subdomains: bool,
    #[serde(default)]
    preload: bool,
}

impl DomainEntry {
    fn edge(self, acme_http: Vec<AcmeAnswer>) -> Domain {
        // Only a servable URL may reach `Location` (the request path checks again).
        let servable = |u: Option<String>| {
            u.filter(|u| lasthop_core::is_servable(u.as_bytes()))
                .map(|u| u.into_bytes().into_boxed_slice())
        };
        Domain {
            name: self
                .domain
                .to_ascii_lowercase()
                .into_bytes()
                .into_boxed_slice(),
            suspended: self.suspended,
            root_redirect: servable(self.root_redirect),
            not_found_redirect: servable(self.not_found_redirect),
            hsts: self
                .hsts
                .map(|h| Domain::hsts_line(h.max_age, h.include_subdomains, h.preload)),
            acme_http: acme_http.into_boxed_slice(),
            legacy_fallback: self.legacy_fallback,
        }
    }
}

/// One domain's certificate; its `Debug` leaves the key out.
#[derive(Deserialize)]
struct Entry {
    domain: String,
    chain: String,
    key: String,
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

/// A set ready to serve, from one answer.
#[derive(Debug)]
pub struct Set {
    pub generation: u64,
    /// Every branded domain, for the request path.
    pub domains: Domains,
    pub certs: HashMap<String, Arc<CertifiedKey>>,
    /// TLS-ALPN-01 challenge certificates, by domain (served for `acme-tls/1` only).
    pub acme_certs: HashMap<String, Arc<CertifiedKey>>,
    /// The nearest `not_after` of those served (Unix ms).
    pub nearest_expiry_ms: Option<i64>,
    /// Domains refused here, with why.
    pub refused: Vec<(String, String)>,
}

/// Reads and checks an answer's certificates at `now_ms`.
pub fn parse(body: &[u8], now_ms: i64) -> Result<Set, String> {
    let answer: Answer =
        serde_json::from_slice(body).map_err(|e| format!("not a certificates answer: {e}"))?;
    let mut acme_http: HashMap<String, Vec<AcmeAnswer>> = HashMap::new();
    let mut acme_certs = HashMap::new();
    let mut refused = Vec::new();
    for c in answer.challenges {
        let domain = c.domain.to_ascii_lowercase();
        match (c.kind.as_str(), c.certificate, c.key) {
            ("http-01", _, _) if acme_text(&c.token) && acme_text(&c.key_authorization) => {
                acme_http.entry(domain).or_default().push((
                    c.token.into_bytes().into_boxed_slice(),
                    c.key_authorization.into_bytes().into_boxed_slice(),
                ));
            }
            ("tls-alpn-01", Some(cert), Some(key)) => {
                match lasthop_tls::certificate::challenge_key(&cert, &key) {
                    Ok(k) => {
                        acme_certs.insert(domain, Arc::new(k));
                    }
                    Err(e) => refused.push((domain, format!("ACME challenge: {e}"))),
                }
            }
            (kind, _, _) => refused.push((domain, format!("ACME challenge {kind} not served"))),
        }
    }
    let domains = answer.domains.into_iter().map(|d| {
        let http = acme_http
            .remove(&d.domain.to_ascii_lowercase())
            .unwrap_or_default();
        d.edge(http)
    });
    let mut set = Set {
        generation: answer.generation,
        domains: Domains::new(domains).with_default_legacy_fallback(answer.default_legacy_fallback),
        certs: HashMap::with_capacity(answer.certificates.len()),
        acme_certs,
        nearest_expiry_ms: None,
        refused,
    };
    for e in answer.certificates {
        let domain = e.domain.to_ascii_lowercase();
        match lasthop_tls::certificate::check(&e.chain, &e.key, &domain, now_ms) {
            Ok(checked) => {
                set.nearest_expiry_ms = Some(
                    set.nearest_expiry_ms
                        .map_or(checked.not_after_ms, |n| n.min(checked.not_after_ms)),
                );
                set.certs.insert(domain, Arc::new(checked.certified));
            }
            Err(err) => set.refused.push((domain, err.to_string())),
        }
    }
    Ok(set)
}

/// What a fetch got.
#[derive(Debug)]
pub enum Fetched {
    /// The engine's generation is current (304).
    Current,
    /// A new answer's bytes.
    Body(Vec<u8>),
}

/// Asks the control planes in turn (from `from`) for the certificates past `held`.
/// An engine that serves no TLS asks for the domains alone (`keys=0`).
pub fn fetch(cfg: &FeedConfig, from: usize, held: Option<u64>) -> Result<Fetched, String> {
    let agent = cfg.transfer_agent();
    let mut path = match held {
        Some(g) => format!("{CERTIFICATES_PATH}?generation={g}"),
        None => format!("{CERTIFICATES_PATH}?"),
    };
    if cfg.certificates.is_none() {
        path.push_str("&keys=0");
    }
    let mut failures = Vec::new();
    for control in cfg.control.order(from) {
        match cfg.get(&agent, control, &path).call() {
            Ok(resp) if resp.status() == 304 => return Ok(Fetched::Current),
            Ok(resp) => {
                let mut body = Vec::new();
                let read = std::io::Read::read_to_end(
                    &mut std::io::Read::take(resp.into_reader(), MAX_BODY + 1),
                    &mut body,
                );
                match read {
                    Ok(_) if body.len() as u64 > MAX_BODY => {
                        failures.push(format!("{}: answer too large", cfg.control.url(control)));
                    }
                    Ok(_) => return Ok(Fetched::Body(body)),
                    Err(e) => failures.push(format!("{}: {e}", cfg.control.url(control))),
                }
            }
            Err(e) => failures.push(format!("{}: {e}", cfg.control.url(control))),
        }
    }
    Err(failures.join("; "))
}

/// `DATA_DIR/certificates.key` and `DATA_DIR/certificates.enc`.
#[derive(Debug, Clone)]
pub struct AtRest {
    key_path: PathBuf,
    file: PathBuf,
}

impl AtRest {
    pub fn new(data_dir: &Path) -> AtRest {
        AtRest {
            key_path: data_dir.join("certificates.key"),
            file: data_dir.join("certificates.enc"),
        }
    }

    /// The sealing key: read, or made (a secret file) when there is none.
    fn key(&self) -> Result<LessSafeKey, String> {
        let hex_text = match std::fs::metadata(&self.key_path) {
            Ok(_) => lasthop_core::secret::read(&self.key_path).map_err(|e| e.to_string())?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut raw = [0u8; 32];
                getrandom::getrandom(&mut raw).map_err(|e| e.to_string())?;
                let text = hex::encode(raw);
                if let Some(dir) = self.key_path.parent() {
                    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
                }
                lasthop_core::secret::write(&self.key_path, text.as_bytes())
                    .map_err(|e| format!("{}: {e}", self.key_path.display()))?;
                text.into_bytes()
            }
            Err(e) => return Err(format!("{}: {e}", self.key_path.display())),
        };
        let raw = hex::decode(String::from_utf8_lossy(&hex_text).trim())
            .ok()
            .filter(|k| k.len() == 32)
            .ok_or_else(|| {
                format!(
                    "{}: not 32 bytes in hex (delete it and the engine makes another)",
                    self.key_path.display()
                )
            })?;
        let unbound = UnboundKey::new(&AES_256_GCM, &raw).map_err(|e| e.to_string())?;
        Ok(LessSafeKey::new(unbound))
    }

    /// Seals `body` into the file, replacing it.
    pub fn save(&self, body: &[u8]) -> Result<(), String> {
        let key = self.key()?;
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::getrandom(&mut nonce).map_err(|e| e.to_string())?;
        let mut sealed = body.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(AAD),
            &mut sealed,
        )
        .map_err(|_| "sealing the certificates failed".to_string())?;
        let mut out = Vec::with_capacity(MAGIC.len() + NONCE_LEN + sealed.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        lasthop_core::secret::write(&self.file, &out)
            .map_err(|e| format!("{}: {e}", self.file.display()))
    }

    /// The body last saved, if there is a file and it opens.
    pub fn load(&self) -> Result<Option<Vec<u8>>, String> {
        let bytes = match std::fs::read(&self.file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("{}: {e}", self.file.display())),
        };
        let key = self.key()?;
        let rest = bytes
            .strip_prefix(MAGIC.as_slice())
            .filter(|r| r.len() >= NONCE_LEN)
            .ok_or_else(|| format!("{}: not a sealed certificates file", self.file.display()))?;
        let (nonce, sealed) = rest.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|e| e.to_string())?;
        let mut sealed = sealed.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(AAD), &mut sealed)
            .map_err(|_| {
                format!(
                    "{}: does not open under {} (another key, or damaged)",
                    self.file.display(),
                    self.key_path.display()
                )
            })?;
        Ok(Some(plain.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_and_opened_only_with_its_key() {
        let dir = tempfile::tempdir().unwrap();
        let at = AtRest::new(dir.path());
        assert_eq!(at.load().unwrap(), None);
        let body = br#"{"generation":3,"certificates":[]}"#;
        at.save(body).unwrap();
        assert_eq!(at.load().unwrap().as_deref(), Some(&body[..]));
        // Nothing of the body in clear, the key file is a secret file.
        let raw = std::fs::read(dir.path().join("certificates.enc")).unwrap();
        assert!(!raw.windows(10).any(|w| w == b"generation"));
        use std::os::unix::fs::PermissionsExt;
        for f in ["certificates.enc", "certificates.key"] {
            let mode = std::fs::metadata(dir.path().join(f))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o077, 0, "{f}: {mode:o}");
        }
        // A flipped byte, or another key: refused, never garbage.
        let mut bad = raw.clone();
        let last = bad.len() - 1;
        bad[last] ^= 1;
        std::fs::write(dir.path().join("certificates.enc"), &bad).unwrap();
        assert!(at.load().is_err());
        std::fs::write(dir.path().join("certificates.enc"), &raw).unwrap();
        assert!(at.load().is_ok());
        std::fs::remove_file(dir.path().join("certificates.key")).unwrap();
        assert!(at.load().unwrap_err().contains("does not open"));
    }

    #[test]
    fn acme_http_answers_reach_their_domain_and_nothing_else_is_published() {
        let set = parse(
            br#"{"generation":9,"domains":[{"domain":"Go.Test"},{"domain":"two.test"}],"certificates":[],
                "challenges":[
                  {"domain":"go.test","type":"http-01","token":"tok_EN-1","key_authorization":"tok_EN-1.thumb"},
                  {"domain":"two.test","type":"http-01","token":"bad token","key_authorization":"x"},
                  {"domain":"two.test","type":"http-01","token":"t","key_authorization":"<script>"},
                  {"domain":"two.test","type":"tls-alpn-01","token":"t","key_authorization":"t.k","certificate":"x","key":"y"},
                  {"domain":"two.test","type":"dns-01","token":"t","key_authorization":"t.k"}
                ]}"#,
            0,
        )
        .unwrap();
        let go = set.domains.find(b"go.test").unwrap();
        assert_eq!(go.acme_answer(b"tok_EN-1"), Some(&b"tok_EN-1.thumb"[..]));
        assert_eq!(go.acme_answer(b"other"), None);
        let two = set.domains.find(b"two.test").unwrap();
        assert!(two.acme_http.is_empty());
        assert!(set.acme_certs.is_empty());
        assert_eq!(set.refused.len(), 4, "{:?}", set.refused);
    }

    #[test]
    fn answers_that_are_not_answers_are_refused() {
        assert!(parse(b"", 0).is_err());
        assert!(parse(b"{\"generation\":1}", 0).is_err());
        let set = parse(
            br#"{"generation":7,"certificates":[{"domain":"go.test","revision":1,"not_after_ms":0,"chain":"x","key":"y"}]}"#,
            0,
        )
        .unwrap();
        assert_eq!(set.generation, 7);
        assert!(set.certs.is_empty());
        assert_eq!(set.refused.len(), 1);
    }
}
