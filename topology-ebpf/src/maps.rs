//! Every map the programs use, declared once. All are BTF maps, so `bpftool map dump` prints field
//! names. The agent pins each under its pin directory (all but the random generator's state) and
//! may override any `max_entries`.
//!
//! `#[btf_map(name = …)]` takes a literal, so each name is spelled here once more; the agent's
//! test `the_objects_declare_exactly_the_maps_topology_common_names` holds every one to
//! `topology_common::map_names` in both builds of the object.

use aya_ebpf::{
    Global,
    bindings::{BPF_F_MMAPABLE, BPF_F_NO_PREALLOC},
    btf_maps::{Array, ArrayOfMaps, HashMap, LruHashMap, PerCpuArray, SkStorage},
    macros::btf_map,
};
use topology_common::{
    BackendKey, BackendLoad, ByteCount, COUNTER_CHUNK, ClientAffinityKey, ClientAffinityValue, DatagramBytes,
    DatagramPeers, DnsSteer, Heartbeat, IndexEntry4, IndexEntry6, NodeCounters, OutlierEntry, OutlierKey,
    OutlierLedger, OutlierScan, OutlierState, ServiceCounters, ServiceKey4, ServiceKey6, ServiceMeta, ServiceOptions,
    ServiceRanges, ServiceValue, Slot, SockBytes, SockTranslation, TcpTranslation, capacity,
};

/// Maps only userspace writes are allocated on write, so an idle capacity costs no kernel memory.
const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;
/// The agent writes the service index through a shared mapping, with the store ordering the
/// read protocol needs (see `topology_common::index`).
const MMAPABLE: usize = BPF_F_MMAPABLE as usize;

/// IPv4 service ports.
#[btf_map(name = "topo_svc4")]
pub static SERVICES_V4: HashMap<ServiceKey4, ServiceValue, { capacity::SERVICES_V4 as usize }, NO_PREALLOC> =
    HashMap::new();

/// IPv6 service ports.
#[btf_map(name = "topo_svc6")]
pub static SERVICES_V6: HashMap<ServiceKey6, ServiceValue, { capacity::SERVICES_V6 as usize }, NO_PREALLOC> =
    HashMap::new();

/// IPv4 service index (see `topology_common::index`): the services the programs find without a
/// hash map lookup. Two positions per IPv4 service entry of capacity (the agent sets the size).
#[btf_map(name = "topo_svc4_idx")]
pub static INDEX_V4: Array<IndexEntry4, { 2 * capacity::SERVICES_V4 as usize }, MMAPABLE> = Array::new();

/// IPv6 service index.
#[btf_map(name = "topo_svc6_idx")]
pub static INDEX_V6: Array<IndexEntry6, { 2 * capacity::SERVICES_V6 as usize }, MMAPABLE> = Array::new();

/// 1 when the programs may probe the index, 0 when they must ask the hash maps (set at load).
#[unsafe(no_mangle)]
static INDEX_ENABLED: Global<u32> = Global::new(1);

/// Whether the programs probe the service index.
#[inline(always)]
pub fn index_enabled() -> bool {
    INDEX_ENABLED.load() != 0
}

/// Positions of [`INDEX_V4`] minus one (a power of two minus one), set by the agent at load.
#[unsafe(no_mangle)]
static INDEX_V4_MASK: Global<u32> = Global::new(2 * capacity::SERVICES_V4 - 1);

/// Positions of [`INDEX_V6`] minus one, set by the agent at load.
#[unsafe(no_mangle)]
static INDEX_V6_MASK: Global<u32> = Global::new(2 * capacity::SERVICES_V6 - 1);

/// The index position `i` steps after `hash`'s home in the IPv4 index.
#[inline(always)]
pub fn index_v4_position(hash: u32, i: u32) -> u32 {
    hash.wrapping_add(i) & INDEX_V4_MASK.load()
}

/// The index position `i` steps after `hash`'s home in the IPv6 index.
#[inline(always)]
pub fn index_v6_position(hash: u32, i: u32) -> u32 {
    hash.wrapping_add(i) & INDEX_V6_MASK.load()
}

/// Where the service ports are (see `ServiceRanges`): read before every lookup, one cache line.
#[btf_map(name = "topo_svc_range")]
pub static SERVICE_RANGES: Array<ServiceRanges, 1> = Array::new();

/// Whether `holds` says that the service ranges may hold a destination; true when the map cannot
/// say. `holds` runs after the map lookup, so what it reads from the context stays in registers.
#[inline(always)]
pub fn in_service_ranges(holds: impl FnOnce(&ServiceRanges) -> bool) -> bool {
    // SAFETY: the element of a one-entry array, valid for the program's lifetime; the agent
    // rewrites it whole while programs read it, and either version is a valid answer for the
    // moment (see `ServiceRanges`).
    SERVICE_RANGES.get_ptr(0).is_none_or(|ranges| holds(unsafe { &*ranges }))
}

/// Whether the IPv4 destination `addr` may be a service port; true when the map cannot say.
#[inline(always)]
pub fn may_be_service4(addr: u32) -> bool {
    in_service_ranges(|ranges| ranges.may_hold_v4(addr))
}

/// Whether the IPv6 destination `addr` may be a service port; true when the map cannot say.
#[inline(always)]
pub fn may_be_service6(addr: &[u32; 4]) -> bool {
    in_service_ranges(|ranges| ranges.may_hold_v6(addr))
}

/// Backend slots of every live backend set, one contiguous run per set. An array, so a lookup is
/// an inlined bounds check and address computation: no hash, no bucket walk.
#[btf_map(name = "topo_slots")]
pub static SLOTS: Array<Slot, { capacity::SLOTS as usize }> = Array::new();

/// One chunk of the counters: per-CPU counters of `COUNTER_CHUNK` consecutive service ids.
pub type CounterChunk = PerCpuArray<ServiceCounters, { COUNTER_CHUNK as usize }>;

/// Per-CPU counters by service id, in chunks the agent creates as ids are used: two array
/// lookups, both inlined by the verifier, instead of a hash walk on every rewrite.
#[btf_map(name = "topo_counters")]
pub static COUNTERS: ArrayOfMaps<CounterChunk, { (capacity::SERVICE_IDS / COUNTER_CHUNK) as usize }> =
    ArrayOfMaps::new();

/// Service names by id, for `status` and `bpftool`; never read here, declared so it is created and
/// pinned with the others.
#[btf_map(name = "topo_svc_meta")]
pub static SERVICE_META: HashMap<u32, ServiceMeta, { capacity::SERVICE_IDS as usize }, NO_PREALLOC> = HashMap::new();

/// Options by service id (session affinity, DNS steering); read after every service lookup.
#[btf_map(name = "topo_svc_opts")]
pub static SERVICE_OPTIONS: Array<ServiceOptions, { capacity::SERVICE_IDS as usize }> = Array::new();

/// What each rewritten connected socket was rewritten from and to; freed with the socket.
#[btf_map(name = "topo_sock_conn")]
pub static SOCK_CONNECTIONS: SkStorage<SockTranslation> = SkStorage::new();

/// What each rewritten TCP socket the load signal does not measure was rewritten from and to, at
/// position `cookie & mask` (see `TcpTranslation`): an array store costs a connect a fraction of a
/// socket storage allocation or a hash insert.
#[btf_map(name = "topo_tcp_conn")]
pub static TCP_CONNECTIONS: Array<TcpTranslation, { capacity::TCP_CONNECTIONS as usize }> = Array::new();

/// Positions of [`TCP_CONNECTIONS`] minus one (a power of two minus one), set by the agent at load.
#[unsafe(no_mangle)]
static TCP_CONNECTIONS_MASK: Global<u32> = Global::new(capacity::TCP_CONNECTIONS - 1);

/// The position of the socket `cookie` in [`TCP_CONNECTIONS`].
#[inline(always)]
pub fn tcp_connection_position(cookie: u64) -> u32 {
    cookie as u32 & TCP_CONNECTIONS_MASK.load()
}

/// The entry of the socket `cookie` in [`TCP_CONNECTIONS`] and its translation, if the entry is
/// still that socket's and whole.
#[inline(always)]
pub fn tcp_connection(cookie: u64) -> Option<(*mut TcpTranslation, SockTranslation)> {
    let entry = TCP_CONNECTIONS.get_ptr_mut(tcp_connection_position(cookie))?;
    // SAFETY: an element of the array, copied out at once (checked whole by its seal).
    unsafe { *entry }.of(cookie).map(|translation| (entry, translation))
}

/// Services and backends of each unconnected UDP socket that sent to one; freed with the socket.
#[btf_map(name = "topo_sock_dgram")]
pub static SOCK_DATAGRAMS: SkStorage<DatagramPeers> = SkStorage::new();

/// The backend each client keeps under `sessionAffinity: ClientIP`.
#[btf_map(name = "topo_client_aff")]
pub static CLIENT_AFFINITY: LruHashMap<ClientAffinityKey, ClientAffinityValue, { capacity::CLIENT_AFFINITY as usize }> =
    LruHashMap::new();

/// The agent's heartbeat; the programs rewrite only while it is fresh.
#[btf_map(name = "topo_heartbeat")]
pub static HEARTBEAT: Array<Heartbeat, 1> = Array::new();

/// The node-local DNS responder's heartbeat; service ports steered to it are rewritten only while
/// it is fresh, and only to the responder it names.
#[btf_map(name = "topo_dns_steer")]
pub static DNS_STEER: Array<DnsSteer, 1> = Array::new();

/// Counters of the whole node (fail-open passes, storage failures), per CPU.
#[btf_map(name = "topo_node_cnt")]
pub static NODE_COUNTERS: PerCpuArray<NodeCounters, 1> = PerCpuArray::new();

/// What the load signal measured per backend (see `load`); created by the connect hook on a
/// backend's first connection, removed by the agent once the backend is gone and idle.
#[btf_map(name = "topo_backend_load")]
pub static BACKEND_LOAD: HashMap<BackendKey, BackendLoad, { capacity::BACKEND_LOAD as usize }, NO_PREALLOC> =
    HashMap::new();

/// Failures and ejections per Service port and backend (see `outlier`); entries made by the
/// tracing program on a pair's first failed handshake, the least recently used forgotten when
/// full.
#[btf_map(name = "topo_outlier")]
pub static OUTLIERS: LruHashMap<OutlierKey, OutlierEntry, { capacity::OUTLIERS as usize }> = LruHashMap::new();

/// The ejections in force per Service port (see `outlier`): the cap's ledger, locked while an
/// ejection takes a place; preallocated (a tracing program takes it).
#[btf_map(name = "topo_outlier_cap")]
pub static OUTLIER_LEDGERS: HashMap<u32, OutlierLedger, { capacity::OUTLIER_LEDGERS as usize }> = HashMap::new();

/// Whether any backend is failing or ejected (see `outlier`).
#[btf_map(name = "topo_outlier_st")]
pub static OUTLIER_STATE: Array<OutlierState, 1> = Array::new();

/// The connect hooks' count over a set's slots while a drawn backend is ejected (see `outlier`);
/// not pinned.
#[btf_map(name = "topo_outlier_scan")]
pub static OUTLIER_SCAN: PerCpuArray<OutlierScan, 1> = PerCpuArray::new();

/// Bytes of the rewritten TCP connections per Service port and backend (see `bytes`).
#[btf_map(name = "topo_bytes")]
pub static BYTES: LruHashMap<SockTranslation, ByteCount, { capacity::BYTES as usize }> = LruHashMap::new();

/// What has been counted of each open connection a sweep found (see `bytes`); freed with the
/// socket.
#[btf_map(name = "topo_sock_bytes")]
pub static SOCK_BYTES: SkStorage<SockBytes> = SkStorage::new();

/// The datagram an unconnected UDP socket's hook just translated, per CPU, sent and received
/// (see `datagrams`); not pinned.
#[btf_map(name = "topo_udp_last")]
pub static UDP_LAST: PerCpuArray<DatagramBytes, 2> = PerCpuArray::new();

/// Per-CPU state of the programs' random number generator (see `rng`); not pinned: a new state
/// per load is as good as the old one.
#[btf_map(name = "topo_rng")]
pub static RNG: PerCpuArray<u64, 1> = PerCpuArray::new();
