//! Cross-zone accounting of UDP (`--byte-accounting all`, see `topology_common::bytes`): a UDP
//! socket keeps no byte counters, so its datagrams are counted one by one where the kernel
//! reports the length of each send and receive of a socket (`tp_btf/sock_send_length`,
//! `sock_recv_length`). Those run for every socket system call of the node: each leaves after one
//! load unless the socket is UDP, and a UDP socket without socket storage after one more.
//!
//! A connected socket's datagrams count against the translation its connect left in its storage.
//! An unconnected socket's are translated one by one by the send and receive hooks, inside the
//! same system call just before its length is reported: the hook leaves the datagram's key in a
//! per-CPU entry marked with the socket and the thread, which the tracepoint takes. A thread that
//! moves to another CPU inside its system call (a send that waits for buffer space) leaves its
//! datagram uncounted, and the entry stale until the same thread and socket send or receive on
//! that CPU again.

use core::{ffi::c_void, ptr};

use aya_ebpf::{
    EbpfContext as _, Global,
    helpers::generated::{bpf_get_current_pid_tgid, bpf_get_socket_cookie, bpf_sk_storage_get},
    macros::btf_tracepoint,
    programs::{BtfTracePointContext, SockAddrContext},
};
use topology_common::{Backend, ByteCount, DatagramBytes, IPPROTO_UDP, SockTranslation};

use crate::{
    bytes::{self, SK_COOKIE_OFFSET},
    kernel,
    maps::{SOCK_CONNECTIONS, UDP_LAST},
};

/// 1 when datagrams are counted (`--byte-accounting all`), set by the agent at load. At 0 the
/// send and receive hooks carry none of it: the verifier drops the branch.
#[unsafe(no_mangle)]
static UDP_BYTES: Global<u32> = Global::new(0);

/// Byte offset of `sk_protocol` in this kernel's `struct sock`, set by the agent at load from its
/// BTF (0: not found, the tracepoints are not loaded).
#[unsafe(no_mangle)]
static SK_PROTOCOL_OFFSET: Global<u32> = Global::new(0);

/// `MSG_PEEK`: a receive that leaves the datagram queued, to be received again.
const MSG_PEEK: i32 = 2;

/// A socket sent data: a datagram through a Service counts what was sent.
#[btf_tracepoint(function = "sock_send_length")]
pub fn bytes_sent(ctx: BtfTracePointContext) -> i32 {
    let length: i32 = ctx.arg(1);
    count(ctx.arg(0), DatagramBytes::SENT, length);
    0
}

/// A socket received data: a datagram through a Service counts what was received (a peek
/// counts nothing: the same datagram is received again).
#[btf_tracepoint(function = "sock_recv_length")]
pub fn bytes_received(ctx: BtfTracePointContext) -> i32 {
    let flags: i32 = ctx.arg(2);
    let length: i32 = if flags & MSG_PEEK != 0 { 0 } else { ctx.arg(1) };
    count(ctx.arg(0), DatagramBytes::RECEIVED, length);
    0
}

/// The send (`direction` [`DatagramBytes::SENT`]) or receive hook translated the datagram this
/// thread is moving on the context's unconnected socket, through the Service at `vip:vip_port`
/// of `family` and `backend`: left for the tracepoint that reports its length.
#[inline(always)]
pub fn translated(ctx: &SockAddrContext, direction: u32, family: u8, vip: [u8; 16], vip_port: u16, backend: &Backend) {
    if UDP_BYTES.load() == 0 {
        return;
    }
    let Some(last) = UDP_LAST.get_ptr_mut(direction) else {
        return;
    };
    // SAFETY: this CPU's element of the array, valid while the program runs; the helpers take
    // the hook's context as it is.
    unsafe {
        (*last).cookie = bpf_get_socket_cookie(ctx.as_ptr());
        (*last).thread = bpf_get_current_pid_tgid();
        (*last).key = SockTranslation {
            vip,
            backend: backend.addr,
            vip_port,
            backend_port: backend.port,
            family,
            proto: IPPROTO_UDP,
            flags: 0,
        };
    }
}

/// The socket `sk` moved `length` bytes in `direction` (0 or less: nothing, or an error): counted
/// if it is a UDP socket of ours and the datagram went through a Service.
#[inline(always)]
fn count(sk: *mut c_void, direction: u32, length: i32) {
    let (protocol, cookie) = (SK_PROTOCOL_OFFSET.load() as usize, SK_COOKIE_OFFSET.load() as usize);
    if sk.is_null() || protocol == 0 || cookie == 0 {
        return;
    }
    // SAFETY: a u16 field of the socket the kernel passed, at its offset.
    if unsafe { kernel::field::<u16>(sk, protocol) } != u16::from(IPPROTO_UDP) {
        return;
    }
    // SAFETY: as above, its u64 cookie, read rather than asked for (asking makes one). A socket
    // without one has no datagram pending (the hooks take the cookie of those they translate).
    let cookie: u64 = unsafe { kernel::field(sk, cookie) };
    let pending = if cookie == 0 { None } else { pending(direction, cookie) };
    let Some(key) = pending.or_else(|| connected(sk)) else {
        return;
    };
    let Ok(length) = u64::try_from(length) else {
        return;
    };
    let moved = if direction == DatagramBytes::SENT {
        ByteCount { to_backend: length, from_backend: 0 }
    } else {
        ByteCount { to_backend: 0, from_backend: length }
    };
    bytes::add(&key, &moved);
}

/// The key a hook left for this thread's datagram on the socket with `cookie`, taken.
#[inline(always)]
fn pending(direction: u32, cookie: u64) -> Option<SockTranslation> {
    let last = UDP_LAST.get_ptr_mut(direction)?;
    // SAFETY: this CPU's element of the array, valid while the program runs; no argument.
    unsafe {
        if (*last).cookie != cookie || (*last).thread != bpf_get_current_pid_tgid() {
            return None;
        }
        (*last).cookie = 0;
        Some((*last).key)
    }
}

/// The key of a connected UDP socket `sk` whose connect was rewritten.
#[inline(always)]
fn connected(sk: *mut c_void) -> Option<SockTranslation> {
    let map = ptr::from_ref(&SOCK_CONNECTIONS).cast_mut().cast::<c_void>();
    // SAFETY: `map` is a socket storage map of this object, `sk` the traced full socket; without
    // a value and flags nothing is created.
    let record = unsafe { bpf_sk_storage_get(map, sk, ptr::null_mut(), 0) }.cast::<SockTranslation>();
    if record.is_null() {
        return None;
    }
    // SAFETY: this socket's storage, valid while the program runs; copied out at once.
    let record = unsafe { *record };
    (record.family != 0 && record.proto == IPPROTO_UDP).then(|| record.bytes_key())
}
