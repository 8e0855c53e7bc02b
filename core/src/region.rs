//! Per-region counter ranges and the high-water-mark check.
//!
//! Region `r` of `R` owns counters `[r·S/R, (r+1)·S/R)` with `S = 62^7`. Writers lease blocks
//! from their region's durable sequence, so two writers never mint the same counter. An edge
//! decrypts a code back to `n` and answers 404 by arithmetic when `n` lies at or above its
//! region's published mark plus a reserve: the reserve covers blocks leased after the mark was
//! published, so a stale mark can only let extra scanners through, never reject a real link.

use crate::code::CODE_SPACE;

/// Default reserve above a published mark (at least any block a writer may hold).
pub const DEFAULT_RESERVE: u64 = 1_000_000;

/// Bad region parameters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegionError {
    #[error("region {region} is not below the region count {regions}")]
    OutOfRange { region: u32, regions: u32 },
    #[error("the region count must be at least 1")]
    NoRegions,
}

/// The counter range owned by `region` of `regions`.
pub fn region_range(region: u32, regions: u32) -> Result<std::ops::Range<u64>, RegionError> {
    if regions == 0 {
        return Err(RegionError::NoRegions);
    }
    if region >= regions {
        return Err(RegionError::OutOfRange { region, regions });
    }
    let bound = |r: u32| (u128::from(r) * u128::from(CODE_SPACE) / u128::from(regions)) as u64;
    Ok(bound(region)..bound(region + 1))
}

/// The region of `regions` whose range holds counter `n` (the inverse of [`region_range`]);
/// `None` for a counter outside the code space or no regions.
pub fn region_of(n: u64, regions: u32) -> Option<u32> {
    if regions == 0 || n >= CODE_SPACE {
        return None;
    }
    let r = (u128::from(n) * u128::from(regions) / u128::from(CODE_SPACE)) as u32;
    // The ranges' bounds round down: step to the one that holds n.
    (r.saturating_sub(1)..regions).find(|&r| region_range(r, regions).is_ok_and(|g| g.contains(&n)))
}

/// Published high-water marks of every region, plus the reserve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HighWater {
    regions: u32,
    /// First counter of each region, ascending.
    starts: Vec<u64>,
    /// Absolute counter value per region: every issued counter of that region is below it.
    marks: Vec<u64>,
    reserve: u64,
    /// Counters added above one region's mark + reserve (a peer region out of touch, see
    /// [`HighWater::widened_region`]); zero for every region unless widened.
    extra: Vec<u64>,
    /// Per region, mark + reserve + extra: the first counter that cannot have been issued
    /// (kept with every change above, so the miss path reads one number).
    limits: Vec<u64>,
}

impl HighWater {
    /// Marks for `regions` regions, each starting at its region's first counter (nothing issued).
    pub fn new(regions: u32, reserve: u64) -> Result<Self, RegionError> {
        let starts = (0..regions)
            .map(|r| region_range(r, regions).map(|range| range.start))
            .collect::<Result<Vec<_>, _>>()?;
        if starts.is_empty() {
            return Err(RegionError::NoRegions);
        }
        let mut hw = HighWater {
            regions,
            marks: starts.clone(),
            extra: vec![0; starts.len()],
            limits: Vec::new(),
            starts,
            reserve,
        };
        hw.relimit();
        Ok(hw)
    }

    /// Raises region `region`'s mark to `mark` (marks never go down).
    pub fn raise(&mut self, region: u32, mark: u64) -> Result<(), RegionError> {
        let regions = self.regions;
        let slot = self
            .marks
            .get_mut(region as usize)
            .ok_or(RegionError::OutOfRange { region, regions })?;
        *slot = (*slot).max(mark);
        self.relimit();
        Ok(())
    }

    /// Recomputes `limits` from the marks, the reserve and the extras.
    fn relimit(&mut self) {
        self.limits = (0..self.marks.len()).map(|r| self.limit(r)).collect();
    }

    /// Region `r`'s mark + reserve + extra.
    fn limit(&self, r: usize) -> u64 {
        let (mark, extra) = (self.marks.get(r), self.extra.get(r));
        mark.copied()
            .unwrap_or(0)
            .saturating_add(self.reserve)
            .saturating_add(extra.copied().unwrap_or(0))
    }

    /// Raises the mark of the region holding counter `n` so that `n` counts as issued (the
    /// edge learnt of a link minted after its snapshot). Counters outside the code space are
    /// ignored.
    pub fn note_issued(&mut self, n: u64) {
        if n >= CODE_SPACE {
            return;
        }
        let region = self.starts.partition_point(|&s| s <= n).saturating_sub(1);
        if let Some(slot) = self.marks.get_mut(region) {
            *slot = (*slot).max(n.saturating_add(1));
            let limit = self.limit(region);
            if let Some(l) = self.limits.get_mut(region) {
                *l = limit;
            }
        }
    }

    /// The same marks with `extra` more counters of reserve above each: what may have been
    /// issued by now when the marks were last confirmed a while ago (an edge that lost its feed
    /// widens by the regions' mint rate × the time since). Marks, and so
    /// [`HighWater::below_mark`], are unchanged: a code in the widened window is never a
    /// cacheable "not found".
    #[must_use]
    pub fn widened(&self, extra: u64) -> HighWater {
        let mut wide = HighWater {
            reserve: self.reserve.saturating_add(extra),
            ..self.clone()
        };
        wide.relimit();
        wide
    }

    /// The same marks with `extra` more counters above region `region`'s alone: what that
    /// region may have minted since its mark was last confirmed (a region whose control plane
    /// lost a peer region widens that region's window by its mint rate × the time since).
    /// Marks, and so [`HighWater::below_mark`], are unchanged. A region out of range is ignored.
    #[must_use]
    pub fn widened_region(&self, region: u32, extra: u64) -> HighWater {
        let mut wide = self.clone();
        if let Some(slot) = wide.extra.get_mut(region as usize) {
            *slot = slot.saturating_add(extra);
        }
        wide.relimit();
        wide
    }

    /// Region count.
    pub fn regions(&self) -> u32 {
        self.regions
    }

    /// The reserve added to every mark.
    pub fn reserve(&self) -> u64 {
        self.reserve
    }

    /// Every region's mark, by region.
    pub fn marks(&self) -> &[u64] {
        &self.marks
    }

    /// False only when `n` can never have been issued: at or above its region's mark + reserve.
    #[inline]
    pub fn may_be_issued(&self, n: u64) -> bool {
        self.region_index(n)
            .and_then(|r| self.limits.get(r))
            .is_some_and(|&limit| n < limit)
    }

    /// True when `n` lies below its region's published mark (not in the reserve window above
    /// it, where links may appear at any moment): an edge may cache "not found" for such codes.
    #[inline]
    pub fn below_mark(&self, n: u64) -> bool {
        self.mark_of(n).is_some_and(|mark| n < mark)
    }

    #[inline]
    fn mark_of(&self, n: u64) -> Option<u64> {
        self.region_index(n)
            .and_then(|r| self.marks.get(r).copied())
    }

    #[inline]
    fn region_index(&self, n: u64) -> Option<usize> {
        if n >= CODE_SPACE {
            return None;
        }
        // starts[0] == 0, so at least one start is <= n.
        Some(self.starts.partition_point(|&s| s <= n).saturating_sub(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_tile_the_space() {
        for regions in [1u32, 2, 3, 7, 64] {
            let mut next = 0;
            for r in 0..regions {
                let range = region_range(r, regions).unwrap();
                assert_eq!(range.start, next);
                assert!(range.end > range.start);
                next = range.end;
            }
            assert_eq!(next, CODE_SPACE);
        }
        assert_eq!(region_range(0, 0), Err(RegionError::NoRegions));
        assert!(region_range(3, 3).is_err());
    }

    #[test]
    fn note_issued_raises_only_its_region() {
        let mut hw = HighWater::new(2, 10).unwrap();
        let r1 = region_range(1, 2).unwrap();
        assert!(!hw.may_be_issued(r1.start + 500));
        hw.note_issued(r1.start + 500);
        assert!(hw.may_be_issued(r1.start + 509));
        assert!(!hw.may_be_issued(r1.start + 511));
        assert!(!hw.may_be_issued(500), "region 0 untouched");
        hw.note_issued(r1.start + 5);
        assert_eq!(hw.marks()[1], r1.start + 501, "marks never go down");
        hw.note_issued(CODE_SPACE);
    }

    #[test]
    fn widening_lets_more_through_but_caches_nothing_more() {
        let mut hw = HighWater::new(2, 1_000).unwrap();
        hw.raise(0, 50_000).unwrap();
        let wide = hw.widened(20_000);
        assert!(!hw.may_be_issued(60_000));
        assert!(wide.may_be_issued(70_999));
        assert!(!wide.may_be_issued(71_000));
        assert!(
            wide.below_mark(49_999) && !wide.below_mark(50_000),
            "marks unchanged"
        );
        assert_eq!((wide.marks(), wide.reserve()), (hw.marks(), 21_000));
        let r1 = region_range(1, 2).unwrap();
        assert!(wide.may_be_issued(r1.start + 20_999), "every region widens");
        assert_eq!(hw.widened(u64::MAX).reserve(), u64::MAX);
    }

    #[test]
    fn high_water_check() {
        let mut hw = HighWater::new(2, 1_000).unwrap();
        let r1 = region_range(1, 2).unwrap();
        assert!(hw.may_be_issued(0));
        assert!(hw.may_be_issued(999));
        assert!(!hw.may_be_issued(1_000));
        assert!(
            !hw.below_mark(0),
            "nothing issued yet: everything is in the reserve window"
        );
        hw.raise(0, 50_000).unwrap();
        assert!(hw.may_be_issued(50_999));
        assert!(!hw.may_be_issued(51_000));
        assert!(hw.below_mark(49_999));
        assert!(!hw.below_mark(50_000));
        hw.raise(0, 10).unwrap();
        assert!(hw.may_be_issued(50_999), "marks never go down");
        assert!(hw.may_be_issued(r1.start + 999));
        assert!(!hw.may_be_issued(r1.start + 1_000));
        assert!(!hw.may_be_issued(CODE_SPACE));
        assert!(hw.raise(2, 5).is_err());
    }

    #[test]
    fn region_boundaries_with_uneven_division() {
        let hw = HighWater::new(7, 0).unwrap();
        for r in 1..7 {
            let start = region_range(r, 7).unwrap().start;
            // Nothing issued anywhere and no reserve: every counter is rejected, and the
            // boundary counters are looked up in their own region (no index panics).
            assert!(!hw.may_be_issued(start));
            assert!(!hw.may_be_issued(start - 1));
        }
        let mut hw = HighWater::new(7, 0).unwrap();
        let start3 = region_range(3, 7).unwrap().start;
        hw.raise(3, start3 + 1).unwrap();
        assert!(hw.may_be_issued(start3));
        assert!(!hw.may_be_issued(start3 - 1));
    }

    #[test]
    fn every_counter_has_the_region_whose_range_holds_it() {
        for regions in [1u32, 2, 3, 7, 64] {
            for r in 0..regions {
                let g = region_range(r, regions).unwrap();
                for n in [
                    g.start,
                    g.start + 1,
                    g.end - 1,
                    g.start + (g.end - g.start) / 2,
                ] {
                    assert_eq!(region_of(n, regions), Some(r), "{n} of {regions}");
                }
            }
        }
        assert_eq!(region_of(CODE_SPACE, 2), None);
        assert_eq!(region_of(0, 0), None);
    }

    #[test]
    fn one_region_widened_alone() {
        let hw = HighWater::new(2, 100).unwrap();
        let b = region_range(1, 2).unwrap().start;
        let wide = hw.widened_region(1, 1_000);
        assert!(!hw.may_be_issued(b + 500));
        assert!(wide.may_be_issued(b + 500) && !wide.may_be_issued(b + 1_100));
        assert!(!wide.below_mark(b + 500), "widening caches no 404");
        // Region 0 is as it was.
        assert!(!wide.may_be_issued(500));
        assert_eq!(hw.widened_region(7, 5), hw);
    }
}
