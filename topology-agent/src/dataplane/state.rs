//! What the kernel holds now, read back from the maps: the agent's mirror after adoption, and
//! what `status` prints.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
};

use aya::maps::MapError;
use topology_common::{ServiceCounters, ServiceMeta, Slot, SlotKey, map_names};

use super::{alias, error::DataplaneError, maps::MapSet};
use crate::desired::{Protocol, ServicePort, WeightedBackend};

/// One service port as the kernel holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgrammedService {
    /// Stable id: key of the counters and names.
    pub service_id: u32,
    /// Current backend-set generation (0 for an empty set).
    pub set_id: u32,
    /// Slot count in the service entry; 0 means connections are refused.
    pub count: u32,
    /// The slots found for `set_id`, by index. Fewer than `count` means the set is damaged.
    pub slots: Vec<Slot>,
    /// `namespace/name:port`.
    pub name: String,
}

impl ProgrammedService {
    /// True when every slot the service entry refers to is present.
    pub fn intact(&self) -> bool {
        self.slots.len() == self.count as usize
    }

    /// The backends and their effective weights (parts per million of traffic).
    pub fn backends(&self, ipv4: bool) -> Vec<WeightedBackend> {
        alias::shares(&self.slots)
            .iter()
            .map(|(backend, share)| alias::weighted_backend(backend, *share, ipv4))
            .collect()
    }
}

/// The programmed state of every service port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelState {
    /// Service ports by (ClusterIP, port, protocol).
    pub services: BTreeMap<ServicePort, ProgrammedService>,
    /// Slots no service entry refers to: a set left behind by an agent that stopped mid-swap.
    pub orphan_slots: Vec<SlotKey>,
    /// Counter and name entries of service ids no service entry uses.
    pub orphan_ids: BTreeSet<u32>,
}

impl KernelState {
    /// Number of slot entries in the kernel, orphans included.
    pub fn slot_entries(&self) -> u64 {
        let live: usize = self.services.values().map(|s| s.slots.len()).sum();
        (live + self.orphan_slots.len()) as u64
    }
}

/// Reads the programmed state from the maps.
pub fn read(maps: &MapSet) -> Result<KernelState, DataplaneError> {
    let mut entries: Vec<(ServicePort, topology_common::ServiceValue)> = Vec::new();
    for item in maps.services4.iter() {
        let (key, value) = item.map_err(DataplaneError::map(map_names::SERVICES_V4))?;
        if let Some(protocol) = Protocol::from_number(key.proto) {
            entries.push((ServicePort { vip: IpAddr::from(key.addr), port: key.port, protocol }, value));
        }
    }
    for item in maps.services6.iter() {
        let (key, value) = item.map_err(DataplaneError::map(map_names::SERVICES_V6))?;
        if let Some(protocol) = Protocol::from_number(key.proto) {
            entries.push((ServicePort { vip: IpAddr::from(key.addr), port: key.port, protocol }, value));
        }
    }

    // One pass over the slots, grouped by set.
    let mut sets: HashMap<u32, BTreeMap<u32, Slot>> = HashMap::new();
    for item in maps.slots.iter() {
        let (key, slot) = item.map_err(DataplaneError::map(map_names::SLOTS))?;
        sets.entry(key.set_id).or_default().insert(key.index, slot);
    }

    let names = read_names(maps)?;
    let mut state = KernelState::default();
    let mut live_ids = BTreeSet::new();
    for (port, value) in entries {
        live_ids.insert(value.service_id);
        let found = if value.count == 0 { None } else { sets.remove(&value.set_id) };
        let mut slots = Vec::with_capacity(value.count as usize);
        if let Some(found) = found {
            // Take indexes 0..count in order, stopping at the first gap; extra indexes are orphans.
            let mut found = found;
            for index in 0..value.count {
                match found.remove(&index) {
                    Some(slot) => slots.push(slot),
                    None => break,
                }
            }
            state.orphan_slots.extend(found.keys().map(|&index| SlotKey { set_id: value.set_id, index }));
        }
        let name = names.get(&value.service_id).cloned().unwrap_or_default();
        state.services.insert(
            port,
            ProgrammedService { service_id: value.service_id, set_id: value.set_id, count: value.count, slots, name },
        );
    }
    for (set_id, slots) in sets {
        state.orphan_slots.extend(slots.keys().map(|&index| SlotKey { set_id, index }));
    }
    state.orphan_slots.sort();
    let mut known_ids: BTreeSet<u32> = names.keys().copied().collect();
    for id in maps.counters.keys() {
        known_ids.insert(id.map_err(DataplaneError::map(map_names::COUNTERS))?);
    }
    state.orphan_ids = known_ids.difference(&live_ids).copied().collect();
    Ok(state)
}

/// Names by service id.
fn read_names(maps: &MapSet) -> Result<BTreeMap<u32, String>, DataplaneError> {
    let mut names = BTreeMap::new();
    for item in maps.meta.iter() {
        let (id, meta) = item.map_err(DataplaneError::map(map_names::SERVICE_META))?;
        names.insert(id, name_from_meta(&meta));
    }
    Ok(names)
}

/// The counters of one service port, with what identifies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CounterReading {
    /// `namespace/name:port`.
    pub name: String,
    /// ClusterIP, port and protocol.
    pub port: ServicePort,
    /// Summed over CPUs.
    pub counters: ServiceCounters,
}

/// Every service port's counters, named: service entries give the port of each id, the names map
/// its name. Reads only the small maps, never the slots.
pub fn read_named_counters(maps: &MapSet) -> Result<Vec<CounterReading>, DataplaneError> {
    let mut ports: BTreeMap<u32, ServicePort> = BTreeMap::new();
    for item in maps.services4.iter() {
        let (key, value) = item.map_err(DataplaneError::map(map_names::SERVICES_V4))?;
        if let Some(protocol) = Protocol::from_number(key.proto) {
            ports.insert(value.service_id, ServicePort { vip: IpAddr::from(key.addr), port: key.port, protocol });
        }
    }
    for item in maps.services6.iter() {
        let (key, value) = item.map_err(DataplaneError::map(map_names::SERVICES_V6))?;
        if let Some(protocol) = Protocol::from_number(key.proto) {
            ports.insert(value.service_id, ServicePort { vip: IpAddr::from(key.addr), port: key.port, protocol });
        }
    }
    let mut names = read_names(maps)?;
    Ok(read_counters(maps)?
        .into_iter()
        .filter_map(|(id, counters)| {
            Some(CounterReading { name: names.remove(&id).unwrap_or_default(), port: *ports.get(&id)?, counters })
        })
        .collect())
}

/// Per-service counters summed over CPUs, by service id.
pub fn read_counters(maps: &MapSet) -> Result<BTreeMap<u32, ServiceCounters>, DataplaneError> {
    let mut out = BTreeMap::new();
    for item in maps.counters.iter() {
        let (id, per_cpu) = match item {
            Ok(entry) => entry,
            // Deleted between listing its key and reading it: the service is gone.
            Err(MapError::KeyNotFound) => continue,
            Err(error) => {
                return Err(DataplaneError::Map { map: map_names::COUNTERS, source: error });
            }
        };
        let mut total = ServiceCounters::default();
        for cpu in per_cpu.iter() {
            for (sum, value) in total.rewritten.iter_mut().zip(cpu.rewritten) {
                *sum += value;
            }
            total.refused += cpu.refused;
            total.errors += cpu.errors;
        }
        out.insert(id, total);
    }
    Ok(out)
}

/// The map form of a service name: UTF-8, truncated at a character boundary, zero-padded.
pub fn meta_from_name(name: &str) -> ServiceMeta {
    let mut meta = ServiceMeta::default();
    let mut end = name.len().min(meta.name.len());
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    meta.name[..end].copy_from_slice(&name.as_bytes()[..end]);
    meta
}

/// A service name read back from the map.
pub fn name_from_meta(meta: &ServiceMeta) -> String {
    let end = meta.name.iter().position(|&b| b == 0).unwrap_or(meta.name.len());
    String::from_utf8_lossy(&meta.name[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_truncate_on_char_boundaries() {
        assert_eq!(name_from_meta(&meta_from_name("default/web:http")), "default/web:http");
        let long = "é".repeat(200);
        let back = name_from_meta(&meta_from_name(&long));
        assert!(back.len() <= topology_common::SERVICE_NAME_LEN);
        assert!(back.chars().all(|c| c == 'é'));
        assert_eq!(name_from_meta(&meta_from_name("")), "");
    }
}
