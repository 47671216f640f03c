//! Liveness and readiness, as the controller reports them and `/healthz` and `/readyz` read them.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Mutex,
    time::{Duration, Instant},
};

use topology_model::Kind;

/// The controller loop must check in at least this often to count as alive.
pub const LIVENESS_DEADLINE: Duration = Duration::from_secs(30);

/// How long a watch may fail before the view counts as stale, in the agent: an API server's
/// restart breaks every agent's watches at once, and must not flip every agent NotReady (nor stop
/// every node's DNS steering) at once; a failure that outlasts it does.
pub const WATCH_STALE_GRACE: Duration = Duration::from_secs(30);

/// Shared health state.
#[derive(Debug)]
pub struct Health {
    state: Mutex<State>,
    /// See [`WATCH_STALE_GRACE`]; zero in [`Health::default`].
    stale_grace: Duration,
}

/// Why a source lost its view, and since when.
#[derive(Debug)]
struct Stale {
    reason: String,
    since: Instant,
    /// Counts only once it has lasted the grace.
    transient: bool,
}

#[derive(Debug)]
struct State {
    heartbeat: Instant,
    waiting_for: BTreeSet<Kind>,
    stale: BTreeMap<String, Stale>,
    /// Sources whose view has been current at least once.
    current_once: BTreeSet<String>,
    programmed: bool,
    blocked: Option<String>,
    failing: Option<String>,
    stranded: Option<String>,
    detached: Option<String>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            state: Mutex::new(State {
                heartbeat: Instant::now(),
                waiting_for: Kind::ALL.into(),
                stale: BTreeMap::new(),
                current_once: BTreeSet::new(),
                programmed: false,
                blocked: None,
                failing: None,
                stranded: None,
                detached: None,
            }),
            stale_grace: Duration::ZERO,
        }
    }
}

impl Health {
    /// Health whose failing watches make the view stale only after `grace`.
    pub fn with_stale_grace(grace: Duration) -> Self {
        Self { stale_grace: grace, ..Self::default() }
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        // A panic while holding this lock would be a bug elsewhere; the data is still usable.
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        f(&mut state)
    }

    /// The controller loop is alive.
    pub fn beat(&self) {
        self.with(|s| s.heartbeat = Instant::now());
    }

    /// The initial list of `kind` is complete.
    pub fn listed(&self, kind: Kind) {
        self.with(|s| s.waiting_for.remove(&kind));
    }

    /// Every kind is listed at once (the file source).
    pub fn listed_all(&self) {
        self.with(|s| s.waiting_for.clear());
    }

    /// A source lost its view, or got it back (`reason` None).
    pub fn set_stale(&self, source: &str, reason: Option<String>) {
        self.with(|s| match reason {
            Some(reason) => {
                s.stale.insert(source.to_owned(), Stale { reason, since: Instant::now(), transient: false });
            }
            None => {
                s.stale.remove(source);
                s.current_once.insert(source.to_owned());
            }
        });
    }

    /// A source's watch failed: the view counts as stale once that has lasted the grace (from
    /// its first failure; [`Health::set_stale`] with `None` ends it).
    pub fn set_watch_failing(&self, source: &str, reason: String) {
        self.with(|s| {
            let since = s.stale.get(source).map_or_else(Instant::now, |stale| stale.since);
            s.stale.insert(source.to_owned(), Stale { reason, since, transient: true });
        });
    }

    /// The sources whose loss of view counts now, with why. The grace is for a watch that ran
    /// and broke (an API server restarting under a fleet): before every kind is listed, or for a
    /// source that never had a current view, the agent is not ready anyway, and the grace would
    /// only hide why (a ServiceAccount without `watch`, an API server out of reach).
    fn stale_now<'a>(&self, state: &'a State) -> impl Iterator<Item = (&'a String, &'a String)> {
        let grace = self.stale_grace;
        let listed = state.waiting_for.is_empty();
        state
            .stale
            .iter()
            .filter(move |(source, s)| {
                !s.transient || !listed || !state.current_once.contains(*source) || s.since.elapsed() >= grace
            })
            .map(|(k, s)| (k, &s.reason))
    }

    /// The kernel holds the desired state of a complete view.
    pub fn programmed(&self) {
        self.with(|s| s.programmed = true);
    }

    /// Something keeps the agent from programming (`None`: nothing does).
    pub fn set_blocked(&self, reason: Option<String>) {
        self.with(|s| s.blocked = reason);
    }

    /// Some service ports could not be programmed (`None`: every port is), and why.
    pub fn set_failing(&self, failing: Option<String>) {
        self.with(|s| s.failing = failing);
    }

    /// Some port's outdated backend set could not be withdrawn (`None`: every failed port holds
    /// nothing), and which.
    pub fn set_stranded(&self, stranded: Option<String>) {
        self.with(|s| s.stranded = stranded);
    }

    /// Some programs are no longer attached (`None`: every one is), and which.
    pub fn set_detached(&self, detached: Option<String>) {
        self.with(|s| s.detached = detached);
    }

    /// True when the kernel holds the policy of a complete view that is current: what the
    /// agent's heartbeat vouches for. Ports that failed to program hold nothing and do not make
    /// the view old; a port left holding an outdated set does.
    pub fn view_current(&self) -> bool {
        self.with(|s| {
            s.waiting_for.is_empty()
                && self.stale_now(s).next().is_none()
                && s.programmed
                && s.blocked.is_none()
                && s.stranded.is_none()
        })
    }

    /// Ok when the controller loop checked in recently.
    pub fn liveness(&self) -> Result<(), NotLive> {
        self.with(|s| {
            let silent_for = s.heartbeat.elapsed();
            if silent_for > LIVENESS_DEADLINE { Err(NotLive { silent_for }) } else { Ok(()) }
        })
    }

    /// Ok when the kernel holds the policy of a complete, current view of the cluster.
    pub fn readiness(&self) -> Result<(), NotReady> {
        self.with(|s| {
            let mut reasons = Vec::new();
            if !s.waiting_for.is_empty() {
                let kinds: Vec<String> = s.waiting_for.iter().map(ToString::to_string).collect();
                reasons.push(format!("waiting for the initial list of {}", kinds.join(", ")));
            }
            for (source, reason) in self.stale_now(s) {
                reasons.push(format!("view is stale: {source}: {reason}"));
            }
            if let Some(blocked) = &s.blocked {
                reasons.push(blocked.clone());
            } else if s.waiting_for.is_empty() && !s.programmed {
                reasons.push("not programmed yet".into());
            }
            if let Some(failing) = &s.failing {
                reasons.push(failing.clone());
            }
            if let Some(stranded) = &s.stranded {
                reasons.push(stranded.clone());
            }
            if let Some(detached) = &s.detached {
                reasons.push(detached.clone());
            }
            if reasons.is_empty() { Ok(()) } else { Err(NotReady { reasons }) }
        })
    }
}

/// The controller loop has not checked in for too long (`/healthz`).
#[derive(Debug, thiserror::Error)]
#[error("controller loop silent for {:.0} s", silent_for.as_secs_f64())]
pub struct NotLive {
    /// Since its last check-in.
    pub silent_for: Duration,
}

/// Why the kernel does not hold the policy of a complete, current view (`/readyz`): every
/// reason, in order.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", reasons.join("; "))]
pub struct NotReady {
    /// One line each.
    pub reasons: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_listed_fresh_and_programmed() {
        let health = Health::default();
        assert!(
            health
                .readiness()
                .unwrap_err()
                .to_string()
                .contains("waiting for the initial list of Node, Service, EndpointSlice")
        );
        health.listed(Kind::Node);
        health.listed(Kind::Service);
        health.listed(Kind::EndpointSlice);
        assert_eq!(health.readiness().unwrap_err().to_string(), "not programmed yet");
        health.programmed();
        assert!(health.readiness().is_ok());
        health.set_stale("EndpointSlice watch", Some("connection reset".into()));
        assert_eq!(health.readiness().unwrap_err().to_string(), "view is stale: EndpointSlice watch: connection reset");
        health.set_stale("EndpointSlice watch", None);
        health.set_blocked(Some("node a is gone".into()));
        assert_eq!(health.readiness().unwrap_err().to_string(), "node a is gone");
        health.set_blocked(None);
        assert!(health.readiness().is_ok());
        assert!(health.view_current());
        health.set_failing(Some("2 service ports failed to program: map topo_slots is full".into()));
        assert_eq!(
            health.readiness().unwrap_err().to_string(),
            "2 service ports failed to program: map topo_slots is full"
        );
        assert!(health.view_current(), "failed ports hold nothing and do not make the view old");
        health.set_stranded(Some("the kernel routes 10.96.0.1:80/TCP by an outdated backend set".into()));
        assert!(!health.view_current(), "a port left with an outdated set does");
        health.set_stranded(None);
        health.set_failing(None);
        health.set_stale("Node watch", Some("stalled".into()));
        assert!(!health.view_current());
        assert!(health.liveness().is_ok());
    }

    #[test]
    fn a_failing_watch_counts_only_once_it_outlasts_the_grace() {
        let health = Health::with_stale_grace(Duration::from_millis(200));
        Kind::ALL.iter().for_each(|kind| health.listed(*kind));
        health.programmed();
        // The watch ran (its view current), then broke.
        health.set_stale("Node watch", None);
        health.set_watch_failing("Node watch", "connection refused".into());
        assert!(health.readiness().is_ok() && health.view_current(), "an API server restarting");
        std::thread::sleep(Duration::from_millis(120));
        health.set_watch_failing("Node watch", "connection refused".into());
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(
            health.readiness().unwrap_err().to_string(),
            "view is stale: Node watch: connection refused",
            "the grace runs from the first failure, not the last"
        );
        assert!(!health.view_current());
        health.set_stale("Node watch", None);
        assert!(health.readiness().is_ok());
        health.set_stale("cluster file", Some("spec.clusterIP: bad".into()));
        assert!(health.readiness().is_err(), "a source that is not a watch has no grace");
    }

    #[test]
    fn a_watch_that_never_ran_is_named_at_once() {
        let health = Health::with_stale_grace(Duration::from_secs(30));
        Kind::ALL.iter().for_each(|kind| health.listed(*kind));
        health.programmed();
        health.set_watch_failing("Service watch", "forbidden (HTTP 403): cannot watch services".into());
        assert_eq!(
            health.readiness().unwrap_err().to_string(),
            "view is stale: Service watch: forbidden (HTTP 403): cannot watch services",
            "listed, never watched: no restart to ride out"
        );
    }

    #[test]
    fn before_the_first_lists_a_failing_watch_is_named_at_once() {
        let health = Health::with_stale_grace(Duration::from_secs(30));
        health.set_watch_failing("Node watch", "forbidden (HTTP 403): cannot list nodes".into());
        assert_eq!(
            health.readiness().unwrap_err().to_string(),
            "waiting for the initial list of Node, Service, EndpointSlice; \
             view is stale: Node watch: forbidden (HTTP 403): cannot list nodes",
            "not ready either way: the reason is said, not held back for the grace"
        );
    }
}
