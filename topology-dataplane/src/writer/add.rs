//! New service ports: one (a room check, ids and a run handed out, every map written, the entry
//! last), or many at once — a full sync, a restart onto empty maps, a large update — in a few
//! batched system calls per group of ports instead of a dozen per port, in the order a single add
//! keeps: every counter, name, option and slot of the group first, then its service entries, the
//! index positions "not sure" around them. No program sees an entry before its set. A batch the
//! kernel refuses is redone port by port, so each failure is charged to its own port and rolled
//! back alone (with any entry the refused batch may have written).

use topology_common::{ServiceMeta, ServiceOptions, ServiceValue, Slot, map_names};
use topology_model::Family;
use topology_policy::desired::{DesiredService, ServicePort};

use super::{ApplyReport, Writer, indexing::StagedIndex, write_slots};
use crate::{
    error::DataplaneError,
    ops::{MapOps, ServiceKey, check_room, services_map},
    slot_space::Run,
    state::{ProgrammedService, meta_from_name},
};

/// Ports written per group: bounds the staging buffers (about 0.5 MB of slots at 10 endpoints)
/// and how long the index waits for a group's entries.
const GROUP: usize = 2048;

/// A new service port with its ids and run handed out, not yet written.
pub(super) struct Prepared<'a> {
    port: ServicePort,
    service: &'a DesiredService,
    slots: Vec<Slot>,
    run: Run,
    key: ServiceKey,
    value: ServiceValue,
}

impl<M: MapOps> Writer<M> {
    /// Adds one port the kernel does not hold.
    pub(super) fn add(
        &mut self,
        port: &ServicePort,
        service: &DesiredService,
        slots: Vec<Slot>,
        report: &mut ApplyReport,
    ) -> Result<(), DataplaneError> {
        let added = self.prepare(*port, service, slots, report)?;
        match self.write_one(&added, false) {
            Ok(()) => {
                self.commit(added, report);
                Ok(())
            }
            Err(error) => {
                self.roll_back(&added);
                Err(error)
            }
        }
    }

    /// Writes a prepared service port: its counters, name, options and slots, then its entry and
    /// its place in the index. `after_refused_batch`: a batch may have written the entry already,
    /// so a failure leaves the index "not sure" for [`Self::forget_entry`].
    fn write_one(&mut self, added: &Prepared<'_>, after_refused_batch: bool) -> Result<(), DataplaneError> {
        let maps = &mut self.maps;
        let service_id = added.value.service_id;
        maps.reset_counters(service_id)
            .and_then(|()| maps.put_name(service_id, meta_from_name(&added.service.name)))
            .and_then(|()| maps.put_options(service_id, added.service.options.to_kernel()))
            .and_then(|()| write_slots(maps, added.value.set_id, added.run, &added.slots))?;
        let staged = self.stage_upsert(added.key, added.value);
        let entry = self.maps.put_service(added.key, added.value);
        if entry.is_err() && !after_refused_batch {
            self.index_remove(added.key);
        }
        self.settle(staged);
        entry
    }

    /// Checks room for a new service port and hands out its ids and slot run (nothing written).
    fn prepare<'a>(
        &mut self,
        port: ServicePort,
        service: &'a DesiredService,
        slots: Vec<Slot>,
        report: &mut ApplyReport,
    ) -> Result<Prepared<'a>, DataplaneError> {
        let family = Family::of(&port.vip);
        let capacities = self.maps.capacities();
        let family_capacity = match family {
            Family::V4 => capacities.services_v4,
            Family::V6 => capacities.services_v6,
        };
        check_room(services_map(family), *self.entries.get(family), 1, family_capacity)?;
        check_room(map_names::COUNTERS, self.service_ids.len() as u64, 1, capacities.service_ids)?;
        let run = self.allocate_for(&port, &service.name, slots.len() as u32, report)?;
        let service_id = self.service_ids.allocate();
        let set_id = if slots.is_empty() { 0 } else { self.set_ids.allocate() };
        // Counted now, so the next port's room check sees it.
        *self.entries.get_mut(family) += 1;
        let value = ServiceValue { service_id, set_id, count: run.len, base: run.base };
        Ok(Prepared { port, service, slots, run, key: ServiceKey::of(&port), value })
    }

    /// Frees what [`Writer::prepare`] handed out: the entry was the last write and is not there,
    /// so no program has seen the run and it is free at once.
    fn roll_back(&mut self, added: &Prepared<'_>) {
        self.slots.release(added.run);
        self.delete_ids(added.value.service_id);
        self.service_ids.release(added.value.service_id);
        self.set_ids.release(added.value.set_id);
        *self.entries.get_mut(added.key.family()) -= 1;
    }

    /// Takes the entry of a port whose batch was refused out of the hash map, where the kernel
    /// may have written it before refusing the rest, then out of the index. An entry that cannot
    /// be deleted either is logged: the index answers "absent" for it, so the programs pass its
    /// connections untouched, until the port's next add overwrites it.
    fn forget_entry(&mut self, added: &Prepared<'_>) {
        if let Err(error) = self.maps.delete_service(added.key) {
            tracing::error!(port = %added.port, %error, "an entry a refused batch may have written could not be deleted");
        }
        self.index_remove(added.key);
    }

    /// Records a written service port in the mirror.
    fn commit(&mut self, added: Prepared<'_>, report: &mut ApplyReport) {
        report.slots_written += added.slots.len();
        report.added += 1;
        let programmed =
            ProgrammedService::new(&added.value, added.slots, added.service.name.clone(), added.service.options);
        self.kernel.services.insert(added.port, programmed);
    }

    /// Adds `new` ports (none of which the kernel holds). Every port is prepared first, so the
    /// counter chunks of all the new ids are created together (one grace period, not one per
    /// chunk), then written group by group.
    pub(super) fn add_many(&mut self, new: Vec<(ServicePort, &DesiredService, Vec<Slot>)>, report: &mut ApplyReport) {
        let mut prepared = Vec::with_capacity(new.len());
        for (port, service, slots) in new {
            match self.prepare(port, service, slots, report) {
                Ok(added) => prepared.push(added),
                Err(error) => report.failed.push((port, error)),
            }
        }
        let ids: Vec<u32> = prepared.iter().map(|added| added.value.service_id).collect();
        if let Err(error) = self.maps.reserve_counters(&ids) {
            // Each port's own reset tries again and charges a failure to that port.
            tracing::debug!(%error, "the counters of new service ids could not be created together");
        }
        let mut prepared = prepared.into_iter().peekable();
        while prepared.peek().is_some() {
            let group: Vec<Prepared<'_>> = prepared.by_ref().take(GROUP).collect();
            let mut staged = None;
            let written = self.write_sets(&group).and_then(|()| {
                let entries: Vec<(ServiceKey, ServiceValue)> = group.iter().map(|a| (a.key, a.value)).collect();
                let group_staged =
                    entries.iter().fold(StagedIndex::default(), |all, (k, v)| all.and(self.stage_upsert(*k, *v)));
                staged = Some(group_staged);
                self.maps.put_services(&entries)
            });
            if written.is_ok() {
                if let Some(staged) = staged {
                    self.settle(staged);
                }
                group.into_iter().for_each(|added| self.commit(added, report));
                continue;
            }
            // The refused batch may have written some entries: until each port is redone, its
            // index position stays "not sure".
            for added in group {
                match self.write_one(&added, staged.is_some()) {
                    Ok(()) => self.commit(added, report),
                    Err(error) => {
                        if staged.is_some() {
                            self.forget_entry(&added);
                        }
                        self.roll_back(&added);
                        report.failed.push((added.port, error));
                    }
                }
            }
            if let Some(staged) = staged {
                self.settle(staged);
            }
        }
    }

    /// Writes everything of a group but its entries.
    fn write_sets(&mut self, group: &[Prepared<'_>]) -> Result<(), DataplaneError> {
        let maps = &mut self.maps;
        for added in group {
            maps.reset_counters(added.value.service_id)?;
        }
        let names: Vec<(u32, ServiceMeta)> =
            group.iter().map(|a| (a.value.service_id, meta_from_name(&a.service.name))).collect();
        maps.put_names(&names)?;
        let options: Vec<(u32, ServiceOptions)> =
            group.iter().map(|a| (a.value.service_id, a.service.options.to_kernel())).collect();
        maps.put_options_many(&options)?;
        let slots: Vec<(u32, Slot)> = group
            .iter()
            .flat_map(|a| {
                (a.run.base..).zip(&a.slots).map(|(index, slot)| (index, Slot { set_id: a.value.set_id, ..*slot }))
            })
            .collect();
        maps.put_slots(&slots)
    }
}
