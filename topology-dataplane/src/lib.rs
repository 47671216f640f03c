//! topology-dataplane: the only owner of the eBPF object and the pinned maps. It loads the programs,
//! adopts whatever a previous agent left pinned, attaches to a cgroup, and applies desired states
//! as minimal diffs. Everything else sends it desired state.
//!
//! Pins live under one directory (default `/sys/fs/bpf/topology`): `maps/<name>` and
//! `links/<program>`. Pinned links keep the programs attached while no agent runs, so traffic keeps
//! flowing with the last programmed state; [`cleanup`] removes all of it.
//!
//! It is the pipeline's last stage: it takes the node plan's desired state (`topology-policy`)
//! and nothing flows back up but reports. `build.rs` builds the kernel programs
//! (`topology-ebpf`) with the nightly toolchain and embeds them.

mod backend_load;
mod batch;
mod btf_offsets;
mod bytes;
mod cleanup;
mod counters;
mod diff;
mod error;
mod features;
mod grace;
mod heartbeat;
mod ids;
mod index;
mod inspect;
#[cfg(test)]
mod killed;
mod layout;
mod links;
mod loader;
mod maps;
#[cfg(any(test, feature = "testing"))]
pub mod memory;
mod mmap;
pub mod mounts;
mod objects;
mod ops;
mod options;
mod outliers;
mod pins;
mod ranges;
#[cfg(test)]
mod refusals;
mod reuse;
mod slot_space;
#[cfg(any(test, feature = "testing"))]
mod snapshot;
mod socket_maps;
mod state;
mod typed_chunk;
mod upgrade;
mod writer;

#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use aya::Ebpf;
pub use bytes::{BytesSweep, CountedBytes};
pub use cleanup::{Attached, CleanupReport, attached_programs, cleanup};
pub use diff::Departure;
pub use error::DataplaneError;
pub use features::KernelFeatures;
pub use grace::Epochs;
pub use heartbeat::{DnsBeat, FailOpen, HeartbeatReading};
pub use inspect::{PinCheck, PinnedState, read_pins, verify_pins};
pub use layout::PinLayout;
pub use loader::Flavour;
pub use maps::{Capacities, CapacityOverride};
pub(crate) use objects::PROGRAMS;
pub use options::{ByteAccounting, IndexOrdering, KernelLogLevel, LoadOptions, LoadSignal};
pub use outliers::Outlier;
pub use socket_maps::{IterError, SocketMaps, TcpConnections};
pub use state::{CounterReading, KernelState, ProgrammedService};
use topology_common::{NodeCounters, ServiceCounters, program_names};
use topology_policy::desired::DesiredState;
pub use topology_policy::feedback::measured::{LoadCounters, MeasuredBackend};
// The pipeline's vocabulary, under the names the modules here were written with.
pub use writer::{ApplyReport, Usage};
#[cfg(any(test, feature = "testing"))]
pub use writer::{Writer, verify_index};

/// Ends a previous run's ejections when ejection is off: the connect hooks read the pinned
/// entries whether or not the tracing programs run, so ejections in force would outlive the switch.
fn end_ejections_if_off(layout: &PinLayout, on: bool) -> Result<(), DataplaneError> {
    if on {
        return Ok(());
    }
    outliers::clear(layout)
}

/// Turns off the steering a previous agent left: the entries it programmed name its responder,
/// which may be gone or answer from an empty view; this agent steers again only once its own
/// responder answers from a current view (see `dns::steer`).
fn stop_dns_steering(layout: &PinLayout) -> Result<(), DataplaneError> {
    DnsBeat::open(layout)?.stop()
}

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
    /// How long the programs keep rewriting after the last [`Dataplane::heartbeat`]; `None`:
    /// forever (they never fail open).
    pub fail_open_after: Option<Duration>,
    /// What the programs are loaded with.
    pub programs: LoadOptions,
}

impl DataplaneConfig {
    /// A configuration with the defaults of a library user: default capacities, no kernel log,
    /// the index ordering this machine needs, never failing open.
    pub fn new(pin_path: impl Into<PathBuf>, cgroup: impl Into<PathBuf>) -> Self {
        Self {
            pin_path: pin_path.into(),
            cgroup: cgroup.into(),
            fail_open_after: None,
            programs: LoadOptions::default(),
        }
    }
}

/// The loaded, attached dataplane.
pub struct Dataplane {
    writer: writer::Writer,
    logger: Option<KernelLogger>,
    layout: PinLayout,
    flavour: Flavour,
    fail_open: FailOpen,
    cgroup: PathBuf,
    // Holds the object's other maps (the log ring buffer) for as long as the programs run;
    // none when a restart kept the programs already attached.
    _ebpf: Option<Ebpf>,
}

impl Dataplane {
    /// Loads the programs, adopts the pinned state, and attaches to the configured cgroup. The
    /// adopted state stays in the kernel untouched until the first [`Dataplane::apply`], except
    /// for the service index, which is brought in line with the service entries it mirrors.
    ///
    /// The heartbeat is left as it is (a previous agent's, or lapsed), unless the programs never
    /// fail open: an agent starting after a long absence routes again only once it has a view.
    pub fn open(config: &DataplaneConfig) -> Result<Self, DataplaneError> {
        let layout = PinLayout::new(&config.pin_path);
        let options = config.programs;
        let fail_open = FailOpen::new(config.fail_open_after);
        // Pins of a layout this agent cannot read are refused before anything is touched.
        let upgrading = upgrade::check(&layout)? == Some(upgrade::PREVIOUS);
        if upgrading {
            upgrade::remove_retired_maps(&layout)?;
        }
        if let Some(previous) = reuse::find(&layout, &options, &config.cgroup) {
            match Self::keep(layout.clone(), previous, fail_open, &config.cgroup, upgrading) {
                Ok(kept) => {
                    end_ejections_if_off(&layout, options.outlier_ejection)?;
                    return Ok(kept);
                }
                Err(error) => tracing::warn!(%error, "the attached programs could not be kept; loading them"),
            }
        }
        reuse::forget(&layout)?;
        let started = std::time::Instant::now();
        let loader::Loaded { mut ebpf, logger, flavour } = loader::load(&layout, &options)?;
        let loaded = started.elapsed();
        let maps = maps::MapSet::from_ebpf(&mut ebpf, &layout)?;
        let kernel = state::read(&maps)?;
        // The index is completed before the programs that probe it are attached: an agent
        // upgraded from one without it starts with an empty index, which would hide every service.
        let mut writer = writer::Writer::adopt(maps, kernel)?;
        tracing::info!(
            ports = writer.kernel().services.len(),
            load_ms = loaded.as_millis() as u64,
            adopt_ms = (started.elapsed() - loaded).as_millis() as u64,
            "programs loaded and pinned state adopted"
        );
        if fail_open.never() {
            heartbeat::beat(&mut writer.maps_mut().heartbeat, &fail_open)?;
        }
        stop_dns_steering(&layout)?;
        end_ejections_if_off(&layout, options.outlier_ejection)?;
        loader::attach_all(&mut ebpf, &layout, &config.cgroup)?;
        if upgrading {
            upgrade::detach_retired(&layout)?;
        }
        upgrade::mark(&layout)?;
        reuse::record(&layout, &options, &config.cgroup, flavour)?;
        tracing::info!(features = %KernelFeatures::attached(&layout, flavour), "what this kernel runs");
        let cgroup = config.cgroup.clone();
        Ok(Self { writer, logger, layout, flavour, fail_open, cgroup, _ebpf: Some(ebpf) })
    }

    /// A restart that keeps the programs a previous agent attached (the same objects, options
    /// and cgroup): only the pinned maps are opened and adopted.
    fn keep(
        layout: PinLayout,
        previous: reuse::Previous,
        fail_open: FailOpen,
        cgroup: &Path,
        upgrading: bool,
    ) -> Result<Self, DataplaneError> {
        let started = std::time::Instant::now();
        let maps = maps::MapSet::from_pins(&layout)?;
        stop_dns_steering(&layout)?;
        let kernel = state::read(&maps)?;
        let mut writer = writer::Writer::adopt(maps, kernel)?;
        if fail_open.never() {
            heartbeat::beat(&mut writer.maps_mut().heartbeat, &fail_open)?;
        }
        tracing::info!(
            ports = writer.kernel().services.len(),
            adopt_ms = started.elapsed().as_millis() as u64,
            object = previous.flavour.object,
            "the attached programs kept (the same objects and options); pinned state adopted"
        );
        let cgroup = cgroup.to_path_buf();
        if upgrading {
            upgrade::detach_retired(&layout)?;
        }
        upgrade::mark(&layout)?;
        Ok(Self { writer, logger: None, layout, flavour: previous.flavour, fail_open, cgroup, _ebpf: None })
    }

    /// What this kernel runs of the programs (which object, which optional programs it took).
    pub fn features(&self) -> KernelFeatures {
        KernelFeatures::attached(&self.layout, self.flavour)
    }

    /// The DNS steering heartbeat, on a descriptor of its own for the responder's prober.
    pub fn dns_beat(&self) -> Result<DnsBeat, DataplaneError> {
        DnsBeat::open(&self.layout)
    }

    /// What socket termination reads of the programs' state: the connected sockets' storage and
    /// the UDP socket iterator.
    pub fn socket_maps(&self) -> SocketMaps {
        SocketMaps::new(self.layout.clone())
    }

    /// A reader of the kernel counters on descriptors of its own: the metrics endpoint reads them
    /// without touching this dataplane, which the controller owns.
    pub fn counter_reader(&self) -> Result<CounterReader, DataplaneError> {
        Ok(CounterReader { maps: maps::CounterMaps::from_pins(&self.layout)? })
    }

    /// Tells the programs the agent is alive with a current view: they keep rewriting until
    /// `fail_open_after` from now.
    pub fn heartbeat(&mut self) -> Result<(), DataplaneError> {
        heartbeat::beat(&mut self.writer.maps_mut().heartbeat, &self.fail_open)
    }

    /// Which object is loaded and whether its programs probe the index.
    pub fn flavour(&self) -> Flavour {
        self.flavour
    }

    /// Counters of the whole node, summed over CPUs.
    pub fn node_counters(&self) -> Result<NodeCounters, DataplaneError> {
        heartbeat::read_node_counters(&self.writer.maps().node_counters)
    }

    /// Makes the kernel hold `desired`, rewriting only the service ports that differ.
    pub fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        self.writer.apply(desired)
    }

    /// The socket-address programs not attached to this dataplane's cgroup any more: their pinned
    /// link is gone, detached (someone ran `bpftool link detach`, the cgroup was removed) or moved
    /// to another cgroup. Connections there are no longer rewritten, whatever the maps hold.
    pub fn detached_programs(&self) -> Vec<&'static str> {
        use std::os::unix::fs::MetadataExt as _;
        let cgroup = std::fs::metadata(&self.cgroup).map(|m| m.ino()).ok();
        program_names::SOCK_ADDR
            .into_iter()
            .filter(|name| {
                let attached = links::cgroup_of(&self.layout.link(name))
                    .is_ok_and(|(program, id)| program != 0 && Some(id) == cgroup);
                !attached
            })
            .collect()
    }

    /// Prepares for about `ports` new service ports coming in several applies
    /// ([`writer::Writer::reserve`]).
    pub fn reserve(&mut self, ports: usize) -> Result<(), DataplaneError> {
        self.writer.reserve(ports)
    }

    /// Makes the kernel hold the given service ports as desired (`None`: removed) and leaves every
    /// other one alone: the incremental form of [`Dataplane::apply`].
    pub fn apply_changes<'a>(
        &mut self,
        changes: impl IntoIterator<
            Item = (topology_policy::desired::ServicePort, Option<&'a topology_policy::desired::DesiredService>),
        >,
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

    /// The RCU grace periods since open: begun, passed, and those the writer waited for itself.
    pub fn grace_periods(&mut self) -> Epochs {
        self.writer.grace_periods()
    }

    /// Batched map updates the kernel refused since open (each redone entry by entry): 0 on a
    /// kernel with `BPF_MAP_UPDATE_BATCH` and maps with room.
    pub fn batch_refusals(&self) -> u64 {
        self.writer.maps().batch_refusals
    }

    /// Map capacities in force.
    pub fn capacities(&self) -> Capacities {
        self.writer.maps().capacities
    }

    /// Per-service counters summed over CPUs, by service id.
    pub fn counters(&self) -> Result<BTreeMap<u32, ServiceCounters>, DataplaneError> {
        state::read_counters(self.writer.maps())
    }

    /// What the load signal measured of each backend this node sent TCP connections to.
    pub fn backend_load(&self) -> Result<Vec<MeasuredBackend>, DataplaneError> {
        backend_load::read(&self.writer.maps().backend_load)
    }

    /// Drops the measurements of backends in no programmed set with nothing in flight; returns
    /// how many went.
    pub fn prune_backend_load(&mut self) -> Result<usize, DataplaneError> {
        // Only the idle measured backends are looked for in the sets: a few, not every backend.
        let (mut idle, invalid) = backend_load::idle(&self.writer.maps().backend_load)?;
        self.writer.kernel().keep_unused(&mut idle);
        backend_load::remove(&mut self.writer.maps_mut().backend_load, idle, invalid)
    }

    /// The backends failing or ejected on this node (outlier ejection) per Service port, after
    /// forgetting those quiet for a failing window.
    pub fn outliers(&self) -> Result<Vec<Outlier>, DataplaneError> {
        let ports = self.writer.kernel().services.iter().map(|(port, service)| (service.service_id, *port)).collect();
        outliers::read_and_prune(&self.layout, ports)
    }

    /// The bytes the accounting programs counted, per Service port and backend.
    pub fn bytes(&self) -> Result<Vec<CountedBytes>, DataplaneError> {
        bytes::read(&self.layout)
    }

    /// The sweep of open connections' bytes, loaded against this dataplane's maps; the caller
    /// runs it in each network namespace.
    pub fn bytes_sweep(&self) -> Result<BytesSweep, IterError> {
        BytesSweep::load(&self.layout)
    }

    /// The kernel log reader, when kernel logging is on; the caller polls it.
    pub fn take_logger(&mut self) -> Option<KernelLogger> {
        self.logger.take()
    }

    /// Checks the kernel's service indexes against the service entries (for tests and
    /// diagnostics): every lookup the programs could make answers the entry or asks the hash map.
    pub fn verify_index(&self) -> Result<(), DataplaneError> {
        self.writer.verify_index()
    }

    /// The pin directory.
    pub fn pin_path(&self) -> &Path {
        self.layout.root()
    }
}

/// Reads the kernel counters on its own descriptors ([`Dataplane::counter_reader`]): the metrics
/// endpoint uses it without touching the controller's dataplane.
pub struct CounterReader {
    maps: maps::CounterMaps,
}

impl CounterReader {
    /// Every service port's counters and the node's, summed over CPUs, and the heartbeat.
    pub fn read(&self) -> Result<KernelReading, DataplaneError> {
        Ok(KernelReading {
            services: state::read_named_counters(&self.maps)?,
            node: heartbeat::read_node_counters(&self.maps.node_counters)?,
            heartbeat: Some(heartbeat::read(&self.maps.heartbeat)?),
            backends: backend_load::read(&self.maps.backend_load)?,
            outliers: outliers::read(&self.maps.outliers, || state::service_ports_of(&self.maps))?,
        })
    }
}

/// What the kernel counts, as one scrape reads it.
#[derive(Clone, Debug, Default)]
pub struct KernelReading {
    /// Per service port.
    pub services: Vec<CounterReading>,
    /// For the whole node.
    pub node: NodeCounters,
    /// The agent's heartbeat as the programs see it.
    pub heartbeat: Option<HeartbeatReading>,
    /// What the load signal measured per backend.
    pub backends: Vec<MeasuredBackend>,
    /// Backends failing or ejected (outlier ejection).
    pub outliers: Vec<Outlier>,
}
