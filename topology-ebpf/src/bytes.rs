//! Cross-zone accounting (see `topology_common::bytes`): the bytes of every TCP connection the
//! connect hooks rewrote, per Service port and backend, read from the client's socket — when it
//! is destroyed (`tp_btf/tcp_destroy_sock`, [`crate::closed`]: once per TCP socket, never on the
//! connect path) and, for the connections still open, at each sweep of the agent (`iter/tcp`, run in
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
    helpers::generated::{
        bpf_map_lookup_elem, bpf_map_update_elem, bpf_seq_write, bpf_sk_storage_get, bpf_skc_to_tcp_sock,
    },
};
use topology_common::{ByteCount, IPPROTO_TCP, SockBytes, SockTranslation};

use crate::{
    count::atomic_add,
    iter::IterMeta,
    kernel::field,
    maps::{self, BYTES, SOCK_BYTES},
    peer,
};

/// Byte offsets of `bytes_acked` and `bytes_received` in this kernel's `struct tcp_sock`, and of
/// `sk_cookie` in its `struct sock`, set by the agent at load (0: not found, the programs are not
/// loaded).
#[unsafe(no_mangle)]
static BYTES_ACKED_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static BYTES_RECEIVED_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
pub(crate) static SK_COOKIE_OFFSET: Global<u32> = Global::new(0);

/// 1 when TCP connections' bytes are counted (`--byte-accounting tcp` or `all`), set at load.
#[unsafe(no_mangle)]
static TCP_BYTES: Global<u32> = Global::new(0);

/// Whether TCP connections' bytes are counted.
#[inline(always)]
pub fn on() -> bool {
    TCP_BYTES.load() != 0
}

/// The TCP socket `sk` (cookie `cookie`) is destroyed (every one ends there, after its last byte
/// is acknowledged or the connection reset): one of ours counts what it moved since its last
/// sweep.
#[inline(never)]
pub fn closed(sk: *mut c_void, cookie: u64) {
    let (key, counted) = match find(sk, cookie) {
        None => return,
        Some(Found::New(key)) => (key, ByteCount::default()),
        // SAFETY: this socket's storage, valid while the program runs; copied out at once.
        Some(Found::Swept(stored)) => unsafe { ((*stored).key, (*stored).counted) },
    };
    if let Some(now) = totals(sk) {
        add(&key, &now.since(&counted));
    }
}

/// The cookie of the TCP socket `sk`, read, not asked for: a socket that never had one (most of a
/// node's: the connect hooks take the cookie of every socket they rewrite) is not ours, and
/// leaves after that one read.
#[inline(always)]
pub fn cookie(sk: *mut c_void) -> Option<u64> {
    let offset = SK_COOKIE_OFFSET.load() as usize;
    if offset == 0 {
        return None;
    }
    // SAFETY: the cookie of the TCP socket the kernel passed, at its offset.
    let cookie: u64 = unsafe { field(sk, offset) };
    (cookie != 0).then_some(cookie)
}

/// `struct bpf_iter__tcp`: each pointer occupies 8 bytes (`__bpf_md_ptr`).
#[repr(C)]
pub struct IterTcp {
    meta: *mut IterMeta,
    sk_common: *mut c_void,
    uid: u32,
}

/// One TCP socket of the namespace the sweep runs in: one of ours counts what it moved since
/// it was last counted, and writes one byte, so the sweep learns how many of ours the namespace
/// holds (it reads the counts from the map).
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
    let Some(found) = cookie(sk).and_then(|cookie| find(sk, cookie)) else {
        return 0;
    };
    // SAFETY: the context's meta is a typed pointer the verifier checks; one byte of the stack.
    unsafe {
        let meta = (*ctx).meta;
        if !meta.is_null() {
            let mut one = 1u8;
            bpf_seq_write(IterMeta::seq(meta).cast(), ptr::from_mut(&mut one).cast(), 1);
        }
    }
    let stored = match found {
        Found::Swept(stored) => stored,
        Found::New(key) => {
            let Some(now) = totals(sk) else { return 0 };
            // Counted from here on through its storage. If the kernel has no room for it, nothing
            // is counted now: its destroy counts it whole if its table entry is still its own.
            let mut first = SockBytes { key, counted: now };
            if !storage(sk, ptr::from_mut(&mut first).cast(), BPF_SK_STORAGE_GET_F_CREATE.into()).is_null() {
                add(&key, &now);
            }
            return 0;
        }
    };
    let Some(now) = totals(sk) else { return 0 };
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

/// A socket of ours, as the programs know it.
enum Found {
    /// A sweep counted it before: its storage, with its key and what was counted.
    Swept(*mut SockBytes),
    /// Not counted yet: its key (its translation, flags cleared), from its table entry.
    New(SockTranslation),
}

/// What the programs know of the socket `sk` (cookie `cookie`), if the connect hooks rewrote it.
#[inline(always)]
fn find(sk: *mut c_void, cookie: u64) -> Option<Found> {
    let stored = storage(sk, ptr::null_mut(), 0);
    if !stored.is_null() {
        return Some(Found::Swept(stored));
    }
    let (_, translation) = maps::tcp_connection(cookie)?;
    // A socket whose rewritten connect failed and that connected elsewhere keeps its entry.
    (translation.proto == IPPROTO_TCP && peer::is_backend(sk, &translation))
        .then(|| Found::New(translation.bytes_key()))
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
pub(crate) fn totals(sk: *mut c_void) -> Option<ByteCount> {
    let (acked, received) = (BYTES_ACKED_OFFSET.load() as usize, BYTES_RECEIVED_OFFSET.load() as usize);
    if acked == 0 || received == 0 {
        return None;
    }
    // SAFETY: two u64 fields of the TCP socket the kernel passed, at their offsets.
    Some(unsafe { ByteCount { to_backend: field(sk, acked), from_backend: field(sk, received) } })
}

/// Adds `bytes` to `key`'s count, made if the map has none (an LRU: it always has room).
#[inline(always)]
pub(crate) fn add(key: &SockTranslation, bytes: &ByteCount) {
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
