//! Backends that left a port's set on this node but still serve its Service (see
//! `topology_policy::plan::serving`): their sockets go on, and are ended once the backend stops
//! serving — the set not changing then, since it no longer draws the backend — unless it comes
//! back to the set first.

use std::collections::BTreeSet;

use super::Departure;

/// Departures held back while their backends still serve.
#[derive(Debug, Default)]
pub struct Lingering {
    held: BTreeSet<Departure>,
}

impl Lingering {
    /// Takes what one apply did: the departures to act on now — those of backends that left their
    /// Service, now or since they were held back. A held departure is looked at again only where
    /// `recheck` says (the ports of the Services the controller decided again: a backend that
    /// stops serving changes its Service's slices), so a large held set costs an apply nothing.
    pub fn settle(
        &mut self,
        departed: &[Departure],
        returned: &[Departure],
        recheck: impl Fn(&Departure) -> bool,
        still_serves: impl Fn(&Departure) -> bool,
    ) -> Vec<Departure> {
        for back in returned {
            self.held.remove(back);
        }
        let mut left: Vec<Departure> = departed.iter().filter(|d| !still_serves(d)).copied().collect();
        let again: Vec<Departure> = self.held.iter().filter(|d| recheck(d)).copied().collect();
        for departure in again {
            if !still_serves(&departure) {
                self.held.remove(&departure);
                left.push(departure);
            }
        }
        self.held.extend(departed.iter().filter(|d| !left.contains(d)).copied());
        left.sort();
        left.dedup();
        left
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use topology_model::Protocol;
    use topology_policy::desired::ServicePort;

    use super::*;

    fn departure(last: u8) -> Departure {
        Departure {
            service: ServicePort { vip: "10.96.0.1".parse().unwrap(), port: 53, protocol: Protocol::Udp },
            backend: format!("10.1.0.{last}:53").parse().unwrap(),
        }
    }

    #[test]
    fn a_backend_that_still_serves_is_held_until_it_stops_or_returns() {
        let mut lingering = Lingering::default();
        let serving = std::cell::RefCell::new(BTreeSet::from([1u8, 2]));
        let serves = |d: &Departure| serving.borrow().iter().any(|last| departure(*last) == *d);
        // 1 and 2 leave the set but serve: held; 3 left the Service: acted on.
        assert_eq!(
            lingering.settle(&[departure(1), departure(2), departure(3)], &[], |_| true, serves),
            [departure(3)]
        );
        assert_eq!(lingering.held.len(), 2);
        // 1 stops serving while nothing else changes in the set: acted on once its port is applied.
        serving.borrow_mut().remove(&1);
        assert!(lingering.settle(&[], &[], |_| false, serves).is_empty(), "an apply of other Services");
        assert_eq!(lingering.settle(&[], &[], |_| true, serves), [departure(1)]);
        // 2 comes back to the set: no longer held, and its later end is not acted on from here.
        assert!(lingering.settle(&[], &[departure(2)], |_| true, serves).is_empty());
        serving.borrow_mut().remove(&2);
        assert!(lingering.settle(&[], &[], |_| true, serves).is_empty() && lingering.is_empty());
    }
}
