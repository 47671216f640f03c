//! What the responder answers from, for THIS node: built from the cluster state by the same
//! policy that programs the kernel, published by the controller after each change, read by every
//! query without a lock. Pure.

use std::{
    collections::{BTreeMap, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Arc,
};

use super::names::endpoint_label;
use crate::{
    cluster::{ClusterState, Family, Node, ObjectKey, Service},
    desired::{Locality, Protocol},
    policy::{self, PolicyError, PolicyKind, Selection, join},
};

/// The Service whose ready endpoints are the default upstream.
pub const UPSTREAM_SERVICE: (&str, &str) = ("kube-system", "kube-dns");

/// One address an answer may hold.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// Endpoint address.
    pub address: IpAddr,
    /// Target port (SRV).
    pub port: u16,
    /// The endpoint's name under its Service (`<label>.<svc>.<ns>.svc.<domain>`).
    pub label: String,
    /// Where it is relative to this node.
    pub locality: Locality,
    /// Relative weight from the policy.
    pub weight: f64,
}

/// The policy's choice for one name: the addresses, and whether the weights differ (then each
/// answer holds one address drawn by weight, so answers across queries follow the plan).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chosen {
    /// The chosen endpoints, both families, sorted by address.
    pub choices: Vec<Choice>,
    /// Weights differ between choices.
    pub weighted: bool,
    /// The policy's reason, per family ("IPv4: …").
    pub reasons: Vec<String>,
    /// The mode that decided.
    pub policy: Option<PolicyKind>,
}

impl Chosen {
    fn add(&mut self, family: Family, selection: &Selection, labels: &HashMap<IpAddr, String>) {
        self.policy.get_or_insert(selection.policy);
        let family = match family {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        };
        self.reasons.push(format!("{family}: {}", selection.reason));
        for backend in &selection.backends {
            self.choices.push(Choice {
                address: backend.address,
                port: backend.port,
                label: labels.get(&backend.address).cloned().unwrap_or_else(|| endpoint_label(None, backend.address)),
                locality: backend.locality,
                weight: backend.weight,
            });
        }
        self.choices.sort_by_key(|c| (c.address, c.port));
        let first = self.choices.first().map(|c| c.weight);
        self.weighted = self.choices.iter().any(|c| Some(c.weight) != first);
    }
}

/// A port of a Service, as SRV names it.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedPort {
    /// `ports[].name`, lowercase.
    pub name: String,
    /// Protocol.
    pub protocol: Protocol,
    /// The Service port.
    pub port: u16,
}

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
    /// A headless Service: what this node's policy chose.
    Headless(Box<Headless>),
    /// `type: ExternalName`: a CNAME to this name, as CoreDNS answers.
    ExternalName {
        /// `spec.externalName`, lowercase, without the final dot.
        target: String,
    },
}

/// The hosts of a Service that has none.
static NO_HOSTS: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();

/// The records of a headless Service.
#[derive(Clone, Debug, PartialEq)]
pub struct Headless {
    /// `<svc>.<ns>.svc.<domain>` A and AAAA.
    pub addresses: Chosen,
    /// `_<port>._<proto>.<svc>.<ns>.svc.<domain>` SRV, per named port.
    pub ports: Vec<(NamedPort, Chosen)>,
    /// `<label>.<svc>.<ns>.svc.<domain>`: every ready endpoint, by its own name (a name that
    /// picks one pod is not subject to topology).
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
}

impl Records {
    /// The Service's ready endpoints by name.
    pub fn hosts(&self) -> &BTreeMap<String, Vec<IpAddr>> {
        match self {
            Self::ClusterIp { hosts, .. } => hosts,
            Self::Headless(h) => &h.hosts,
            Self::ExternalName { .. } => &NO_HOSTS,
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
}

impl DnsView {
    /// An empty view; `configured`: the upstreams given on the command line (none: kube-dns).
    pub fn new(configured: Vec<SocketAddr>) -> Self {
        Self { upstreams: configured.clone(), configured, ..Self::default() }
    }

    /// The whole view from `node`.
    pub fn build(state: &ClusterState, node: &str, configured: Vec<SocketAddr>) -> Result<Self, PolicyError> {
        let this = state.node(node).ok_or_else(|| PolicyError::UnknownNode(node.to_owned()))?;
        let mut view = Self::new(configured);
        let keys: Vec<ObjectKey> = state.services().map(|s| s.key.clone()).collect();
        for key in &keys {
            view.update(state, this, key);
        }
        Ok(view)
    }

    /// Recomputes the records of Service `key` from `this` node; whether anything changed.
    pub fn update(&mut self, state: &ClusterState, this: &Node, key: &ObjectKey) -> bool {
        let id = service_key(&key.namespace, &key.name);
        let records = state.service(key).and_then(|service| {
            if let Some(target) = &service.external_name {
                Some(Records::ExternalName { target: target.clone() })
            } else if service.headless {
                Some(Records::Headless(Box::new(headless(state, this, service))))
            } else if service.cluster_ips.is_empty() {
                None
            } else {
                Some(Records::ClusterIp {
                    ips: service.cluster_ips.clone(),
                    ports: named_ports(service),
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

    /// The records of `namespace/name`.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&Records> {
        self.services.get(service_key(namespace, name).as_str()).map(AsRef::as_ref)
    }

    /// Whether any Service lives in `namespace`.
    pub fn has_namespace(&self, namespace: &str) -> bool {
        self.namespaces.contains_key(namespace)
    }

    /// Every headless Service, sorted, for `explain`.
    pub fn headless(&self) -> Vec<(ObjectKey, &Headless)> {
        let mut out: Vec<(ObjectKey, &Headless)> = self
            .services
            .iter()
            .filter_map(|(id, records)| match (records.as_ref(), id.split_once('/')) {
                (Records::Headless(h), Some((ns, name))) => Some((ObjectKey::new(ns, name), h.as_ref())),
                _ => None,
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// The view's key of a Service.
fn service_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

fn named_ports(service: &Service) -> Vec<NamedPort> {
    service
        .ports
        .iter()
        .filter(|p| !p.name.is_empty())
        .map(|p| NamedPort { name: p.name.to_ascii_lowercase(), protocol: p.protocol, port: p.port })
        .collect()
}

/// The families a headless Service has endpoints in.
fn families(state: &ClusterState, service: &Service) -> Vec<Family> {
    let mut families: Vec<Family> = state.slices_of(&service.key).map(|s| s.family).collect();
    families.sort();
    families.dedup();
    families
}

/// Every endpoint's label by address, and the ready endpoints by label.
fn hosts(state: &ClusterState, service: &Service) -> (HashMap<IpAddr, String>, BTreeMap<String, Vec<IpAddr>>) {
    let mut labels = HashMap::new();
    let mut hosts: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
    for slice in state.slices_of(&service.key) {
        for endpoint in &slice.endpoints {
            let label = endpoint_label(endpoint.hostname(), endpoint.address);
            labels.insert(endpoint.address, label.clone());
            if endpoint.ready {
                let addresses = hosts.entry(label).or_default();
                if !addresses.contains(&endpoint.address) {
                    addresses.push(endpoint.address);
                }
            }
        }
    }
    (labels, hosts)
}

fn headless(state: &ClusterState, this: &Node, service: &Service) -> Headless {
    let (labels, hosts) = hosts(state, service);
    let families = families(state, service);
    let mut addresses = Chosen::default();
    for &family in &families {
        let candidates = join::addresses(state, service, family);
        addresses.add(family, &policy::select(this, state.demand(), service, &candidates), &labels);
    }
    let mut ports = Vec::new();
    for port in service.ports.iter().filter(|p| !p.name.is_empty()) {
        let mut chosen = Chosen::default();
        for &family in &families {
            let joined = join::candidates(state, service, port, family);
            chosen.add(family, &policy::select(this, state.demand(), service, &joined.candidates), &labels);
        }
        ports.push((
            NamedPort { name: port.name.to_ascii_lowercase(), protocol: port.protocol, port: port.port },
            chosen,
        ));
    }
    Headless { addresses, ports, hosts }
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
