//! Walker's alias tables: any weighted backend set becomes `n` slots from which the kernel picks
//! with one uniform draw, one map lookup and one comparison, whatever the weights.
//!
//! Construction is exact integer arithmetic over the sorted backends, so the same set always
//! produces the same slots: the dataplane compares slots to decide whether a service changed.

use std::net::IpAddr;

use topology_common::{Backend, Slot, THRESHOLD_ONE};

use crate::desired::{Locality, WeightedBackend};

/// The slots for `backends`. Backends of weight 0 are left out; an empty result means "refuse".
pub fn build(backends: &[WeightedBackend]) -> Vec<Slot> {
    let mut live: Vec<&WeightedBackend> = backends.iter().filter(|b| b.weight > 0).collect();
    live.sort_by_key(|b| (b.addr, b.port, b.locality));
    live.dedup_by(|a, b| a.addr == b.addr && a.port == b.port);
    let n = live.len() as u128;
    if n == 0 {
        return Vec::new();
    }
    let total: u128 = live.iter().map(|b| u128::from(b.weight)).sum();
    // Each slot holds `total` units; backend i brings `weight_i * n` units.
    let mut units: Vec<u128> = live.iter().map(|b| u128::from(b.weight) * n).collect();
    let (mut small, mut large): (Vec<usize>, Vec<usize>) = (0..live.len()).partition(|&i| units[i] < total);
    // Reverse so `pop` takes the lowest index first: the order stays easy to reason about in tests.
    small.reverse();
    large.reverse();

    let mut slots: Vec<Option<(u32, usize, usize)>> = vec![None; live.len()];
    while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
        small.pop();
        let threshold = (units[s] << 31) / total;
        slots[s] = Some((threshold as u32, s, l));
        units[l] -= total - units[s];
        if units[l] < total {
            large.pop();
            small.push(l);
        }
    }
    // With exact arithmetic whatever remains holds exactly `total` units: always its own backend.
    for i in large.into_iter().chain(small) {
        slots[i] = Some((THRESHOLD_ONE, i, i));
    }
    slots
        .into_iter()
        .map(|slot| {
            let (threshold, primary, alias) = slot.expect("every index is assigned exactly once");
            Slot { set_id: 0, threshold, primary: backend(live[primary]), alias: backend(live[alias]) }
        })
        .collect()
}

/// The probability each backend is chosen from `slots`, keyed by its map form. This is what
/// `status` reports: it is computed from what the kernel holds, not from what was asked.
pub fn shares(slots: &[Slot]) -> Vec<(Backend, f64)> {
    let mut shares: Vec<(Backend, f64)> = Vec::new();
    let mut add = |backend: Backend, share: f64| match shares.iter_mut().find(|(b, _)| *b == backend) {
        Some((_, total)) => *total += share,
        None => shares.push((backend, share)),
    };
    let n = slots.len() as f64;
    for slot in slots {
        let primary = f64::from(slot.threshold.min(THRESHOLD_ONE)) / f64::from(THRESHOLD_ONE);
        add(slot.primary, primary / n);
        if primary < 1.0 {
            add(slot.alias, (1.0 - primary) / n);
        }
    }
    shares.retain(|(_, share)| *share > 0.0);
    shares
}

/// The backends `slots` draw and their shares in parts per million, as `status` reports them.
pub fn drawn(slots: &[Slot], ipv4: bool) -> Vec<WeightedBackend> {
    shares(slots).iter().map(|(backend, share)| weighted_backend(backend, *share, ipv4)).collect()
}

/// The map form of a backend.
pub fn backend(b: &WeightedBackend) -> Backend {
    Backend { addr: addr_bytes(b.addr), port: b.port, locality: b.locality.class(), _pad: 0 }
}

/// The maps' 16-byte address form: IPv4 first, zeros after.
pub fn addr_bytes(addr: IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => {
            let mut out = [0; 16];
            out[..4].copy_from_slice(&v4.octets());
            out
        }
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// An address read back from the maps' 16-byte form.
pub fn addr_from_bytes(bytes: [u8; 16], ipv4: bool) -> IpAddr {
    if ipv4 { IpAddr::from([bytes[0], bytes[1], bytes[2], bytes[3]]) } else { IpAddr::from(bytes) }
}

/// A backend read back from a slot, weighted by its share in parts per million.
pub fn weighted_backend(backend: &Backend, share: f64, ipv4: bool) -> WeightedBackend {
    WeightedBackend {
        addr: addr_from_bytes(backend.addr, ipv4),
        port: backend.port,
        weight: (share * 1e6).round() as u32,
        locality: Locality::from_class(backend.locality),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn wb(last: u8, weight: u32) -> WeightedBackend {
        WeightedBackend { addr: IpAddr::from([10, 244, 0, last]), port: 8080, weight, locality: Locality::Zone }
    }

    fn share_of(slots: &[Slot], b: &WeightedBackend) -> f64 {
        let key = backend(b);
        shares(slots).into_iter().find(|(x, _)| *x == key).map_or(0.0, |(_, s)| s)
    }

    #[test]
    fn empty_and_zero_weight_sets_have_no_slots() {
        assert!(build(&[]).is_empty());
        assert!(build(&[wb(1, 0), wb(2, 0)]).is_empty());
    }

    #[test]
    fn equal_weights_make_one_slot_per_backend_that_always_picks_itself() {
        let slots = build(&[wb(3, 1), wb(1, 1), wb(2, 1)]);
        assert_eq!(slots.len(), 3);
        for slot in &slots {
            assert_eq!(slot.threshold, THRESHOLD_ONE);
            assert_eq!(slot.primary, slot.alias);
        }
        // Sorted by address, whatever the input order.
        assert_eq!(slots[0].primary.addr[3], 1);
        assert_eq!(slots[2].primary.addr[3], 3);
    }

    #[test]
    fn weights_three_to_one() {
        let (a, b) = (wb(1, 3), wb(2, 1));
        let slots = build(&[a, b]);
        assert_eq!(slots.len(), 2);
        assert!((share_of(&slots, &a) - 0.75).abs() < 1e-9);
        assert!((share_of(&slots, &b) - 0.25).abs() < 1e-9);
    }

    #[test]
    fn zero_weight_backends_are_left_out() {
        let slots = build(&[wb(1, 5), wb(2, 0)]);
        assert_eq!(slots.len(), 1);
        assert_eq!(share_of(&slots, &wb(2, 0)), 0.0);
    }

    #[test]
    fn duplicate_backends_count_once() {
        assert_eq!(build(&[wb(1, 1), wb(1, 1), wb(2, 1)]).len(), 2);
    }

    #[test]
    fn ipv4_addresses_sit_in_the_first_four_bytes() {
        let bytes = addr_bytes("10.1.2.3".parse().unwrap());
        assert_eq!(&bytes[..4], &[10, 1, 2, 3]);
        assert!(bytes[4..].iter().all(|&b| b == 0));
        assert_eq!(addr_from_bytes(bytes, true), "10.1.2.3".parse::<IpAddr>().unwrap());
        let v6: IpAddr = "fd00::1".parse().unwrap();
        assert_eq!(addr_from_bytes(addr_bytes(v6), false), v6);
    }

    proptest! {
        #[test]
        fn shares_match_weights(weights in prop::collection::vec(0u32..1000, 1..40)) {
            let backends: Vec<_> = weights.iter().enumerate().map(|(i, &w)| wb(i as u8, w)).collect();
            let slots = build(&backends);
            let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
            prop_assert_eq!(slots.len(), weights.iter().filter(|&&w| w > 0).count());
            for b in &backends {
                let expected = if total == 0 { 0.0 } else { f64::from(b.weight) / total as f64 };
                prop_assert!((share_of(&slots, b) - expected).abs() < 1e-6,
                    "backend {:?}: share {} expected {}", b.addr, share_of(&slots, b), expected);
            }
        }

        #[test]
        fn construction_ignores_input_order(weights in prop::collection::vec(1u32..100, 1..20)) {
            let backends: Vec<_> = weights.iter().enumerate().map(|(i, &w)| wb(i as u8, w)).collect();
            let mut shuffled = backends.clone();
            shuffled.reverse();
            prop_assert_eq!(build(&backends), build(&shuffled));
        }
    }
}
