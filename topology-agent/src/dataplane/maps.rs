//! Typed handles on the maps the agent reads and writes, opened from a freshly loaded object or
//! from the pins a previous agent left, and the configured capacities.

use std::path::{Path, PathBuf};

use aya::{
    Ebpf,
    maps::{Array, HashMap, IterableMap as _, Map, MapData, MapInfo},
};
use serde::{Deserialize, Serialize};
use topology_common::{
    IndexEntry4, IndexEntry6, ServiceKey4, ServiceKey6, ServiceMeta, ServiceValue, Slot, capacity, map_names,
};

use super::{counters::Counters, error::DataplaneError, index::positions_for};

/// `max_entries` of every map; an agent restarted with different capacities refuses to adopt.
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
    /// Service ids (counters and names), both families. Default 131,072.
    pub service_ids: u32,
    /// Unconnected UDP sockets' backend affinity entries (LRU). Default 65,536.
    pub affinity: u32,
    /// Unconnected UDP reply translations (LRU). Default 65,536.
    pub revnat: u32,
    /// Slots of the connected-socket translation table; a power of two. A socket's slot is reused
    /// after this many newer sockets, which bounds how long `getpeername()` shows the ClusterIP.
    /// Default 262,144.
    pub sock_translations: u32,
}

impl Default for Capacities {
    fn default() -> Self {
        Self {
            services_v4: capacity::SERVICES_V4,
            services_v6: capacity::SERVICES_V6,
            slots: capacity::SLOTS,
            service_ids: capacity::SERVICE_IDS,
            affinity: capacity::AFFINITY,
            revnat: capacity::REVNAT,
            sock_translations: capacity::SOCK_TRANSLATIONS,
        }
    }
}

impl Capacities {
    /// Checks what the kernel and the programs require: every capacity at least 1, the
    /// translation table a power of two (the programs index it with a mask).
    pub fn validate(&self) -> Result<(), String> {
        if let Some((name, _)) = self.by_map().into_iter().find(|(_, capacity)| *capacity == 0) {
            return Err(format!("capacity of {name} must be at least 1"));
        }
        for (name, services) in [(map_names::SERVICES_V4, self.services_v4), (map_names::SERVICES_V6, self.services_v6)]
        {
            if services > 1 << 30 {
                return Err(format!("capacity of {name} must be at most 2^30, not {services}"));
            }
        }
        if !self.sock_translations.is_power_of_two() {
            return Err(format!(
                "capacity of {} must be a power of two, not {}",
                map_names::SOCK_TRANSLATIONS,
                self.sock_translations
            ));
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
            (map_names::AFFINITY, self.affinity),
            (map_names::REVNAT, self.revnat),
            (map_names::SOCK_TRANSLATIONS, self.sock_translations),
        ]
    }
}

/// Layout of a pin directory.
#[derive(Clone, Debug)]
pub struct PinLayout {
    root: PathBuf,
}

impl PinLayout {
    /// The layout under `root` (e.g. `/sys/fs/bpf/topology`).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The pin directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory of the pinned maps.
    pub fn maps_dir(&self) -> PathBuf {
        self.root.join("maps")
    }

    /// Directory of the pinned links.
    pub fn links_dir(&self) -> PathBuf {
        self.root.join("links")
    }

    /// Pin path of a map.
    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }

    /// Pin path of the link of a program.
    pub fn link(&self, program: &str) -> PathBuf {
        self.links_dir().join(program)
    }
}

/// The maps that hold the programmed state.
pub struct MapSet {
    /// IPv4 service ports.
    pub services4: HashMap<MapData, ServiceKey4, ServiceValue>,
    /// IPv6 service ports.
    pub services6: HashMap<MapData, ServiceKey6, ServiceValue>,
    /// IPv4 service index.
    pub index4: Array<MapData, IndexEntry4>,
    /// IPv6 service index.
    pub index6: Array<MapData, IndexEntry6>,
    /// Backend slots, one run per set.
    pub slots: Array<MapData, Slot>,
    /// Per-CPU counters by service id, in chunks.
    pub counters: Counters,
    /// Names by service id.
    pub meta: HashMap<MapData, u32, ServiceMeta>,
    /// Capacities as the kernel reports them.
    pub capacities: Capacities,
}

impl MapSet {
    /// Takes the maps out of a loaded object.
    pub fn from_ebpf(ebpf: &mut Ebpf) -> Result<Self, DataplaneError> {
        let mut take = |name: &'static str| {
            ebpf.take_map(name).ok_or(DataplaneError::MapMissing { map: name, location: "the eBPF object".into() })
        };
        let maps = [
            take(map_names::SERVICES_V4)?,
            take(map_names::SERVICES_V6)?,
            take(map_names::SLOTS)?,
            take(map_names::COUNTERS)?,
            take(map_names::SERVICE_META)?,
            take(map_names::INDEX_V4)?,
            take(map_names::INDEX_V6)?,
        ];
        Self::from_maps(maps)
    }

    /// Opens the maps pinned under `layout`.
    pub fn from_pins(layout: &PinLayout) -> Result<Self, DataplaneError> {
        let open = |name: &'static str| -> Result<Map, DataplaneError> {
            let path = layout.map(name);
            if !path.exists() {
                return Err(DataplaneError::MapMissing {
                    map: name,
                    location: layout.maps_dir().display().to_string(),
                });
            }
            let data = MapData::from_pin(&path).map_err(DataplaneError::map(name))?;
            Map::from_map_data(data).map_err(DataplaneError::map(name))
        };
        Self::from_maps([
            open(map_names::SERVICES_V4)?,
            open(map_names::SERVICES_V6)?,
            open(map_names::SLOTS)?,
            open(map_names::COUNTERS)?,
            open(map_names::SERVICE_META)?,
            open(map_names::INDEX_V4)?,
            open(map_names::INDEX_V6)?,
        ])
    }

    fn from_maps(
        [services4, services6, slots, counters, meta, index4, index6]: [Map; 7],
    ) -> Result<Self, DataplaneError> {
        let services4: HashMap<_, ServiceKey4, ServiceValue> =
            services4.try_into().map_err(DataplaneError::map(map_names::SERVICES_V4))?;
        let services6: HashMap<_, ServiceKey6, ServiceValue> =
            services6.try_into().map_err(DataplaneError::map(map_names::SERVICES_V6))?;
        let slots: Array<_, Slot> = slots.try_into().map_err(DataplaneError::map(map_names::SLOTS))?;
        let index4: Array<_, IndexEntry4> = index4.try_into().map_err(DataplaneError::map(map_names::INDEX_V4))?;
        let index6: Array<_, IndexEntry6> = index6.try_into().map_err(DataplaneError::map(map_names::INDEX_V6))?;
        let counters = Counters::new(counters)?;
        let meta: HashMap<_, u32, ServiceMeta> =
            meta.try_into().map_err(DataplaneError::map(map_names::SERVICE_META))?;
        let max_entries = |data: &MapData, name: &'static str| -> Result<u32, DataplaneError> {
            Ok(data.info().map_err(DataplaneError::map(name))?.max_entries())
        };
        let ids = max_entries(meta.map(), map_names::SERVICE_META)?;
        let capacities = Capacities {
            services_v4: max_entries(services4.map(), map_names::SERVICES_V4)?,
            services_v6: max_entries(services6.map(), map_names::SERVICES_V6)?,
            slots: max_entries(slots.map(), map_names::SLOTS)?,
            service_ids: ids,
            // The LRU maps are not opened here; their capacities are checked at load.
            affinity: 0,
            revnat: 0,
            sock_translations: 0,
        };
        Ok(Self { services4, services6, index4, index6, slots, counters, meta, capacities })
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
        let odd = Capacities { sock_translations: 100_000, ..Capacities::default() };
        assert_eq!(odd.validate().unwrap_err(), "capacity of topo_sock_xlate must be a power of two, not 100000");
        let zero = Capacities { slots: 0, ..Capacities::default() };
        assert_eq!(zero.validate().unwrap_err(), "capacity of topo_slots must be at least 1");
    }
}
