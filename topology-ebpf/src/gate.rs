//! Whether a connection to a service port is rewritten at all: not once the agent's heartbeat has
//! lapsed (fail open to kube-proxy), not for the agent's own sockets to services it must reach
//! whatever its maps say (the API server), and not to the node-local DNS responder unless its own
//! heartbeat is fresh and names the backend chosen (DNS fails open to the cluster DNS).

use aya_ebpf::helpers::generated::bpf_ktime_get_coarse_ns;
use topology_common::{NodeCounters, ServiceOptions, ServiceValue, service_flags};

use crate::{
    count::count_node,
    maps::{DNS_STEER, HEARTBEAT, SERVICE_OPTIONS, SLOTS},
    sockaddr::words,
};

/// `CLOCK_MONOTONIC_COARSE`, read at most once per program run.
pub struct Clock {
    now: u64,
}

impl Clock {
    /// A clock not read yet.
    #[inline(always)]
    pub fn new() -> Self {
        Self { now: 0 }
    }

    /// Nanoseconds of `CLOCK_MONOTONIC_COARSE` (the same value for the whole run).
    #[inline(always)]
    pub fn now(&mut self) -> u64 {
        if self.now == 0 {
            // SAFETY: no arguments; reads the coarse monotonic clock.
            self.now = unsafe { bpf_ktime_get_coarse_ns() };
        }
        self.now
    }
}

/// What to do with a connection to a service port.
pub enum Gate {
    /// Rewrite it, with the service's options.
    Rewrite(ServiceOptions),
    /// Let it through untouched (counted in the node counters).
    Pass,
}

/// Decides whether a connection to `service` is rewritten.
#[inline(always)]
pub fn admit(service: &ServiceValue, clock: &mut Clock) -> Gate {
    // SAFETY: index 0 of a one-entry array; the value is copied out at once.
    let deadline = HEARTBEAT.get_ptr(0).map_or(0, |beat| unsafe { (*beat).deadline_ns });
    if deadline != u64::MAX && clock.now() > deadline {
        count_node(NodeCounters::FAIL_OPEN);
        return Gate::Pass;
    }
    // SAFETY: an array element, copied out at once; ids beyond the array have no options.
    let options = SERVICE_OPTIONS.get_ptr(service.service_id).map_or(ServiceOptions::default(), |o| unsafe { *o });
    if options.flags & service_flags::LOCAL_DNS != 0 && !steered_here(service, clock) {
        return Gate::Pass;
    }
    Gate::Rewrite(options)
}

/// Whether a port steered to the node-local DNS responder goes there now: only while the
/// responder's heartbeat is fresh and names the one backend of the port's set (an entry a previous
/// agent left names its own responder, which may be gone).
#[inline(always)]
fn steered_here(service: &ServiceValue, clock: &mut Clock) -> bool {
    let Some(beat) = DNS_STEER.get_ptr(0) else {
        return false;
    };
    // SAFETY: index 0 of a one-entry array; the value is copied out at once.
    let beat = unsafe { *beat };
    if clock.now() > beat.deadline_ns || service.count != 1 {
        return false;
    }
    let Some(slot) = SLOTS.get_ptr(service.base) else {
        return false;
    };
    // SAFETY: an array element for the program's lifetime; the fields are read at once.
    let slot = unsafe { &*slot };
    slot.set_id == service.set_id && slot.primary.port == beat.port && words(&slot.primary.addr) == words(&beat.addr)
}
