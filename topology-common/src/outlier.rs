//! Passive outlier ejection, per node: a backend whose TCP handshakes from this node fail
//! [`CONSECUTIVE_FAILURES`] times in a row (refused, timed out, unreachable) is avoided by this
//! node's connect hooks for an ejection time that doubles with each ejection, from
//! [`BASE_EJECTION_NS`] up to [`MAX_EJECTION_NS`] (Envoy's consecutive failures, base and
//! maximum ejection time). A tracing program on `inet_sock_set_state` sees each handshake of a
//! connection the hooks rewrote end (it finds the socket in the TCP connections table by cookie):
//! it counts failures in a row per backend, resets them on a success while some backend is
//! failing, and ejects. The connect hook looks a drawn backend up only while some ejection is in
//! force ([`OutlierState::active_until_ns`]) and draws again, up to [`REDRAWS`] times, then
//! takes the first backend of the set's first slots that is not ejected: when none is (the whole
//! set ejected, or most of a large one) the last draw is used, so ejection never empties a set.

/// One backend's failures and ejections (the value of `map_names::OUTLIERS`, keyed by
/// [`BackendKey`](crate::BackendKey)).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OutlierEntry {
    /// Handshakes failed since the last success or ejection.
    pub failures: u32,
    /// Times ejected (each doubles the next ejection time).
    pub ejections: u32,
    /// `CLOCK_MONOTONIC` until which the connect hooks avoid it, nanoseconds; 0: never ejected.
    pub ejected_until_ns: u64,
    /// When its last handshake failed.
    pub last_failure_ns: u64,
}
const _: () = assert!(size_of::<OutlierEntry>() == 24);

/// Whether any backend is failing or ejected (the one entry of `map_names::OUTLIER_STATE`): the
/// programs do nothing more for outliers outside these times.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct OutlierState {
    /// Some backend may be ejected until then: the connect hooks look drawn backends up.
    pub active_until_ns: u64,
    /// Some backend failed within [`FAILING_WINDOW_NS`] before then: successes reset failures.
    pub failing_until_ns: u64,
}
const _: () = assert!(size_of::<OutlierState>() == 16);

/// Failed handshakes in a row that eject a backend (Envoy's `consecutive_5xx` default).
pub const CONSECUTIVE_FAILURES: u32 = 5;
/// The first ejection's length.
pub const BASE_EJECTION_NS: u64 = 10_000_000_000;
/// The longest ejection (Envoy's `max_ejection_time` default).
pub const MAX_EJECTION_NS: u64 = 300_000_000_000;
/// How long after a failure successes still reset a backend's failures.
pub const FAILING_WINDOW_NS: u64 = 60_000_000_000;
/// Draws after the first while the drawn backend is ejected (then the set's first slots are
/// searched for one that is not).
pub const REDRAWS: u32 = 3;

impl OutlierEntry {
    /// The length of ejection number `ejections` (1 for the first).
    #[inline(always)]
    pub fn ejection_ns(ejections: u32) -> u64 {
        // Shifts, not a multiplication: the BPF target has no 128-bit overflow check. Five
        // doublings pass the maximum already.
        let doublings = if ejections > 6 { 5 } else { ejections.saturating_sub(1) };
        let length = BASE_EJECTION_NS << doublings;
        if length < MAX_EJECTION_NS { length } else { MAX_EJECTION_NS }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejections_double_up_to_the_maximum() {
        let seconds: [u64; 7] = core::array::from_fn(|n| OutlierEntry::ejection_ns(n as u32 + 1) / 1_000_000_000);
        assert_eq!(seconds, [10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(OutlierEntry::ejection_ns(u32::MAX), MAX_EJECTION_NS);
    }
}
