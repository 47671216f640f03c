//! What the pins hold, read without loading or attaching anything (`status`, `cleanup --check`,
//! the tests' consistency checks after a crash).

use std::{collections::BTreeMap, path::Path};

use topology_common::{NodeCounters, ServiceCounters, program_names};

use crate::{
    Capacities, DataplaneError, HeartbeatReading, KernelState, MeasuredBackend, Outlier, PinLayout, backend_load,
    heartbeat, maps, outliers, state, upgrade, writer,
};

/// What the pins hold, read without loading or attaching anything.
#[derive(Debug)]
pub struct PinnedState {
    /// Programmed service ports.
    pub kernel: KernelState,
    /// Counters by service id.
    pub counters: BTreeMap<u32, ServiceCounters>,
    /// Counters of the whole node.
    pub node_counters: NodeCounters,
    /// The agent's heartbeat as the programs see it.
    pub heartbeat: HeartbeatReading,
    /// Programs with a pinned (attached) link.
    pub attached: Vec<&'static str>,
    /// What the load signal measured per backend.
    pub backend_load: Vec<MeasuredBackend>,
    /// Backends failing or ejected (outlier ejection).
    pub outliers: Vec<Outlier>,
    /// Map capacities.
    pub capacities: Capacities,
}

/// Reads the pinned state under `pin_path`.
pub fn read_pins(pin_path: &Path) -> Result<PinnedState, DataplaneError> {
    let layout = PinLayout::new(pin_path);
    upgrade::check(&layout)?;
    let maps = maps::MapSet::from_pins(&layout)?;
    let kernel = state::read(&maps)?;
    let counters = state::read_counters(&maps)?;
    let node_counters = heartbeat::read_node_counters(&maps.node_counters)?;
    let heartbeat = heartbeat::read(&maps.heartbeat)?;
    let attached = program_names::ALL
        .into_iter()
        .chain(program_names::CLOSED.map(|(name, _)| name))
        .filter(|name| layout.link(name).exists())
        .collect();
    let backend_load = backend_load::read(&maps.backend_load)?;
    let outliers = maps::CounterMaps::from_pins(&layout)
        .and_then(|counters| outliers::read(&counters.outliers, || state::service_ports_of(&counters)))?;
    Ok(PinnedState {
        kernel,
        counters,
        node_counters,
        heartbeat,
        attached,
        backend_load,
        outliers,
        capacities: maps.capacities,
    })
}

/// What [`verify_pins`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PinCheck {
    /// Service entries.
    pub services: usize,
    /// Slots the service entries refer to.
    pub live_slots: u64,
}

/// Checks what the pins hold is consistent, as a program would find it: every service entry's
/// slot run lies in the array, carries the entry's set id and overlaps no other run; every
/// lookup the programs could make in the service index agrees with the hash maps. For an agent
/// that was killed at any instant, this must hold on what it left.
pub fn verify_pins(pin_path: &Path) -> Result<PinCheck, DataplaneError> {
    let layout = PinLayout::new(pin_path);
    upgrade::check(&layout)?;
    let maps = maps::MapSet::from_pins(&layout)?;
    let kernel = state::read(&maps)?;
    let inconsistent = |problem| DataplaneError::Inconsistent { map: topology_common::map_names::SLOTS, problem };
    let mut runs: Vec<(u32, u32, ProgrammedPort)> = Vec::new();
    for (port, service) in &kernel.services {
        if !service.intact() {
            let found = service.slots.len();
            return Err(inconsistent(format!("{port}: {found} of its {} slots carry its set id", service.count)));
        }
        if service.count > 0 {
            runs.push((service.base, service.count, *port));
        }
    }
    runs.sort();
    for pair in runs.windows(2) {
        let ((base, count, first), (next, _, second)) = (pair[0], pair[1]);
        if u64::from(base) + u64::from(count) > u64::from(next) {
            return Err(inconsistent(format!("{first} and {second} share slots")));
        }
    }
    writer::verify_index(&maps, &kernel)?;
    Ok(PinCheck { services: kernel.services.len(), live_slots: kernel.slot_entries() })
}

/// A service port, as [`verify_pins`] names it.
type ProgrammedPort = topology_policy::desired::ServicePort;
