//! The controller: keeps the kernel equal to what the policy says for this node. It owns the
//! cluster state and the dataplane; sources send it events, it recomputes only the Services an
//! event can affect, and hands the changed entries to the dataplane.
//!
//! Nothing is programmed until every source has completed its initial list; the first programming
//! is a full reconcile with whatever a previous agent left pinned (stale entries removed,
//! unchanged ones not rewritten). Events that arrive together are handled as one batch.

mod health;
mod ingest;
mod program;
mod routes;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{Arc, mpsc::RecvTimeoutError},
    time::{Duration, Instant},
};

pub use health::Health;
pub use program::{Observation, Programmer};
use routes::Routes;
use tokio_util::sync::CancellationToken;

use crate::{
    cluster::{ClusterState, Kind, Node, ObjectKey},
    dataplane::{ApplyReport, DataplaneError},
    desired::ServicePort,
    dns::{DnsPublisher, steer::Steering},
    metrics::{Metrics, ReasonLabels},
    policy::{self, desired::desired_state},
    report::{Problem, ProblemSink},
    sockets::Terminator,
    source::{EventReceiver, Invalid, ObjectId},
};

/// How the controller runs.
#[derive(Clone, Debug)]
pub struct ControllerConfig {
    /// The node this agent programs for.
    pub node: String,
    /// How often the whole desired state is re-applied, retrying service ports that failed.
    pub reconcile_interval: Duration,
}

impl ControllerConfig {
    /// Defaults: reconcile every minute.
    pub fn new(node: impl Into<String>) -> Self {
        Self { node: node.into(), reconcile_interval: Duration::from_secs(60) }
    }
}

/// How often the kernel heartbeat is refreshed while the view is current; `--fail-open-after`
/// must be comfortably longer.
pub const BEAT_INTERVAL: Duration = Duration::from_millis(500);

/// The controller cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// The node named with `--node` / `NODE_NAME` is not in the cluster.
    #[error(
        "node {0:?} is not in the cluster (no Node object of that name after the initial list); check --node or \
         NODE_NAME: routing without knowing where this node is would send traffic anywhere"
    )]
    UnknownNode(String),
    /// This node's own Node object cannot be used.
    #[error("this node's Node object cannot be used: {0}; the agent cannot route without knowing where it is")]
    InvalidOwnNode(crate::cluster::ObjectError),
}

/// The control loop.
pub struct Controller<P: Programmer> {
    config: ControllerConfig,
    programmer: P,
    state: ClusterState,
    routes: Routes,
    dirty: BTreeSet<ObjectKey>,
    everything_dirty: bool,
    listed: BTreeSet<Kind>,
    programmed: bool,
    skipped: BTreeMap<ObjectId, Invalid>,
    reported: BTreeMap<(ObjectKey, String), String>,
    kernel_failures: BTreeMap<ServicePort, (ObjectKey, String)>,
    oldest_pending: Option<Instant>,
    last_beat: Option<Instant>,
    terminator: Option<Terminator>,
    dns: Option<DnsPublisher>,
    steering: Option<Steering>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    sink: Box<dyn ProblemSink>,
}

impl<P: Programmer> Controller<P> {
    /// A controller programming through `programmer`.
    pub fn new(
        config: ControllerConfig,
        programmer: P,
        health: Arc<Health>,
        metrics: Arc<Metrics>,
        sink: Box<dyn ProblemSink>,
    ) -> Self {
        Self {
            config,
            programmer,
            state: ClusterState::default(),
            routes: Routes::default(),
            dirty: BTreeSet::new(),
            everything_dirty: false,
            listed: BTreeSet::new(),
            programmed: false,
            skipped: BTreeMap::new(),
            reported: BTreeMap::new(),
            kernel_failures: BTreeMap::new(),
            oldest_pending: None,
            last_beat: None,
            terminator: None,
            dns: None,
            steering: None,
            health,
            metrics,
            sink,
        }
    }

    /// Hands the backends that leave a set to `terminator`, which destroys the sockets still
    /// connected to them through the service.
    pub fn with_terminator(mut self, terminator: Option<Terminator>) -> Self {
        self.terminator = terminator;
        self
    }

    /// Keeps `dns`'s view of this node's answers current, one Service at a time.
    pub fn with_dns(mut self, dns: Option<DnsPublisher>) -> Self {
        self.dns = dns;
        self
    }

    /// Steers the cluster DNS Service's port 53 to this node's responder.
    pub fn with_steering(mut self, steering: Option<Steering>) -> Self {
        self.steering = steering;
        self
    }

    /// Runs until `shutdown` or until every source is gone; returns the programmer. The kernel
    /// state stays as last programmed.
    pub fn run(mut self, events: &EventReceiver, shutdown: &CancellationToken) -> Result<P, ControllerError> {
        let mut next_reconcile = Instant::now() + self.config.reconcile_interval;
        while !shutdown.is_cancelled() {
            self.health.beat();
            let wait = next_reconcile.saturating_duration_since(Instant::now());
            match events.recv_timeout(wait.min(Duration::from_secs(1))) {
                Ok((seen, event)) => {
                    self.receive(seen, event);
                    // Everything already queued joins this batch: bursts cost one sync.
                    while let Ok((seen, event)) = events.try_recv() {
                        self.receive(seen, event);
                    }
                    self.sync()?;
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            let now = Instant::now();
            if now >= next_reconcile {
                next_reconcile = now + self.config.reconcile_interval;
                self.reconcile();
            }
            self.beat();
        }
        Ok(self.programmer)
    }

    /// Refreshes the kernel's heartbeat while the view is current, at most every
    /// [`BEAT_INTERVAL`]: the programs fail open once the view has not been current for
    /// `--fail-open-after`.
    fn beat(&mut self) {
        if !self.health.view_current() || self.last_beat.is_some_and(|at| at.elapsed() < BEAT_INTERVAL) {
            return;
        }
        match self.programmer.heartbeat() {
            Ok(()) => self.last_beat = Some(Instant::now()),
            Err(error) => tracing::warn!(%error, "the kernel heartbeat could not be written; retrying"),
        }
    }

    /// The programmer (tests read what it was given).
    pub fn programmer(&self) -> &P {
        &self.programmer
    }

    /// Recomputes what the events changed and programs it; nothing before every kind is listed.
    pub fn sync(&mut self) -> Result<(), ControllerError> {
        if self.listed.len() < 3 {
            return Ok(());
        }
        let node = self.config.node.clone();
        let Some(this) = self.state.node(&node).cloned() else {
            if !self.programmed {
                if let Some(invalid) = self.skipped.get(&ObjectId::Node(node.clone())) {
                    return Err(ControllerError::InvalidOwnNode(invalid.error.clone()));
                }
                return Err(ControllerError::UnknownNode(node));
            }
            self.health.set_blocked(Some(format!(
                "node {node} is no longer in the cluster; the kernel keeps the last programmed state"
            )));
            return Ok(());
        };
        self.health.set_blocked(None);
        if !self.programmed || self.everything_dirty {
            self.dirty.clear();
            self.everything_dirty = false;
            let keys: BTreeSet<ObjectKey> =
                self.state.services().map(|s| s.key.clone()).chain(self.routes.services().cloned()).collect();
            let started = Instant::now();
            for key in &keys {
                self.recompute(&this, key);
            }
            self.drain_retries(&this);
            let report = self.programmer.apply(self.routes.desired());
            self.finish(started, &report, None);
        } else if !self.dirty.is_empty() {
            let started = Instant::now();
            let mut changed = BTreeSet::new();
            for key in std::mem::take(&mut self.dirty) {
                changed.extend(self.recompute(&this, &key));
            }
            changed.extend(self.drain_retries(&this));
            let report = self.programmer.apply_changes(self.routes.desired(), &changed);
            self.finish(started, &report, Some(&changed));
        } else {
            self.oldest_pending = None;
        }
        if let Some(dns) = &mut self.dns {
            dns.publish();
        }
        Ok(())
    }

    /// Re-applies the whole desired state: retries failures and heals drift.
    fn reconcile(&mut self) {
        if self.programmed {
            let started = Instant::now();
            let report = self.programmer.apply(self.routes.desired());
            self.finish(started, &report, None);
        }
    }

    /// Books an apply: health, metrics, and the problems of ports that failed or recovered.
    /// `attempted` is the set of ports the apply covered (`None`: all).
    fn finish(&mut self, started: Instant, report: &ApplyReport, attempted: Option<&BTreeSet<ServicePort>>) {
        self.programmed = true;
        self.health.programmed();
        if let Some(terminator) = &self.terminator {
            terminator.submit(report.departed.clone());
        }
        self.metrics.sync_duration.observe(started.elapsed().as_secs_f64());
        if let Some(seen) = self.oldest_pending.take() {
            self.metrics.event_to_kernel.observe(seen.elapsed().as_secs_f64());
        }
        if report.added + report.updated + report.removed + report.failed.len() > 0 {
            tracing::info!(
                added = report.added,
                updated = report.updated,
                removed = report.removed,
                unchanged = report.unchanged,
                failed = report.failed.len(),
                "kernel maps updated"
            );
        }
        let mut failed = BTreeMap::new();
        for (port, error) in &report.failed {
            let reason = match error {
                DataplaneError::MapFull { .. } => "MapFull",
                DataplaneError::InvalidService { .. } => "InvalidService",
                _ => "KernelWriteFailed",
            };
            self.metrics.apply_failures.get_or_create(&ReasonLabels { reason: reason.into() }).inc();
            if let Some(service) = self.routes.owner(port).cloned() {
                let message = format!("{port}: {error}; the kernel keeps its previous state for this port");
                self.problem(&service, format!("kernel {port}"), reason, message);
                failed.insert(*port, (service, error.to_string()));
            }
        }
        let recovered: Vec<ServicePort> = self
            .kernel_failures
            .keys()
            .filter(|port| !failed.contains_key(*port) && attempted.is_none_or(|a| a.contains(*port)))
            .copied()
            .collect();
        for port in recovered {
            if let Some((service, _)) = self.kernel_failures.remove(&port) {
                self.reported.remove(&(service, format!("kernel {port}")));
            }
        }
        self.kernel_failures.extend(failed);
        self.metrics.failed_service_ports.set(self.kernel_failures.len() as i64);
        self.health.set_failing(failing_summary(&self.kernel_failures));
        for error in &report.housekeeping {
            tracing::warn!(%error, "kernel clean-up deferred to the next apply");
        }
        self.observe();
    }

    /// Recomputes one Service and stores its entries; returns the changed service ports.
    fn recompute(&mut self, this: &Node, key: &ObjectKey) -> BTreeSet<ServicePort> {
        let mut selections = match self.state.service(key) {
            Some(service) => policy::compute_service(&self.state, this, service),
            None => Vec::new(),
        };
        if let Some(steering) = &self.steering {
            steering.apply(&this.name, &mut selections);
        }
        if let Some(dns) = &mut self.dns {
            let changed = dns.view_mut().update(&self.state, this, key);
            dns.touch(changed);
        }
        let warnings: Vec<String> = selections
            .iter()
            .flat_map(|s| s.selection.warnings.iter().map(move |w| format!("port {}: {w}", s.port.port)))
            .collect();
        if warnings.is_empty() {
            self.reported.remove(&(key.clone(), "policy".into()));
        } else {
            self.problem(key, "policy".into(), "IgnoredConfiguration", warnings.join("; "));
        }
        let update = self.routes.set(key, desired_state(&selections).services);
        for (port, holder) in &update.conflicts {
            let message = format!("{port} is already programmed for Service {holder}; this Service's port is skipped");
            self.problem(key, format!("conflict {port}"), "ClusterIPConflict", message);
        }
        if update.conflicts.is_empty() {
            self.reported.retain(|(service, topic), _| service != key || !topic.starts_with("conflict "));
        }
        self.dirty.extend(update.retry);
        update.changed
    }

    /// Recomputes Services waiting for ports that others released, until none is left.
    fn drain_retries(&mut self, this: &Node) -> BTreeSet<ServicePort> {
        let mut changed = BTreeSet::new();
        // Each round only adds Services that were blocked; a port is released once per sync.
        for _ in 0..16 {
            if self.dirty.is_empty() {
                break;
            }
            for key in std::mem::take(&mut self.dirty) {
                changed.extend(self.recompute(this, &key));
            }
        }
        changed
    }

    /// Logs and publishes a problem, once per (Service, topic) until its message changes.
    fn problem(&mut self, service: &ObjectKey, topic: String, reason: &'static str, message: String) {
        let key = (service.clone(), topic);
        if self.reported.get(&key) == Some(&message) {
            return;
        }
        tracing::warn!(service = %service, reason, "{message}");
        self.sink.publish(&Problem { service: service.clone(), reason, message: message.clone() });
        self.reported.insert(key, message);
    }

    /// Updates the gauges from what the programmer reports.
    fn observe(&mut self) {
        let observation = self.programmer.observe();
        self.metrics.services.set(observation.services as i64);
        self.metrics.backends.set(observation.backends as i64);
        for (map, used, capacity) in &observation.maps {
            let labels = crate::metrics::MapLabels { map: (*map).to_owned() };
            self.metrics.map_entries.get_or_create(&labels).set(*used as i64);
            self.metrics.map_capacity.get_or_create(&labels).set(i64::from(*capacity));
        }
    }
}

/// "2 service ports failed to program (10.96.0.1:80/TCP: map topo_slots is full ...)", naming
/// the first few; `None` when none failed.
fn failing_summary(failures: &BTreeMap<ServicePort, (ObjectKey, String)>) -> Option<String> {
    const NAMED: usize = 3;
    if failures.is_empty() {
        return None;
    }
    let named: Vec<String> = failures.iter().take(NAMED).map(|(port, (_, error))| format!("{port}: {error}")).collect();
    let more = failures.len().saturating_sub(NAMED);
    let tail = if more > 0 { format!("; and {more} more") } else { String::new() };
    let noun = if failures.len() == 1 { "service port" } else { "service ports" };
    Some(format!("{} {noun} failed to program ({}{tail})", failures.len(), named.join("; ")))
}

#[cfg(test)]
mod tests;
