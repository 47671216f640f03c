//! Entry points for the fuzz targets: adoption of whatever the pinned maps hold.

use std::collections::HashMap;

use topology_common::{IndexEntry4, ServiceKey4, ServiceValue};

use super::{
    ids::{DenseIds, IdPool},
    index::Placement,
    slot_space::{Run, SlotSpace},
};

/// Adopts an index of `positions` holding `held`, to index `services`; once its changes are
/// published, every lookup a program could make must agree with `services`.
pub fn adopt_index(positions: u32, held: Vec<(u32, IndexEntry4)>, services: &HashMap<ServiceKey4, ServiceValue>) {
    let (mut placement, changed) = Placement::adopt(positions, held, services);
    placement.published_all(&changed);
    if let Err(error) = placement.check(services) {
        panic!("adoption broke the index invariant: {error}");
    }
}

/// Adopts slot runs `(base, len)` in a slots array of `capacity`: overlapping or out-of-range
/// runs are rejected, never trusted.
pub fn adopt_slots(capacity: u32, runs: &[(u32, u32)]) {
    let (space, rejected) =
        SlotSpace::adopt(capacity, runs.iter().enumerate().map(|(i, &(base, len))| (Run { base, len }, i)));
    assert!(space.live() <= u64::from(capacity), "more live slots than the array has");
    assert!(rejected.len() <= runs.len());
}

/// Id pools from ids read back from maps, then a few allocations.
pub fn adopt_ids(ids: &[u32], capacity: u32) {
    let mut dense = DenseIds::new(ids.iter().copied(), capacity);
    let mut sets = IdPool::new(ids.iter().copied().take(1024));
    for _ in 0..4 {
        if (dense.len() as u64) < u64::from(capacity) {
            let id = dense.allocate();
            assert!(id < capacity, "a service id at or beyond the capacity: {id}");
        }
        assert_ne!(sets.allocate(), 0);
    }
}

/// Reads a service entry's set from an arbitrary slot array, as adoption does, and rebuilds the
/// backends and their shares from it.
pub fn read_set(value: &ServiceValue, slots: &[topology_common::Slot]) {
    let capacity = u32::try_from(slots.len()).unwrap_or(u32::MAX);
    let set = super::state::set_slots(value, capacity, |index| Ok::<_, ()>(slots[index as usize]))
        .expect("reading from memory cannot fail");
    assert!(set.len() <= slots.len());
    let service = super::state::ProgrammedService::new(value, set, String::new(), Default::default());
    let _ = service.backends(true);
    let _ = service.backends(false);
}
