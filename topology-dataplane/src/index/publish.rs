//! Publishing the placement into the kernel's index, one position at a time, through the
//! index's shared mapping (see `topology_common::index` for the protocol).

use std::{
    collections::{BTreeSet, HashMap, HashSet},
    sync::atomic::Ordering,
};

use topology_common::ServiceValue;

use super::placement::{Content, IndexKey, Placement, Position};
use crate::{error::DataplaneError, grace::Grace, ops::IndexStore};

/// Rewrites of one position a running program may see at most. `seq` advances by two per rewrite
/// and wraps at 256, so a program would have to stay inside one lookup for 128 rewrites of its
/// position to see the same even `seq` twice; the agent waits for a grace period long before.
pub(super) const REWRITES_PER_GRACE: u8 = 64;
/// Rewrites of one position a running program may see before a grace period is asked for in the
/// background: it passes long before the position is rewritten [`REWRITES_PER_GRACE`] times but
/// under a storm of changes to one Service, and the writer need not wait itself.
pub(super) const REWRITES_BEFORE_BACKGROUND: u8 = REWRITES_PER_GRACE / 4;

/// The index of one family: its placement, and the writes that publish it to its map.
pub struct ServiceIndex<K: IndexKey> {
    placement: Placement<K>,
    /// Positions not published because a grace period could not be waited for; retried by
    /// [`Self::repair`]. Meanwhile they hold whole, earlier contents.
    pending: BTreeSet<u32>,
    /// Failures since last asked, for the apply report.
    errors: Vec<DataplaneError>,
}

impl<K: IndexKey> ServiceIndex<K> {
    /// Adopts the index in `map` and makes it index exactly `services`.
    pub fn adopt(
        map: &mut dyn IndexStore<K::Entry>,
        services: &HashMap<K, ServiceValue>,
        grace: &mut dyn Grace,
    ) -> Result<Self, DataplaneError> {
        let positions = map.len();
        if !positions.is_power_of_two() {
            return Err(DataplaneError::IndexSize { map: K::MAP, positions });
        }
        let held = (0..positions).map(|p| (p, map.read(p))).filter(|(_, entry)| *entry != K::Entry::default());
        let (placement, changed) = Placement::adopt(positions, held, services);
        let mut index = Self { placement, pending: BTreeSet::new(), errors: Vec::new() };
        index.publish(map, changed, grace);
        Ok(index)
    }

    /// Makes `key` map to `value` in the index.
    pub fn upsert(&mut self, map: &mut dyn IndexStore<K::Entry>, key: K, value: ServiceValue, grace: &mut dyn Grace) {
        let changed = self.placement.upsert(key, value);
        self.publish(map, changed, grace);
    }

    /// Removes `key` from the index.
    pub fn remove(&mut self, map: &mut dyn IndexStore<K::Entry>, key: &K, grace: &mut dyn Grace) {
        let changed = self.placement.remove(key);
        self.publish(map, changed, grace);
    }

    /// The first half of making `key` map to `value`, done before its hash map entry is written:
    /// every position that changes is made "not sure" (odd `seq`), so a program asks the hash map
    /// whichever entry it holds. [`Self::settle`] publishes the contents once the entry is written.
    pub fn stage_upsert(&mut self, map: &mut dyn IndexStore<K::Entry>, key: K, value: ServiceValue) -> Staged {
        let changed = self.placement.upsert(key, value);
        self.stage(map, changed)
    }

    /// The first half of removing `key`, done before its hash map entry is deleted (see
    /// [`Self::stage_upsert`]).
    pub fn stage_remove(&mut self, map: &mut dyn IndexStore<K::Entry>, key: &K) -> Staged {
        let changed = self.placement.remove(key);
        self.stage(map, changed)
    }

    /// Publishes what is decided for the positions of `staged`, once the hash map holds what they
    /// were staged for (or the change was undone). A position a grace period held back stays
    /// "not sure" and pending, as in [`Self::upsert`].
    pub fn settle(&mut self, map: &mut dyn IndexStore<K::Entry>, staged: Staged, grace: &mut dyn Grace) {
        for position in staged.0 {
            let open = self.placement.seq(position) & 1 != 0;
            if open && !self.pending.contains(&position) {
                self.close_or_keep_pending(map, position, grace);
            }
        }
    }

    /// Publishes positions left pending; true if the kernel holds every decision.
    pub fn repair(&mut self, map: &mut dyn IndexStore<K::Entry>, grace: &mut dyn Grace) -> bool {
        let pending = std::mem::take(&mut self.pending).into_iter().collect();
        self.publish(map, pending, grace);
        self.pending.is_empty()
    }

    /// Failures since the last call.
    pub fn take_errors(&mut self) -> Vec<DataplaneError> {
        std::mem::take(&mut self.errors)
    }

    /// Publishes the current contents of `positions`, in order.
    fn publish(&mut self, map: &mut dyn IndexStore<K::Entry>, positions: Vec<u32>, grace: &mut dyn Grace) {
        let mut done = HashSet::new();
        for position in positions {
            if done.insert(position) {
                self.open(map, position);
                self.close_or_keep_pending(map, position, grace);
            }
        }
    }

    /// Makes `positions` "not sure", once each.
    fn stage(&mut self, map: &mut dyn IndexStore<K::Entry>, positions: Vec<u32>) -> Staged {
        let mut staged = Vec::with_capacity(positions.len());
        for position in positions {
            if !staged.contains(&position) {
                self.open(map, position);
                staged.push(position);
            }
        }
        Staged(staged)
    }

    /// Closes an open position, or leaves it pending with the error.
    fn close_or_keep_pending(&mut self, map: &mut dyn IndexStore<K::Entry>, position: u32, grace: &mut dyn Grace) {
        if let Err(error) = self.close(map, position, grace) {
            self.pending.insert(position);
            self.errors.push(error);
        }
    }

    /// The first half of a rewrite: `seq` made odd over the old contents. No later write becomes
    /// visible before it: the contents are stored after a release fence, and the kernel publishes
    /// a hash map update with a release store of its own. Making `seq` odd never validates a read,
    /// so it needs no grace period.
    fn open(&mut self, map: &mut dyn IndexStore<K::Entry>, position: u32) {
        let known = self.placement.positions.entry(position).or_insert_with(Position::never_written);
        if known.seq & 1 == 0 {
            known.seq = known.seq.wrapping_add(1);
            map.store_seq(position, known.seq, Ordering::Relaxed);
        }
    }

    /// The second half: the decided contents, then `seq` made even by a release store. Fails only
    /// when a grace period is due and cannot be waited for, leaving the position "not sure".
    fn close(
        &mut self,
        map: &mut dyn IndexStore<K::Entry>,
        position: u32,
        grace: &mut dyn Grace,
    ) -> Result<(), DataplaneError> {
        let known = *self.placement.positions.entry(position).or_insert_with(Position::never_written);
        debug_assert!(known.seq & 1 != 0, "position {position} closed before it was opened");
        match known.rewrites.uncovered(grace.epochs()) {
            REWRITES_PER_GRACE.. => grace.wait()?,
            REWRITES_BEFORE_BACKGROUND.. => grace.begin(),
            _ => {}
        }
        map.store_body(position, &K::entry(known.seq, &known.content));
        let even = known.seq.wrapping_add(1);
        map.store_seq(position, even, Ordering::Release);
        self.placement.published.remove(&position);
        if let Some(known) = self.placement.positions.get_mut(&position) {
            known.seq = even;
            known.rewrites.count(grace.epochs());
        }
        Ok(())
    }
}

/// Index positions made "not sure" ahead of a hash map write, to be settled after it: between
/// the two, whatever the hash map holds is what every lookup answers.
#[must_use = "staged positions stay \"not sure\" until settled"]
#[derive(Debug, Default)]
pub struct Staged(Vec<u32>);

impl Staged {
    /// Both sets of positions.
    pub fn and(mut self, other: Self) -> Self {
        self.0.extend(other.0);
        self
    }
}

/// Checks what the kernel holds in `map` against `services`: each service's lookup, as the
/// programs make it, answers its entry or "not sure", and every placed key is a service.
pub fn verify<K: IndexKey>(
    map: &dyn IndexStore<K::Entry>,
    services: &HashMap<K, ServiceValue>,
) -> Result<(), DataplaneError> {
    let inconsistent = |problem| DataplaneError::Inconsistent { map: K::MAP, problem };
    let mut held = Placement::new(map.len());
    let mut seen = HashSet::new();
    for position in 0..map.len() {
        let entry = map.read(position);
        let (seq, content) = K::parse(&entry).ok_or_else(|| inconsistent(format!("[{position}]: invalid state")))?;
        if let Content::Used(key, _) = content
            && !seen.insert(key)
        {
            return Err(inconsistent(format!("{key:?} at two positions")));
        }
        held.record(position, seq, content);
    }
    held.check(services).map_err(|violation| inconsistent(violation.to_string()))
}
