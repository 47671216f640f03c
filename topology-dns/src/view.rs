//! What the responder answers from, for THIS node: the cluster's names, and for headless Services
//! the answers of the node plan (the same plan that programs the kernel); published by the
//! controller after each change, read by every query without a lock. Pure.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use topology_model::{ClusterState, Family, Node, ObjectKey, Prefix, Protocol};
pub use topology_policy::plan::headless::{Chosen, Headless, NamedChoice, NamedPort};
use topology_policy::{
    plan::{
        NodePlan,
        headless::{hosts, srv_ports},
    },
    policy::{PolicyError, join},
};

/// The Service whose ready endpoints are the default upstream.
pub const UPSTREAM_SERVICE: (&str, &str) = ("kube-system", "kube-dns");

/// The records of one Service.
#[derive(Clone, Debug, PartialEq)]
pub enum Records {
    /// A Service with ClusterIPs: the ClusterIPs, as CoreDNS answers.
    ClusterIp {
        /// ClusterIPs.
        ips: Vec<IpAddr>,
        /// Named ports, for SRV.
        ports: Vec<NamedPort>,
        /// `<label>.<svc>.<ns>.svc.<domain>`: its ready endpoints, by name.
        hosts: BTreeMap<String, Vec<IpAddr>>,
    },
    /// A headless Service: what this node's plan chose (shared with the plan).
    Headless(Arc<Headless>),
    /// `type: ExternalName`: a CNAME to this name, as CoreDNS answers.
    ExternalName {
        /// `spec.externalName`, lowercase, without the final dot.
        target: String,
    },
    /// Annotated `topology-agent.io/dns: upstream`: every query for its names is relayed.
    Upstream,
}

/// The hosts of a Service that has none.
static NO_HOSTS: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();

impl Records {
    /// The Service's ready endpoints by name.
    pub fn hosts(&self) -> &BTreeMap<String, Vec<IpAddr>> {
        match self {
            Self::ClusterIp { hosts, .. } => hosts,
            Self::Headless(h) => &h.hosts,
            Self::ExternalName { .. } | Self::Upstream => &NO_HOSTS,
        }
    }
}

/// Everything the responder answers from. Kept up to date one Service at a time by the
/// controller, and published as a whole: keys and records are shared, so a publish copies
/// pointers, never strings or records.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DnsView {
    /// By `namespace/name` (neither part can hold a `/`).
    services: HashMap<Arc<str>, Arc<Records>>,
    namespaces: HashMap<Arc<str>, usize>,
    configured: Vec<SocketAddr>,
    /// Where other names go: the configured upstreams, else the ready endpoints of
    /// `kube-system/kube-dns` (pod addresses: never a ClusterIP this node rewrites).
    pub upstreams: Vec<SocketAddr>,
    /// This node's pod CIDRs and addresses: who its own pods are ([`crate::clients`]).
    node: OwnNode,
}

/// What tells this node's pods and processes from others.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OwnNode {
    /// `spec.podCIDRs`.
    pub pod_cidrs: Vec<Prefix>,
    /// The Node's IP addresses.
    pub addresses: Vec<IpAddr>,
}

impl DnsView {
    /// An empty view; `configured`: the upstreams given on the command line (none: kube-dns).
    pub fn new(configured: Vec<SocketAddr>) -> Self {
        Self { upstreams: configured.clone(), configured, ..Self::default() }
    }

    /// The whole view from `state` and the node's `plan` of it.
    pub fn build(state: &ClusterState, plan: &NodePlan, configured: Vec<SocketAddr>) -> Self {
        let mut view = Self::new(configured);
        if let Some(node) = state.node(plan.node()) {
            view.set_node(node);
        }
        for service in state.services() {
            view.update(state, plan, &service.key);
        }
        view
    }

    /// The whole view of `node`, with a plan of its own (without steering, which changes no
    /// answer): for tools and tests that have no plan at hand.
    pub fn of_node(state: &ClusterState, node: &str, configured: Vec<SocketAddr>) -> Result<Self, PolicyError> {
        Ok(Self::build(state, &NodePlan::build(state, node, None)?, configured))
    }

    /// Takes the records of Service `key` from `state` and `plan` (updated for `key` first);
    /// whether anything changed.
    pub fn update(&mut self, state: &ClusterState, plan: &NodePlan, key: &ObjectKey) -> bool {
        let id = service_key(&key.namespace, &key.name);
        let records = state.service(key).and_then(|service| {
            if service.dns_on_upstream() {
                Some(Records::Upstream)
            } else if let Some(target) = &service.external_name {
                Some(Records::ExternalName { target: target.clone() })
            } else if service.headless {
                plan.headless(key).map(|answers| Records::Headless(Arc::clone(answers)))
            } else if service.cluster_ips.is_empty() {
                None
            } else {
                Some(Records::ClusterIp {
                    ips: service.cluster_ips.clone(),
                    ports: srv_ports(service),
                    hosts: hosts(state, service).1,
                })
            }
        });
        let mut changed = false;
        if *key.namespace == *UPSTREAM_SERVICE.0 && *key.name == *UPSTREAM_SERVICE.1 {
            let upstreams = if self.configured.is_empty() { default_upstreams(state) } else { self.configured.clone() };
            changed |= upstreams != self.upstreams;
            self.upstreams = upstreams;
        }
        match records {
            Some(records) => {
                if self.services.get(id.as_str()).is_some_and(|old| **old == records) {
                    return changed;
                }
                if self.services.insert(id.into(), Arc::new(records)).is_none() {
                    *self.namespaces.entry(Arc::clone(&key.namespace)).or_default() += 1;
                }
                true
            }
            None => {
                if self.services.remove(id.as_str()).is_none() {
                    return changed;
                }
                if let Some(count) = self.namespaces.get_mut(&*key.namespace) {
                    *count -= 1;
                    if *count == 0 {
                        self.namespaces.remove(&*key.namespace);
                    }
                }
                true
            }
        }
    }

    /// Takes who this node's pods are from its Node; whether that changed.
    pub fn set_node(&mut self, node: &Node) -> bool {
        if self.node.pod_cidrs == node.pod_cidrs && self.node.addresses == node.addresses {
            return false;
        }
        self.node = OwnNode { pod_cidrs: node.pod_cidrs.clone(), addresses: node.addresses.clone() };
        true
    }

    /// This node's pod CIDRs and addresses, as its Node last said.
    pub fn node(&self) -> &OwnNode {
        &self.node
    }

    /// The records of `namespace/name`.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&Records> {
        self.services.get(service_key(namespace, name).as_str()).map(AsRef::as_ref)
    }

    /// Whether any Service lives in `namespace`.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains_key(namespace)
    }
}

/// The view's key of a Service.
fn service_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// The ready endpoints of `kube-system/kube-dns`'s UDP DNS port (named `dns`, else port 53).
fn default_upstreams(state: &ClusterState) -> Vec<SocketAddr> {
    let key = ObjectKey::new(UPSTREAM_SERVICE.0, UPSTREAM_SERVICE.1);
    let Some(service) = state.service(&key) else {
        return Vec::new();
    };
    let port = service
        .ports
        .iter()
        .filter(|p| p.protocol == Protocol::Udp)
        .find(|p| p.name == "dns")
        .or_else(|| service.ports.iter().find(|p| p.protocol == Protocol::Udp && p.port == 53));
    let Some(port) = port else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for family in [Family::V4, Family::V6] {
        let joined = join::candidates(state, service, port, family);
        out.extend(joined.candidates.iter().filter(|c| c.is_ready()).map(|c| SocketAddr::new(c.address, c.port)));
    }
    out
}
