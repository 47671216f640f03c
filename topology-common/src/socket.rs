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

/// A TCP connection's translation in the direct-mapped table of TCP connections
/// (`map_names::TCP_CONNECTIONS`), at position `cookie & mask`: the socket's cookie and a seal
/// over both, so a reader takes it only if it is this socket's and whole; for a connection the
/// load signal measures, also when the connect hook started it and what the tracing programs
/// saw of it (outside the seal).
///
/// Socket cookies are handed out in increasing order, so a position is overwritten only after
/// about as many newer cookies as the table has positions: the oldest entries go first, as in an
/// LRU, for the price of an array store instead of a hash insert. Two writers racing for one
/// position (two connections with the same `cookie & mask`, at the same instant) leave an entry
/// whose seal fails: no reader takes a mix of the two.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TcpTranslation {
    /// The socket's cookie; 0 for a free position.
    pub cookie: u64,
    /// What it was rewritten from and to.
    pub translation: SockTranslation,
    /// [`TcpTranslation::seal_of`] the two fields above.
    pub seal: u64,
    /// `CLOCK_MONOTONIC` when a measured connection was started (and counted) by the connect
    /// hook, nanoseconds; 0 otherwise, and once its end was counted.
    pub connect_ns: u64,
    /// What the tracing programs saw of the connection: [`TcpTranslation::HANDSHAKE_FAILED`],
    /// [`TcpTranslation::RESET`].
    pub marks: u32,
    /// The client: the low word of its network namespace's cookie (outlier ejection counts a
    /// run's failures by client).
    pub client: u32,
    /// The Service port's id (`ServiceValue::service_id`): the port a failed handshake is
    /// charged through.
    pub service_id: u32,
    /// Slots of the port's set when the connection was made (the ejection cap's measure).
    pub set_size: u32,
}
const _: () = assert!(size_of::<TcpTranslation>() == 80);

impl TcpTranslation {
    /// A mark: a failure of its handshake was counted (`outlier`), so the socket's later failures
    /// (another unanswered SYN, then a reset) count nothing more.
    pub const HANDSHAKE_FAILED: u32 = 1;
    /// A mark: the backend reset the connection after its handshake.
    pub const RESET: u32 = 2;

    /// The entry of `translation` for the socket `cookie` (of no client, through no port).
    #[inline(always)]
    pub fn new(cookie: u64, translation: SockTranslation) -> Self {
        Self {
            cookie,
            translation,
            seal: Self::seal_of(cookie, &translation),
            connect_ns: 0,
            marks: 0,
            client: 0,
            service_id: 0,
            set_size: 0,
        }
    }

    /// A mix of the cookie and every byte of the translation (FNV-style over 32-bit words), never 0.
    #[inline(always)]
    pub fn seal_of(cookie: u64, translation: &SockTranslation) -> u64 {
        let t = translation;
        let words = [
            u32::from_ne_bytes([t.vip[0], t.vip[1], t.vip[2], t.vip[3]]),
            u32::from_ne_bytes([t.vip[4], t.vip[5], t.vip[6], t.vip[7]]),
            u32::from_ne_bytes([t.vip[8], t.vip[9], t.vip[10], t.vip[11]]),
            u32::from_ne_bytes([t.vip[12], t.vip[13], t.vip[14], t.vip[15]]),
            u32::from_ne_bytes([t.backend[0], t.backend[1], t.backend[2], t.backend[3]]),
            u32::from_ne_bytes([t.backend[4], t.backend[5], t.backend[6], t.backend[7]]),
            u32::from_ne_bytes([t.backend[8], t.backend[9], t.backend[10], t.backend[11]]),
            u32::from_ne_bytes([t.backend[12], t.backend[13], t.backend[14], t.backend[15]]),
            u32::from(t.vip_port) | u32::from(t.backend_port) << 16,
            u32::from(t.family) | u32::from(t.proto) << 8 | u32::from(t.flags) << 16,
        ];
        let mut seal = cookie ^ 0xcbf2_9ce4_8422_2325;
        let mut i = 0;
        while i < words.len() {
            seal = (seal ^ u64::from(words[i])).wrapping_mul(0x0000_0100_0000_01b3);
            i += 1;
        }
        seal | 1
    }

    /// The translation, if this entry is `cookie`'s and whole.
    #[inline(always)]
    pub fn of(&self, cookie: u64) -> Option<SockTranslation> {
        (cookie != 0 && self.cookie == cookie && self.seal == Self::seal_of(cookie, &self.translation))
            .then_some(self.translation)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn translation(vip_last: u8) -> SockTranslation {
        SockTranslation {
            vip: [10, 96, 0, vip_last, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            backend: [10, 244, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            vip_port: 80,
            backend_port: 8080,
            family: 2,
            proto: 6,
            flags: 0,
        }
    }

    #[test]
    fn an_entry_is_taken_only_by_its_own_socket_and_only_whole() {
        let entry = TcpTranslation::new(42, translation(10));
        assert_eq!(entry.of(42), Some(translation(10)));
        assert_eq!(entry.of(43), None, "another socket at the same position");
        assert_eq!(TcpTranslation::default().of(0), None, "a free position is nobody's");
        // Two writers racing for one position: one's cookie and seal, the other's fields.
        let other = TcpTranslation::new(42 + 131_072, translation(11));
        let torn = TcpTranslation { translation: other.translation, ..entry };
        assert_eq!(torn.of(42), None);
        let torn = TcpTranslation { cookie: other.cookie, ..entry };
        assert_eq!(torn.of(other.cookie), None);
        // Any one field changed breaks the seal.
        for change in [
            |t: &mut SockTranslation| t.vip[15] = 1,
            |t: &mut SockTranslation| t.backend[3] ^= 1,
            |t: &mut SockTranslation| t.vip_port += 1,
            |t: &mut SockTranslation| t.backend_port += 1,
            |t: &mut SockTranslation| t.family = 10,
            |t: &mut SockTranslation| t.flags = 1,
        ] {
            let mut bent = entry;
            change(&mut bent.translation);
            assert_eq!(bent.of(42), None, "{bent:?}");
        }
    }
}
