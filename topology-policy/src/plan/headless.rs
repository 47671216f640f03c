//! The plan's answers for headless Services: which endpoints this node's DNS answer holds for a
//! headless Service's name and its SRV ports, decided by the same policy as a ClusterIP's kernel
//! entry. Headless Services have no kernel entry; their topology is the DNS answer, so it lives
//! in the node plan beside the entries, and `explain` and the responder both read it from there.
//!
//! Only ready endpoints are answered, as the Kubernetes DNS specification and CoreDNS answer
//! them: the serving-and-terminating fallback of ClusterIP traffic (KEP-1669) does not apply. A
//! DNS answer is cached and used for new connections for its TTL and beyond, and names pods that
//! are going away; an SRV target must resolve, and a terminating pod's own name does not. (A
//! Service with `publishNotReadyAddresses` has every endpoint marked ready by the EndpointSlice
//! controller, so those are answered.)

use std::{
    collections::{BTreeMap, HashMap},
    net::IpAddr,
};

use topology_model::{ClusterState, Family, Node, Protocol, Service};

use crate::{
    desired::Locality,
    policy::{self, PolicyKind, Selection, join},
};

/// One endpoint an answer may hold: the policy's choice, with its DNS name.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedChoice {
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

/// The policy's choice for one name: the endpoints, and whether the weights differ (then each
/// answer holds one address drawn by weight, so answers across queries follow the plan).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chosen {
    /// The chosen endpoints, both families, sorted by address.
    pub choices: Vec<NamedChoice>,
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
            self.choices.push(NamedChoice {
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
    /// `ports[].name`, lowercase; empty for an unnamed port (answered only on the Service's own
    /// name, as CoreDNS does).
    pub name: String,
    /// Protocol.
    pub protocol: Protocol,
    /// The Service port.
    pub port: u16,
}

/// The answers of a headless Service on this node.
#[derive(Clone, Debug, PartialEq)]
pub struct Headless {
    /// `<svc>.<ns>.svc.<domain>` A and AAAA.
    pub addresses: Chosen,
    /// SRV per port: every port for `<svc>.<ns>.svc.<domain>`, the named ones for
    /// `_<port>._<proto>.<svc>.<ns>.svc.<domain>`.
    pub ports: Vec<(NamedPort, Chosen)>,
    /// `<label>.<svc>.<ns>.svc.<domain>`: every ready endpoint, by its own name (a name that
    /// picks one pod is not subject to topology).
    pub hosts: BTreeMap<String, Vec<IpAddr>>,
}

/// The answers of headless `service` on `this` node.
pub fn decide(state: &ClusterState, this: &Node, service: &Service) -> Headless {
    let (labels, hosts) = hosts(state, service);
    let families = families(state, service);
    let mut addresses = Chosen::default();
    for &family in &families {
        let mut candidates = join::addresses(state, service, family);
        candidates.retain(join::Candidate::is_ready);
        addresses.add(family, &policy::select(this, state.demand(), service, &candidates), &labels);
    }
    let mut ports = Vec::new();
    for (named, port) in srv_ports(service).into_iter().zip(&service.ports) {
        let mut chosen = Chosen::default();
        for &family in &families {
            let mut joined = join::candidates(state, service, port, family);
            joined.candidates.retain(join::Candidate::is_ready);
            chosen.add(family, &policy::select(this, state.demand(), service, &joined.candidates), &labels);
        }
        ports.push((named, chosen));
    }
    Headless { addresses, ports, hosts }
}

/// The label an endpoint is known by: its `hostname`, else its address with `.` or `:` as `-`,
/// and an IPv6 label that would end in `-` (an address ending in `::`) ends in `-0`, as CoreDNS
/// names endpoints without one (a label ending in `-` is no hostname: Go's resolver rejects it).
pub fn endpoint_label(hostname: Option<&str>, address: IpAddr) -> String {
    match hostname {
        Some(host) if !host.is_empty() => host.to_ascii_lowercase(),
        _ => {
            let mut label = address.to_string().replace(['.', ':'], "-");
            if label.ends_with('-') {
                label.push('0');
            }
            label
        }
    }
}

/// Every port of the Service, as SRV names them, in the Service's order.
pub fn srv_ports(service: &Service) -> Vec<NamedPort> {
    service
        .ports
        .iter()
        .map(|p| NamedPort { name: p.name.to_ascii_lowercase(), protocol: p.protocol, port: p.port })
        .collect()
}

/// Every endpoint's label by address, and the ready endpoints by label.
pub fn hosts(state: &ClusterState, service: &Service) -> (HashMap<IpAddr, String>, BTreeMap<String, Vec<IpAddr>>) {
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

/// The families a Service has endpoints in.
fn families(state: &ClusterState, service: &Service) -> Vec<Family> {
    let mut families: Vec<Family> = state.slices_of(&service.key).map(|s| s.family).collect();
    families.sort();
    families.dedup();
    families
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_without_a_hostname_are_named_by_address() {
        assert_eq!(endpoint_label(Some("Web-0"), "10.0.0.1".parse().unwrap()), "web-0");
        assert_eq!(endpoint_label(None, "10.0.0.1".parse().unwrap()), "10-0-0-1");
        assert_eq!(endpoint_label(Some(""), "fd00::1".parse().unwrap()), "fd00--1");
        assert_eq!(endpoint_label(None, "fd00:20::".parse().unwrap()), "fd00-20--0", "CoreDNS's name");
        assert_eq!(endpoint_label(None, "5678:abcd::2".parse().unwrap()), "5678-abcd--2");
    }
}
