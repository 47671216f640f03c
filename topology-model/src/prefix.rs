//! An address prefix (`10.244.1.0/24`, `fd00:10:244:1::/64`): a Node's pod CIDRs, which tell the
//! DNS responder the node's own pods from anyone else's.

use std::{fmt, net::IpAddr, str::FromStr};

/// An address and the number of leading bits that matter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prefix {
    addr: IpAddr,
    len: u8,
}

/// Why text is not a prefix.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PrefixError {
    /// No `/`.
    #[error("{0:?} is not ADDRESS/LENGTH")]
    NoLength(String),
    /// The address does not parse.
    #[error("{0:?} is not an IP address")]
    Address(String),
    /// The length does not parse or is longer than the address.
    #[error("{0:?} is not a prefix length for this family")]
    Length(String),
}

impl Prefix {
    /// `addr/len`; `None` when `len` is longer than the family's address.
    pub fn new(addr: IpAddr, len: u8) -> Option<Self> {
        let bits = if addr.is_ipv4() { 32 } else { 128 };
        (u32::from(len) <= bits).then_some(Self { addr, len })
    }

    /// Whether `addr` is within the prefix (an IPv4-mapped IPv6 address as its IPv4 one).
    pub fn contains(&self, addr: IpAddr) -> bool {
        match (self.addr, addr.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(addr)) => {
                same_bits(u128::from(net.to_bits()) << 96, u128::from(addr.to_bits()) << 96, self.len)
            }
            (IpAddr::V6(net), IpAddr::V6(addr)) => same_bits(net.to_bits(), addr.to_bits(), self.len),
            _ => false,
        }
    }
}

/// The first `len` bits of `a` and `b` are equal.
fn same_bits(a: u128, b: u128, len: u8) -> bool {
    len == 0 || (a ^ b) >> (128 - u32::from(len)) == 0
}

impl FromStr for Prefix {
    type Err = PrefixError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let (addr, len) = text.split_once('/').ok_or_else(|| PrefixError::NoLength(text.into()))?;
        let addr: IpAddr = addr.parse().map_err(|_| PrefixError::Address(text.into()))?;
        let len: u8 = len.parse().map_err(|_| PrefixError::Length(text.into()))?;
        Self::new(addr, len).ok_or_else(|| PrefixError::Length(text.into()))
    }
}

impl fmt::Display for Prefix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contains_by_leading_bits() {
        let v4: Prefix = "10.244.1.0/24".parse().unwrap();
        assert!(v4.contains("10.244.1.7".parse().unwrap()));
        assert!(v4.contains("::ffff:10.244.1.7".parse().unwrap()), "v4-mapped is the IPv4 address");
        assert!(!v4.contains("10.244.2.7".parse().unwrap()));
        assert!(!v4.contains("fd00::1".parse().unwrap()));
        let v6: Prefix = "fd00:10:244:1::/64".parse().unwrap();
        assert!(v6.contains("fd00:10:244:1::5".parse().unwrap()));
        assert!(!v6.contains("fd00:10:244:2::5".parse().unwrap()));
        let all: Prefix = "0.0.0.0/0".parse().unwrap();
        assert!(all.contains("192.0.2.1".parse().unwrap()));
        let one: Prefix = "192.0.2.1/32".parse().unwrap();
        assert!(one.contains("192.0.2.1".parse().unwrap()) && !one.contains("192.0.2.2".parse().unwrap()));
        assert_eq!(v6.to_string(), "fd00:10:244:1::/64");
    }

    #[test]
    fn bad_text_says_why() {
        assert_eq!("10.0.0.0".parse::<Prefix>(), Err(PrefixError::NoLength("10.0.0.0".into())));
        assert_eq!("ten/8".parse::<Prefix>(), Err(PrefixError::Address("ten/8".into())));
        assert_eq!("10.0.0.0/33".parse::<Prefix>(), Err(PrefixError::Length("10.0.0.0/33".into())));
        assert!("fd00::/129".parse::<Prefix>().is_err());
    }
}
