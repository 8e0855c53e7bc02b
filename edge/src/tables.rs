//! Everything one request reads: the code scheme, the high-water marks, the snapshot, the
//! denylist and the overlay, plus whether an origin exists to read through to.
//!
//! A [`Tables`] is a generation. It is cheap to clone (a few `Arc`s and the high-water vector)
//! and immutable: a change (new snapshot, denylist or overlay) builds the next generation with
//! one of the `with_*` methods, and each core picks it up between requests ([`Published`]).
//! Nothing in it is locked on the request path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lasthop_core::{CodeScheme, HighWater};
use lasthop_snapshot::Snapshot;

use crate::denylist::Denylist;
use crate::domains::Domains;
use crate::overlay::Overlay;

/// Why a set of tables was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TablesError {
    /// The snapshot's codes were minted under another permutation key: every generated code in
    /// it would decode to the wrong counter, so it must never be served.
    #[error("snapshot is for key {snapshot:08x}, but this engine runs key {scheme:08x}")]
    KeyMismatch { snapshot: u32, scheme: u32 },
}

/// What a request reads. See the module docs.
#[derive(Debug, Clone)]
pub struct Tables {
    /// FF1 + base62 under this engine's key.
    pub scheme: CodeScheme,
    /// Per-region marks plus reserve: a generated code above them was never issued.
    pub high_water: HighWater,
    /// The current snapshot; `None` serves from the overlay and origin alone.
    pub snapshot: Option<Arc<Snapshot>>,
    pub denylist: Arc<Denylist>,
    pub overlay: Arc<Overlay>,
    /// The branded domains, by `Host` (empty: every request is the default domain's).
    pub domains: Arc<Domains>,
    /// An origin (the control plane) is configured: a miss becomes a read-through, not a 404.
    pub has_origin: bool,
    /// Safe mode (the feed is lost or catching up): a redirect found locally is confirmed at
    /// the origin first, and served from the local tables only when the origin cannot answer.
    pub safe_mode: bool,
}

impl Tables {
    /// Tables with no snapshot, an empty denylist and overlay, and the given marks.
    pub fn new(scheme: CodeScheme, high_water: HighWater, has_origin: bool) -> Tables {
        Tables {
            scheme,
            high_water,
            snapshot: None,
            denylist: Arc::new(Denylist::empty()),
            overlay: Arc::new(Overlay::empty()),
            domains: Arc::new(Domains::empty()),
            has_origin,
            safe_mode: false,
        }
    }

    /// Tables serving `snapshot`, with its high-water marks. Refuses a snapshot built under
    /// another key.
    pub fn from_snapshot(
        scheme: CodeScheme,
        snapshot: Arc<Snapshot>,
        has_origin: bool,
    ) -> Result<Tables, TablesError> {
        check_key(&scheme, &snapshot)?;
        let mut tables = Tables::new(scheme, snapshot.high_water().clone(), has_origin);
        tables.snapshot = Some(snapshot);
        Ok(tables)
    }

    /// The next generation with `snapshot` swapped in. Marks never go down: when the new
    /// snapshot has the same regions and reserve, each region keeps the higher of the two marks
    /// (the feed may have raised them past the snapshot); otherwise the snapshot's marks win.
    pub fn with_snapshot(&self, snapshot: Arc<Snapshot>) -> Result<Tables, TablesError> {
        check_key(&self.scheme, &snapshot)?;
        let mut high_water = snapshot.high_water().clone();
        if high_water.regions() == self.high_water.regions()
            && high_water.reserve() == self.high_water.reserve()
        {
            for (region, &mark) in (0u32..).zip(self.high_water.marks()) {
                // `region` < regions() of both, so raise cannot fail; ignoring is safe.
                let _ = high_water.raise(region, mark);
            }
        }
        Ok(Tables {
            high_water,
            snapshot: Some(snapshot),
            ..self.clone()
        })
    }

    /// The next generation with another denylist.
    #[must_use]
    pub fn with_denylist(&self, denylist: Arc<Denylist>) -> Tables {
        Tables {
            denylist,
            ..self.clone()
        }
    }

    /// The next generation with another set of branded domains.
    #[must_use]
    pub fn with_domains(&self, domains: Arc<Domains>) -> Tables {
        Tables {
            domains,
            ..self.clone()
        }
    }

    /// The next generation with another overlay.
    #[must_use]
    pub fn with_overlay(&self, overlay: Arc<Overlay>) -> Tables {
        Tables {
            overlay,
            ..self.clone()
        }
    }
}

/// The generation every core serves, and its swap.
///
/// The swap is a sequence lock in the seqlock pattern, with an `Arc` as its payload: the writer
/// (the feed's applier thread, or SIGHUP) replaces the `Arc` under a mutex and then bumps
/// `generation`; each core compares `generation` with the one it holds once per loop turn (one
/// acquire load) and, only when it moved, clones the new `Arc` with `try_lock`. If the writer
/// holds the lock at that instant the core keeps serving the generation it has and retries next
/// turn, so a reader never blocks, and since a generation is immutable and reached through one
/// pointer, no reader can see half a denylist. (The `seqlock` crate needs a `Copy` payload,
/// which a table set with its own lifetime is not; this is the same protocol with the `Arc`
/// doing the lifetime work.)
#[derive(Debug)]
pub struct Published {
    tables: Mutex<Arc<Tables>>,
    generation: AtomicU64,
}

impl Published {
    /// Publishing `tables` as generation 1.
    pub fn new(tables: Tables) -> Published {
        Published {
            tables: Mutex::new(Arc::new(tables)),
            generation: AtomicU64::new(1),
        }
    }

    /// Publishes the next generation; every core picks it up at its next turn.
    pub fn publish(&self, tables: Tables) {
        let new = Arc::new(tables);
        let old = match self.tables.lock() {
            Ok(mut t) => Some(std::mem::replace(&mut *t, new)),
            Err(_) => None,
        };
        self.generation.fetch_add(1, Ordering::Release);
        // The old generation is freed (if no core still holds it) outside the lock.
        drop(old);
    }

    /// The generation counter: bumped after every publish.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The tables now published, waiting for a writer mid-swap (not for serving cores).
    pub fn current(&self) -> Option<Arc<Tables>> {
        self.tables.lock().ok().map(|t| Arc::clone(&t))
    }

    /// A serving core's once-per-turn check: when the generation moved past `held`, takes the
    /// new tables into `tables` unless a writer is mid-swap (then it keeps what it has and looks
    /// again next turn). Never blocks. Returns whether it took a new generation.
    pub fn refresh(&self, held: &mut u64, tables: &mut Arc<Tables>) -> bool {
        let g = self.generation();
        if g == *held {
            return false;
        }
        match self.tables.try_lock() {
            Ok(t) => {
                *tables = Arc::clone(&t);
                *held = g;
                true
            }
            Err(_) => false,
        }
    }
}

fn check_key(scheme: &CodeScheme, snapshot: &Snapshot) -> Result<(), TablesError> {
    if snapshot.key_id() == scheme.key_id() {
        Ok(())
    } else {
        Err(TablesError::KeyMismatch {
            snapshot: snapshot.key_id(),
            scheme: scheme.key_id(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lasthop_core::PermutationKey;
    use lasthop_snapshot::{SnapshotMeta, SnapshotWriter};

    fn scheme(byte: u8) -> CodeScheme {
        CodeScheme::new(&PermutationKey::from_bytes(&[byte; 16]).unwrap()).unwrap()
    }

    fn snapshot(key_id: u32, mark: u64) -> Arc<Snapshot> {
        let mut hw = HighWater::new(1, 100).unwrap();
        hw.raise(0, mark).unwrap();
        let mut w = SnapshotWriter::in_memory(SnapshotMeta::new(1, key_id, hw)).unwrap();
        w.add(b"some-alias", b"https://example.com/", None).unwrap();
        let (_, bytes) = w.seal().unwrap();
        Arc::new(Snapshot::from_vec(bytes).unwrap())
    }

    #[test]
    fn refuses_another_key() {
        let s = scheme(1);
        let other = scheme(2);
        assert!(Tables::from_snapshot(s.clone(), snapshot(s.key_id(), 10), false).is_ok());
        let err =
            Tables::from_snapshot(s.clone(), snapshot(other.key_id(), 10), false).unwrap_err();
        assert_eq!(
            err,
            TablesError::KeyMismatch {
                snapshot: other.key_id(),
                scheme: s.key_id()
            }
        );
        let t = Tables::new(s.clone(), HighWater::new(1, 100).unwrap(), true);
        assert!(t.with_snapshot(snapshot(other.key_id(), 10)).is_err());
    }

    #[test]
    fn takes_and_keeps_high_water() {
        let s = scheme(1);
        let t = Tables::from_snapshot(s.clone(), snapshot(s.key_id(), 500), false).unwrap();
        assert_eq!(t.high_water.marks(), &[500]);
        assert!(t.snapshot.is_some());
        let mut raised = t.clone();
        raised.high_water.raise(0, 900).unwrap();
        let swapped = raised.with_snapshot(snapshot(s.key_id(), 600)).unwrap();
        assert_eq!(swapped.high_water.marks(), &[900], "marks never go down");
        let later = raised.with_snapshot(snapshot(s.key_id(), 1000)).unwrap();
        assert_eq!(later.high_water.marks(), &[1000]);
    }

    #[test]
    fn a_core_takes_each_published_generation_once() {
        let t = Tables::new(scheme(1), HighWater::new(1, 0).unwrap(), false);
        let p = Published::new(t.clone());
        let mut tables = p.current().unwrap();
        let mut held = p.generation();
        assert!(!p.refresh(&mut held, &mut tables), "nothing new");
        let mut next = t.clone();
        next.safe_mode = true;
        p.publish(next);
        assert!(p.refresh(&mut held, &mut tables));
        assert!(tables.safe_mode);
        assert!(!p.refresh(&mut held, &mut tables), "taken once");
        // A writer mid-swap: the core keeps what it has and takes it on a later turn.
        let guard = p.tables.lock().unwrap();
        p.generation.fetch_add(1, Ordering::Release);
        assert!(!p.refresh(&mut held, &mut tables));
        drop(guard);
        assert!(p.refresh(&mut held, &mut tables));
    }
}
