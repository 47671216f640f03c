//! The node plan: the output of the policy stage for one node, and the one thing both `explain`
//! prints and the dataplane programs.
//!
//! For every Service it keeps the policy's decisions (per port and family: mode, reason,
//! warnings, weights); from them, the kernel's entries (per ClusterIP, port and protocol: backends
//! with integer weights, options), and which Service owns each such port when two claim it. The
//! controller updates it one Service at a time; `explain` builds it whole. A headless Service has
//! no kernel entry: its topology is this node's DNS answer, planned here too ([`headless`]).

pub mod alias;
pub mod headless;
pub mod ownership;
mod serving;
pub mod steering;
pub mod weights;

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

pub use headless::Headless;
pub use ownership::{Ownership, OwnershipUpdate};
use topology_model::{ClusterState, Node, ObjectKey};

use crate::{
    desired::{DesiredService, DesiredState, ServicePort},
    feedback,
    plan::steering::Steering,
    policy::{self, PolicyError, PortSelection},
};

/// Rounds of retries in one update: each round only recomputes Services that were waiting for a
/// port another released, and a port is released once per update.
pub const RETRY_ROUNDS: usize = 16;

/// What one node programs, and why.
#[derive(Debug)]
pub struct NodePlan {
    node: String,
    steering: Option<Steering>,
    selections: BTreeMap<ObjectKey, Vec<PortSelection>>,
    /// The DNS answers of headless Services (shared with the responder's view).
    headless: BTreeMap<ObjectKey, Arc<Headless>>,
    /// The Services with a port under feedback: what the controller visits once a second.
    under_feedback: BTreeSet<ObjectKey>,
    ownership: Ownership,
    feedback: feedback::Inputs,
    /// Which ports the load signal measures.
    measured: MeasuredPorts,
}

/// Which ports the load signal measures (`--load-signal`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MeasuredPorts {
    /// None: the load signal is off.
    Off,
    /// Ports under feedback, which need it.
    #[default]
    Feedback,
    /// Every port.
    All,
}

impl NodePlan {
    /// An empty plan for `node`; `steering`: the cluster DNS steered to this node's responder.
    pub fn new(node: impl Into<String>, steering: Option<Steering>) -> Self {
        Self {
            node: node.into(),
            steering,
            selections: BTreeMap::new(),
            headless: BTreeMap::new(),
            under_feedback: BTreeSet::new(),
            ownership: Ownership::default(),
            feedback: feedback::Inputs::new(),
            measured: MeasuredPorts::Feedback,
        }
    }

    /// Has the load signal measure `measured` ports' connections.
    pub fn measured(mut self, measured: MeasuredPorts) -> Self {
        self.measured = measured;
        self
    }

    /// The whole plan of `node`: every Service decided, ports released retried by those waiting.
    pub fn build(state: &ClusterState, node: &str, steering: Option<Steering>) -> Result<Self, PolicyError> {
        Self::build_with_feedback(state, node, steering, feedback::Inputs::new())
    }

    /// [`build`](Self::build), the feedback controller's `inputs` taken as they stand: the plan a
    /// loop that made every change one by one, feedback included, must equal.
    pub fn build_with_feedback(
        state: &ClusterState,
        node: &str,
        steering: Option<Steering>,
        inputs: feedback::Inputs,
    ) -> Result<Self, PolicyError> {
        let this = state.node(node).ok_or_else(|| PolicyError::UnknownNode(node.to_owned()))?;
        let mut plan = Self::new(node, steering);
        plan.feedback = inputs;
        let mut waiting = BTreeSet::new();
        for service in state.services() {
            waiting.extend(plan.update(state, this, &service.key).retry);
        }
        plan.retry(state, this, waiting);
        Ok(plan)
    }

    /// Decides `key` again (gone from `state`: removed from the plan) and updates its entries.
    pub fn update(&mut self, state: &ClusterState, this: &Node, key: &ObjectKey) -> OwnershipUpdate {
        match state.service(key).filter(|s| s.headless && s.external_name.is_none()) {
            Some(service) => {
                let answers = headless::decide(state, this, service);
                if self.headless.get(key).is_none_or(|old| **old != answers) {
                    self.headless.insert(key.clone(), Arc::new(answers));
                }
            }
            None => {
                self.headless.remove(key);
            }
        }
        let mut selections = match state.service(key) {
            Some(service) => policy::compute_service_with(state, this, service, &self.feedback),
            None => Vec::new(),
        };
        if let Some(steering) = &self.steering {
            steering.apply(&this.name, &mut selections);
        }
        if self.measured != MeasuredPorts::Feedback {
            for selected in &mut selections {
                selected.options.measured = self.measured == MeasuredPorts::All;
            }
        }
        let update = self.ownership.set(key, weights::desired_state(&selections).services);
        if selections.iter().any(|s| s.selection.feedback.is_some()) {
            self.under_feedback.insert(key.clone());
        } else {
            self.under_feedback.remove(key);
        }
        if selections.is_empty() {
            self.selections.remove(key);
        } else {
            self.selections.insert(key.clone(), selections);
        }
        update
    }

    /// Decides `waiting` Services again, and those waiting for the ports they release, until none
    /// is left; returns the ports that changed.
    pub fn retry(&mut self, state: &ClusterState, this: &Node, waiting: BTreeSet<ObjectKey>) -> BTreeSet<ServicePort> {
        let (mut waiting, mut changed) = (waiting, BTreeSet::new());
        for _ in 0..RETRY_ROUNDS {
            if waiting.is_empty() {
                break;
            }
            for key in std::mem::take(&mut waiting) {
                let update = self.update(state, this, &key);
                changed.extend(update.changed);
                waiting.extend(update.retry);
            }
        }
        changed
    }

    /// The node planned for.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The policy's selections for one Service, per port and family.
    pub fn selections(&self, key: &ObjectKey) -> &[PortSelection] {
        self.selections.get(key).map_or(&[], Vec::as_slice)
    }

    /// The DNS answers of headless Service `key`.
    pub fn headless(&self, key: &ObjectKey) -> Option<&Arc<Headless>> {
        self.headless.get(key)
    }

    /// Every headless Service's DNS answers, by Service.
    pub fn all_headless(&self) -> impl Iterator<Item = (&ObjectKey, &Arc<Headless>)> {
        self.headless.iter()
    }

    /// Every Service's selections, by Service.
    pub fn all_selections(&self) -> impl Iterator<Item = (&ObjectKey, &[PortSelection])> {
        self.selections.iter().map(|(key, selections)| (key, selections.as_slice()))
    }

    /// What the kernel should hold: one entry per owned ClusterIP, port and protocol. (What it
    /// holds is the dataplane's `kernel()`.)
    pub fn desired(&self) -> &DesiredState {
        self.ownership.desired()
    }

    /// The kernel entry of a port, if it is planned.
    pub fn entry(&self, port: &ServicePort) -> Option<&DesiredService> {
        self.desired().services.get(port)
    }

    /// The Service owning a port.
    pub fn owner(&self, port: &ServicePort) -> Option<&ObjectKey> {
        self.ownership.owner(port)
    }

    /// What the default policy would keep in this node's zone for a planned port
    /// ([`policy::Selection::baseline_in_zone`]).
    pub fn baseline_in_zone(&self, port: &ServicePort) -> Option<f64> {
        self.selections(self.owner(port)?)
            .iter()
            .find(|d| d.port.port == port.port && d.port.protocol == port.protocol && d.cluster_ips.contains(&port.vip))
            .and_then(|d| d.selection.baseline_in_zone)
    }

    /// Every planned port's [`Self::baseline_in_zone`], from one walk of the selections: a full
    /// sync asks for all of them, and searching the owner and then its selections per port is
    /// quadratic in a large cluster.
    pub fn baselines(&self) -> impl Iterator<Item = (ServicePort, f64)> + '_ {
        self.selections.iter().flat_map(move |(key, selections)| {
            selections.iter().flat_map(move |decision| {
                decision.cluster_ips.iter().filter_map(move |&vip| {
                    let port = ServicePort { vip, port: decision.port.port, protocol: decision.port.protocol };
                    let baseline = decision.selection.baseline_in_zone?;
                    (self.owner(&port) == Some(key)).then_some((port, baseline))
                })
            })
        })
    }

    /// The feedback controller's inputs the plan was decided with.
    pub fn feedback(&self) -> &feedback::Inputs {
        &self.feedback
    }

    /// The feedback controller's inputs from now on; returns the Services whose ports' inputs
    /// changed, for the caller to [`NodePlan::update`].
    pub fn set_feedback(&mut self, inputs: feedback::Inputs) -> BTreeSet<ObjectKey> {
        let mut changed: BTreeSet<ObjectKey> = BTreeSet::new();
        for (key, input) in &inputs {
            if self.feedback.get(key) != Some(input) {
                changed.insert(key.service.clone());
            }
        }
        changed.extend(self.feedback.keys().filter(|key| !inputs.contains_key(*key)).map(|key| key.service.clone()));
        self.feedback = inputs;
        changed
    }

    /// Every port under feedback, with its usable endpoints near and far: what the controller
    /// measures.
    pub fn feedback_ports(&self) -> BTreeMap<feedback::PortKey, feedback::control::PortBackends> {
        let mut ports = BTreeMap::new();
        for service in &self.under_feedback {
            for selected in self.selections(service) {
                if let Some(report) = &selected.selection.feedback {
                    let key = feedback::PortKey {
                        service: service.clone(),
                        port: selected.port.port,
                        family: selected.family,
                    };
                    let backends =
                        feedback::control::PortBackends { near: report.near.clone(), far: report.far.clone() };
                    ports.insert(key, backends);
                }
            }
        }
        ports
    }

    /// Services with kernel entries, and those only decided (no ClusterIP, or every port held by
    /// another): everything an update of the whole plan must visit.
    pub fn services(&self) -> BTreeSet<ObjectKey> {
        self.selections.keys().chain(self.ownership.services()).chain(self.headless.keys()).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use topology_model::yaml;

    use super::*;

    const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}}
- apiVersion: v1
  kind: Service
  metadata: {name: first, namespace: default}
  spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
- apiVersion: v1
  kind: Service
  metadata: {name: second, namespace: default}
  spec: {clusterIP: 10.96.0.10, ports: [{port: 80}, {port: 81}]}
"#;

    #[test]
    fn a_port_claimed_twice_is_owned_by_one_service_and_both_are_decided() {
        let state = yaml::parse(CLUSTER, "test").unwrap();
        let plan = NodePlan::build(&state, "node-a", None).unwrap();
        let port =
            |p| ServicePort { vip: "10.96.0.10".parse().unwrap(), port: p, protocol: topology_model::Protocol::Tcp };
        assert_eq!(plan.owner(&port(80)), Some(&ObjectKey::new("default", "first")));
        assert_eq!(plan.owner(&port(81)), Some(&ObjectKey::new("default", "second")));
        assert_eq!(plan.selections(&ObjectKey::new("default", "second")).len(), 2, "decided even where not owned");
        assert_eq!(plan.desired().services.len(), 2);
        assert!(matches!(NodePlan::build(&state, "node-z", None), Err(PolicyError::UnknownNode(_))));
    }

    #[test]
    fn the_baselines_are_the_owners_port_by_port() {
        let endpoints = r#"
- {apiVersion: v1, kind: Node, metadata: {name: node-b, labels: {topology.kubernetes.io/zone: zone-b}}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: first-1, namespace: default, labels: {kubernetes.io/service-name: first}}
  addressType: IPv4
  ports: [{port: 8080}]
  endpoints:
  - {addresses: [10.0.0.1], nodeName: node-a, conditions: {ready: true}}
  - {addresses: [10.0.0.2], nodeName: node-b, conditions: {ready: true}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: second-1, namespace: default, labels: {kubernetes.io/service-name: second}}
  addressType: IPv4
  ports: [{port: 8080}]
  endpoints:
  - {addresses: [10.0.0.3], nodeName: node-b, conditions: {ready: true}}
"#;
        let state = yaml::parse(&format!("{CLUSTER}{endpoints}"), "test").unwrap();
        let plan = NodePlan::build(&state, "node-a", None).unwrap();
        let port =
            |p| ServicePort { vip: "10.96.0.10".parse().unwrap(), port: p, protocol: topology_model::Protocol::Tcp };
        let all: BTreeMap<ServicePort, f64> = plan.baselines().collect();
        assert_eq!(all, BTreeMap::from([(port(80), 0.5), (port(81), 0.0)]), "port 80 is the first Service's");
        let each: BTreeMap<ServicePort, f64> =
            plan.desired().services.keys().filter_map(|p| Some((*p, plan.baseline_in_zone(p)?))).collect();
        assert_eq!(all, each);
    }

    #[test]
    fn a_released_port_goes_to_the_service_waiting_for_it() {
        let mut state = yaml::parse(CLUSTER, "test").unwrap();
        let mut plan = NodePlan::build(&state, "node-a", None).unwrap();
        let this = state.node("node-a").unwrap().clone();
        let first = ObjectKey::new("default", "first");
        state.remove_service(&first);
        let update = plan.update(&state, &this, &first);
        let changed = plan.retry(&state, &this, update.retry);
        let port =
            ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 80, protocol: topology_model::Protocol::Tcp };
        assert!(changed.contains(&port));
        assert_eq!(plan.owner(&port), Some(&ObjectKey::new("default", "second")));
        assert!(plan.selections(&first).is_empty());
    }

    #[test]
    fn a_service_kube_proxy_leaves_to_another_proxy_is_not_programmed() {
        let text = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: a, labels: {topology.kubernetes.io/zone: z}}}
- apiVersion: v1
  kind: Service
  metadata: {name: mesh, namespace: ns, labels: {service.kubernetes.io/service-proxy-name: my-proxy}}
  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: ns}
  spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: mesh-1, namespace: ns, labels: {kubernetes.io/service-name: mesh}}
  addressType: IPv4
  ports: [{port: 8080}]
  endpoints: [{addresses: [10.244.0.1], nodeName: a}]
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: ns, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{port: 8080}]
  endpoints: [{addresses: [10.244.0.2], nodeName: a}]
"#;
        let state = yaml::parse(text, "proxies.yaml").unwrap();
        let plan = NodePlan::build(&state, "a", None).unwrap();
        let vips: Vec<String> = plan.desired().services.keys().map(|port| port.vip.to_string()).collect();
        assert_eq!(vips, ["10.96.0.2"], "only the Service kube-proxy would program");
    }
}
