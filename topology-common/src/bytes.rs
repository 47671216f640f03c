//! Bytes per Service port and backend, counted by the kernel for every TCP connection the connect
//! hooks rewrote (cross-zone traffic accounting): nothing on the connect path. A connection's
//! totals are read from its socket (`tcp_sock.bytes_acked`, `bytes_received`) when it is
//! destroyed (`tp_btf/tcp_destroy_sock`), and every sweep of the agent (`iter/tcp`) reads those
//! of the connections still open, so a connection of hours shows as it goes. What was counted
//! of an open connection is kept in its socket storage ([`SockBytes`], made by its first sweep),
//! so each byte is counted once.
//!
//! UDP sockets keep no byte counters: with `--byte-accounting all` their datagrams are counted one
//! by one where the kernel reports each send and receive of a socket (`tp_btf/sock_send_length`,
//! `sock_recv_length`, node-wide). A connected socket's datagrams count against its translation;
//! an unconnected socket's against the backend the send or receive hook translated just before,
//! left for the tracepoint in a per-CPU [`DatagramBytes`] of the thread and socket.

use crate::SockTranslation;

/// Bytes a client's connections moved, both directions, as its sockets count them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ByteCount {
    /// Sent by the client and acknowledged by the backend (`tcp_sock.bytes_acked`).
    pub to_backend: u64,
    /// Received from the backend, in order (`tcp_sock.bytes_received`).
    pub from_backend: u64,
}
const _: () = assert!(size_of::<ByteCount>() == 16);

impl ByteCount {
    /// What `self` has beyond `counted`: a connection's new bytes since they were last counted.
    #[inline(always)]
    pub fn since(&self, counted: &Self) -> Self {
        Self {
            to_backend: self.to_backend.saturating_sub(counted.to_backend),
            from_backend: self.from_backend.saturating_sub(counted.from_backend),
        }
    }
}

/// What has been counted of one open connection (its socket storage in
/// [`map_names::SOCK_BYTES`](crate::map_names::SOCK_BYTES)), made by the first sweep that finds
/// it; the destroy program counts only what came after.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SockBytes {
    /// Where its bytes are counted ([`SockTranslation::bytes_key`]): kept here because its entry
    /// in the TCP connections table goes after about a table of newer sockets.
    pub key: SockTranslation,
    /// Its totals when last counted.
    pub counted: ByteCount,
}
const _: () = assert!(size_of::<SockBytes>() == 56);

/// The datagram an unconnected UDP socket is sending or receiving through a Service: written by
/// the send or receive hook that translated it, read (and cleared) by the tracepoint that sees
/// its length, on the same CPU in the same system call (per-CPU entry
/// [`DatagramBytes::SENT`] or [`DatagramBytes::RECEIVED`] of
/// [`map_names::UDP_LAST`](crate::map_names::UDP_LAST)).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatagramBytes {
    /// The socket's cookie; 0: nothing pending.
    pub cookie: u64,
    /// The thread (`bpf_get_current_pid_tgid`) that sends or receives it.
    pub thread: u64,
    /// Where its bytes count ([`SockTranslation::bytes_key`]).
    pub key: SockTranslation,
}
const _: () = assert!(size_of::<DatagramBytes>() == 56);

impl DatagramBytes {
    /// The entry of a datagram being sent.
    pub const SENT: u32 = 0;
    /// The entry of a datagram being received.
    pub const RECEIVED: u32 = 1;
}

impl SockTranslation {
    /// The key of the bytes of connections with this translation
    /// ([`map_names::BYTES`](crate::map_names::BYTES)): Service port and backend, flags cleared.
    #[inline(always)]
    pub fn bytes_key(&self) -> Self {
        Self { flags: 0, ..*self }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_bytes_are_what_came_after_the_last_count() {
        let counted = ByteCount { to_backend: 100, from_backend: 7 };
        let now = ByteCount { to_backend: 150, from_backend: 7 };
        assert_eq!(now.since(&counted), ByteCount { to_backend: 50, from_backend: 0 });
        // A count never runs backwards (a socket reused after a failed connect starts again).
        assert_eq!(counted.since(&now), ByteCount { to_backend: 0, from_backend: 0 });
    }

    #[test]
    fn the_key_drops_the_flags() {
        let translation = SockTranslation { vip_port: 80, flags: SockTranslation::MEASURED, ..Default::default() };
        assert_eq!(translation.bytes_key(), SockTranslation { vip_port: 80, ..Default::default() });
    }
}
