//! Errors of the dataplane: every one names the map, program, path or service it is about.

use std::{io, path::PathBuf};

use topology_policy::desired::ServicePort;

/// A dataplane failure.
#[derive(Debug, thiserror::Error)]
pub enum DataplaneError {
    /// A configured capacity is out of range.
    #[error("capacity of map {map} {reason}")]
    Capacity {
        /// Map name.
        map: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// The embedded eBPF object could not be parsed (a build problem).
    #[error("parsing the embedded eBPF object {object}: {reason}")]
    Object {
        /// Which object.
        object: &'static str,
        /// The parser's message.
        reason: String,
    },
    /// A map that must be shared with the agent's memory is not mmapable.
    #[error("map {map} is not an mmapable array of the expected value size")]
    NotMappable {
        /// Map name.
        map: &'static str,
    },
    /// Mapping a map into memory failed.
    #[error("mapping map {map}: {source}")]
    Mmap {
        /// Map name.
        map: &'static str,
        /// The I/O error.
        source: io::Error,
    },
    /// The service index does not have a power-of-two size.
    #[error("map {map} has {positions} positions; the service index needs a power of two")]
    IndexSize {
        /// Map name.
        map: &'static str,
        /// Its size.
        positions: u32,
    },
    /// The kernel did not wait for an RCU grace period; nothing that needs one was reused.
    #[error("waiting for an RCU grace period: {source}")]
    GracePeriod {
        /// The error of the map-in-map update that should have waited.
        source: io::Error,
    },
    /// An object could not be pinned.
    #[error("pinning {path}: {source}")]
    Pin {
        /// The pin path.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// This process's own cgroup could not be found.
    #[error("finding this process's cgroup ({path}): {source}")]
    OwnCgroup {
        /// What was read.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The pin directory could not be created or read.
    #[error("pin directory {path}: {source}")]
    PinDir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The pins are of a layout this agent neither writes nor upgrades from.
    #[error(
        "pin directory {path} holds layout {}; this agent writes v{} and upgrades only from unversioned pins (v{}): \
         remove them with `topology-agent cleanup` of the version that wrote them, or stop every agent on the node \
         and remove the directory (connections then pass to kube-proxy untouched)",
        versions(found),
        writes,
        upgrades_from
    )]
    PinLayout {
        /// The pin directory.
        path: PathBuf,
        /// The layout versions its markers name.
        found: Vec<u32>,
        /// The layout version this agent writes.
        writes: u32,
        /// The one earlier version it upgrades from.
        upgrades_from: u32,
    },
    /// The pin directory is not on a BPF filesystem.
    #[error(
        "{path} is not on a BPF filesystem; mount one (`topology-agent mount-bpffs`, as the DaemonSet's init \
         container does, or `mount -t bpf bpf /sys/fs/bpf`) or choose another --pin-path"
    )]
    NotBpffs {
        /// The directory.
        path: PathBuf,
    },
    /// The cgroup directory could not be opened.
    #[error("cgroup {path}: {source}")]
    Cgroup {
        /// The cgroup directory.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// The cgroup directory is not on a cgroup v2 filesystem.
    #[error("{path} is not a cgroup v2 directory")]
    NotCgroup2 {
        /// The directory.
        path: PathBuf,
    },
    /// The eBPF object could not be loaded (maps created or opened, relocations applied).
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    /// A program could not be loaded, attached or pinned.
    #[error("program {program}: {source}")]
    Program {
        /// Program name.
        program: &'static str,
        /// The aya error.
        source: aya::programs::ProgramError,
    },
    /// A link pin could not be created, opened, renamed or removed.
    #[error("link {path}: {source}")]
    Link {
        /// The pin path.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
    /// A map is missing from the object or the pin directory.
    #[error("map {map} is missing from {location}")]
    MapMissing {
        /// Map name.
        map: &'static str,
        /// Where it was looked for.
        location: String,
    },
    /// A map operation failed.
    #[error("map {map}: {source}")]
    Map {
        /// Map name.
        map: &'static str,
        /// The aya error.
        source: aya::maps::MapError,
    },
    /// Writing would exceed a map's capacity; nothing was written.
    #[error("map {map} is full: {needed} entries needed, capacity {capacity}")]
    MapFull {
        /// Map name.
        map: &'static str,
        /// Entries the map would need to hold.
        needed: u64,
        /// The map's `max_entries`.
        capacity: u32,
    },
    /// A set was withdrawn to make room for another namespace's: its namespace held more than
    /// an equal share of the map.
    #[error(
        "map {map} is full and namespace {namespace} holds {holds} of its entries, over an equal share of {share}: \
         its largest sets are withdrawn while other namespaces need room"
    )]
    OverShare {
        /// Map name.
        map: &'static str,
        /// The namespace over its share.
        namespace: String,
        /// What it held.
        holds: u64,
        /// An equal share.
        share: u64,
    },
    /// The slots map has room in total but no contiguous run for a set.
    #[error(
        "map {map} has {free} free entries but no run of {needed} (longest {largest}, capacity {capacity}); \
         raise its capacity"
    )]
    MapFragmented {
        /// Map name.
        map: &'static str,
        /// Length of the run needed.
        needed: u32,
        /// Free entries in total.
        free: u64,
        /// Longest free run.
        largest: u32,
        /// The map's `max_entries`.
        capacity: u32,
    },
    /// A pinned map was created by another version of the programs.
    #[error(
        "pinned map {map} is {pinned} but these programs declare {expected} (pinned by another \
         version?); run `topology-agent cleanup` to recreate the maps"
    )]
    PinnedLayout {
        /// Map name.
        map: &'static str,
        /// Layout of the pinned map.
        pinned: MapLayout,
        /// Layout the programs declare.
        expected: MapLayout,
    },
    /// A pinned map exists with a different capacity than configured.
    #[error(
        "pinned map {map} has capacity {pinned} but {configured} is configured; keep the old \
         capacity or run `topology-agent cleanup` to recreate the maps"
    )]
    CapacityMismatch {
        /// Map name.
        map: &'static str,
        /// Capacity of the pinned map.
        pinned: u32,
        /// Configured capacity.
        configured: u32,
    },
    /// What the maps hold breaks an invariant the programs rely on.
    #[error("map {map}: inconsistent: {problem}")]
    Inconsistent {
        /// Map name.
        map: &'static str,
        /// The first problem found.
        problem: String,
    },
    /// A desired service cannot be expressed in the maps.
    #[error("service {service}: {reason}")]
    InvalidService {
        /// The service port.
        service: ServicePort,
        /// What is wrong with it.
        reason: String,
    },
    /// The number of possible CPUs (the size of per-CPU values) could not be read.
    #[error("reading {path}: {source}")]
    Cpus {
        /// What was read.
        path: &'static str,
        /// The I/O error.
        source: io::Error,
    },
    /// The kernel log reader could not be set up.
    #[error("kernel log: {0}")]
    Logger(#[from] aya_log::Error),
    /// The kernel's own BTF (which tracing programs are loaded against) could not be read.
    #[error("reading the kernel's BTF: {0}")]
    KernelBtf(#[from] aya::BtfError),
    /// The kernel refused a tracing program at its tracepoint.
    #[error("program {program} (tp_btf/{tracepoint}): {source}")]
    Tracing {
        /// Program name.
        program: &'static str,
        /// The tracepoint it attaches to.
        tracepoint: &'static str,
        /// aya's error.
        source: aya::programs::ProgramError,
    },
}

impl DataplaneError {
    /// Wraps an aya map error for `map`.
    pub(crate) fn map(map: &'static str) -> impl FnOnce(aya::maps::MapError) -> Self {
        move |source| Self::Map { map, source }
    }

    /// Wraps an aya program error for `program`.
    pub(crate) fn program(program: &'static str) -> impl FnOnce(aya::programs::ProgramError) -> Self {
        move |source| Self::Program { program, source }
    }
}

/// The shape of a map: what must match for pinned maps to be reused by these programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapLayout {
    /// `enum bpf_map_type` value.
    pub map_type: u32,
    /// Key size in bytes.
    pub key_size: u32,
    /// Value size in bytes.
    pub value_size: u32,
}

impl std::fmt::Display for MapLayout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.map_type {
            1 => "a hash",
            2 => "an array",
            5 => "a percpu_hash",
            6 => "a percpu_array",
            9 => "an lru_hash",
            12 => "an array_of_maps",
            24 => "an sk_storage",
            27 => "a ringbuf",
            other => return write!(f, "map type {other}, key {} B, value {} B", self.key_size, self.value_size),
        };
        write!(f, "{kind} map, key {} B, value {} B", self.key_size, self.value_size)
    }
}

/// Layout versions as the pin layout error names them: `v1, v9`.
fn versions(found: &[u32]) -> String {
    found.iter().map(|v| format!("v{v}")).collect::<Vec<_>>().join(", ")
}
