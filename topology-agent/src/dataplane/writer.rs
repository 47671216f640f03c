//! Applies a desired state to the maps as a minimal diff. The only code that writes BPF maps.
//!
//! # Swap protocol
//!
//! A program reads a service entry `{service_id, set_id, count, base}` and then one slot at
//! `base + i` (`i < count`) of the slots array, which must carry the entry's `set_id`. To replace a
//! backend set without a connect ever seeing half of it:
//!
//! 1. write every slot of the new set, tagged with a fresh `set_id`, into a free run;
//! 2. overwrite the service entry with the new `set_id`, `count` and `base` (one map update,
//!    which the kernel publishes with RCU: a program sees the old entry or the new one);
//! 3. retire the old run: it is reused only after an RCU grace period ([`super::grace`]), when
//!    no program that read the old entry is still running.
//!
//! A program that read the old entry before step 2 therefore always finds the old set intact and
//! makes a consistent old choice. A new service's entry is written last and a removed service's
//! entry is deleted first. The writer waits for a grace period only when it runs out of free runs,
//! so a swap costs `count` array writes and one hash update, and nothing is ever deleted.
//!
//! Room is checked before the first write for a service, and a failed write frees what that
//! service wrote, so a map is never left holding part of a set.

use std::{
    collections::{HashMap, HashSet},
    io,
};

use aya::maps::MapError;
use topology_common::{Backend, ServiceKey4, ServiceKey6, ServiceValue, Slot, THRESHOLD_ONE, map_names};

use super::{
    alias,
    error::DataplaneError,
    grace::Grace as _,
    ids::{DenseIds, IdPool},
    index::{self, ServiceIndex},
    maps::MapSet,
    slot_space::{Run, Shortage, SlotSpace},
    state::{KernelState, ProgrammedService, meta_from_name},
};
use crate::{
    desired::{DesiredService, DesiredState, PortOptions, ServicePort},
    sockets::Departure,
};

/// What one `apply` did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Service ports written for the first time.
    pub added: usize,
    /// Service ports whose backend set was swapped.
    pub updated: usize,
    /// Service ports removed.
    pub removed: usize,
    /// Service ports already as desired (not rewritten).
    pub unchanged: usize,
    /// Slot entries written.
    pub slots_written: usize,
    /// Grace periods waited for to reuse retired slots.
    pub grace_periods: usize,
    /// Time spent waiting for them.
    pub grace_wait: std::time::Duration,
    /// Service ports that could not be programmed; the kernel keeps their previous state.
    pub failed: Vec<(ServicePort, DataplaneError)>,
    /// Leftovers (ids of a removed service) that could not be deleted yet; they are retried on the
    /// next apply and never visible to the programs.
    pub housekeeping: Vec<DataplaneError>,
    /// Backends that left a service port's set (or whose service port went).
    pub departed: Vec<Departure>,
}

/// The dataplane's view of the kernel and the means to change it.
pub struct Writer {
    maps: MapSet,
    kernel: KernelState,
    service_ids: DenseIds,
    set_ids: IdPool,
    slots: SlotSpace,
    /// Services adopted with a run that overlaps another's or lies out of range: the run is not
    /// theirs to retire when they are rewritten.
    foreign_runs: HashSet<ServicePort>,
    /// Services adopted with a service id out of range or shared with another: rewritten from
    /// scratch (removed, then added with a fresh id) on the next apply.
    foreign_ids: HashSet<ServicePort>,
    /// Service entries per family, kept as services are added and removed.
    family_entries: [u64; 2],
    /// The service indexes the programs probe before the hash maps.
    index4: ServiceIndex<ServiceKey4>,
    index6: ServiceIndex<ServiceKey6>,
}

/// Entries in use in the maps with a capacity, as the writer counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// IPv4 service entries.
    pub services_v4: u64,
    /// IPv6 service entries.
    pub services_v6: u64,
    /// Slots of live sets.
    pub slots: u64,
    /// Slots of replaced sets waiting for a grace period before reuse.
    pub slots_retired: u64,
    /// Service ids (counters and names).
    pub service_ids: u64,
}

impl Writer {
    /// Adopts what the kernel holds.
    pub fn adopt(maps: MapSet, kernel: KernelState) -> Result<Self, DataplaneError> {
        let capacity = maps.capacities.service_ids;
        let mut seen = HashSet::new();
        let foreign_ids: HashSet<ServicePort> = kernel
            .services
            .iter()
            .filter(|(_, s)| s.service_id >= capacity || !seen.insert(s.service_id))
            .map(|(port, _)| *port)
            .collect();
        let service_ids = DenseIds::new(
            kernel.services.values().map(|s| s.service_id).chain(kernel.orphan_ids.iter().copied()),
            capacity,
        );
        let set_ids = IdPool::new(kernel.services.values().map(|s| s.set_id));
        let runs = kernel.services.iter().map(|(port, s)| (Run { base: s.base, len: s.count }, *port));
        let (slots, rejected) = SlotSpace::adopt(maps.capacities.slots, runs);
        let foreign_runs = rejected.into_iter().collect();
        let v4 = kernel.services.keys().filter(|port| port.vip.is_ipv4()).count() as u64;
        let family_entries = [v4, kernel.services.len() as u64 - v4];
        let mut maps = maps;
        let (services4, services6) = entries_by_family(&kernel);
        let index4 = ServiceIndex::adopt(&mut maps.index4, &services4, &mut maps.counters)?;
        let index6 = ServiceIndex::adopt(&mut maps.index6, &services6, &mut maps.counters)?;
        Ok(Self {
            maps,
            kernel,
            service_ids,
            set_ids,
            slots,
            foreign_runs,
            foreign_ids,
            family_entries,
            index4,
            index6,
        })
    }

    /// What the kernel holds, as last written or adopted.
    pub fn kernel(&self) -> &KernelState {
        &self.kernel
    }

    /// The maps, for reading counters.
    pub fn maps(&self) -> &MapSet {
        &self.maps
    }

    /// The maps, for the writes that are not about service ports (the heartbeat).
    pub fn maps_mut(&mut self) -> &mut MapSet {
        &mut self.maps
    }

    /// Makes the kernel hold `desired`, touching only what differs.
    pub fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        let stale: Vec<ServicePort> =
            self.kernel.services.keys().filter(|port| !desired.services.contains_key(port)).copied().collect();
        let changes =
            stale.into_iter().map(|port| (port, None)).chain(desired.services.iter().map(|(p, s)| (*p, Some(s))));
        self.apply_changes(changes)
    }

    /// Makes the kernel hold the given service ports as desired (`None`: removed), leaving every
    /// other service port alone. Removals run first, so they free capacity for additions.
    pub fn apply_changes<'a>(
        &mut self,
        changes: impl IntoIterator<Item = (ServicePort, Option<&'a DesiredService>)>,
    ) -> ApplyReport {
        let mut report = ApplyReport::default();
        self.remove_orphan_ids();
        self.repair_index();
        let (removals, upserts): (Vec<_>, Vec<_>) = changes.into_iter().partition(|(_, desired)| desired.is_none());
        for (port, desired) in removals.into_iter().chain(upserts) {
            if let Err(error) = self.reconcile(&port, desired, &mut report) {
                report.failed.push((port, error));
            }
        }
        report.housekeeping.extend(self.index4.take_errors());
        report.housekeeping.extend(self.index6.take_errors());
        report
    }

    /// Brings one service port to `desired`, counting what happened in `report`.
    fn reconcile(
        &mut self,
        port: &ServicePort,
        desired: Option<&DesiredService>,
        report: &mut ApplyReport,
    ) -> Result<(), DataplaneError> {
        let Some(service) = desired else {
            if self.kernel.services.contains_key(port) {
                self.remove(port, report)?;
                report.removed += 1;
            }
            return Ok(());
        };
        let slots = validated_slots(port, service)?;
        if self.foreign_ids.contains(port) {
            self.remove(port, &mut ApplyReport::default())?;
            self.foreign_ids.remove(port);
        }
        match self.kernel.services.get(port) {
            Some(current) if current.intact() && !self.foreign_runs.contains(port) && current.slots == slots => {
                let (name_changed, options_changed) =
                    (current.name != service.name, current.options != service.options);
                if name_changed {
                    self.rename(port, &service.name)?;
                }
                if options_changed {
                    self.set_options(port, service.options)?;
                }
                // A new name is no new routing; new options are.
                if options_changed {
                    report.updated += 1;
                } else {
                    report.unchanged += 1;
                }
            }
            Some(_) => {
                self.swap(port, service, slots, report)?;
                report.updated += 1;
            }
            None => {
                self.add(port, service, slots, report)?;
                report.added += 1;
            }
        }
        Ok(())
    }

    fn add(
        &mut self,
        port: &ServicePort,
        service: &DesiredService,
        slots: Vec<Slot>,
        report: &mut ApplyReport,
    ) -> Result<(), DataplaneError> {
        let ipv4 = port.vip.is_ipv4();
        let (family_map, family_used, family_capacity) = if ipv4 {
            (map_names::SERVICES_V4, self.family_entries[0], self.maps.capacities.services_v4)
        } else {
            (map_names::SERVICES_V6, self.family_entries[1], self.maps.capacities.services_v6)
        };
        check_room(family_map, family_used, 1, family_capacity)?;
        check_room(map_names::COUNTERS, self.service_ids.len() as u64, 1, self.maps.capacities.service_ids)?;
        let run = self.allocate(slots.len() as u32, report)?;

        let service_id = self.service_ids.allocate();
        let set_id = if slots.is_empty() { 0 } else { self.set_ids.allocate() };
        let value = ServiceValue { service_id, set_id, count: run.len, base: run.base };
        let written = self
            .write_counters(service_id)
            .and_then(|()| self.write_meta(service_id, &service.name))
            .and_then(|()| self.write_options(service_id, service.options))
            .and_then(|()| self.write_slots(set_id, run, &slots))
            .and_then(|()| self.write_entry(port, value));
        if let Err(error) = written {
            // Roll back everything this service wrote; the entry was the last write, so no program
            // has seen the run and it is free at once.
            self.slots.release(run);
            self.delete_ids(service_id);
            self.service_ids.release(service_id);
            self.set_ids.release(set_id);
            return Err(error);
        }
        self.family_entries[family_index(port)] += 1;
        self.index_upsert(port, value);
        report.slots_written += slots.len();
        self.kernel
            .services
            .insert(*port, ProgrammedService::new(&value, slots, service.name.clone(), service.options));
        Ok(())
    }

    fn swap(
        &mut self,
        port: &ServicePort,
        service: &DesiredService,
        slots: Vec<Slot>,
        report: &mut ApplyReport,
    ) -> Result<(), DataplaneError> {
        let current = self.kernel.services[port].clone();
        if current.options != service.options {
            // Before the new set: a client's affinity is only ever judged by the options in force.
            self.write_options(current.service_id, service.options)?;
            self.update_mirror(port, |s| s.options = service.options);
        }
        let run = self.allocate(slots.len() as u32, report)?;
        let set_id = if slots.is_empty() { 0 } else { self.set_ids.allocate() };
        let value = ServiceValue { service_id: current.service_id, set_id, count: run.len, base: run.base };
        // Steps 1 and 2 of the swap protocol.
        if let Err(error) = self.write_slots(set_id, run, &slots).and_then(|()| self.write_entry(port, value)) {
            self.slots.release(run);
            self.set_ids.release(set_id);
            return Err(error);
        }
        self.index_upsert(port, value);
        report.slots_written += slots.len();
        // Step 3: the old run waits for a grace period. The mirror follows the kernel before
        // anything else can fail, so the old run is never retired twice.
        self.retire(port, &current);
        report.departed.extend(departures(port, &current.slots, &slots));
        self.kernel
            .services
            .insert(*port, ProgrammedService::new(&value, slots, current.name.clone(), service.options));
        if current.name != service.name {
            self.rename(port, &service.name)?;
        }
        Ok(())
    }

    /// Changes the mirror of one service port.
    fn update_mirror(&mut self, port: &ServicePort, change: impl FnOnce(&mut ProgrammedService)) {
        if let Some(service) = self.kernel.services.get_mut(port) {
            change(service);
        }
    }

    fn set_options(&mut self, port: &ServicePort, options: PortOptions) -> Result<(), DataplaneError> {
        let service_id = self.kernel.services[port].service_id;
        self.write_options(service_id, options)?;
        self.update_mirror(port, |s| s.options = options);
        Ok(())
    }

    fn remove(&mut self, port: &ServicePort, report: &mut ApplyReport) -> Result<(), DataplaneError> {
        let current = self.kernel.services[port].clone();
        self.index_remove(port);
        self.delete_entry(port)?;
        report.departed.extend(departures(port, &current.slots, &[]));
        self.kernel.services.remove(port);
        self.family_entries[family_index(port)] -= 1;
        self.retire(port, &current);
        if self.delete_ids(current.service_id) {
            self.service_ids.release(current.service_id);
        } else {
            self.kernel.orphan_ids.insert(current.service_id);
        }
        Ok(())
    }

    /// Retires the run a replaced or removed service entry referred to, and frees its set id.
    fn retire(&mut self, port: &ServicePort, old: &ProgrammedService) {
        if !self.foreign_runs.remove(port) {
            self.slots.retire(Run { base: old.base, len: old.count });
        }
        if old.set_id != 0 {
            self.set_ids.release(old.set_id);
        }
    }

    /// A free run of `len` slots, waiting for a grace period to reuse retired runs if needed.
    fn allocate(&mut self, len: u32, report: &mut ApplyReport) -> Result<Run, DataplaneError> {
        if len == 0 {
            return Ok(Run { base: 0, len: 0 });
        }
        let mut shortage = match self.slots.allocate(len) {
            Ok(run) => return Ok(run),
            Err(shortage) => shortage,
        };
        // A position of the index not yet published may still lead to a retired run.
        if self.slots.has_retired() && self.repair_index() {
            let started = std::time::Instant::now();
            let waited = self.maps.counters.wait();
            report.grace_wait += started.elapsed();
            match waited {
                Ok(()) => {
                    self.slots.reclaim();
                    self.index4.grace_passed();
                    self.index6.grace_passed();
                    report.grace_periods += 1;
                    match self.slots.allocate(len) {
                        Ok(run) => return Ok(run),
                        Err(again) => shortage = again,
                    }
                }
                // Retired runs stay retired: reusing them without a grace period could hand a
                // running program a slot of another set.
                Err(error) => report.housekeeping.push(error),
            }
        }
        Err(match shortage {
            Shortage::Full { needed } => {
                DataplaneError::MapFull { map: map_names::SLOTS, needed, capacity: self.maps.capacities.slots }
            }
            Shortage::Fragmented { free, largest } => DataplaneError::MapFragmented {
                map: map_names::SLOTS,
                needed: len,
                free,
                largest,
                capacity: self.maps.capacities.slots,
            },
        })
    }

    fn rename(&mut self, port: &ServicePort, name: &str) -> Result<(), DataplaneError> {
        let service_id = self.kernel.services[port].service_id;
        self.write_meta(service_id, name)?;
        self.update_mirror(port, |s| s.name = name.to_owned());
        Ok(())
    }

    fn remove_orphan_ids(&mut self) {
        let ids = std::mem::take(&mut self.kernel.orphan_ids);
        for id in ids {
            if self.delete_ids(id) {
                self.service_ids.release(id);
            } else {
                self.kernel.orphan_ids.insert(id);
            }
        }
    }

    /// Entries in use, from the writer's own counts (no kernel access).
    pub fn usage(&self) -> Usage {
        Usage {
            services_v4: self.family_entries[0],
            services_v6: self.family_entries[1],
            slots: self.slots.live(),
            slots_retired: self.slots.retired(),
            service_ids: self.service_ids.len() as u64,
        }
    }

    /// Checks the service indexes in the kernel against the service entries: what every lookup
    /// the programs could make answers (see [`index::verify`]).
    pub fn verify_index(&self) -> Result<(), String> {
        verify_index(&self.maps, &self.kernel)
    }

    /// Publishes index positions left pending; true if the index holds every decision.
    fn repair_index(&mut self) -> bool {
        let v4 = self.index4.repair(&mut self.maps.index4, &mut self.maps.counters);
        self.index6.repair(&mut self.maps.index6, &mut self.maps.counters) && v4
    }

    /// Points the index at a service entry just written to the hash map. A failure is reported
    /// with the apply and repaired on the next; meanwhile the position holds earlier, whole
    /// contents, and the run they point at is not reclaimed.
    fn index_upsert(&mut self, port: &ServicePort, value: ServiceValue) {
        let maps = &mut self.maps;
        match key_of(port) {
            Key::V4(key) => self.index4.upsert(&mut maps.index4, key, value, &mut maps.counters),
            Key::V6(key) => self.index6.upsert(&mut maps.index6, key, value, &mut maps.counters),
        }
    }

    /// Takes a service port out of the index, before its hash map entry goes.
    fn index_remove(&mut self, port: &ServicePort) {
        let maps = &mut self.maps;
        match key_of(port) {
            Key::V4(key) => self.index4.remove(&mut maps.index4, &key, &mut maps.counters),
            Key::V6(key) => self.index6.remove(&mut maps.index6, &key, &mut maps.counters),
        }
    }

    /// Writes `slots`, tagged with `set_id`, into `run`.
    fn write_slots(&mut self, set_id: u32, run: Run, slots: &[Slot]) -> Result<(), DataplaneError> {
        for (index, slot) in (run.base..).zip(slots) {
            self.maps.slots.set(index, Slot { set_id, ..*slot }, 0).map_err(DataplaneError::map(map_names::SLOTS))?;
        }
        Ok(())
    }

    fn write_entry(&mut self, port: &ServicePort, value: ServiceValue) -> Result<(), DataplaneError> {
        match key_of(port) {
            Key::V4(key) => {
                self.maps.services4.insert(key, value, 0).map_err(DataplaneError::map(map_names::SERVICES_V4))
            }
            Key::V6(key) => {
                self.maps.services6.insert(key, value, 0).map_err(DataplaneError::map(map_names::SERVICES_V6))
            }
        }
    }

    fn delete_entry(&mut self, port: &ServicePort) -> Result<(), DataplaneError> {
        match key_of(port) {
            Key::V4(key) => {
                ignore_missing(self.maps.services4.remove(&key)).map_err(DataplaneError::map(map_names::SERVICES_V4))
            }
            Key::V6(key) => {
                ignore_missing(self.maps.services6.remove(&key)).map_err(DataplaneError::map(map_names::SERVICES_V6))
            }
        }
    }

    fn write_counters(&mut self, service_id: u32) -> Result<(), DataplaneError> {
        self.maps.counters.reset(service_id)
    }

    fn write_meta(&mut self, service_id: u32, name: &str) -> Result<(), DataplaneError> {
        self.maps.meta.insert(service_id, meta_from_name(name), 0).map_err(DataplaneError::map(map_names::SERVICE_META))
    }

    fn write_options(&mut self, service_id: u32, options: PortOptions) -> Result<(), DataplaneError> {
        self.maps
            .options
            .set(service_id, options.to_kernel(), 0)
            .map_err(DataplaneError::map(map_names::SERVICE_OPTIONS))
    }

    /// Deletes the name of a service id (its counters are zeroed when the id is reused); false if
    /// it is still there.
    fn delete_ids(&mut self, service_id: u32) -> bool {
        ignore_missing(self.maps.meta.remove(&service_id)).is_ok()
    }
}

/// The backends a set change takes away from a service port: drawn from `old`, never from `new`.
fn departures(port: &ServicePort, old: &[Slot], new: &[Slot]) -> Vec<Departure> {
    let kept = drawn(new);
    let ipv4 = port.vip.is_ipv4();
    let mut gone: Vec<Departure> = drawn(old)
        .difference(&kept)
        .map(|(addr, backend_port)| {
            let backend =
                alias::weighted_backend(&Backend { addr: *addr, port: *backend_port, ..Backend::default() }, 0.0, ipv4);
            Departure { service: *port, backend: std::net::SocketAddr::new(backend.addr, backend.port) }
        })
        .collect();
    gone.sort();
    gone
}

/// The backends (address, port) a set can draw: a slot's primary unless its threshold is 0, its
/// alias unless its threshold is one.
fn drawn(slots: &[Slot]) -> HashSet<([u8; 16], u16)> {
    let mut out = HashSet::new();
    for slot in slots {
        if slot.threshold > 0 {
            out.insert((slot.primary.addr, slot.primary.port));
        }
        if slot.threshold < THRESHOLD_ONE {
            out.insert((slot.alias.addr, slot.alias.port));
        }
    }
    out
}

/// Checks the service indexes in `maps` against the service entries of `kernel`.
pub fn verify_index(maps: &MapSet, kernel: &KernelState) -> Result<(), String> {
    let (services4, services6) = entries_by_family(kernel);
    index::verify(&maps.index4, &services4)?;
    index::verify(&maps.index6, &services6)
}

/// The service entries of each family, keyed as in the maps.
fn entries_by_family(kernel: &KernelState) -> (HashMap<ServiceKey4, ServiceValue>, HashMap<ServiceKey6, ServiceValue>) {
    let (mut services4, mut services6) = (HashMap::new(), HashMap::new());
    for (port, service) in &kernel.services {
        match key_of(port) {
            Key::V4(key) => services4.insert(key, service.value()),
            Key::V6(key) => services6.insert(key, service.value()),
        };
    }
    (services4, services6)
}

/// Index of a service port's family in `family_entries`.
fn family_index(port: &ServicePort) -> usize {
    usize::from(port.vip.is_ipv6())
}

enum Key {
    V4(ServiceKey4),
    V6(ServiceKey6),
}

fn key_of(port: &ServicePort) -> Key {
    let proto = port.protocol.number();
    match port.vip {
        std::net::IpAddr::V4(vip) => Key::V4(ServiceKey4 { addr: vip.octets(), port: port.port, proto, _pad: 0 }),
        std::net::IpAddr::V6(vip) => Key::V6(ServiceKey6 { addr: vip.octets(), port: port.port, proto, _pad: 0 }),
    }
}

/// The slots for a desired service, after checking every backend has the ClusterIP's family.
fn validated_slots(port: &ServicePort, service: &DesiredService) -> Result<Vec<Slot>, DataplaneError> {
    if let Some(backend) = service.backends.iter().find(|b| b.addr.is_ipv4() != port.vip.is_ipv4()) {
        return Err(DataplaneError::InvalidService {
            service: *port,
            reason: format!("backend {} is not of the ClusterIP's address family", backend.addr),
        });
    }
    let slots = alias::build(&service.backends);
    if slots.len() > u32::MAX as usize {
        return Err(DataplaneError::InvalidService { service: *port, reason: "too many backends".into() });
    }
    Ok(slots)
}

fn check_room(map: &'static str, used: u64, more: u64, capacity: u32) -> Result<(), DataplaneError> {
    if used + more > u64::from(capacity) {
        return Err(DataplaneError::MapFull { map, needed: used + more, capacity });
    }
    Ok(())
}

/// A delete of an entry that is already gone succeeded.
fn ignore_missing(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::SyscallError(aya::sys::SyscallError { io_error, .. }))
            if io_error.kind() == io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn departures_are_the_backends_the_old_set_drew_and_the_new_one_does_not() {
        let port =
            ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 53, protocol: crate::desired::Protocol::Udp };
        let backend = |last: u8| crate::desired::WeightedBackend {
            addr: std::net::IpAddr::from([10, 244, 0, last]),
            port: 8053,
            weight: 1,
            locality: crate::desired::Locality::Zone,
        };
        let old = alias::build(&[backend(1), backend(2), backend(3)]);
        let new = alias::build(&[backend(2), backend(3), backend(4)]);
        let gone = departures(&port, &old, &new);
        assert_eq!(gone, vec![Departure { service: port, backend: "10.244.0.1:8053".parse().unwrap() }]);
        assert!(departures(&port, &old, &old).is_empty(), "new weights for the same members take nobody away");
        assert_eq!(departures(&port, &old, &[]).len(), 3, "a removed service port takes every backend");
    }

    #[test]
    fn room_is_checked_before_writing() {
        assert!(check_room("topo_slots", 10, 5, 15).is_ok());
        let error = check_room("topo_slots", 10, 6, 15).unwrap_err();
        assert_eq!(error.to_string(), "map topo_slots is full: 16 entries needed, capacity 15");
    }

    #[test]
    fn backends_must_match_the_cluster_ip_family() {
        let port = ServicePort { vip: "10.96.0.1".parse().unwrap(), port: 80, protocol: crate::desired::Protocol::Tcp };
        let service = DesiredService {
            name: "default/web:http".into(),
            backends: vec![crate::desired::WeightedBackend {
                addr: "fd00::1".parse().unwrap(),
                port: 8080,
                weight: 1,
                locality: crate::desired::Locality::Zone,
            }],
            options: PortOptions::default(),
        };
        let error = validated_slots(&port, &service).unwrap_err();
        assert!(error.to_string().contains("fd00::1 is not of the ClusterIP's address family"), "{error}");
    }
}
