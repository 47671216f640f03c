//! Taking a port out of the kernel: deleting its entry (its index position "not sure" meanwhile),
//! retiring its run, and withdrawing one whose new state could not be written.

use topology_common::Slot;
use topology_policy::desired::ServicePort;

use super::{ApplyReport, Writer};
use crate::{
    diff,
    error::DataplaneError,
    ops::{MapOps, ServiceKey},
    slot_space::Run,
    state::ProgrammedService,
};

impl<M: MapOps> Writer<M> {
    /// Deletes the entry of a port whose new state could not be written (see the module docs);
    /// `kept`: the set it should have held, whose backends have not departed.
    pub(super) fn withdraw(&mut self, port: &ServicePort, kept: &[Slot], report: &mut ApplyReport) {
        if !self.kernel.services.contains_key(port) {
            return;
        }
        match self.remove(port, kept, report) {
            Ok(()) => report.withdrawn += 1,
            Err(error) => {
                tracing::error!(%port, %error, "an outdated backend set could not be withdrawn");
                report.stranded.push(*port);
            }
        }
    }

    /// Deletes a port's entry; the backends of `kept` (what it should hold) have not departed.
    pub(super) fn remove(
        &mut self,
        port: &ServicePort,
        kept: &[Slot],
        report: &mut ApplyReport,
    ) -> Result<(), DataplaneError> {
        let current = self.kernel.services[port].clone();
        let key = ServiceKey::of(port);
        let staged = self.stage_remove(key);
        let deleted = self.maps.delete_service(key);
        if deleted.is_err() {
            // The entry stays, so must its place in the index: the programs trust the index's
            // "absent", and the next apply, finding the port as desired, would change nothing.
            self.index_upsert(key, current.value());
        }
        self.settle(staged);
        deleted?;
        report.departed.extend(diff::departures(port, &current.slots, kept));
        self.kernel.services.remove(port);
        self.foreign.ids.remove(port);
        *self.entries.get_mut(key.family()) -= 1;
        self.retire(port, &current);
        if self.delete_ids(current.service_id) {
            self.service_ids.release(current.service_id);
        } else {
            self.kernel.orphan_ids.insert(current.service_id);
        }
        Ok(())
    }

    /// Retires the run a replaced or removed service entry referred to, and frees its set id.
    pub(super) fn retire(&mut self, port: &ServicePort, old: &ProgrammedService) {
        if !self.foreign.runs.remove(port) {
            self.slots.retire(Run { base: old.base, len: old.count });
        }
        if old.set_id != 0 {
            self.set_ids.release(old.set_id);
        }
    }
}
