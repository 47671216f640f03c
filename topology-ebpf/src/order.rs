//! Loads of the service index, in program order on every CPU (see `topology_common::index`).
//!
//! The standard object reads with volatile loads: the compiler keeps their order and the JIT
//! emits them as written, which x86-64's TSO keeps in order at run time. The object built with
//! the `acquire` feature (ISA v4, for weakly ordered CPUs on kernels with BPF load-acquire) makes
//! each load a load-acquire, so no later load can be satisfied before it.

#[cfg(feature = "acquire")]
use core::intrinsics::{AtomicOrdering, atomic_load};
#[cfg(not(feature = "acquire"))]
use core::ptr::read_volatile;

/// Reads a byte of the index.
///
/// # Safety
/// `src` must be valid for reads.
#[inline(always)]
pub unsafe fn load_u8(src: *const u8) -> u8 {
    // SAFETY: the caller guarantees `src` is readable.
    #[cfg(feature = "acquire")]
    unsafe {
        atomic_load::<u8, { AtomicOrdering::Acquire }>(src)
    }
    // SAFETY: as above.
    #[cfg(not(feature = "acquire"))]
    unsafe {
        read_volatile(src)
    }
}

/// Reads a 32-bit word of the index.
///
/// # Safety
/// `src` must be valid for reads and 4-byte aligned.
#[inline(always)]
pub unsafe fn load_u32(src: *const u32) -> u32 {
    // SAFETY: the caller guarantees `src` is readable and aligned.
    #[cfg(feature = "acquire")]
    unsafe {
        atomic_load::<u32, { AtomicOrdering::Acquire }>(src)
    }
    // SAFETY: as above.
    #[cfg(not(feature = "acquire"))]
    unsafe {
        read_volatile(src)
    }
}

/// Reads a 64-bit word of the index.
///
/// # Safety
/// `src` must be valid for reads and 8-byte aligned.
#[inline(always)]
pub unsafe fn load_u64(src: *const u64) -> u64 {
    // SAFETY: the caller guarantees `src` is readable and aligned.
    #[cfg(feature = "acquire")]
    unsafe {
        atomic_load::<u64, { AtomicOrdering::Acquire }>(src)
    }
    // SAFETY: as above.
    #[cfg(not(feature = "acquire"))]
    unsafe {
        read_volatile(src)
    }
}
