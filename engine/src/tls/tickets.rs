//! Session tickets whose keys derive from a master secret in a file, so every process holding
//! the file issues and accepts the same tickets (see [`crate::tls`]).

use std::path::Path;
use std::sync::{PoisonError, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use rustls::server::ProducesTickets;

/// Why the ticket key file cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("ticket key file {}: {why}", path.display())]
pub struct TicketKeyError {
    pub path: std::path::PathBuf,
    pub why: String,
}

/// Session-ticket keys derived from a master secret in a file: see the module docs.
pub struct FileTicketer {
    master: hkdf::Prk,
    lifetime: u64,
    rng: SystemRandom,
    /// The keys derived so far, by period, oldest first: at most [`KEPT`]. Deriving one (HKDF,
    /// then AES-256's key expansion) cost as much again as sealing the ticket, for every
    /// ticket issued and every one presented.
    keys: RwLock<Vec<(u64, LessSafeKey)>>,
}

/// Periods whose keys are kept: the one tickets are sealed in, the previous one (still
/// accepted), and the next, which one core may reach while another is still in this one.
const KEPT: usize = 3;

impl std::fmt::Debug for FileTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTicketer")
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

/// Bytes before the sealed ticket: the period it was sealed in, then the nonce.
const TICKET_HEADER: usize = 8 + NONCE_LEN;

impl FileTicketer {
    /// Reads the master (at least 32 bytes; hex or raw) from `path`.
    pub fn load(path: &Path, lifetime: Duration) -> Result<FileTicketer, TicketKeyError> {
        let err = |why: String| TicketKeyError {
            path: path.to_path_buf(),
            why,
        };
        let raw = lasthop_core::secret::read(path).map_err(|e| match e {
            lasthop_core::secret::SecretError::Io { source, .. } => err(source.to_string()),
            loose => err(loose.to_string()),
        })?;
        let text = String::from_utf8_lossy(&raw);
        let bytes = hex::decode(text.trim()).unwrap_or(raw);
        if bytes.len() < 32 {
            return Err(err(format!(
                "{} bytes; need at least 32 random bytes (e.g. `openssl rand -hex 32`)",
                bytes.len()
            )));
        }
        Ok(FileTicketer::new(&bytes, lifetime))
    }

    /// A ticketer over `master` with keys rotating every `lifetime`.
    pub fn new(master: &[u8], lifetime: Duration) -> FileTicketer {
        FileTicketer {
            master: hkdf::Salt::new(hkdf::HKDF_SHA256, b"lasthop ticket keys").extract(master),
            lifetime: lifetime.as_secs().max(60),
            rng: SystemRandom::new(),
            keys: RwLock::new(Vec::with_capacity(KEPT + 1)),
        }
    }

    fn period_now(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        now / self.lifetime
    }

    /// Derives `period`'s key from the master.
    fn derive(&self, period: u64) -> Option<LessSafeKey> {
        let info = period.to_be_bytes();
        let info = [&info[..]];
        let okm = self.master.expand(&info, &AES_256_GCM).ok()?;
        let mut key = [0u8; 32];
        okm.fill(&mut key).ok()?;
        Some(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).ok()?))
    }

    /// Runs `f` with `period`'s key, derived once and kept.
    fn with_key<T>(&self, period: u64, f: impl FnOnce(&LessSafeKey) -> Option<T>) -> Option<T> {
        {
            let keys = self.keys.read().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, key)) = keys.iter().find(|(p, _)| *p == period) {
                return f(key);
            }
        }
        let derived = self.derive(period)?;
        let mut keys = self.keys.write().unwrap_or_else(PoisonError::into_inner);
        if !keys.iter().any(|(p, _)| *p == period) {
            keys.push((period, derived));
            keys.sort_unstable_by_key(|(p, _)| *p);
            if keys.len() > KEPT {
                keys.remove(0);
            }
        }
        // Gone at once only if older than every kept period, which neither side asks for.
        let (_, key) = keys.iter().find(|(p, _)| *p == period)?;
        f(key)
    }

    fn seal(&self, period: u64, plain: &[u8]) -> Option<Vec<u8>> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(TICKET_HEADER + plain.len() + 16);
        out.extend_from_slice(&period.to_be_bytes());
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        self.with_key(period, |key| {
            key.seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&out[..8]),
                &mut body,
            )
            .ok()
        })?;
        out.extend_from_slice(&body);
        Some(out)
    }

    fn open(&self, now_period: u64, cipher: &[u8]) -> Option<Vec<u8>> {
        let period = u64::from_be_bytes(cipher.get(..8)?.try_into().ok()?);
        // This period's key or the previous one's; anything else has been rotated out.
        if period != now_period && period.checked_add(1) != Some(now_period) {
            return None;
        }
        let nonce: [u8; NONCE_LEN] = cipher.get(8..TICKET_HEADER)?.try_into().ok()?;
        let mut body = cipher.get(TICKET_HEADER..)?.to_vec();
        let len = self.with_key(period, |key| {
            key.open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&cipher[..8]),
                &mut body,
            )
            .ok()
            .map(|plain| plain.len())
        })?;
        body.truncate(len);
        Some(body)
    }
}

impl ProducesTickets for FileTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        u32::try_from(self.lifetime).unwrap_or(u32::MAX)
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        self.seal(self.period_now(), plain)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.open(self.period_now(), cipher)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ticket_key_file_others_can_read_is_refused_naming_it() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tickets.key");
        lasthop_core::secret::write(&path, "42".repeat(32).as_bytes()).unwrap();
        assert!(FileTicketer::load(&path, Duration::from_secs(3600)).is_ok());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o604)).unwrap();
        let e = FileTicketer::load(&path, Duration::from_secs(3600))
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("other users can read") && e.contains("chmod o-rwx"),
            "{e}"
        );
    }

    #[test]
    fn file_tickets_are_shared_between_instances_and_rotate_out() {
        let a = FileTicketer::new(&[7u8; 32], Duration::from_secs(3600));
        let b = FileTicketer::new(&[7u8; 32], Duration::from_secs(3600));
        let other = FileTicketer::new(&[8u8; 32], Duration::from_secs(3600));
        let now = a.period_now();
        let t = a.seal(now, b"session state").unwrap();
        assert_eq!(
            b.open(now, &t).unwrap(),
            b"session state",
            "another process"
        );
        assert_eq!(
            b.open(now + 1, &t).unwrap(),
            b"session state",
            "previous period"
        );
        assert!(b.open(now + 2, &t).is_none(), "rotated out");
        assert!(other.open(now, &t).is_none(), "another master");
        let mut tampered = t.clone();
        let last = tampered.len() - 1;
        tampered[last] ^= 1;
        assert!(a.open(now, &tampered).is_none());
        assert!(a.open(now, &t[..10]).is_none());
        assert!(a.open(now, &[]).is_none());
        // The period is authenticated: moving a ticket to another period fails.
        let mut moved = t.clone();
        moved[..8].copy_from_slice(&(now + 1).to_be_bytes());
        assert!(a.open(now + 1, &moved).is_none());
    }

    #[test]
    fn keys_are_kept_for_the_periods_in_use_and_no_more() {
        let a = FileTicketer::new(&[7u8; 32], Duration::from_secs(3600));
        let fresh = FileTicketer::new(&[7u8; 32], Duration::from_secs(3600));
        let now = a.period_now();
        let mut last = None;
        for period in now..now + 6 {
            let t = a.seal(period, b"s").unwrap();
            // Sealed with the kept key, opened by a ticketer that derives it anew, and back.
            assert_eq!(fresh.open(period, &t).unwrap(), b"s");
            if let Some(previous) = last.replace(t) {
                assert_eq!(a.open(period, &previous).unwrap(), b"s", "previous period");
            }
            let keys = a.keys.read().unwrap();
            assert!(keys.len() <= KEPT, "{} keys", keys.len());
            assert!(keys.iter().any(|(p, _)| *p == period));
        }
    }

    #[test]
    fn short_ticket_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        lasthop_core::secret::write(&p, b"abcd").unwrap();
        assert!(FileTicketer::load(&p, Duration::from_secs(60)).is_err());
        lasthop_core::secret::write(&p, hex::encode([1u8; 32]).as_bytes()).unwrap();
        assert!(FileTicketer::load(&p, Duration::from_secs(60)).is_ok());
    }
}
