//! Per-socket state: what a rewritten socket must remember to undo the rewrite for the application
//! (`getpeername()`, the source of replies), kept in socket-local storage
//! (`BPF_MAP_TYPE_SK_STORAGE`). The kernel frees it with the socket, so no other socket can ever
//! take its place: a long-lived connection keeps its translation whatever happens around it.

use core::mem::size_of;

use crate::Backend;

/// What a connected socket (TCP, connected UDP) was rewritten from and to.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SockTranslation {
    /// ClusterIP the application connected to; IPv4 in the first four bytes.
    pub vip: [u8; 16],
    /// Backend the connection was rewritten to; IPv4 in the first four bytes.
    pub backend: [u8; 16],
    /// Service port, host byte order.
    pub vip_port: u16,
    /// Backend port, host byte order.
    pub backend_port: u16,
    /// `AF_INET` or `AF_INET6`: the family of both addresses.
    pub family: u8,
    /// IP protocol number of the socket.
    pub proto: u8,
    /// [`SockTranslation::MEASURED`], or zero (a record an earlier version wrote: unmeasured).
    pub flags: u16,
}
const _: () = assert!(size_of::<SockTranslation>() == 40);

impl SockTranslation {
    /// The port is under feedback ([`service_flags::MEASURED`](crate::service_flags::MEASURED)):
    /// the load signal measures this socket.
    pub const MEASURED: u16 = 1;
}

/// How many (service, backend) pairs an unconnected UDP socket remembers at once.
///
/// A socket that sends to more services than this at the same time forgets the oldest pair: a
/// late reply from that backend then shows the backend's address, and the socket's next datagram
/// to that service chooses a backend again. Resolvers and metrics senders talk to one or two.
pub const DATAGRAM_PEERS: usize = 4;

/// One service an unconnected UDP socket sent to, and the backend it keeps for it.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DatagramPeer {
    /// ClusterIP the application sent to; IPv4 in the first four bytes. Zero: an unused entry.
    pub vip: [u8; 16],
    /// Service port, host byte order.
    pub vip_port: u16,
    /// `AF_INET` or `AF_INET6`: the family of `vip` and of the backend.
    pub family: u8,
    /// Always zero.
    pub _pad: u8,
    /// Backend set the backend was chosen from; a newer set means choose again.
    pub set_id: u32,
    /// The backend this socket keeps for the service while its set is unchanged.
    pub backend: Backend,
}
const _: () = assert!(size_of::<DatagramPeer>() == 44);

/// Socket-local state of an unconnected UDP socket that sent to services.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct DatagramPeers {
    /// The services this socket sent to most recently, at most [`DATAGRAM_PEERS`].
    pub peers: [DatagramPeer; DATAGRAM_PEERS],
    /// The entry the next new service replaces (round robin).
    pub next: u32,
}
const _: () = assert!(size_of::<DatagramPeers>() == 4 * 44 + 4);

/// What the socket iterator writes for each socket with a translation: the socket's cookie (as
/// `sock_diag` reports it) and the translation.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IterRecord {
    /// Socket cookie.
    pub cookie: u64,
    /// The socket's translation.
    pub translation: SockTranslation,
}
const _: () = assert!(size_of::<IterRecord>() == 48);
