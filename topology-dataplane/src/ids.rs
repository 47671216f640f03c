//! Id allocators of the writer: set generations (unique among live sets) and service ids (dense,
//! lowest first).

use std::collections::{BTreeSet, HashSet};

/// Allocator of ids that are unique among those in use; ids wrap around and skip live ones.
#[derive(Debug, Default)]
pub struct IdPool {
    used: HashSet<u32>,
    cursor: u32,
}

impl IdPool {
    /// A pool where `used` are taken; allocation continues after the largest.
    pub fn new(used: impl IntoIterator<Item = u32>) -> Self {
        let used: HashSet<u32> = used.into_iter().filter(|&id| id != 0).collect();
        let cursor = used.iter().copied().max().unwrap_or(0);
        Self { used, cursor }
    }

    /// A fresh non-zero id.
    pub fn allocate(&mut self) -> u32 {
        loop {
            self.cursor = self.cursor.wrapping_add(1).max(1);
            if self.used.insert(self.cursor) {
                return self.cursor;
            }
        }
    }

    /// Returns `id` to the pool.
    pub fn release(&mut self, id: u32) {
        self.used.remove(&id);
    }
}

/// Allocator of service ids: the lowest free id first, so the ids in use stay below their count
/// and fill the counters' chunks densely. An id is reused at once after release: a program that
/// read the old service entry just before its removal may add one count to the new holder.
#[derive(Debug, Default)]
pub struct DenseIds {
    free: BTreeSet<u32>,
    next: u32,
}

impl DenseIds {
    /// A pool of ids below `capacity` where `used` are taken; ids at or beyond the capacity
    /// (read from damaged maps) are not in the pool, so the free list is bounded by it.
    pub fn new(used: impl IntoIterator<Item = u32>, capacity: u32) -> Self {
        let used: BTreeSet<u32> = used.into_iter().filter(|&id| id < capacity).collect();
        let next = used.last().map_or(0, |&max| max + 1);
        Self { free: (0..next).filter(|id| !used.contains(id)).collect(), next }
    }

    /// The lowest id not in use.
    pub fn allocate(&mut self) -> u32 {
        self.free.pop_first().unwrap_or_else(|| {
            // The writer checks room against the capacity first, so this never reaches u32::MAX.
            self.next = self.next.saturating_add(1);
            self.next - 1
        })
    }

    /// Returns `id` to the pool.
    pub fn release(&mut self, id: u32) {
        if id < self.next {
            self.free.insert(id);
        }
    }

    /// The next `count` ids [`Self::allocate`] would hand out, in that order.
    pub fn upcoming(&self, count: usize) -> impl Iterator<Item = u32> + '_ {
        self.free.iter().copied().chain(self.next..).take(count)
    }

    /// Number of ids in use.
    pub fn len(&self) -> usize {
        self.next as usize - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_non_zero_and_reused_only_after_release() {
        let mut pool = IdPool::new([3, 5]);
        assert_eq!(pool.allocate(), 6);
        assert_eq!(pool.allocate(), 7);
        pool.release(6);
        assert_eq!(pool.allocate(), 8, "released ids wait for the cursor to come round");
        let mut wrapped = IdPool::new([u32::MAX, 1]);
        assert_eq!(wrapped.allocate(), 2, "wraps past u32::MAX, skipping 0 and live ids");
    }

    #[test]
    fn service_ids_are_dense_lowest_free_first() {
        let mut ids = DenseIds::new([0, 2, 5, 1000, u32::MAX], 100);
        assert_eq!(ids.len(), 3);
        assert_eq!([ids.allocate(), ids.allocate(), ids.allocate(), ids.allocate()], [1, 3, 4, 6]);
        ids.release(3);
        ids.release(0);
        assert_eq!(ids.len(), 5);
        assert_eq!([ids.allocate(), ids.allocate(), ids.allocate()], [0, 3, 7]);
        // The lowest free id never exceeds the number in use, so ids stay below the capacity.
        let mut fresh = DenseIds::new([], 10);
        assert_eq!([fresh.allocate(), fresh.allocate()], [0, 1]);
        assert_eq!(fresh.len(), 2);
    }
}
