//! `BPF_MAP_UPDATE_BATCH` and `BPF_MAP_LOOKUP_BATCH`: many entries of one map in one system call
//! (Linux 5.6+). aya has no binding for them, so the commands' attribute is spelled here.
//!
//! The kernel applies the entries in order and stops at the first it cannot. Callers redo a refused
//! batch entry by entry (each write is idempotent), so an error is charged to the entry it belongs
//! to; a kernel without the command (`EINVAL`, `ENOTSUPP`) gets the same.

use std::{
    io,
    os::fd::{AsFd as _, AsRawFd as _, BorrowedFd},
};

use aya::{Pod, maps::MapData};

/// `BPF_MAP_LOOKUP_BATCH` from `linux/bpf.h`.
const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;
/// `BPF_MAP_UPDATE_BATCH` from `linux/bpf.h`.
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;

/// The `batch` member of `union bpf_attr` (`linux/bpf.h`).
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}
const _: () = assert!(size_of::<BatchAttr>() == 56);

/// Most entries per system call: the kernel copies one entry at a time, so this only bounds how
/// long one call runs without a signal being seen.
const CHUNK: usize = 8192;

/// Writes `keys[i] → values[i]` for every `i` into `map` (`BPF_ANY`), in order.
pub fn update<K: Pod, V: Pod>(map: &MapData, keys: &[K], values: &[V]) -> io::Result<()> {
    update_fd(map.fd().as_fd(), keys, values)
}

/// [`update`] on the map behind `map` (a map aya keeps its `MapData` of to itself: the values of
/// a map of maps are the inner maps' descriptors, as `u32`).
pub fn update_fd<K: Pod, V: Pod>(map: BorrowedFd<'_>, keys: &[K], values: &[V]) -> io::Result<()> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    let fd = map.as_raw_fd() as u32;
    for (keys, values) in keys.chunks(CHUNK).zip(values.chunks(CHUNK)) {
        let mut attr = BatchAttr {
            keys: keys.as_ptr() as u64,
            values: values.as_ptr() as u64,
            count: keys.len() as u32,
            map_fd: fd,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is a valid `bpf_attr` prefix for the command; `keys` and `values` hold
        // `count` Pod entries each, of the map's key and value sizes (the caller's types), alive
        // for the call; the kernel writes back only `count`.
        let result = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_BATCH, &raw mut attr, size_of::<BatchAttr>() as libc::c_uint)
        };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Entries `start..start + count` of the array `map` (fewer if the array ends first), in
/// order, a few system calls for all of them.
pub fn lookup_array<V: Pod + Default>(map: &MapData, start: u32, count: u32) -> io::Result<Vec<V>> {
    let fd = map.fd().as_fd().as_raw_fd() as u32;
    let mut out: Vec<V> = Vec::with_capacity(count as usize);
    while (out.len() as u32) < count {
        let next = start + out.len() as u32;
        let wanted = (count as usize - out.len()).min(CHUNK);
        let mut keys = vec![0u32; wanted];
        let mut values = vec![V::default(); wanted];
        // The kernel starts after the key `in_batch` points at, or at the first without one.
        let previous = next.wrapping_sub(1);
        let mut token = 0u32;
        let mut attr = BatchAttr {
            in_batch: if next == 0 { 0 } else { (&raw const previous) as u64 },
            out_batch: (&raw mut token) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: wanted as u32,
            map_fd: fd,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is a valid `bpf_attr` prefix for the command; `keys` and `values` have
        // room for `count` entries of the array's key (u32) and value (`V`, the caller's type,
        // Pod) sizes; `in_batch` and `out_batch` point at u32 keys alive for the call.
        let result = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, &raw mut attr, size_of::<BatchAttr>() as libc::c_uint)
        };
        let got = attr.count as usize;
        if result < 0 {
            let error = io::Error::last_os_error();
            // ENOENT: the array ended; `count` says how many were copied before.
            if error.raw_os_error() != Some(libc::ENOENT) {
                return Err(error);
            }
        }
        values.truncate(got.min(wanted));
        out.extend(values);
        if got < wanted {
            break;
        }
    }
    Ok(out)
}

/// Every entry of the hash `map`, in the kernel's bucket order, a few system calls for all of
/// them. The map must not change meanwhile (an entry moved between buckets could be missed or seen
/// twice); an error means the caller iterates entry by entry instead.
pub fn lookup_hash<K: Pod + Default, V: Pod + Default>(map: &MapData) -> io::Result<Vec<(K, V)>> {
    let fd = map.fd().as_fd().as_raw_fd() as u32;
    let mut out = Vec::new();
    // The hash map's position is a bucket number (a u32); the tokens have room to spare.
    let (mut position, mut next) = (0u64, 0u64);
    let mut started = false;
    let mut chunk = CHUNK;
    loop {
        let mut keys = vec![K::default(); chunk];
        let mut values = vec![V::default(); chunk];
        let mut attr = BatchAttr {
            in_batch: if started { (&raw const position) as u64 } else { 0 },
            out_batch: (&raw mut next) as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk as u32,
            map_fd: fd,
            ..BatchAttr::default()
        };
        // SAFETY: `attr` is a valid `bpf_attr` prefix for the command; `keys` and `values` have
        // room for `count` entries of the map's key and value sizes (the caller's Pod types);
        // `in_batch` and `out_batch` point at tokens larger than the kernel's, alive for the call.
        let result = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_LOOKUP_BATCH, &raw mut attr, size_of::<BatchAttr>() as libc::c_uint)
        };
        let got = (attr.count as usize).min(chunk);
        let ended = if result < 0 {
            let error = io::Error::last_os_error();
            match error.raw_os_error() {
                // The map ended; `count` says how many were copied before.
                Some(libc::ENOENT) => true,
                // One bucket holds more entries than asked for: ask for more.
                Some(libc::ENOSPC) if got == 0 && chunk < 1 << 20 => {
                    chunk *= 2;
                    continue;
                }
                _ => return Err(error),
            }
        } else {
            false
        };
        out.extend(keys.into_iter().zip(values).take(got));
        if ended {
            return Ok(out);
        }
        position = next;
        started = true;
    }
}
