//! Whether a connection to a service port is rewritten at all: not once the agent's heartbeat has
//! lapsed (fail open to kube-proxy), not for the agent's own sockets to services it must reach
//! whatever its maps say (the API server), and not to the node-local DNS responder once its own
//! heartbeat has lapsed (DNS fails open to the cluster DNS).

use aya_ebpf::helpers::generated::{bpf_get_current_cgroup_id, bpf_ktime_get_coarse_ns};
use topology_common::{NodeCounters, ServiceOptions, service_flags};

use crate::{
    count::count_node,
    maps::{DNS_BEAT, HEARTBEAT, SERVICE_OPTIONS, agent_cgroup},
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

/// Decides whether a connection to the service `service_id` is rewritten.
#[inline(always)]
pub fn admit(service_id: u32, clock: &mut Clock) -> Gate {
    // SAFETY: index 0 of a one-entry array; the value is copied out at once.
    let deadline = HEARTBEAT.get_ptr(0).map_or(0, |beat| unsafe { (*beat).deadline_ns });
    if deadline != u64::MAX && clock.now() > deadline {
        count_node(NodeCounters::FAIL_OPEN);
        return Gate::Pass;
    }
    // SAFETY: an array element, copied out at once; ids beyond the array have no options.
    let options = SERVICE_OPTIONS.get_ptr(service_id).map_or(ServiceOptions::default(), |o| unsafe { *o });
    if options.flags & service_flags::AGENT_EXEMPT != 0 {
        let agent = agent_cgroup();
        // SAFETY: no arguments; the cgroup v2 id of the calling task.
        if agent != 0 && unsafe { bpf_get_current_cgroup_id() } == agent {
            count_node(NodeCounters::AGENT_EXEMPT);
            return Gate::Pass;
        }
    }
    if options.flags & service_flags::LOCAL_DNS != 0 {
        // SAFETY: as for the agent's heartbeat.
        let deadline = DNS_BEAT.get_ptr(0).map_or(0, |beat| unsafe { (*beat).deadline_ns });
        if clock.now() > deadline {
            return Gate::Pass;
        }
    }
    Gate::Rewrite(options)
}
