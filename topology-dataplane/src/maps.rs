//! Typed handles on the maps the agent reads and writes, opened from a freshly loaded object or
//! from the pins a previous agent left, and the configured capacities.

use std::path::Path;

use aya::{
    Ebpf,
    maps::{Array, HashMap, IterableMap as _, Map, MapData, MapInfo, PerCpuArray},
};
use serde::{Deserialize, Serialize};
use topology_common::{
    Heartbeat, IndexEntry4, IndexEntry6, NodeCounters, ServiceKey4, ServiceKey6, ServiceMeta, ServiceOptions,
    ServiceRanges, ServiceValue, Slot, capacity, map_names,
};

use super::{counters::CounterChunks, error::DataplaneError, index::positions_for, mmap::MappedArray};

/// `max_entries` of every map with a configurable size; an agent restarted with different
/// capacities refuses to adopt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Capacities {
    /// IPv4 service ports. Default 65,536; at most 2^30. The IPv4 service index has twice this
    /// many positions, rounded up to a power of two.
    pub services_v4: u32,
    /// IPv6 service ports. Default 65,536; the IPv6 index is sized the same way.
    pub services_v6: u32,
    /// Backend slots across all service ports, plus room for one set being swapped. Default 262,144.
    pub slots: u32,
    /// Service ids (counters, names and options), both families. Default 131,072.
    pub service_ids: u32,
    /// Clients remembered for `sessionAffinity: ClientIP` (LRU). Default 65,536.
    pub client_affinity: u32,
    /// Positions of the TCP connections table, which translates them back for `getpeername()`
    /// (direct-mapped by socket cookie, allocated at load; a power of two). Default 131,072.
    #[serde(default = "default_tcp_connections")]
    pub tcp_connections: u32,
}

fn default_tcp_connections() -> u32 {
    capacity::TCP_CONNECTIONS
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            services_v4: capacity::SERVICES_V4,
            services_v6: capacity::SERVICES_V6,
            slots: capacity::SLOTS,
            service_ids: capacity::SERVICE_IDS,
            client_affinity: capacity::CLIENT_AFFINITY,
            tcp_connections: capacity::TCP_CONNECTIONS,
        }
    }
}

impl Capacities {
    /// Checks what the kernel and the programs require: every capacity at least 1, services at
    /// most 2^30 (the index doubles them into a power of two).
    pub fn validate(&self) -> Result<(), DataplaneError> {
        if let Some((map, _)) = self.by_map().into_iter().find(|(_, capacity)| *capacity == 0) {
            return Err(DataplaneError::Capacity { map, reason: "must be at least 1".into() });
        }
        if !self.tcp_connections.is_power_of_two() {
            return Err(DataplaneError::Capacity {
                map: map_names::TCP_CONNECTIONS,
                reason: format!("must be a power of two (positions by socket cookie), not {}", self.tcp_connections),
            });
        }
        for (map, services) in [(map_names::SERVICES_V4, self.services_v4), (map_names::SERVICES_V6, self.services_v6)]
        {
            if services > 1 << 30 {
                return Err(DataplaneError::Capacity { map, reason: format!("must be at most 2^30, not {services}") });
            }
        }
        Ok(())
    }

    /// `(map name, max_entries)` for every map with a configurable capacity.
    pub fn by_map(&self) -> [(&'static str, u32); 10] {
        [
            (map_names::INDEX_V4, positions_for(self.services_v4)),
            (map_names::INDEX_V6, positions_for(self.services_v6)),
            (map_names::SERVICES_V4, self.services_v4),
            (map_names::SERVICES_V6, self.services_v6),
            (map_names::SLOTS, self.slots),
            (map_names::COUNTERS, super::counters::chunks_for(self.service_ids)),
            (map_names::SERVICE_META, self.service_ids),
            (map_names::SERVICE_OPTIONS, self.service_ids),
            (map_names::CLIENT_AFFINITY, self.client_affinity),
            (map_names::TCP_CONNECTIONS, self.tcp_connections),
        ]
    }

    /// These capacities with `overrides` applied, in order.
    pub fn with_overrides(mut self, overrides: &[CapacityOverride]) -> Self {
        for CapacityOverride { map, entries } in overrides {
            if let Some(slot) = self.entry_mut(map) {
                *slot = *entries;
            }
        }
        self
    }

    /// The capacity of `map` as a `--capacity MAP=ENTRIES` override names it.
    pub fn entry_mut(&mut self, map: &str) -> Option<&mut u32> {
        Some(match map {
            map_names::SERVICES_V4 => &mut self.services_v4,
            map_names::SERVICES_V6 => &mut self.services_v6,
            map_names::SLOTS => &mut self.slots,
            map_names::COUNTERS | map_names::SERVICE_META | map_names::SERVICE_OPTIONS => &mut self.service_ids,
            map_names::CLIENT_AFFINITY => &mut self.client_affinity,
            map_names::TCP_CONNECTIONS => &mut self.tcp_connections,
            _ => return None,
        })
    }
}

/// The maps whose capacity an override may name.
const SIZED: [&str; 8] = [
    map_names::SERVICES_V4,
    map_names::SERVICES_V6,
    map_names::SLOTS,
    map_names::COUNTERS,
    map_names::SERVICE_META,
    map_names::SERVICE_OPTIONS,
    map_names::CLIENT_AFFINITY,
    map_names::TCP_CONNECTIONS,
];

/// One `--capacity MAP=ENTRIES` override: a map with a configurable size (the service-id maps
/// share one), and its entries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityOverride {
    map: String,
    entries: u32,
}

impl std::str::FromStr for CapacityOverride {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (map, entries) = text.split_once('=').ok_or_else(|| format!("{text:?}: expected MAP=ENTRIES"))?;
        if !SIZED.contains(&map) {
            return Err(format!("{map:?} is no map with a configurable size ({})", SIZED.join(", ")));
        }
        let entries = entries.parse().map_err(|error| format!("{map}={entries:?}: the entries: {error}"))?;
        Ok(Self { map: map.to_owned(), entries })
    }
}

use super::layout::PinLayout;

/// The maps that hold the programmed state.
pub struct MapSet {
    /// IPv4 service ports.
    pub services4: HashMap<MapData, ServiceKey4, ServiceValue>,
    /// IPv6 service ports.
    pub services6: HashMap<MapData, ServiceKey6, ServiceValue>,
    /// IPv4 service index, mapped.
    pub index4: MappedArray<IndexEntry4>,
    /// IPv6 service index, mapped.
    pub index6: MappedArray<IndexEntry6>,
    /// Backend slots, one run per set.
    pub slots: Array<MapData, Slot>,
    /// Per-CPU counters by service id, in chunks.
    pub counters: CounterChunks,
    /// Names by service id.
    pub meta: HashMap<MapData, u32, ServiceMeta>,
    /// Options by service id.
    pub options: Array<MapData, ServiceOptions>,
    /// The agent's heartbeat.
    pub heartbeat: Array<MapData, Heartbeat>,
    /// Where the service ports are.
    pub ranges: Array<MapData, ServiceRanges>,
    /// Counters of the whole node.
    pub node_counters: PerCpuArray<MapData, NodeCounters>,
    /// What the load signal measured per backend.
    pub backend_load: super::backend_load::LoadMap,
    /// Capacities as the kernel reports them.
    pub capacities: Capacities,
    /// Batched updates the kernel refused, redone entry by entry (a kernel without
    /// `BPF_MAP_UPDATE_BATCH`, or a failing entry).
    pub batch_refusals: u64,
}

/// The maps of a [`MapSet`], in the order `MapSet::from_maps` takes them.
const SET: [&str; 14] = [
    map_names::SERVICES_V4,
    map_names::SERVICES_V6,
    map_names::SLOTS,
    map_names::COUNTERS,
    map_names::SERVICE_META,
    map_names::INDEX_V4,
    map_names::INDEX_V6,
    map_names::SERVICE_OPTIONS,
    map_names::HEARTBEAT,
    map_names::NODE_COUNTERS,
    map_names::CLIENT_AFFINITY,
    map_names::BACKEND_LOAD,
    map_names::TCP_CONNECTIONS,
    map_names::SERVICE_RANGES,
];

impl MapSet {
    /// Takes the maps out of a loaded object.
    pub fn from_ebpf(ebpf: &mut Ebpf, layout: &PinLayout) -> Result<Self, DataplaneError> {
        let mut maps = Vec::with_capacity(SET.len());
        for name in SET {
            maps.push(
                ebpf.take_map(name)
                    .ok_or(DataplaneError::MapMissing { map: name, location: "the eBPF object".into() })?,
            );
        }
        Self::from_maps(maps, layout)
    }

    /// Opens the maps pinned under `layout`.
    pub fn from_pins(layout: &PinLayout) -> Result<Self, DataplaneError> {
        let maps = SET.into_iter().map(|name| layout.open_map(name)).collect::<Result<Vec<_>, _>>()?;
        Self::from_maps(maps, layout)
    }

    fn from_maps(maps: Vec<Map>, layout: &PinLayout) -> Result<Self, DataplaneError> {
        let [
            services4,
            services6,
            slots,
            counters,
            meta,
            index4,
            index6,
            options,
            heartbeat,
            node,
            affinity,
            load,
            tcp,
            ranges,
        ]: [Map; 14] =
            maps.try_into().map_err(|_| DataplaneError::MapMissing { map: "?", location: "the map set".into() })?;
        let services4: HashMap<_, ServiceKey4, ServiceValue> =
            services4.try_into().map_err(DataplaneError::map(map_names::SERVICES_V4))?;
        let services6: HashMap<_, ServiceKey6, ServiceValue> =
            services6.try_into().map_err(DataplaneError::map(map_names::SERVICES_V6))?;
        let slots: Array<_, Slot> = slots.try_into().map_err(DataplaneError::map(map_names::SLOTS))?;
        let index4 = MappedArray::new(map_data(index4, map_names::INDEX_V4)?, map_names::INDEX_V4)?;
        let index6 = MappedArray::new(map_data(index6, map_names::INDEX_V6)?, map_names::INDEX_V6)?;
        let counters = CounterChunks::new(counters, layout)?;
        let meta: HashMap<_, u32, ServiceMeta> =
            meta.try_into().map_err(DataplaneError::map(map_names::SERVICE_META))?;
        let options: Array<_, ServiceOptions> =
            options.try_into().map_err(DataplaneError::map(map_names::SERVICE_OPTIONS))?;
        let heartbeat: Array<_, Heartbeat> = heartbeat.try_into().map_err(DataplaneError::map(map_names::HEARTBEAT))?;
        let ranges: Array<_, ServiceRanges> =
            ranges.try_into().map_err(DataplaneError::map(map_names::SERVICE_RANGES))?;
        let node_counters: PerCpuArray<_, NodeCounters> =
            node.try_into().map_err(DataplaneError::map(map_names::NODE_COUNTERS))?;
        let max_entries = |data: &MapData, name: &'static str| -> Result<u32, DataplaneError> {
            Ok(data.info().map_err(DataplaneError::map(name))?.max_entries())
        };
        let affinity = map_data(affinity, map_names::CLIENT_AFFINITY)?;
        let tcp = map_data(tcp, map_names::TCP_CONNECTIONS)?;
        let backend_load = load.try_into().map_err(DataplaneError::map(map_names::BACKEND_LOAD))?;
        let capacities = Capacities {
            services_v4: max_entries(services4.map(), map_names::SERVICES_V4)?,
            services_v6: max_entries(services6.map(), map_names::SERVICES_V6)?,
            slots: max_entries(slots.map(), map_names::SLOTS)?,
            service_ids: max_entries(meta.map(), map_names::SERVICE_META)?,
            client_affinity: max_entries(&affinity, map_names::CLIENT_AFFINITY)?,
            tcp_connections: max_entries(&tcp, map_names::TCP_CONNECTIONS)?,
        };
        Ok(Self {
            services4,
            services6,
            index4,
            index6,
            slots,
            counters,
            meta,
            options,
            heartbeat,
            ranges,
            node_counters,
            backend_load,
            capacities,
            batch_refusals: 0,
        })
    }
}

/// What a reader of the counters opens (the metrics endpoint, beside the controller's dataplane):
/// no slots, and no index mapped, whose megabytes a second mapping would count twice in the
/// agent's resident size.
pub struct CounterMaps {
    /// IPv4 service entries: the port of each id.
    pub services4: HashMap<MapData, ServiceKey4, ServiceValue>,
    /// IPv6 service entries.
    pub services6: HashMap<MapData, ServiceKey6, ServiceValue>,
    /// Names by service id.
    pub meta: HashMap<MapData, u32, ServiceMeta>,
    /// Per-CPU counters by service id.
    pub counters: CounterChunks,
    /// The agent's heartbeat.
    pub heartbeat: Array<MapData, Heartbeat>,
    /// Counters of the whole node.
    pub node_counters: PerCpuArray<MapData, NodeCounters>,
    /// What the load signal measured per backend.
    pub backend_load: super::backend_load::LoadMap,
    /// Failures and ejections per backend.
    pub outliers: super::outliers::OutlierMap,
}

impl CounterMaps {
    /// Opens them from their pins under `layout`.
    pub fn from_pins(layout: &PinLayout) -> Result<Self, DataplaneError> {
        let open = |name| layout.open_map(name);
        Ok(Self {
            services4: open(map_names::SERVICES_V4)?.try_into().map_err(DataplaneError::map(map_names::SERVICES_V4))?,
            services6: open(map_names::SERVICES_V6)?.try_into().map_err(DataplaneError::map(map_names::SERVICES_V6))?,
            meta: open(map_names::SERVICE_META)?.try_into().map_err(DataplaneError::map(map_names::SERVICE_META))?,
            counters: CounterChunks::new(open(map_names::COUNTERS)?, layout)?,
            heartbeat: open(map_names::HEARTBEAT)?.try_into().map_err(DataplaneError::map(map_names::HEARTBEAT))?,
            node_counters: open(map_names::NODE_COUNTERS)?
                .try_into()
                .map_err(DataplaneError::map(map_names::NODE_COUNTERS))?,
            backend_load: open(map_names::BACKEND_LOAD)?
                .try_into()
                .map_err(DataplaneError::map(map_names::BACKEND_LOAD))?,
            outliers: open(map_names::OUTLIERS)?.try_into().map_err(DataplaneError::map(map_names::OUTLIERS))?,
        })
    }
}

/// The map data under an array or LRU hash map (the kinds this set opens without a typed handle).
fn map_data(map: Map, name: &'static str) -> Result<MapData, DataplaneError> {
    match map {
        Map::Array(data) | Map::LruHashMap(data) => Ok(data),
        _ => Err(DataplaneError::map(name)(aya::maps::MapError::InvalidMapType { map_type: u32::MAX })),
    }
}

/// What the kernel says about the map pinned at `path`, if it exists.
pub fn pinned_info(path: &Path, name: &'static str) -> Result<Option<MapInfo>, DataplaneError> {
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(path).map_err(DataplaneError::map(name))?;
    Ok(Some(data.info().map_err(DataplaneError::map(name))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_are_validated() {
        assert!(Capacities::default().validate().is_ok());
        let zero = Capacities { slots: 0, ..Capacities::default() };
        assert_eq!(zero.validate().unwrap_err().to_string(), "capacity of map topo_slots must be at least 1");
        let huge = Capacities { services_v6: (1 << 30) + 1, ..Capacities::default() };
        assert_eq!(
            huge.validate().unwrap_err().to_string(),
            "capacity of map topo_svc6 must be at most 2^30, not 1073741825"
        );
    }

    #[test]
    fn overrides_parse_name_what_is_wrong_and_apply_in_order() {
        let parsed = |text: &str| text.parse::<CapacityOverride>();
        let overrides = [
            parsed("topo_slots=1024").unwrap(),
            parsed("topo_svc_meta=64").unwrap(),
            parsed("topo_slots=2048").unwrap(),
        ];
        let capacities = Capacities::default().with_overrides(&overrides);
        assert_eq!((capacities.slots, capacities.service_ids), (2048, 64), "the service-id maps share one");
        assert_eq!(capacities.services_v4, Capacities::default().services_v4);
        assert_eq!(parsed("topo_slots").unwrap_err(), "\"topo_slots\": expected MAP=ENTRIES");
        assert!(
            parsed("topo_heartbeat=1")
                .unwrap_err()
                .starts_with("\"topo_heartbeat\" is no map with a configurable size")
        );
        assert!(parsed("topo_slots=-1").unwrap_err().starts_with("topo_slots=\"-1\": the entries: "));
        for map in SIZED {
            assert!(Capacities::default().entry_mut(map).is_some(), "{map} has a capacity to override");
        }
    }

    #[test]
    fn every_configurable_map_has_an_override_name() {
        let mut capacities = Capacities::default();
        for (map, _) in Capacities::default().by_map() {
            if map != map_names::INDEX_V4 && map != map_names::INDEX_V6 {
                assert!(capacities.entry_mut(map).is_some(), "{map}");
            }
        }
        assert!(capacities.entry_mut("topo_sock_xlate").is_none());
    }
}
