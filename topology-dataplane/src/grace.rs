//! Waiting until no program can still use what it read before a map update.
//!
//! The socket programs run inside an RCU read-side critical section (`bpf_prog_run_array_cg`
//! holds `rcu_read_lock()` around them), so once an RCU grace period has passed after a service
//! entry was replaced, no program holds the old entry any more and its slots may be rewritten.
//!
//! The kernel's documented way for userspace to wait for one is an update of a map-in-map: after
//! `BPF_MAP_UPDATE_ELEM` on an `ARRAY_OF_MAPS` succeeds, the kernel has called `synchronize_rcu()`
//! so that "userspace, when we return to it, knows that all non-sleepable programs that could be
//! running use the new map value" (`maybe_wait_bpf_programs`, kernel/bpf/syscall.c). Unlike
//! `membarrier(MEMBARRIER_CMD_GLOBAL)`, which returns at once on a one-CPU machine even when a
//! preempted program is mid-run (preemptible RCU), this is a real grace period on every
//! configuration. The writer rewrites an entry of the counters map with the same inner map.

use super::error::DataplaneError;

/// Something that can wait for an RCU grace period.
pub trait Grace {
    /// Returns once every program that started before the call has finished; an error means
    /// no grace period was waited for, and nothing that needs one may be reused.
    fn wait(&mut self) -> Result<(), DataplaneError>;
}
