//! The per-CPU counters map: an array of per-CPU arrays ("chunks") of `COUNTER_CHUNK` service ids
//! each. The programs reach a service's counters with two inlined array accesses instead of a
//! hash walk; the agent creates a chunk when it first hands out an id in it, so kernel memory
//! follows the ids in use (`COUNTER_CHUNK × 48 B × possible CPUs` per chunk), not the capacity.
//!
//! Each chunk is also pinned (`maps/topo_cnt_chunk_<n>`), so readers open it by path: looking an
//! inner map up by id would need `CAP_SYS_ADMIN`. Updating an entry of the outer map is also how
//! the agent waits for an RCU grace period (see [`super::grace`]).

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsFd as _, AsRawFd as _, OwnedFd},
    path::PathBuf,
};

use aya::maps::{ArrayOfMaps, Map, MapData, MapError, PerCpuArray, PerCpuValues};
use aya_obj::generated::bpf_map_type;
use topology_common::{COUNTER_CHUNK, ServiceCounters, map_names};

use super::{
    batch,
    error::DataplaneError,
    grace::{Background, Clock, Epochs, Grace},
    layout::PinLayout,
    typed_chunk,
};

type Chunk = PerCpuArray<MapData, ServiceCounters>;

/// The counters map and the chunks this process has opened or created.
pub struct CounterChunks {
    outer: ArrayOfMaps<MapData, Chunk>,
    /// The outer map again, for batched updates (aya keeps `outer`'s descriptor to itself).
    outer_fd: OwnedFd,
    chunks: Vec<Option<Chunk>>,
    /// Per chunk this process created: a bit per id not reset since, still zero as the kernel
    /// made it (so the first reset of each costs no system call: a full sync creates its ids).
    untouched: Vec<Option<Box<[u64]>>>,
    nr_cpus: usize,
    layout: PinLayout,
    /// The grace periods waited for here and in the background.
    clock: Clock,
    /// The thread that waits for them in the background, once first asked.
    background: Option<Background>,
}

/// The chunk and the index in it of a service id.
fn place(service_id: u32) -> (u32, u32) {
    (service_id / COUNTER_CHUNK, service_id % COUNTER_CHUNK)
}

/// Number of chunks (entries of the outer map) that hold `service_ids` ids.
pub fn chunks_for(service_ids: u32) -> u32 {
    service_ids.div_ceil(COUNTER_CHUNK)
}

impl CounterChunks {
    /// Wraps the pinned or freshly created outer map; chunks are pinned under `layout`.
    pub fn new(map: Map, layout: &PinLayout) -> Result<Self, DataplaneError> {
        let outer_fd = match &map {
            Map::ArrayOfMaps(data) => Some(data.fd().as_fd().try_clone_to_owned()),
            _ => None,
        };
        let outer: ArrayOfMaps<MapData, Chunk> = map.try_into().map_err(DataplaneError::map(map_names::COUNTERS))?;
        let outer_fd = outer_fd
            .expect("only an array of maps converts")
            .map_err(|error| DataplaneError::map(map_names::COUNTERS)(MapError::IoError(error)))?;
        let nr_cpus = aya::util::nr_cpus().map_err(|(path, source)| DataplaneError::Cpus { path, source })?;
        let chunks = (0..outer.len()).map(|_| None).collect();
        let untouched = (0..outer.len()).map(|_| None).collect();
        Ok(Self {
            outer,
            outer_fd,
            chunks,
            untouched,
            nr_cpus,
            layout: layout.clone(),
            clock: Clock::default(),
            background: None,
        })
    }

    /// Pin path of chunk `index`.
    fn chunk_pin(&self, index: u32) -> PathBuf {
        self.layout.map(&format!("{}_{index}", map_names::COUNTER_CHUNK))
    }

    /// Chunk `index` from its pin, else from the outer map (by id, which needs `CAP_SYS_ADMIN`;
    /// only chunks an older agent created lack a pin, and they get one here), else `None`.
    fn open_chunk(&self, index: u32) -> Result<Option<Chunk>, DataplaneError> {
        let pin = self.chunk_pin(index);
        if pin.exists() {
            let data = MapData::from_pin(&pin).map_err(DataplaneError::map(map_names::COUNTERS))?;
            return Chunk::try_from(Map::PerCpuArray(data)).map(Some).map_err(DataplaneError::map(map_names::COUNTERS));
        }
        match self.outer.get(&index, 0) {
            Ok(chunk) => {
                // Best effort: a reader without the right to pin still reads it.
                let _ = chunk_data(&chunk).pin(&pin);
                Ok(Some(chunk))
            }
            Err(MapError::KeyNotFound | MapError::OutOfBounds { .. }) => Ok(None),
            Err(error) => Err(DataplaneError::Map { map: map_names::COUNTERS, source: error }),
        }
    }

    /// Makes sure the chunks of `service_ids` exist, creating the missing ones and publishing them
    /// in the outer map with one batched update. Every update of a map of maps waits for an RCU
    /// grace period before it returns (the kernel's `maybe_wait_bpf_programs`, 5-15 ms), once per
    /// system call: a full sync of 50,000 ids waits once instead of fifty times. A kernel that
    /// refuses the batch gets the updates one by one (the answer is then `false`); a chunk that
    /// cannot be published loses its pin, so a later [`Self::reset`] creates it again.
    pub fn reserve(&mut self, service_ids: impl IntoIterator<Item = u32>) -> Result<bool, DataplaneError> {
        let missing: BTreeSet<u32> = service_ids
            .into_iter()
            .map(|id| place(id).0)
            .filter(|&index| matches!(self.chunks.get(index as usize), Some(None)))
            .collect();
        let mut created = Vec::new();
        // A chunk that cannot be created stops the creating; those created are still published
        // (a pinned chunk is taken as published), then the error is returned.
        let mut stopped = None;
        for index in missing {
            match self.open_chunk(index) {
                Ok(Some(chunk)) => self.chunks[index as usize] = Some(chunk),
                Ok(None) => match create_chunk(&self.chunk_pin(index)) {
                    Ok(chunk) => created.push((index, chunk)),
                    Err(error) => {
                        stopped = Some(error);
                        break;
                    }
                },
                Err(error) => {
                    stopped = Some(error);
                    break;
                }
            }
        }
        if created.is_empty() {
            return stopped.map_or(Ok(true), Err);
        }
        let indexes: Vec<u32> = created.iter().map(|(index, _)| *index).collect();
        let fds: Vec<u32> =
            created.iter().map(|(_, chunk)| chunk_data(chunk).fd().as_fd().as_raw_fd() as u32).collect();
        let batched = batch::update_fd(self.outer_fd.as_fd(), &indexes, &fds).is_ok();
        let mut failure = None;
        for (index, chunk) in created {
            if !batched && failure.is_none() {
                failure = self.outer.set(index, &chunk, 0).err();
            }
            if batched || failure.is_none() {
                self.untouched[index as usize] = Some(vec![u64::MAX; COUNTER_CHUNK.div_ceil(64) as usize].into());
                self.chunks[index as usize] = Some(chunk);
            } else {
                // Unpublished: without its pin, the next use creates and publishes it again.
                let _ = std::fs::remove_file(self.chunk_pin(index));
            }
        }
        match (failure, stopped) {
            (Some(error), _) => Err(DataplaneError::Map { map: map_names::COUNTERS, source: error }),
            (None, Some(error)) => Err(error),
            (None, None) => Ok(batched),
        }
    }

    /// Zeroes the counters of `service_id`, creating its chunk first if no id in it was used yet.
    pub fn reset(&mut self, service_id: u32) -> Result<(), DataplaneError> {
        let (chunk, index) = place(service_id);
        self.chunk(chunk)?;
        if let Some(bits) = self.untouched[chunk as usize].as_mut() {
            let (word, bit) = (index as usize / 64, 1u64 << (index % 64));
            if bits[word] & bit != 0 {
                bits[word] &= !bit;
                return Ok(());
            }
        }
        let zero = PerCpuValues::try_from(vec![ServiceCounters::default(); self.nr_cpus])
            .map_err(|source| DataplaneError::Cpus { path: "possible CPUs", source })?;
        self.chunk(chunk)?.set(index, zero, 0).map_err(DataplaneError::map(map_names::COUNTERS))
    }

    /// The chunk at `index`: already open, else opened from the outer map, else created and
    /// published in it.
    fn chunk(&mut self, index: u32) -> Result<&mut Chunk, DataplaneError> {
        let slot = self.chunks.get(index as usize).ok_or(DataplaneError::MapFull {
            map: map_names::COUNTERS,
            needed: u64::from(index + 1) * u64::from(COUNTER_CHUNK),
            capacity: self.outer.len().saturating_mul(COUNTER_CHUNK),
        })?;
        if slot.is_none() {
            let chunk = match self.open_chunk(index)? {
                Some(chunk) => chunk,
                None => {
                    let created = create_chunk(&self.chunk_pin(index))?;
                    self.outer.set(index, &created, 0).map_err(DataplaneError::map(map_names::COUNTERS))?;
                    self.untouched[index as usize] = Some(vec![u64::MAX; COUNTER_CHUNK.div_ceil(64) as usize].into());
                    created
                }
            };
            self.chunks[index as usize] = Some(chunk);
        }
        Ok(self.chunks[index as usize].as_mut().expect("filled above"))
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
                _ => match self.open_chunk(index)? {
                    Some(chunk) => {
                        opened = chunk;
                        &opened
                    }
                    None => {
                        out.extend(ids.into_iter().map(|id| (id, ServiceCounters::default())));
                        continue;
                    }
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

impl Grace for CounterChunks {
    /// Sets entry 0 of the outer map to the chunk it already holds: the kernel waits for an RCU
    /// grace period before the update returns.
    fn wait(&mut self) -> Result<(), DataplaneError> {
        let grace_error = |error: MapError| DataplaneError::GracePeriod { source: std::io::Error::other(error) };
        self.chunk(0)?;
        let chunk = self.chunks[0].as_ref().expect("opened above");
        self.outer.set(0, chunk, 0).map_err(grace_error)?;
        self.clock.waited();
        Ok(())
    }

    fn epochs(&mut self) -> Epochs {
        if let Some(background) = &self.background {
            self.clock.passed(background.passed());
        }
        self.clock.epochs()
    }

    /// Asks the background thread (started on first use, with the outer map and chunk 0) for one.
    /// When it cannot be started, or its wait fails, the period never passes and the writer
    /// waits itself when it must.
    fn begin(&mut self) {
        if self.clock.under_way() {
            return;
        }
        if self.background.is_none() {
            let Ok(chunk) = self.chunk(0) else { return };
            let inner = chunk_data(chunk).fd().as_fd().try_clone_to_owned();
            let outer = self.outer_fd.try_clone();
            let (Ok(inner), Ok(outer)) = (inner, outer) else { return };
            self.background = Background::start(outer, inner).ok();
        }
        if let Some(background) = &self.background {
            let number = self.clock.began();
            if !background.ask(number) {
                // The thread is gone: the period will never pass; the next wait passes it.
                self.background = None;
            }
        }
    }
}

/// The map under a chunk.
fn chunk_data(chunk: &Chunk) -> &MapData {
    aya::maps::IterableMap::map(chunk)
}

/// A new, zeroed chunk with the inner layout the programs were verified against, pinned at `pin`.
fn create_chunk(pin: &std::path::Path) -> Result<Chunk, DataplaneError> {
    // Typed in BTF like the outer map's template, or Linux before 6.2 refuses it as an inner map.
    let fd = typed_chunk::create(
        bpf_map_type::BPF_MAP_TYPE_PERCPU_ARRAY as u32,
        size_of::<ServiceCounters>() as u32,
        COUNTER_CHUNK,
        map_names::COUNTER_CHUNK,
    )
    .map_err(|error| DataplaneError::Map {
        map: map_names::COUNTERS,
        source: MapError::SyscallError(aya::sys::SyscallError { call: "bpf_map_create", io_error: error }),
    })?;
    let data = MapData::from_fd(fd).map_err(DataplaneError::map(map_names::COUNTERS))?;
    data.pin(pin)
        .map_err(|error| DataplaneError::Pin { path: pin.to_path_buf(), source: std::io::Error::other(error) })?;
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
