//! Finding the service at a destination: none outside the service ranges (no lookup at all), else
//! the service index first, the hash maps when the index is unsure or turned off (see
//! `topology_common::index`).

use core::ptr::addr_of;

use topology_common::{
    ServiceKey4, ServiceKey6, ServiceValue,
    index::{self, EMPTY, MAX_PROBE, USED},
};

use crate::{
    maps::{
        INDEX_V4, INDEX_V6, SERVICES_V4, SERVICES_V6, index_enabled, index_v4_position, index_v6_position,
        may_be_service4, may_be_service6,
    },
    order::{load_u8, load_u32, load_u64},
    sockaddr::{self, Words},
};

/// What the service index says about a destination.
enum Indexed {
    /// The service entry.
    Found(ServiceValue),
    /// No service port here.
    Absent,
    /// The index cannot tell (a position being rewritten, a full probe window, the index turned
    /// off): ask the services hash map, which is the authority.
    Unsure,
}

/// The IPv4 service at `addr:port/proto`, if any: from the index, else the hash map.
#[inline(always)]
pub fn service4(addr: u32, port: u16, proto: u8) -> Option<ServiceValue> {
    if !may_be_service4(addr) {
        return None;
    }
    service4_in_ranges(addr, port, proto)
}

/// [`service4`] of a destination already found in the service ranges.
#[inline(always)]
pub fn service4_in_ranges(addr: u32, port: u16, proto: u8) -> Option<ServiceValue> {
    if index_enabled() {
        match probe4(index::key_bits4(addr, port, proto)) {
            Indexed::Found(value) => return Some(value),
            Indexed::Absent => return None,
            Indexed::Unsure => {}
        }
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
    if !may_be_service6(&addr) {
        return None;
    }
    service6_in_ranges(addr, port, proto)
}

/// [`service6`] of a destination already found in the service ranges.
#[inline(always)]
pub fn service6_in_ranges(addr: Words, port: u16, proto: u8) -> Option<ServiceValue> {
    if index_enabled() {
        match probe6(addr, port, proto) {
            Indexed::Found(value) => return Some(value),
            Indexed::Absent => return None,
            Indexed::Unsure => {}
        }
    }
    let key = ServiceKey6 { addr: sockaddr::bytes(addr), port, proto, _pad: 0 };
    SERVICES_V6.get_ptr(key).map(|value| {
        // SAFETY: as in `service4`.
        unsafe { *value }
    })
}

/// Looks an IPv4 key word up in the index: `seq`, the fields, `seq` again, in this order.
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
            let seq = load_u8(addr_of!((*entry).seq));
            let state = load_u8(addr_of!((*entry).state));
            let key = load_u64(addr_of!((*entry).key).cast::<u64>());
            let value = load_value(addr_of!((*entry).value));
            (seq, state, key, value, load_u8(addr_of!((*entry).seq)))
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
            let seq = load_u8(addr_of!((*entry).seq));
            let state = load_u8(addr_of!((*entry).state));
            let key = load_words(addr_of!((*entry).key.addr));
            let key_tail = load_u32(addr_of!((*entry).key.port).cast::<u32>());
            let value = load_value(addr_of!((*entry).value));
            (seq, state, key, key_tail, value, load_u8(addr_of!((*entry).seq)))
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

/// Loads a service entry of the index as four 32-bit reads.
///
/// # Safety
/// `src` must be valid for reads.
#[inline(always)]
unsafe fn load_value(src: *const ServiceValue) -> ServiceValue {
    // SAFETY: the caller guarantees `src` is readable; the fields are 4-byte aligned.
    unsafe {
        ServiceValue {
            service_id: load_u32(addr_of!((*src).service_id)),
            set_id: load_u32(addr_of!((*src).set_id)),
            count: load_u32(addr_of!((*src).count)),
            base: load_u32(addr_of!((*src).base)),
        }
    }
}

/// Loads an address of the index as four 32-bit reads.
///
/// # Safety
/// `src` must be valid for reads and 4-byte aligned.
#[inline(always)]
unsafe fn load_words(src: *const [u8; 16]) -> Words {
    let src = src.cast::<u32>();
    // SAFETY: the caller guarantees `src` covers 16 readable, 4-byte aligned bytes.
    unsafe { [load_u32(src), load_u32(src.add(1)), load_u32(src.add(2)), load_u32(src.add(3))] }
}
