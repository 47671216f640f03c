//! The states of passive outlier ejection that cost a connect anything, set on a hooked node's
//! maps so its rows measure them like every other: another backend of the node failing (the
//! connect hook reads the chosen backend's bucket), and the chosen backends themselves failing
//! (a hash lookup, and the connection counted). With nothing failing the hook reads one array
//! element; the tracing programs run only where a handshake fails (the run counts them).

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use aya::maps::{Array, HashMap, Map, MapData};
use topology_common::{
    BackendKey, OutlierEntry, OutlierKey, OutlierState, ServiceKey4, ServiceValue, map_names,
    outlier::{BUCKETS, bucket_of},
};
use topology_dataplane::PinLayout;

/// A state of the node's outlier maps.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Another backend of the node failing.
    Elsewhere,
    /// The chosen backends failing (not ejected).
    Chosen,
}

/// The outlier maps of one pin directory.
pub struct Maps {
    state: Array<MapData, OutlierState>,
    entries: HashMap<MapData, OutlierKey, OutlierEntry>,
    /// The ids of the service ports at the dialled ClusterIP: its backends fail through them.
    service_ids: Vec<u32>,
}

impl Maps {
    /// The maps of `layout`'s node, whose clients dial `target`.
    pub fn open(layout: &PinLayout, target: SocketAddr) -> Self {
        let open = |name: &str| MapData::from_pin(layout.map(name)).unwrap_or_else(|e| panic!("open {name}: {e}"));
        Self {
            state: Array::try_from(Map::Array(open(map_names::OUTLIER_STATE))).expect("state"),
            entries: HashMap::try_from(Map::LruHashMap(open(map_names::OUTLIERS))).expect("entries"),
            service_ids: {
                let services: HashMap<MapData, ServiceKey4, ServiceValue> =
                    HashMap::try_from(Map::HashMap(open(map_names::SERVICES_V4))).expect("services");
                let IpAddr::V4(vip) = target.ip() else { panic!("an IPv4 target: {target}") };
                services
                    .iter()
                    .filter_map(Result::ok)
                    .filter(|(key, _)| key.addr == vip.octets() && key.port == target.port())
                    .map(|(_, value)| value.service_id)
                    .collect()
            },
        }
    }

    /// Puts the node in `state` for `backends` (those the measured Service balances over).
    pub fn enter(&mut self, state: State, backends: &[SocketAddr]) {
        let mut flags = OutlierState { active: 1, ..OutlierState::default() };
        if state == State::Chosen {
            for key in backends.iter().map(key) {
                let bucket = bucket_of(&key.addr, key.port);
                assert!(bucket < BUCKETS);
                flags.flag(bucket);
                let entry = OutlierEntry { failures: 1, last_failure_ns: now_ns(), ..OutlierEntry::default() };
                for &service_id in &self.service_ids {
                    self.entries.insert(OutlierKey { backend: key, service_id }, entry, 0).expect("entry");
                }
            }
        } else {
            // Another backend's bucket: none of these.
            let taken: Vec<u32> = backends.iter().map(key).map(|k| bucket_of(&k.addr, k.port)).collect();
            flags.flag((0..BUCKETS).find(|b| !taken.contains(b)).expect("a free bucket"));
        }
        self.state.set(0, flags, 0).expect("state");
    }
}

fn key(backend: &SocketAddr) -> BackendKey {
    let mut addr = [0u8; 16];
    let family = match backend.ip() {
        IpAddr::V4(v4) => {
            addr[..4].copy_from_slice(&v4.octets());
            libc::AF_INET as u8
        }
        IpAddr::V6(v6) => {
            addr.copy_from_slice(&v6.octets());
            libc::AF_INET6 as u8
        }
    };
    BackendKey { addr, port: backend.port(), family, _pad: 0 }
}

/// `CLOCK_MONOTONIC`, nanoseconds (the programs' clock).
fn now_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32).as_nanos() as u64
}
