//! What the control loop reports to, beside the loop (the shape of kube-rs controllers' context):
//! health, metrics, and the problems it publishes as Events, each once per Service and topic until
//! its message changes, forgotten when it clears.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use topology_dataplane::{ApplyReport, DataplaneError};
use topology_kube::{
    ObjectId,
    events::{Problem, ProblemSink},
};
use topology_model::{Node, ObjectKey};
use topology_policy::desired::ServicePort;

use super::{Health, Observation};
use crate::metrics::{MapLabels, Metrics, NodeLabels, ReasonLabels};

/// What a problem of a Service is about: one is published per Service and topic until its
/// message changes, and forgotten when the topic clears.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Topic {
    /// The policy ignored some of the Service's configuration.
    Policy,
    /// A port of the Service is claimed by another Service.
    Conflict(ServicePort),
    /// A port of the Service could not be written to the kernel.
    Kernel(ServicePort),
    /// An object of the Service (itself, or one of its EndpointSlices) was skipped as invalid.
    Object(ObjectId),
    /// This node's kernel ejected a backend from a port of the Service (outlier ejection).
    Ejection(ServicePort, std::net::SocketAddr),
}

/// Health, metrics and published problems.
pub(super) struct Context {
    pub(super) health: Arc<Health>,
    pub(super) metrics: Arc<Metrics>,
    sink: Box<dyn ProblemSink>,
    /// What was published, per Service and topic. By Service first, so the calls every decided
    /// Service makes find its problems by a borrowed key, without building one.
    reported: BTreeMap<ObjectKey, BTreeMap<Topic, String>>,
    /// Ports the kernel refused, with their Service and the error, until an apply succeeds.
    kernel_failures: BTreeMap<ServicePort, (ObjectKey, String)>,
    /// Failed ports whose outdated set could not be withdrawn either, until an apply succeeds.
    stranded: BTreeSet<ServicePort>,
    /// What `node_info` says now.
    node_labels: Option<NodeLabels>,
    /// This node's rank among the cluster's Nodes and their count: which Services' cluster-wide
    /// problems this agent publishes (see [`Context::publishes`]).
    rank: (usize, usize),
}

impl Context {
    pub(super) fn new(health: Arc<Health>, metrics: Arc<Metrics>, sink: Box<dyn ProblemSink>) -> Self {
        Self {
            health,
            metrics,
            sink,
            reported: BTreeMap::new(),
            kernel_failures: BTreeMap::new(),
            stranded: BTreeSet::new(),
            node_labels: None,
            rank: (0, 0),
        }
    }

    /// This node's place among the cluster's Nodes (by name) and their count.
    pub(super) fn set_rank(&mut self, rank: (usize, usize)) {
        self.rank = rank;
    }

    /// Whether this agent publishes `service`'s problems of `topic` as Events. A problem of the
    /// node's own kernel (a port it refused, a backend it ejected) is published by that node; one of the Service itself (its configuration,
    /// a conflict, an invalid object) is the same on every node, and one tenant edit must not
    /// become one Event per node: it is published by the one agent the Service's name picks.
    fn publishes(&self, service: &ObjectKey, topic: &Topic) -> bool {
        let (rank, nodes) = self.rank;
        matches!(topic, Topic::Kernel(_) | Topic::Ejection(..))
            || nodes == 0
            || stable_hash(service) % nodes as u64 == rank as u64
    }

    /// Logs and publishes a problem, once per (Service, topic) until its message changes.
    pub(super) fn problem(&mut self, service: &ObjectKey, topic: Topic, reason: &'static str, message: String) {
        if self.reported.get(service).and_then(|topics| topics.get(&topic)) == Some(&message) {
            return;
        }
        tracing::warn!(service = %service, reason, "{message}");
        if !self.publishes(service, &topic) {
            self.reported.entry(service.clone()).or_default().insert(topic, message);
            return;
        }
        self.sink.publish(&Problem { service: service.clone(), reason, message: message.clone() });
        self.reported.entry(service.clone()).or_default().insert(topic, message);
    }

    /// The problem cleared: its next occurrence is published again.
    pub(super) fn resolved(&mut self, service: &ObjectKey, topic: &Topic) {
        self.forget(service, |held| held == topic);
    }

    /// Every conflict of `service` cleared.
    pub(super) fn conflicts_resolved(&mut self, service: &ObjectKey) {
        self.forget(service, |topic| matches!(topic, Topic::Conflict(_)));
    }

    /// Forgets `service`'s problems whose topic is `cleared`.
    fn forget(&mut self, service: &ObjectKey, cleared: impl Fn(&Topic) -> bool) {
        let Some(topics) = self.reported.get_mut(service) else { return };
        topics.retain(|topic, _| !cleared(topic));
        if topics.is_empty() {
            self.reported.remove(service);
        }
    }

    /// Books the ports an apply could not program and those that recovered: metrics, readiness,
    /// and a problem for the Service owning each (`owner`). `attempted`: the ports the apply
    /// covered (`None`: all).
    pub(super) fn kernel_failures(
        &mut self,
        report: &ApplyReport,
        attempted: Option<&BTreeSet<ServicePort>>,
        owner: impl Fn(&ServicePort) -> Option<ObjectKey>,
    ) {
        let mut failed = BTreeMap::new();
        for (port, error) in &report.failed {
            let reason = match error {
                DataplaneError::MapFull { .. } | DataplaneError::OverShare { .. } => "MapFull",
                DataplaneError::InvalidService { .. } => "InvalidService",
                _ => "KernelWriteFailed",
            };
            self.metrics.control.apply_failures.get_or_create(&ReasonLabels { reason: reason.into() }).inc();
            let stranded = report.stranded.contains(port);
            if let Some(service) = owner(port) {
                let consequence = if stranded {
                    "the kernel still routes it by an outdated backend set that could not be withdrawn"
                } else {
                    "its connections pass to the ClusterIP untouched (kube-proxy) until it can be programmed"
                };
                self.problem(&service, Topic::Kernel(*port), reason, format!("{port}: {error}; {consequence}"));
                failed.insert(*port, (service, error.to_string()));
            }
        }
        self.stranded.retain(|port| attempted.is_some_and(|a| !a.contains(port)));
        self.stranded.extend(report.stranded.iter().copied());
        self.health.set_stranded(stranded_summary(&self.stranded));
        let recovered: Vec<ServicePort> = self
            .kernel_failures
            .keys()
            .filter(|port| !failed.contains_key(*port) && attempted.is_none_or(|a| a.contains(*port)))
            .copied()
            .collect();
        for port in recovered {
            if let Some((service, _)) = self.kernel_failures.remove(&port) {
                self.resolved(&service, &Topic::Kernel(port));
            }
        }
        self.kernel_failures.extend(failed);
        self.metrics.control.failed_service_ports.set(self.kernel_failures.len() as i64);
        self.health.set_failing(failing_summary(&self.kernel_failures));
    }

    /// This node's zone, as `node_info` last said it (empty before the Node is known or without one).
    pub(super) fn node_zone(&self) -> &str {
        self.node_labels.as_ref().map_or("", |labels| labels.zone.as_str())
    }

    /// Labels `node_info` with this node's place (a changed zone replaces the series).
    pub(super) fn node_info(&mut self, this: &Node) {
        let labels = NodeLabels {
            node: this.name.clone(),
            zone: this.zone().unwrap_or_default().to_owned(),
            region: this.region().unwrap_or_default().to_owned(),
        };
        if self.node_labels.as_ref() != Some(&labels) {
            self.metrics.control.node_info.clear();
            self.metrics.control.node_info.get_or_create(&labels).set(1);
            self.node_labels = Some(labels);
        }
    }

    /// Updates the gauges from what the programmer reports.
    pub(super) fn observe(&self, observation: &Observation) {
        self.metrics.control.services.set(observation.services as i64);
        self.metrics.control.backends.set(observation.backends as i64);
        for (map, used, capacity) in &observation.maps {
            let labels = MapLabels { map: (*map).to_owned() };
            self.metrics.control.map_entries.get_or_create(&labels).set(*used as i64);
            self.metrics.control.map_capacity.get_or_create(&labels).set(i64::from(*capacity));
        }
        self.metrics.control.record_grace_periods(observation.grace);
    }
}

/// FNV-1a of `namespace/name`: the same on every agent, whatever the build or the process.
fn stable_hash(service: &ObjectKey) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in service.namespace.bytes().chain(*b"/").chain(service.name.bytes()) {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

/// Why the view is not current while some port keeps an outdated set; `None` when none does.
fn stranded_summary(stranded: &BTreeSet<ServicePort>) -> Option<String> {
    let first = stranded.first()?;
    let more = stranded.len() - 1;
    let tail = if more > 0 { format!(" and {more} more") } else { String::new() };
    Some(format!("the kernel routes {first}{tail} by an outdated backend set that could not be withdrawn"))
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
mod tests {
    use topology_kube::events::LogOnly;
    use topology_model::Protocol;

    use super::*;

    #[test]
    fn a_services_own_problems_come_from_one_node_its_kernels_from_each() {
        #[derive(Clone, Default)]
        struct Count(Arc<std::sync::Mutex<usize>>);
        impl ProblemSink for Count {
            fn publish(&self, _: &Problem) {
                *self.0.lock().unwrap() += 1;
            }
        }
        let port = ServicePort { vip: [10, 96, 0, 1].into(), port: 80, protocol: Protocol::Tcp };
        for service in (0..50).map(|n| ObjectKey::new("ns", format!("svc-{n}").as_str())) {
            let count = Count::default();
            for rank in 0..7 {
                let mut context = Context::new(Arc::default(), Arc::default(), Box::new(count.clone()));
                context.set_rank((rank, 7));
                context.problem(&service, Topic::Policy, "IgnoredConfiguration", "x".into());
                context.problem(&service, Topic::Kernel(port), "MapFull", "y".into());
            }
            assert_eq!(*count.0.lock().unwrap(), 1 + 7, "{service}: one policy Event, a kernel Event per node");
        }
    }

    #[test]
    fn a_services_conflicts_clear_alone() {
        let mut context = Context::new(Arc::default(), Arc::default(), Box::new(LogOnly));
        let port = |last: u8| ServicePort { vip: [10, 96, 0, last].into(), port: 80, protocol: Protocol::Tcp };
        let (a, b, c) = (ObjectKey::new("ns", "a"), ObjectKey::new("ns", "b"), ObjectKey::new("ns", "c"));
        for service in [&a, &b, &c] {
            context.problem(service, Topic::Policy, "IgnoredConfiguration", "x".into());
            context.problem(service, Topic::Conflict(port(1)), "ClusterIPConflict", "y".into());
            context.problem(service, Topic::Conflict(port(2)), "ClusterIPConflict", "y".into());
            context.problem(service, Topic::Kernel(port(1)), "MapFull", "z".into());
        }
        context.conflicts_resolved(&b);
        let left: Vec<(&str, &Topic)> =
            context.reported.iter().flat_map(|(key, topics)| topics.keys().map(|topic| (&*key.name, topic))).collect();
        let mut expected = Vec::new();
        for name in ["a", "b", "c"] {
            expected.push((name, Topic::Policy));
            if name != "b" {
                expected.extend([(name, Topic::Conflict(port(1))), (name, Topic::Conflict(port(2)))]);
            }
            expected.push((name, Topic::Kernel(port(1))));
        }
        assert_eq!(left, expected.iter().map(|(name, topic)| (*name, topic)).collect::<Vec<_>>());
    }
}
