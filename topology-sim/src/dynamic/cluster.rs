//! The simulated cluster: zones of client nodes and endpoints, as the agent's own cluster state,
//! so every node decides through the agent's policy (`topology_policy::policy`).

use std::{collections::BTreeMap, net::SocketAddr};

use topology_model::{ClusterState, Family, ObjectKey, yaml};
use topology_policy::{
    feedback::{Inputs, PortKey},
    policy,
};

/// The routing a run compares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
pub enum Algorithm {
    /// `trafficDistribution: PreferClose`.
    PreferClose,
    /// `topology-agent.io/spillover: capacity`.
    Spillover,
    /// `topology-agent.io/spillover: feedback`.
    Feedback,
}

impl Algorithm {
    /// Every algorithm, in table order.
    pub const ALL: [Self; 3] = [Self::PreferClose, Self::Spillover, Self::Feedback];

    /// The row name.
    pub fn name(self) -> &'static str {
        match self {
            Self::PreferClose => "PreferClose",
            Self::Spillover => "static spillover",
            Self::Feedback => "feedback",
        }
    }
}

/// The shape of the cluster.
#[derive(Clone, Copy, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Shape {
    /// Zones (`zone-0`, `zone-1`, ...).
    pub zones: usize,
    /// Client nodes per zone, each with its own agent.
    pub nodes_per_zone: usize,
    /// Endpoints per zone.
    pub endpoints_per_zone: usize,
    /// Requests each endpoint serves at once.
    pub workers: usize,
    /// Time to serve one request, milliseconds.
    pub service_ms: f64,
}

impl Shape {
    /// Requests per second one zone's endpoints can serve.
    pub fn zone_capacity(&self) -> f64 {
        self.endpoints_per_zone as f64 * self.workers as f64 * 1000.0 / self.service_ms
    }

    /// Zone of node or endpoint index `i` (node `i` of `nodes_per_zone`, etc.).
    pub fn endpoint_zone(&self, endpoint: usize) -> usize {
        endpoint / self.endpoints_per_zone
    }
}

/// The cluster as the agent sees it, for one algorithm.
pub struct Cluster {
    state: ClusterState,
    service: ObjectKey,
    /// Endpoint addresses, index = endpoint number.
    pub endpoints: Vec<SocketAddr>,
    /// Node names, index = node number (zone-major).
    pub nodes: Vec<String>,
}

impl Cluster {
    /// Builds the cluster of `shape` with the Service routed by `algorithm`.
    pub fn new(shape: &Shape, algorithm: Algorithm) -> anyhow::Result<Self> {
        let mut yaml = String::from("apiVersion: v1\nkind: List\nitems:\n");
        let mut nodes = Vec::new();
        for zone in 0..shape.zones {
            for n in 0..shape.nodes_per_zone {
                let name = format!("node-{zone}-{n}");
                yaml.push_str(&format!(
                    "- {{apiVersion: v1, kind: Node, metadata: {{name: {name}, labels: {{topology.kubernetes.io/zone: \
                     zone-{zone}, topology.kubernetes.io/region: r1}}}}, status: {{allocatable: {{cpu: \"4\"}}, \
                     conditions: [{{type: Ready, status: \"True\"}}]}}}}\n"
                ));
                nodes.push(name);
            }
        }
        let (annotations, distribution) = match algorithm {
            Algorithm::PreferClose => ("{}", ", trafficDistribution: PreferClose"),
            Algorithm::Spillover => ("{topology-agent.io/spillover: capacity}", ""),
            Algorithm::Feedback => ("{topology-agent.io/spillover: feedback}", ""),
        };
        yaml.push_str(&format!(
            "- {{apiVersion: v1, kind: Service, metadata: {{name: web, namespace: default, annotations: {annotations}}}, \
             spec: {{clusterIPs: [10.96.0.10], ports: [{{name: http, port: 80, protocol: TCP}}]{distribution}}}}}\n"
        ));
        yaml.push_str(
            "- apiVersion: discovery.k8s.io/v1\n  kind: EndpointSlice\n  metadata: {name: web-1, namespace: default, \
             labels: {kubernetes.io/service-name: web}}\n  addressType: IPv4\n  ports: [{name: http, port: 8080, \
             protocol: TCP}]\n  endpoints:\n",
        );
        let mut endpoints = Vec::new();
        for zone in 0..shape.zones {
            for e in 0..shape.endpoints_per_zone {
                let address = format!("10.{}.0.{}", zone + 1, e + 1);
                yaml.push_str(&format!("  - {{addresses: [{address}], nodeName: node-{zone}-0}}\n"));
                endpoints.push(SocketAddr::new(address.parse()?, 8080));
            }
        }
        let state = yaml::parse(&yaml, "simulated cluster")?;
        Ok(Self { state, service: ObjectKey::new("default", "web"), endpoints, nodes })
    }

    /// The port key of the Service, for the feedback controller.
    pub fn port_key(&self) -> PortKey {
        PortKey { service: self.service.clone(), port: 80, family: Family::V4 }
    }

    /// Node `node`'s set, with the controller's `inputs`: what its kernel would hold and its
    /// feedback ports.
    pub fn decide(&self, node: usize, inputs: &Inputs) -> Decision {
        let this = self.state.node(&self.nodes[node]).expect("simulated node");
        let service = self.state.service(&self.service).expect("simulated Service");
        let selections = policy::compute_service_with(&self.state, this, service, inputs);
        let selection = &selections[0].selection;
        let total: f64 = selection.backends.iter().map(|b| b.weight).sum();
        let mut weights = vec![0.0; self.endpoints.len()];
        for backend in &selection.backends {
            let addr = SocketAddr::new(backend.address, backend.port);
            if let Some(i) = self.endpoints.iter().position(|e| *e == addr) {
                weights[i] = backend.weight / total;
            }
        }
        let mut ports = BTreeMap::new();
        if let Some(report) = &selection.feedback {
            let backends = ControlPorts { near: report.near.clone(), far: report.far.clone() };
            ports.insert(self.port_key(), backends);
        }
        Decision { weights, spill_at: selections[0].options.spill_at, ports }
    }
}

/// One node's set for the Service.
#[derive(Clone, Debug)]
pub struct Decision {
    /// Weights over the endpoints (index = endpoint number, summing to 1; 0: not in the set).
    pub weights: Vec<f64>,
    /// The connect hook's per-connection limit ([`topology_common::spill`]); 0: off.
    pub spill_at: u32,
    /// The feedback ports, as the controller takes them.
    pub ports: BTreeMap<PortKey, ControlPorts>,
}

/// A port's near and far endpoints, as the controller takes them.
pub type ControlPorts = topology_policy::feedback::control::PortBackends;

/// One stretch of constant demand.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Phase {
    /// Its name in the table.
    pub name: &'static str,
    /// How long, seconds.
    pub seconds: f64,
    /// Demand per zone, as a share of that zone's capacity.
    pub demand: Vec<f64>,
}
