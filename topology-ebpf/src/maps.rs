//! Every map the programs use, declared once. All are BTF maps, so `bpftool map dump` prints field
//! names. The agent pins each under its pin directory (all but the random generator's state) and
//! may override any `max_entries`.

use aya_ebpf::{
    Global,
    bindings::BPF_F_NO_PREALLOC,
    btf_maps::{Array, ArrayOfMaps, HashMap, LruHashMap, PerCpuArray},
    macros::btf_map,
};
use topology_common::{
    AffinityKey, AffinityValue, COUNTER_CHUNK, IndexEntry4, IndexEntry6, RevNatKey, RevNatValue, ServiceCounters,
    ServiceKey4, ServiceKey6, ServiceMeta, ServiceValue, Slot, SockTranslation, capacity,
};

/// Maps only userspace writes are allocated on write, so an idle capacity costs no kernel memory.
const NO_PREALLOC: usize = BPF_F_NO_PREALLOC as usize;

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
pub static INDEX_V4: Array<IndexEntry4, { 2 * capacity::SERVICES_V4 as usize }> = Array::new();

/// IPv6 service index.
#[btf_map(name = "topo_svc6_idx")]
pub static INDEX_V6: Array<IndexEntry6, { 2 * capacity::SERVICES_V6 as usize }> = Array::new();

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

/// Backend kept by an unconnected UDP socket per service port.
#[btf_map(name = "topo_affinity")]
pub static AFFINITY: LruHashMap<AffinityKey, AffinityValue, { capacity::AFFINITY as usize }> = LruHashMap::new();

/// Reverse translation of unconnected UDP sockets, which may talk to several backends each.
#[btf_map(name = "topo_revnat")]
pub static REVNAT: LruHashMap<RevNatKey, RevNatValue, { capacity::REVNAT as usize }> = LruHashMap::new();

/// Reverse translation of connected sockets, one slot per socket cookie (see `SockTranslation`).
/// An array: written without a lock, so a `connect()` pays no map update.
#[btf_map(name = "topo_sock_xlate")]
pub static SOCK_TRANSLATIONS: Array<SockTranslation, { capacity::SOCK_TRANSLATIONS as usize }> = Array::new();

/// `capacity - 1` of [`SOCK_TRANSLATIONS`], set by the agent at load; a known constant to the
/// verifier, so the index is provably in range.
#[unsafe(no_mangle)]
static SOCK_TRANSLATION_MASK: Global<u32> = Global::new(capacity::SOCK_TRANSLATIONS - 1);

/// The translation slot of a socket cookie.
#[inline(always)]
pub fn translation_slot(cookie: u64) -> u32 {
    (cookie as u32) & SOCK_TRANSLATION_MASK.load()
}

/// Per-CPU state of the programs' random number generator (see `rng`); not pinned: a new state
/// per load is as good as the old one.
#[btf_map(name = "topo_rng")]
pub static RNG: PerCpuArray<u64, 1> = PerCpuArray::new();
