//! What the controller needs from the dataplane, so that the control loop can be tested without a
//! kernel: apply a desired state (whole, or only some service ports), and report what it holds.

use std::collections::BTreeSet;

use topology_common::map_names;

use crate::{
    dataplane::{ApplyReport, Dataplane},
    desired::{DesiredState, ServicePort},
    metrics::KernelServiceCounters,
};

/// What the kernel holds, for the metrics.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    /// Service ports programmed.
    pub services: usize,
    /// Backends programmed, over all service ports.
    pub backends: usize,
    /// (map, entries in use, capacity).
    pub maps: Vec<(&'static str, u64, u32)>,
    /// Kernel counters by service port.
    pub counters: Vec<KernelServiceCounters>,
}

/// Something that makes the kernel hold a desired state.
pub trait Programmer {
    /// Makes the kernel hold `desired`, touching only what differs.
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport;
    /// Makes the kernel hold `desired` for the `changed` ports only.
    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport;
    /// What the kernel holds now.
    fn observe(&self) -> Observation;
}

impl Programmer for Dataplane {
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        Dataplane::apply(self, desired)
    }

    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport {
        Dataplane::apply_changes(self, changed.iter().map(|port| (*port, desired.services.get(port))))
    }

    fn observe(&self) -> Observation {
        let kernel = self.kernel();
        let capacities = self.capacities();
        let v4 = kernel.services.keys().filter(|p| p.vip.is_ipv4()).count() as u64;
        let v6 = kernel.services.len() as u64 - v4;
        let counters = match self.counters() {
            Ok(counters) => kernel
                .services
                .iter()
                .filter_map(|(port, programmed)| {
                    counters.get(&programmed.service_id).map(|counters| KernelServiceCounters {
                        name: programmed.name.clone(),
                        port: *port,
                        counters: *counters,
                    })
                })
                .collect(),
            Err(error) => {
                tracing::warn!(%error, "reading the kernel counters");
                Vec::new()
            }
        };
        Observation {
            services: kernel.services.len(),
            backends: kernel.services.values().map(|s| s.slots.len()).sum(),
            maps: vec![
                (map_names::SERVICES_V4, v4, capacities.services_v4),
                (map_names::SERVICES_V6, v6, capacities.services_v6),
                (map_names::SLOTS, kernel.slot_entries(), capacities.slots),
                (map_names::COUNTERS, kernel.services.len() as u64, capacities.service_ids),
            ],
            counters,
        }
    }
}
