//! The service ranges the programs check before they look a destination up
//! ([`ServiceRanges`]): per family, the longest prefix covering every service port the maps hold.
//! Kept as the lowest and highest address, so that widening for new ports costs only them.

use std::net::IpAddr;

use topology_common::ServiceRanges;

/// The lowest and highest service address of each family; `None`: no service port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bounds {
    v4: Option<(u32, u32)>,
    v6: Option<(u128, u128)>,
}

impl Bounds {
    /// The bounds of `vips`.
    pub fn of(vips: impl IntoIterator<Item = IpAddr>) -> Self {
        let mut bounds = Self::default();
        bounds.extend(vips);
        bounds
    }

    /// Widened to cover `vips` too.
    pub fn extend(&mut self, vips: impl IntoIterator<Item = IpAddr>) {
        for vip in vips {
            match vip {
                IpAddr::V4(v4) => self.v4 = Some(widen(self.v4, u32::from(v4))),
                IpAddr::V6(v6) => self.v6 = Some(widen(self.v6, u128::from(v6))),
            }
        }
    }

    /// The programs' form: the common prefix of each family's bounds; a family without service
    /// ports matches only the all-zero address (never a destination with a service).
    pub fn to_kernel(self) -> ServiceRanges {
        let (v4_net, v4_mask) = self.v4.map_or((0, u32::MAX), |(low, high)| {
            let mask = u32::MAX.checked_shl(32 - (low ^ high).leading_zeros()).unwrap_or(0);
            (low & mask, mask)
        });
        let (v6_net, v6_mask) = self.v6.map_or((0, u128::MAX), |(low, high)| {
            let mask = u128::MAX.checked_shl(128 - (low ^ high).leading_zeros()).unwrap_or(0);
            (low & mask, mask)
        });
        ServiceRanges {
            v4_net: u32::from_ne_bytes(v4_net.to_be_bytes()),
            v4_mask: u32::from_ne_bytes(v4_mask.to_be_bytes()),
            v6_net: words(v6_net),
            v6_mask: words(v6_mask),
        }
    }
}

/// Whether `ranges` let the programs find a service port at `vip` (what they decide for it).
pub fn covers(ranges: &ServiceRanges, vip: IpAddr) -> bool {
    match vip {
        IpAddr::V4(v4) => ranges.may_hold_v4(u32::from_ne_bytes(v4.octets())),
        IpAddr::V6(v6) => ranges.may_hold_v6(&words(u128::from(v6))),
    }
}

fn widen<T: Ord + Copy>(bounds: Option<(T, T)>, value: T) -> (T, T) {
    bounds.map_or((value, value), |(low, high)| (low.min(value), high.max(value)))
}

/// A host-order IPv6 value as the four network-byte-order words the programs read.
fn words(value: u128) -> [u32; 4] {
    let bytes = value.to_be_bytes();
    std::array::from_fn(|i| u32::from_ne_bytes([bytes[4 * i], bytes[4 * i + 1], bytes[4 * i + 2], bytes[4 * i + 3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn may_hold(ranges: &ServiceRanges, dest: &str) -> bool {
        covers(ranges, ip(dest))
    }

    #[test]
    fn the_ranges_cover_every_service_address_and_leave_the_rest_out() {
        let vips = ["10.96.0.10", "10.96.3.7", "10.100.0.1", "fd00:10:96::a", "fd00:10:96::1:0"].map(ip);
        let ranges = Bounds::of(vips).to_kernel();
        for vip in vips {
            assert!(may_hold(&ranges, &vip.to_string()), "{vip}");
        }
        // 10.96.0.10 … 10.100.0.1 share 10.96.0.0/13.
        assert!(may_hold(&ranges, "10.97.1.1") && may_hold(&ranges, "10.103.255.255"));
        for outside in ["10.104.0.1", "10.244.1.5", "192.168.1.1", "8.8.8.8", "fd00:10:97::1", "2001:db8::1"] {
            assert!(!may_hold(&ranges, outside), "{outside}");
        }
    }

    #[test]
    fn one_address_is_a_full_prefix_and_none_matches_nothing_but_zero() {
        let one = Bounds::of([ip("10.96.0.10")]).to_kernel();
        assert!(may_hold(&one, "10.96.0.10") && !may_hold(&one, "10.96.0.11"));
        assert!(!may_hold(&one, "fd00::1") && may_hold(&one, "::"), "no IPv6 service: only ::");
        let far_apart = Bounds::of([ip("1.0.0.1"), ip("200.0.0.1")]).to_kernel();
        assert_eq!((far_apart.v4_net, far_apart.v4_mask), (0, 0), "no common prefix: everything");
        assert!(may_hold(&ServiceRanges::default(), "8.8.8.8"), "a map never written: everything");
    }

    #[test]
    fn widening_keeps_what_was_covered() {
        let mut bounds = Bounds::of([ip("10.96.0.10")]);
        bounds.extend([ip("10.96.200.1")]);
        let ranges = bounds.to_kernel();
        assert!(may_hold(&ranges, "10.96.0.10") && may_hold(&ranges, "10.96.200.1"));
        assert!(!may_hold(&ranges, "10.97.0.1"));
    }
}
