//! The load signal: for every TCP connection the connect hooks rewrote for a port under feedback,
//! the backend's counters of connections started, ended and failed, and the time each lived.
//! Counted where a connection starts (the connect hook, [`started`]) and where its socket ends
//! (`tcp_destroy_sock`, [`ended`]): no program runs on a connection's packets or state changes,
//! so no other socket pays anything for it.
//!
//! A measured connection's start time is kept in its entry of the TCP connections table, beside
//! its translation, and cleared once its end is counted (so two copies of the program, for the
//! moment an upgrade runs both, count it once). A connection that outlives its entry (about a
//! table of newer connections through the hooks) is known at its end by a mark the connect hook
//! put on the socket itself — a `sock_ops` callback flag no program of ours answers
//! ([`crate::sockaddr::mark_measured`]), or on kernels before 6.12 its translation in socket storage —
//! and counted against its real peer, without a lifetime. Counters are keyed by the socket's
//! real peer.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    Global,
    bindings::BPF_NOEXIST,
    helpers::generated::{bpf_ktime_get_ns, bpf_map_lookup_elem, bpf_map_update_elem, bpf_sk_storage_get},
};
use topology_common::{Backend, BackendKey, BackendLoad, IPPROTO_TCP, SockTranslation, TcpTranslation};

use crate::{
    choose::Pick,
    kernel::field,
    maps::{self, BACKEND_LOAD, SOCK_CONNECTIONS},
    peer,
    sockaddr::MEASURED_MARK,
};

/// 1 when the load signal runs (the agent's `--load-signal`), set at load.
#[unsafe(no_mangle)]
static LOAD_SIGNAL: Global<u32> = Global::new(0);
/// Byte offsets in this kernel's `struct tcp_sock` of `srtt_us`, `total_retrans` and
/// `bpf_sock_ops_cb_flags`, set by the agent at load from its BTF.
#[unsafe(no_mangle)]
static SRTT_US_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TOTAL_RETRANS_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static CB_FLAGS_OFFSET: Global<u32> = Global::new(0);

/// Whether the load signal runs.
#[inline(always)]
pub fn on() -> bool {
    LOAD_SIGNAL.load() != 0
}

/// The connect hook wrote `entry` for a measured connection of `translation`: its start counted
/// and timed. A subprogram: its key and zero counters take no room in the connect hook's frame.
#[inline(never)]
pub fn started(entry: *mut TcpTranslation, translation: &SockTranslation) {
    let Some(load) = counters(&key_of(translation), true) else { return };
    // SAFETY: an element of the array, valid for the program's lifetime; this socket's own.
    unsafe { (*entry).connect_ns = now() };
    add(load, BackendLoad::CONNECTS, 1);
}

/// Overload answered per connection on a port under feedback: when the backend drawn has `limit`
/// or more connections in flight from this node, one more backend of the set is drawn uniformly,
/// and the connection goes there if it carries fewer than half as many
/// ([`topology_common::spill`]). A subprogram: two keys, read in place, off the hook's frame.
#[inline(never)]
pub fn spill(pick: &mut Pick, family: u8, limit: u32) {
    let drawn = in_flight(&pick.backend, family);
    if drawn < u64::from(limit) {
        return;
    }
    let Some(other) = crate::choose::uniform(&pick.service) else { return };
    if topology_common::spill(drawn, in_flight(&other, family), limit) {
        pick.backend = other;
    }
}

/// Connections in flight from this node to `backend` (0 when not measured yet).
#[inline(always)]
fn in_flight(backend: &Backend, family: u8) -> u64 {
    let key = BackendKey { addr: backend.addr, port: backend.port, family, _pad: 0 };
    // SAFETY: a map value, valid while the program runs; other CPUs add to it, so a reading may
    // be a moment old, never invalid.
    counters(&key, false).map_or(0, |load| unsafe { (*load).in_flight() })
}

/// The connect hook is about to rewrite `entry`, the socket `cookie`'s position: if it holds this
/// socket's measured connection not yet ended, that one's handshake failed (the kernel runs the
/// connect hooks again only on a socket whose connect failed), and it is counted refused.
#[inline(always)]
pub fn connecting_again(entry: *mut TcpTranslation, cookie: u64) {
    if !on() {
        return;
    }
    // SAFETY: as in `started`; read at once.
    let (own, started) = unsafe { ((*entry).cookie == cookie, (*entry).connect_ns) };
    if own && started != 0 {
        failed_again(entry, cookie);
    }
}

/// The rare half of [`connecting_again`], a subprogram: the entry checked whole, then counted.
/// Read in place, not copied: its frame stacks on the connect hook's.
#[inline(never)]
fn failed_again(entry: *mut TcpTranslation, cookie: u64) {
    // SAFETY: as in `started`.
    let entry = unsafe { &*entry };
    let Some(translation) = entry.of(cookie) else { return };
    if translation.flags & SockTranslation::MEASURED == 0 {
        return;
    }
    if let Some(load) = counters(&key_of(&translation), false)
        && !before_entry(entry.connect_ns, load)
    {
        add(load, BackendLoad::REFUSED, 1);
    }
}

/// The TCP socket `sk` (cookie `cookie`, one the connect hooks took) is destroyed: a measured
/// connection's end counted — a failed handshake (refused, or timed out after a retransmitted
/// SYN), or an ended connection with its lifetime, round-trip time and whether it was reset.
#[inline(never)]
pub fn ended(sk: *mut c_void, cookie: u64) {
    let Some((key, started, marks)) = measured(sk, cookie) else { return };
    let Some(load) = counters(&key, false) else { return };
    if started != 0 && before_entry(started, load) {
        return;
    }
    if !established(sk) {
        // SAFETY: a u32 field of the TCP socket the kernel passed, at its offset.
        let retransmitted = unsafe { field::<u32>(sk, TOTAL_RETRANS_OFFSET.load() as usize) } > 0;
        add(load, if retransmitted { BackendLoad::TIMED_OUT } else { BackendLoad::REFUSED }, 1);
        return;
    }
    add(load, BackendLoad::CLOSED, 1);
    // SAFETY: as above; `srtt_us` holds eight times the smoothed round-trip time.
    add(load, BackendLoad::RTT_US, u64::from(unsafe { field::<u32>(sk, SRTT_US_OFFSET.load() as usize) } >> 3));
    if started != 0 {
        add(load, BackendLoad::LIFETIME_US, now().saturating_sub(started) / 1000);
    }
    if marks & TcpTranslation::RESET != 0 {
        add(load, BackendLoad::RESET, 1);
    }
}

/// The measured connection of `sk` whose end is to be counted, if it is one: its backend, its
/// start time (0 when its entry is gone) and its marks. A socket connected elsewhere since (its
/// connect through the Service failed) has that failure counted here and gives none.
#[inline(always)]
fn measured(sk: *mut c_void, cookie: u64) -> Option<(BackendKey, u64, u32)> {
    let Some((entry, translation)) = maps::tcp_connection(cookie) else {
        return marked(sk).then(|| peer::key(sk)).flatten().map(|key| (key, 0, 0));
    };
    if translation.flags & SockTranslation::MEASURED == 0 || translation.proto != IPPROTO_TCP {
        return None;
    }
    // SAFETY: an element of the array, valid while the program runs; only this socket's programs
    // write its times and marks. Cleared: counted once.
    let (started, marks) = unsafe { ((*entry).connect_ns, (*entry).marks) };
    if started == 0 {
        return None;
    }
    // SAFETY: as above.
    unsafe { (*entry).connect_ns = 0 };
    let key = key_of(&translation);
    if !peer::is_backend(sk, &translation) {
        if let Some(load) = counters(&key, false)
            && !before_entry(started, load)
        {
            add(load, BackendLoad::REFUSED, 1);
        }
        return None;
    }
    Some((key, started, marks))
}

/// Whether the connect hook marked `sk` measured: the callback flag, or (kernels before 6.12) its
/// translation in socket storage.
#[inline(always)]
fn marked(sk: *mut c_void) -> bool {
    // SAFETY: a u8 field of the TCP socket the kernel passed, at its offset.
    if unsafe { field::<u8>(sk, CB_FLAGS_OFFSET.load() as usize) } & MEASURED_MARK as u8 != 0 {
        return true;
    }
    let map = ptr::from_ref(&SOCK_CONNECTIONS).cast_mut().cast::<c_void>();
    // SAFETY: `map` is a socket storage map of this object, `sk` a full socket.
    let stored = unsafe { bpf_sk_storage_get(map, sk, ptr::null_mut(), 0) }.cast::<SockTranslation>();
    // SAFETY: non-null storage of this socket, valid while the program runs; read at once.
    !stored.is_null() && unsafe { (*stored).flags } & SockTranslation::MEASURED != 0
}

/// Whether `sk`'s handshake completed: a round-trip time was sampled (the SYN-ACK's, or a
/// later segment's), or bytes moved.
#[inline(always)]
fn established(sk: *mut c_void) -> bool {
    // SAFETY: a u32 field of the TCP socket the kernel passed, at its offset.
    let sampled = unsafe { field::<u32>(sk, SRTT_US_OFFSET.load() as usize) } != 0;
    sampled || crate::bytes::totals(sk).is_some_and(|moved| moved.to_backend != 0 || moved.from_backend != 0)
}

/// The load map's key of `translation`'s backend.
#[inline(always)]
fn key_of(translation: &SockTranslation) -> BackendKey {
    BackendKey { addr: translation.backend, port: translation.backend_port, family: translation.family, _pad: 0 }
}

/// Whether a connection that started at `started` began before `load`'s entry was created (it
/// was counted in an earlier entry, since pruned or cleared).
#[inline(always)]
fn before_entry(started: u64, load: *mut BackendLoad) -> bool {
    // SAFETY: a map value, valid while the program runs.
    started < unsafe { (*load).created_ns }
}

/// The counters of `key`, created (zero) when `create` and the map has room.
#[inline(always)]
fn counters(key: &BackendKey, create: bool) -> Option<*mut BackendLoad> {
    let map = ptr::from_ref(&BACKEND_LOAD).cast_mut().cast::<c_void>();
    let key = ptr::from_ref(key).cast_mut().cast::<c_void>();
    // SAFETY: `map` is a hash map of this object whose key and value types these are.
    let found = unsafe { bpf_map_lookup_elem(map, key) }.cast::<BackendLoad>();
    if !found.is_null() || !create {
        return (!found.is_null()).then_some(found);
    }
    let zero = BackendLoad { created_ns: now(), ..BackendLoad::default() };
    // SAFETY: as above. NOEXIST: a CPU that lost the race to create it finds the winner's.
    let _ = unsafe { bpf_map_update_elem(map, key, ptr::from_ref(&zero).cast_mut().cast(), BPF_NOEXIST.into()) };
    // SAFETY: as above.
    let created = unsafe { bpf_map_lookup_elem(map, key) }.cast::<BackendLoad>();
    (!created.is_null()).then_some(created)
}

/// Adds `value` to counter `index` of `load`, atomically: connections of one backend open and
/// close on every CPU at once.
#[inline(always)]
fn add(load: *mut BackendLoad, index: usize, value: u64) {
    if index >= BackendLoad::FIELDS {
        return;
    }
    // SAFETY: `load` points to a map value of `FIELDS` u64s (asserted in topology-common), 8-byte
    // aligned, valid while the program runs; every writer of the counters adds atomically.
    crate::count::atomic_add(unsafe { load.cast::<u64>().add(index) }, value);
}

/// `CLOCK_MONOTONIC`, nanoseconds.
#[inline(always)]
fn now() -> u64 {
    // SAFETY: no arguments.
    unsafe { bpf_ktime_get_ns() }
}
