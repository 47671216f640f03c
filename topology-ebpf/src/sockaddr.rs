//! Reads and writes of the `bpf_sock_addr` context, and the few helpers the programs call.
//!
//! The verifier only accepts 4-byte accesses to `user_ip4`, `user_ip6[i]` and `user_port`, and LLVM
//! merges adjacent plain stores into 8-byte ones, so every access here is volatile and 32-bit wide.

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use aya_ebpf::{
    EbpfContext as _,
    helpers::generated::{bpf_set_retval, bpf_setsockopt},
    programs::SockAddrContext,
};

/// Program return value that lets the operation proceed.
pub const ALLOW: i32 = 1;
/// Program return value that fails the operation with the errno set by [`fail_with`].
pub const DENY: i32 = 0;

/// `ECONNREFUSED`: the service port has no usable backend.
pub const ECONNREFUSED: i32 = 111;
/// `ENETUNREACH`: the rewrite failed; the connection must not go to the unrewritten ClusterIP.
pub const ENETUNREACH: i32 = 101;

/// An address as four 32-bit words in network byte order; IPv4 uses the first word in the maps'
/// form and the last one in the IPv4-mapped form.
pub type Words = [u32; 4];

/// Destination IPv4 address as a network-byte-order word.
#[inline(always)]
pub fn ip4(ctx: &SockAddrContext) -> u32 {
    // SAFETY: the kernel passes a valid context for the program's lifetime.
    unsafe { read_volatile(addr_of!((*ctx.sock_addr).user_ip4)) }
}

/// Replaces the destination IPv4 address.
#[inline(always)]
pub fn set_ip4(ctx: &SockAddrContext, addr: u32) {
    // SAFETY: as in `ip4`; the field is writable for every hook these programs attach to.
    unsafe { write_volatile(addr_of_mut!((*ctx.sock_addr).user_ip4), addr) }
}

/// Destination IPv6 address.
#[inline(always)]
pub fn ip6(ctx: &SockAddrContext) -> Words {
    // SAFETY: as in `ip4`; four separate 32-bit loads of `user_ip6[0..4]`.
    unsafe {
        [
            read_volatile(addr_of!((*ctx.sock_addr).user_ip6[0])),
            read_volatile(addr_of!((*ctx.sock_addr).user_ip6[1])),
            read_volatile(addr_of!((*ctx.sock_addr).user_ip6[2])),
            read_volatile(addr_of!((*ctx.sock_addr).user_ip6[3])),
        ]
    }
}

/// Replaces the destination IPv6 address.
#[inline(always)]
pub fn set_ip6(ctx: &SockAddrContext, addr: Words) {
    // SAFETY: as in `set_ip4`; four separate 32-bit stores.
    unsafe {
        write_volatile(addr_of_mut!((*ctx.sock_addr).user_ip6[0]), addr[0]);
        write_volatile(addr_of_mut!((*ctx.sock_addr).user_ip6[1]), addr[1]);
        write_volatile(addr_of_mut!((*ctx.sock_addr).user_ip6[2]), addr[2]);
        write_volatile(addr_of_mut!((*ctx.sock_addr).user_ip6[3]), addr[3]);
    }
}

/// Destination port, host byte order.
#[inline(always)]
pub fn port(ctx: &SockAddrContext) -> u16 {
    // SAFETY: as in `ip4`. The port sits in the low 16 bits, in network byte order.
    let raw = unsafe { read_volatile(addr_of!((*ctx.sock_addr).user_port)) };
    u16::from_be(raw as u16)
}

/// Replaces the destination port.
#[inline(always)]
pub fn set_port(ctx: &SockAddrContext, port: u16) {
    // SAFETY: as in `set_ip4`.
    unsafe { write_volatile(addr_of_mut!((*ctx.sock_addr).user_port), u32::from(port.to_be())) }
}

/// `IPPROTO_MPTCP`: a multipath TCP socket, which the kernel falls back to TCP for.
const IPPROTO_MPTCP: u32 = 262;

/// IP protocol of the socket as the maps key it: TCP, UDP, SCTP ...; MPTCP is TCP (the services
/// maps know TCP ports); `None` for a number beyond a byte, which no service port has.
#[inline(always)]
pub fn protocol(ctx: &SockAddrContext) -> Option<u8> {
    // SAFETY: as in `ip4`.
    let protocol = unsafe { read_volatile(addr_of!((*ctx.sock_addr).protocol)) };
    match protocol {
        IPPROTO_MPTCP => Some(topology_common::IPPROTO_TCP),
        byte if byte <= 0xff => Some(byte as u8),
        _ => None,
    }
}

/// `SOL_TCP`.
const SOL_TCP: i32 = 6;
/// `TCP_BPF_SOCK_OPS_CB_FLAGS`: the socket's `sock_ops` callback flags (settable by
/// `bpf_setsockopt` since Linux 6.12).
const TCP_BPF_SOCK_OPS_CB_FLAGS: i32 = 1008;
/// The mark of a measured socket: `BPF_SOCK_OPS_RTO_CB_FLAG`, the callback flag whose callback
/// is rarest (a retransmission timeout), for sockets no `sock_ops` program of ours answers.
pub const MEASURED_MARK: i32 = 1;

/// Marks this TCP socket (it is being connected, so it has no callback flags yet) measured, for
/// the load signal to know it at its end (`crate::load`); false when the kernel does not allow it
/// here (before 6.12).
#[inline(always)]
pub fn mark_measured(ctx: &SockAddrContext) -> bool {
    let mut flags = MEASURED_MARK;
    // SAFETY: the helper accepts the sock_addr context of a connect hook; `flags` is a valid
    // int for the length given and outlives the call.
    let ret = unsafe {
        bpf_setsockopt(
            ctx.as_ptr(),
            SOL_TCP,
            TCP_BPF_SOCK_OPS_CB_FLAGS,
            core::ptr::from_mut(&mut flags).cast(),
            size_of::<i32>() as i32,
        )
    };
    ret == 0
}

/// Makes the syscall fail with `errno` once the program returns [`DENY`].
#[inline(always)]
pub fn fail_with(errno: i32) -> i32 {
    // SAFETY: cgroup programs may set the syscall's return value. It cannot fail for a
    // negative errno, so its result carries no information.
    unsafe { bpf_set_retval(-errno) };
    DENY
}

/// The second-to-last word of an IPv4-mapped address: bytes `00 00 ff ff`.
pub const MAPPED_MARKER: u32 = u32::from_ne_bytes([0, 0, 0xff, 0xff]);

/// The IPv4 address inside an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`).
#[inline(always)]
pub fn unmap_v4(addr: &Words) -> Option<u32> {
    (addr[0] == 0 && addr[1] == 0 && addr[2] == MAPPED_MARKER).then_some(addr[3])
}

/// `::ffff:a.b.c.d` for an IPv4 address.
#[inline(always)]
pub fn map_v4(addr: u32) -> Words {
    [0, 0, MAPPED_MARKER, addr]
}

/// An IPv4 address in the maps' 16-byte form: the address first, zeros after.
#[inline(always)]
pub fn widen_v4(addr: u32) -> Words {
    [addr, 0, 0, 0]
}

/// The maps' 16-byte address form as words.
#[inline(always)]
pub fn words(addr: &[u8; 16]) -> Words {
    // SAFETY: same size, every bit pattern valid; by-value copy has no alignment requirement.
    unsafe { core::mem::transmute::<[u8; 16], Words>(*addr) }
}

/// Words back in the maps' 16-byte address form.
#[inline(always)]
pub fn bytes(addr: Words) -> [u8; 16] {
    // SAFETY: as in `words`.
    unsafe { core::mem::transmute::<Words, [u8; 16]>(addr) }
}
