//! The cap on ejection: how many backends of one Service port's set this node may avoid at once,
//! and the ledger that holds it to that across CPUs.
//!
//! A failing backend is ejected only while fewer than [`ejection_cap`] of its set's backends are:
//! a tenth of the set (Envoy's `max_ejection_percent` default), at least one, never more than half
//! of it, and never more than [`LEDGER_ENTRIES`]. A backend past the cap is not ejected: it keeps
//! its share of connections and its clients see its failures, as without ejection. The cap is
//! judged when a backend would be ejected, over the whole set (its slot count, not a sample of
//! its slots), under the ledger's lock: two backends failing on two CPUs at once cannot both take
//! the last place.

/// Ejections one Service port's ledger holds at once: the most backends of one set a node
/// avoids at the same time, however large the set.
pub const LEDGER_ENTRIES: usize = 16;

/// The most backends of a set of `backends` that may be ejected at once: a tenth, at least one,
/// at most half (a set of one backend has none ejected) and at most [`LEDGER_ENTRIES`].
///
/// Why a tenth: an ejection on one node moves every client of the node, not one proxy's share of
/// them; a wide outage (a zone, a bad rollout) is the rollout's and the zone logic's to handle,
/// and ejecting half a set would pile its traffic onto the other half. Envoy's default is the same.
#[inline(always)]
pub fn ejection_cap(backends: u32) -> u32 {
    let tenth = if backends / 10 > 1 { backends / 10 } else { 1 };
    let half = backends / 2;
    let cap = if tenth < half { tenth } else { half };
    if cap < LEDGER_ENTRIES as u32 { cap } else { LEDGER_ENTRIES as u32 }
}

/// The kernel's spin lock, by the name its verifier looks for in a map value's BTF.
#[allow(non_camel_case_types, reason = "the verifier knows the lock by this C name")]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct bpf_spin_lock {
    /// The lock word; the kernel's alone.
    pub val: u32,
}

/// The ejections in force of one Service port's set (the value of `map_names::OUTLIER_LEDGER`,
/// keyed by service id): when each ends. A place whose end is past is free.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OutlierLedger {
    /// Held while a program reads and takes a place.
    pub lock: bpf_spin_lock,
    /// Zero.
    pub _pad: u32,
    /// `CLOCK_MONOTONIC` end of each ejection in force, nanoseconds; a past one is a free place.
    pub until_ns: [u64; LEDGER_ENTRIES],
}
const _: () = assert!(size_of::<OutlierLedger>() == 136);

impl OutlierLedger {
    /// Takes a place for an ejection at `now` until `until` if fewer than `cap` are in force
    /// (then true). No call is made: the programs hold the ledger's lock around it, and the
    /// verifier allows no call while a lock is held.
    #[inline(always)]
    pub fn admit(&mut self, now: u64, until: u64, cap: u32) -> bool {
        let mut live = 0u32;
        let mut free = LEDGER_ENTRIES;
        let mut i = 0;
        while i < LEDGER_ENTRIES {
            if self.until_ns[i] > now {
                live += 1;
            } else if free == LEDGER_ENTRIES {
                free = i;
            }
            i += 1;
        }
        if live >= cap || free >= LEDGER_ENTRIES {
            return false;
        }
        self.until_ns[free] = until;
        true
    }

    /// Ejections in force at `now`.
    pub fn live(&self, now: u64) -> usize {
        self.until_ns.iter().filter(|&&until| until > now).count()
    }

    /// When its last ejection ended or ends.
    pub fn last_end(&self) -> u64 {
        self.until_ns.iter().copied().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_a_tenth_at_least_one_at_most_half_and_the_ledger() {
        let caps: [(u32, u32); 10] =
            [(0, 0), (1, 0), (2, 1), (3, 1), (9, 1), (20, 2), (29, 2), (40, 4), (160, 16), (10_000, 16)];
        for (backends, cap) in caps {
            assert_eq!(ejection_cap(backends), cap, "{backends} backends");
        }
    }

    #[test]
    fn the_ledger_admits_up_to_the_cap_and_frees_a_place_when_an_ejection_ends() {
        let mut ledger = OutlierLedger::default();
        assert!(ledger.admit(100, 200, 2));
        assert!(ledger.admit(110, 300, 2));
        // Two in force: a third is refused, whatever its end.
        assert!(!ledger.admit(120, 400, 2));
        assert_eq!(ledger.live(120), 2);
        // The first ended at 200: its place is free again.
        assert!(ledger.admit(200, 500, 2));
        assert_eq!((ledger.live(200), ledger.last_end()), (2, 500));
        // A cap of zero admits nothing.
        assert!(!OutlierLedger::default().admit(0, 1, 0));
    }

    #[test]
    fn a_full_ledger_admits_nothing_more() {
        let mut ledger = OutlierLedger::default();
        for i in 0..LEDGER_ENTRIES as u64 {
            assert!(ledger.admit(0, 1_000 + i, 100));
        }
        assert!(!ledger.admit(0, 5_000, 100));
        assert!(ledger.admit(1_000, 5_000, 100), "the first place is free once its ejection ends");
    }
}
