//! Cgroup socket-address programs: a connection or datagram to a service port (ClusterIP, port,
//! protocol) is rewritten to a backend chosen by weight from the set the agent wrote for this node,
//! before a packet exists. Replies and `getpeername()` are translated back to the ClusterIP.
//! Every other destination passes untouched.
#![no_std]
#![no_main]
// Load-acquire (the `acquire` object) and atomic adds (the load counters) are intrinsics on BPF.
#![cfg_attr(any(feature = "acquire", target_arch = "bpf"), feature(core_intrinsics))]
#![cfg_attr(any(feature = "acquire", target_arch = "bpf"), allow(internal_features))]

mod bytes;
mod choose;
mod closed;
mod count;
mod datagrams;
mod gate;
mod iter;
mod kernel;
mod load;
mod lookup;
mod maps;
mod order;
mod outlier;
mod peer;
mod record;
mod rng;
mod sockaddr;

use aya_ebpf::{macros::cgroup_sock_addr, programs::SockAddrContext};
use aya_log_ebpf::{debug, warn};
use choose::{Error, Pick};
use gate::{Clock, Gate};
use record::Addressed;
use sockaddr::{ALLOW, Words};
use topology_common::{
    AF_INET, AF_INET6, DatagramBytes, IPPROTO_TCP, IPPROTO_UDP, NodeCounters, ServiceRanges, ServiceValue,
    service_flags,
};

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
            lookup::service4(self.addr[0], self.port, proto)
        } else {
            lookup::service6(self.addr, self.port, proto)
        }
    }

    /// The service at this destination, already found in the service ranges, if any.
    #[inline(always)]
    fn service_in_ranges(&self, proto: u8) -> Option<ServiceValue> {
        if self.family == AF_INET {
            lookup::service4_in_ranges(self.addr[0], self.port, proto)
        } else {
            lookup::service6_in_ranges(self.addr, self.port, proto)
        }
    }

    /// This destination as a socket's records name it.
    #[inline(always)]
    fn addressed(&self, proto: u8) -> Addressed {
        Addressed { family: self.family, vip: self.addr, port: self.port, proto }
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
    if maps::in_service_ranges(|ranges| ranges.may_hold_v4(sockaddr::ip4(&ctx))) {
        core::hint::cold_path();
        return rewrite4(&ctx, connect(&ctx, Dest::of4(&ctx)));
    }
    not_a_service(&ctx)
}

#[cgroup_sock_addr(connect6)]
pub fn connect6(ctx: SockAddrContext) -> i32 {
    if maps::in_service_ranges(|ranges| may_hold6(ranges, &sockaddr::ip6(&ctx))) {
        core::hint::cold_path();
        let dest = Dest::of6(&ctx);
        return rewrite6(&ctx, dest.family, connect(&ctx, dest));
    }
    not_a_service(&ctx)
}

/// What a hook decided for a destination in the service ranges: a backend to write over it,
/// nothing (pass it untouched), or an error (fail open, counted).
type Outcome = Result<Option<Pick>, Error>;

/// An AF_INET hook's destination in the service ranges, once connect or send decided: the
/// choice is written over it. This path is laid out after the destination elsewhere (`cold_path`
/// at the branch: a layout hint, not a claim about which is more common), so that one runs a
/// few contiguous instructions and not across this one's cache lines, cold after a handshake;
/// inline, not a subprogram, whose call and separate image would cost this path.
#[inline(always)]
fn rewrite4(ctx: &SockAddrContext, outcome: Outcome) -> i32 {
    if let Ok(Some(choice)) = &outcome {
        Dest::write4(ctx, choice.addr(), choice.backend.port);
    }
    finish(ctx, &outcome)
}

/// An AF_INET6 hook's destination in the service ranges, of `family` (IPv4 is written back
/// IPv4-mapped), as [`rewrite4`].
#[inline(always)]
fn rewrite6(ctx: &SockAddrContext, family: u8, outcome: Outcome) -> i32 {
    if let Ok(Some(choice)) = &outcome {
        Dest::write6(ctx, family, choice.addr(), choice.backend.port);
    }
    finish(ctx, &outcome)
}

/// Whether `ranges` may hold an AF_INET6 destination, an IPv4-mapped one as IPv4.
#[inline(always)]
fn may_hold6(ranges: &ServiceRanges, addr: &Words) -> bool {
    match sockaddr::unmap_v4(addr) {
        Some(v4) => ranges.may_hold_v4(v4),
        None => ranges.may_hold_v6(addr),
    }
}

/// A connect outside the service ranges passes; a UDP socket may connect again, and what it
/// connected to before is no longer its peer.
#[inline(always)]
fn not_a_service(ctx: &SockAddrContext) -> i32 {
    if sockaddr::protocol(ctx) == Some(IPPROTO_UDP) {
        record::forget_connection(ctx);
    }
    ALLOW
}

/// TCP and connected UDP to a destination in the service ranges: choose, and record the
/// translation for `getpeername()` and replies.
#[inline(always)]
fn connect(ctx: &SockAddrContext, dest: Dest) -> Outcome {
    let Some(proto) = sockaddr::protocol(ctx) else {
        return Ok(None);
    };
    let Some(service) = dest.service_in_ranges(proto) else {
        if proto == IPPROTO_UDP {
            // A UDP socket may connect again; what it connected to before is no longer its peer.
            record::forget_connection(ctx);
        }
        return Ok(None);
    };
    let mut clock = Clock::new();
    let Gate::Rewrite(options) = gate::admit(&service, &mut clock) else {
        return Ok(None);
    };
    let mut choice = choose::choose(ctx, service, &options, &mut clock)?;
    // A client kept on its backend (session affinity) keeps it.
    if proto == IPPROTO_TCP && options.affinity_timeout_s == 0 {
        let spill_at = options.flags >> service_flags::SPILL_SHIFT & service_flags::SPILL_MASK;
        if spill_at != 0 {
            load::spill(&mut choice, dest.family, spill_at);
        }
        // A port may turn ejection off.
        if options.flags & service_flags::OUTLIER_OFF == 0 {
            outlier::avoid(&mut choice, dest.family);
        }
    }
    let measured = options.flags & service_flags::MEASURED != 0;
    if !record::remember_connection(ctx, &dest.addressed(proto), &choice, measured) {
        count::count_node(NodeCounters::NO_STORAGE);
    }
    log_connect(ctx, choice.service.service_id, dest.port, &choice.backend);
    Ok(Some(choice))
}

/// The kernel log's line for a rewritten connection: a function of its own (a BPF subprogram),
/// so its record's room is not in the connect hooks' stack frame, near the limit already.
#[inline(never)]
fn log_connect(ctx: &SockAddrContext, service_id: u32, port: u16, backend: &topology_common::Backend) {
    debug!(ctx, "connect {}:{} -> {:i}:{}", service_id, port, backend.addr, backend.port);
}

#[cgroup_sock_addr(sendmsg4)]
pub fn sendmsg4(ctx: SockAddrContext) -> i32 {
    if maps::in_service_ranges(|ranges| ranges.may_hold_v4(sockaddr::ip4(&ctx))) {
        core::hint::cold_path();
        return rewrite4(&ctx, send(&ctx, Dest::of4(&ctx)));
    }
    ALLOW
}

#[cgroup_sock_addr(sendmsg6)]
pub fn sendmsg6(ctx: SockAddrContext) -> i32 {
    if maps::in_service_ranges(|ranges| may_hold6(ranges, &sockaddr::ip6(&ctx))) {
        core::hint::cold_path();
        let dest = Dest::of6(&ctx);
        return rewrite6(&ctx, dest.family, send(&ctx, dest));
    }
    ALLOW
}

/// Unconnected UDP to a destination in the service ranges: the backend this socket keeps for the
/// service while its set is unchanged, else a new choice; the socket's record also translates
/// the replies.
#[inline(always)]
fn send(ctx: &SockAddrContext, dest: Dest) -> Outcome {
    let Some(proto) = sockaddr::protocol(ctx) else {
        return Ok(None);
    };
    let Some(service) = dest.service_in_ranges(proto) else {
        return Ok(None);
    };
    let mut clock = Clock::new();
    let Gate::Rewrite(options) = gate::admit(&service, &mut clock) else {
        return Ok(None);
    };
    if service.count == 0 {
        return Err(Error::EmptySet { service_id: service.service_id });
    }
    let to = dest.addressed(proto);
    let choice = datagram_choice(ctx, service, &options, &mut clock, &to)?;
    // Its bytes count there (with `--byte-accounting all`).
    datagrams::translated(ctx, DatagramBytes::SENT, to.family, sockaddr::bytes(to.vip), to.port, &choice.backend);
    Ok(Some(choice))
}

/// The backend of an unconnected socket's datagram to the service at `to`: the one the socket
/// keeps for it while its set is unchanged, else a new choice, kept.
#[inline(always)]
fn datagram_choice(
    ctx: &SockAddrContext,
    service: ServiceValue,
    options: &topology_common::ServiceOptions,
    clock: &mut Clock,
    to: &Addressed,
) -> Result<Pick, Error> {
    let peers = record::datagram_peers(ctx, true);
    if peers.is_null() {
        count::count_node(NodeCounters::NO_STORAGE);
        return choose::choose(ctx, service, options, clock);
    }
    // SAFETY: non-null storage of this socket, valid for the program's lifetime; only this
    // socket's own system calls touch it.
    let peers = unsafe { &mut *peers };
    let entry = record::find_service(peers, to);
    if let Some(index) = entry
        && let Some(peer) = peers.peers.get(index)
        && peer.set_id == service.set_id
    {
        return Ok(Pick { service, backend: peer.backend });
    }
    let choice = choose::choose(ctx, service, options, clock)?;
    record::keep_datagram_peer(peers, entry, to, &choice);
    Ok(choice)
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
    let tcp = sockaddr::protocol(&ctx) == Some(IPPROTO_TCP);
    if let Some((vip, port)) = record::connection_translation(&ctx, peer.family, peer.addr, peer.port, tcp) {
        Dest::write4(&ctx, vip, port);
    }
    // getpeername hooks cannot fail the call.
    ALLOW
}

#[cgroup_sock_addr(getpeername6)]
pub fn getpeername6(ctx: SockAddrContext) -> i32 {
    let peer = Dest::of6(&ctx);
    let tcp = sockaddr::protocol(&ctx) == Some(IPPROTO_TCP);
    if let Some((vip, port)) = record::connection_translation(&ctx, peer.family, peer.addr, peer.port, tcp) {
        Dest::write6(&ctx, peer.family, vip, port);
    }
    ALLOW
}

/// The ClusterIP and port a datagram's source stands for on this socket: a connected socket's
/// translation, else an unconnected socket's while the backend is still in the service's set (a
/// departed backend's address may be another pod's by now; kube-proxy flushes its conntrack
/// entries for the same reason).
#[inline(always)]
fn original(ctx: &SockAddrContext, source: Dest) -> Option<(Words, u16)> {
    if let Some(translation) = record::connection_translation(ctx, source.family, source.addr, source.port, false) {
        return Some(translation);
    }
    let peer = record::datagram_peer(ctx, source.family, source.addr, source.port)?;
    let vip = Dest { family: peer.family, addr: sockaddr::words(&peer.vip), port: peer.vip_port };
    let service = vip.service(IPPROTO_UDP)?;
    if service.set_id != peer.set_id && !choose::in_set(&service, &peer.backend) {
        return None;
    }
    datagrams::translated(ctx, DatagramBytes::RECEIVED, peer.family, peer.vip, peer.vip_port, &peer.backend);
    Some((vip.addr, vip.port))
}

/// Counts a rewrite or a failure, and turns it into the program's return value. Every outcome
/// goes through the one counter update here, so each program carries a single copy of it.
#[inline(always)]
fn finish(ctx: &SockAddrContext, outcome: &Outcome) -> i32 {
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
    count::count(counter.0, counter.1);
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
