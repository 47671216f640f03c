//! Which runs of the slots array are in use. Every backend set occupies one contiguous run, so a
//! program finds slot `i` of a set at `base + i` with one inlined array access.
//!
//! A run a service stopped using is *retired*, not freed: a program that read the old service
//! entry just before the swap may still read it. Retired runs become free only after an RCU grace
//! period (see [`super::grace`]), which the writer waits for only when it runs out of free room.

use std::collections::BTreeMap;

/// A run of slots: `base..base + len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Run {
    /// First index.
    pub base: u32,
    /// Number of slots.
    pub len: u32,
}

impl Run {
    fn end(self) -> u64 {
        u64::from(self.base) + u64::from(self.len)
    }
}

/// Why a run could not be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shortage {
    /// Fewer free slots than needed, even counting retired ones.
    Full {
        /// Slots in use (live and retired) plus the run asked for.
        needed: u64,
    },
    /// Enough free slots, but no run of the length asked for.
    Fragmented {
        /// Free slots in total.
        free: u64,
        /// Longest free run.
        largest: u32,
    },
}

/// Free, live and retired runs of an array of `capacity` slots.
#[derive(Clone, Debug)]
pub struct SlotSpace {
    capacity: u32,
    /// Free runs by base, never adjacent to each other (merged on release).
    free: BTreeMap<u32, u32>,
    free_total: u64,
    retired: Vec<Run>,
    retired_total: u64,
}

impl SlotSpace {
    /// An array of `capacity` slots where the `live` runs are in use, each with its owner, and
    /// everything else is retired: after a restart, slots no service refers to may have been
    /// released by the previous agent an instant ago. The owners of runs that are out of range or
    /// overlap an earlier run are returned: their runs are not taken, their services must be
    /// rewritten.
    pub fn adopt<T>(capacity: u32, live: impl IntoIterator<Item = (Run, T)>) -> (Self, Vec<T>) {
        let mut runs: Vec<(Run, T)> = live.into_iter().filter(|(run, _)| run.len > 0).collect();
        runs.sort_by_key(|(run, _)| *run);
        let mut rejected = Vec::new();
        let mut space = Self { capacity, free: BTreeMap::new(), free_total: 0, retired: Vec::new(), retired_total: 0 };
        let mut cursor: u64 = 0;
        for (run, owner) in runs {
            if run.end() > u64::from(capacity) || u64::from(run.base) < cursor {
                rejected.push(owner);
                continue;
            }
            if u64::from(run.base) > cursor {
                space.retire(Run { base: cursor as u32, len: (u64::from(run.base) - cursor) as u32 });
            }
            cursor = run.end();
        }
        if cursor < u64::from(capacity) {
            space.retire(Run { base: cursor as u32, len: (u64::from(capacity) - cursor) as u32 });
        }
        (space, rejected)
    }

    /// An empty array of `capacity` slots, all free.
    #[cfg(test)]
    pub fn new(capacity: u32) -> Self {
        let mut space = Self::adopt::<()>(capacity, []).0;
        space.reclaim();
        space
    }

    /// A free run of `len` slots (first fit), or why there is none. `len` 0 is never asked for.
    pub fn allocate(&mut self, len: u32) -> Result<Run, Shortage> {
        let found = self.free.iter().find(|&(_, &free)| free >= len).map(|(&base, &free)| (base, free));
        let Some((base, free)) = found else {
            return Err(self.shortage(len));
        };
        self.free.remove(&base);
        if free > len {
            self.free.insert(base + len, free - len);
        }
        self.free_total -= u64::from(len);
        Ok(Run { base, len })
    }

    /// Why `len` slots cannot be allocated now.
    fn shortage(&self, len: u32) -> Shortage {
        let reclaimable = self.free_total + self.retired_total;
        if reclaimable < u64::from(len) {
            Shortage::Full { needed: u64::from(self.capacity) - reclaimable + u64::from(len) }
        } else {
            Shortage::Fragmented { free: reclaimable, largest: self.free.values().copied().max().unwrap_or(0) }
        }
    }

    /// Frees a run no program can have seen (its service entry was never written).
    pub fn release(&mut self, run: Run) {
        if run.len == 0 {
            return;
        }
        let mut base = run.base;
        let mut len = run.len;
        // Merge with the free run ending where this one starts, and the one starting where it ends.
        if let Some((&before, &before_len)) = self.free.range(..base).next_back()
            && u64::from(before) + u64::from(before_len) == u64::from(base)
        {
            self.free.remove(&before);
            base = before;
            len += before_len;
        }
        if let Some(after_len) = self.free.remove(&(run.base + run.len)) {
            len += after_len;
        }
        self.free.insert(base, len);
        self.free_total += u64::from(run.len);
    }

    /// Sets aside a run a service entry referred to until the next grace period.
    pub fn retire(&mut self, run: Run) {
        if run.len > 0 {
            self.retired.push(run);
            self.retired_total += u64::from(run.len);
        }
    }

    /// True when a grace period would free something.
    pub fn has_retired(&self) -> bool {
        !self.retired.is_empty()
    }

    /// Frees every retired run; call only after a grace period that began after they retired.
    pub fn reclaim(&mut self) {
        for run in std::mem::take(&mut self.retired) {
            self.release(run);
        }
        self.retired_total = 0;
    }

    /// Slots in use by live sets.
    pub fn live(&self) -> u64 {
        u64::from(self.capacity) - self.free_total - self.retired_total
    }

    /// Slots waiting for a grace period.
    pub fn retired(&self) -> u64 {
        self.retired_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(base: u32, len: u32) -> Run {
        Run { base, len }
    }

    #[test]
    fn first_fit_splits_and_release_merges_both_sides() {
        let mut space = SlotSpace::new(10);
        assert_eq!(space.allocate(3), Ok(run(0, 3)));
        assert_eq!(space.allocate(3), Ok(run(3, 3)));
        assert_eq!(space.allocate(3), Ok(run(6, 3)));
        assert_eq!(space.live(), 9);
        space.release(run(0, 3));
        space.release(run(6, 3));
        // 0..3 and 6..10 are free; releasing 3..6 joins them into one run of 10.
        space.release(run(3, 3));
        assert_eq!(space.allocate(10), Ok(run(0, 10)));
        assert_eq!(space.live(), 10);
    }

    #[test]
    fn retired_runs_are_reused_only_after_reclaim() {
        let mut space = SlotSpace::new(4);
        let first = space.allocate(4).unwrap();
        space.retire(first);
        assert_eq!(space.live(), 0);
        assert_eq!(space.retired(), 4);
        assert_eq!(space.allocate(2), Err(Shortage::Fragmented { free: 4, largest: 0 }));
        assert!(space.has_retired());
        space.reclaim();
        assert_eq!(space.allocate(2), Ok(run(0, 2)));
        assert!(!space.has_retired());
    }

    #[test]
    fn shortage_says_full_or_fragmented() {
        let mut space = SlotSpace::new(6);
        let a = space.allocate(2).unwrap();
        space.allocate(2).unwrap();
        space.allocate(2).unwrap();
        assert_eq!(space.allocate(1), Err(Shortage::Full { needed: 7 }));
        space.release(a);
        assert_eq!(space.allocate(3), Err(Shortage::Full { needed: 7 }));
        let mut holes = SlotSpace::new(6);
        let runs: Vec<Run> = (0..3).map(|_| holes.allocate(2).unwrap()).collect();
        holes.release(runs[0]);
        holes.release(runs[2]);
        assert_eq!(holes.allocate(3), Err(Shortage::Fragmented { free: 4, largest: 2 }));
    }

    #[test]
    fn adoption_keeps_live_runs_retires_the_rest_and_rejects_overlaps() {
        let live = [(run(2, 3), 'a'), (run(10, 5), 'b'), (run(12, 2), 'c'), (run(18, 4), 'd'), (run(0, 0), 'e')];
        let (mut space, rejected) = SlotSpace::adopt(20, live);
        assert_eq!(rejected, vec!['c', 'd'], "overlapping and out-of-range runs");
        assert_eq!(space.live(), 8);
        assert_eq!(space.retired(), 12);
        assert!(space.allocate(1).is_err(), "nothing is free before a grace period");
        space.reclaim();
        assert_eq!(space.allocate(5), Ok(run(5, 5)), "the gap between the live runs");
        assert_eq!(space.allocate(2), Ok(run(0, 2)));
        assert_eq!(space.allocate(5), Ok(run(15, 5)));
        assert_eq!(space.live(), 20);
    }

    #[test]
    fn churn_never_loses_or_duplicates_a_slot() {
        // Allocate, retire and reclaim sets of varying sizes; the accounting must always add up
        // and live runs must never overlap.
        let mut space = SlotSpace::new(64);
        let mut live: Vec<Run> = Vec::new();
        let mut seed = 7u64;
        for step in 0..2_000 {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let len = 1 + (seed >> 33) as u32 % 9;
            if live.len() > 4 || (seed >> 20).is_multiple_of(3) {
                if !live.is_empty() {
                    let victim = live.swap_remove((seed >> 40) as usize % live.len());
                    space.retire(victim);
                }
            } else {
                match space.allocate(len) {
                    Ok(run) => live.push(run),
                    Err(_) if space.has_retired() => space.reclaim(),
                    Err(error) => panic!("step {step}: {error:?} with {} live", space.live()),
                }
            }
            let in_live: u64 = live.iter().map(|r| u64::from(r.len)).sum();
            assert_eq!(space.live(), in_live, "step {step}");
            let mut sorted = live.clone();
            sorted.sort();
            assert!(sorted.windows(2).all(|w| w[0].end() <= u64::from(w[1].base)), "step {step}: overlap");
        }
    }
}
