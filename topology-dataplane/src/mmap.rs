//! A BPF array created with `BPF_F_MMAPABLE`, mapped into the agent: positions are read and
//! written as plain memory the programs share, without a system call, and with exactly the store
//! ordering the index protocol needs (see `topology_common::index`).

use std::{
    marker::PhantomData,
    os::fd::{AsFd as _, AsRawFd as _},
    ptr::NonNull,
    sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering, fence},
};

use aya::{Pod, maps::MapData};

use super::error::DataplaneError;

/// `BPF_F_MMAPABLE` from `linux/bpf.h`.
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// An mmapped array map of `T`, whose first byte is a sequence number (`seq`).
pub struct MappedArray<T> {
    base: NonNull<u8>,
    len: u32,
    bytes: usize,
    // The map stays open as long as it is mapped (the mapping alone would keep it too).
    _map: MapData,
    _value: PhantomData<T>,
}

// SAFETY: the mapping is plain shared memory owned by this value; all access goes through
// `&self`/`&mut self` methods that use atomic or volatile operations.
unsafe impl<T: Send> Send for MappedArray<T> {}
// SAFETY: as above; concurrent readers only perform volatile reads.
unsafe impl<T: Sync> Sync for MappedArray<T> {}

impl<T: Pod> MappedArray<T> {
    /// Maps `map`, which must be an mmapable array of `T` (8-byte aligned, a multiple of 8 bytes).
    pub fn new(map: MapData, name: &'static str) -> Result<Self, DataplaneError> {
        const { assert!(size_of::<T>().is_multiple_of(8) && align_of::<T>() >= 8) };
        let info = map.info().map_err(DataplaneError::map(name))?;
        if info.value_size() as usize != size_of::<T>() || info.map_flags() & BPF_F_MMAPABLE == 0 {
            return Err(DataplaneError::NotMappable { map: name });
        }
        let len = info.max_entries();
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let bytes = (len as usize * size_of::<T>()).div_ceil(page) * page;
        // SAFETY: a shared read-write mapping of the map's value area, which the kernel sizes to
        // `max_entries * value_size` rounded up to pages; the map's descriptor is valid here.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(DataplaneError::Mmap { map: name, source: std::io::Error::last_os_error() });
        }
        let base = NonNull::new(base.cast::<u8>()).ok_or(DataplaneError::NotMappable { map: name })?;
        Ok(Self { base, len, bytes, _map: map, _value: PhantomData })
    }

    /// Number of positions.
    pub fn len(&self) -> u32 {
        self.len
    }

    fn at(&self, position: u32) -> *mut u8 {
        assert!(position < self.len, "position {position} beyond {}", self.len);
        // SAFETY: in bounds of the mapping, checked above.
        unsafe { self.base.as_ptr().add(position as usize * size_of::<T>()) }
    }

    /// The value at `position` (a volatile copy).
    pub fn read(&self, position: u32) -> T {
        // SAFETY: in bounds and aligned (the mapping is page aligned, `T` a multiple of 8 bytes).
        unsafe { std::ptr::read_volatile(self.at(position).cast::<T>()) }
    }

    /// Stores `seq`: with `Release`, every earlier store is visible before it.
    pub fn store_seq(&mut self, position: u32, seq: u8, ordering: Ordering) {
        // SAFETY: byte 0 of an in-bounds value; shared with the programs, hence atomic.
        unsafe { AtomicU8::from_ptr(self.at(position)) }.store(seq, ordering);
    }

    /// Writes every byte of `value` but the first (`seq`), after a release fence, so none of
    /// them becomes visible before a `seq` stored earlier.
    pub fn store_body(&mut self, position: u32, value: &T) {
        fence(Ordering::Release);
        let dst = self.at(position);
        let src = std::ptr::from_ref(value).cast::<u8>();
        // SAFETY: `src` is a `T` (Pod, so every byte is initialised) and `dst` an in-bounds,
        // 8-aligned `T`; each store has its natural alignment: byte 1, bytes 2..4, 4..8, then words.
        unsafe {
            AtomicU8::from_ptr(dst.add(1)).store(*src.add(1), Ordering::Relaxed);
            AtomicU16::from_ptr(dst.add(2).cast()).store(src.add(2).cast::<u16>().read_unaligned(), Ordering::Relaxed);
            AtomicU32::from_ptr(dst.add(4).cast()).store(src.add(4).cast::<u32>().read_unaligned(), Ordering::Relaxed);
            for offset in (8..size_of::<T>()).step_by(8) {
                let word = src.add(offset).cast::<u64>().read_unaligned();
                AtomicU64::from_ptr(dst.add(offset).cast()).store(word, Ordering::Relaxed);
            }
        }
    }
}

impl<T> Drop for MappedArray<T> {
    fn drop(&mut self) {
        // SAFETY: exactly the region mapped in `new`, not used after this.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.bytes) };
    }
}
