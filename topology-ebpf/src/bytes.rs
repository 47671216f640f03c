//! Cross-zone accounting (see `topology_common::bytes`): the bytes of every TCP connection the
//! connect hooks rewrote, per Service port and backend, read from the client's socket — when it
//! is destroyed (`tp_btf/tcp_destroy_sock`, node-wide: once per TCP socket, never on the connect
//! path) and, for the connections still open, at each sweep of the agent (`iter/tcp`, run in
//! every network namespace). A connection is one of ours by its cookie's entry in the TCP
//! connections table; the first sweep that finds it copies its key into its socket storage,
//! with what it counted, since the table entry goes after about a table of newer sockets.
//!
//! The socket's own counters are read at the offsets the agent found in the kernel's BTF (Rust
//! programs have no CO-RE relocations): `bytes_acked` (sent, and acknowledged by the backend)
//! and `bytes_received`. At destroy, a connection closed in order has every byte acknowledged.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    Global,
    bindings::{BPF_NOEXIST, BPF_SK_STORAGE_GET_F_CREATE},
    helpers::{
        bpf_probe_read_kernel,
        generated::{
            bpf_get_socket_cookie, bpf_map_lookup_elem, bpf_map_update_elem, bpf_sk_storage_get, bpf_skc_to_tcp_sock,
        },
    },
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use topology_common::{ByteCount, IPPROTO_TCP, SockBytes, SockTranslation};

use crate::{
    count::atomic_add,
    iter::IterMeta,
    maps::{self, BYTES, SOCK_BYTES},
};

/// Byte offsets of `bytes_acked` and `bytes_received` in this kernel's `struct tcp_sock`, set by
/// the agent at load (0: not found, the programs are not loaded).
#[unsafe(no_mangle)]
static BYTES_ACKED_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYTES_RECEIVED_OFFSET: Global<u32> = Global::new(0);

/// A TCP socket is destroyed (every one ends here, after its last byte is acknowledged or the
/// connection reset): one of ours counts what it moved since its last sweep.
#[btf_tracepoint(function = "tcp_destroy_sock")]
pub fn bytes_closed(ctx: BtfTracePointContext) -> i32 {
    let sk: *mut c_void = ctx.arg(0);
    let stored = storage(sk, ptr::null_mut(), 0);
    let (key, counted) = if stored.is_null() {
        match ours(sk) {
            Some(key) => (key, ByteCount::default()),
            None => return 0,
        }
    } else {
        // SAFETY: this socket's storage, valid while the program runs; copied out at once.
        unsafe { ((*stored).key, (*stored).counted) }
    };
    if let Some(now) = totals(sk) {
        add(&key, &now.since(&counted));
    }
    0
}

/// `struct bpf_iter__tcp`: each pointer occupies 8 bytes (`__bpf_md_ptr`).
#[repr(C)]
pub struct IterTcp {
    meta: *mut IterMeta,
    sk_common: *mut c_void,
    uid: u32,
}

/// One TCP socket of the namespace the sweep runs in: one of ours counts what it moved since
/// it was last counted. Writes nothing: the sweep reads the counts from the map.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/tcp")]
pub extern "C" fn tcp_bytes(ctx: *mut IterTcp) -> i32 {
    // SAFETY: the kernel passes a valid context; `sk_common` is a typed pointer the verifier
    // checks (NULL once, at the end of the walk).
    let common = unsafe { (*ctx).sk_common };
    if common.is_null() {
        return 0;
    }
    // A full TCP socket only (not one in TIME_WAIT, not a request).
    // SAFETY: the helper takes any socket pointer and returns NULL for anything else.
    let sk = unsafe { bpf_skc_to_tcp_sock(common) }.cast::<c_void>();
    if sk.is_null() {
        return 0;
    }
    let Some(now) = totals(sk) else { return 0 };
    let stored = storage(sk, ptr::null_mut(), 0);
    if stored.is_null() {
        let Some(key) = ours(sk) else { return 0 };
        // Counted from here on through its storage (if the kernel gives it some: otherwise its
        // destroy finds the table entry, or, gone, leaves the rest uncounted).
        let mut first = SockBytes { key, counted: now };
        storage(sk, ptr::from_mut(&mut first).cast(), BPF_SK_STORAGE_GET_F_CREATE.into());
        add(&key, &now);
        return 0;
    }
    // SAFETY: this socket's storage, valid while the program runs. The sweep holds the socket's
    // lock; its destroy reads `counted` after the sweep's write or before it (then both count
    // the bytes in between: at most one sweep's worth of one connection, once).
    unsafe {
        let new = now.since(&(*stored).counted);
        (*stored).counted = now;
        add(&(*stored).key, &new);
    }
    0
}

/// The key of the socket `sk`'s bytes if the connect hooks rewrote it (its table entry is still
/// its own): its translation, flags cleared.
#[inline(always)]
fn ours(sk: *mut c_void) -> Option<SockTranslation> {
    // SAFETY: the helper takes the socket pointer as the kernel passed it.
    let cookie = unsafe { bpf_get_socket_cookie(sk) };
    let (_, translation) = maps::tcp_connection(cookie)?;
    (translation.proto == IPPROTO_TCP).then(|| translation.bytes_key())
}

/// The socket `sk`'s storage in [`SOCK_BYTES`], created from `init` with
/// `BPF_SK_STORAGE_GET_F_CREATE`; null when it has none (or the kernel has no room).
#[inline(always)]
fn storage(sk: *mut c_void, init: *mut c_void, flags: u64) -> *mut SockBytes {
    let map = ptr::from_ref(&SOCK_BYTES).cast_mut().cast::<c_void>();
    // SAFETY: `map` is a socket storage map of this object, `sk` a full socket.
    unsafe { bpf_sk_storage_get(map, sk, init, flags) }.cast()
}

/// The socket `sk`'s totals: bytes acknowledged by the peer, bytes received.
#[inline(always)]
fn totals(sk: *mut c_void) -> Option<ByteCount> {
    let (acked, received) = (BYTES_ACKED_OFFSET.load() as usize, BYTES_RECEIVED_OFFSET.load() as usize);
    if acked == 0 || received == 0 {
        return None;
    }
    let at = |offset: usize| sk.cast::<u8>().wrapping_add(offset).cast::<u64>();
    // SAFETY: reads two u64 fields of the TCP socket the kernel passed, at their offsets.
    let (to_backend, from_backend) =
        unsafe { (bpf_probe_read_kernel(at(acked)).ok()?, bpf_probe_read_kernel(at(received)).ok()?) };
    Some(ByteCount { to_backend, from_backend })
}

/// Adds `bytes` to `key`'s count, made if the map has none (an LRU: it always has room).
#[inline(always)]
fn add(key: &SockTranslation, bytes: &ByteCount) {
    if bytes.to_backend == 0 && bytes.from_backend == 0 {
        return;
    }
    let map = ptr::from_ref(&BYTES).cast_mut().cast::<c_void>();
    let key = ptr::from_ref(key).cast_mut().cast::<c_void>();
    // SAFETY: `map` is a hash map of this object whose key and value types these are.
    let mut count = unsafe { bpf_map_lookup_elem(map, key) }.cast::<ByteCount>();
    if count.is_null() {
        let zero = ByteCount::default();
        // SAFETY: as above. NOEXIST: a CPU that lost the race to create it adds to the winner's.
        unsafe {
            bpf_map_update_elem(map, key, ptr::from_ref(&zero).cast_mut().cast(), BPF_NOEXIST.into());
            count = bpf_map_lookup_elem(map, key).cast::<ByteCount>();
        }
        if count.is_null() {
            return;
        }
    }
    // SAFETY: a map value of this type, 8-byte aligned, valid while the program runs.
    unsafe {
        atomic_add(&raw mut (*count).to_backend, bytes.to_backend);
        atomic_add(&raw mut (*count).from_backend, bytes.from_backend);
    }
}
