//! The load signal (`sock_ops`): for every TCP connection the connect hooks rewrote, the backend's
//! counters of handshakes started, completed and failed, connections closed and reset, and the
//! time spent in each. Only a socket's state changes run it, never its packets.
//!
//! A socket counts only if the connect hook left its translation marked measured (so it went to a
//! backend this node chose, for a port under feedback), and its close counts only if its
//! handshake was counted (its `SockLoad` exists): connections older than the program are never
//! half counted. Every other socket leaves on a flag test, and gets no state callbacks.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    bindings::{BPF_NOEXIST, BPF_SK_STORAGE_GET_F_CREATE},
    helpers::generated::{bpf_ktime_get_ns, bpf_map_lookup_elem, bpf_map_update_elem, bpf_sk_storage_get},
    macros::sock_ops,
    programs::SockOpsContext,
};
use topology_common::{BackendKey, BackendLoad, IPPROTO_TCP, SockLoad, SockTranslation};

use crate::maps::{BACKEND_LOAD, SOCK_CONNECTIONS, SOCK_LOAD};

/// `BPF_SOCK_OPS_TCP_CONNECT_CB`: an active handshake starts (after the connect hooks).
const TCP_CONNECT: u32 = 3;
/// `BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB`: an active handshake completed.
const ACTIVE_ESTABLISHED: u32 = 4;
/// `BPF_SOCK_OPS_STATE_CB`: the socket changed TCP state (`args[0]` old, `args[1]` new).
const STATE: u32 = 10;
/// `BPF_SOCK_OPS_STATE_CB_FLAG`: ask for [`STATE`] callbacks on this socket.
const STATE_CB_FLAG: i32 = 4;
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
/// port under feedback.
#[inline(always)]
fn connect(ctx: &SockOpsContext) {
    let sk = socket(ctx);
    let Some(key) = backend(sk, true) else { return };
    let Some(load) = counters(&key, true) else { return };
    let start = SockLoad { connect_ns: now(), established_ns: 0 };
    let record = storage(&SOCK_LOAD, sk, BPF_SK_STORAGE_GET_F_CREATE.into()).cast::<SockLoad>();
    if record.is_null() {
        // Without its record the close could not be matched: leave the socket unmeasured.
        return;
    }
    // SAFETY: non-null storage of this socket, valid while the program runs.
    unsafe { *record = start };
    add(load, BackendLoad::CONNECTS, 1);
    // The state callbacks report how the handshake or the connection ends. A socket whose flag
    // cannot be set (never a full TCP socket here) is counted as connecting until it goes.
    let _ = ctx.set_cb_flags(ctx.cb_flags() as i32 | STATE_CB_FLAG);
}

/// A handshake completed.
#[inline(always)]
fn established(ctx: &SockOpsContext) {
    let sk = socket(ctx);
    let Some((record, load)) = measured(sk) else { return };
    let now = now();
    // SAFETY: non-null storage of this socket (see `measured`).
    let connect_ns = unsafe {
        (*record).established_ns = now;
        (*record).connect_ns
    };
    add(load, BackendLoad::ESTABLISHED, 1);
    add(load, BackendLoad::HANDSHAKE_US, now.saturating_sub(connect_ns) / 1000);
}

/// A state change: only the move to `CLOSE` counts, by where it came from.
#[inline(always)]
fn state(ctx: &SockOpsContext) {
    if ctx.arg(1) != TCP_CLOSE {
        return;
    }
    let old = ctx.arg(0);
    let sk = socket(ctx);
    let Some((record, load)) = measured(sk) else { return };
    // SAFETY: non-null storage of this socket (see `measured`); copied out at once.
    let established_ns = unsafe { (*record).established_ns };
    if old == TCP_SYN_SENT || established_ns == 0 {
        // SAFETY: `ops` is the context the kernel passed; `total_retrans` is readable for a full
        // socket, and a state callback only runs for one.
        let retransmitted = unsafe { (*ctx.ops).total_retrans } > 0;
        add(load, if retransmitted { BackendLoad::TIMED_OUT } else { BackendLoad::REFUSED }, 1);
    } else {
        add(load, BackendLoad::CLOSED, 1);
        add(load, BackendLoad::LIFETIME_US, now().saturating_sub(established_ns) / 1000);
        if old == TCP_ESTABLISHED {
            add(load, BackendLoad::RESET, 1);
        }
    }
    // A socket may connect again after a failed handshake: it starts over then.
    // SAFETY: as above.
    unsafe { *record = SockLoad::default() };
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

/// The backend the connect hook rewrote this TCP socket to, if it did.
#[inline(always)]
fn backend(sk: *mut c_void, only_measured: bool) -> Option<BackendKey> {
    let translation = storage(&SOCK_CONNECTIONS, sk, 0).cast::<SockTranslation>();
    if translation.is_null() {
        return None;
    }
    // SAFETY: non-null storage of this socket, valid while the program runs; copied out at once.
    let translation = unsafe { *translation };
    if only_measured && translation.flags & SockTranslation::MEASURED == 0 {
        return None;
    }
    (translation.proto == IPPROTO_TCP && translation.family != 0).then_some(BackendKey {
        addr: translation.backend,
        port: translation.backend_port,
        family: translation.family,
        _pad: 0,
    })
}

/// A measured socket's record and its backend's counters.
#[inline(always)]
fn measured(sk: *mut c_void) -> Option<(*mut SockLoad, *mut BackendLoad)> {
    let record = storage(&SOCK_LOAD, sk, 0).cast::<SockLoad>();
    // SAFETY: non-null storage of this socket; a zero start means not measured (or done).
    if record.is_null() || unsafe { (*record).connect_ns } == 0 {
        return None;
    }
    let key = backend(sk, false)?;
    let load = counters(&key, false)?;
    // SAFETY: both non-null and valid while the program runs; copied out at once.
    let (started, created) = unsafe { ((*record).connect_ns, (*load).created_ns) };
    // A socket counted in an earlier entry of this backend (pruned, or cleared at a detach).
    (started >= created).then_some((record, load))
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
    // aligned, valid while the program runs.
    let counter = unsafe { load.cast::<u64>().add(index) };
    // The BPF target has atomic adds but no compare-and-swap, so `AtomicU64` has no `fetch_add`
    // there; the intrinsic is the same instruction (`lock xadd`, its result unused).
    // SAFETY: as above; every writer of the counters adds atomically.
    #[cfg(target_arch = "bpf")]
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(counter, value)
    };
    // SAFETY: as above (the host build only type-checks the programs).
    #[cfg(not(target_arch = "bpf"))]
    unsafe {
        core::sync::atomic::AtomicU64::from_ptr(counter).fetch_add(value, core::sync::atomic::Ordering::Relaxed)
    };
}

/// `CLOCK_MONOTONIC`, nanoseconds.
#[inline(always)]
fn now() -> u64 {
    // SAFETY: no arguments.
    unsafe { bpf_ktime_get_ns() }
}
