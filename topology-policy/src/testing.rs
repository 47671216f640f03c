//! A small builder of clusters for policy tests.

use std::{collections::BTreeMap, net::IpAddr};

use topology_model::{
    ClusterState, Endpoint, EndpointSlice, Family, Node, ObjectKey, PortSpec, Protocol, Service, SlicePort,
    TopologyKeysSource, TopologyKeysSpec, TrafficDistribution,
    objects::{LABEL_REGION, LABEL_ZONE},
};

use crate::policy::{self, PortSelection, Selection};

/// A node in `zone` (empty: no zone label) of `region` (empty: no region label).
pub fn node(name: &str, zone: &str, region: &str) -> Node {
    let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_owned(), name.to_owned())]);
    if !zone.is_empty() {
        labels.insert(LABEL_ZONE.into(), zone.into());
    }
    if !region.is_empty() {
        labels.insert(LABEL_REGION.into(), region.into());
    }
    Node {
        name: name.into(),
        labels: labels.into(),
        allocatable_cpu_millis: 4000,
        ready: true,
        pod_cidrs: Vec::new(),
        addresses: Vec::new(),
    }
}

/// A Service `ns/<name>` with one TCP port `http` 80 and ClusterIP 10.96.0.10.
pub fn service(name: &str) -> Service {
    Service {
        key: ObjectKey::new("ns", name),
        cluster_ips: vec!["10.96.0.10".parse().unwrap()],
        headless: false,
        ports: vec![PortSpec { name: "http".into(), port: 80, protocol: Protocol::Tcp }],
        internal_traffic_local: false,
        session_affinity_timeout_s: None,
        traffic_distribution: None,
        topology_keys: None,
        topology_mode: None,
        agent_annotations: BTreeMap::new(),
        external_name: None,
        other_proxy: None,
    }
}

/// Builders on a Service.
pub trait ServiceExt {
    /// Topology keys from the annotation.
    fn keys(self, keys: &[&str]) -> Self;
    /// Topology keys from `spec.topologyKeys`.
    fn spec_keys(self, keys: &[&str]) -> Self;
    /// `service.kubernetes.io/topology-mode`.
    fn mode(self, mode: &str) -> Self;
    /// `spec.trafficDistribution`.
    fn distribution(self, value: &str) -> Self;
    /// `internalTrafficPolicy: Local`.
    fn local(self) -> Self;
    /// In namespace `namespace` with ClusterIP `vip`.
    fn at(self, namespace: &str, vip: &str) -> Self;
}

impl ServiceExt for Service {
    fn keys(mut self, keys: &[&str]) -> Self {
        self.topology_keys = Some(TopologyKeysSpec::new(TopologyKeysSource::Annotation, keys.iter().copied()));
        self
    }

    fn spec_keys(mut self, keys: &[&str]) -> Self {
        self.topology_keys = Some(TopologyKeysSpec::new(TopologyKeysSource::Spec, keys.iter().copied()));
        self
    }

    fn mode(mut self, mode: &str) -> Self {
        self.topology_mode = Some(mode.into());
        self
    }

    fn distribution(mut self, value: &str) -> Self {
        self.traffic_distribution = Some(TrafficDistribution::parse(value));
        self
    }

    fn local(mut self) -> Self {
        self.internal_traffic_local = true;
        self
    }

    fn at(mut self, namespace: &str, vip: &str) -> Self {
        self.key = ObjectKey::new(namespace, &*self.key.name);
        self.cluster_ips = vec![vip.parse().unwrap()];
        self
    }
}

/// A ready endpoint at `address` on `node` (empty: no nodeName).
pub fn ep(address: &str, node: &str) -> Endpoint {
    Endpoint {
        address: address.parse().unwrap(),
        ready: true,
        serving: true,
        terminating: false,
        node_name: (!node.is_empty()).then(|| node.into()),
        zone: None,
        extra: None,
    }
}

/// Builders on an Endpoint.
pub trait EndpointExt {
    /// Sets the endpoint's own `zone` field.
    fn zone(self, zone: &str) -> Self;
    /// Not ready, not serving.
    fn unready(self) -> Self;
    /// Not ready, serving and terminating.
    fn terminating(self) -> Self;
    /// `hints.forZones`.
    fn for_zones(self, zones: &[&str]) -> Self;
    /// `hints.forNodes`.
    fn for_nodes(self, nodes: &[&str]) -> Self;
}

impl EndpointExt for Endpoint {
    fn zone(mut self, zone: &str) -> Self {
        self.zone = Some(zone.into());
        self
    }

    fn unready(mut self) -> Self {
        (self.ready, self.serving) = (false, false);
        self
    }

    fn terminating(mut self) -> Self {
        (self.ready, self.serving, self.terminating) = (false, true, true);
        self
    }

    fn for_zones(mut self, zones: &[&str]) -> Self {
        self.set_extra(|extra| extra.hint_zones = zones.iter().map(|z| (*z).to_owned()).collect());
        self
    }

    fn for_nodes(mut self, nodes: &[&str]) -> Self {
        self.set_extra(|extra| extra.hint_nodes = nodes.iter().map(|n| (*n).to_owned()).collect());
        self
    }
}

/// An EndpointSlice `ns/<name>` of `service` with port `http` = `port` (see [`SliceExt::within`]
/// for another namespace).
pub fn slice(name: &str, service: &str, port: u16, endpoints: Vec<Endpoint>) -> EndpointSlice {
    let family = endpoints.first().map_or(Family::V4, |e| Family::of(&e.address));
    EndpointSlice {
        key: ObjectKey::new("ns", name),
        service: Some(ObjectKey::new("ns", service)),
        family,
        ports: vec![SlicePort { name: "http".into(), port, protocol: Protocol::Tcp }],
        endpoints,
        changed_at: None,
    }
}

/// Builders on an EndpointSlice.
pub trait SliceExt {
    /// In namespace `namespace`, with its Service.
    fn within(self, namespace: &str) -> Self;
}

impl SliceExt for EndpointSlice {
    fn within(mut self, namespace: &str) -> Self {
        self.key = ObjectKey::new(namespace, &*self.key.name);
        self.service = self.service.map(|service| ObjectKey::new(namespace, &*service.name));
        self
    }
}

/// The reference topology: zones a, b (region r1) and c (region r2), a node without a zone label,
/// and one endpoint on each of a1, a2, b1 and c1.
pub fn world() -> ClusterState {
    let mut state = ClusterState::default();
    let mut empty_zone = node("empty-zone", "", "");
    empty_zone.labels.insert(LABEL_ZONE, "");
    for n in [
        node("a1", "a", "r1"),
        node("a2", "a", "r1"),
        node("a3", "a", "r1"),
        node("b1", "b", "r1"),
        node("c1", "c", "r2"),
        node("d1", "d", "r2"),
        node("nz", "", "r1"),
        empty_zone,
    ] {
        state.upsert_node(n);
    }
    state
}

/// The four endpoints of [`world`], with their zones as hints when `hinted`.
pub fn endpoints(hinted: bool) -> Vec<Endpoint> {
    let mut all = vec![ep("10.0.1.1", "a1"), ep("10.0.1.2", "a2"), ep("10.0.2.1", "b1"), ep("10.0.3.1", "c1")];
    if hinted {
        for (e, zone) in all.iter_mut().zip(["a", "a", "b", "c"]) {
            let node = e.node_name.as_deref().unwrap().to_owned();
            e.set_extra(|extra| (extra.hint_zones, extra.hint_nodes) = (Box::new([zone.into()]), Box::new([node])));
        }
    }
    all
}

/// `world()` plus `svc` and one slice with `endpoints`.
pub fn with(svc: Service, endpoints: Vec<Endpoint>) -> ClusterState {
    let mut state = world();
    let name = svc.key.name.clone();
    state.upsert_service(svc);
    state.upsert_slice(slice(&format!("{name}-1"), &name, 8080, endpoints));
    state
}

/// The single selection of the single port and family of the only Service, from `node`.
pub fn decide(state: &ClusterState, node: &str) -> Selection {
    let selections = policy::compute(state, node).unwrap();
    assert_eq!(selections.len(), 1, "{selections:?}");
    selections.into_iter().next().unwrap().selection
}

/// Every selection from `node`.
pub fn decide_all(state: &ClusterState, node: &str) -> Vec<PortSelection> {
    policy::compute(state, node).unwrap()
}

/// The chosen addresses, sorted.
pub fn chosen(selection: &Selection) -> Vec<String> {
    let mut out: Vec<String> = selection.backends.iter().map(|b| b.address.to_string()).collect();
    out.sort();
    out
}

/// Addresses as strings.
pub fn addrs(list: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = list.iter().map(|a| a.parse::<IpAddr>().unwrap().to_string()).collect();
    out.sort();
    out
}
