//! Passive outlier ejection (see `topology_common::outlier`): the tracing programs that count
//! each backend's failed handshakes and eject it, and the connect hooks' part — avoiding an
//! ejected backend and counting the connections sent to a failing one.
//!
//! The tracing programs run where a handshake can fail, never on one that succeeds: a reset
//! received, a segment retransmitted, an error reported on a socket, node-wide. Each leaves at
//! once unless the socket is in `SYN_SENT` (read at the offset the agent found in the kernel's
//! BTF), the connect hooks rewrote it (its cookie's entry in the TCP connections table), and it
//! is still connecting to the backend they chose.

use core::{
    ffi::c_void,
    ptr::{self, read_volatile, write_volatile},
};

use aya_ebpf::{
    Global,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_probe_read_kernel,
        generated::{
            bpf_get_socket_cookie, bpf_ktime_get_coarse_ns, bpf_ktime_get_ns, bpf_map_lookup_elem, bpf_map_update_elem,
        },
    },
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use topology_common::{
    AF_INET, Backend, BackendKey, IPPROTO_TCP, OutlierEntry, OutlierScan, SockTranslation, TcpTranslation,
    outlier::{REDRAWS, Tuning, bucket_of, bucket_of_words},
};

use crate::{
    choose::{self, Pick},
    count, lookup,
    maps::{self, OUTLIER_SCAN, OUTLIER_STATE, OUTLIERS, SERVICE_OPTIONS, SLOTS},
    peer, sockaddr,
};

/// `TCP_SYN_SENT`, as `sock_common.skc_state` holds it.
const TCP_SYN_SENT: u8 = 2;

/// Byte offset of `skc_state` in the kernel's `struct sock` (through `struct sock_common`), set
/// by the agent at load from the kernel's BTF.
#[unsafe(no_mangle)]
static SKC_STATE_OFFSET: Global<u32> = Global::new(18);

/// A reset received: in `SYN_SENT`, the handshake was refused; after it, a measured connection
/// is marked reset for the load signal.
#[btf_tracepoint(function = "tcp_receive_reset")]
pub fn outlier_reset(ctx: BtfTracePointContext) -> i32 {
    let sk = ctx.arg(0);
    if !handshake_failed(sk) {
        reset(sk);
    }
    0
}

/// A segment retransmitted: in `SYN_SENT`, the SYN went unanswered for a retransmission timeout.
#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn outlier_retransmit(ctx: BtfTracePointContext) -> i32 {
    let _ = handshake_failed(ctx.arg(0));
    0
}

/// An error reported on a socket: in `SYN_SENT`, an ICMP error answered the handshake (a reset
/// moves the socket to `CLOSE` before it reports, and was counted by [`outlier_reset`]).
#[btf_tracepoint(function = "inet_sk_error_report")]
pub fn outlier_error(ctx: BtfTracePointContext) -> i32 {
    let _ = handshake_failed(ctx.arg(0));
    0
}

/// The traced socket `sk`'s handshake failed, if it is in one (then true): counted against its
/// backend, once per socket, if the connect hooks rewrote it.
#[inline(always)]
fn handshake_failed(sk: *const c_void) -> bool {
    let offset = SKC_STATE_OFFSET.load() as usize;
    // SAFETY: reads one byte of the socket the kernel passed, at the offset of its state.
    let state = unsafe { bpf_probe_read_kernel(sk.cast::<u8>().wrapping_add(offset)) };
    if state != Ok(TCP_SYN_SENT) {
        return false;
    }
    let Some((entry, translation)) = ours(sk) else {
        return true;
    };
    // The socket may have connected elsewhere since the hooks rewrote it (its cookie, and so its
    // entry, outlive `connect(AF_UNSPEC)`): only a handshake to the entry's backend is charged to
    // that backend.
    if !peer::is_backend(sk.cast_mut(), &translation) {
        return true;
    }
    // SAFETY: as above; only this socket's programs write its entry's marks.
    let marks = unsafe { &raw mut (*entry).marks };
    // SAFETY: as above.
    let seen = unsafe { read_volatile(marks) };
    if translation.proto != IPPROTO_TCP || seen & TcpTranslation::HANDSHAKE_FAILED != 0 {
        return true;
    }
    // SAFETY: as above.
    unsafe { write_volatile(marks, seen | TcpTranslation::HANDSHAKE_FAILED) };
    let key =
        BackendKey { addr: translation.backend, port: translation.backend_port, family: translation.family, _pad: 0 };
    fail(&key, port_flags(&translation));
    true
}

/// The traced socket `sk`, past its handshake, was reset by its peer: marked, if the connect
/// hooks rewrote it for a measured port, for the load signal to count at its end.
#[inline(never)]
fn reset(sk: *const c_void) {
    let Some((entry, translation)) = ours(sk) else { return };
    if translation.flags & SockTranslation::MEASURED != 0 {
        // SAFETY: as in `handshake_failed`.
        unsafe {
            let marks = &raw mut (*entry).marks;
            write_volatile(marks, read_volatile(marks) | TcpTranslation::RESET);
        }
    }
}

/// The traced socket `sk`'s entry in the TCP connections table, if the connect hooks rewrote it.
#[inline(always)]
fn ours(sk: *const c_void) -> Option<(*mut TcpTranslation, SockTranslation)> {
    // SAFETY: the helper takes the traced socket argument as it is.
    let cookie = unsafe { bpf_get_socket_cookie(sk.cast_mut()) };
    maps::tcp_connection(cookie)
}

/// The options' flags of the Service port `translation` was rewritten from (its ejection
/// settings, see `Tuning`); 0 (the defaults) once the port is gone.
#[inline(never)]
fn port_flags(translation: &SockTranslation) -> u32 {
    let vip = sockaddr::words(&translation.vip);
    let service = if translation.family == AF_INET {
        lookup::service4(vip[0], translation.vip_port, translation.proto)
    } else {
        lookup::service6(vip, translation.vip_port, translation.proto)
    };
    // SAFETY: an array element, read at once.
    service
        .and_then(|service| SERVICE_OPTIONS.get_ptr(service.service_id))
        .map_or(0, |options| unsafe { (*options).flags })
}

/// A handshake to `key` failed now, through a port with options `flags` (its ejection
/// settings): counted in its entry (made if the map takes it); its bucket's bit and the node's
/// state set.
#[inline(never)]
fn fail(key: &BackendKey, flags: u32) {
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(entry) = lookup(key).or_else(|| create(key)) else {
        return;
    };
    // SAFETY: a map value of this type, valid while the program runs. The run's count is added to
    // atomically: failures of one backend on two CPUs at once both count.
    let _ = unsafe {
        (*entry).fail_adding(now, Tuning::of(flags), |failures| count::atomic_increment(ptr::from_mut(failures)))
    };
    if let Some(state) = OUTLIER_STATE.get_ptr_mut(0) {
        // SAFETY: the element of a one-entry array, valid while the program runs. Not atomic: a
        // bit another CPU sets in the same word at the same moment may be lost, and set again by
        // its backend's next failure.
        unsafe {
            (*state).flag(bucket_of(&key.addr, key.port));
            write_volatile(&raw mut (*state).active, 1);
        }
    }
}

/// `key`'s entry, if it has one.
#[inline(always)]
fn lookup(key: &BackendKey) -> Option<*mut OutlierEntry> {
    let map = ptr::from_ref(&OUTLIERS).cast_mut().cast::<c_void>();
    // SAFETY: `map` is a hash map of this object whose key and value types these are.
    let found = unsafe { bpf_map_lookup_elem(map, ptr::from_ref(key).cast_mut().cast()) }.cast::<OutlierEntry>();
    (!found.is_null()).then_some(found)
}

/// `key`'s entry, made (zero) if the map takes it.
#[inline(always)]
fn create(key: &BackendKey) -> Option<*mut OutlierEntry> {
    let map = ptr::from_ref(&OUTLIERS).cast_mut().cast::<c_void>();
    let zero = OutlierEntry::default();
    // SAFETY: as in `lookup`. NOEXIST: a CPU that lost the race to make it finds the winner's.
    let _ = unsafe {
        bpf_map_update_elem(
            map,
            ptr::from_ref(key).cast_mut().cast(),
            ptr::from_ref(&zero).cast_mut().cast(),
            BPF_NOEXIST.into(),
        )
    };
    lookup(key)
}

/// The connect hooks' part: while some backend of the node may be failing or ejected, and the
/// drawn one's bucket says it may be, [`probe`] looks it up; an ejected one is replaced
/// ([`redraw`]) and the connection counted against the backend it ends with ([`attempt`]). While
/// no backend of the node is: one word read. Each is a subprogram called from here, so no two of
/// their frames stack on the connect hook's.
#[inline(always)]
pub fn avoid(pick: &mut Pick, family: u8) {
    let Some(state) = OUTLIER_STATE.get_ptr(0) else {
        return;
    };
    // SAFETY: the element of a one-entry array, read at once; its line is already loaded.
    if unsafe { read_volatile(&raw const (*state).active) } == 0 || !flagged(&pick.backend) {
        return;
    }
    let ejected_at = probe(pick, family);
    if ejected_at != 0 {
        redraw(pick, family, ejected_at);
        attempt(pick, family, ejected_at);
    }
}

/// Whether `backend` may be failing or ejected, by its bucket's bit.
#[inline(always)]
fn flagged(backend: &Backend) -> bool {
    let bucket = bucket_of_words(backend.addr_words(), backend.port);
    // SAFETY: the element of a one-entry array, read at once.
    OUTLIER_STATE.get_ptr(0).is_some_and(|state| unsafe { (*state).flagged(bucket) })
}

/// The drawn backend (flagged), if found: the clock's time if it is ejected; else the connection
/// counted against it, and 0.
#[inline(never)]
fn probe(pick: &Pick, family: u8) -> u64 {
    let key = BackendKey { addr: pick.backend.addr, port: pick.backend.port, family, _pad: 0 };
    let Some(entry) = lookup(&key) else {
        return 0;
    };
    // SAFETY: no arguments; the coarse monotonic clock, the connect hooks' own.
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    // SAFETY: a map value of this type, valid while the program runs (racing CPUs may count one
    // connection less).
    unsafe {
        if now < read_volatile(&raw const (*entry).ejected_until_ns) {
            return now;
        }
        (*entry).attempt(now);
    }
    0
}

/// The connection counted against the backend `pick` ends with, at `now`, if that one is failing.
#[inline(never)]
fn attempt(pick: &Pick, family: u8, now: u64) {
    if !flagged(&pick.backend) {
        return;
    }
    let key = BackendKey { addr: pick.backend.addr, port: pick.backend.port, family, _pad: 0 };
    if let Some(entry) = lookup(&key) {
        // SAFETY: as in `probe`.
        unsafe { (*entry).attempt(now) };
    }
}

/// The search for a backend not ejected (a BPF subprogram, so its keys and loops take no room in
/// the connect hooks' own stack frame). The drawn backend, ejected, is
/// kept if more than half the set's first [`SCAN`] slots are (the panic threshold); else drawn
/// again, up to [`REDRAWS`] times, then replaced by the first of those slots not ejected.
#[inline(never)]
fn redraw(pick: &mut Pick, family: u8, now: u64) {
    let Some(scan) = OUTLIER_SCAN.get_ptr_mut(0) else {
        return;
    };
    let (base, count, set_id) = (pick.service.base, pick.service.count, pick.service.set_id);
    // SAFETY: this CPU's element of a one-entry per-CPU array, valid while the program runs
    // (nothing else runs on this CPU meanwhile: the hooks do not nest).
    unsafe { write_volatile(scan, OutlierScan { searched: 0, out: 0, first_in: u32::MAX, _pad: 0 }) };
    for offset in 0..SCAN {
        if offset >= count {
            break;
        }
        let Some(slot) = SLOTS.get_ptr(base.wrapping_add(offset)) else {
            break;
        };
        // SAFETY: an element of the array for the program's lifetime.
        let slot = unsafe { &*slot };
        if slot.set_id != set_id || set_id == 0 {
            continue;
        }
        // SAFETY: as above; each count read back from the map, so the verifier does not follow
        // every combination of the slots' outcomes.
        unsafe {
            write_volatile(&raw mut (*scan).searched, read_volatile(&raw const (*scan).searched) + 1);
            if ejected(&slot.primary, family, now) {
                write_volatile(&raw mut (*scan).out, read_volatile(&raw const (*scan).out) + 1);
            } else if read_volatile(&raw const (*scan).first_in) == u32::MAX {
                write_volatile(&raw mut (*scan).first_in, offset);
            }
        }
    }
    // SAFETY: as above.
    let scan = unsafe { read_volatile(scan) };
    if scan.first_in == u32::MAX || 2 * scan.out > scan.searched {
        return;
    }
    for _ in 0..REDRAWS {
        match choose::draw(&pick.service) {
            Ok(backend) if !ejected(&backend, family, now) => {
                pick.backend = backend;
                return;
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    if let Some(slot) = SLOTS.get_ptr(base.wrapping_add(scan.first_in)) {
        // SAFETY: an element of the array for the program's lifetime.
        pick.backend = unsafe { (*slot).primary };
    }
}

/// Whether `backend` is ejected at `now`.
#[inline(never)]
fn ejected(backend: &Backend, family: u8, now: u64) -> bool {
    let key = BackendKey { addr: backend.addr, port: backend.port, family, _pad: 0 };
    // SAFETY: a map value of this type, read at once.
    lookup(&key).is_some_and(|entry| now < unsafe { read_volatile(&raw const (*entry).ejected_until_ns) })
}

/// Slots searched for a backend not ejected, and for the share ejected: a set of at most this
/// many slots is judged whole.
const SCAN: u32 = 16;
