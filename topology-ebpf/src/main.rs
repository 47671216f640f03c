//! Cgroup socket-address programs: a connection or datagram to a service port (ClusterIP, port,
//! protocol) is rewritten to a backend chosen by weight from the set the agent wrote for this node,
//! before a packet exists. Replies and `getpeername()` are translated back to the ClusterIP.
//! Every other destination passes untouched.
#![no_std]
#![no_main]

mod balance;
mod maps;
mod rng;
mod sockaddr;

use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};
use aya_log_ebpf::{debug, warn};
use balance::{Choice, Error};
use sockaddr::{ALLOW, Words};
use topology_common::{AF_INET, AF_INET6, AffinityKey, ServiceValue};

/// A destination as the maps see it: the family of the service (an IPv4-mapped address on an
/// AF_INET6 socket is an IPv4 service) and its address in the maps' 16-byte form.
#[derive(Clone, Copy)]
struct Dest {
    family: u8,
    addr: Words,
    port: u16,
}

impl Dest {
    /// The destination of an AF_INET context.
    #[inline(always)]
    fn of4(ctx: &SockAddrContext) -> Self {
        Self { family: AF_INET, addr: sockaddr::widen_v4(sockaddr::ip4(ctx)), port: sockaddr::port(ctx) }
    }

    /// The destination of an AF_INET6 context, native or IPv4-mapped.
    #[inline(always)]
    fn of6(ctx: &SockAddrContext) -> Self {
        let addr = sockaddr::ip6(ctx);
        let port = sockaddr::port(ctx);
        match sockaddr::unmap_v4(&addr) {
            Some(v4) => Self { family: AF_INET, addr: sockaddr::widen_v4(v4), port },
            None => Self { family: AF_INET6, addr, port },
        }
    }

    /// The service at this destination, if any.
    #[inline(always)]
    fn service(&self, proto: u8) -> Option<ServiceValue> {
        if self.family == AF_INET {
            balance::service4(self.addr[0], self.port, proto)
        } else {
            balance::service6(self.addr, self.port, proto)
        }
    }

    /// Writes `addr:port` (same family as `self`) into an AF_INET context.
    #[inline(always)]
    fn write4(ctx: &SockAddrContext, addr: Words, port: u16) {
        sockaddr::set_ip4(ctx, addr[0]);
        sockaddr::set_port(ctx, port);
    }

    /// Writes `addr:port` of `family` into an AF_INET6 context; IPv4 is written IPv4-mapped.
    #[inline(always)]
    fn write6(ctx: &SockAddrContext, family: u8, addr: Words, port: u16) {
        let addr = if family == AF_INET { sockaddr::map_v4(addr[0]) } else { addr };
        sockaddr::set_ip6(ctx, addr);
        sockaddr::set_port(ctx, port);
    }
}

#[cgroup_sock_addr(connect4)]
pub fn connect4(ctx: SockAddrContext) -> i32 {
    let outcome = connect(&ctx, Dest::of4(&ctx));
    if let Ok(Some(choice)) = &outcome {
        Dest::write4(&ctx, choice.addr(), choice.backend.port);
    }
    finish(&ctx, &outcome)
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    let dest = Dest::of6(&ctx);
    let outcome = connect(&ctx, dest);
    if let Ok(Some(choice)) = &outcome {
        Dest::write6(&ctx, dest.family, choice.addr(), choice.backend.port);
    }
    finish(&ctx, &outcome)
}

/// TCP and connected UDP: choose, and record the translation for `getpeername()` and replies.
#[inline(always)]
fn connect(ctx: &SockAddrContext, dest: Dest) -> Result<Option<Choice>, Error> {
    let Some(choice) = balance::choose(dest.service(sockaddr::protocol(ctx)))? else {
        return Ok(None);
    };
    balance::remember_connection(sockaddr::cookie(ctx), dest.family, dest.addr, dest.port, &choice);
    debug!(
        ctx,
        "connect {}:{} -> {:i}:{}", choice.service.service_id, dest.port, choice.backend.addr, choice.backend.port
    );
    Ok(Some(choice))
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sendmsg4(ctx: SockAddrContext) -> i32 {
    let outcome = send(&ctx, Dest::of4(&ctx));
    if let Ok(Some(choice)) = &outcome {
        Dest::write4(&ctx, choice.addr(), choice.backend.port);
    }
    finish(&ctx, &outcome)
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sendmsg6(ctx: SockAddrContext) -> i32 {
    let dest = Dest::of6(&ctx);
    let outcome = send(&ctx, dest);
    if let Ok(Some(choice)) = &outcome {
        Dest::write6(&ctx, dest.family, choice.addr(), choice.backend.port);
    }
    finish(&ctx, &outcome)
}

/// Unconnected UDP: choose with per-socket affinity, and record the reverse translation.
#[inline(always)]
fn send(ctx: &SockAddrContext, dest: Dest) -> Result<Option<Choice>, Error> {
    let proto = sockaddr::protocol(ctx);
    let cookie = sockaddr::cookie(ctx);
    let key =
        AffinityKey { cookie, vip: sockaddr::bytes(dest.addr), port: dest.port, proto, family: dest.family, _pad: 0 };
    let Some(choice) = balance::choose_sticky(&key, dest.service(proto))? else {
        return Ok(None);
    };
    balance::remember_datagram(cookie, dest.family, dest.addr, dest.port, &choice);
    Ok(Some(choice))
}

#[cgroup_sock_addr(recvmsg4)]
pub fn recvmsg4(ctx: SockAddrContext) -> i32 {
    let source = Dest::of4(&ctx);
    if let Some((vip, port)) = original(&ctx, source) {
        Dest::write4(&ctx, vip, port);
    }
    // recvmsg hooks cannot fail the call.
    ALLOW
}

#[cgroup_sock_addr(recvmsg6)]
pub fn recvmsg6(ctx: SockAddrContext) -> i32 {
    let source = Dest::of6(&ctx);
    if let Some((vip, port)) = original(&ctx, source) {
        Dest::write6(&ctx, source.family, vip, port);
    }
    ALLOW
}

#[cgroup_sock_addr(getpeername4)]
pub fn getpeername4(ctx: SockAddrContext) -> i32 {
    let peer = Dest::of4(&ctx);
    if let Some((vip, port)) =
        balance::connection_translation(sockaddr::cookie(&ctx), peer.family, peer.addr, peer.port)
    {
        Dest::write4(&ctx, vip, port);
    }
    // getpeername hooks cannot fail the call.
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn getpeername6(ctx: SockAddrContext) -> i32 {
    let peer = Dest::of6(&ctx);
    if let Some((vip, port)) =
        balance::connection_translation(sockaddr::cookie(&ctx), peer.family, peer.addr, peer.port)
    {
        Dest::write6(&ctx, peer.family, vip, port);
    }
    ALLOW
}

/// The ClusterIP and port a datagram's source stands for on this socket: a connected socket's
/// translation, else an unconnected socket's.
#[inline(always)]
fn original(ctx: &SockAddrContext, source: Dest) -> Option<(Words, u16)> {
    let cookie = sockaddr::cookie(ctx);
    balance::connection_translation(cookie, source.family, source.addr, source.port)
        .or_else(|| balance::datagram_translation(cookie, source.family, source.addr, source.port))
}

/// Counts a rewrite or a failure, and turns it into the program's return value. Every outcome
/// goes through the one counter update here, so each program carries a single copy of it.
#[inline(always)]
fn finish(ctx: &SockAddrContext, outcome: &Result<Option<Choice>, Error>) -> i32 {
    let (counter, verdict) = match outcome {
        Ok(None) => return ALLOW,
        Ok(Some(choice)) => (choice.counter(), ALLOW),
        Err(error) => {
            if let Error::ForeignSlot { service_id } = error {
                warn!(ctx, "service {}: the slot drawn belongs to another set", *service_id);
            }
            (error.counter(), error.verdict())
        }
    };
    balance::count(counter.0, counter.1);
    verdict
}

// On the host (clippy, the library target's build) a dependency links std, which has its own.
#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // The verifier rejects any reachable panic, so this is never entered at run time.
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
