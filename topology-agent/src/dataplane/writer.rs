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
    collections::{BTreeSet, HashMap, HashSet},
    io,
};

use aya::maps::MapError;
use topology_common::{ServiceKey4, ServiceKey6, ServiceValue, Slot, map_names};

use super::{
    alias,
    error::DataplaneError,
    grace,
    index::{Placement, ServiceIndex},
    maps::MapSet,
    slot_space::{Run, Shortage, SlotSpace},
    state::{KernelState, ProgrammedService, meta_from_name},
};
use crate::desired::{DesiredService, DesiredState, ServicePort};

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
    /// Service ports that could not be programmed; the kernel keeps their previous state.
    pub failed: Vec<(ServicePort, DataplaneError)>,
    /// Leftovers (ids of a removed service) that could not be deleted yet; they are retried on the
    /// next apply and never visible to the programs.
    pub housekeeping: Vec<DataplaneError>,
}

/// Allocator of ids that are unique among those in use; ids wrap around and skip live ones.
#[derive(Debug, Default)]
pub struct IdPool {
    used: HashSet<u32>,
    cursor: u32,
}

impl IdPool {
    /// A pool where `used` are taken; allocation continues after the largest.
    pub fn new(used: impl IntoIterator<Item = u32>) -> Self {
        let used: HashSet<u32> = used.into_iter().filter(|&id| id != 0).collect();
        let cursor = used.iter().copied().max().unwrap_or(0);
        Self { used, cursor }
    }

    /// A fresh non-zero id.
    pub fn allocate(&mut self) -> u32 {
        loop {
            self.cursor = self.cursor.wrapping_add(1).max(1);
            if self.used.insert(self.cursor) {
                return self.cursor;
            }
        }
    }

    /// Returns `id` to the pool.
    pub fn release(&mut self, id: u32) {
        self.used.remove(&id);
    }
}

/// Allocator of service ids: the lowest free id first, so the ids in use stay below their count
/// and fill the counters' chunks densely. An id is reused at once after release: a program that
/// read the old service entry just before its removal may add one count to the new holder.
#[derive(Debug, Default)]
pub struct DenseIds {
    free: BTreeSet<u32>,
    next: u32,
}

impl DenseIds {
    /// A pool where `used` are taken.
    pub fn new(used: impl IntoIterator<Item = u32>) -> Self {
        let used: BTreeSet<u32> = used.into_iter().collect();
        let next = used.last().map_or(0, |&max| max + 1);
        Self { free: (0..next).filter(|id| !used.contains(id)).collect(), next }
    }

    /// The lowest id not in use.
    pub fn allocate(&mut self) -> u32 {
        self.free.pop_first().unwrap_or_else(|| {
            self.next += 1;
            self.next - 1
        })
    }

    /// Returns `id` to the pool.
    pub fn release(&mut self, id: u32) {
        if id < self.next {
            self.free.insert(id);
        }
    }

    /// Number of ids in use.
    pub fn len(&self) -> usize {
        self.next as usize - self.free.len()
    }
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
        let service_ids =
            DenseIds::new(kernel.services.values().map(|s| s.service_id).chain(kernel.orphan_ids.iter().copied()));
        let set_ids = IdPool::new(kernel.services.values().map(|s| s.set_id));
        let runs = kernel.services.iter().map(|(port, s)| (Run { base: s.base, len: s.count }, *port));
        let (slots, rejected) = SlotSpace::adopt(maps.capacities.slots, runs);
        let foreign_runs = rejected.into_iter().collect();
        let v4 = kernel.services.keys().filter(|port| port.vip.is_ipv4()).count() as u64;
        let family_entries = [v4, kernel.services.len() as u64 - v4];
        let mut maps = maps;
        let (services4, services6) = entries_by_family(&kernel);
        let index4 = ServiceIndex::adopt(&mut maps.index4, &services4)?;
        let index6 = ServiceIndex::adopt(&mut maps.index6, &services6)?;
        Ok(Self { maps, kernel, service_ids, set_ids, slots, foreign_runs, family_entries, index4, index6 })
    }

    /// What the kernel holds, as last written or adopted.
    pub fn kernel(&self) -> &KernelState {
        &self.kernel
    }

    /// The maps, for reading counters.
    pub fn maps(&self) -> &MapSet {
        &self.maps
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
                self.remove(port)?;
                report.removed += 1;
            }
            return Ok(());
        };
        let slots = validated_slots(port, service)?;
        match self.kernel.services.get(port) {
            Some(current) if current.intact() && !self.foreign_runs.contains(port) && current.slots == slots => {
                if current.name != service.name {
                    self.rename(port, &service.name)?;
                }
                report.unchanged += 1;
            }
            Some(_) => {
                self.swap(port, &service.name, slots, report)?;
                report.updated += 1;
            }
            None => {
                self.add(port, &service.name, slots, report)?;
                report.added += 1;
            }
        }
        Ok(())
    }

    fn add(
        &mut self,
        port: &ServicePort,
        name: &str,
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
            .and_then(|()| self.write_meta(service_id, name))
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
        self.kernel.services.insert(*port, ProgrammedService::new(&value, slots, name.to_owned()));
        Ok(())
    }

    fn swap(
        &mut self,
        port: &ServicePort,
        name: &str,
        slots: Vec<Slot>,
        report: &mut ApplyReport,
    ) -> Result<(), DataplaneError> {
        let current = self.kernel.services[port].clone();
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
        self.kernel.services.insert(*port, ProgrammedService::new(&value, slots, current.name.clone()));
        if current.name != name {
            self.rename(port, name)?;
        }
        Ok(())
    }

    fn remove(&mut self, port: &ServicePort) -> Result<(), DataplaneError> {
        let current = self.kernel.services[port].clone();
        self.index_remove(port);
        self.delete_entry(port)?;
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
        // A position of the index left half-written may still lead to a retired run.
        if self.slots.has_retired() && self.repair_index() {
            grace::wait();
            self.slots.reclaim();
            self.index4.grace_passed();
            self.index6.grace_passed();
            report.grace_periods += 1;
            match self.slots.allocate(len) {
                Ok(run) => return Ok(run),
                Err(again) => shortage = again,
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
        if let Some(service) = self.kernel.services.get_mut(port) {
            service.name = name.to_owned();
        }
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
    /// the programs could make answers (see [`Placement::verify`]).
    pub fn verify_index(&self) -> Result<(), String> {
        let (services4, services6) = entries_by_family(&self.kernel);
        Placement::verify(&self.maps.index4, &services4)?;
        Placement::verify(&self.maps.index6, &services6)
    }

    /// Finishes index rewrites that failed half-way; true if the index is whole.
    fn repair_index(&mut self) -> bool {
        let v4 = self.index4.repair(&mut self.maps.index4);
        self.index6.repair(&mut self.maps.index6) && v4
    }

    /// Points the index at a service entry just written to the hash map. A failure is reported
    /// with the apply and repaired on the next; meanwhile the programs use the hash map.
    fn index_upsert(&mut self, port: &ServicePort, value: ServiceValue) {
        match key_of(port) {
            Key::V4(key) => self.index4.upsert(&mut self.maps.index4, key, value),
            Key::V6(key) => self.index6.upsert(&mut self.maps.index6, key, value),
        }
    }

    /// Takes a service port out of the index, before its hash map entry goes.
    fn index_remove(&mut self, port: &ServicePort) {
        match key_of(port) {
            Key::V4(key) => self.index4.remove(&mut self.maps.index4, &key),
            Key::V6(key) => self.index6.remove(&mut self.maps.index6, &key),
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

    /// Deletes the name of a service id (its counters are zeroed when the id is reused); false if
    /// it is still there.
    fn delete_ids(&mut self, service_id: u32) -> bool {
        ignore_missing(self.maps.meta.remove(&service_id)).is_ok()
    }
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
    fn ids_are_unique_non_zero_and_reused_only_after_release() {
        let mut pool = IdPool::new([3, 5]);
        assert_eq!(pool.allocate(), 6);
        assert_eq!(pool.allocate(), 7);
        pool.release(6);
        assert_eq!(pool.allocate(), 8, "released ids wait for the cursor to come round");
        let mut wrapped = IdPool::new([u32::MAX, 1]);
        assert_eq!(wrapped.allocate(), 2, "wraps past u32::MAX, skipping 0 and live ids");
    }

    #[test]
    fn service_ids_are_dense_lowest_free_first() {
        let mut ids = DenseIds::new([0, 2, 5]);
        assert_eq!(ids.len(), 3);
        assert_eq!([ids.allocate(), ids.allocate(), ids.allocate(), ids.allocate()], [1, 3, 4, 6]);
        ids.release(3);
        ids.release(0);
        assert_eq!(ids.len(), 5);
        assert_eq!([ids.allocate(), ids.allocate(), ids.allocate()], [0, 3, 7]);
        // The lowest free id never exceeds the number in use, so ids stay below the capacity.
        let mut fresh = DenseIds::default();
        assert_eq!([fresh.allocate(), fresh.allocate()], [0, 1]);
        assert_eq!(fresh.len(), 2);
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
        };
        let error = validated_slots(&port, &service).unwrap_err();
        assert!(error.to_string().contains("fd00::1 is not of the ClusterIP's address family"), "{error}");
    }
}
