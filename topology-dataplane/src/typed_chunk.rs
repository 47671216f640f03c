//! A counters chunk created with BTF types, as the programs' loader creates the outer map's
//! template.
//!
//! An `ARRAY_OF_MAPS` takes an inner map only if it matches the template the outer map was
//! created with. Linux before 6.2 compares the maps' `timer_off` too, which is `-ENOENT` for a map
//! created with BTF types (no timer found in the value) and `-EINVAL` for one created without: a
//! chunk made without BTF is refused (EINVAL) by 6.1's outer map, so no chunk could be set and no
//! grace period waited for — nothing was ever programmed. Found by the kernel matrix (`cargo xtask
//! test --kernels`). A minimal BTF of our own (a 32-bit key; the value a struct of one array of
//! 32-bit words — 6.1 refuses a value type that is not a struct) gives every kernel the same
//! answer.

use std::{
    io,
    os::fd::{FromRawFd as _, OwnedFd},
};

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_BTF_LOAD: libc::c_long = 18;
const BTF_KIND_INT: u32 = 1;
const BTF_KIND_ARRAY: u32 = 3;
const BTF_KIND_STRUCT: u32 = 4;

/// `union bpf_attr` for `BPF_BTF_LOAD`, every byte a field: the kernel refuses nonzero bytes past
/// the fields it knows (6.1 ends at `log_level`), and padding is not guaranteed zero.
#[repr(C)]
#[derive(Default)]
struct BtfLoadAttr {
    btf: u64,
    log_buf: u64,
    btf_size: u32,
    log_size: u32,
    log_level: u32,
    /// `btf_log_true_size` since 6.4 (written by the kernel); zero.
    log_true_size: u32,
}
const _: () = assert!(size_of::<BtfLoadAttr>() == 32);

/// `union bpf_attr` for `BPF_MAP_CREATE`, up to `btf_vmlinux_value_type_id`.
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
    btf_vmlinux_value_type_id: u32,
}
const _: () = assert!(size_of::<MapCreateAttr>() == 64);

/// Type ids in [`btf`].
const KEY_TYPE: u32 = 1;
const WORDS_TYPE: u32 = 2;
const VALUE_TYPE: u32 = 3;

/// A BTF blob of three types: [1] `u32`, a 32-bit unsigned int; [2] an array of `words` of them;
/// [3] `struct counters { u32 words[words]; }`.
fn btf(words: u32) -> Vec<u8> {
    // Names at offsets 1 ("u32"), 5 ("counters") and 14 ("words").
    let strings = b"\0u32\0counters\0words\0";
    let mut types = Vec::new();
    // [1] INT "u32": name, info (kind), size, then encoding/offset/bits.
    // [2] ARRAY: no name, info, size 0, then element type, index type, count.
    // [3] STRUCT "counters", one member: name, info (kind, vlen 1), size, then the member's name,
    //     type and bit offset.
    for word in [
        [1, BTF_KIND_INT << 24, 4, 32].as_slice(),
        &[0, BTF_KIND_ARRAY << 24, 0, KEY_TYPE, KEY_TYPE, words],
        &[5, BTF_KIND_STRUCT << 24 | 1, words * 4, 14, WORDS_TYPE, 0],
    ]
    .concat()
    {
        types.extend_from_slice(&u32::to_le_bytes(word));
    }
    let mut blob = Vec::new();
    blob.extend_from_slice(&0xEB9F_u16.to_le_bytes()); // magic
    blob.extend_from_slice(&[1, 0]); // version, flags
    for word in [24, 0, types.len() as u32, types.len() as u32, strings.len() as u32] {
        blob.extend_from_slice(&u32::to_le_bytes(word)); // hdr_len, type_off/len, str_off/len
    }
    blob.extend_from_slice(&types);
    blob.extend_from_slice(strings);
    blob
}

fn bpf<T>(command: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    // SAFETY: `attr` is a valid, fully initialised `bpf_attr` prefix for `command`, alive for the
    // call; the pointers it holds point at live buffers of the sizes it gives.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, command, attr as *mut T, size_of::<T>() as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a non-negative return of these commands is a new descriptor that we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// A new map of `map_type` with 32-bit keys, `value_size`-byte values (a multiple of 4) and
/// `max_entries`, named `name`, its key and value typed in BTF.
pub fn create(map_type: u32, value_size: u32, max_entries: u32, name: &str) -> io::Result<OwnedFd> {
    assert!(value_size.is_multiple_of(4), "values are arrays of 32-bit words");
    let blob = btf(value_size / 4);
    let mut log = vec![0u8; 4096];
    let mut load = BtfLoadAttr {
        btf: blob.as_ptr() as u64,
        btf_size: blob.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        log_size: log.len() as u32,
        log_level: 1,
        log_true_size: 0,
    };
    let btf = bpf(BPF_BTF_LOAD, &mut load).map_err(|error| {
        let said = String::from_utf8_lossy(log.split(|b| *b == 0).next().unwrap_or_default()).trim().to_owned();
        io::Error::new(error.kind(), format!("BPF_BTF_LOAD: {error}: {said}"))
    })?;
    let mut map_name = [0u8; 16];
    for (to, from) in map_name.iter_mut().zip(name.bytes().take(15)) {
        *to = from;
    }
    let mut create = MapCreateAttr {
        map_type,
        key_size: 4,
        value_size,
        max_entries,
        map_name,
        btf_fd: std::os::fd::AsRawFd::as_raw_fd(&btf) as u32,
        btf_key_type_id: KEY_TYPE,
        btf_value_type_id: VALUE_TYPE,
        ..MapCreateAttr::default()
    };
    bpf(BPF_MAP_CREATE, &mut create).map_err(|error| io::Error::new(error.kind(), format!("BPF_MAP_CREATE: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_blob_is_a_header_three_types_and_their_names() {
        let blob = btf(12);
        let strings = b"\0u32\0counters\0words\0";
        assert_eq!(blob.len(), 24 + 16 + 24 + 24 + strings.len());
        assert_eq!(&blob[..4], &[0x9F, 0xEB, 1, 0]);
        let word = |at: usize| u32::from_le_bytes(blob[24 + at * 4..24 + at * 4 + 4].try_into().unwrap());
        assert_eq!((word(9), word(12)), (12, 48), "the array's count, the struct's size");
        assert_eq!(&strings[word(10) as usize..][..9], b"counters\0");
        assert_eq!(&strings[word(13) as usize..][..6], b"words\0");
        assert_eq!(&blob[blob.len() - strings.len()..], strings);
    }
}
