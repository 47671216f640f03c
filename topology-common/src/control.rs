//! What the agent tells the programs besides the backend sets — whether it is alive, which
//! services keep a client on one backend — and what the programs count for the whole node.

use core::mem::{offset_of, size_of};

use crate::Backend;

/// The agent's heartbeat: the programs rewrite only while it is fresh.
///
/// The agent moves `deadline_ns` forward while it runs with a current view of the cluster. Once
/// `CLOCK_MONOTONIC` (coarse, as `bpf_ktime_get_coarse_ns` reads it) passes it, the programs stop
/// rewriting and every connection goes to the ClusterIP untouched, where kube-proxy (or whatever
/// implements Services on the node) answers: a node whose agent is gone fails open, not stale.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Heartbeat {
    /// Rewrite while `CLOCK_MONOTONIC_COARSE` is at most this; `u64::MAX`: never fail open; 0 (a
    /// map no agent has written yet): fail open at once.
    pub deadline_ns: u64,
}
const _: () = assert!(size_of::<Heartbeat>() == 8);

/// The node-local DNS responder's heartbeat: service ports steered to it
/// ([`service_flags::LOCAL_DNS`]) are rewritten only while it is fresh, and only to the address it
/// names — so an entry a previous agent left, naming a responder that is gone, steers nothing.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DnsSteer {
    /// Steer while `CLOCK_MONOTONIC_COARSE` is at most this; 0: never.
    pub deadline_ns: u64,
    /// The responder's address, as in [`Backend::addr`](crate::Backend::addr).
    pub addr: [u8; 16],
    /// The responder's port, host byte order.
    pub port: u16,
    /// Always zero.
    pub _pad: [u8; 6],
}
const _: () = assert!(size_of::<DnsSteer>() == 32);

/// Where the service ports are: a destination outside these prefixes is no service port, and
/// the connect and send hooks pass it without looking it up (the index's first probe is a cache
/// miss on a large node: most of what a non-Service connection pays the hook). Words in the
/// programs' form (network byte order, as `user_ip4` and `user_ip6` read): a destination `addr`
/// may be a service port when `addr & mask == net`, word by word. All zero (a map no agent wrote
/// yet) matches every address. The agent widens a prefix before it writes a service port outside
/// it, and narrows it after the last one left.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceRanges {
    /// IPv4 prefix (the IPv4-mapped addresses of IPv6 sockets included).
    pub v4_net: u32,
    /// Its mask.
    pub v4_mask: u32,
    /// IPv6 prefix.
    pub v6_net: [u32; 4],
    /// Its mask.
    pub v6_mask: [u32; 4],
}
const _: () = assert!(size_of::<ServiceRanges>() == 40);

impl ServiceRanges {
    /// Whether an IPv4 destination (a network-byte-order word) may be a service port.
    #[inline(always)]
    pub fn may_hold_v4(&self, addr: u32) -> bool {
        addr & self.v4_mask == self.v4_net
    }

    /// Whether an IPv6 destination (network-byte-order words) may be a service port.
    #[inline(always)]
    pub fn may_hold_v6(&self, addr: &[u32; 4]) -> bool {
        (addr[0] & self.v6_mask[0]) == self.v6_net[0]
            && (addr[1] & self.v6_mask[1]) == self.v6_net[1]
            && (addr[2] & self.v6_mask[2]) == self.v6_net[2]
            && (addr[3] & self.v6_mask[3]) == self.v6_net[3]
    }
}

/// Per-CPU counters of the whole node, for what has no service to count under.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NodeCounters {
    /// Connections and datagrams to a service port passed through untouched because the
    /// heartbeat lapsed (the agent is gone, or its view has been stale for too long).
    pub fail_open: u64,
    /// Unused. It counted the agent's own connections to the API server's Service, passed
    /// untouched, until that Service was left to kube-proxy; kept so that the map an earlier
    /// version pinned keeps its layout and is adopted across an upgrade.
    pub retired: u64,
    /// Rewrites whose socket storage could not be allocated: the connection works, but
    /// `getpeername()` and replies show the backend instead of the ClusterIP.
    pub no_storage: u64,
}
const _: () = assert!(size_of::<NodeCounters>() == NodeCounters::FIELDS * size_of::<u64>());

impl NodeCounters {
    /// Number of counters; the programs address them as `[u64; FIELDS]`.
    pub const FIELDS: usize = 3;
    /// Index of [`NodeCounters::fail_open`].
    pub const FAIL_OPEN: usize = 0;
    /// Index of [`NodeCounters::no_storage`].
    pub const NO_STORAGE: usize = 2;
}
const _: () = assert!(offset_of!(NodeCounters, fail_open) == NodeCounters::FAIL_OPEN * 8);
const _: () = assert!(offset_of!(NodeCounters, no_storage) == NodeCounters::NO_STORAGE * 8);

/// Flags of [`ServiceOptions::flags`]. Bit 0 is retired: in pin layout 0 it exempted the agent's
/// own cgroup from the API server's Service, which is no longer programmed. Layout 1 ignores it
/// and may adopt options with it set; a layout that reuses it must clear it in its upgrade step
/// (`topology-dataplane/src/upgrade.rs`).
pub mod service_flags {
    /// Steered to the agent's node-local DNS responder: rewritten only while the responder's own
    /// heartbeat ([`DnsSteer`], `map_names::DNS_STEER`) is fresh and names the chosen backend,
    /// else passed to the ClusterIP untouched, where kube-proxy sends it to the cluster DNS as if
    /// the agent were not there.
    pub const LOCAL_DNS: u32 = 1 << 1;
    /// Under feedback: the port's TCP connections are measured by the load signal (the connect
    /// hooks count their start and mark their sockets,
    /// [`SockTranslation::MEASURED`](crate::SockTranslation); their end is counted where the
    /// socket is destroyed): no other socket pays anything for it.
    pub const MEASURED: u32 = 1 << 2;
    /// Outlier ejection off for the port (`topology-agent.io/outlier-ejection: "off"`): the
    /// connect hooks draw its backends whatever their failures.
    pub const OUTLIER_OFF: u32 = 1 << 3;
    /// Overload answered per connection (a port under feedback): in bits 4–15, the connections in
    /// flight from this node to the backend drawn at which the connect hook compares it with a
    /// second backend of the set ([`spill`](crate::load::spill)); 0: off.
    pub const SPILL_SHIFT: u32 = 4;
    /// Its mask, after the shift.
    pub const SPILL_MASK: u32 = 0xfff;
    /// Outlier ejection's failed handshakes in a row for the port
    /// (`topology-agent.io/outlier-ejection: "failures=N"`), in bits 16–19; 0: the default.
    pub const OUTLIER_FAILURES_SHIFT: u32 = 16;
    /// Its mask, after the shift.
    pub const OUTLIER_FAILURES_MASK: u32 = 0xf;
    /// Outlier ejection's first ejection for the port, seconds (`"base=Ns"`), in bits 20–27; 0:
    /// the default.
    pub const OUTLIER_BASE_SHIFT: u32 = 20;
    /// Its mask, after the shift.
    pub const OUTLIER_BASE_MASK: u32 = 0xff;
}

/// Per-service options, by service id.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceOptions {
    /// `sessionAffinity: ClientIP`: seconds a client keeps its backend after its last connection;
    /// 0: no affinity.
    pub affinity_timeout_s: u32,
    /// [`service_flags`].
    pub flags: u32,
}
const _: () = assert!(size_of::<ServiceOptions>() == 8);

/// Key of the client affinity map: one client of one service port.
///
/// A client is its network namespace (`bpf_get_netns_cookie`), not its IP: at `connect()` the
/// source address is not chosen yet, and every socket of a pod shares its namespace. Host-network
/// processes share the host's namespace and so count as one client, as they share one IP.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ClientAffinityKey {
    /// Network namespace cookie of the client.
    pub netns: u64,
    /// The service port's id.
    pub service_id: u32,
    /// Always zero.
    pub _pad: u32,
}
const _: () = assert!(size_of::<ClientAffinityKey>() == 16);

/// Value of the client affinity map: the backend a client keeps.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ClientAffinityValue {
    /// The backend.
    pub backend: Backend,
    /// Backend set in which the backend was last seen; when the service's set changes, the
    /// programs check the backend is still in the new set before keeping it.
    pub set_id: u32,
    /// `CLOCK_MONOTONIC_COARSE` of the client's last connection (ns).
    pub last_used_ns: u64,
}
const _: () = assert!(size_of::<ClientAffinityValue>() == 32);
