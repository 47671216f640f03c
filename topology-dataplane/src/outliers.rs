//! The outlier ejections as the tracing program left them (see `topology_common::outlier`):
//! which backends this node's hooks avoid now, and which are failing.

use std::{net::SocketAddr, time::Duration};

use aya::maps::{HashMap, MapData};
use topology_common::{BackendKey, OutlierEntry, map_names};

use super::{backend_load::socket_addr, error::DataplaneError, heartbeat::now_ns};

/// The outlier map's typed handle.
pub type OutlierMap = HashMap<MapData, BackendKey, OutlierEntry>;

/// One backend the tracing program recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outlier {
    /// The backend.
    pub backend: SocketAddr,
    /// Handshakes failed in a row since its last success or ejection.
    pub failures: u32,
    /// Times ejected.
    pub ejections: u32,
    /// How long it is avoided still; zero when it is not ejected.
    pub ejected_for: Duration,
}

impl Outlier {
    /// Whether this node's hooks avoid it now.
    pub fn ejected(&self) -> bool {
        !self.ejected_for.is_zero()
    }
}

/// Every backend with a failure in a row or an ejection in force, by address (entries of
/// backends that recovered are left out: the map is LRU and forgets them).
pub fn read(map: &OutlierMap) -> Result<Vec<Outlier>, DataplaneError> {
    let now = now_ns();
    let mut outliers = Vec::new();
    for entry in map.iter() {
        let (key, entry) = entry.map_err(DataplaneError::map(map_names::OUTLIERS))?;
        let ejected_for = Duration::from_nanos(entry.ejected_until_ns.saturating_sub(now));
        if entry.failures == 0 && ejected_for.is_zero() {
            continue;
        }
        if let Some(backend) = socket_addr(&key) {
            outliers.push(Outlier { backend, failures: entry.failures, ejections: entry.ejections, ejected_for });
        }
    }
    outliers.sort_by_key(|o| o.backend);
    Ok(outliers)
}
