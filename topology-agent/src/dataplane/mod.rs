//! The dataplane: the only owner of the eBPF object and the pinned maps. It loads the programs,
//! adopts whatever a previous agent left pinned, attaches to a cgroup, and applies desired states
//! as minimal diffs. Everything else sends it desired state.
//!
//! Pins live under one directory (default `/sys/fs/bpf/topology`): `maps/<name>` and
//! `links/<program>`. Pinned links keep the programs attached while no agent runs, so traffic keeps
//! flowing with the last programmed state; [`cleanup`] removes all of it.

pub mod alias;
mod counters;
mod error;
mod grace;
mod index;
mod links;
mod loader;
mod maps;
mod slot_space;
mod state;
mod writer;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use aya::Ebpf;
pub use error::DataplaneError;
pub use loader::KernelLogLevel;
pub use maps::{Capacities, PinLayout};
pub use state::{CounterReading, KernelState, ProgrammedService};
use topology_common::{ServiceCounters, program_names};
pub use writer::{ApplyReport, Usage};

use crate::desired::DesiredState;

/// Default pin directory.
pub const DEFAULT_PIN_PATH: &str = "/sys/fs/bpf/topology";

/// Reader of the kernel programs' log ring buffer.
pub type KernelLogger = aya_log::EbpfLogger<&'static dyn log::Log>;

/// How to open the dataplane.
#[derive(Clone, Debug)]
pub struct DataplaneConfig {
    /// Pin directory on bpffs.
    pub pin_path: PathBuf,
    /// cgroup v2 directory the programs attach to; sockets of every process below it are served.
    pub cgroup: PathBuf,
    /// Map capacities.
    pub capacities: Capacities,
    /// Kernel diagnostics level.
    pub kernel_log: KernelLogLevel,
}

/// The loaded, attached dataplane.
pub struct Dataplane {
    writer: writer::Writer,
    logger: Option<KernelLogger>,
    layout: PinLayout,
    // Holds the object's other maps (the log ring buffer) for as long as the programs run.
    _ebpf: Ebpf,
}

impl Dataplane {
    /// Loads the programs, adopts the pinned state, and attaches to the configured cgroup. The
    /// adopted state stays in the kernel untouched until the first [`Dataplane::apply`], except
    /// for the service index, which is brought in line with the service entries it mirrors.
    pub fn open(config: &DataplaneConfig) -> Result<Self, DataplaneError> {
        let layout = PinLayout::new(&config.pin_path);
        let loader::Loaded { mut ebpf, logger } = loader::load(&layout, &config.capacities, config.kernel_log)?;
        let maps = maps::MapSet::from_ebpf(&mut ebpf)?;
        let kernel = state::read(&maps)?;
        // The index is completed before the programs that probe it are attached: an agent
        // upgraded from one without it starts with an empty index, which would hide every service.
        let writer = writer::Writer::adopt(maps, kernel)?;
        loader::attach_all(&mut ebpf, &layout, &config.cgroup)?;
        Ok(Self { writer, logger, layout, _ebpf: ebpf })
    }

    /// Makes the kernel hold `desired`, rewriting only the service ports that differ.
    pub fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        self.writer.apply(desired)
    }

    /// Makes the kernel hold the given service ports as desired (`None`: removed) and leaves every
    /// other one alone: the incremental form of [`Dataplane::apply`].
    pub fn apply_changes<'a>(
        &mut self,
        changes: impl IntoIterator<Item = (crate::desired::ServicePort, Option<&'a crate::desired::DesiredService>)>,
    ) -> ApplyReport {
        self.writer.apply_changes(changes)
    }

    /// What the kernel holds, as last written or adopted.
    pub fn kernel(&self) -> &KernelState {
        self.writer.kernel()
    }

    /// Entries in use in the maps with a capacity.
    pub fn usage(&self) -> Usage {
        self.writer.usage()
    }

    /// Map capacities in force.
    pub fn capacities(&self) -> Capacities {
        self.writer.maps().capacities
    }

    /// Per-service counters summed over CPUs, by service id.
    pub fn counters(&self) -> Result<BTreeMap<u32, ServiceCounters>, DataplaneError> {
        state::read_counters(self.writer.maps())
    }

    /// The kernel log reader, when kernel logging is on; the caller polls it.
    pub fn take_logger(&mut self) -> Option<KernelLogger> {
        self.logger.take()
    }

    /// Checks the kernel's service indexes against the service entries (for tests and
    /// diagnostics): every lookup the programs could make answers the entry or asks the hash map.
    pub fn verify_index(&self) -> Result<(), String> {
        self.writer.verify_index()
    }

    /// The pin directory.
    pub fn pin_path(&self) -> &Path {
        self.layout.root()
    }
}

/// What the pins hold, read without loading or attaching anything.
#[derive(Debug)]
pub struct Snapshot {
    /// Programmed service ports.
    pub kernel: KernelState,
    /// Counters by service id.
    pub counters: BTreeMap<u32, ServiceCounters>,
    /// Programs with a pinned (attached) link.
    pub attached: Vec<&'static str>,
    /// Map capacities.
    pub capacities: Capacities,
}

/// Reads the pinned state under `pin_path`.
pub fn snapshot(pin_path: &Path) -> Result<Snapshot, DataplaneError> {
    let layout = PinLayout::new(pin_path);
    let maps = maps::MapSet::from_pins(&layout)?;
    let kernel = state::read(&maps)?;
    let counters = state::read_counters(&maps)?;
    let attached = program_names::ALL.into_iter().filter(|name| layout.link(name).exists()).collect();
    Ok(Snapshot { kernel, counters, attached, capacities: maps.capacities })
}

/// Reads the kernel counters from the pins, on its own descriptors: the metrics endpoint uses it
/// without touching the controller's dataplane.
pub struct CounterReader {
    maps: maps::MapSet,
}

impl CounterReader {
    /// Opens the pinned maps under `pin_path`.
    pub fn open(pin_path: &Path) -> Result<Self, DataplaneError> {
        Ok(Self { maps: maps::MapSet::from_pins(&PinLayout::new(pin_path))? })
    }

    /// Every service port's counters, summed over CPUs.
    pub fn read(&self) -> Result<Vec<CounterReading>, DataplaneError> {
        state::read_named_counters(&self.maps)
    }
}

/// What [`cleanup`] removed.
#[derive(Debug, Default)]
pub struct CleanupReport {
    /// Link pins detached and removed.
    pub links: Vec<PathBuf>,
    /// Map pins removed.
    pub maps: Vec<PathBuf>,
}

/// Detaches every pinned link and removes every pin under `pin_path`. Idempotent.
pub fn cleanup(pin_path: &Path) -> Result<CleanupReport, DataplaneError> {
    let layout = PinLayout::new(pin_path);
    let mut report = CleanupReport::default();
    for path in entries(&layout.links_dir())? {
        links::detach_pinned(&path)?;
        report.links.push(path);
    }
    for path in entries(&layout.maps_dir())? {
        std::fs::remove_file(&path).map_err(|source| DataplaneError::PinDir { path: path.clone(), source })?;
        report.maps.push(path);
    }
    for dir in [layout.links_dir(), layout.maps_dir(), layout.root().to_path_buf()] {
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(DataplaneError::PinDir { path: dir, source }),
        }
    }
    Ok(report)
}

/// The files in `dir`, sorted; none if it does not exist.
fn entries(dir: &Path) -> Result<Vec<PathBuf>, DataplaneError> {
    let read = match std::fs::read_dir(dir) {
        Ok(read) => read,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(DataplaneError::PinDir { path: dir.to_path_buf(), source });
        }
    };
    let mut paths = Vec::new();
    for entry in read {
        let entry = entry.map_err(|source| DataplaneError::PinDir { path: dir.to_path_buf(), source })?;
        paths.push(entry.path());
    }
    paths.sort();
    Ok(paths)
}
