//! The load signal as the programs left it: cumulative counters per backend of the TCP
//! connections this node's hooks sent there (see `topology_common::load`).

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use aya::maps::{HashMap, MapData};
use topology_common::{AF_INET, AF_INET6, BackendKey, BackendLoad, map_names};
use topology_policy::feedback::measured::MeasuredBackend;

use super::error::DataplaneError;

/// The load map's typed handle.
pub type LoadMap = HashMap<MapData, BackendKey, BackendLoad>;

/// Every measured backend, by address. Entries whose key is not a valid backend (a map edited by
/// hand) are skipped.
pub fn read(map: &LoadMap) -> Result<Vec<MeasuredBackend>, DataplaneError> {
    let mut backends = Vec::new();
    for entry in map.iter() {
        let (key, load) = entry.map_err(DataplaneError::map(map_names::BACKEND_LOAD))?;
        if let Some(backend) = socket_addr(&key) {
            backends.push(MeasuredBackend::new(backend, load));
        }
    }
    backends.sort_by_key(|b| b.backend);
    Ok(backends)
}

/// The measured backends with nothing in flight (candidates for [`remove`]), and the keys that
/// name no valid backend (a map edited by hand).
pub fn idle(map: &LoadMap) -> Result<(BTreeSet<SocketAddr>, Vec<BackendKey>), DataplaneError> {
    let (mut idle, mut invalid) = (BTreeSet::new(), Vec::new());
    for entry in map.iter() {
        let (key, load) = entry.map_err(DataplaneError::map(map_names::BACKEND_LOAD))?;
        if load.in_flight() == 0 {
            match socket_addr(&key) {
                Some(backend) => {
                    idle.insert(backend);
                }
                None => invalid.push(key),
            }
        }
    }
    Ok((idle, invalid))
}

/// Removes the counters of `backends` and `invalid` keys; returns how many went.
pub fn remove(
    map: &mut LoadMap,
    backends: BTreeSet<SocketAddr>,
    invalid: Vec<BackendKey>,
) -> Result<usize, DataplaneError> {
    let keys: Vec<BackendKey> = invalid.into_iter().chain(backends.into_iter().map(key)).collect();
    for key in &keys {
        match map.remove(key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(error) => return Err(DataplaneError::map(map_names::BACKEND_LOAD)(error)),
        }
    }
    Ok(keys.len())
}

/// The backend a key names, if it is a valid one.
pub fn socket_addr(key: &BackendKey) -> Option<SocketAddr> {
    let ip = match key.family {
        AF_INET => {
            let [a, b, c, d, rest @ ..] = key.addr;
            if rest != [0; 12] {
                return None;
            }
            IpAddr::V4(Ipv4Addr::new(a, b, c, d))
        }
        AF_INET6 => IpAddr::V6(Ipv6Addr::from(key.addr)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, key.port))
}

/// The key of a backend.
fn key(backend: SocketAddr) -> BackendKey {
    let (addr, family) = match backend.ip() {
        IpAddr::V4(v4) => {
            let mut addr = [0; 16];
            addr[..4].copy_from_slice(&v4.octets());
            (addr, AF_INET)
        }
        IpAddr::V6(v6) => (v6.octets(), AF_INET6),
    };
    BackendKey { addr, port: backend.port(), family, _pad: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_reject_what_no_backend_is() {
        for text in ["10.0.0.7:8080", "[fd00::7]:443"] {
            let backend: SocketAddr = text.parse().unwrap();
            assert_eq!(socket_addr(&key(backend)), Some(backend));
        }
        let mut stray = key("10.0.0.7:80".parse().unwrap());
        stray.addr[9] = 1;
        assert_eq!(socket_addr(&stray), None);
        assert_eq!(socket_addr(&BackendKey { family: 1, ..stray }), None);
    }

    #[test]
    fn derived_figures_never_underflow() {
        let load = BackendLoad { connects: 10, closed: 5, refused: 1, timed_out: 1, ..Default::default() };
        assert_eq!((load.in_flight(), load.failed()), (3, 2));
        // A reading that raced an end (the end's add seen, the start's not yet).
        let raced = BackendLoad { connects: 3, closed: 3, refused: 1, ..Default::default() };
        assert_eq!(raced.in_flight(), 0);
    }
}
