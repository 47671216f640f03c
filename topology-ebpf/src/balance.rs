//! Service lookup and backend choice, the translation records that undo a rewrite, and counters.

use aya_ebpf::programs::SockAddrContext;
use topology_common::{
    AffinityKey, AffinityValue, Backend, RevNatKey, RevNatValue, ServiceKey4, ServiceKey6,
    ServiceValue, SlotKey, SockOrigin, locality,
};

use crate::{
    maps::{AFFINITY, COUNTERS, REVNAT, SERVICES_V4, SERVICES_V6, SLOTS, SOCK_ORIGIN},
    sockaddr::{self, Words},
};

/// How often a backend choice re-reads the service after its slot vanished. A slot vanishes only
/// when the agent swapped the set and deleted the old generation between our two lookups, and each
/// retry reads the newest set, so a miss after this many rounds means the maps are inconsistent.
const CHOICE_ATTEMPTS: u32 = 4;

/// Why a destination that is a service port could not be rewritten.
pub enum Error {
    /// The backend set is empty: refuse the connection.
    EmptySet { service_id: u32 },
    /// The set's slots are missing after every retry.
    SlotMissing { service_id: u32 },
}

impl Error {
    /// Counts the failure and turns it into the program's verdict.
    #[inline(always)]
    pub fn verdict(self) -> i32 {
        match self {
            Self::EmptySet { service_id } => {
                count(service_id, |c| c.refused += 1);
                sockaddr::fail_with(sockaddr::ECONNREFUSED)
            }
            Self::SlotMissing { service_id } => {
                count(service_id, |c| c.errors += 1);
                sockaddr::fail_with(sockaddr::ENETUNREACH)
            }
        }
    }
}

/// A service port and the backend chosen for it.
pub struct Choice {
    /// The service entry the backend was chosen from.
    pub service: ServiceValue,
    /// The chosen backend.
    pub backend: Backend,
}

impl Choice {
    /// The backend's address as words (IPv4 in the first word).
    #[inline(always)]
    pub fn addr(&self) -> Words {
        sockaddr::words(&self.backend.addr)
    }
}

/// The IPv4 service at `addr:port/proto`, if any.
#[inline(always)]
pub fn service4(addr: u32, port: u16, proto: u8) -> Option<ServiceValue> {
    let key = ServiceKey4 {
        addr: addr.to_ne_bytes(),
        port,
        proto,
        _pad: 0,
    };
    SERVICES_V4.get_ptr(key).map(|value| {
        // SAFETY: the pointer came from a successful lookup; the value is copied out at once.
        unsafe { *value }
    })
}

/// The IPv6 service at `addr:port/proto`, if any.
#[inline(always)]
pub fn service6(addr: Words, port: u16, proto: u8) -> Option<ServiceValue> {
    let key = ServiceKey6 {
        addr: sockaddr::bytes(addr),
        port,
        proto,
        _pad: 0,
    };
    SERVICES_V6.get_ptr(key).map(|value| {
        // SAFETY: as in `service4`.
        unsafe { *value }
    })
}

/// Chooses a backend by weight. `Ok(None)`: the destination is not a service port.
#[inline(always)]
pub fn choose(lookup: impl Fn() -> Option<ServiceValue>) -> Result<Option<Choice>, Error> {
    let mut service_id = 0;
    for _ in 0..CHOICE_ATTEMPTS {
        let Some(service) = lookup() else {
            // Not a service, or deleted since the previous attempt: leave the destination alone.
            return Ok(None);
        };
        service_id = service.service_id;
        if service.count == 0 {
            return Err(Error::EmptySet { service_id });
        }
        // Multiply-shift maps a uniform u32 onto 0..count without a division.
        let index = ((u64::from(sockaddr::random()) * u64::from(service.count)) >> 32) as u32;
        let key = SlotKey {
            set_id: service.set_id,
            index,
        };
        if let Some(slot) = SLOTS.get_ptr(key) {
            // SAFETY: the pointer came from a successful lookup; fields are copied out at once.
            let slot = unsafe { &*slot };
            let draw = sockaddr::random() >> 1;
            // `threshold == THRESHOLD_ONE` always picks the primary: `draw` is below 2^31.
            let backend = if draw < slot.threshold {
                slot.primary
            } else {
                slot.alias
            };
            return Ok(Some(Choice { service, backend }));
        }
    }
    Err(Error::SlotMissing { service_id })
}

/// Like [`choose`], but an unconnected UDP socket keeps the backend it got first for as long as
/// the service's backend set is unchanged, so a resolver's retries reach the same server.
#[inline(always)]
pub fn choose_sticky(
    key: &AffinityKey,
    lookup: impl Fn() -> Option<ServiceValue>,
) -> Result<Option<Choice>, Error> {
    let Some(service) = lookup() else {
        return Ok(None);
    };
    if service.count == 0 {
        return Err(Error::EmptySet {
            service_id: service.service_id,
        });
    }
    if let Some(kept) = AFFINITY.get_ptr(key) {
        // SAFETY: the pointer came from a successful lookup; fields are copied out at once.
        let kept = unsafe { &*kept };
        if kept.set_id == service.set_id {
            return Ok(Some(Choice {
                service,
                backend: kept.backend,
            }));
        }
    }
    let choice = choose(lookup)?;
    if let Some(choice) = &choice {
        let value = AffinityValue {
            set_id: choice.service.set_id,
            backend: choice.backend,
        };
        // A failed insert only costs stickiness for the next datagram; the rewrite stands.
        if AFFINITY.insert(key, value, 0).is_err() {
            count(choice.service.service_id, |c| c.errors += 1);
        }
    }
    Ok(choice)
}

/// Remembers, for the reply path, that this socket sent to `backend` while addressing `vip:port`.
#[inline(always)]
pub fn remember_reply_source(cookie: u64, family: u8, vip: Words, port: u16, choice: &Choice) {
    let key = RevNatKey {
        cookie,
        addr: choice.backend.addr,
        port: choice.backend.port,
        family,
        _pad: 0,
        _pad2: 0,
    };
    // A lookup refreshes the LRU entry and is cheaper than an update on every datagram.
    if REVNAT.get_ptr(key).is_some() {
        return;
    }
    let value = RevNatValue {
        vip: sockaddr::bytes(vip),
        port,
        _pad: 0,
    };
    if REVNAT.insert(key, value, 0).is_err() {
        count(choice.service.service_id, |c| c.errors += 1);
    }
}

/// The service a reply from `addr:port` on this socket answers, if it was rewritten by sendmsg.
#[inline(always)]
pub fn reply_source(cookie: u64, family: u8, addr: Words, port: u16) -> Option<(Words, u16)> {
    let key = RevNatKey {
        cookie,
        addr: sockaddr::bytes(addr),
        port,
        family,
        _pad: 0,
        _pad2: 0,
    };
    REVNAT.get_ptr(key).map(|value| {
        // SAFETY: as in `service4`.
        let value = unsafe { &*value };
        (sockaddr::words(&value.vip), value.port)
    })
}

/// Records a connected socket's original destination in its socket storage.
#[inline(always)]
pub fn remember_origin(ctx: &SockAddrContext, family: u8, vip: Words, port: u16, choice: &Choice) {
    let mut origin = SockOrigin {
        vip: sockaddr::bytes(vip),
        backend: choice.backend.addr,
        vip_port: port,
        backend_port: choice.backend.port,
        family,
        _pad: [0; 3],
    };
    // SAFETY: `ctx` is the program's context; storage is created with `origin` as its value.
    let stored = unsafe { SOCK_ORIGIN.get_or_insert_ptr_mut(ctx, Some(&mut origin)) };
    if stored.is_null() {
        count(choice.service.service_id, |c| c.errors += 1);
        return;
    }
    // SAFETY: non-null storage of this socket; a re-connect overwrites the previous origin.
    unsafe { *stored = origin };
}

/// Drops the origin of a socket that re-connects to something that is not a service, so a later
/// `getpeername()` is not translated.
#[inline(always)]
pub fn forget_origin(ctx: &SockAddrContext) {
    // SAFETY: `ctx` is the program's context; lookup only, nothing is created.
    let stored = unsafe { SOCK_ORIGIN.get_ptr_mut(ctx) };
    if !stored.is_null() {
        // SAFETY: `sk` is the context's socket, valid for the program's lifetime.
        let sk = unsafe { (*ctx.sock_addr).__bindgen_anon_1.sk };
        // SAFETY: `sk` is a full socket owned by the kernel. A failed delete leaves an origin
        // that only matches this exact backend address, so there is nothing more to do.
        let _ = unsafe { SOCK_ORIGIN.delete(sk) };
    }
}

/// The ClusterIP and port this connected socket addressed, if its `connect()` was rewritten to
/// exactly `family` `addr:port`.
#[inline(always)]
pub fn origin_of(
    ctx: &SockAddrContext,
    family: u8,
    addr: Words,
    port: u16,
) -> Option<(Words, u16)> {
    // SAFETY: `ctx` is the program's context; lookup only.
    let stored = unsafe { SOCK_ORIGIN.get_ptr_mut(ctx) };
    if stored.is_null() {
        return None;
    }
    // SAFETY: non-null storage of this socket, read at once.
    let origin = unsafe { &*stored };
    (origin.family == family
        && origin.backend_port == port
        && sockaddr::words(&origin.backend) == addr)
        .then(|| (sockaddr::words(&origin.vip), origin.vip_port))
}

/// Counts a rewrite to a backend of the given locality class.
#[inline(always)]
pub fn count_rewrite(choice: &Choice) {
    let class = usize::from(choice.backend.locality);
    count(choice.service.service_id, |c| {
        // The class comes from userspace; out-of-range values count as "other".
        let class = if class < locality::CLASSES {
            class
        } else {
            usize::from(locality::OTHER)
        };
        c.rewritten[class] += 1;
    });
}

#[inline(always)]
fn count(service_id: u32, update: impl FnOnce(&mut topology_common::ServiceCounters)) {
    if let Some(counters) = COUNTERS.get_ptr_mut(service_id) {
        // SAFETY: this CPU's copy of the value; programs on one CPU do not run concurrently
        // with each other for the same map value except under preemption, where a lost increment
        // is acceptable for statistics.
        update(unsafe { &mut *counters });
    }
}
