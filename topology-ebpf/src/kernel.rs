//! Reading a kernel object the verifier knows the type of (a traced or iterated socket) at an
//! offset the agent found in the kernel's BTF: Rust programs have no CO-RE relocations.

use core::{ffi::c_void, ptr};

/// The field at `offset` of the kernel object `base` points to: a plain load, which the verifier
/// checks against the object's BTF type (the offsets are constants of the frozen `.rodata`).
///
/// # Safety
/// `base` is a pointer the kernel typed (a traced or iterated socket) and `offset` the offset
/// of a `T` field in its type.
#[inline(always)]
pub unsafe fn field<T: Copy>(base: *mut c_void, offset: usize) -> T {
    // SAFETY: as the caller promises.
    unsafe { ptr::read_volatile(base.cast::<u8>().add(offset).cast::<T>()) }
}
