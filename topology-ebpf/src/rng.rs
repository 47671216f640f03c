//! The programs' random numbers: SplitMix64 over a per-CPU state.
//!
//! `bpf_get_prandom_u32` is a helper call, and every call and return on the connect path costs
//! more than the arithmetic it saves (retpolines and return thunks on mitigated CPUs). The state
//! lives in a per-CPU array, whose lookup the verifier inlines, and is seeded from the kernel's
//! generator the first time a CPU draws. Two programs on one CPU may draw the same number when one
//! preempts the other between the read and the write of the state; for load balancing that is as
//! good as two independent draws.

use aya_ebpf::helpers::generated::bpf_get_prandom_u32;

use crate::maps::RNG;

/// SplitMix64's increment (the golden ratio as a 64-bit fraction).
const GAMMA: u64 = 0x9E37_79B9_7F4A_7C15;

/// A uniformly random `u64`.
#[inline(always)]
pub fn random() -> u64 {
    let Some(state) = RNG.get_ptr_mut(0) else {
        // Unreachable: index 0 of a one-entry array.
        return (u64::from(kernel_random()) << 32) | u64::from(kernel_random());
    };
    // SAFETY: this CPU's copy of the value, valid for the program's lifetime.
    let state = unsafe { &mut *state };
    let mut seed = *state;
    if seed == 0 {
        seed = (u64::from(kernel_random()) << 32) | u64::from(kernel_random());
    }
    seed = seed.wrapping_add(GAMMA);
    *state = seed;
    mix(seed)
}

/// SplitMix64's output function (Stafford's variant 13).
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[inline(always)]
fn kernel_random() -> u32 {
    // SAFETY: no arguments, no side effects beyond the kernel's PRNG state.
    unsafe { bpf_get_prandom_u32() }
}
