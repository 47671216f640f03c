//! What the kernel measured of each backend, as the feedback control reads it: the load signal's
//! cumulative counters per backend of the TCP connections this node's hooks sent there
//! (`topology_common::BackendLoad`, read by the dataplane).

use std::net::SocketAddr;

use serde::Serialize;
use topology_common::BackendLoad;

/// One backend's counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MeasuredBackend {
    /// The backend's address and port.
    pub backend: SocketAddr,
    /// Connections in flight (started, not ended: connecting or open).
    pub in_flight: u64,
    /// Cumulative counters.
    #[serde(flatten)]
    pub load: LoadCounters,
}

/// [`BackendLoad`] as `status` and the metrics print it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadCounters {
    /// Handshakes started.
    pub connects: u64,
    /// Connections ended.
    pub closed: u64,
    /// Handshakes refused (or abandoned before a SYN retransmission).
    pub refused: u64,
    /// Handshakes that timed out (after a SYN retransmission).
    pub timed_out: u64,
    /// Connections reset.
    pub reset: u64,
    /// Sum of the ended connections' smoothed round-trip times, microseconds.
    pub rtt_us: u64,
    /// Sum of connection lifetimes, microseconds.
    pub lifetime_us: u64,
}

impl From<BackendLoad> for LoadCounters {
    fn from(load: BackendLoad) -> Self {
        Self {
            connects: load.connects,
            closed: load.closed,
            refused: load.refused,
            timed_out: load.timed_out,
            reset: load.reset,
            rtt_us: load.rtt_us,
            lifetime_us: load.lifetime_us,
        }
    }
}

impl MeasuredBackend {
    /// The counters the kernel keeps for `backend`.
    pub fn new(backend: SocketAddr, load: BackendLoad) -> Self {
        Self { backend, in_flight: load.in_flight(), load: load.into() }
    }

    /// Adds `other`'s counts to these: a sum of backends (its address stays this one's).
    pub fn add(&mut self, other: &Self) {
        let (sum, more) = (&mut self.load, &other.load);
        self.in_flight += other.in_flight;
        sum.connects += more.connects;
        sum.closed += more.closed;
        sum.refused += more.refused;
        sum.timed_out += more.timed_out;
        sum.reset += more.reset;
        sum.rtt_us += more.rtt_us;
        sum.lifetime_us += more.lifetime_us;
    }
}
