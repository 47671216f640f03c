//! Map layouts and constants shared by the topology eBPF programs and the agent.
//!
//! Everything here is plain old data: fixed-width integers and arrays with explicit padding, so the
//! kernel and userspace agree on every byte and `bpftool map dump` prints named fields from BTF.
//!
//! Conventions used by every type below:
//! - IPv4 addresses are `[u8; 4]` and IPv6 addresses `[u8; 16]`, in network byte order (the bytes
//!   as they appear on the wire). A backend of either family uses `[u8; 16]` with an IPv4 address in
//!   the first four bytes and zeros after it.
//! - Ports are in host byte order, so dumps read naturally; the programs convert at the boundary.
//! - `family` is `AF_INET` (2) or `AF_INET6` (10); `proto` is the IP protocol number.
//! - Every type holding an address is at least 4-byte aligned, so the programs move addresses as
//!   32-bit words.
#![no_std]

use core::mem::size_of;

pub mod bytes;
pub mod control;
pub mod index;
pub mod load;
pub mod map_names;
pub mod outlier;
pub mod socket;
pub use bytes::{ByteCount, DatagramBytes, SockBytes};
pub use control::{
    ClientAffinityKey, ClientAffinityValue, DnsSteer, Heartbeat, NodeCounters, ServiceOptions, ServiceRanges,
    service_flags,
};
pub use index::{IndexEntry4, IndexEntry6};
pub use load::{BackendKey, BackendLoad, spill};
pub use outlier::{OutlierEntry, OutlierKey, OutlierLedger, OutlierScan, OutlierState};
pub use socket::{DATAGRAM_PEERS, DatagramPeer, DatagramPeers, IterRecord, SockTranslation, TcpTranslation};

/// `AF_INET`, as stored in the `family` fields.
pub const AF_INET: u8 = 2;
/// `AF_INET6`, as stored in the `family` fields.
pub const AF_INET6: u8 = 10;
/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;
/// IP protocol number of SCTP.
pub const IPPROTO_SCTP: u8 = 132;

/// Program names (ELF symbols); each is attached at the cgroup hook of the same name.
pub mod program_names {
    /// `connect()` on AF_INET sockets.
    pub const CONNECT4: &str = "connect4";
    /// `connect()` on AF_INET6 sockets, including IPv4-mapped destinations.
    pub const CONNECT6: &str = "connect6";
    /// `sendmsg()`/`sendto()` with a destination on unconnected AF_INET UDP sockets.
    pub const SENDMSG4: &str = "sendmsg4";
    /// `sendmsg()`/`sendto()` with a destination on unconnected AF_INET6 UDP sockets.
    pub const SENDMSG6: &str = "sendmsg6";
    /// `recvmsg()`/`recvfrom()` source address on AF_INET UDP sockets.
    pub const RECVMSG4: &str = "recvmsg4";
    /// `recvmsg()`/`recvfrom()` source address on AF_INET6 UDP sockets.
    pub const RECVMSG6: &str = "recvmsg6";
    /// `getpeername()` on AF_INET sockets.
    pub const GETPEERNAME4: &str = "getpeername4";
    /// `getpeername()` on AF_INET6 sockets.
    pub const GETPEERNAME6: &str = "getpeername6";

    /// Passive outlier ejection of the backends the connect hooks chose: a reset received
    /// (`tp_btf/tcp_receive_reset`, node-wide, not a cgroup hook).
    pub const OUTLIER_RESET: &str = "outlier_reset";
    /// The same: a segment retransmitted (`tp_btf/tcp_retransmit_skb`).
    pub const OUTLIER_RETRANSMIT: &str = "outlier_retransmit";
    /// The same: an error reported on a socket (`tp_btf/inet_sk_error_report`).
    pub const OUTLIER_ERROR: &str = "outlier_error";
    /// The outlier ejection programs with the tracepoints they attach to.
    pub const OUTLIER: [(&str, &str); 3] = [
        (OUTLIER_RESET, "tcp_receive_reset"),
        (OUTLIER_RETRANSMIT, "tcp_retransmit_skb"),
        (OUTLIER_ERROR, "inet_sk_error_report"),
    ];
    /// A TCP socket destroyed (`tp_btf/tcp_destroy_sock`, node-wide): the end of a connection
    /// the connect hooks rewrote — its bytes since its last sweep (cross-zone accounting), and
    /// its end for the load signal.
    pub const TCP_CLOSED: &str = "tcp_closed";
    /// The programs at a TCP socket's end with the tracepoints they attach to.
    pub const CLOSED: [(&str, &str); 1] = [(TCP_CLOSED, "tcp_destroy_sock")];
    /// Cross-zone accounting of UDP (`--byte-accounting all`): a socket's send
    /// (`tp_btf/sock_send_length`, node-wide), counted if its datagram went through a Service.
    pub const BYTES_SENT: &str = "bytes_sent";
    /// The same, a socket's receive (`tp_btf/sock_recv_length`).
    pub const BYTES_RECEIVED: &str = "bytes_received";
    /// The UDP accounting programs with the tracepoints they attach to.
    pub const UDP_ACCOUNTING: [(&str, &str); 2] =
        [(BYTES_SENT, "sock_send_length"), (BYTES_RECEIVED, "sock_recv_length")];
    /// The sweep of open TCP connections (`iter/tcp`), loaded by the agent's sweeper only.
    pub const TCP_BYTES: &str = "tcp_bytes";

    /// The socket-address programs, in attach order.
    pub const SOCK_ADDR: [&str; 8] =
        [CONNECT4, CONNECT6, SENDMSG4, SENDMSG6, RECVMSG4, RECVMSG6, GETPEERNAME4, GETPEERNAME6];

    /// Every program attached to the cgroup, in attach order.
    pub const ALL: [&str; 8] = SOCK_ADDR;

    /// The UDP socket iterator socket termination reads (`iter/udp`), loaded only by it.
    pub const UDP_TRANSLATIONS: &str = "udp_translations";
}

/// Default capacities (`max_entries`); the agent can override each at load time.
pub mod capacity {
    /// IPv4 service ports.
    pub const SERVICES_V4: u32 = 65_536;
    /// IPv6 service ports.
    pub const SERVICES_V6: u32 = 65_536;
    /// Backend slots across all services, including the new generation written during a swap
    /// (an array: 262,144 × 48 bytes = 12 MiB of kernel memory, allocated at load).
    pub const SLOTS: u32 = 262_144;
    /// Service ids (counters, names and options), both families together; a multiple of
    /// [`COUNTER_CHUNK`](crate::COUNTER_CHUNK).
    pub const SERVICE_IDS: u32 = 131_072;
    /// Clients remembered for `sessionAffinity: ClientIP`, over all services (LRU: the least
    /// recently used client of a full map chooses again).
    pub const CLIENT_AFFINITY: u32 = 65_536;
    /// Positions of the TCP connections table (a power of two; 80 bytes each, allocated at load:
    /// 10 MiB). A connection's entry is overwritten after about this many newer socket cookies:
    /// its `getpeername()` then shows its backend's address, and `--terminate-sockets all`
    /// cannot find it.
    pub const TCP_CONNECTIONS: u32 = 131_072;
    /// Backends measured by the load signal (allocated on use: 20-byte keys, 64-byte
    /// values). A backend beyond it is not measured: its connections are still rewritten.
    pub const BACKEND_LOAD: u32 = 65_536;
    /// Service port and backend pairs whose handshakes failed, remembered for outlier ejection
    /// (LRU, 72 bytes each): the least recently failing one of a full map is forgotten.
    pub const OUTLIERS: u32 = 16_384;
    /// Service ports with ejections in force or recent, each with its ledger (preallocated, 140
    /// bytes each, 560 KiB): an ejection of a port that finds the map full is refused.
    pub const OUTLIER_LEDGERS: u32 = 4_096;
    /// Service port and backend pairs whose bytes are counted (LRU, preallocated: 40-byte keys,
    /// 16-byte values, about 3.5 MiB in all): the least recently counted pair of a full map is
    /// forgotten, with what it counted since the agent last read it.
    pub const BYTES: u32 = 32_768;
}

/// Service ids per chunk of the counters map. A chunk is a per-CPU array the agent creates when it
/// first hands out an id in it, so the counters' kernel memory follows the ids in use
/// (`COUNTER_CHUNK × size_of::<ServiceCounters>() × possible CPUs` per chunk), while the programs
/// reach a service's counters with two array accesses the verifier inlines, without a hash walk.
pub const COUNTER_CHUNK: u32 = 1024;
const _: () = assert!(capacity::SERVICE_IDS.is_multiple_of(COUNTER_CHUNK));

/// Global (`.rodata`) variable the agent overrides to set the kernel log level (0 = off).
pub const LOG_LEVEL_GLOBAL: &str = "AYA_LOG_LEVEL";
/// Global (`.rodata`) variable the agent sets to the IPv4 service index's positions minus one.
pub const INDEX_V4_MASK_GLOBAL: &str = "INDEX_V4_MASK";
/// Global (`.rodata`) variable the agent sets to the IPv6 service index's positions minus one.
pub const INDEX_V6_MASK_GLOBAL: &str = "INDEX_V6_MASK";
/// Global (`.rodata`) variable the agent sets to the TCP connections table's positions minus one.
pub const TCP_CONNECTIONS_MASK_GLOBAL: &str = "TCP_CONNECTIONS_MASK";
/// Global (`.rodata`) variable the agent sets to the byte offset of `skc_state` in the kernel's
/// `struct sock`, read from its BTF (the outlier ejection programs read a socket's state there).
pub const SKC_STATE_OFFSET_GLOBAL: &str = "SKC_STATE_OFFSET";
/// Globals the agent sets to the byte offsets of `inet_sock.uc_ttl`, `inet_sock.pinet6` and
/// `ipv6_pinfo.hop_limit` (a socket's own TTL or hop limit: its failures are no evidence).
pub const OWN_TTL_OFFSETS_GLOBAL: &str = "OWN_TTL_OFFSETS";
/// Global (`.rodata`) variable: 1 when the kernel's `tcp_retransmit_skb` tracepoint passes the
/// retransmission's error (Linux 6.17), which the outlier program then reads.
pub const RETRANSMIT_ERR_GLOBAL: &str = "RETRANSMIT_ERR";
/// Global (`.rodata`) variables the agent sets to the byte offsets of `tcp_sock.bytes_acked` and
/// `tcp_sock.bytes_received` in this kernel, from its BTF (cross-zone accounting).
pub const BYTES_ACKED_OFFSET_GLOBAL: &str = "BYTES_ACKED_OFFSET";
pub const BYTES_RECEIVED_OFFSET_GLOBAL: &str = "BYTES_RECEIVED_OFFSET";
/// Global (`.rodata`) variable the agent sets to the byte offset of `sock.sk_cookie`.
pub const SK_COOKIE_OFFSET_GLOBAL: &str = "SK_COOKIE_OFFSET";
/// Global (`.rodata`) variables the agent sets to the byte offsets of a socket's peer in the
/// kernel's `struct sock`: `skc_daddr`, `skc_v6_daddr`, `skc_dport` (in `__sk_common`).
pub const SKC_DADDR_OFFSET_GLOBAL: &str = "SKC_DADDR_OFFSET";
pub const SKC_V6_DADDR_OFFSET_GLOBAL: &str = "SKC_V6_DADDR_OFFSET";
pub const SKC_DPORT_OFFSET_GLOBAL: &str = "SKC_DPORT_OFFSET";
/// Global (`.rodata`) variable the agent sets to the byte offset of `sock.sk_protocol`.
pub const SK_PROTOCOL_OFFSET_GLOBAL: &str = "SK_PROTOCOL_OFFSET";
/// Global (`.rodata`) variables the agent sets to the byte offsets of `tcp_sock.srtt_us`,
/// `tcp_sock.total_retrans` and `tcp_sock.bpf_sock_ops_cb_flags` (the load signal, at a
/// connection's end).
pub const SRTT_US_OFFSET_GLOBAL: &str = "SRTT_US_OFFSET";
pub const TOTAL_RETRANS_OFFSET_GLOBAL: &str = "TOTAL_RETRANS_OFFSET";
pub const CB_FLAGS_OFFSET_GLOBAL: &str = "CB_FLAGS_OFFSET";
/// Global (`.rodata`) variables: 1 when a TCP connection's end counts its bytes (accounting) and
/// its end (the load signal).
pub const TCP_BYTES_GLOBAL: &str = "TCP_BYTES";
pub const LOAD_SIGNAL_GLOBAL: &str = "LOAD_SIGNAL";
/// Global (`.rodata`) variable: 1 when the UDP hooks leave each translated datagram for the
/// accounting tracepoints (`--byte-accounting all`).
pub const UDP_BYTES_GLOBAL: &str = "UDP_BYTES";
/// Global (`.rodata`) variable: 1 when the programs may probe the service index, 0 when they
/// must ask the hash maps (a weakly ordered CPU whose kernel has no BPF load-acquire; see
/// [`index`]).
pub const INDEX_ENABLED_GLOBAL: &str = "INDEX_ENABLED";

/// Where the backend sits relative to the node the maps were written for.
pub mod locality {
    /// Same node.
    pub const NODE: u8 = 0;
    /// Same zone, other node.
    pub const ZONE: u8 = 1;
    /// Same region, other zone.
    pub const REGION: u8 = 2;
    /// Anywhere else, or unknown.
    pub const OTHER: u8 = 3;
    /// Number of classes; the length of [`ServiceCounters::rewritten`](crate::ServiceCounters::rewritten).
    pub const CLASSES: usize = 4;
}

/// Probability scale of [`Slot::threshold`]: a slot picks its primary backend when a uniformly random
/// `u32 >> 1` is below the threshold, so `THRESHOLD_ONE` means "always the primary".
pub const THRESHOLD_ONE: u32 = 1 << 31;

/// Key of the IPv4 services map: a ClusterIP, port and protocol.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ServiceKey4 {
    /// ClusterIP, network byte order.
    pub addr: [u8; 4],
    /// Service port, host byte order.
    pub port: u16,
    /// IP protocol number.
    pub proto: u8,
    /// Always zero.
    pub _pad: u8,
}
const _: () = assert!(size_of::<ServiceKey4>() == 8);

/// Key of the IPv6 services map: a ClusterIP, port and protocol.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct ServiceKey6 {
    /// ClusterIP, network byte order.
    pub addr: [u8; 16],
    /// Service port, host byte order.
    pub port: u16,
    /// IP protocol number.
    pub proto: u8,
    /// Always zero.
    pub _pad: u8,
}
const _: () = assert!(size_of::<ServiceKey6>() == 20);

/// Value of both services maps: which backend set a service port currently uses.
///
/// Swap protocol (see `topology-dataplane/src/writer.rs`): the agent writes the slots of a
/// new set into a free run of the slots array first, then replaces this value in one map update;
/// the old run is reused only after an RCU grace period, when no program can still hold the old
/// value. Every slot carries its set's `set_id`, which the program checks.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ServiceValue {
    /// Stable id of the service port: the key of the counters and name maps.
    pub service_id: u32,
    /// Generation of the backend set, unique among live sets; 0 for an empty set.
    pub set_id: u32,
    /// Number of slots. Zero means the set is empty and connections are refused.
    pub count: u32,
    /// Index of the set's first slot in the slots array; its slots are `base..base + count`.
    pub base: u32,
}
const _: () = assert!(size_of::<ServiceValue>() == 16);

/// One backend as the programs rewrite to it.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Backend {
    /// Address, network byte order; IPv4 in the first four bytes.
    pub addr: [u8; 16],
    /// Port, host byte order.
    pub port: u16,
    /// Locality class relative to this node, one of [`locality`].
    pub locality: u8,
    /// Always zero.
    pub _pad: u8,
}
const _: () = assert!(size_of::<Backend>() == 20);
const _: () = assert!(core::mem::offset_of!(Backend, addr) == 0);

impl Backend {
    /// The address as four native-endian words, read as words: the struct is 4-aligned and the
    /// address its first field.
    #[inline(always)]
    pub fn addr_words(&self) -> [u32; 4] {
        // SAFETY: `addr` is 16 bytes at offset 0 of a 4-aligned struct (asserted above), so a
        // 4-aligned `[u32; 4]`; every bit pattern is a valid one.
        unsafe { core::ptr::from_ref(&self.addr).cast::<[u32; 4]>().read() }
    }
}

/// One slot of a backend set, laid out for Walker's alias method: choose a slot uniformly, then its
/// primary with probability `threshold / THRESHOLD_ONE`, else its alias. Any weights cost one lookup.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Slot {
    /// The set this slot belongs to ([`ServiceValue::set_id`]); 0 in a free slot.
    pub set_id: u32,
    /// Probability of `primary`, scaled to [`THRESHOLD_ONE`].
    pub threshold: u32,
    /// Backend chosen when the random draw is below `threshold`.
    pub primary: Backend,
    /// Backend chosen otherwise.
    pub alias: Backend,
}
const _: () = assert!(size_of::<Slot>() == 48);

/// Per-CPU counters of one service port.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ServiceCounters {
    /// Connections and first datagrams rewritten, indexed by the chosen backend's locality class.
    pub rewritten: [u64; locality::CLASSES],
    /// Connections and datagrams refused because the backend set was empty.
    pub refused: u64,
    /// Internal failures (a slot of another set drawn, affinity state that could not be stored).
    pub errors: u64,
}
const _: () = assert!(size_of::<ServiceCounters>() == 48);

impl ServiceCounters {
    /// Number of counters; the programs address them as `[u64; FIELDS]` in field order, so an
    /// outcome is counted by one indexed increment: `0..CLASSES` by locality class, then these.
    pub const FIELDS: usize = locality::CLASSES + 2;
    /// Index of [`ServiceCounters::refused`].
    pub const REFUSED: usize = locality::CLASSES;
    /// Index of [`ServiceCounters::errors`].
    pub const ERRORS: usize = locality::CLASSES + 1;
}
const _: () = assert!(size_of::<ServiceCounters>() == ServiceCounters::FIELDS * size_of::<u64>());
const _: () = assert!(core::mem::offset_of!(ServiceCounters, refused) == ServiceCounters::REFUSED * size_of::<u64>());
const _: () = assert!(core::mem::offset_of!(ServiceCounters, errors) == ServiceCounters::ERRORS * size_of::<u64>());

/// Length of [`ServiceMeta::name`].
pub const SERVICE_NAME_LEN: usize = 152;

/// Human-readable identity of a service port, for `status` and `bpftool`; the programs never read it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceMeta {
    /// `namespace/name:port`, UTF-8, zero-padded.
    pub name: [u8; SERVICE_NAME_LEN],
}
const _: () = assert!(size_of::<ServiceMeta>() == SERVICE_NAME_LEN);

impl Default for ServiceMeta {
    fn default() -> Self {
        Self { name: [0; SERVICE_NAME_LEN] }
    }
}

#[cfg(feature = "user")]
mod pod;
