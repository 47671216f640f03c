//! Backend choice: a weighted draw from the service's set (Walker's alias method), and
//! `sessionAffinity: ClientIP`, which keeps a client on the backend it got while it stays in the set.

use aya_ebpf::{EbpfContext as _, helpers::generated::bpf_get_netns_cookie, programs::SockAddrContext};
use topology_common::{
    Backend, ClientAffinityKey, ClientAffinityValue, ServiceCounters, ServiceOptions, ServiceValue, THRESHOLD_ONE,
    locality,
};

use crate::{
    count::count,
    gate::Clock,
    maps::{CLIENT_AFFINITY, SLOTS},
    rng::random,
    sockaddr::{self, Words},
};

/// Slots of a set searched for a client's kept backend after the set changed. A set with more
/// slots may make a client whose backend is beyond them choose again (never a wrong backend).
const AFFINITY_SCAN: u32 = 256;

/// Why a destination that is a service port could not be rewritten.
pub enum Error {
    /// The backend set is empty: refuse the connection.
    EmptySet { service_id: u32 },
    /// The slot drawn is out of range or belongs to another set.
    ForeignSlot { service_id: u32 },
}

impl Error {
    /// The service and the counter (index into `ServiceCounters`) the failure adds to.
    #[inline(always)]
    pub fn counter(&self) -> (u32, usize) {
        match *self {
            Self::EmptySet { service_id } => (service_id, ServiceCounters::REFUSED),
            Self::ForeignSlot { service_id } => (service_id, ServiceCounters::ERRORS),
        }
    }

    /// Fails the operation with the failure's errno; returns the program's verdict.
    #[inline(always)]
    pub fn verdict(&self) -> i32 {
        match self {
            Self::EmptySet { .. } => sockaddr::fail_with(sockaddr::ECONNREFUSED),
            Self::ForeignSlot { .. } => sockaddr::fail_with(sockaddr::ENETUNREACH),
        }
    }
}

/// A service port and the backend chosen for it.
pub struct Pick {
    /// The service entry the backend was chosen from.
    pub service: ServiceValue,
    /// The chosen backend.
    pub backend: Backend,
}

impl Pick {
    /// The backend's address as words (IPv4 in the first word).
    #[inline(always)]
    pub fn addr(&self) -> Words {
        sockaddr::words(&self.backend.addr)
    }

    /// The service and the counter (index into `ServiceCounters`) the rewrite adds to: the
    /// backend's locality class, written by userspace; out-of-range values count as "other".
    #[inline(always)]
    pub fn counter(&self) -> (u32, usize) {
        let class = usize::from(self.backend.locality);
        let class = if class < locality::CLASSES { class } else { usize::from(locality::OTHER) };
        (self.service.service_id, class)
    }
}

/// Chooses a backend for a connection to `service`, honouring its options.
#[inline(always)]
pub fn choose(
    ctx: &SockAddrContext,
    service: ServiceValue,
    options: &ServiceOptions,
    clock: &mut Clock,
) -> Result<Pick, Error> {
    if service.count == 0 {
        return Err(Error::EmptySet { service_id: service.service_id });
    }
    let backend = if options.affinity_timeout_s == 0 {
        draw(&service)?
    } else {
        keep_client(ctx, &service, options.affinity_timeout_s, clock)?
    };
    Ok(Pick { service, backend })
}

/// Draws a backend of a non-empty set by weight.
///
/// No retry: the agent reuses a set's slots only after an RCU grace period, so the slots of the
/// entry read here stay intact while this program runs. A slot tagged with another set (a map
/// edited by hand, a bug) fails the connection rather than sending it to a stranger's backend.
#[inline(always)]
pub fn draw(service: &ServiceValue) -> Result<Backend, Error> {
    let service_id = service.service_id;
    // One draw, two independent halves: the high one picks the slot, the low one the side.
    let draw = random();
    // Multiply-shift maps a uniform u32 onto 0..count without a division.
    let offset = (((draw >> 32) * u64::from(service.count)) >> 32) as u32;
    // An array lookup: the verifier inlines it as a bounds check and an address computation.
    let Some(slot) = SLOTS.get_ptr(service.base.wrapping_add(offset)) else {
        return Err(Error::ForeignSlot { service_id });
    };
    // SAFETY: the pointer points into the array's value area for the program's lifetime; the
    // fields are copied out at once.
    let slot = unsafe { &*slot };
    // Set id 0 marks a free slot (and an empty set's entry): never a set to draw from.
    if slot.set_id != service.set_id || slot.set_id == 0 {
        return Err(Error::ForeignSlot { service_id });
    }
    // The primary wins with probability threshold / 2^31: always at `THRESHOLD_ONE` (equal weights).
    Ok(if ((draw as u32) >> 1) < slot.threshold { slot.primary } else { slot.alias })
}

/// A backend of a non-empty set drawn uniformly, whatever the weights: a slot's primary (every
/// backend is the primary of exactly one slot of an alias table), for the second look of
/// [`crate::load::spill`]; `None` for a foreign slot.
#[inline(always)]
pub fn uniform(service: &ServiceValue) -> Option<Backend> {
    let offset = (((random() >> 32) * u64::from(service.count)) >> 32) as u32;
    let slot = SLOTS.get_ptr(service.base.wrapping_add(offset))?;
    // SAFETY: as in `draw`.
    let slot = unsafe { &*slot };
    (slot.set_id == service.set_id && slot.set_id != 0).then_some(slot.primary)
}

/// `sessionAffinity: ClientIP`: the backend this client (its network namespace) got last, if it
/// used it within `timeout_s` seconds and it is still in the set; else a fresh draw, remembered.
#[inline(always)]
fn keep_client(
    ctx: &SockAddrContext,
    service: &ServiceValue,
    timeout_s: u32,
    clock: &mut Clock,
) -> Result<Backend, Error> {
    // SAFETY: the helper accepts the sock_addr context.
    let netns = unsafe { bpf_get_netns_cookie(ctx.as_ptr()) };
    let key = ClientAffinityKey { netns, service_id: service.service_id, _pad: 0 };
    let now = clock.now();
    if let Some(kept) = CLIENT_AFFINITY.get_ptr_mut(key) {
        // SAFETY: the pointer came from a successful lookup and stays valid while this program
        // runs; a concurrent update from another CPU only makes the values racy, not invalid.
        let kept = unsafe { &mut *kept };
        let fresh = now.saturating_sub(kept.last_used_ns) <= u64::from(timeout_s) * 1_000_000_000;
        if fresh && (kept.set_id == service.set_id || in_set(service, &kept.backend)) {
            kept.set_id = service.set_id;
            kept.last_used_ns = now;
            return Ok(kept.backend);
        }
    }
    let backend = draw(service)?;
    let value = ClientAffinityValue { backend, set_id: service.set_id, last_used_ns: now };
    if CLIENT_AFFINITY.insert(key, value, 0).is_err() {
        // The rewrite stands; only the next connection of this client may choose differently.
        count(service.service_id, ServiceCounters::ERRORS);
    }
    Ok(backend)
}

/// Whether `backend` can be drawn from the service's current set (within the first
/// [`AFFINITY_SCAN`] slots).
#[inline(always)]
pub fn in_set(service: &ServiceValue, backend: &Backend) -> bool {
    for offset in 0..AFFINITY_SCAN {
        if offset >= service.count {
            break;
        }
        let Some(slot) = SLOTS.get_ptr(service.base.wrapping_add(offset)) else {
            return false;
        };
        // SAFETY: as in `draw`.
        let slot = unsafe { &*slot };
        if slot.set_id != service.set_id {
            return false;
        }
        let primary = slot.threshold > 0 && same(&slot.primary, backend);
        let alias = slot.threshold < THRESHOLD_ONE && same(&slot.alias, backend);
        if primary || alias {
            return true;
        }
    }
    false
}

/// Same address and port.
#[inline(always)]
pub fn same(a: &Backend, b: &Backend) -> bool {
    sockaddr::words(&a.addr) == sockaddr::words(&b.addr) && a.port == b.port
}
