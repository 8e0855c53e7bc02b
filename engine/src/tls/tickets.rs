//! Session tickets whose keys derive from a master secret in a file, so every process holding
//! the file issues and accepts the same tickets (see [`crate::tls`]).

use std::path::Path;
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
}

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
        let raw = std::fs::read(path).map_err(|e| err(e.to_string()))?;
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
        }
    }

    fn period_now(&self) -> u64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        now / self.lifetime
    }

    fn key(&self, period: u64) -> Option<LessSafeKey> {
        let info = period.to_be_bytes();
        let info = [&info[..]];
        let okm = self.master.expand(&info, &AES_256_GCM).ok()?;
        let mut key = [0u8; 32];
        okm.fill(&mut key).ok()?;
        Some(LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &key).ok()?))
    }

    fn seal(&self, period: u64, plain: &[u8]) -> Option<Vec<u8>> {
        let key = self.key(period)?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut out = Vec::with_capacity(TICKET_HEADER + plain.len() + 16);
        out.extend_from_slice(&period.to_be_bytes());
        out.extend_from_slice(&nonce);
        let mut body = plain.to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&out[..8]),
            &mut body,
        )
        .ok()?;
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
        let key = self.key(period)?;
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&cipher[..8]),
                &mut body,
            )
            .ok()?;
        Some(plain.to_vec())
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
    fn short_ticket_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        std::fs::write(&p, "abcd").unwrap();
        assert!(FileTicketer::load(&p, Duration::from_secs(60)).is_err());
        std::fs::write(&p, hex::encode([1u8; 32])).unwrap();
        assert!(FileTicketer::load(&p, Duration::from_secs(60)).is_ok());
    }
}
