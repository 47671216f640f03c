//! Maps read back: the in-memory maps as the agent reads the kernel's after a restart (a
//! [`KernelState`] a new writer adopts), and the kernel's maps into their in-memory form, so that
//! what the golden scenarios print of the in-memory maps can be printed of the real ones and the
//! two compared (the scenarios' root run).

use std::collections::BTreeSet;

use topology_common::map_names;
use topology_policy::desired::PortOptions;

use super::{
    Dataplane, KernelState,
    error::DataplaneError,
    maps::MapSet,
    memory::MemoryMaps,
    ops::ServiceKey,
    state::{ProgrammedService, name_from_meta, set_slots},
};

impl MemoryMaps {
    /// What the maps hold, read back as the agent reads the kernel's after a restart
    /// ([`crate::state::read`]): the writer of a restarted agent adopts it.
    pub fn kernel_state(&self) -> KernelState {
        let entries = self
            .services4
            .iter()
            .map(|(k, v)| (ServiceKey::V4(*k), *v))
            .chain(self.services6.iter().map(|(k, v)| (ServiceKey::V6(*k), *v)));
        let mut state = KernelState::default();
        for (key, value) in entries {
            let Some(port) = key.port() else { continue };
            let slots = set_slots(&value, self.slots.len() as u32, |index| {
                Ok::<_, std::convert::Infallible>(self.slots[index as usize])
            });
            let slots = slots.unwrap_or_else(|never| match never {});
            let name = self.names.get(&value.service_id).map(name_from_meta).unwrap_or_default();
            let options = self.options.get(value.service_id as usize).map(PortOptions::from_kernel).unwrap_or_default();
            state.services.insert(port, ProgrammedService::new(&value, slots, name, options));
        }
        let live: BTreeSet<u32> = state.services.values().map(|s| s.service_id).collect();
        state.orphan_ids = self.names.keys().copied().filter(|id| !live.contains(id)).collect();
        state
    }

    /// Every entry of the kernel's service maps, slots, names, options, ranges and indexes. What
    /// the kernel cannot say (how often counters were zeroed, grace periods waited for) is left
    /// at zero.
    pub fn read_from(maps: &MapSet) -> Result<Self, DataplaneError> {
        let capacities = maps.capacities;
        let mut memory = Self::new(capacities);
        for item in maps.services4.iter() {
            let (key, value) = item.map_err(DataplaneError::map(map_names::SERVICES_V4))?;
            memory.services4.insert(key, value);
        }
        for item in maps.services6.iter() {
            let (key, value) = item.map_err(DataplaneError::map(map_names::SERVICES_V6))?;
            memory.services6.insert(key, value);
        }
        for (index, slot) in (0..capacities.slots).zip(memory.slots.iter_mut()) {
            *slot = maps.slots.get(&index, 0).map_err(DataplaneError::map(map_names::SLOTS))?;
        }
        for item in maps.meta.iter() {
            let (id, meta) = item.map_err(DataplaneError::map(map_names::SERVICE_META))?;
            memory.names.insert(id, meta);
        }
        for (id, options) in (0..capacities.service_ids).zip(memory.options.iter_mut()) {
            *options = maps.options.get(&id, 0).map_err(DataplaneError::map(map_names::SERVICE_OPTIONS))?;
        }
        memory.ranges = maps.ranges.get(&0, 0).map_err(DataplaneError::map(map_names::SERVICE_RANGES))?;
        memory.index4 = super::memory::MemoryIndex::from_positions((0..maps.index4.len()).map(|p| maps.index4.read(p)));
        memory.index6 = super::memory::MemoryIndex::from_positions((0..maps.index6.len()).map(|p| maps.index6.read(p)));
        Ok(memory)
    }
}

impl Dataplane {
    /// What the kernel's maps hold now, in their in-memory form (see [`MemoryMaps::read_from`]).
    pub fn snapshot(&self) -> Result<MemoryMaps, DataplaneError> {
        MemoryMaps::read_from(self.writer.maps())
    }
}
