//! Which departures still hold when the terminator gets to them. A walk of every namespace takes
//! a while; meanwhile a backend may return to the set it left (a readiness flap, a rollout undone),
//! and the sockets connected to it again must not be ended for the earlier departure. The control
//! loop records departures and returns as it programs them; the terminator ends a socket only for
//! a departure that no return has cancelled since.

use std::{collections::HashMap, sync::Mutex};

use super::Departure;

/// Departures not acted on yet, each with the round of its latest recording.
#[derive(Debug, Default)]
pub struct Ledger {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    round: u64,
    pending: HashMap<Departure, u64>,
}

impl Ledger {
    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner))
    }

    /// Records what one apply did: backends that left, and backends that came back (which cancels
    /// their pending departures). The round the departures belong to.
    pub fn record(&self, departed: &[Departure], returned: &[Departure]) -> u64 {
        self.with(|state| {
            state.round += 1;
            for departure in departed {
                state.pending.insert(*departure, state.round);
            }
            for back in returned {
                state.pending.remove(back);
            }
            state.round
        })
    }

    /// Whether `departure`, recorded in `round`, still holds: its backend has not come back since.
    pub fn holds(&self, departure: &Departure, round: u64) -> bool {
        self.with(|state| state.pending.get(departure).is_some_and(|latest| *latest >= round))
    }

    /// Forgets departures acted on, unless recorded again in a later round.
    pub fn done(&self, acted: impl IntoIterator<Item = (Departure, u64)>) {
        self.with(|state| {
            for (departure, round) in acted {
                if state.pending.get(&departure).is_some_and(|latest| *latest <= round) {
                    state.pending.remove(&departure);
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use topology_model::Protocol;
    use topology_policy::desired::ServicePort;

    use super::*;

    fn departure(last: u8) -> Departure {
        Departure {
            service: ServicePort { vip: [10, 96, 0, 53].into(), port: 53, protocol: Protocol::Udp },
            backend: std::net::SocketAddr::from(([10, 244, 0, last], 8053)),
        }
    }

    #[test]
    fn a_backend_that_came_back_keeps_its_sockets_and_a_new_departure_ends_them_again() {
        let ledger = Ledger::default();
        let left = ledger.record(&[departure(1), departure(2)], &[]);
        assert!(ledger.holds(&departure(1), left));
        // Backend 1 returns before the terminator acts: its departure no longer holds.
        ledger.record(&[], &[departure(1)]);
        assert!(!ledger.holds(&departure(1), left), "the sockets connected to it again are kept");
        assert!(ledger.holds(&departure(2), left));
        // It leaves again: the later departure holds, for its own round and the earlier one's.
        let again = ledger.record(&[departure(1)], &[]);
        assert!(ledger.holds(&departure(1), again) && ledger.holds(&departure(1), left));
        // Acting on the earlier round forgets nothing recorded later.
        ledger.done([(departure(1), left), (departure(2), left)]);
        assert!(ledger.holds(&departure(1), again));
        assert!(!ledger.holds(&departure(2), left), "acted on");
        ledger.done([(departure(1), again)]);
        assert!(ledger.with(|state| state.pending.is_empty()));
    }
}
