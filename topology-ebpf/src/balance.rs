//! Service lookup and backend choice, the translation records that undo a rewrite, and counters.

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use topology_common::{
    AffinityKey, AffinityValue, Backend, RevNatKey, RevNatValue, ServiceKey4, ServiceKey6, ServiceValue, SlotKey,
    THRESHOLD_ONE, locality,
};

use crate::{
    maps::{AFFINITY, COUNTERS, REVNAT, SERVICES_V4, SERVICES_V6, SLOTS, SOCK_TRANSLATIONS, translation_slot},
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
    let key = ServiceKey4 { addr: addr.to_ne_bytes(), port, proto, _pad: 0 };
    SERVICES_V4.get_ptr(key).map(|value| {
        // SAFETY: the pointer came from a successful lookup; the value is copied out at once.
        unsafe { *value }
    })
}

/// The IPv6 service at `addr:port/proto`, if any.
#[inline(always)]
pub fn service6(addr: Words, port: u16, proto: u8) -> Option<ServiceValue> {
    let key = ServiceKey6 { addr: sockaddr::bytes(addr), port, proto, _pad: 0 };
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
        let key = SlotKey { set_id: service.set_id, index };
        if let Some(slot) = SLOTS.get_ptr(key) {
            // SAFETY: the pointer came from a successful lookup; fields are copied out at once.
            let slot = unsafe { &*slot };
            // A slot that always picks its primary (every slot, for equal weights) needs no
            // second draw; otherwise the primary wins with probability threshold / 2^31.
            let backend = if slot.threshold >= THRESHOLD_ONE || (sockaddr::random() >> 1) < slot.threshold {
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
pub fn choose_sticky(key: &AffinityKey, lookup: impl Fn() -> Option<ServiceValue>) -> Result<Option<Choice>, Error> {
    let Some(service) = lookup() else {
        return Ok(None);
    };
    if service.count == 0 {
        return Err(Error::EmptySet { service_id: service.service_id });
    }
    if let Some(kept) = AFFINITY.get_ptr(key) {
        // SAFETY: the pointer came from a successful lookup; fields are copied out at once.
        let kept = unsafe { &*kept };
        if kept.set_id == service.set_id {
            return Ok(Some(Choice { service, backend: kept.backend }));
        }
    }
    let choice = choose(lookup)?;
    if let Some(choice) = &choice {
        let value = AffinityValue { set_id: choice.service.set_id, backend: choice.backend };
        // A failed insert only costs stickiness for the next datagram; the rewrite stands.
        if AFFINITY.insert(key, value, 0).is_err() {
            count(choice.service.service_id, |c| c.errors += 1);
        }
    }
    Ok(choice)
}

/// Records, in the socket's translation slot, that this connected socket reaches `vip:port`
/// through the chosen backend (the lock-free protocol of `SockTranslation`).
#[inline(always)]
pub fn remember_connection(cookie: u64, family: u8, vip: Words, port: u16, choice: &Choice) {
    let Some(slot) = SOCK_TRANSLATIONS.get_ptr_mut(translation_slot(cookie)) else {
        // Unreachable: the mask keeps the index below the capacity.
        count(choice.service.service_id, |c| c.errors += 1);
        return;
    };
    // SAFETY: `slot` points into the array's value area for the program's lifetime. Volatile
    // writes keep the order: cookie cleared, fields, cookie set.
    unsafe {
        write_volatile(addr_of_mut!((*slot).cookie), 0);
        write_volatile(addr_of_mut!((*slot).vip), sockaddr::bytes(vip));
        write_volatile(addr_of_mut!((*slot).backend), choice.backend.addr);
        write_volatile(addr_of_mut!((*slot).vip_port), port);
        write_volatile(addr_of_mut!((*slot).backend_port), choice.backend.port);
        write_volatile(addr_of_mut!((*slot).family), family);
        write_volatile(addr_of_mut!((*slot).cookie), cookie);
    }
}

/// The ClusterIP and port this connected socket addressed, if its `connect()` was rewritten to
/// exactly `addr:port`.
#[inline(always)]
pub fn connection_translation(cookie: u64, family: u8, addr: Words, port: u16) -> Option<(Words, u16)> {
    let slot = SOCK_TRANSLATIONS.get_ptr(translation_slot(cookie))?;
    // SAFETY: as in `remember_connection`; reads mirror its write order.
    unsafe {
        if read_volatile(addr_of!((*slot).cookie)) != cookie {
            return None;
        }
        let vip = read_volatile(addr_of!((*slot).vip));
        let backend = read_volatile(addr_of!((*slot).backend));
        let vip_port = read_volatile(addr_of!((*slot).vip_port));
        let backend_port = read_volatile(addr_of!((*slot).backend_port));
        let slot_family = read_volatile(addr_of!((*slot).family));
        // A newer socket sharing the slot clears the cookie before touching the fields.
        if read_volatile(addr_of!((*slot).cookie)) != cookie {
            return None;
        }
        (slot_family == family && backend_port == port && sockaddr::words(&backend) == addr)
            .then(|| (sockaddr::words(&vip), vip_port))
    }
}

/// Records that this unconnected socket reached `vip:port` through the chosen backend, so replies
/// from it show the ClusterIP. An existing record is only looked up (refreshing its LRU
/// position): every datagram after the first costs no map update.
#[inline(always)]
pub fn remember_datagram(cookie: u64, family: u8, vip: Words, port: u16, choice: &Choice) {
    let key = RevNatKey { cookie, addr: choice.backend.addr, port: choice.backend.port, family, _pad: 0, _pad2: 0 };
    if REVNAT.get_ptr(key).is_some() {
        return;
    }
    let value = RevNatValue { vip: sockaddr::bytes(vip), port, _pad: 0 };
    if REVNAT.insert(key, value, 0).is_err() {
        count(choice.service.service_id, |c| c.errors += 1);
    }
}

/// The ClusterIP and port an unconnected socket addressed when it sent to `addr:port`.
#[inline(always)]
pub fn datagram_translation(cookie: u64, family: u8, addr: Words, port: u16) -> Option<(Words, u16)> {
    let key = RevNatKey { cookie, addr: sockaddr::bytes(addr), port, family, _pad: 0, _pad2: 0 };
    REVNAT.get_ptr(key).map(|value| {
        // SAFETY: as in `service4`.
        let value = unsafe { &*value };
        (sockaddr::words(&value.vip), value.port)
    })
}

/// Counts a rewrite to a backend of the given locality class.
#[inline(always)]
pub fn count_rewrite(choice: &Choice) {
    let class = usize::from(choice.backend.locality);
    count(choice.service.service_id, |c| {
        // The class comes from userspace; out-of-range values count as "other".
        let class = if class < locality::CLASSES { class } else { usize::from(locality::OTHER) };
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
