//! The agent's heartbeat in the kernel, which makes a node whose agent is gone fail open, and the
//! node-wide counters that say how often that happened.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use aya::maps::{Array, MapData, PerCpuArray};
use serde::Serialize;
use topology_common::{DnsSteer, Heartbeat, NodeCounters, map_names};

use super::error::DataplaneError;

/// How long the programs keep rewriting after a heartbeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailOpen {
    after: Option<Duration>,
}

impl FailOpen {
    /// Fail open `after` the last heartbeat; `None`: never.
    pub fn new(after: Option<Duration>) -> Self {
        Self { after }
    }

    /// True when the programs never fail open.
    pub fn never(&self) -> bool {
        self.after.is_none()
    }

    /// The deadline a heartbeat at `now_ns` sets.
    fn deadline(&self, now_ns: u64) -> u64 {
        match self.after {
            None => u64::MAX,
            // Never u64::MAX itself, which means "never".
            Some(after) => now_ns.saturating_add(u64::try_from(after.as_nanos()).unwrap_or(u64::MAX)).min(u64::MAX - 1),
        }
    }
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds: the clock `bpf_ktime_get_coarse_ns` reads.
pub fn now_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `now` is a valid timespec to write; the clock id is valid on every Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    (now.tv_sec as u64).saturating_mul(1_000_000_000).saturating_add(now.tv_nsec as u64)
}

/// Writes a heartbeat: the programs rewrite until `fail_open`'s deadline from now.
pub fn beat(map: &mut Array<MapData, Heartbeat>, fail_open: &FailOpen) -> Result<(), DataplaneError> {
    let beat = Heartbeat { deadline_ns: fail_open.deadline(now_ns()) };
    map.set(0, beat, 0).map_err(DataplaneError::map(map_names::HEARTBEAT))
}

/// The heartbeat as the programs see it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatReading {
    /// The programs never fail open.
    pub never_fails_open: bool,
    /// Nanoseconds until the programs fail open (0: they already do).
    pub remaining_ns: u64,
    /// Nanoseconds since they started to (0: they rewrite).
    pub lapsed_ns: u64,
}

impl HeartbeatReading {
    /// True when the programs pass every connection through untouched.
    pub fn failing_open(&self) -> bool {
        !self.never_fails_open && self.remaining_ns == 0
    }
}

/// Reads the heartbeat.
pub fn read(map: &Array<MapData, Heartbeat>) -> Result<HeartbeatReading, DataplaneError> {
    let beat = map.get(&0, 0).map_err(DataplaneError::map(map_names::HEARTBEAT))?;
    Ok(reading(beat.deadline_ns, now_ns()))
}

/// The reading of a deadline at `now`.
fn reading(deadline_ns: u64, now_ns: u64) -> HeartbeatReading {
    HeartbeatReading {
        never_fails_open: deadline_ns == u64::MAX,
        remaining_ns: if deadline_ns == u64::MAX { u64::MAX } else { deadline_ns.saturating_sub(now_ns) },
        lapsed_ns: if deadline_ns == u64::MAX { 0 } else { now_ns.saturating_sub(deadline_ns) },
    }
}

/// The node-local DNS responder's heartbeat (`map_names::DNS_STEER`), on its own descriptor: the
/// responder's prober writes it, never blocking the controller.
pub struct DnsBeat {
    map: Array<MapData, DnsSteer>,
}

impl DnsBeat {
    /// Opens the pinned map under `layout` (the programs are loaded: it exists).
    pub(super) fn open(layout: &super::PinLayout) -> Result<Self, DataplaneError> {
        let name = map_names::DNS_STEER;
        let data = MapData::from_pin(layout.map(name)).map_err(DataplaneError::map(name))?;
        let map = aya::maps::Map::from_map_data(data).map_err(DataplaneError::map(name))?;
        Ok(Self { map: map.try_into().map_err(DataplaneError::map(name))? })
    }

    /// Keeps the steering to `responder` on for `grace` from now; ports whose entry names another
    /// address are not steered.
    pub fn refresh(&mut self, responder: SocketAddr, grace: Duration) -> Result<(), DataplaneError> {
        let deadline_ns = FailOpen::new(Some(grace)).deadline(now_ns());
        self.write(steer_record(responder, deadline_ns))
    }

    /// Turns the steering off now.
    pub fn stop(&mut self) -> Result<(), DataplaneError> {
        self.write(DnsSteer::default())
    }

    fn write(&mut self, record: DnsSteer) -> Result<(), DataplaneError> {
        self.map.set(0, record, 0).map_err(DataplaneError::map(map_names::DNS_STEER))
    }
}

/// The record that steers to `responder` until `deadline_ns`, its address laid out as a backend's.
fn steer_record(responder: SocketAddr, deadline_ns: u64) -> DnsSteer {
    let mut addr = [0u8; 16];
    match responder.ip() {
        IpAddr::V4(ip) => addr[..4].copy_from_slice(&ip.octets()),
        IpAddr::V6(ip) => addr = ip.octets(),
    }
    DnsSteer { deadline_ns, addr, port: responder.port(), _pad: [0; 6] }
}

/// The node counters summed over CPUs.
pub fn read_node_counters(map: &PerCpuArray<MapData, NodeCounters>) -> Result<NodeCounters, DataplaneError> {
    let per_cpu = map.get(&0, 0).map_err(DataplaneError::map(map_names::NODE_COUNTERS))?;
    Ok(per_cpu.iter().fold(NodeCounters::default(), |sum, cpu| NodeCounters {
        fail_open: sum.fail_open + cpu.fail_open,
        retired: 0,
        no_storage: sum.no_storage + cpu.no_storage,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_never_mean_never_by_accident() {
        assert_eq!(FailOpen::new(None).deadline(5), u64::MAX);
        assert_eq!(FailOpen::new(Some(Duration::from_secs(2))).deadline(1_000), 2_000_001_000);
        assert_eq!(FailOpen::new(Some(Duration::MAX)).deadline(1), u64::MAX - 1, "a huge delay is not 'never'");
    }

    #[test]
    fn the_steering_record_names_the_responder_as_a_backend_would() {
        let v4 = steer_record("10.0.0.5:53".parse().unwrap(), 7);
        assert_eq!((v4.deadline_ns, v4.port), (7, 53));
        assert_eq!(v4.addr, [10, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let v6 = steer_record("[fd00::5]:5353".parse().unwrap(), 9);
        assert_eq!((v6.addr, v6.port), ("fd00::5".parse::<std::net::Ipv6Addr>().unwrap().octets(), 5353));
        let backend = topology_policy::plan::alias::build(&[topology_policy::desired::WeightedBackend {
            addr: "10.0.0.5".parse().unwrap(),
            port: 53,
            weight: 1,
            locality: topology_policy::desired::Locality::Node,
        }]);
        assert_eq!((backend[0].primary.addr, backend[0].primary.port), (v4.addr, v4.port), "as the slot holds it");
    }

    #[test]
    fn readings_say_whether_the_programs_fail_open() {
        let fresh = reading(10_000, 4_000);
        assert_eq!((fresh.remaining_ns, fresh.lapsed_ns, fresh.failing_open()), (6_000, 0, false));
        let lapsed = reading(10_000, 25_000);
        assert_eq!((lapsed.remaining_ns, lapsed.lapsed_ns, lapsed.failing_open()), (0, 15_000, true));
        assert!(reading(0, 1).failing_open(), "a map no agent wrote fails open");
        assert!(!reading(u64::MAX, 1).failing_open());
    }
}
