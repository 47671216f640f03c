//! Keeping the service index in step with the hash maps, at every instant.
//!
//! A change of a service entry goes in three steps: the index positions it changes are made "not
//! sure" ([`Writer::stage_upsert`], [`Writer::stage_remove`]), the hash map entry is written or
//! deleted, then the positions get their new contents ([`Writer::settle`]). Whenever the agent
//! stops — killed between any two stores — every lookup a program makes in the index answers what
//! the hash map holds, or "not sure" and the program asks the hash map.

use topology_common::ServiceValue;

use super::Writer;
use crate::{
    index::Staged,
    ops::{MapOps, ServiceKey},
};

/// Index positions staged ahead of hash map writes, per family.
#[must_use = "staged positions stay \"not sure\" until settled"]
#[derive(Debug, Default)]
pub(super) struct StagedIndex {
    v4: Staged,
    v6: Staged,
}

impl StagedIndex {
    /// Both sets of positions.
    pub(super) fn and(self, other: Self) -> Self {
        Self { v4: self.v4.and(other.v4), v6: self.v6.and(other.v6) }
    }
}

impl<M: MapOps> Writer<M> {
    /// Makes the index positions that `key` → `value` changes "not sure", before the entry is
    /// written.
    pub(super) fn stage_upsert(&mut self, key: ServiceKey, value: ServiceValue) -> StagedIndex {
        match key {
            ServiceKey::V4(key) => {
                let (map, _) = self.maps.index4();
                StagedIndex { v4: self.index4.stage_upsert(map, key, value), v6: Staged::default() }
            }
            ServiceKey::V6(key) => {
                let (map, _) = self.maps.index6();
                StagedIndex { v4: Staged::default(), v6: self.index6.stage_upsert(map, key, value) }
            }
        }
    }

    /// Makes the index positions that removing `key` changes "not sure", before the entry is
    /// deleted.
    pub(super) fn stage_remove(&mut self, key: ServiceKey) -> StagedIndex {
        match key {
            ServiceKey::V4(key) => {
                let (map, _) = self.maps.index4();
                StagedIndex { v4: self.index4.stage_remove(map, &key), v6: Staged::default() }
            }
            ServiceKey::V6(key) => {
                let (map, _) = self.maps.index6();
                StagedIndex { v4: Staged::default(), v6: self.index6.stage_remove(map, &key) }
            }
        }
    }

    /// Publishes staged positions once the hash map holds what they were staged for, or the change
    /// was undone in the index too. A position a grace period holds back is repaired on the next
    /// apply; meanwhile it stays "not sure", and the run it pointed at is not reclaimed.
    pub(super) fn settle(&mut self, staged: StagedIndex) {
        let (map, grace) = self.maps.index4();
        self.index4.settle(map, staged.v4, grace);
        let (map, grace) = self.maps.index6();
        self.index6.settle(map, staged.v6, grace);
    }

    /// Publishes index positions left pending; true if the index holds every decision.
    pub(super) fn repair_index(&mut self) -> bool {
        let (map, grace) = self.maps.index4();
        let v4 = self.index4.repair(map, grace);
        let (map, grace) = self.maps.index6();
        self.index6.repair(map, grace) && v4
    }

    /// Points the index at a service entry the hash map holds (undoing a staged change that
    /// could not be written). A failure is reported with the apply and repaired on the next.
    pub(super) fn index_upsert(&mut self, key: ServiceKey, value: ServiceValue) {
        match key {
            ServiceKey::V4(key) => {
                let (map, grace) = self.maps.index4();
                self.index4.upsert(map, key, value, grace);
            }
            ServiceKey::V6(key) => {
                let (map, grace) = self.maps.index6();
                self.index6.upsert(map, key, value, grace);
            }
        }
    }

    /// Takes a service port the hash map does not hold out of the index.
    pub(super) fn index_remove(&mut self, key: ServiceKey) {
        match key {
            ServiceKey::V4(key) => {
                let (map, grace) = self.maps.index4();
                self.index4.remove(map, &key, grace);
            }
            ServiceKey::V6(key) => {
                let (map, grace) = self.maps.index6();
                self.index6.remove(map, &key, grace);
            }
        }
    }
}
