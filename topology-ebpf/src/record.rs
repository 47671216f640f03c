//! The per-socket records that undo a rewrite for the application: a connected socket's
//! translation (`getpeername()`, replies), an unconnected UDP socket's services and the backend
//! it keeps for each.
//!
//! UDP sockets keep theirs in socket storage, freed with the socket: a UDP socket's every datagram
//! is translated (a storage read is a pointer test on the sockets that have none). TCP
//! connections keep their translation in a direct-mapped array by socket cookie
//! (`TcpTranslation`), read by `getpeername()` and at the connection's end: allocating socket
//! storage costs a connect about 0.7 µs on our bench machine, an LRU hash insert 0.5–0.9 µs, an
//! array store next to nothing.

use aya_ebpf::{
    EbpfContext as _,
    helpers::generated::{bpf_get_netns_cookie, bpf_get_socket_cookie},
    programs::SockAddrContext,
};
use topology_common::{
    Backend, DATAGRAM_PEERS, DatagramPeer, DatagramPeers, IPPROTO_TCP, SockTranslation, TcpTranslation,
};

use crate::{
    choose::Pick,
    load,
    maps::{SOCK_CONNECTIONS, SOCK_DATAGRAMS, TCP_CONNECTIONS, tcp_connection_position},
    sockaddr::{self, Words},
};

/// Where a socket was headed: the ClusterIP, its port and family, and the socket's protocol.
#[derive(Clone, Copy)]
pub struct Addressed {
    /// `AF_INET` or `AF_INET6` (of the service, not of the socket: IPv4-mapped is AF_INET).
    pub family: u8,
    /// ClusterIP in the maps' form.
    pub vip: Words,
    /// Service port.
    pub port: u16,
    /// IP protocol number.
    pub proto: u8,
}

/// Records that this connected socket reaches `to` through the chosen backend, and whether the
/// load signal measures it (`measured`: its port is under feedback); false when the kernel could
/// not store it.
///
/// A TCP connection keeps its translation in the table by cookie. A measured one has its start
/// counted there, and its socket marked, one `setsockopt` on the socket the hook already holds
/// (`crate::load`); a kernel that does not allow that (before 6.12) gets the translation in
/// socket storage as well, marked measured.
#[inline(always)]
pub fn remember_connection(ctx: &SockAddrContext, to: &Addressed, choice: &Pick, measured: bool) -> bool {
    let translation = SockTranslation {
        vip: sockaddr::bytes(to.vip),
        backend: choice.backend.addr,
        vip_port: to.port,
        backend_port: choice.backend.port,
        family: to.family,
        proto: to.proto,
        flags: if measured { SockTranslation::MEASURED } else { 0 },
    };
    if to.proto == IPPROTO_TCP {
        // SAFETY: the helper accepts the sock_addr context; it names the context's socket.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        let Some(entry) = TCP_CONNECTIONS.get_ptr_mut(tcp_connection_position(cookie)) else {
            return false;
        };
        // A socket whose earlier connect through a measured port failed connects again.
        load::connecting_again(entry, cookie);
        // SAFETY: the helper accepts the sock_addr context. The client's namespace, for outlier
        // ejection's evidence; its low word (cookies count up from one).
        let client = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) } as u32;
        // SAFETY: an element of the array, valid for the program's lifetime. Another CPU writing
        // the same position at once leaves a torn entry, whose seal no reader accepts.
        unsafe {
            *entry = TcpTranslation {
                client,
                service_id: choice.service.service_id,
                set_size: choice.service.count,
                ..TcpTranslation::new(cookie, translation)
            }
        };
        if !measured || !load::on() {
            return true;
        }
        load::started(entry, &translation);
        if sockaddr::mark_measured(ctx) {
            return true;
        }
    }
    // SAFETY: the context's socket is valid for the program's lifetime.
    let record = unsafe { SOCK_CONNECTIONS.get_or_insert_ptr_mut(ctx, None) };
    if record.is_null() {
        return false;
    }
    // SAFETY: non-null storage of this socket, valid for the program's lifetime; only this
    // socket's own system calls touch it.
    unsafe { *record = translation };
    true
}

/// Forgets a connected socket's translation: a UDP socket connected again, to a destination
/// that is not a service, must not show the old ClusterIP.
#[inline(always)]
pub fn forget_connection(ctx: &SockAddrContext) {
    // SAFETY: as in `remember_connection`, without creating storage.
    let record = unsafe { SOCK_CONNECTIONS.get_ptr_mut(ctx) };
    if !record.is_null() {
        // SAFETY: as in `remember_connection`. A zero family matches no peer.
        unsafe { (*record).family = 0 };
    }
}

/// The ClusterIP and port this connected socket addressed, if its `connect()` was rewritten to
/// exactly `addr:port` of `family`: from its storage, else (`tcp`: a TCP socket, so its
/// translation may be kept by cookie) from the TCP connections' table.
#[inline(always)]
pub fn connection_translation(
    ctx: &SockAddrContext,
    family: u8,
    addr: Words,
    port: u16,
    tcp: bool,
) -> Option<(Words, u16)> {
    // SAFETY: as in `forget_connection`.
    let record = unsafe { SOCK_CONNECTIONS.get_ptr_mut(ctx) };
    let record = if !record.is_null() {
        // SAFETY: as in `remember_connection`; copied out at once.
        unsafe { *record }
    } else if tcp {
        // SAFETY: as in `remember_connection`.
        let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
        crate::maps::tcp_connection(cookie)?.1
    } else {
        return None;
    };
    (record.family == family && record.backend_port == port && sockaddr::words(&record.backend) == addr)
        .then_some((sockaddr::words(&record.vip), record.vip_port))
}

/// An unconnected UDP socket's record of the services it sent to; null when it has none and
/// `create` is false, or when the kernel could not allocate it.
#[inline(always)]
pub fn datagram_peers(ctx: &SockAddrContext, create: bool) -> *mut DatagramPeers {
    // SAFETY: as in `remember_connection`.
    unsafe { if create { SOCK_DATAGRAMS.get_or_insert_ptr_mut(ctx, None) } else { SOCK_DATAGRAMS.get_ptr_mut(ctx) } }
}

/// The entry of `peers` for the service at `to`, if this socket sent to it recently.
#[inline(always)]
pub fn find_service(peers: &DatagramPeers, to: &Addressed) -> Option<usize> {
    (0..DATAGRAM_PEERS).find(|&i| {
        let peer = &peers.peers[i];
        peer.family == to.family && peer.vip_port == to.port && sockaddr::words(&peer.vip) == to.vip
    })
}

/// Records in `peers` (at `entry`, or replacing the oldest) that the socket keeps `choice`'s
/// backend for the service at `to`.
#[inline(always)]
pub fn keep_datagram_peer(peers: &mut DatagramPeers, entry: Option<usize>, to: &Addressed, choice: &Pick) {
    let index = match entry {
        Some(index) => index,
        None => {
            let next = peers.next as usize % DATAGRAM_PEERS;
            peers.next = ((next + 1) % DATAGRAM_PEERS) as u32;
            next
        }
    };
    if index < DATAGRAM_PEERS {
        peers.peers[index] = DatagramPeer {
            vip: sockaddr::bytes(to.vip),
            vip_port: to.port,
            family: to.family,
            _pad: 0,
            set_id: choice.service.set_id,
            backend: choice.backend,
        };
    }
}

/// The entry of an unconnected socket's record for the backend at `addr:port`: the service it
/// sent to there, and the set it chose that backend from.
#[inline(always)]
pub fn datagram_peer(ctx: &SockAddrContext, family: u8, addr: Words, port: u16) -> Option<DatagramPeer> {
    let peers = datagram_peers(ctx, false);
    if peers.is_null() {
        return None;
    }
    // SAFETY: non-null storage of this socket (see `remember_connection`).
    let peers = unsafe { &*peers };
    let source = Backend { addr: sockaddr::bytes(addr), port, locality: 0, _pad: 0 };
    (0..DATAGRAM_PEERS).find_map(|i| {
        let peer = &peers.peers[i];
        (peer.family == family && crate::choose::same(&peer.backend, &source)).then_some(*peer)
    })
}
