//! The load signal: what the programs measure of the TCP connections the connect hooks rewrote,
//! per backend, on this node. For request-per-connection traffic the connections in
//! flight to a backend are its throughput times its latency (Little's law): the load a
//! latency-aware proxy would measure, here without a proxy and without any per-packet cost.

use core::mem::size_of;

/// A backend as the load map names it: address, port and family.
#[repr(C, align(4))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BackendKey {
    /// Address, network byte order; IPv4 in the first four bytes, zeros after it.
    pub addr: [u8; 16],
    /// Port, host byte order.
    pub port: u16,
    /// `AF_INET` or `AF_INET6`.
    pub family: u8,
    /// Always zero.
    pub _pad: u8,
}
const _: () = assert!(size_of::<BackendKey>() == 20);

/// Cumulative counters of the TCP connections this node's hooks sent to one backend, counted where
/// a connection starts (the connect hook) and where its socket ends (`tcp_destroy_sock`). The
/// programs add to them atomically; readers take differences between two readings.
///
/// Derived figures: connections in flight (connecting or open) = `connects - closed - refused -
/// timed_out`; mean lifetime = `lifetime_us / closed`; mean round-trip time = `rtt_us / closed`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BackendLoad {
    /// `connect()`s rewritten to this backend.
    pub connects: u64,
    /// Connections that completed their handshake and ended (any way).
    pub closed: u64,
    /// Handshakes that failed without a retransmitted SYN: the backend refused (RST), or the
    /// application gave up within the first retransmission timeout or connected again.
    pub refused: u64,
    /// Handshakes that failed after at least one SYN retransmission: nobody answered in time.
    pub timed_out: u64,
    /// Ended connections the backend reset (a RST received after the handshake; counted while
    /// the outlier ejection programs run, which see it).
    pub reset: u64,
    /// Sum of the smoothed round-trip times of the ended connections, microseconds.
    pub rtt_us: u64,
    /// Sum of the lifetimes (connect to end) of the ended connections whose start the node still
    /// knew at their end (nearly all: see `TcpTranslation`), microseconds.
    pub lifetime_us: u64,
    /// `CLOCK_MONOTONIC` when the program created the entry, nanoseconds; not a counter. A
    /// connection that started before it was counted in an earlier entry (one the agent pruned or
    /// cleared) and adds nothing here: no end is counted without its start, so nothing stays in
    /// flight that is not.
    pub created_ns: u64,
}
const _: () = assert!(size_of::<BackendLoad>() == (BackendLoad::FIELDS + 1) * size_of::<u64>());
const _: () = assert!(core::mem::offset_of!(BackendLoad, created_ns) == BackendLoad::FIELDS * size_of::<u64>());

impl BackendLoad {
    /// Number of counters; the program addresses them as `[u64; FIELDS]` in field order, before
    /// [`BackendLoad::created_ns`].
    pub const FIELDS: usize = 7;
    /// Index of [`BackendLoad::connects`].
    pub const CONNECTS: usize = 0;
    /// Index of [`BackendLoad::closed`].
    pub const CLOSED: usize = 1;
    /// Index of [`BackendLoad::refused`].
    pub const REFUSED: usize = 2;
    /// Index of [`BackendLoad::timed_out`].
    pub const TIMED_OUT: usize = 3;
    /// Index of [`BackendLoad::reset`].
    pub const RESET: usize = 4;
    /// Index of [`BackendLoad::rtt_us`].
    pub const RTT_US: usize = 5;
    /// Index of [`BackendLoad::lifetime_us`].
    pub const LIFETIME_US: usize = 6;

    /// Connections started and not ended yet, connecting or open (0 if a reading raced an end).
    pub fn in_flight(&self) -> u64 {
        self.connects.saturating_sub(self.closed + self.refused + self.timed_out)
    }

    /// Handshakes that failed.
    pub fn failed(&self) -> u64 {
        self.refused + self.timed_out
    }
}

const _: () = assert!(core::mem::offset_of!(BackendLoad, lifetime_us) == BackendLoad::LIFETIME_US * size_of::<u64>());
const _: () = assert!(core::mem::offset_of!(BackendLoad, reset) == BackendLoad::RESET * size_of::<u64>());
const _: () = assert!(core::mem::offset_of!(BackendLoad, rtt_us) == BackendLoad::RTT_US * size_of::<u64>());

/// Overload answered per connection, on a port under feedback: the connect hook drew a backend by
/// weight with `drawn` connections in flight from this node; when that is at least the port's
/// `limit` (0: off), it looks at one more backend of the set drawn uniformly, `other` in flight,
/// and moves the connection there if it carries fewer than half as many. Below the limit the
/// weighted draw stands, so the plan's locality holds; above it the connection goes to the
/// lighter of two (power of two choices), biased to the one the plan drew.
#[inline(always)]
pub fn spill(drawn: u64, other: u64, limit: u32) -> bool {
    limit != 0 && drawn >= u64::from(limit) && other.saturating_mul(2) < drawn
}

#[cfg(test)]
mod tests {
    use super::spill;

    #[test]
    fn a_connection_spills_only_past_the_limit_and_only_to_a_backend_half_as_loaded() {
        assert!(!spill(100, 0, 0), "no limit: never");
        assert!(!spill(3, 0, 4), "under the limit the weighted draw stands");
        assert!(spill(4, 1, 4), "at the limit, to one with fewer than half");
        assert!(!spill(4, 2, 4), "half as many is not fewer than half");
        assert!(!spill(9, 9, 4), "as loaded: stay");
        assert!(spill(u64::MAX, u64::MAX / 2 - 1, 4), "no overflow");
    }
}
