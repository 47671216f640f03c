//! What the controller needs from the dataplane, so that the control loop can be tested without a
//! kernel: apply a desired state (whole, or only some service ports), and report what it holds.

use std::collections::BTreeSet;

use topology_common::map_names;
use topology_dataplane::{ApplyReport, CountedBytes, Dataplane, DataplaneError, Epochs, MeasuredBackend, Outlier};
use topology_policy::desired::{DesiredState, ServicePort};

/// What the kernel holds, for the metrics; known without asking the kernel.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    /// Service ports programmed.
    pub services: usize,
    /// Backends programmed, over all service ports.
    pub backends: usize,
    /// (map, entries in use, capacity).
    pub maps: Vec<(&'static str, u64, u32)>,
    /// The RCU grace periods the service index's writer needed so far (none without the index).
    pub grace: Epochs,
}

/// Something that makes the kernel hold a desired state. `Send`: the full sync of a large cluster
/// writes on a thread of its own while the controller decides.
pub trait Programmer: Send {
    /// Makes the kernel hold `desired`, touching only what differs.
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport;
    /// Makes the kernel hold `desired` for the `changed` ports only.
    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport;
    /// Ends a full sync whose every changed port was handed to [`Programmer::apply_changes`]:
    /// removes what the kernel holds that `desired` lacks and writes the `retry` ports again (those
    /// that failed). The default applies the whole of `desired`, which comes to the same.
    fn complete(&mut self, desired: &DesiredState, retry: &BTreeSet<ServicePort>) -> ApplyReport {
        let _ = retry;
        self.apply(desired)
    }
    /// Prepares for about `ports` new service ports that several [`Programmer::apply_changes`]
    /// will bring (the full sync of a large cluster); best effort.
    fn reserve(&mut self, _ports: usize) {}
    /// What the kernel holds now (from the programmer's own record: cheap).
    fn observe(&mut self) -> Observation;
    /// Tells the kernel the agent is alive with a current view (see `--fail-open-after`).
    fn heartbeat(&mut self) -> Result<(), DataplaneError> {
        Ok(())
    }
    /// Drops what no programmed set needs any more (measurements of backends gone and idle).
    fn tidy(&mut self) -> Result<(), DataplaneError> {
        Ok(())
    }
    /// What the kernel measured of each backend (the load signal).
    fn backend_load(&self) -> Result<Vec<MeasuredBackend>, DataplaneError> {
        Ok(Vec::new())
    }
    /// The programs that should rewrite and are not attached any more.
    fn detached(&self) -> Vec<&'static str> {
        Vec::new()
    }
    /// The backends failing or ejected on this node (outlier ejection); the read forgets those
    /// quiet for a failing window.
    fn outliers(&mut self) -> Result<Vec<Outlier>, DataplaneError> {
        Ok(Vec::new())
    }
    /// The bytes the kernel counted per Service port and backend (cross-zone accounting).
    fn bytes(&self) -> Result<Vec<CountedBytes>, DataplaneError> {
        Ok(Vec::new())
    }
}

impl Programmer for Dataplane {
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        Dataplane::apply(self, desired)
    }

    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport {
        Dataplane::apply_changes(self, changed.iter().map(|port| (*port, desired.services.get(port))))
    }

    fn complete(&mut self, desired: &DesiredState, retry: &BTreeSet<ServicePort>) -> ApplyReport {
        let stale: Vec<ServicePort> =
            self.kernel().services.keys().filter(|port| !desired.services.contains_key(port)).copied().collect();
        let retried = retry.iter().map(|port| (*port, desired.services.get(port)));
        Dataplane::apply_changes(self, stale.into_iter().map(|port| (port, None)).chain(retried))
    }

    fn reserve(&mut self, ports: usize) {
        if let Err(error) = Dataplane::reserve(self, ports) {
            // Each new port's own add creates what it needs.
            tracing::debug!(%error, "the counters of the full sync's ports could not be created together");
        }
    }

    fn heartbeat(&mut self) -> Result<(), DataplaneError> {
        Dataplane::heartbeat(self)
    }

    fn backend_load(&self) -> Result<Vec<MeasuredBackend>, DataplaneError> {
        Dataplane::backend_load(self)
    }

    fn detached(&self) -> Vec<&'static str> {
        self.detached_programs()
    }

    fn outliers(&mut self) -> Result<Vec<Outlier>, DataplaneError> {
        Dataplane::outliers(self)
    }

    fn bytes(&self) -> Result<Vec<CountedBytes>, DataplaneError> {
        Dataplane::bytes(self)
    }

    fn tidy(&mut self) -> Result<(), DataplaneError> {
        let gone = self.prune_backend_load()?;
        if gone > 0 {
            tracing::debug!(gone, "dropped the load measurements of backends gone and idle");
        }
        Ok(())
    }

    fn observe(&mut self) -> Observation {
        let usage = self.usage();
        let capacities = self.capacities();
        Observation {
            services: (usage.services_v4 + usage.services_v6) as usize,
            backends: usage.slots as usize,
            maps: vec![
                (map_names::SERVICES_V4, usage.services_v4, capacities.services_v4),
                (map_names::SERVICES_V6, usage.services_v6, capacities.services_v6),
                (map_names::SLOTS, usage.slots, capacities.slots),
                (map_names::COUNTERS, usage.service_ids, capacities.service_ids),
            ],
            grace: self.grace_periods(),
        }
    }
}
