//! The maps in memory: what the kernel would hold after the same operations, with the kernel's
//! limits (array bounds, hash map capacity), grace periods counted instead of waited for, and
//! writes to a chosen map made to fail, and the index checked against the hash maps around every
//! hash map write, as an agent killed there would leave them. [`MemoryMaps::dump`] prints the contents the way the
//! golden scenarios under `topology-agent/testdata/scenarios/` keep them.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    fmt::Write as _,
    io,
    sync::atomic::Ordering,
};

use aya::maps::MapError;
use topology_common::{
    Backend, IndexEntry4, IndexEntry6, ServiceKey4, ServiceKey6, ServiceMeta, ServiceOptions, ServiceRanges,
    ServiceValue, Slot, THRESHOLD_ONE, index::USED, map_names,
};
use topology_model::Family;
use topology_policy::{
    desired::{DesiredService, DesiredState, PortOptions, ServicePort},
    plan::alias,
};

use super::{
    ApplyReport,
    error::DataplaneError,
    grace::Grace,
    index::{self, positions_for},
    maps::Capacities,
    ops::{IndexStore, MapOps, ServiceKey},
    state::name_from_meta,
};
use crate::KernelState;

/// One family's index as a plain array.
#[derive(Clone, Debug)]
pub struct MemoryIndex<T>(Vec<T>);

impl<T: Copy + Default> MemoryIndex<T> {
    fn new(positions: u32) -> Self {
        Self(vec![T::default(); positions as usize])
    }

    /// An index holding `positions`, in order.
    pub fn from_positions(positions: impl IntoIterator<Item = T>) -> Self {
        Self(positions.into_iter().collect())
    }
}

impl<T: Copy + aya::Pod> IndexStore<T> for MemoryIndex<T> {
    fn len(&self) -> u32 {
        self.0.len() as u32
    }

    fn read(&self, position: u32) -> T {
        self.0[position as usize]
    }

    fn store_seq(&mut self, position: u32, seq: u8, _ordering: Ordering) {
        // SAFETY: `T` is Pod and at least one byte long; byte 0 is `seq` in both index entries.
        unsafe { *std::ptr::from_mut(&mut self.0[position as usize]).cast::<u8>() = seq };
    }

    fn store_body(&mut self, position: u32, value: &T) {
        let seq = IndexStore::read(self, position);
        self.0[position as usize] = *value;
        // SAFETY: as above.
        let kept = unsafe { *std::ptr::from_ref(&seq).cast::<u8>() };
        self.store_seq(position, kept, Ordering::Relaxed);
    }
}

pub use crate::grace::CountedGrace;

/// Every map the writer changes, in memory.
#[derive(Clone, Debug)]
pub struct MemoryMaps {
    capacities: Capacities,
    /// `topo_svc4`.
    pub services4: BTreeMap<ServiceKey4, ServiceValue>,
    /// `topo_svc6`.
    pub services6: BTreeMap<ServiceKey6, ServiceValue>,
    /// `topo_slots`.
    pub slots: Vec<Slot>,
    /// `topo_svc_meta`.
    pub names: BTreeMap<u32, ServiceMeta>,
    /// `topo_svc_opts`.
    pub options: Vec<ServiceOptions>,
    /// `topo_svc_range`.
    pub ranges: ServiceRanges,
    /// How often each service id's counters were zeroed.
    pub counter_resets: BTreeMap<u32, u32>,
    /// `topo_svc4_idx`.
    pub index4: MemoryIndex<IndexEntry4>,
    /// `topo_svc6_idx`.
    pub index6: MemoryIndex<IndexEntry6>,
    /// Grace periods.
    pub grace: CountedGrace,
    /// Writes to this map fail, as a full or broken kernel map would make them.
    pub failing: Option<&'static str>,
    /// When set, what the index answers is checked against the hash maps just before and just
    /// after every hash map write, and each disagreement kept here.
    pub audit: Option<Vec<String>>,
}

impl MemoryMaps {
    /// Empty maps of `capacities`, as a fresh load creates them.
    pub fn new(capacities: Capacities) -> Self {
        Self {
            capacities,
            services4: BTreeMap::new(),
            services6: BTreeMap::new(),
            slots: vec![Slot::default(); capacities.slots as usize],
            names: BTreeMap::new(),
            options: vec![ServiceOptions::default(); capacities.service_ids as usize],
            ranges: ServiceRanges::default(),
            counter_resets: BTreeMap::new(),
            index4: MemoryIndex::new(positions_for(capacities.services_v4)),
            index6: MemoryIndex::new(positions_for(capacities.services_v6)),
            grace: CountedGrace::default(),
            failing: None,
            audit: None,
        }
    }

    /// Checks the indexes against the hash maps, if asked to ([`Self::audit`]).
    fn audit(&mut self, moment: &str, key: ServiceKey) {
        let Some(found) = &mut self.audit else { return };
        let services4: HashMap<ServiceKey4, ServiceValue> = self.services4.iter().map(|(k, v)| (*k, *v)).collect();
        let services6: HashMap<ServiceKey6, ServiceValue> = self.services6.iter().map(|(k, v)| (*k, *v)).collect();
        let checked = index::verify(&self.index4, &services4).and_then(|()| index::verify(&self.index6, &services6));
        if let Err(error) = checked {
            found.push(format!("{moment} {key:?}: {error}"));
        }
    }

    /// Writes a service entry as the kernel would.
    fn put_service_unaudited(&mut self, key: ServiceKey, value: ServiceValue) -> Result<(), DataplaneError> {
        self.check(key.map())?;
        let full = |map| DataplaneError::Map {
            map,
            source: MapError::SyscallError(aya::sys::SyscallError {
                call: "bpf_map_update_elem",
                io_error: io::Error::from_raw_os_error(7), // E2BIG, as a full hash map answers
            }),
        };
        match key {
            ServiceKey::V4(k)
                if !self.services4.contains_key(&k) && self.services4.len() as u32 >= self.capacities.services_v4 =>
            {
                return Err(full(key.map()));
            }
            ServiceKey::V6(k)
                if !self.services6.contains_key(&k) && self.services6.len() as u32 >= self.capacities.services_v6 =>
            {
                return Err(full(key.map()));
            }
            ServiceKey::V4(k) => self.services4.insert(k, value),
            ServiceKey::V6(k) => self.services6.insert(k, value),
        };
        Ok(())
    }

    fn check(&self, map: &'static str) -> Result<(), DataplaneError> {
        match self.failing {
            Some(failing) if failing == map => Err(DataplaneError::Map {
                map,
                source: MapError::SyscallError(aya::sys::SyscallError {
                    call: "bpf_map_update_elem",
                    io_error: io::Error::other("injected failure"),
                }),
            }),
            _ => Ok(()),
        }
    }

    /// The contents as the golden files keep them: every entry in key order, every slot written.
    pub fn dump(&self) -> String {
        self.dump_with(true)
    }

    /// [`dump`](Self::dump) without what only the in-memory maps count (counters zeroed, grace
    /// periods): what the kernel's maps, read back ([`MemoryMaps::read_from`]), must print alike.
    pub fn dump_held(&self) -> String {
        self.dump_with(false)
    }

    fn dump_with(&self, counted: bool) -> String {
        let mut out = String::new();
        let mut families = BTreeMap::new();
        let entries = self
            .services4
            .iter()
            .map(|(k, v)| (ServiceKey::V4(*k), *v))
            .chain(self.services6.iter().map(|(k, v)| (ServiceKey::V6(*k), *v)));
        for (family, map, count) in [
            (Family::V4, map_names::SERVICES_V4, self.services4.len()),
            (Family::V6, map_names::SERVICES_V6, self.services6.len()),
        ] {
            let _ = writeln!(out, "{map}: {count}");
            for (key, value) in entries.clone().filter(|(key, _)| key.family() == family) {
                let _ = writeln!(out, "  {} {}", describe_key(&key), describe_value(&value));
                let ServiceValue { count, base, .. } = value;
                for index in base..base.saturating_add(count) {
                    families.insert(index, family);
                }
            }
        }
        let written: Vec<_> = self.slots.iter().enumerate().filter(|(_, s)| **s != Slot::default()).collect();
        let _ = writeln!(out, "{}: {} written", map_names::SLOTS, written.len());
        for (index, slot) in written {
            let ipv4 = families.get(&(index as u32)).is_none_or(|f| *f == Family::V4);
            let _ = writeln!(out, "  [{index}] set={} {}", slot.set_id, describe_slot(slot, ipv4));
        }
        let _ = writeln!(out, "{}: {}", map_names::SERVICE_META, self.names.len());
        for (id, meta) in &self.names {
            let options = PortOptions::from_kernel(&self.options[*id as usize]);
            let options = serde_json::to_string(&options).unwrap_or_default();
            let _ = write!(out, "  {id} {:?} options={options}", name_from_meta(meta));
            if counted {
                let _ = write!(out, " counters-zeroed={}", self.counter_resets.get(id).copied().unwrap_or(0));
            }
            out.push('\n');
        }
        dump_index(&mut out, map_names::INDEX_V4, &self.index4.0, |e| (e.seq, e.state, ServiceKey::V4(e.key), e.value));
        dump_index(&mut out, map_names::INDEX_V6, &self.index6.0, |e| (e.seq, e.state, ServiceKey::V6(e.key), e.value));
        if counted {
            let _ = writeln!(out, "grace periods: {}", self.grace.periods);
        }
        out
    }
}

fn describe_key(key: &ServiceKey) -> String {
    key.port().map_or_else(|| format!("{key:?}"), |port| port.to_string())
}

fn describe_value(value: &ServiceValue) -> String {
    let ServiceValue { service_id, set_id, count, base } = value;
    format!("id={service_id} set={set_id} base={base} count={count}")
}

/// `threshold` as a share of the primary, then primary | alias.
fn describe_slot(slot: &Slot, ipv4: bool) -> String {
    let backend = |b: &Backend| {
        let w = alias::weighted_backend(b, 0.0, ipv4);
        format!("{}/{}", std::net::SocketAddr::new(w.addr, w.port), w.locality.as_str())
    };
    let share = f64::from(slot.threshold) / f64::from(THRESHOLD_ONE);
    format!("{share:.6} {} | {}", backend(&slot.primary), backend(&slot.alias))
}

fn dump_index<T: Copy + Default + PartialEq>(
    out: &mut String,
    map: &str,
    positions: &[T],
    parts: impl Fn(&T) -> (u8, u8, ServiceKey, ServiceValue),
) {
    let held: Vec<_> = positions.iter().enumerate().filter(|(_, e)| **e != T::default()).collect();
    let _ = writeln!(out, "{map}: {} of {} positions", held.len(), positions.len());
    for (position, entry) in held {
        let (seq, state, key, value) = parts(entry);
        let what = if state == USED {
            format!("{} {}", describe_key(&key), describe_value(&value))
        } else {
            format!("state={state}")
        };
        let _ = writeln!(out, "  [{position}] seq={seq} {what}");
    }
}

impl MapOps for MemoryMaps {
    fn capacities(&self) -> Capacities {
        self.capacities
    }

    fn put_slot(&mut self, index: u32, slot: Slot) -> Result<(), DataplaneError> {
        self.check(map_names::SLOTS)?;
        let max_entries = self.capacities.slots;
        let entry = self.slots.get_mut(index as usize).ok_or(DataplaneError::Map {
            map: map_names::SLOTS,
            source: MapError::OutOfBounds { index, max_entries },
        })?;
        *entry = slot;
        Ok(())
    }

    fn put_service(&mut self, key: ServiceKey, value: ServiceValue) -> Result<(), DataplaneError> {
        self.audit("before writing", key);
        let written = self.put_service_unaudited(key, value);
        self.audit("after writing", key);
        written
    }

    fn delete_service(&mut self, key: ServiceKey) -> Result<(), DataplaneError> {
        self.audit("before deleting", key);
        self.check(key.map())?;
        match key {
            ServiceKey::V4(k) => self.services4.remove(&k),
            ServiceKey::V6(k) => self.services6.remove(&k),
        };
        self.audit("after deleting", key);
        Ok(())
    }

    fn reset_counters(&mut self, service_id: u32) -> Result<(), DataplaneError> {
        self.check(map_names::COUNTERS)?;
        *self.counter_resets.entry(service_id).or_default() += 1;
        Ok(())
    }

    fn put_name(&mut self, service_id: u32, name: ServiceMeta) -> Result<(), DataplaneError> {
        self.check(map_names::SERVICE_META)?;
        self.names.insert(service_id, name);
        Ok(())
    }

    fn delete_name(&mut self, service_id: u32) -> Result<(), DataplaneError> {
        self.check(map_names::SERVICE_META)?;
        self.names.remove(&service_id);
        Ok(())
    }

    fn put_options(&mut self, service_id: u32, options: ServiceOptions) -> Result<(), DataplaneError> {
        self.check(map_names::SERVICE_OPTIONS)?;
        let max_entries = self.capacities.service_ids;
        let entry = self.options.get_mut(service_id as usize).ok_or(DataplaneError::Map {
            map: map_names::SERVICE_OPTIONS,
            source: MapError::OutOfBounds { index: service_id, max_entries },
        })?;
        *entry = options;
        Ok(())
    }

    fn put_ranges(&mut self, ranges: ServiceRanges) -> Result<(), DataplaneError> {
        self.check(map_names::SERVICE_RANGES)?;
        self.ranges = ranges;
        Ok(())
    }

    fn index4(&mut self) -> (&mut dyn IndexStore<IndexEntry4>, &mut dyn Grace) {
        (&mut self.index4, &mut self.grace)
    }

    fn index6(&mut self) -> (&mut dyn IndexStore<IndexEntry6>, &mut dyn Grace) {
        (&mut self.index6, &mut self.grace)
    }

    fn grace(&mut self) -> &mut dyn Grace {
        &mut self.grace
    }

    fn indexes(&self) -> (&dyn IndexStore<IndexEntry4>, &dyn IndexStore<IndexEntry6>) {
        (&self.index4, &self.index6)
    }
}

/// The report of one apply, as the golden files keep it.
pub fn describe(report: &ApplyReport) -> String {
    let mut out = format!(
        "added={} updated={} removed={} unchanged={} slots_written={} grace_periods={}\n",
        report.added, report.updated, report.removed, report.unchanged, report.slots_written, report.grace_periods
    );
    for (port, error) in &report.failed {
        let _ = writeln!(out, "failed {port}: {error}");
    }
    if report.withdrawn > 0 {
        let _ = writeln!(out, "withdrawn={}", report.withdrawn);
    }
    for port in &report.stranded {
        let _ = writeln!(out, "stranded {port}");
    }
    for error in &report.housekeeping {
        let _ = writeln!(out, "housekeeping: {error}");
    }
    for departure in &report.departed {
        let _ = writeln!(out, "departed {} from {}", departure.backend, departure.service);
    }
    out
}

/// Panics unless the kernel mirror holds what `desired` asks, to rounding, for every port not
/// `failed`, and a failed port (not `stranded`) holds nothing or what was asked, never an old set.
pub fn assert_programmed(
    kernel: &KernelState,
    desired: &DesiredState,
    failed: &BTreeSet<ServicePort>,
    stranded: &BTreeSet<ServicePort>,
    what: &str,
) {
    for port in failed.iter().filter(|port| !stranded.contains(port)) {
        let outdated = kernel.services.contains_key(port)
            && !desired.services.get(port).is_some_and(|service| holds(kernel, port, service));
        assert!(!outdated, "{what}: failed port {port} still holds an outdated set");
    }
    for (port, service) in &desired.services {
        if !failed.contains(port) {
            assert!(
                kernel.services.contains_key(port) && holds(kernel, port, service),
                "{what}: {port} holds {:?}, the plan asks {:?}",
                kernel.services.contains_key(port).then(|| held(kernel, port)),
                weights_of(service)
            );
        }
    }
    let extra: Vec<&ServicePort> = kernel.services.keys().filter(|p| !desired.services.contains_key(*p)).collect();
    let extra: Vec<&&ServicePort> = extra.iter().filter(|p| !stranded.contains(p)).collect();
    assert!(extra.is_empty(), "{what}: the kernel holds ports the plan does not: {extra:?}");
}

/// What the kernel mirror says a service port draws: backends and parts per million.
pub fn held(kernel: &KernelState, port: &ServicePort) -> Vec<(std::net::IpAddr, u16, u32)> {
    let service = &kernel.services[port];
    let mut backends: Vec<_> =
        service.backends(port.vip.is_ipv4()).iter().map(|b| (b.addr, b.port, b.weight)).collect();
    backends.sort();
    backends
}

/// True when the kernel holds `service`'s backends and shares (to rounding) and its options.
fn holds(kernel: &KernelState, port: &ServicePort, service: &DesiredService) -> bool {
    let (held, wanted) = (held(kernel, port), weights_of(service));
    kernel.services[port].options == service.options
        && held.len() == wanted.len()
        && held.iter().zip(&wanted).all(|(h, w)| h.0 == w.0 && h.1 == w.1 && h.2.abs_diff(w.2) <= 2)
}

/// The desired shares of a service port, in parts per million.
fn weights_of(service: &DesiredService) -> Vec<(std::net::IpAddr, u16, u32)> {
    let total: f64 = service.backends.iter().map(|b| f64::from(b.weight)).sum();
    let mut backends: Vec<_> =
        service.backends.iter().map(|b| (b.addr, b.port, (f64::from(b.weight) / total * 1e6).round() as u32)).collect();
    backends.sort();
    backends
}

/// Compares `actual` with the golden file at `path`, or rewrites the file when `UPDATE_GOLDEN` is
/// set; the first differing line when they differ.
pub fn golden(path: &std::path::Path, actual: &str) -> Option<String> {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, actual).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        return None;
    }
    let expected = std::fs::read_to_string(path).unwrap_or_default();
    let (mut expected_lines, mut actual_lines) = (expected.lines(), actual.lines());
    for line in 1.. {
        match (expected_lines.next(), actual_lines.next()) {
            (None, None) => break,
            (e, a) if e != a => {
                return Some(format!(
                    "{}:\n  line {line}: expected {e:?}\n  line {line}:   actual {a:?}",
                    path.display()
                ));
            }
            _ => {}
        }
    }
    None
}
