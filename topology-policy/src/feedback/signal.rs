//! Windows of the load signal: what happened to each backend between two readings of the
//! kernel's cumulative counters.

use std::{collections::BTreeMap, net::SocketAddr};

use super::measured::{LoadCounters, MeasuredBackend};

/// One backend over one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Window {
    /// Handshakes started.
    pub connects: u64,
    /// Connections that ended.
    pub closed: u64,
    /// Their summed lifetime, microseconds.
    pub lifetime_us: u64,
    /// Handshakes refused or timed out, connections reset.
    pub failures: u64,
    /// Connections in flight at the end of the interval.
    pub in_flight: u64,
}

impl Window {
    /// Adds `other` (a zone's backends summed).
    pub fn add(&mut self, other: &Window) {
        self.connects += other.connects;
        self.closed += other.closed;
        self.lifetime_us += other.lifetime_us;
        self.failures += other.failures;
        self.in_flight += other.in_flight;
    }

    /// Mean lifetime of the connections that ended, microseconds, if at least `min_samples` did.
    pub fn mean_lifetime_us(&self, min_samples: u64) -> Option<f64> {
        (self.closed >= min_samples.max(1)).then(|| self.lifetime_us as f64 / self.closed as f64)
    }
}

/// The previous reading, to difference the next one against.
#[derive(Clone, Debug, Default)]
pub struct Windows {
    last: BTreeMap<SocketAddr, LoadCounters>,
    /// Whether a reading was taken: the first one (a start, with counters pinned by an earlier
    /// agent) gives no window.
    primed: bool,
}

impl Windows {
    /// The windows since the previous reading, by backend. After the first reading, a backend
    /// that appears, or whose counters went back, has a new entry in the kernel, made since the
    /// previous reading and counted from zero: its window is all it holds (the first connections
    /// moved to another zone count at once).
    pub fn advance(&mut self, reading: &[MeasuredBackend]) -> BTreeMap<SocketAddr, Window> {
        let mut windows = BTreeMap::new();
        let mut next = BTreeMap::new();
        let zero = LoadCounters::default();
        for measured in reading {
            let now = measured.load;
            let before = match self.last.get(&measured.backend) {
                Some(before) => Some(before),
                None if self.primed => Some(&zero),
                None => None,
            };
            if let Some(before) = before {
                let window = difference(before, &now, measured.in_flight)
                    .or_else(|| difference(&zero, &now, measured.in_flight));
                windows.extend(window.map(|w| (measured.backend, w)));
            }
            next.insert(measured.backend, now);
        }
        self.last = next;
        self.primed = true;
        windows
    }
}

/// `now − before`, unless a counter went back.
fn difference(before: &LoadCounters, now: &LoadCounters, in_flight: u64) -> Option<Window> {
    let failures = |c: &LoadCounters| c.refused + c.timed_out + c.reset;
    Some(Window {
        connects: now.connects.checked_sub(before.connects)?,
        closed: now.closed.checked_sub(before.closed)?,
        lifetime_us: now.lifetime_us.checked_sub(before.lifetime_us)?,
        failures: failures(now).checked_sub(failures(before))?,
        in_flight,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(backend: &str, connects: u64, closed: u64, lifetime_us: u64, refused: u64) -> MeasuredBackend {
        MeasuredBackend {
            backend: backend.parse().unwrap(),
            in_flight: connects - closed - refused,
            load: LoadCounters { connects, closed, refused, lifetime_us, ..Default::default() },
        }
    }

    #[test]
    fn a_window_is_the_difference_of_two_readings_and_a_new_entry_counts_from_zero() {
        let mut windows = Windows::default();
        assert!(windows.advance(&[reading("10.0.0.1:80", 10, 8, 8000, 0)]).is_empty(), "first sight");
        let next = windows.advance(&[reading("10.0.0.1:80", 30, 25, 42_000, 2), reading("10.0.0.2:80", 3, 1, 10, 0)]);
        let window = next[&"10.0.0.1:80".parse().unwrap()];
        assert_eq!((window.connects, window.closed, window.lifetime_us, window.failures), (20, 17, 34_000, 2));
        assert_eq!(window.mean_lifetime_us(5), Some(2000.0));
        assert_eq!(window.mean_lifetime_us(18), None, "too few samples");
        let new = next[&"10.0.0.2:80".parse().unwrap()];
        assert_eq!((new.connects, new.closed, new.lifetime_us), (3, 1, 10), "a new entry counts from zero");
        let after_reset = windows.advance(&[reading("10.0.0.1:80", 4, 2, 100, 0)]);
        let window = after_reset[&"10.0.0.1:80".parse().unwrap()];
        assert_eq!((window.connects, window.closed), (4, 2), "counters went back: a new entry, from zero");
    }
}
