//! Service lookup and backend choice, the translation records that undo a rewrite, and counters.

use core::ptr::{addr_of, addr_of_mut, read_volatile, write_volatile};

use topology_common::{
    AffinityKey, AffinityValue, Backend, COUNTER_CHUNK, RevNatKey, RevNatValue, ServiceCounters, ServiceKey4,
    ServiceKey6, ServiceValue,
    index::{self, EMPTY, MAX_PROBE, USED},
    locality,
};

use crate::{
    maps::{
        AFFINITY, COUNTERS, INDEX_V4, INDEX_V6, REVNAT, SERVICES_V4, SERVICES_V6, SLOTS, SOCK_TRANSLATIONS,
        index_v4_position, index_v6_position, translation_slot,
    },
    rng::random,
    sockaddr::{self, Words},
};

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

    /// The service and the counter (index into `ServiceCounters`) the rewrite adds to: the
    /// backend's locality class, written by userspace; out-of-range values count as "other".
    #[inline(always)]
    pub fn counter(&self) -> (u32, usize) {
        let class = usize::from(self.backend.locality);
        let class = if class < locality::CLASSES { class } else { usize::from(locality::OTHER) };
        (self.service.service_id, class)
    }
}

/// What the service index says about a destination.
enum Indexed {
    /// The service entry.
    Found(ServiceValue),
    /// No service port here.
    Absent,
    /// The index cannot tell (a position being rewritten, or a full probe window): ask the
    /// services hash map, which is the authority.
    Unsure,
}

/// The IPv4 service at `addr:port/proto`, if any: from the index, else the hash map.
#[inline(always)]
pub fn service4(addr: u32, port: u16, proto: u8) -> Option<ServiceValue> {
    let bits = index::key_bits4(addr, port, proto);
    match probe4(bits) {
        Indexed::Found(value) => return Some(value),
        Indexed::Absent => return None,
        Indexed::Unsure => {}
    }
    let key = ServiceKey4 { addr: addr.to_ne_bytes(), port, proto, _pad: 0 };
    SERVICES_V4.get_ptr(key).map(|value| {
        // SAFETY: the pointer came from a successful lookup; the value is copied out at once.
        unsafe { *value }
    })
}

/// The IPv6 service at `addr:port/proto`, if any: from the index, else the hash map.
#[inline(always)]
pub fn service6(addr: Words, port: u16, proto: u8) -> Option<ServiceValue> {
    match probe6(addr, port, proto) {
        Indexed::Found(value) => return Some(value),
        Indexed::Absent => return None,
        Indexed::Unsure => {}
    }
    let key = ServiceKey6 { addr: sockaddr::bytes(addr), port, proto, _pad: 0 };
    SERVICES_V6.get_ptr(key).map(|value| {
        // SAFETY: as in `service4`.
        unsafe { *value }
    })
}

/// Looks an IPv4 key word up in the index (the read side of the protocol in
/// `topology_common::index`: `seq`, the fields, `seq` again, all as volatile loads in this order).
#[inline(always)]
fn probe4(bits: u64) -> Indexed {
    let hash = index::hash4(bits);
    for i in 0..MAX_PROBE {
        let Some(entry) = INDEX_V4.get_ptr(index_v4_position(hash, i)) else {
            return Indexed::Unsure;
        };
        // SAFETY: `entry` points into the array's value area for the program's lifetime; the
        // key is 8-byte aligned (asserted in topology-common) and read as one word.
        let (seq, state, key, value, again) = unsafe {
            let seq = read_volatile(addr_of!((*entry).seq));
            let state = read_volatile(addr_of!((*entry).state));
            let key = read_volatile(addr_of!((*entry).key).cast::<u64>());
            let value = load_value(addr_of!((*entry).value));
            (seq, state, key, value, read_volatile(addr_of!((*entry).seq)))
        };
        if seq != again || seq & 1 != 0 {
            return Indexed::Unsure;
        }
        if state == EMPTY {
            return Indexed::Absent;
        }
        if state == USED && key == bits {
            return Indexed::Found(value);
        }
    }
    Indexed::Unsure
}

/// Looks an IPv6 service port up in the index, as [`probe4`] does.
#[inline(always)]
fn probe6(addr: Words, port: u16, proto: u8) -> Indexed {
    let hash = index::hash6(addr, port, proto);
    // The key's last word: port, protocol and the zero pad, as laid out in `ServiceKey6`.
    let tail = u32::from_ne_bytes({
        let port = port.to_ne_bytes();
        [port[0], port[1], proto, 0]
    });
    for i in 0..MAX_PROBE {
        let Some(entry) = INDEX_V6.get_ptr(index_v6_position(hash, i)) else {
            return Indexed::Unsure;
        };
        // SAFETY: as in `probe4`; the key is 4-byte aligned and read as five words.
        let (seq, state, key, key_tail, value, again) = unsafe {
            let seq = read_volatile(addr_of!((*entry).seq));
            let state = read_volatile(addr_of!((*entry).state));
            let key = load_words(addr_of!((*entry).key.addr));
            let key_tail = read_volatile(addr_of!((*entry).key.port).cast::<u32>());
            let value = load_value(addr_of!((*entry).value));
            (seq, state, key, key_tail, value, read_volatile(addr_of!((*entry).seq)))
        };
        if seq != again || seq & 1 != 0 {
            return Indexed::Unsure;
        }
        if state == EMPTY {
            return Indexed::Absent;
        }
        if state == USED && key == addr && key_tail == tail {
            return Indexed::Found(value);
        }
    }
    Indexed::Unsure
}

/// Loads a service entry as four 32-bit volatile reads.
///
/// # Safety
/// `src` must be valid for reads.
#[inline(always)]
unsafe fn load_value(src: *const ServiceValue) -> ServiceValue {
    // SAFETY: the caller guarantees `src` is readable; the fields are 4-byte aligned.
    unsafe {
        ServiceValue {
            service_id: read_volatile(addr_of!((*src).service_id)),
            set_id: read_volatile(addr_of!((*src).set_id)),
            count: read_volatile(addr_of!((*src).count)),
            base: read_volatile(addr_of!((*src).base)),
        }
    }
}

/// Chooses a backend by weight. `Ok(None)`: the destination is not a service port.
///
/// No retry: the agent reuses a set's slots only after an RCU grace period, so the slots of the
/// entry read here stay intact while this program runs. A slot tagged with another set (a map
/// edited by hand, a bug) fails the connection rather than sending it to a stranger's backend.
#[inline(always)]
pub fn choose(service: Option<ServiceValue>) -> Result<Option<Choice>, Error> {
    let Some(service) = service else {
        return Ok(None);
    };
    let service_id = service.service_id;
    if service.count == 0 {
        return Err(Error::EmptySet { service_id });
    }
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
    if slot.set_id != service.set_id {
        return Err(Error::ForeignSlot { service_id });
    }
    // The primary wins with probability threshold / 2^31: always at `THRESHOLD_ONE` (equal weights).
    let backend = if ((draw as u32) >> 1) < slot.threshold { slot.primary } else { slot.alias };
    Ok(Some(Choice { service, backend }))
}

/// Like [`choose`], but an unconnected UDP socket keeps the backend it got first for as long as
/// the service's backend set is unchanged, so a resolver's retries reach the same server.
#[inline(always)]
pub fn choose_sticky(key: &AffinityKey, service: Option<ServiceValue>) -> Result<Option<Choice>, Error> {
    let Some(service) = service else {
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
    let choice = choose(Some(service))?;
    if let Some(choice) = &choice {
        let value = AffinityValue { set_id: choice.service.set_id, backend: choice.backend };
        // A failed insert only costs stickiness for the next datagram; the rewrite stands.
        if AFFINITY.insert(key, value, 0).is_err() {
            count(choice.service.service_id, ServiceCounters::ERRORS);
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
        return;
    };
    // SAFETY: `slot` points into the array's value area for the program's lifetime. Volatile
    // writes keep the order: cookie cleared, fields, cookie set.
    unsafe {
        write_volatile(addr_of_mut!((*slot).cookie), 0);
        store_words(addr_of_mut!((*slot).vip), vip);
        store_words(addr_of_mut!((*slot).backend), choice.addr());
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
        let vip = load_words(addr_of!((*slot).vip));
        let backend = load_words(addr_of!((*slot).backend));
        let vip_port = read_volatile(addr_of!((*slot).vip_port));
        let backend_port = read_volatile(addr_of!((*slot).backend_port));
        let slot_family = read_volatile(addr_of!((*slot).family));
        // A newer socket sharing the slot clears the cookie before touching the fields.
        if read_volatile(addr_of!((*slot).cookie)) != cookie {
            return None;
        }
        (slot_family == family && backend_port == port && backend == addr).then_some((vip, vip_port))
    }
}

/// Stores an address as four 32-bit volatile writes (a `[u8; 16]` volatile write compiles to
/// sixteen byte stores).
///
/// # Safety
/// `dst` must be valid for writes and 4-byte aligned.
#[inline(always)]
unsafe fn store_words(dst: *mut [u8; 16], src: Words) {
    let dst = dst.cast::<u32>();
    // SAFETY: the caller guarantees `dst` covers 16 writable, 4-byte aligned bytes.
    unsafe {
        write_volatile(dst, src[0]);
        write_volatile(dst.add(1), src[1]);
        write_volatile(dst.add(2), src[2]);
        write_volatile(dst.add(3), src[3]);
    }
}

/// Loads an address as four 32-bit volatile reads.
///
/// # Safety
/// `src` must be valid for reads and 4-byte aligned.
#[inline(always)]
unsafe fn load_words(src: *const [u8; 16]) -> Words {
    let src = src.cast::<u32>();
    // SAFETY: the caller guarantees `src` covers 16 readable, 4-byte aligned bytes.
    unsafe { [read_volatile(src), read_volatile(src.add(1)), read_volatile(src.add(2)), read_volatile(src.add(3))] }
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
        count(choice.service.service_id, ServiceCounters::ERRORS);
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

/// Adds one to counter `index` (see `ServiceCounters::FIELDS`) of a service on this CPU.
#[inline(always)]
pub fn count(service_id: u32, index: usize) {
    // A chunk the agent has not created (never the case for an id in a service entry) counts nothing.
    let Some(counters) = COUNTERS.get_value_ptr_mut(service_id / COUNTER_CHUNK, &(service_id % COUNTER_CHUNK)) else {
        return;
    };
    let counters = counters.cast::<[u64; ServiceCounters::FIELDS]>();
    if index < ServiceCounters::FIELDS {
        // SAFETY: this CPU's copy of the value, which is `FIELDS` u64s (asserted in
        // topology-common). Programs on one CPU run one at a time except under preemption, where
        // a lost increment is acceptable for statistics.
        unsafe { (*counters)[index] += 1 };
    }
}
