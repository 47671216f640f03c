//! The per-CPU counters map: an array of per-CPU arrays ("chunks") of `COUNTER_CHUNK` service ids
//! each. The programs reach a service's counters with two inlined array accesses instead of a
//! hash walk; the agent creates a chunk when it first hands out an id in it, so kernel memory
//! follows the ids in use (`COUNTER_CHUNK × 48 B × possible CPUs` per chunk), not the capacity.

use std::collections::BTreeMap;

use aya::maps::{ArrayOfMaps, Map, MapData, MapError, PerCpuArray, PerCpuValues};
use aya_obj::generated::bpf_map_type;
use topology_common::{COUNTER_CHUNK, ServiceCounters, map_names};

use super::error::DataplaneError;

type Chunk = PerCpuArray<MapData, ServiceCounters>;

/// Kernel object name of every chunk (`bpftool map` lists them under it).
const CHUNK_NAME: &str = "topo_cnt_chunk";

/// The counters map and the chunks this process has opened or created.
pub struct Counters {
    outer: ArrayOfMaps<MapData, Chunk>,
    chunks: Vec<Option<Chunk>>,
    nr_cpus: usize,
}

/// The chunk and the index in it of a service id.
fn place(service_id: u32) -> (u32, u32) {
    (service_id / COUNTER_CHUNK, service_id % COUNTER_CHUNK)
}

/// Number of chunks (entries of the outer map) that hold `service_ids` ids.
pub fn chunks_for(service_ids: u32) -> u32 {
    service_ids.div_ceil(COUNTER_CHUNK)
}

impl Counters {
    /// Wraps the pinned or freshly created outer map.
    pub fn new(map: Map) -> Result<Self, DataplaneError> {
        let outer: ArrayOfMaps<MapData, Chunk> = map.try_into().map_err(DataplaneError::map(map_names::COUNTERS))?;
        let nr_cpus = aya::util::nr_cpus().map_err(|(path, source)| DataplaneError::Cpus { path, source })?;
        let chunks = (0..outer.len()).map(|_| None).collect();
        Ok(Self { outer, chunks, nr_cpus })
    }

    /// Zeroes the counters of `service_id`, creating its chunk first if no id in it was used yet.
    pub fn reset(&mut self, service_id: u32) -> Result<(), DataplaneError> {
        let (chunk, index) = place(service_id);
        let zero = PerCpuValues::try_from(vec![ServiceCounters::default(); self.nr_cpus])
            .map_err(|source| DataplaneError::Cpus { path: "possible CPUs", source })?;
        self.chunk(chunk)?.set(index, zero, 0).map_err(DataplaneError::map(map_names::COUNTERS))
    }

    /// The chunk at `index`: already open, else opened from the outer map, else created and
    /// published in it.
    fn chunk(&mut self, index: u32) -> Result<&mut Chunk, DataplaneError> {
        let slot = self.chunks.get_mut(index as usize).ok_or(DataplaneError::MapFull {
            map: map_names::COUNTERS,
            needed: u64::from(index + 1) * u64::from(COUNTER_CHUNK),
            capacity: self.outer.len().saturating_mul(COUNTER_CHUNK),
        })?;
        if slot.is_none() {
            let chunk = match self.outer.get(&index, 0) {
                Ok(chunk) => chunk,
                Err(MapError::KeyNotFound) => {
                    let created = create_chunk()?;
                    self.outer.set(index, &created, 0).map_err(DataplaneError::map(map_names::COUNTERS))?;
                    created
                }
                Err(error) => return Err(DataplaneError::Map { map: map_names::COUNTERS, source: error }),
            };
            *slot = Some(chunk);
        }
        Ok(slot.as_mut().expect("filled above"))
    }

    /// The counters of `ids`, summed over CPUs. Ids whose chunk does not exist read as zero.
    pub fn read(&self, ids: impl IntoIterator<Item = u32>) -> Result<BTreeMap<u32, ServiceCounters>, DataplaneError> {
        let mut by_chunk: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for id in ids {
            by_chunk.entry(place(id).0).or_default().push(id);
        }
        let mut out = BTreeMap::new();
        for (index, ids) in by_chunk {
            // Opened per read (one descriptor per chunk), so a shared reader needs no cache.
            let opened;
            let chunk = match self.chunks.get(index as usize) {
                Some(Some(chunk)) => chunk,
                _ => match self.outer.get(&index, 0) {
                    Ok(chunk) => {
                        opened = chunk;
                        &opened
                    }
                    Err(MapError::KeyNotFound | MapError::OutOfBounds { .. }) => {
                        out.extend(ids.into_iter().map(|id| (id, ServiceCounters::default())));
                        continue;
                    }
                    Err(error) => return Err(DataplaneError::Map { map: map_names::COUNTERS, source: error }),
                },
            };
            for id in ids {
                let per_cpu = chunk.get(&place(id).1, 0).map_err(DataplaneError::map(map_names::COUNTERS))?;
                out.insert(id, sum(per_cpu.iter()));
            }
        }
        Ok(out)
    }
}

/// A new, zeroed chunk with the inner layout the programs were verified against.
fn create_chunk() -> Result<Chunk, DataplaneError> {
    let definition = aya_obj::Map::new_from_params(
        bpf_map_type::BPF_MAP_TYPE_PERCPU_ARRAY as u32,
        size_of::<u32>() as u32,
        size_of::<ServiceCounters>() as u32,
        COUNTER_CHUNK,
        0,
    );
    let data = MapData::create(definition, CHUNK_NAME, None).map_err(DataplaneError::map(map_names::COUNTERS))?;
    Chunk::try_from(Map::PerCpuArray(data)).map_err(DataplaneError::map(map_names::COUNTERS))
}

/// Per-CPU values added up.
fn sum<'a>(per_cpu: impl Iterator<Item = &'a ServiceCounters>) -> ServiceCounters {
    let mut total = ServiceCounters::default();
    for cpu in per_cpu {
        for (sum, value) in total.rewritten.iter_mut().zip(cpu.rewritten) {
            *sum += value;
        }
        total.refused += cpu.refused;
        total.errors += cpu.errors;
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_map_to_chunk_and_index() {
        assert_eq!(place(0), (0, 0));
        assert_eq!(place(COUNTER_CHUNK - 1), (0, COUNTER_CHUNK - 1));
        assert_eq!(place(COUNTER_CHUNK), (1, 0));
        assert_eq!(chunks_for(COUNTER_CHUNK * 128), 128);
        assert_eq!(chunks_for(COUNTER_CHUNK * 128 + 1), 129);
    }

    #[test]
    fn per_cpu_values_add_up() {
        let a = ServiceCounters { rewritten: [1, 2, 3, 4], refused: 5, errors: 6 };
        let b = ServiceCounters { rewritten: [10, 20, 30, 40], refused: 50, errors: 60 };
        assert_eq!(sum([a, b].iter()), ServiceCounters { rewritten: [11, 22, 33, 44], refused: 55, errors: 66 });
    }
}
