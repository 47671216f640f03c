//! One shard of the relay cache: its answers, the ring the CLOCK hand walks, and the two ways
//! room is made — for the cache's bytes, and within a client's share.

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    time::{Duration, Instant},
};

use super::{CacheMetrics, Entry, Key, OWN_STEPS, uncharge};

#[derive(Default)]
pub(super) struct Shard {
    /// Hashed with a seed of the process's own: names are the clients' choice.
    pub(super) entries: HashMap<Key, Entry, foldhash::fast::RandomState>,
    /// Keys in the order the CLOCK hand visits them.
    pub(super) ring: VecDeque<Key>,
    /// What its entries cost, bytes.
    pub(super) bytes: usize,
}

impl Shard {
    /// Evicts by CLOCK — an entry used since the hand last passed it gets a second chance, so
    /// each is passed at most twice — until `cost` more bytes fit in `budget`; never `keep`'s
    /// entry (when they replace it, add its bytes to `budget`). Whether they fit.
    pub(super) fn make_room(
        &mut self,
        keep: &Key,
        cost: usize,
        budget: usize,
        owned: &mut HashMap<IpAddr, usize>,
        metrics: &CacheMetrics,
    ) -> bool {
        let mut turns = 2 * self.ring.len() + 1;
        while self.bytes + cost > budget && turns > 0 {
            turns -= 1;
            let Some(candidate) = self.ring.pop_front() else { break };
            if candidate == *keep {
                self.ring.push_back(candidate);
                continue;
            }
            // A key whose entry is gone leaves the ring here.
            let Some(entry) = self.entries.get_mut(&candidate) else { continue };
            if std::mem::take(&mut entry.referenced) {
                self.ring.push_back(candidate);
            } else {
                self.evict(&candidate, owned, metrics);
            }
        }
        self.bytes + cost <= budget
    }

    /// Moves the CLOCK hand up to [`OWN_STEPS`] places, evicting the answers of `owner` (but
    /// `keep`'s) that expired or were not used since the hand last passed them (those used get
    /// a second chance), until `needed` bytes are freed; the bytes freed. Within its share a
    /// client's answers go by use, as the cache's do: its flood of unique names churns among
    /// itself, while the popular answers it keeps asking stay.
    pub(super) fn evict_own(
        &mut self,
        owned: &mut HashMap<IpAddr, usize>,
        owner: IpAddr,
        keep: &Key,
        needed: usize,
        now: Instant,
        metrics: &CacheMetrics,
    ) -> usize {
        let mut freed = 0;
        for _ in 0..self.ring.len().min(OWN_STEPS) {
            if freed >= needed {
                break;
            }
            let Some(candidate) = self.ring.pop_front() else { break };
            // A key whose entry is gone leaves the ring here.
            let Some(entry) = self.entries.get_mut(&candidate) else { continue };
            let evict = candidate != *keep
                && entry.owner == Some(owner)
                && (now >= entry.stored + Duration::from_secs(u64::from(entry.keep_for))
                    || !std::mem::take(&mut entry.referenced));
            if evict {
                freed += self.evict(&candidate, owned, metrics);
            } else {
                self.ring.push_back(candidate);
            }
        }
        freed
    }

    /// Drops `key`'s entry (its place in the ring already taken off), uncharging its client;
    /// the bytes freed.
    fn evict(&mut self, key: &Key, owned: &mut HashMap<IpAddr, usize>, metrics: &CacheMetrics) -> usize {
        let Some(old) = self.entries.remove(key) else { return 0 };
        let cost = old.cost();
        self.bytes -= cost;
        metrics.evictions.inc();
        metrics.bytes.dec_by(cost as i64);
        uncharge(owned, old.owner, cost);
        cost
    }
}
