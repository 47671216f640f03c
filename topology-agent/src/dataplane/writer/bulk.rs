//! Many new service ports at once — a full sync, a restart onto empty maps, a large update — in a
//! few batched system calls per group of ports instead of a dozen per port, in the order a single
//! add keeps: every counter, name, option and slot of the group first, then its service entries,
//! then the index. No program sees an entry before its set. A batch the kernel refuses is redone
//! port by port, so each failure is charged to its own port and rolled back alone.

use topology_common::{ServiceMeta, ServiceOptions, ServiceValue, Slot};

use super::{ApplyReport, Prepared, Writer};
use crate::{
    dataplane::{
        error::DataplaneError,
        ops::{MapOps, ServiceKey},
        state::meta_from_name,
    },
    desired::{DesiredService, ServicePort},
};

/// Ports written per group: bounds the staging buffers (about 0.5 MB of slots at 10 endpoints)
/// and how long the index waits for a group's entries.
const GROUP: usize = 2048;

impl<M: MapOps> Writer<M> {
    /// Adds `new` ports (none of which the kernel holds).
    pub(super) fn add_many(&mut self, new: Vec<(ServicePort, &DesiredService, Vec<Slot>)>, report: &mut ApplyReport) {
        let mut new = new.into_iter().peekable();
        while new.peek().is_some() {
            let mut group = Vec::with_capacity(GROUP);
            for (port, service, slots) in new.by_ref().take(GROUP) {
                match self.prepare(port, service, slots, report) {
                    Ok(prepared) => group.push(prepared),
                    Err(error) => report.failed.push((port, error)),
                }
            }
            if self.write_group(&group).is_ok() {
                group.into_iter().for_each(|added| self.commit(added, report));
                continue;
            }
            for added in group {
                match self.write_one(&added) {
                    Ok(()) => self.commit(added, report),
                    Err(error) => {
                        self.roll_back(&added);
                        report.failed.push((added.port, error));
                    }
                }
            }
        }
    }

    /// Writes a group: everything but the entries, then the entries.
    fn write_group(&mut self, group: &[Prepared<'_>]) -> Result<(), DataplaneError> {
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
        maps.put_slots(&slots)?;
        let entries: Vec<(ServiceKey, ServiceValue)> = group.iter().map(|a| (a.key, a.value)).collect();
        maps.put_services(&entries)
    }
}
