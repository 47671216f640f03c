//! Room in the slots array: a free run for a set, after a grace period if only retired runs are
//! left, after taking room back from namespaces over their share ([`super::share`]) if none is.

use topology_common::map_names;
use topology_policy::desired::ServicePort;

use super::{ApplyReport, Writer, share};
use crate::{
    error::DataplaneError,
    ops::MapOps,
    slot_space::{Run, Shortage},
};

impl<M: MapOps> Writer<M> {
    /// A free run of `len` slots for `port`'s set of the Service `name`, taking room back from
    /// the namespaces over their share ([`share`]) when there is none.
    pub(super) fn allocate_for(
        &mut self,
        port: &ServicePort,
        name: &str,
        len: u32,
        report: &mut ApplyReport,
    ) -> Result<Run, DataplaneError> {
        match self.allocate(len, report) {
            Err(full) if self.take_back_shares(port, share::namespace_of(name), len, report) => {
                self.allocate(len, report).map_err(|_| full)
            }
            outcome => outcome,
        }
    }

    /// A free run of `len` slots, waiting for a grace period to reuse retired runs if needed.
    pub(super) fn allocate(&mut self, len: u32, report: &mut ApplyReport) -> Result<Run, DataplaneError> {
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
            let waited = self.maps.grace().wait();
            report.grace_wait += started.elapsed();
            match waited {
                Ok(()) => {
                    self.slots.reclaim();
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
        let capacity = self.maps.capacities().slots;
        Err(match shortage {
            Shortage::Full { needed } => DataplaneError::MapFull { map: map_names::SLOTS, needed, capacity },
            Shortage::Fragmented { free, largest } => {
                DataplaneError::MapFragmented { map: map_names::SLOTS, needed: len, free, largest, capacity }
            }
        })
    }
}
