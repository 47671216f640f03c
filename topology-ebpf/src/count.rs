//! Counting: per service port (by locality class, refused, errors) and for the whole node.

use topology_common::{COUNTER_CHUNK, NodeCounters, ServiceCounters};

use crate::maps::{COUNTERS, NODE_COUNTERS};

/// Adds one to counter `index` (see `ServiceCounters::FIELDS`) of a service on this CPU.
#[inline(always)]
pub fn count(service_id: u32, index: usize) {
    // A chunk the agent has not created (never the case for an id in a service entry) counts nothing.
    let Some(counters) = COUNTERS.get_value_ptr_mut(service_id / COUNTER_CHUNK, &(service_id % COUNTER_CHUNK)) else {
        return;
    };
    let counters = counters.cast::<[u64; ServiceCounters::FIELDS]>();
    if index < ServiceCounters::FIELDS {
        // SAFETY: this CPU's copy of the value, which is `FIELDS` u64s (asserted in
        // topology-common). Programs on one CPU run one at a time except under preemption, where
        // a lost increment is acceptable for statistics.
        unsafe { (*counters)[index] += 1 };
    }
}

/// Adds one to counter `index` (see `NodeCounters::FIELDS`) of the node on this CPU.
#[inline(always)]
pub fn count_node(index: usize) {
    let Some(counters) = NODE_COUNTERS.get_ptr_mut(0) else {
        return;
    };
    let counters = counters.cast::<[u64; NodeCounters::FIELDS]>();
    if index < NodeCounters::FIELDS {
        // SAFETY: as in `count`.
        unsafe { (*counters)[index] += 1 };
    }
}
