//! What the kernel holds now, read back from the maps: the agent's mirror after adoption, and
//! what `status` prints.

use std::collections::{BTreeMap, BTreeSet};

use aya::maps::IterableMap as _;
use topology_common::{ServiceCounters, ServiceMeta, ServiceOptions, ServiceValue, Slot, map_names};
use topology_policy::{
    desired::{PortOptions, ServicePort, WeightedBackend},
    plan::alias,
};

use super::{
    error::DataplaneError,
    maps::{CounterMaps, MapSet},
    ops::ServiceKey,
};

/// One service port as the kernel holds it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgrammedService {
    /// Stable id: key of the counters and names.
    pub service_id: u32,
    /// Current backend-set generation (0 for an empty set).
    pub set_id: u32,
    /// Slot count in the service entry; 0 means connections are refused.
    pub count: u32,
    /// Index of the set's first slot in the slots array.
    pub base: u32,
    /// The set's slots, in order, with `set_id` cleared (the set's content). Only those found
    /// tagged with `set_id` from `base` on: fewer than `count` means the set is damaged.
    pub slots: Vec<Slot>,
    /// `namespace/name:port`.
    pub name: String,
    /// Session affinity and exemptions.
    pub options: PortOptions,
}

impl ProgrammedService {
    /// The mirror of a service entry, with the slots found for (or written to) its set.
    pub fn new(value: &ServiceValue, slots: Vec<Slot>, name: String, options: PortOptions) -> Self {
        Self {
            service_id: value.service_id,
            set_id: value.set_id,
            count: value.count,
            base: value.base,
            slots,
            name,
            options,
        }
    }

    /// The service entry this mirrors.
    pub fn value(&self) -> ServiceValue {
        ServiceValue { service_id: self.service_id, set_id: self.set_id, count: self.count, base: self.base }
    }

    /// True when every slot the service entry refers to is present.
    pub fn intact(&self) -> bool {
        self.slots.len() == self.count as usize
    }

    /// The backends and their effective weights (parts per million of traffic).
    pub fn backends(&self, ipv4: bool) -> Vec<WeightedBackend> {
        alias::drawn(&self.slots, ipv4)
    }
}

/// The programmed state of every service port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelState {
    /// Service ports by (ClusterIP, port, protocol).
    pub services: BTreeMap<ServicePort, ProgrammedService>,
    /// Service ids with a name but no service entry (a removal that could not finish).
    pub orphan_ids: BTreeSet<u32>,
}

impl KernelState {
    /// Removes from `backends` every one that some programmed set holds.
    pub fn keep_unused(&self, backends: &mut BTreeSet<std::net::SocketAddr>) {
        for (port, service) in &self.services {
            if backends.is_empty() {
                return;
            }
            for slot in &service.slots {
                for backend in [&slot.primary, &slot.alias] {
                    let ip = if port.vip.is_ipv4() {
                        let [a, b, c, d, ..] = backend.addr;
                        std::net::IpAddr::from([a, b, c, d])
                    } else {
                        std::net::IpAddr::from(backend.addr)
                    };
                    backends.remove(&std::net::SocketAddr::new(ip, backend.port));
                }
            }
        }
    }

    /// Number of slots the service entries refer to.
    pub fn slot_entries(&self) -> u64 {
        self.services.values().map(|s| u64::from(s.count)).sum()
    }
}

/// Reads the programmed state from the maps.
pub fn read(maps: &MapSet) -> Result<KernelState, DataplaneError> {
    let entries = service_entries(&maps.services4, &maps.services6)?;
    let names = read_names(&maps.meta)?;
    let mut state = KernelState::default();
    let mut live_ids = BTreeSet::new();
    let runs = SlotRuns::read(maps, entries.iter().map(|(_, value)| value));
    let options = OptionsTable::read(maps, entries.iter().map(|(_, value)| value.service_id));
    for (port, value) in entries {
        live_ids.insert(value.service_id);
        let slots = set_slots(&value, maps.capacities.slots, |index| match runs.get(index) {
            Some(slot) => Ok(slot),
            None => maps.slots.get(&index, 0).map_err(DataplaneError::map(map_names::SLOTS)),
        })?;
        let name = names.get(&value.service_id).cloned().unwrap_or_default();
        let options = match options.get(value.service_id) {
            Some(options) => PortOptions::from_kernel(&options),
            None => read_options(maps, value.service_id)?,
        };
        state.services.insert(port, ProgrammedService::new(&value, slots, name, options));
    }
    // Counter entries have no keys to list (an array); only names mark an id as taken.
    state.orphan_ids = names.keys().copied().filter(|id| !live_ids.contains(id)).collect();
    Ok(state)
}

/// The slots every service entry refers to, read in a few batched lookups: the entries' runs,
/// merged where they touch. Empty when the kernel has no batched lookup (the reader then asks
/// slot by slot).
struct SlotRuns {
    /// (first index, slots from it), sorted, disjoint.
    spans: Vec<(u32, Vec<Slot>)>,
}

impl SlotRuns {
    fn read<'a>(maps: &MapSet, values: impl Iterator<Item = &'a ServiceValue>) -> Self {
        let merged = spans_of(values, maps.capacities.slots);
        let mut spans = Vec::with_capacity(merged.len());
        for (start, end) in merged {
            match super::batch::lookup_array::<Slot>(maps.slots.map(), start, end - start) {
                Ok(slots) => spans.push((start, slots)),
                Err(_) => return Self { spans: Vec::new() },
            }
        }
        Self { spans }
    }

    fn get(&self, index: u32) -> Option<Slot> {
        let at = self.spans.partition_point(|(start, _)| *start <= index).checked_sub(1)?;
        let (start, slots) = &self.spans[at];
        slots.get((index - start) as usize).copied()
    }
}

/// The slot ranges `start..end` the entries refer to, clamped to the array of `capacity` slots,
/// sorted and merged where they overlap or touch (whatever the entries say: they come from a map).
fn spans_of<'a>(values: impl Iterator<Item = &'a ServiceValue>, capacity: u32) -> Vec<(u32, u32)> {
    let mut runs: Vec<(u32, u32)> = values
        .filter(|v| v.count > 0 && v.base < capacity)
        .map(|v| (v.base, v.base.saturating_add(v.count).min(capacity)))
        .collect();
    runs.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::new();
    for (start, end) in runs {
        match merged.last_mut() {
            Some(last) if start <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((start, end)),
        }
    }
    merged
}

/// The options of every service id up to the largest in use, in a few batched lookups (empty
/// when the kernel has none).
struct OptionsTable(Vec<ServiceOptions>);

impl OptionsTable {
    fn read(maps: &MapSet, ids: impl Iterator<Item = u32>) -> Self {
        let Some(largest) = ids.max() else { return Self(Vec::new()) };
        let count = largest.saturating_add(1).min(maps.capacities.service_ids);
        Self(super::batch::lookup_array(maps.options.map(), 0, count).unwrap_or_default())
    }

    fn get(&self, id: u32) -> Option<ServiceOptions> {
        self.0.get(id as usize).copied()
    }
}

/// [`read_set`] over any slot array of `capacity` entries: whatever a service entry says (it is
/// read from a map and may be anything), no slot beyond the array is read and nothing is sized by it.
pub fn set_slots<E>(
    value: &ServiceValue,
    capacity: u32,
    mut slot: impl FnMut(u32) -> Result<Slot, E>,
) -> Result<Vec<Slot>, E> {
    let mut slots = Vec::with_capacity(value.count.min(capacity).min(4096) as usize);
    for offset in 0..value.count {
        let Some(index) = value.base.checked_add(offset).filter(|&index| index < capacity) else {
            break;
        };
        let read = slot(index)?;
        if read.set_id != value.set_id {
            break;
        }
        slots.push(Slot { set_id: 0, ..read });
    }
    Ok(slots)
}

/// The options of a service id; ids beyond the options map have none.
fn read_options(maps: &MapSet, service_id: u32) -> Result<PortOptions, DataplaneError> {
    match maps.options.get(&service_id, 0) {
        Ok(options) => Ok(PortOptions::from_kernel(&options)),
        Err(aya::maps::MapError::OutOfBounds { .. }) => Ok(PortOptions::default()),
        Err(source) => Err(DataplaneError::Map { map: map_names::SERVICE_OPTIONS, source }),
    }
}

/// Names by service id.
fn read_names(meta: &ServiceNames) -> Result<BTreeMap<u32, String>, DataplaneError> {
    if let Ok(batched) = super::batch::lookup_hash::<u32, ServiceMeta>(meta.map()) {
        return Ok(batched.iter().map(|(id, meta)| (*id, name_from_meta(meta))).collect());
    }
    let mut names = BTreeMap::new();
    for item in meta.iter() {
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

/// The counters of every service port this node's clients have used (a counter above zero),
/// named: service entries give the port of each id, the names map its name. A port never used
/// has nothing to say, and at 10,000 Services its series would be most of a scrape. Reads only
/// the small maps, never the slots.
pub fn read_named_counters(maps: &CounterMaps) -> Result<Vec<CounterReading>, DataplaneError> {
    let ports = service_ports(&maps.services4, &maps.services6)?;
    let used: Vec<(u32, ServiceCounters)> = maps
        .counters
        .read(ports.keys().copied())?
        .into_iter()
        .filter(|(_, counters)| *counters != ServiceCounters::default())
        .collect();
    if used.is_empty() {
        return Ok(Vec::new());
    }
    let mut names = read_names(&maps.meta)?;
    Ok(used
        .into_iter()
        .filter_map(|(id, counters)| {
            Some(CounterReading { name: names.remove(&id).unwrap_or_default(), port: *ports.get(&id)?, counters })
        })
        .collect())
}

/// Per-service counters summed over CPUs, by the service id of every service entry.
pub fn read_counters(maps: &MapSet) -> Result<BTreeMap<u32, ServiceCounters>, DataplaneError> {
    maps.counters.read(service_ports(&maps.services4, &maps.services6)?.into_keys())
}

/// The service port of every service id in the service entries `maps` hold.
pub fn service_ports_of(maps: &CounterMaps) -> Result<BTreeMap<u32, ServicePort>, DataplaneError> {
    service_ports(&maps.services4, &maps.services6)
}

type Services<K> = aya::maps::HashMap<aya::maps::MapData, K, ServiceValue>;
type ServiceNames = aya::maps::HashMap<aya::maps::MapData, u32, ServiceMeta>;

/// The service port of every service id in the service entries.
fn service_ports(
    v4: &Services<topology_common::ServiceKey4>,
    v6: &Services<topology_common::ServiceKey6>,
) -> Result<BTreeMap<u32, ServicePort>, DataplaneError> {
    Ok(service_entries(v4, v6)?.into_iter().map(|(port, value)| (value.service_id, port)).collect())
}

/// Every service entry of both families (keys with an unknown protocol number are skipped).
fn service_entries(
    v4: &Services<topology_common::ServiceKey4>,
    v6: &Services<topology_common::ServiceKey6>,
) -> Result<Vec<(ServicePort, ServiceValue)>, DataplaneError> {
    let mut entries = entries_of(v4, map_names::SERVICES_V4, ServiceKey::V4)?;
    entries.extend(entries_of(v6, map_names::SERVICES_V6, ServiceKey::V6)?);
    Ok(entries)
}

/// The entries of one service map with a port: batched, else entry by entry.
fn entries_of<K: aya::Pod + Default>(
    map: &Services<K>,
    name: &'static str,
    key: fn(K) -> ServiceKey,
) -> Result<Vec<(ServicePort, ServiceValue)>, DataplaneError> {
    let all = match super::batch::lookup_hash::<K, ServiceValue>(aya::maps::IterableMap::map(map)) {
        Ok(batched) => batched,
        Err(error) => {
            tracing::debug!(map = name, %error, "no batched lookup; reading entry by entry");
            map.iter().collect::<Result<_, _>>().map_err(DataplaneError::map(name))?
        }
    };
    Ok(all.into_iter().filter_map(|(k, value)| Some((key(k).port()?, value))).collect())
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
    fn slot_spans_merge_touching_runs_and_stay_inside_the_array() {
        let entry = |base, count| ServiceValue { service_id: 0, set_id: 1, count, base };
        let values =
            [entry(10, 5), entry(0, 4), entry(4, 2), entry(12, 10), entry(40, 0), entry(95, 10), entry(200, 3)];
        assert_eq!(spans_of(values.iter(), 100), [(0, 6), (10, 22), (95, 100)]);
        assert_eq!(spans_of([entry(u32::MAX - 1, 5)].iter(), u32::MAX), [(u32::MAX - 1, u32::MAX)]);
        assert!(spans_of([].iter(), 100).is_empty());
    }

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
