//! The load signal (`sock_ops`): for every TCP connection the connect hooks rewrote for a port
//! under feedback, the backend's counters of handshakes started, completed and failed,
//! connections closed and reset, and the time spent in each. Only a socket's state changes run
//! it, never its packets.
//!
//! A socket counts only if the connect hook left its translation marked measured (so it went to a
//! backend this node chose, for a port under feedback) and it connects to that backend. The
//! connect hook asks for a measured socket's state callbacks itself, so every other socket leaves
//! on a flag test (on kernels before 6.12, which do not let it, after a socket storage read that
//! finds nothing, and the flag is set here). The flag is the mark of a counted connection: it is
//! cleared from any socket whose handshake is not counted, so a close counts only after its start.
//! When the handshake started and completed is kept in the connection's entry of the TCP
//! connections table, beside its translation: no allocation per connection. Counters are keyed
//! by the socket's real peer.

use core::{
    ffi::c_void,
    ptr::{self, addr_of, read_volatile},
};

use aya_ebpf::{
    EbpfContext as _,
    bindings::BPF_NOEXIST,
    helpers::generated::{
        bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_map_lookup_elem, bpf_map_update_elem, bpf_sk_storage_get,
    },
    macros::sock_ops,
    programs::SockOpsContext,
};
use topology_common::{AF_INET, AF_INET6, BackendKey, BackendLoad, IPPROTO_TCP, SockTranslation, TcpTranslation};

use crate::{
    maps::{self, BACKEND_LOAD, SOCK_CONNECTIONS},
    sockaddr::STATE_CB_FLAG,
};

/// `BPF_SOCK_OPS_TCP_CONNECT_CB`: an active handshake starts (after the connect hooks).
const TCP_CONNECT: u32 = 3;
/// `BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB`: an active handshake completed.
const ACTIVE_ESTABLISHED: u32 = 4;
/// `BPF_SOCK_OPS_STATE_CB`: the socket changed TCP state (`args[0]` old, `args[1]` new).
const STATE: u32 = 10;
/// `AF_INET` and `AF_INET6` as the context's `family` holds them.
const AF_INET_SOCKET: u32 = 2;
const AF_INET6_SOCKET: u32 = 10;
/// TCP states (`BPF_TCP_*`).
const TCP_ESTABLISHED: u32 = 1;
const TCP_SYN_SENT: u32 = 2;
const TCP_CLOSE: u32 = 7;

/// The program's return value: sock_ops programs return 1; the reply stays 0, so every
/// tunable callback (initial RTO, receive window, ECN) keeps the kernel's default.
const DONE: u32 = 1;

#[sock_ops]
pub fn backend_load(ctx: SockOpsContext) -> u32 {
    match ctx.op() {
        TCP_CONNECT => connect(&ctx),
        ACTIVE_ESTABLISHED => established(&ctx),
        STATE => state(&ctx),
        _ => {}
    }
    DONE
}

/// A handshake starts: counted, timed and followed if the connect hooks rewrote this socket for a
/// port under feedback, to the peer it is connecting to now.
#[inline(always)]
fn connect(ctx: &SockOpsContext) {
    // Asked for by the connect hook (see `record::remember_connection`), else, on a kernel that
    // does not let it ask, marked in the socket's storage: every other socket leaves here.
    let flagged = ctx.cb_flags() & STATE_CB_FLAG as u32 != 0;
    if !flagged && stored(socket(ctx)).is_none_or(|t| t.flags & SockTranslation::MEASURED == 0) {
        return;
    }
    match (flagged, start(ctx)) {
        // Not counted: no state callbacks, so its close is not counted either.
        (true, false) => {
            let _ = ctx.set_cb_flags(ctx.cb_flags() as i32 & !STATE_CB_FLAG);
        }
        // Counted: the state callbacks report how the handshake or the connection ends. A socket
        // whose flag cannot be set (never a full TCP socket here) stays connecting in the counts.
        (false, true) => {
            let _ = ctx.set_cb_flags(ctx.cb_flags() as i32 | STATE_CB_FLAG);
        }
        _ => {}
    }
}

/// Counts and times the start of a measured connection; false when it is not one (its
/// translation is gone, not measured, or names another peer) or cannot be counted.
#[inline(always)]
fn start(ctx: &SockOpsContext) -> bool {
    let Some(entry) = entry(ctx) else { return false };
    // SAFETY: an element of the array, valid while the program runs; copied out at once.
    let translation = unsafe { (*entry).translation };
    let Some(key) = peer(ctx) else { return false };
    // A socket whose earlier connect was measured and that now connects elsewhere is not.
    let names_peer =
        translation.family == key.family && translation.backend == key.addr && translation.backend_port == key.port;
    if translation.flags & SockTranslation::MEASURED == 0 || translation.proto != IPPROTO_TCP || !names_peer {
        return false;
    }
    let Some(load) = counters(&key, true) else { return false };
    // SAFETY: as above; only this socket's callbacks write its entry's times (another socket
    // taking the position rewrites the whole entry, and its cookie tells).
    unsafe {
        (*entry).connect_ns = now();
        (*entry).established_ns = 0;
    }
    add(load, BackendLoad::CONNECTS, 1);
    true
}

/// A counted handshake completed.
#[inline(always)]
fn established(ctx: &SockOpsContext) {
    if ctx.cb_flags() & STATE_CB_FLAG as u32 == 0 {
        return;
    }
    let Some(load) = peer(ctx).and_then(|key| counters(&key, false)) else { return };
    let now = now();
    let handshake_us = match entry(ctx) {
        Some(entry) => {
            // SAFETY: as in `start`.
            let started = unsafe { (*entry).connect_ns };
            if started == 0 || before_entry(started, load) {
                return;
            }
            // SAFETY: as in `start`.
            unsafe { (*entry).established_ns = now };
            now.saturating_sub(started) / 1000
        }
        // Its entry was taken by a newer socket (not within a handshake, in practice): the
        // smoothed RTT's first sample is the handshake's (`srtt_us` holds eight times it).
        // SAFETY: the kernel passes a valid context; `srtt_us` is readable for a full socket.
        None => u64::from(unsafe { (*ctx.ops).srtt_us } >> 3),
    };
    add(load, BackendLoad::ESTABLISHED, 1);
    add(load, BackendLoad::HANDSHAKE_US, handshake_us);
}

/// A state change of a counted socket: only the move to `CLOSE` counts, by where it came from.
#[inline(always)]
fn state(ctx: &SockOpsContext) {
    if ctx.arg(1) != TCP_CLOSE {
        return;
    }
    let old = ctx.arg(0);
    let Some(load) = peer(ctx).and_then(|key| counters(&key, false)) else { return };
    let entry = entry(ctx);
    // SAFETY: as in `start`; copied out at once.
    let times = entry.map(|entry| unsafe { ((*entry).connect_ns, (*entry).established_ns) });
    let counted = match times {
        // A start this program counted, into this entry of the backend's counters.
        Some((started, _)) => started != 0 && !before_entry(started, load),
        // Taken by a newer socket: a long-lived connection, counted when it started (the flag
        // says so); a failed handshake never lives that long.
        None => old != TCP_SYN_SENT,
    };
    if counted {
        if old == TCP_SYN_SENT {
            // SAFETY: `ops` is the context the kernel passed; `total_retrans` is readable for a
            // full socket, and a state callback only runs for one.
            let retransmitted = unsafe { (*ctx.ops).total_retrans } > 0;
            add(load, if retransmitted { BackendLoad::TIMED_OUT } else { BackendLoad::REFUSED }, 1);
        } else {
            add(load, BackendLoad::CLOSED, 1);
            if let Some((_, established @ 1..)) = times {
                add(load, BackendLoad::LIFETIME_US, now().saturating_sub(established) / 1000);
            }
            if old == TCP_ESTABLISHED {
                add(load, BackendLoad::RESET, 1);
            }
        }
    }
    // A socket may connect again after a failed handshake: it starts over then.
    if let Some(entry) = entry {
        // SAFETY: as in `start`.
        unsafe {
            (*entry).connect_ns = 0;
            (*entry).established_ns = 0;
        }
    }
    let _ = ctx.set_cb_flags(ctx.cb_flags() as i32 & !STATE_CB_FLAG);
}

/// Whether a connection that started at `started` began before `load`'s entry was created (it
/// was counted in an earlier entry, since pruned or cleared at a detach).
#[inline(always)]
fn before_entry(started: u64, load: *mut BackendLoad) -> bool {
    // SAFETY: a map value, valid while the program runs.
    started < unsafe { (*load).created_ns }
}

/// The socket of the context; null for a request socket (never one of these callbacks).
#[inline(always)]
fn socket(ctx: &SockOpsContext) -> *mut c_void {
    // SAFETY: the kernel passes a valid context; `sk` reads as a full socket or null.
    unsafe { (*ctx.ops).__bindgen_anon_2.sk.cast() }
}

/// A socket's storage in `map`; null when it has none (and `flags` does not create it), or for a
/// null socket.
#[inline(always)]
fn storage<M>(map: &M, sk: *mut c_void, flags: u64) -> *mut c_void {
    if sk.is_null() {
        return ptr::null_mut();
    }
    let map = ptr::from_ref(map).cast_mut().cast::<c_void>();
    // SAFETY: `map` is a socket storage map of this object, `sk` a non-null full socket.
    unsafe { bpf_sk_storage_get(map, sk, ptr::null_mut(), flags) }
}

/// This socket's entry in the TCP connections table, if it is still its own and whole.
#[inline(always)]
fn entry(ctx: &SockOpsContext) -> Option<*mut TcpTranslation> {
    // SAFETY: the helper accepts the sock_ops context.
    let cookie = unsafe { bpf_get_socket_cookie(ctx.as_ptr()) };
    maps::tcp_connection(cookie).map(|(entry, _)| entry)
}

/// The translation the connect hook left in this socket's storage (a kernel whose connect hook
/// cannot ask for the state callbacks).
#[inline(always)]
fn stored(sk: *mut c_void) -> Option<SockTranslation> {
    let translation = storage(&SOCK_CONNECTIONS, sk, 0).cast::<SockTranslation>();
    // SAFETY: non-null storage of this socket, valid while the program runs; copied out at once.
    (!translation.is_null()).then(|| unsafe { *translation })
}

/// The peer this socket is connected (or connecting) to, as the load map keys it: its real
/// peer, whatever a record says. An IPv4-mapped peer of an AF_INET6 socket is IPv4.
#[inline(always)]
fn peer(ctx: &SockOpsContext) -> Option<BackendKey> {
    // SAFETY: the kernel passes a valid context; each field is read as the 4-byte load the
    // verifier requires (`remote_port` holds the network-order port in its upper 16 bits).
    let (family, port) =
        unsafe { (read_volatile(addr_of!((*ctx.ops).family)), read_volatile(addr_of!((*ctx.ops).remote_port))) };
    let port = u16::from_be((port >> 16) as u16);
    let mut addr = [0u8; 16];
    let family = match family {
        AF_INET_SOCKET => {
            // SAFETY: as above.
            let ip = unsafe { read_volatile(addr_of!((*ctx.ops).remote_ip4)) };
            addr[..4].copy_from_slice(&ip.to_ne_bytes());
            AF_INET
        }
        AF_INET6_SOCKET => {
            // SAFETY: as above, one word at a time.
            let words = unsafe {
                let ip6 = addr_of!((*ctx.ops).remote_ip6).cast::<u32>();
                [read_volatile(ip6), read_volatile(ip6.add(1)), read_volatile(ip6.add(2)), read_volatile(ip6.add(3))]
            };
            if words[0] == 0 && words[1] == 0 && words[2] == 0xffff_u32.to_be() {
                addr[..4].copy_from_slice(&words[3].to_ne_bytes());
                AF_INET
            } else {
                for (i, word) in words.iter().enumerate() {
                    addr[4 * i..4 * i + 4].copy_from_slice(&word.to_ne_bytes());
                }
                AF_INET6
            }
        }
        _ => return None,
    };
    Some(BackendKey { addr, port, family, _pad: 0 })
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
