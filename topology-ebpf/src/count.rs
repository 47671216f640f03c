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

/// Adds `value` to the u64 at `counter` atomically: a counter every CPU adds to.
#[inline(always)]
pub fn atomic_add(counter: *mut u64, value: u64) {
    // The BPF target has atomic adds but no compare-and-swap, so `AtomicU64` has no `fetch_add`
    // there; the intrinsic is the same instruction (`lock xadd`, its result unused).
    // SAFETY: the caller passes an 8-byte aligned u64 of a map value, valid while the program
    // runs, that every writer adds to atomically.
    #[cfg(target_arch = "bpf")]
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(counter, value)
    };
    // SAFETY: as above (the host build only type-checks the programs).
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(counter).fetch_add(value, core::sync::atomic::Ordering::Relaxed)
    };
}

/// Adds one to the u32 at `counter` atomically and reads it back: the count after this CPU's
/// add and any other's that landed before the read.
#[inline(always)]
pub fn atomic_increment(counter: *mut u32) -> u32 {
    // As in `atomic_add`: the BPF v1 target's `lock xadd` (32-bit), its result unused, then a read.
    // SAFETY: the caller passes a 4-byte aligned u32 of a map value, valid while the program runs,
    // that every writer adds to atomically (or sets, where a race loses nothing it needs).
    #[cfg(target_arch = "bpf")]
    unsafe {
        core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(counter, 1)
    };
    // SAFETY: as above (the host build only type-checks the programs).
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        core::sync::atomic::AtomicU32::from_ptr(counter).fetch_add(1, core::sync::atomic::Ordering::Relaxed)
    };
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(counter) }
}
