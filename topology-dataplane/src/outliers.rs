//! The outlier ejections as the tracing program left them (see `topology_common::outlier`):
//! which backends this node's hooks avoid now, and which are failing, per Service port.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use aya::maps::{Array, HashMap, MapData};
use topology_common::{
    OutlierEntry, OutlierKey, OutlierLedger, OutlierState, map_names,
    outlier::{BUCKET_WORDS, FAILING_WINDOW_NS, bucket_of},
};
use topology_policy::desired::ServicePort;

use super::{backend_load::socket_addr, error::DataplaneError, heartbeat::now_ns, layout::PinLayout};

/// The outlier map's typed handle.
pub type OutlierMap = HashMap<MapData, OutlierKey, OutlierEntry>;
/// The ledgers' typed handle.
type LedgerMap = HashMap<MapData, u32, OutlierLedger>;

/// One backend the tracing program recorded, through one Service port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outlier {
    /// The Service port whose set it is ejected from (and whose failures counted).
    pub service: ServicePort,
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

/// Every backend with a failure in a row or an ejection in force through a port `ports` names
/// (by service id; read only if there is one), by port and address. Entries of backends that
/// recovered are left out (the map is LRU and forgets them), and so are those of ports gone.
pub fn read(
    map: &OutlierMap,
    ports: impl FnOnce() -> Result<BTreeMap<u32, ServicePort>, DataplaneError>,
) -> Result<Vec<Outlier>, DataplaneError> {
    let now = now_ns();
    let mut found = Vec::new();
    for entry in map.iter() {
        let (key, entry) = entry.map_err(DataplaneError::map(map_names::OUTLIERS))?;
        let ejected_for = Duration::from_nanos(entry.ejected_until_ns.saturating_sub(now));
        if entry.failures != 0 || !ejected_for.is_zero() {
            found.push((key, entry, ejected_for));
        }
    }
    if found.is_empty() {
        return Ok(Vec::new());
    }
    let ports = ports()?;
    let mut outliers: Vec<Outlier> = found
        .into_iter()
        .filter_map(|(key, entry, ejected_for)| {
            Some(Outlier {
                service: *ports.get(&key.service_id)?,
                backend: socket_addr(&key.backend)?,
                failures: entry.failures,
                ejections: entry.ejections,
                ejected_for,
            })
        })
        .collect();
    outliers.sort_by_key(|o| (o.service, o.backend));
    Ok(outliers)
}

/// What [`read`] returns, after removing the entries of backends quiet for a failing window (not
/// ejected, no failure within [`FAILING_WINDOW_NS`] of now or of their ejection's end): the
/// programs would start their next run afresh anyway, and the map stays as small as the node's
/// trouble, not as large as every backend that ever failed. A failure racing the removal is
/// counted in a new entry, as the first of a run. The node's state (its flag and bucket bits) is
/// set to what the entries left say (see `topology_common::OutlierState`), and the ledgers of
/// ports quiet as long go too.
pub fn read_and_prune(layout: &PinLayout, ports: BTreeMap<u32, ServicePort>) -> Result<Vec<Outlier>, DataplaneError> {
    let mut map: OutlierMap =
        layout.open_map(map_names::OUTLIERS)?.try_into().map_err(DataplaneError::map(map_names::OUTLIERS))?;
    let now = now_ns();
    let mut quiet = Vec::new();
    let mut flags = OutlierState::default();
    for entry in map.iter() {
        let (key, entry) = entry.map_err(DataplaneError::map(map_names::OUTLIERS))?;
        if now.saturating_sub(entry.last_failure_ns.max(entry.ejected_until_ns)) > FAILING_WINDOW_NS {
            quiet.push(key);
        } else if entry.active(now) {
            flags.flag(bucket_of(&key.backend.addr, key.backend.port));
        }
    }
    for key in &quiet {
        // Gone already (the LRU evicted it): nothing to do.
        let _ = map.remove(key);
    }
    set_flags(layout, flags.bits)?;
    prune_ledgers(layout, now)?;
    read(&map, || Ok(ports))
}

/// Removes the ledgers whose last ejection ended a failing window ago. An ejection that takes a
/// place in one as it is removed is not in the next ledger of its port: for its length, that
/// port's cap admits one more than it says (a race of one instant in a port quiet for a minute).
fn prune_ledgers(layout: &PinLayout, now: u64) -> Result<(), DataplaneError> {
    let mut ledgers: LedgerMap = layout
        .open_map(map_names::OUTLIER_LEDGERS)?
        .try_into()
        .map_err(DataplaneError::map(map_names::OUTLIER_LEDGERS))?;
    let mut quiet = Vec::new();
    for entry in ledgers.iter() {
        let (service_id, ledger) = entry.map_err(DataplaneError::map(map_names::OUTLIER_LEDGERS))?;
        if now.saturating_sub(ledger.last_end()) > FAILING_WINDOW_NS {
            quiet.push(service_id);
        }
    }
    for service_id in quiet {
        let _ = ledgers.remove(&service_id);
    }
    Ok(())
}

/// Ends every ejection and forgets every failure (ejection turned off: a previous run's
/// ejections must not outlive it, for the connect hooks still read them).
pub fn clear(layout: &PinLayout) -> Result<(), DataplaneError> {
    let mut map: OutlierMap =
        layout.open_map(map_names::OUTLIERS)?.try_into().map_err(DataplaneError::map(map_names::OUTLIERS))?;
    let keys: Vec<OutlierKey> = map.keys().filter_map(Result::ok).collect();
    for key in keys {
        let _ = map.remove(&key);
    }
    let mut ledgers: LedgerMap = layout
        .open_map(map_names::OUTLIER_LEDGERS)?
        .try_into()
        .map_err(DataplaneError::map(map_names::OUTLIER_LEDGERS))?;
    let ids: Vec<u32> = ledgers.keys().filter_map(Result::ok).collect();
    for id in ids {
        let _ = ledgers.remove(&id);
    }
    set_flags(layout, [0; BUCKET_WORDS as usize])
}

/// Sets the node's state to `bits` and whether any is set, if it differs. A failure that sets a
/// bit while the entries are read (its entry not seen) has it cleared here; that backend's next
/// failure sets it again, and meanwhile only its connections go uncounted (or, if that failure
/// ejected it, one more connection is sent to it).
fn set_flags(layout: &PinLayout, bits: [u64; BUCKET_WORDS as usize]) -> Result<(), DataplaneError> {
    let error = DataplaneError::map(map_names::OUTLIER_STATE);
    let mut state: Array<MapData, OutlierState> =
        layout.open_map(map_names::OUTLIER_STATE)?.try_into().map_err(error)?;
    let wanted = OutlierState { active: u64::from(bits.iter().any(|&word| word != 0)), bits, _pad: [0; 3] };
    if state.get(&0, 0).map_err(DataplaneError::map(map_names::OUTLIER_STATE))? != wanted {
        state.set(0, wanted, 0).map_err(DataplaneError::map(map_names::OUTLIER_STATE))?;
    }
    Ok(())
}
