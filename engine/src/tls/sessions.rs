//! The process-wide store of resumable TLS sessions (TLS 1.3 stateful tickets, which rustls
//! requires for 0-RTT and takes single-use as its replay guard, and TLS 1.2 session ids).
//!
//! rustls' own `ServerSessionMemoryCache` keeps its eviction order in a `VecDeque` and removes
//! a taken session by scanning it (`LimitedCache::remove`: "O(N) search, followed by O(N)
//! removal"), a `memcmp` of every key held. Under TLS 1.3 resumptions with the cache full
//! (16,384 sessions) that scan was 16.5 % of the serving core's samples (`MODE=handshake
//! PERF_RECORD=1 perf/bypass.sh`, `perf report`: `__memcmp_evex_movbe`). Here the same
//! bounded store is an LRU list (the `lru` crate: a hash map over a linked list), so putting,
//! getting and taking a session are each O(1); when full, the least recently used session goes.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;
use rustls::server::StoresServerSessions;

/// At most `capacity` sessions, the least recently used evicted first; shared by every core.
pub struct SessionStore {
    cache: Mutex<LruCache<Vec<u8>, Vec<u8>>>,
}

impl std::fmt::Debug for SessionStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.cache.lock().map_or(0, |c| c.len());
        f.debug_struct("SessionStore").field("held", &held).finish()
    }
}

impl SessionStore {
    /// A store holding at most `capacity` sessions (at least one).
    pub fn new(capacity: usize) -> SessionStore {
        SessionStore {
            cache: Mutex::new(LruCache::new(
                NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN),
            )),
        }
    }

    /// Sessions held now.
    pub fn len(&self) -> usize {
        self.cache.lock().map_or(0, |c| c.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl StoresServerSessions for SessionStore {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        // A poisoned lock (a panic while holding it) refuses to store: the client does a full
        // handshake next time, nothing worse.
        self.cache
            .lock()
            .map(|mut c| {
                c.put(key, value);
            })
            .is_ok()
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.cache.lock().ok()?.get(key).cloned()
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.cache.lock().ok()?.pop(key)
    }

    fn can_cache(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: u32) -> Vec<u8> {
        let mut k = vec![0u8; 32];
        k[..4].copy_from_slice(&i.to_le_bytes());
        k
    }

    #[test]
    fn a_taken_session_is_gone_and_a_got_one_stays() {
        let s = SessionStore::new(4);
        assert!(s.put(key(1), b"one".to_vec()));
        assert!(s.put(key(2), b"two".to_vec()));
        assert_eq!(s.get(&key(1)).as_deref(), Some(&b"one"[..]));
        assert_eq!(s.get(&key(1)).as_deref(), Some(&b"one"[..]));
        assert_eq!(s.take(&key(2)).as_deref(), Some(&b"two"[..]));
        assert_eq!(s.take(&key(2)), None, "single use");
        assert_eq!(s.get(&key(2)), None);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn the_least_recently_used_session_is_evicted_at_capacity() {
        let s = SessionStore::new(3);
        for i in 0..3 {
            s.put(key(i), vec![i as u8]);
        }
        // Using 0 makes 1 the oldest.
        assert!(s.get(&key(0)).is_some());
        s.put(key(3), vec![3]);
        assert_eq!(s.len(), 3);
        assert!(s.get(&key(1)).is_none(), "evicted");
        for i in [0, 2, 3] {
            assert!(s.get(&key(i)).is_some(), "{i} kept");
        }
    }

    #[test]
    fn takes_keep_it_bounded_under_churn() {
        // Resumptions in steady state: each handshake takes the ticket it came with and puts
        // a new one; the store never exceeds its capacity and never loses the newest.
        let s = SessionStore::new(100);
        for i in 0..10_000u32 {
            s.put(key(i), vec![1]);
            if i >= 50 {
                assert!(
                    s.take(&key(i - 50)).is_some(),
                    "ticket {} still held",
                    i - 50
                );
            }
        }
        assert_eq!(s.len(), 50);
        assert!(
            SessionStore::new(0).put(key(1), vec![1]),
            "a zero capacity holds one"
        );
    }
}
