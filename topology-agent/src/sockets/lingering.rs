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
    /// Service, now or since they were held back.
    pub fn settle(
        &mut self,
        departed: &[Departure],
        returned: &[Departure],
        still_serves: impl Fn(&Departure) -> bool,
    ) -> Vec<Departure> {
        for back in returned {
            self.held.remove(back);
        }
        self.held.extend(departed.iter().copied());
        let (serving, left): (BTreeSet<Departure>, BTreeSet<Departure>) =
            std::mem::take(&mut self.held).into_iter().partition(|departure| still_serves(departure));
        self.held = serving;
        left.into_iter().collect()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::desired::{Protocol, ServicePort};

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
        assert_eq!(lingering.settle(&[departure(1), departure(2), departure(3)], &[], serves), [departure(3)]);
        assert_eq!(lingering.held.len(), 2);
        // 1 stops serving while nothing else changes in the set: acted on now.
        serving.borrow_mut().remove(&1);
        assert_eq!(lingering.settle(&[], &[], serves), [departure(1)]);
        // 2 comes back to the set: no longer held, and its later end is not acted on from here.
        assert!(lingering.settle(&[], &[departure(2)], serves).is_empty());
        serving.borrow_mut().remove(&2);
        assert!(lingering.settle(&[], &[], serves).is_empty() && lingering.is_empty());
    }
}
