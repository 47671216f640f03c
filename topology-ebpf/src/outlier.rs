//! Passive outlier ejection (see `topology_common::outlier`): the tracing programs that count
//! each backend's failed handshakes and eject it, and the connect hooks' part — avoiding an
//! ejected backend and counting the connections sent to a failing one.
//!
//! The tracing programs run where a handshake can fail, never on one that succeeds: a reset
//! received, a segment retransmitted, an error reported on a socket, node-wide. Each leaves at
//! once unless the socket is in `SYN_SENT` (read at the offset the agent found in the kernel's
//! BTF), the connect hooks rewrote it (its cookie's entry in the TCP connections table), and it
//! is still connecting to the backend they chose. A failure is charged to the backend through
//! the Service port the socket was rewritten from, by that port's settings, and ejects it from
//! that port's set alone.

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
            bpf_spin_lock, bpf_spin_unlock,
        },
    },
    macros::btf_tracepoint,
    programs::BtfTracePointContext,
};
use topology_common::{
    Backend, BackendKey, IPPROTO_TCP, OutlierEntry, OutlierKey, OutlierLedger, OutlierScan, SockTranslation,
    TcpTranslation,
    outlier::{
        EjectionSettings, LEDGER_ENTRIES, REDRAWS, SCAN_SLOTS, bucket_of, bucket_of_words, ejection_cap,
        ledger::bpf_spin_lock as SpinLock,
    },
    service_flags,
};

use crate::{
    choose::{self, Pick},
    count,
    maps::{self, OUTLIER_LEDGERS, OUTLIER_SCAN, OUTLIER_STATE, OUTLIERS, SERVICE_OPTIONS, SLOTS},
    peer, rng,
};

/// `TCP_SYN_SENT`, as `sock_common.skc_state` holds it.
const TCP_SYN_SENT: u8 = 2;

/// Byte offset of `skc_state` in the kernel's `struct sock` (through `struct sock_common`), set
/// by the agent at load from the kernel's BTF.
#[unsafe(no_mangle)]
static SKC_STATE_OFFSET: Global<u32> = Global::new(18);

/// Byte offsets of `inet_sock.uc_ttl`, `inet_sock.pinet6` and the 16-bit word holding
/// `ipv6_pinfo.hop_limit` in this kernel, and the shift that reads the hop limit from that word (a
/// 9-bit field before Linux 6.5), set by the agent at load from its BTF.
#[unsafe(no_mangle)]
static OWN_TTL_OFFSETS: Global<[u32; 4]> = Global::new([u32::MAX, u32::MAX, u32::MAX, 0]);

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

/// 1 when `tcp_retransmit_skb` passes the retransmission's error as its third argument (Linux
/// 6.17), set by the agent at load from the kernel's BTF. At 0 the verifier never sees the read
/// of an argument the kernel does not have: it prunes the branch of a frozen global.
#[unsafe(no_mangle)]
static RETRANSMIT_ERR: Global<u32> = Global::new(0);

/// A segment retransmitted: in `SYN_SENT`, the SYN went unanswered for a retransmission timeout.
/// A retransmission that failed to leave this host (its own netfilter, a full qdisc: traced from
/// 6.17 on, with its error) says nothing of the backend, as before 6.17 when it was not traced.
#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn outlier_retransmit(ctx: BtfTracePointContext) -> i32 {
    if RETRANSMIT_ERR.load() != 0 {
        // The kernel's BTF gives this tracepoint a third argument, the error.
        let err: i32 = ctx.arg(2);
        if err != 0 {
            return 0;
        }
    }
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
    // A socket that set its own TTL or hop limit may have failed by it (too low for the path):
    // what it says of the backend is no evidence.
    if own_ttl(sk) {
        return true;
    }
    // SAFETY: as above; written by the connect hook with the rest of the entry.
    let (client, service_id, set_size) = unsafe { ((*entry).client, (*entry).service_id, (*entry).set_size) };
    // Charged through the port the socket was rewritten from, by its settings (see `EjectionSettings`);
    // nothing while that port has ejection off.
    // SAFETY: an array element, read at once.
    let flags = SERVICE_OPTIONS.get_ptr(service_id).map_or(0, |options| unsafe { (*options).flags });
    if flags & service_flags::OUTLIER_OFF == 0 {
        let backend = BackendKey {
            addr: translation.backend,
            port: translation.backend_port,
            family: translation.family,
            _pad: 0,
        };
        fail(&OutlierKey { backend, service_id }, flags, set_size, client);
    }
    true
}

/// Whether the socket `sk` set a TTL (`IP_TTL`) or an IPv6 hop limit (`IPV6_UNICAST_HOPS`) of
/// its own: the kernel keeps -1 in either while it has not.
#[inline(never)]
fn own_ttl(sk: *const c_void) -> bool {
    let [uc_ttl, pinet6, hop_word, hop_shift] = OWN_TTL_OFFSETS.load();
    let base = sk.cast::<u8>();
    // SAFETY: reads of the traced socket at offsets from this kernel's BTF; a failed read is
    // taken as no TTL of its own.
    unsafe {
        if bpf_probe_read_kernel(base.wrapping_add(uc_ttl as usize).cast::<i16>()).is_ok_and(|ttl| ttl != -1) {
            return true;
        }
        let Ok(v6) = bpf_probe_read_kernel(base.wrapping_add(pinet6 as usize).cast::<*const u8>()) else {
            return false;
        };
        !v6.is_null()
            && bpf_probe_read_kernel(v6.wrapping_add(hop_word as usize).cast::<i16>())
                .is_ok_and(|word| word.wrapping_shr(hop_shift) != -1)
    }
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

/// A handshake of `client` to `key` failed now, through a port with options `flags` (its
/// ejection settings) and a set of `backends` slots: counted in its entry (made if the map takes
/// it); its bucket's bit and the node's state set. An ejection takes a place in the port's
/// ledger, within the set's cap.
#[inline(never)]
fn fail(key: &OutlierKey, flags: u32, backends: u32, client: u32) {
    // SAFETY: no arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(entry) = lookup(key).or_else(|| create(key, now)) else {
        return;
    };
    let (service_id, cap) = (key.service_id, ejection_cap(backends));
    // SAFETY: a map value of this type, valid while the program runs. The run's count is added to
    // atomically: failures of one backend on two CPUs at once both count.
    let _ = unsafe {
        (*entry).fail_adding(
            now,
            EjectionSettings::of(flags),
            client,
            |failures| count::atomic_increment(ptr::from_mut(failures)),
            |until| admit(service_id, now, until, cap),
        )
    };
    if let Some(state) = OUTLIER_STATE.get_ptr_mut(0) {
        // SAFETY: the element of a one-entry array, valid while the program runs. Not atomic: a
        // bit another CPU sets in the same word at the same moment may be lost, and set again by
        // its backend's next failure.
        unsafe {
            (*state).flag(bucket_of(&key.backend.addr, key.backend.port));
            write_volatile(&raw mut (*state).active, 1);
        }
    }
}

/// A ledger with no ejection in force.
static EMPTY_LEDGER: OutlierLedger =
    OutlierLedger { lock: SpinLock { val: 0 }, _pad: 0, until_ns: [0; LEDGER_ENTRIES] };

/// A place in port `service_id`'s ledger for an ejection at `now` until `until`, if fewer than
/// `cap` are in force (then true); the ledger made if the map takes it, else refused.
#[inline(never)]
fn admit(service_id: u32, now: u64, until: u64, cap: u32) -> bool {
    let ledger = match OUTLIER_LEDGERS.get_ptr_mut(service_id) {
        Some(ledger) => ledger,
        None => {
            // NOEXIST: a CPU that lost the race to make it finds the winner's. From a constant: a
            // ledger on the stack would not fit beside the tracing program's frames.
            #[expect(clippy::needless_borrows_for_generic_args, reason = "by value, it would be copied to the stack")]
            let _ = OUTLIER_LEDGERS.insert(service_id, &EMPTY_LEDGER, BPF_NOEXIST.into());
            let Some(ledger) = OUTLIER_LEDGERS.get_ptr_mut(service_id) else {
                return false;
            };
            ledger
        }
    };
    // SAFETY: a map value of this type whose lock is its first field; held around a search that
    // makes no call, as the verifier requires.
    unsafe {
        let lock = (&raw mut (*ledger).lock).cast();
        bpf_spin_lock(lock);
        let admitted = (*ledger).admit(now, until, cap);
        bpf_spin_unlock(lock);
        admitted
    }
}

/// `key`'s entry, if it has one.
#[inline(always)]
fn lookup(key: &OutlierKey) -> Option<*mut OutlierEntry> {
    let map = ptr::from_ref(&OUTLIERS).cast_mut().cast::<c_void>();
    // SAFETY: `map` is a hash map of this object whose key and value types these are.
    let found = unsafe { bpf_map_lookup_elem(map, ptr::from_ref(key).cast_mut().cast()) }.cast::<OutlierEntry>();
    (!found.is_null()).then_some(found)
}

/// `key`'s entry, made if the map takes it: empty, but failing since `now`, so that the agent's
/// pruning of quiet entries, reading it before its failure is counted, keeps it.
#[inline(always)]
fn create(key: &OutlierKey, now: u64) -> Option<*mut OutlierEntry> {
    let map = ptr::from_ref(&OUTLIERS).cast_mut().cast::<c_void>();
    let zero = OutlierEntry { last_failure_ns: now, ..OutlierEntry::default() };
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
    let Some(entry) = lookup(&key_of(&pick.backend, family, pick.service.service_id)) else {
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
    if let Some(entry) = lookup(&key_of(&pick.backend, family, pick.service.service_id)) {
        // SAFETY: as in `probe`.
        unsafe { (*entry).attempt(now) };
    }
}

/// The search for a backend not ejected (a BPF subprogram, so its keys and loops take no room in
/// the connect hooks' own stack frame). The drawn backend, ejected, is kept if more than half of
/// [`SCAN_SLOTS`] slots from a random one are (the panic threshold: a set that shrank under its
/// ejections); else drawn again, up to [`REDRAWS`] times, then replaced by the first of those
/// slots not ejected — from a random slot, so the clients of a set with ejections spread over
/// the rest of it, not onto its first backend.
#[inline(never)]
fn redraw(pick: &mut Pick, family: u8, now: u64) {
    let Some(scan) = OUTLIER_SCAN.get_ptr_mut(0) else {
        return;
    };
    let (base, count, set_id, service_id) =
        (pick.service.base, pick.service.count, pick.service.set_id, pick.service.service_id);
    if count == 0 {
        return;
    }
    let start = (rng::random() as u32) % count;
    // SAFETY: this CPU's element of a one-entry per-CPU array, valid while the program runs
    // (nothing else runs on this CPU meanwhile: the hooks do not nest).
    unsafe { write_volatile(scan, OutlierScan { searched: 0, out: 0, first_in: u32::MAX, _pad: 0 }) };
    for step in 0..SCAN_SLOTS {
        if step >= count {
            break;
        }
        let offset = if start + step >= count { start + step - count } else { start + step };
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
            if ejected(&slot.primary, family, service_id, now) {
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
            Ok(backend) if !ejected(&backend, family, service_id, now) => {
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

/// Whether `backend` is ejected from port `service_id`'s set at `now`.
#[inline(never)]
fn ejected(backend: &Backend, family: u8, service_id: u32, now: u64) -> bool {
    // SAFETY: a map value of this type, read at once.
    lookup(&key_of(backend, family, service_id))
        .is_some_and(|entry| now < unsafe { read_volatile(&raw const (*entry).ejected_until_ns) })
}

/// `backend` of family `family` as port `service_id`'s ejections name it.
#[inline(always)]
fn key_of(backend: &Backend, family: u8, service_id: u32) -> OutlierKey {
    OutlierKey { backend: BackendKey { addr: backend.addr, port: backend.port, family, _pad: 0 }, service_id }
}
