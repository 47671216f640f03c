//! The service index: an open-addressing table of service entries the programs probe themselves.
//!
//! A hash map lookup is a call into the kernel (hashing, a bucket walk, an out-of-line key
//! compare) and touches three cache lines; a probe of this table is a few inlined instructions
//! and usually one cache line. The hash maps stay the authority: the index only ever answers
//! "this entry", "no service here" or "not sure", and the programs ask the hash map when unsure.
//!
//! # Layout
//! An array of `2^n` positions; a key's probe window is the [`MAX_PROBE`] positions starting at
//! `hash & (2^n - 1)`, wrapping around. Keys never move once placed. The agent keeps this
//! invariant at every instant: a key in the hash map is either [`USED`] at some position of its
//! window with no [`EMPTY`] position before it in the window, or its window holds no [`EMPTY`]
//! position at all (it overflowed, and lookups end "not sure"). A removed key leaves a
//! [`TOMBSTONE`] unless no other key's probe passes its position.
//!
//! # Torn reads, on every CPU
//! The agent rewrites a position through a shared mapping of the array (`BPF_F_MMAPABLE`), as
//! the writer of a sequence lock: `seq` made odd (only that byte changes), a release fence, the
//! new contents, then `seq` made even by a release store. A program reads `seq`, the fields, then
//! `seq` again, and trusts the fields only if both reads are equal and even.
//!
//! That is sound when the program's loads happen in program order and the agent's stores become
//! visible in program order:
//! - The agent's side holds on every CPU: the release fence keeps the contents from becoming
//!   visible before the odd `seq`, the release store keeps the even `seq` from becoming visible
//!   before the contents.
//! - x86-64 is TSO: a load is never reordered with an earlier load. The standard object reads with
//!   plain loads in program order (volatile, so the compiler keeps the order, and the JIT emits
//!   them as written), which is enough there, on every kernel.
//! - A weakly ordered CPU (arm64) may satisfy the second `seq` load before the field loads. The
//!   programs then need BPF load-acquire (ISA v4, kernel 6.15 and later): every load of a probe
//!   is a load-acquire, so each one, and the second `seq` load last, happens after the ones before
//!   it. The agent loads the object built that way where the kernel has load-acquire; on a weakly
//!   ordered CPU whose kernel has not, it turns the index off (`INDEX_ENABLED` = 0) and the
//!   programs ask the hash maps, whose updates the kernel publishes with RCU.
//!
//! `seq` is one byte, so no read of it can tear. It wraps after 128 rewrites; the agent waits for
//! an RCU grace period (which no running program can span) after 64 rewrites of a position, so a
//! program inside one lookup can never see the same even `seq` twice across a rewrite.

use core::mem::{offset_of, size_of};

use crate::{ServiceKey4, ServiceKey6, ServiceValue};

/// Positions probed per lookup before the answer is "not sure".
pub const MAX_PROBE: u32 = 8;

/// A position never used, or freed: a lookup that reaches it ends with "no service here".
pub const EMPTY: u8 = 0;
/// A position holding a key and its entry.
pub const USED: u8 = 1;
/// A freed position other keys' probes pass through: a lookup goes on past it.
pub const TOMBSTONE: u8 = 2;

/// One position of the IPv4 index.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IndexEntry4 {
    /// Odd while the agent rewrites the position; see the module documentation.
    pub seq: u8,
    /// [`EMPTY`], [`USED`] or [`TOMBSTONE`].
    pub state: u8,
    /// Always zero.
    pub _pad: [u8; 6],
    /// The service port at this position, if `state` is [`USED`].
    pub key: ServiceKey4,
    /// Its entry, as in the services hash map.
    pub value: ServiceValue,
}
const _: () = assert!(size_of::<IndexEntry4>() == 32);
const _: () = assert!(offset_of!(IndexEntry4, key) == 8);
const _: () = assert!(offset_of!(IndexEntry4, value) == 16);

/// One position of the IPv6 index.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IndexEntry6 {
    /// Odd while the agent rewrites the position; see the module documentation.
    pub seq: u8,
    /// [`EMPTY`], [`USED`] or [`TOMBSTONE`].
    pub state: u8,
    /// Always zero.
    pub _pad: [u8; 2],
    /// The service port at this position, if `state` is [`USED`].
    pub key: ServiceKey6,
    /// Its entry, as in the services hash map.
    pub value: ServiceValue,
}
const _: () = assert!(size_of::<IndexEntry6>() == 40);
const _: () = assert!(offset_of!(IndexEntry6, key) == 4);
const _: () = assert!(offset_of!(IndexEntry6, value) == 24);

/// Multiplier of the mixing steps (2^64 / golden ratio).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

#[inline(always)]
fn mix(x: u64) -> u64 {
    (x ^ (x >> 31)).wrapping_mul(GOLDEN)
}

/// The key of an IPv4 service port as one word: address (as its bytes read in native order),
/// port, protocol; also its bytes in memory on a little-endian machine.
#[inline(always)]
pub fn key_bits4(addr: u32, port: u16, proto: u8) -> u64 {
    u64::from(addr) | (u64::from(port) << 32) | (u64::from(proto) << 48)
}

/// Hash of an IPv4 key word ([`key_bits4`]); a key's home position is `hash & mask`.
#[inline(always)]
pub fn hash4(bits: u64) -> u32 {
    (mix(bits) >> 32) as u32
}

/// Hash of an IPv6 service port: the address as four native-order words, port, protocol.
#[inline(always)]
pub fn hash6(addr: [u32; 4], port: u16, proto: u8) -> u32 {
    let low = u64::from(addr[0]) | (u64::from(addr[1]) << 32);
    let high = u64::from(addr[2]) | (u64::from(addr[3]) << 32);
    let rest = u64::from(port) | (u64::from(proto) << 16);
    (mix(mix(mix(low) ^ high) ^ rest) >> 32) as u32
}

impl ServiceKey4 {
    /// This key as [`key_bits4`].
    #[inline(always)]
    pub fn bits(&self) -> u64 {
        key_bits4(u32::from_ne_bytes(self.addr), self.port, self.proto)
    }

    /// [`hash4`] of this key.
    #[inline(always)]
    pub fn index_hash(&self) -> u32 {
        hash4(self.bits())
    }
}

impl ServiceKey6 {
    /// The address as four native-order words.
    #[inline(always)]
    pub fn addr_words(&self) -> [u32; 4] {
        let a = &self.addr;
        [
            u32::from_ne_bytes([a[0], a[1], a[2], a[3]]),
            u32::from_ne_bytes([a[4], a[5], a[6], a[7]]),
            u32::from_ne_bytes([a[8], a[9], a[10], a[11]]),
            u32::from_ne_bytes([a[12], a[13], a[14], a[15]]),
        ]
    }

    /// [`hash6`] of this key.
    #[inline(always)]
    pub fn index_hash(&self) -> u32 {
        hash6(self.addr_words(), self.port, self.proto)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_bits_are_the_key_bytes_on_little_endian() {
        let key = ServiceKey4 { addr: [10, 96, 0, 5], port: 80, proto: 6, _pad: 0 };
        if cfg!(target_endian = "little") {
            let mut bytes = [0u8; 8];
            bytes[..4].copy_from_slice(&key.addr);
            bytes[4..6].copy_from_slice(&key.port.to_ne_bytes());
            bytes[6] = key.proto;
            assert_eq!(key.bits(), u64::from_ne_bytes(bytes));
        }
        assert_ne!(key.index_hash(), ServiceKey4 { proto: 17, ..key }.index_hash());
        assert_ne!(key.index_hash(), ServiceKey4 { port: 81, ..key }.index_hash());
    }

    #[test]
    fn sequential_cluster_ips_spread_over_the_table() {
        // 30,000 consecutive ClusterIPs, TCP and UDP, in 2^16 positions: no home position
        // collects more than a handful of keys.
        let mask = (1u32 << 16) - 1;
        let mut homes = [0u8; 1 << 16];
        for i in 0..30_000u32 {
            for proto in [6, 17] {
                let addr = [10, 96 + (i >> 16) as u8, (i >> 8) as u8, i as u8];
                let home = ServiceKey4 { addr, port: 80, proto, _pad: 0 }.index_hash() & mask;
                homes[home as usize] += 1;
                let mut v6 = [0u8; 16];
                v6[..2].copy_from_slice(&[0xfd, 0]);
                v6[12..].copy_from_slice(&i.to_be_bytes());
                let home6 = ServiceKey6 { addr: v6, port: 80, proto, _pad: 0 }.index_hash() & mask;
                assert!(home6 <= mask);
            }
        }
        assert!(homes.iter().all(|&n| n <= 8), "max {}", homes.iter().max().unwrap());
    }
}
