//! Passive outlier ejection (see `topology_common::outlier`): the tracing program that counts
//! each backend's failed handshakes in a row and ejects it, and the connect hooks' avoidance of an
//! ejected backend.
//!
//! The tracing program runs at every TCP state change of the node, so it leaves at once unless
//! the change ends an active handshake (`SYN_SENT` to `ESTABLISHED` or `CLOSE`); a success goes
//! further only while some backend failed within the failing window. That is still about ten
//! runs per connection of the node, client and server ends together (0.5 µs of a connect here):
//! ejection is off unless asked for (`--outlier-ejection on`). The connect hooks read one array
//! element per connection and look a drawn backend up only while an ejection is in force.

use core::{
    ffi::c_void,
    ptr::{self, read_volatile, write_volatile},
};

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::generated::{bpf_get_socket_cookie, bpf_ktime_get_ns, bpf_map_lookup_elem, bpf_map_update_elem},
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use topology_common::{
    Backend, BackendKey, IPPROTO_TCP, OutlierEntry, OutlierState,
    outlier::{CONSECUTIVE_FAILURES, FAILING_WINDOW_NS, REDRAWS},
};

use crate::{
    choose::{self, Pick},
    gate::Clock,
    maps::{OUTLIER_STATE, OUTLIERS, SLOTS, TCP_CONNECTIONS, tcp_connection_position},
};

/// TCP states as the tracepoint passes them.
const TCP_ESTABLISHED: i32 = 1;
const TCP_SYN_SENT: i32 = 2;
const TCP_CLOSE: i32 = 7;

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn outlier(ctx: BtfTracePointContext) -> i32 {
    // The tracepoint's arguments are (const struct sock *sk, int oldstate, int newstate).
    let (old, new): (i32, i32) = (ctx.arg(1), ctx.arg(2));
    if old != TCP_SYN_SENT {
        return 0;
    }
    let failed = new == TCP_CLOSE;
    if !failed && new != TCP_ESTABLISHED {
        return 0;
    }
    let Some(state) = OUTLIER_STATE.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: an element of a one-entry array, valid while the program runs.
    if !failed && now >= unsafe { read_volatile(&raw const (*state).failing_until_ns) } {
        return 0;
    }
    let Some(key) = rewritten(ctx.arg(0)) else {
        return 0;
    };
    if failed {
        fail(&key, state, now);
    } else if let Some(entry) = lookup(&key) {
        // SAFETY: a map value of this type, valid while the program runs.
        unsafe { write_volatile(&raw mut (*entry).failures, 0) };
    }
    0
}

/// The backend a TCP connection the connect hooks rewrote went to (its entry in the TCP
/// connections table, by cookie); `None` for any other socket.
#[inline(always)]
fn rewritten(sk: *mut c_void) -> Option<BackendKey> {
    // SAFETY: the helper takes the traced socket argument as it is.
    let cookie = unsafe { bpf_get_socket_cookie(sk) };
    let entry = TCP_CONNECTIONS.get_ptr(tcp_connection_position(cookie))?;
    // SAFETY: an element of the array, copied out at once (checked whole by its seal).
    let translation = unsafe { *entry }.of(cookie)?;
    (translation.proto == IPPROTO_TCP).then_some(BackendKey {
        addr: translation.backend,
        port: translation.backend_port,
        family: translation.family,
        _pad: 0,
    })
}

/// A handshake to `key` failed at `now`: one more in a row, and an ejection at the threshold
/// (not while it is ejected already: a connection made before it counts nothing more).
#[inline(always)]
fn fail(key: &BackendKey, state: *mut OutlierState, now: u64) {
    // SAFETY: an element of a one-entry array, valid while the program runs.
    unsafe { write_volatile(&raw mut (*state).failing_until_ns, now + FAILING_WINDOW_NS) };
    let Some(entry) = lookup(key).or_else(|| create(key)) else {
        return;
    };
    // SAFETY: a map value of this type, valid while the program runs. Two CPUs failing the same
    // backend at once may count one failure less: the ejection comes a failure later.
    unsafe {
        write_volatile(&raw mut (*entry).last_failure_ns, now);
        if now < read_volatile(&raw const (*entry).ejected_until_ns) {
            return;
        }
        let failures = read_volatile(&raw const (*entry).failures) + 1;
        if failures < CONSECUTIVE_FAILURES {
            write_volatile(&raw mut (*entry).failures, failures);
            return;
        }
        let ejections = read_volatile(&raw const (*entry).ejections).saturating_add(1);
        let until = now + OutlierEntry::ejection_ns(ejections);
        write_volatile(&raw mut (*entry).ejections, ejections);
        write_volatile(&raw mut (*entry).ejected_until_ns, until);
        write_volatile(&raw mut (*entry).failures, 0);
        if read_volatile(&raw const (*state).active_until_ns) < until {
            write_volatile(&raw mut (*state).active_until_ns, until);
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

/// `pick`, or while its backend is ejected, another draw from its set, up to [`REDRAWS`] times,
/// then the first primary among the set's first [`SCAN`] slots that is not ejected; if none is
/// found the last draw stands, so a set mostly or wholly ejected is still used.
#[inline(always)]
pub fn avoid(pick: &mut Pick, family: u8, clock: &mut Clock) {
    let Some(state) = OUTLIER_STATE.get_ptr(0) else {
        return;
    };
    // SAFETY: an element of a one-entry array, read at once.
    if unsafe { read_volatile(&raw const (*state).active_until_ns) } == 0 {
        return;
    }
    let now = clock.now();
    // SAFETY: an element of a one-entry array, read at once.
    if now >= unsafe { read_volatile(&raw const (*state).active_until_ns) } {
        return;
    }
    redraw(pick, family, now);
}

/// The search [`avoid`] makes while an ejection is in force: a function of its own (a BPF
/// subprogram), so its keys and loops take no room in the connect hooks' own stack frame.
#[inline(never)]
fn redraw(pick: &mut Pick, family: u8, now: u64) {
    for _ in 0..REDRAWS {
        if !ejected(&pick.backend, family, now) {
            return;
        }
        match choose::draw(&pick.service) {
            Ok(backend) => pick.backend = backend,
            Err(_) => return,
        }
    }
    if !ejected(&pick.backend, family, now) {
        return;
    }
    let (base, count, set_id) = (pick.service.base, pick.service.count, pick.service.set_id);
    for offset in 0..SCAN {
        if offset >= count {
            return;
        }
        let Some(slot) = SLOTS.get_ptr(base.wrapping_add(offset)) else {
            return;
        };
        // SAFETY: an element of the array for the program's lifetime.
        let slot = unsafe { &*slot };
        if slot.set_id == set_id && set_id != 0 && !ejected(&slot.primary, family, now) {
            pick.backend = slot.primary;
            return;
        }
    }
}

/// Whether `backend` is ejected at `now`.
#[inline(never)]
fn ejected(backend: &Backend, family: u8, now: u64) -> bool {
    let key = BackendKey { addr: backend.addr, port: backend.port, family, _pad: 0 };
    // SAFETY: a map value of this type, read at once.
    lookup(&key).is_some_and(|entry| now < unsafe { read_volatile(&raw const (*entry).ejected_until_ns) })
}

/// Slots searched for a backend not ejected once the draws found none: a set of at most this
/// many backends always yields one that is not ejected, if it has one.
const SCAN: u32 = 16;
