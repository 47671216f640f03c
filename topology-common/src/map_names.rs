//! Every BPF map of the programs, declared once: its name — the ELF symbol, the kernel object
//! name and the pin file name are all this string — and what an agent that restarts, or upgrades,
//! does with the map a previous agent pinned. The loader, the pin checks, cleanup, `status` and
//! the tests all read [`MAPS`]; the eBPF crate spells each name as a literal in its map
//! declaration, and a test of the dataplane holds both builds of the object to this table.

/// What an agent does with the pin of a map a previous agent left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kept {
    /// Pinned and adopted with what it holds; a pin of another layout or capacity is refused,
    /// since its state cannot be carried over.
    Carried,
    /// Pinned and adopted; a pin of another layout or capacity is removed and created anew,
    /// losing what it holds (named here): state derived from the others, or only measured.
    Rebuilt(&'static str),
    /// Not pinned: each load makes its own (scratch space, or a state as good new as old).
    PerLoad,
}

/// One map of the programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// The map's name.
    pub name: &'static str,
    /// What becomes of it across an agent's restart.
    pub kept: Kept,
}

impl MapSpec {
    /// Whether the agent pins it.
    pub const fn pinned(&self) -> bool {
        !matches!(self.kept, Kept::PerLoad)
    }
}

/// The declaration of every map: a name constant each, and the table.
macro_rules! maps {
    ($($(#[$attr:meta])* $konst:ident = $name:literal, $kept:ident $(($what:literal))?;)*) => {
        $($(#[$attr])* pub const $konst: &str = $name;)*

        /// Every map the programs declare, in a stable order.
        pub const MAPS: [MapSpec; [$($name),*].len()] =
            [$(MapSpec { name: $name, kept: Kept::$kept $(($what))? }),*];
    };
}

maps! {
    /// IPv4 services: [`ServiceKey4`](crate::ServiceKey4) -> [`ServiceValue`](crate::ServiceValue).
    SERVICES_V4 = "topo_svc4", Carried;
    /// IPv6 services: [`ServiceKey6`](crate::ServiceKey6) -> [`ServiceValue`](crate::ServiceValue).
    SERVICES_V6 = "topo_svc6", Carried;
    /// Backend slots of every live set, one contiguous run per set: index -> [`Slot`](crate::Slot).
    SLOTS = "topo_slots", Carried;
    /// Per-CPU counters by service id, in chunks of [`COUNTER_CHUNK`](crate::COUNTER_CHUNK) ids:
    /// an array of maps whose entry `id / COUNTER_CHUNK` is a per-CPU array of
    /// [`ServiceCounters`](crate::ServiceCounters) indexed by `id % COUNTER_CHUNK`.
    COUNTERS = "topo_counters", Carried;
    /// Human-readable name by service id: `u32` -> [`ServiceMeta`](crate::ServiceMeta).
    SERVICE_META = "topo_svc_meta", Carried;
    /// Options by service id: `u32` -> [`ServiceOptions`](crate::ServiceOptions).
    SERVICE_OPTIONS = "topo_svc_opts", Carried;
    /// IPv4 service index (see [`index`](crate::index)): position -> [`IndexEntry4`](crate::IndexEntry4).
    INDEX_V4 = "topo_svc4_idx", Rebuilt("the service index");
    /// IPv6 service index: position -> [`IndexEntry6`](crate::IndexEntry6).
    INDEX_V6 = "topo_svc6_idx", Rebuilt("the service index");
    /// Translation of each connected socket rewritten (socket storage):
    /// [`SockTranslation`](crate::SockTranslation).
    SOCK_CONNECTIONS = "topo_sock_conn", Carried;
    /// Translation of each rewritten TCP connection the load signal does not measure, in a
    /// direct-mapped array by socket cookie: position `cookie & mask` ->
    /// [`TcpTranslation`](crate::TcpTranslation). An array store costs a connect a fraction of a
    /// socket storage allocation or a hash insert, which only measured connections and UDP sockets
    /// (whose every datagram's source is translated) pay.
    TCP_CONNECTIONS = "topo_tcp_conn", Rebuilt("the TCP connections' translations");
    /// Services and backends of each unconnected UDP socket that sent to one (socket storage):
    /// [`DatagramPeers`](crate::DatagramPeers).
    SOCK_DATAGRAMS = "topo_sock_dgram", Carried;
    /// `sessionAffinity: ClientIP`: [`ClientAffinityKey`](crate::ClientAffinityKey) ->
    /// [`ClientAffinityValue`](crate::ClientAffinityValue) (LRU).
    CLIENT_AFFINITY = "topo_client_aff", Carried;
    /// The agent's heartbeat, one [`Heartbeat`](crate::Heartbeat).
    HEARTBEAT = "topo_heartbeat", Carried;
    /// Per-CPU [`NodeCounters`](crate::NodeCounters), one entry.
    NODE_COUNTERS = "topo_node_cnt", Carried;
    /// The node-local DNS responder's own heartbeat, one [`DnsSteer`](crate::DnsSteer): service
    /// ports steered to it (`service_flags::LOCAL_DNS`) are rewritten only while it is fresh, and
    /// only to the responder it names.
    DNS_STEER = "topo_dns_steer", Carried;
    /// What the load signal measured per backend: [`BackendKey`](crate::BackendKey) ->
    /// [`BackendLoad`](crate::BackendLoad).
    BACKEND_LOAD = "topo_backend_load", Rebuilt("the load signal's measurements");
    /// Failures and ejections per Service port and backend (passive outlier ejection,
    /// [`crate::outlier`]): [`OutlierKey`](crate::OutlierKey) -> [`OutlierEntry`](crate::OutlierEntry); LRU.
    OUTLIERS = "topo_outlier", Rebuilt("the outlier ejections");
    /// The ejections in force per Service port, the cap's ledger: service id ->
    /// [`OutlierLedger`](crate::OutlierLedger).
    OUTLIER_LEDGERS = "topo_outlier_cap", Rebuilt("the outlier ejections");
    /// Whether any backend is failing or ejected, and the buckets of those that may be: one
    /// [`OutlierState`](crate::OutlierState).
    OUTLIER_STATE = "topo_outlier_st", Rebuilt("the outlier ejections");
    /// Bytes of the TCP connections the connect hooks rewrote, per Service port and backend
    /// ([`crate::bytes`]): [`SockTranslation`](crate::SockTranslation) (flags cleared) ->
    /// [`ByteCount`](crate::ByteCount), added to atomically; LRU (the agent's counters survive an
    /// entry forgotten).
    BYTES = "topo_bytes", Rebuilt("the bytes counted since the agent last read them");
    /// What has been counted of each open connection a sweep found (socket storage):
    /// [`SockBytes`](crate::SockBytes).
    SOCK_BYTES = "topo_sock_bytes", Carried;
    /// Where the service ports are, one [`ServiceRanges`](crate::ServiceRanges): destinations
    /// outside are passed without a lookup.
    SERVICE_RANGES = "topo_svc_range", Rebuilt("the service ranges");
    /// State of the programs' random number generator; not pinned (a new state per load is as
    /// good as the old one).
    RNG = "topo_rng", PerLoad;
    /// The connect hooks' per-CPU count of ejected slots in a set (`outlier::OutlierScan`); not
    /// pinned: scratch space, meaningless between two runs.
    OUTLIER_SCAN = "topo_outlier_scan", PerLoad;
    /// The datagram an unconnected UDP socket's hook just translated, per CPU, for the tracepoint
    /// that counts its bytes ([`DatagramBytes`](crate::DatagramBytes)); not pinned: scratch space.
    UDP_LAST = "topo_udp_last", PerLoad;
}

/// Kernel object name of every chunk of [`COUNTERS`]; chunk `n` is pinned as
/// `topo_cnt_chunk_<n>`, so readers open it without looking a map up by id.
pub const COUNTER_CHUNK: &str = "topo_cnt_chunk";

/// How many maps the agent pins.
const PINNED_COUNT: usize = {
    let mut count = 0;
    let mut i = 0;
    while i < MAPS.len() {
        if MAPS[i].pinned() {
            count += 1;
        }
        i += 1;
    }
    count
};

/// Every map the agent pins and keeps across restarts, in the order of [`MAPS`].
pub const PINNED: [&str; PINNED_COUNT] = {
    let mut names = [""; PINNED_COUNT];
    let (mut i, mut n) = (0, 0);
    while i < MAPS.len() {
        if MAPS[i].pinned() {
            names[n] = MAPS[i].name;
            n += 1;
        }
        i += 1;
    }
    names
};
