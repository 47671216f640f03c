//! Carries out the diff ([`super::diff`]) against the maps, through [`MapOps`]: service and set
//! ids, slot runs, the service index and the kernel mirror. The only code that writes service maps.
//!
//! # Swap protocol
//!
//! A program reads a service entry `{service_id, set_id, count, base}` and then one slot at
//! `base + i` (`i < count`) of the slots array, which must carry the entry's `set_id`. To replace a
//! backend set without a connect ever seeing half of it:
//!
//! 1. write every slot of the new set, tagged with a fresh `set_id`, into a free run;
//! 2. overwrite the service entry with the new `set_id`, `count` and `base` (one map update,
//!    which the kernel publishes with RCU: a program sees the old entry or the new one), its
//!    service index position "not sure" from just before the update until just after it, so the
//!    index never answers an entry the hash map no longer holds ([`indexing`]);
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
//!
//! # A failed update holds nothing, never the old set
//!
//! When a port's new set or options cannot be written (a full slots array, a refused write), its
//! entry is deleted: connections to it pass to the ClusterIP untouched, where kube-proxy routes
//! them to the current endpoints, as it does for a node without the agent. Keeping the old set
//! would route to backends that may be gone, silently, for as long as the failure lasts — and one
//! tenant filling the slots could cause it for every other. Only a port whose entry cannot be
//! deleted either is left holding an old set; it is reported [`ApplyReport::stranded`].

use std::collections::HashMap;

use topology_common::{ServiceKey4, ServiceKey6, ServiceValue, Slot};
use topology_policy::desired::{DesiredService, DesiredState, PortOptions, ServicePort};

use super::{
    diff::{self, Foreign, Op},
    error::DataplaneError,
    ids::{DenseIds, IdPool},
    index::{self, ServiceIndex},
    maps::MapSet,
    ops::{MapOps, PerFamily, ServiceKey},
    slot_space::{Run, SlotSpace},
    state::{KernelState, ProgrammedService, meta_from_name},
};
use crate::Departure;

mod add;
mod indexing;
mod ranges;
mod remove;
mod room;
mod share;

/// What one `apply` did.
#[derive(Debug, Default)]
pub struct ApplyReport {
    /// Service ports written for the first time.
    pub added: usize,
    /// Service ports whose backend set (or options) changed.
    pub updated: usize,
    /// Service ports removed.
    pub removed: usize,
    /// Service ports already as desired (not rewritten; a new name only is no new routing).
    pub unchanged: usize,
    /// Slot entries written.
    pub slots_written: usize,
    /// Grace periods waited for to reuse retired slots.
    pub grace_periods: usize,
    /// Time spent waiting for them.
    pub grace_wait: std::time::Duration,
    /// Service ports that could not be programmed; the kernel holds nothing for them (their
    /// connections pass to the ClusterIP untouched), unless they are also `stranded`.
    pub failed: Vec<(ServicePort, DataplaneError)>,
    /// Failed ports whose earlier entry was deleted so that no outdated set routes them.
    pub withdrawn: usize,
    /// Failed ports whose outdated entry could not be deleted either: the kernel still routes
    /// them by a set the cluster no longer asks for.
    pub stranded: Vec<ServicePort>,
    /// Leftovers (ids of a removed service) that could not be deleted yet; they are retried on the
    /// next apply and never visible to the programs.
    pub housekeeping: Vec<DataplaneError>,
    /// Backends that left a service port's set (or whose service port went).
    pub departed: Vec<Departure>,
    /// Backends that joined a service port's set by a swap: a pending departure of theirs no
    /// longer holds.
    pub returned: Vec<Departure>,
}

impl ApplyReport {
    /// Adds what `other`, a later apply, did to this report.
    pub fn absorb(&mut self, other: ApplyReport) {
        self.added += other.added;
        self.updated += other.updated;
        self.removed += other.removed;
        self.unchanged += other.unchanged;
        self.slots_written += other.slots_written;
        self.grace_periods += other.grace_periods;
        self.grace_wait += other.grace_wait;
        self.failed.extend(other.failed);
        self.withdrawn += other.withdrawn;
        self.stranded.extend(other.stranded);
        self.housekeeping.extend(other.housekeeping);
        self.departed.extend(other.departed);
        self.returned.extend(other.returned);
    }
}

/// The dataplane's view of the kernel and the means to change it.
pub struct Writer<M: MapOps = MapSet> {
    maps: M,
    kernel: KernelState,
    service_ids: DenseIds,
    set_ids: IdPool,
    slots: SlotSpace,
    foreign: Foreign,
    /// Service entries per family, kept as services are added and removed.
    entries: PerFamily<u64>,
    /// The service indexes the programs probe before the hash maps.
    index4: ServiceIndex<ServiceKey4>,
    index6: ServiceIndex<ServiceKey6>,
    /// Where the service ports are, for the programs to pass other destinations unlooked.
    ranges: ranges::Ranges,
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

impl<M: MapOps> Writer<M> {
    /// Adopts what the kernel holds.
    pub fn adopt(mut maps: M, kernel: KernelState) -> Result<Self, DataplaneError> {
        let capacities = maps.capacities();
        let mut seen = std::collections::HashSet::new();
        let foreign_ids = kernel
            .services
            .iter()
            .filter(|(_, s)| s.service_id >= capacities.service_ids || !seen.insert(s.service_id))
            .map(|(port, _)| *port)
            .collect();
        let service_ids = DenseIds::new(
            kernel.services.values().map(|s| s.service_id).chain(kernel.orphan_ids.iter().copied()),
            capacities.service_ids,
        );
        let set_ids = IdPool::new(kernel.services.values().map(|s| s.set_id));
        let runs = kernel.services.iter().map(|(port, s)| (Run { base: s.base, len: s.count }, *port));
        let (slots, rejected) = SlotSpace::adopt(capacities.slots, runs);
        let foreign = Foreign { runs: rejected.into_iter().collect(), ids: foreign_ids };
        let v4 = kernel.services.keys().filter(|port| port.vip.is_ipv4()).count() as u64;
        let entries = PerFamily { v4, v6: kernel.services.len() as u64 - v4 };
        let (services4, services6) = entries_by_family(&kernel);
        let (map, grace) = maps.index4();
        let index4 = ServiceIndex::adopt(map, &services4, grace)?;
        let (map, grace) = maps.index6();
        let index6 = ServiceIndex::adopt(map, &services6, grace)?;
        let ranges = ranges::Ranges::adopt(kernel.services.keys().map(|port| port.vip));
        Ok(Self { maps, kernel, service_ids, set_ids, slots, foreign, entries, index4, index6, ranges })
    }

    /// What the kernel holds, as last written or adopted.
    pub fn kernel(&self) -> &KernelState {
        &self.kernel
    }

    /// The maps, for reading counters.
    pub fn maps(&self) -> &M {
        &self.maps
    }

    /// The maps, for the writes that are not about service ports (the heartbeat).
    pub fn maps_mut(&mut self) -> &mut M {
        &mut self.maps
    }

    /// Prepares for about `ports` new service ports that will come in several applies (a full
    /// sync written while it is decided): the counters of the ids they will get are created now,
    /// together — one RCU grace period, not one per apply. Best effort: an add still creates
    /// whatever this did not.
    pub fn reserve(&mut self, ports: usize) -> Result<(), DataplaneError> {
        let capacity = self.maps.capacities().service_ids;
        let ids: Vec<u32> = self.service_ids.upcoming(ports).take_while(|&id| id < capacity).collect();
        self.maps.reserve_counters(&ids)
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
    /// other service port alone.
    pub fn apply_changes<'a>(
        &mut self,
        changes: impl IntoIterator<Item = (ServicePort, Option<&'a DesiredService>)>,
    ) -> ApplyReport {
        let mut report = ApplyReport::default();
        self.remove_orphan_ids();
        self.repair_index();
        let mut changes: Vec<_> = changes.into_iter().collect();
        self.widen_ranges(&mut changes, &mut report);
        let removes = changes.iter().any(|(_, service)| service.is_none());
        let diff = diff::diff(changes, &self.kernel, &self.foreign);
        report.unchanged = diff.unchanged;
        for (port, _) in &diff.invalid {
            // What it should hold is unknown; nobody's sockets are ended for it.
            let kept = self.kernel.services.get(port).map(|held| held.slots.clone()).unwrap_or_default();
            self.withdraw(port, &kept, &mut report);
        }
        report.failed.extend(diff.invalid);
        // New ports are written together after every other change, a few batched system calls
        // for all of them (a full sync, a restart onto empty maps, a large update).
        let mut new = Vec::new();
        for op in diff.ops {
            let port = *op.port();
            match op {
                Op::Add { port, slots, service, replace: false } => new.push((port, service, slots)),
                op => {
                    if let Err(error) = self.execute(op, &mut report) {
                        report.failed.push((port, error));
                    }
                }
            }
        }
        self.add_many(new, &mut report);
        if removes || !report.failed.is_empty() {
            self.narrow_ranges(&mut report);
        }
        report.housekeeping.extend(self.index4.take_errors());
        report.housekeeping.extend(self.index6.take_errors());
        report
    }

    /// Carries out one operation, counting what happened in `report`.
    fn execute(&mut self, op: Op<'_>, report: &mut ApplyReport) -> Result<(), DataplaneError> {
        if !self.kernel.services.contains_key(op.port()) {
            // Withdrawn earlier in this apply to make room for another namespace (and reported
            // failed then, so it is retried): a set to write is written afresh.
            return match op {
                Op::Swap { port, slots, service } | Op::Add { port, slots, service, .. } => {
                    self.add(&port, service, slots, report)
                }
                Op::Remove(_) | Op::Retag { .. } => Ok(()),
            };
        }
        match op {
            Op::Remove(port) => {
                if let Err(error) = self.remove(&port, &[], report) {
                    report.stranded.push(port);
                    return Err(error);
                }
                report.removed += 1;
            }
            Op::Add { port, slots, service, replace } => {
                if replace && let Err(error) = self.remove(&port, &slots, &mut ApplyReport::default()) {
                    report.stranded.push(port);
                    return Err(error);
                }
                self.add(&port, service, slots, report)?;
            }
            Op::Swap { port, slots, service } => {
                if let Err(error) = self.swap(&port, service, &slots, report) {
                    self.withdraw(&port, &slots, report);
                    return Err(error);
                }
                report.updated += 1;
                if self.kernel.services[&port].name != service.name {
                    // After the set: a port that keeps its old name keeps its right set.
                    self.rename(&port, &service.name)?;
                }
            }
            Op::Retag { port, name, options } => {
                match options {
                    Some(options) => {
                        if let Err(error) = self.set_options(&port, options) {
                            let kept = self.kernel.services[&port].slots.clone();
                            self.withdraw(&port, &kept, report);
                            return Err(error);
                        }
                        report.updated += 1;
                    }
                    None => report.unchanged += 1,
                }
                if let Some(name) = name {
                    // After the options: a name is no routing, a port that keeps its old name
                    // keeps its right set and options.
                    self.rename(&port, name)?;
                }
            }
        }
        Ok(())
    }

    fn swap(
        &mut self,
        port: &ServicePort,
        service: &DesiredService,
        slots: &[Slot],
        report: &mut ApplyReport,
    ) -> Result<(), DataplaneError> {
        let current = self.kernel.services[port].clone();
        if current.options != service.options {
            // Before the new set: a client's affinity is only ever judged by the options in force.
            self.set_options(port, service.options)?;
        }
        let run = self.allocate_for(port, &service.name, slots.len() as u32, report)?;
        let set_id = if slots.is_empty() { 0 } else { self.set_ids.allocate() };
        let value = ServiceValue { service_id: current.service_id, set_id, count: run.len, base: run.base };
        let key = ServiceKey::of(port);
        // Steps 1 and 2 of the swap protocol, the index position "not sure" around step 2.
        let written = write_slots(&mut self.maps, set_id, run, slots).and_then(|()| {
            let staged = self.stage_upsert(key, value);
            let entry = self.maps.put_service(key, value);
            if entry.is_err() {
                // The entry still holds the current set: so does the index.
                self.index_upsert(key, current.value());
            }
            self.settle(staged);
            entry
        });
        if let Err(error) = written {
            self.slots.release(run);
            self.set_ids.release(set_id);
            return Err(error);
        }
        report.slots_written += slots.len();
        // Step 3: the old run waits for a grace period. The mirror follows the kernel before
        // anything else can fail, so the old run is never retired twice.
        self.retire(port, &current);
        report.departed.extend(diff::departures(port, &current.slots, slots));
        report.returned.extend(diff::departures(port, slots, &current.slots));
        self.kernel
            .services
            .insert(*port, ProgrammedService::new(&value, slots.to_vec(), current.name.clone(), service.options));
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
        self.maps.put_options(service_id, options.to_kernel())?;
        self.update_mirror(port, |s| s.options = options);
        Ok(())
    }

    fn rename(&mut self, port: &ServicePort, name: &str) -> Result<(), DataplaneError> {
        let service_id = self.kernel.services[port].service_id;
        self.maps.put_name(service_id, meta_from_name(name))?;
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

    /// The RCU grace periods since open: begun, passed, and those the writer waited for itself.
    pub fn grace_periods(&mut self) -> crate::Epochs {
        self.maps.grace().epochs()
    }

    /// Entries in use, from the writer's own counts (no kernel access).
    pub fn usage(&self) -> Usage {
        Usage {
            services_v4: self.entries.v4,
            services_v6: self.entries.v6,
            slots: self.slots.live(),
            slots_retired: self.slots.retired(),
            service_ids: self.service_ids.len() as u64,
        }
    }

    /// Checks the service indexes in the kernel against the service entries: what every lookup
    /// the programs could make answers (see [`index::verify`]).
    pub fn verify_index(&self) -> Result<(), DataplaneError> {
        verify_index(&self.maps, &self.kernel)
    }

    /// Deletes the name of a service id (its counters are zeroed when the id is reused); false if
    /// it is still there.
    fn delete_ids(&mut self, service_id: u32) -> bool {
        self.maps.delete_name(service_id).is_ok()
    }
}

/// Writes `slots`, tagged with `set_id`, into `run`.
fn write_slots(maps: &mut impl MapOps, set_id: u32, run: Run, slots: &[Slot]) -> Result<(), DataplaneError> {
    for (index, slot) in (run.base..).zip(slots) {
        maps.put_slot(index, Slot { set_id, ..*slot })?;
    }
    Ok(())
}

/// Checks the service indexes in `maps` against the service entries of `kernel`.
pub fn verify_index(maps: &impl MapOps, kernel: &KernelState) -> Result<(), DataplaneError> {
    let (services4, services6) = entries_by_family(kernel);
    let (index4, index6) = maps.indexes();
    index::verify(index4, &services4)?;
    index::verify(index6, &services6)
}

/// The service entries of each family, keyed as in the maps.
fn entries_by_family(kernel: &KernelState) -> (HashMap<ServiceKey4, ServiceValue>, HashMap<ServiceKey6, ServiceValue>) {
    let (mut services4, mut services6) = (HashMap::new(), HashMap::new());
    for (port, service) in &kernel.services {
        match ServiceKey::of(port) {
            ServiceKey::V4(key) => services4.insert(key, service.value()),
            ServiceKey::V6(key) => services6.insert(key, service.value()),
        };
    }
    (services4, services6)
}
