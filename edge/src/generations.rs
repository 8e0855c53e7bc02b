//! Publishing a keyed table (the denylist, the overlay) so that a generation costs what
//! changed, not the table's size.
//!
//! A published table is immutable and reaches the serving cores behind an `Arc`
//! ([`crate::tables::Published`]), so a request keeps its single hash probe and never sees half
//! a change. Building each generation by copying the previous one costs O(table) per burst of
//! changes: 1M standing denylist entries made every takedown copy 1M keys. Instead the writer
//! keeps two copies, the left-right scheme (as in `evmap`) with the `Arc`'s count standing in
//! for the readers' epoch:
//!
//! - `front`: the table it published last;
//! - `spare`: the one it published before, behind `front` by the changes of one publish (`lag`).
//!
//! The next generation is the spare brought up to date in place (`lag`, then the new changes)
//! once no core holds it any more (`Arc::get_mut`; every core takes the newest generation at its
//! next loop turn, and an idle core's turn comes at least every tick, 10 ms); the old front then
//! becomes the spare. If a core still holds the spare, the front is copied instead (the old
//! cost) and [`PublishStats::copied`] counts it. The price is memory: two copies of each table
//! instead of one (plus whatever generation a slow core still holds).

use std::sync::Arc;

/// A table that can be changed one key at a time.
pub trait Patch: Clone + std::fmt::Debug {
    /// What a key maps to.
    type Value: Clone + std::fmt::Debug;
    /// Sets `key` to `value`, or removes it when `value` is `None`.
    fn patch(&mut self, key: &[u8], value: Option<&Self::Value>);
}

/// One key's new value (`None`: removed).
pub type Change<T> = (Box<[u8]>, Option<<T as Patch>::Value>);

/// How the generations of one table were made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PublishStats {
    /// The spare brought up to date in place: cost proportional to the changes.
    pub in_place: u64,
    /// The front copied, because a core still held the spare: cost proportional to the table.
    pub copied: u64,
    /// Built whole from the writer's own state (a new standing list, a rewind).
    pub rebuilt: u64,
}

/// A table's published generation and the spare it reuses. See the module docs.
#[derive(Debug)]
pub struct Generations<T: Patch> {
    front: Arc<T>,
    spare: Option<Arc<T>>,
    /// The changes `front` has and `spare` lacks.
    lag: Vec<Change<T>>,
    stats: PublishStats,
}

impl<T: Patch> Generations<T> {
    /// Starts from `table` (its spare is a copy, so the first change is made in place).
    pub fn new(table: T) -> Generations<T> {
        Generations {
            spare: Some(Arc::new(table.clone())),
            front: Arc::new(table),
            lag: Vec::new(),
            stats: PublishStats::default(),
        }
    }

    /// The generation published last.
    pub fn front(&self) -> &Arc<T> {
        &self.front
    }

    /// How generations were made so far.
    pub fn stats(&self) -> PublishStats {
        self.stats
    }

    /// Publishes `table`, built whole: O(table), twice (the spare is a copy of it).
    pub fn replace(&mut self, table: T) {
        self.spare = Some(Arc::new(table.clone()));
        self.front = Arc::new(table);
        self.lag.clear();
        self.stats.rebuilt += 1;
    }

    /// Publishes the front with `changes` applied (in order; a later change to a key wins).
    /// Nothing changes, and nothing is counted, when `changes` is empty.
    pub fn publish(&mut self, changes: Vec<Change<T>>) {
        if changes.is_empty() {
            return;
        }
        let lag = &self.lag;
        let reused = self.spare.take().and_then(|mut spare| {
            let table = Arc::get_mut(&mut spare)?;
            for (key, value) in lag.iter().chain(&changes) {
                table.patch(key, value.as_ref());
            }
            Some(spare)
        });
        let next = match reused {
            Some(next) => {
                self.stats.in_place += 1;
                next
            }
            None => {
                let mut table = T::clone(&self.front);
                for (key, value) in &changes {
                    table.patch(key, value.as_ref());
                }
                self.stats.copied += 1;
                Arc::new(table)
            }
        };
        self.spare = Some(std::mem::replace(&mut self.front, next));
        self.lag = changes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[derive(Debug, Clone, Default, PartialEq)]
    struct Map(BTreeMap<Vec<u8>, u32>);

    impl Patch for Map {
        type Value = u32;
        fn patch(&mut self, key: &[u8], value: Option<&u32>) {
            match value {
                Some(v) => self.0.insert(key.to_vec(), *v),
                None => self.0.remove(key),
            };
        }
    }

    fn set(key: &str, v: Option<u32>) -> Change<Map> {
        (key.as_bytes().into(), v)
    }

    fn map(entries: &[(&str, u32)]) -> Map {
        Map(entries
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), *v))
            .collect())
    }

    #[test]
    fn reuses_the_spare_once_no_reader_holds_it() {
        let mut g = Generations::new(map(&[("a", 1)]));
        g.publish(vec![set("b", Some(2))]);
        assert_eq!(**g.front(), map(&[("a", 1), ("b", 2)]));
        g.publish(vec![set("a", None), set("c", Some(3))]);
        assert_eq!(**g.front(), map(&[("b", 2), ("c", 3)]));
        // The spare trails by the last publish; bringing it up to date replays that too.
        g.publish(vec![set("b", Some(20))]);
        assert_eq!(**g.front(), map(&[("b", 20), ("c", 3)]));
        assert_eq!(
            g.stats(),
            PublishStats {
                in_place: 3,
                copied: 0,
                rebuilt: 0
            }
        );
        g.publish(Vec::new());
        assert_eq!(g.stats().in_place, 3, "no change, no generation");
    }

    #[test]
    fn copies_when_a_reader_still_holds_the_spare() {
        let mut g = Generations::new(map(&[]));
        let first = Arc::clone(g.front());
        g.publish(vec![set("a", Some(1))]);
        // `first` is now the spare, and a reader holds it: it must not change under them.
        g.publish(vec![set("b", Some(2))]);
        assert_eq!(*first, map(&[]), "a held generation never changes");
        assert_eq!(**g.front(), map(&[("a", 1), ("b", 2)]));
        assert_eq!(g.stats().copied, 1);
        drop(first);
        g.publish(vec![set("c", Some(3))]);
        assert_eq!(**g.front(), map(&[("a", 1), ("b", 2), ("c", 3)]));
        assert_eq!(g.stats().in_place, 2);
        g.publish(vec![set("a", None)]);
        assert_eq!(**g.front(), map(&[("b", 2), ("c", 3)]));
        assert_eq!(g.stats().in_place, 3);
    }

    #[test]
    fn replace_starts_over() {
        let mut g = Generations::new(map(&[("a", 1)]));
        g.publish(vec![set("b", Some(2))]);
        g.replace(map(&[("z", 9)]));
        assert_eq!(**g.front(), map(&[("z", 9)]));
        g.publish(vec![set("y", Some(8))]);
        assert_eq!(**g.front(), map(&[("y", 8), ("z", 9)]));
        g.publish(vec![set("x", Some(7))]);
        assert_eq!(**g.front(), map(&[("x", 7), ("y", 8), ("z", 9)]));
        assert_eq!(
            g.stats(),
            PublishStats {
                in_place: 3,
                copied: 0,
                rebuilt: 1
            }
        );
    }
}
