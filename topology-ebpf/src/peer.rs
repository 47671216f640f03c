//! Whether a traced TCP socket is still connected where the connect hooks sent it: a socket whose
//! rewritten connect failed may connect again, to anything, and keeps its cookie and so its entry
//! in the TCP connections table. The socket's own peer (`skc_daddr` or `skc_v6_daddr`, and
//! `skc_dport`, at the offsets the agent found in the kernel's BTF) must be the entry's backend.

use core::ffi::c_void;

use aya_ebpf::Global;
use topology_common::{AF_INET, AF_INET6, BackendKey, SockTranslation};

use crate::{kernel::field, sockaddr};

/// Byte offsets in this kernel's `struct sock` of the peer's IPv4 address, IPv6 address and port
/// (`__sk_common.skc_daddr`, `skc_v6_daddr`, `skc_dport`), set by the agent at load. A zero port
/// offset: not found, and no socket is checked.
#[unsafe(no_mangle)]
static SKC_DADDR_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SKC_V6_DADDR_OFFSET: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static SKC_DPORT_OFFSET: Global<u32> = Global::new(0);

/// Whether the socket `sk` (a pointer the kernel typed as a socket) is connected to the backend
/// of `translation`; true when the offsets are unknown.
#[inline(always)]
pub fn is_backend(sk: *mut c_void, translation: &SockTranslation) -> bool {
    let port = SKC_DPORT_OFFSET.load() as usize;
    if port == 0 {
        return true;
    }
    // SAFETY: a u16 field (network order) of the socket the kernel passed, at its offset.
    if u16::from_be(unsafe { field::<u16>(sk, port) }) != translation.backend_port {
        return false;
    }
    let backend = sockaddr::words(&translation.backend);
    if translation.family == AF_INET {
        // SAFETY: as above, the u32 IPv4 address (IPv4-mapped peers of IPv6 sockets too).
        return unsafe { field::<u32>(sk, SKC_DADDR_OFFSET.load() as usize) } == backend[0];
    }
    let v6 = SKC_V6_DADDR_OFFSET.load() as usize;
    // SAFETY: as above, the four u32 words of the IPv6 address.
    unsafe {
        field::<u32>(sk, v6) == backend[0]
            && field::<u32>(sk, v6 + 4) == backend[1]
            && field::<u32>(sk, v6 + 8) == backend[2]
            && field::<u32>(sk, v6 + 12) == backend[3]
    }
}

/// The peer the socket `sk` (a pointer the kernel typed as a socket) is connected to, as the load
/// map keys it: an IPv4 peer, also of an IPv6 socket (IPv4-mapped), in the first four bytes. None
/// when the offsets are unknown.
#[inline(always)]
pub fn key(sk: *mut c_void) -> Option<BackendKey> {
    let port = SKC_DPORT_OFFSET.load() as usize;
    if port == 0 {
        return None;
    }
    let v6 = SKC_V6_DADDR_OFFSET.load() as usize;
    // SAFETY: fields of the socket the kernel passed, at their offsets: the port (network order)
    // and the four u32 words of the IPv6 address (zero on an IPv4 socket).
    let (port, words) = unsafe {
        (
            u16::from_be(field::<u16>(sk, port)),
            [field::<u32>(sk, v6), field::<u32>(sk, v6 + 4), field::<u32>(sk, v6 + 8), field::<u32>(sk, v6 + 12)],
        )
    };
    let mut addr = [0u8; 16];
    let family = if words[0] == 0 && words[1] == 0 && (words[2] == 0 || words[2] == sockaddr::MAPPED_MARKER) {
        // SAFETY: as above, the u32 IPv4 address.
        let v4 = unsafe { field::<u32>(sk, SKC_DADDR_OFFSET.load() as usize) };
        addr[..4].copy_from_slice(&v4.to_ne_bytes());
        AF_INET
    } else {
        for (i, word) in words.iter().enumerate() {
            addr[4 * i..4 * i + 4].copy_from_slice(&word.to_ne_bytes());
        }
        AF_INET6
    };
    Some(BackendKey { addr, port, family, _pad: 0 })
}
