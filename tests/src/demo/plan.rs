//! The demo cluster on paper: zones, nodes, backends and one Service per policy (each with a
//! twin with no topology policy, the baseline), written as ordinary Kubernetes YAML.

use std::net::{IpAddr, Ipv4Addr};

use serde_json::Value;
use topology_kube::objects::{self, EndpointSpec};

/// Size and shape of the demo cluster.
#[derive(Clone, Debug)]
pub struct DemoConfig {
    /// Zones (at most 26).
    pub zones: usize,
    /// Nodes per zone.
    pub nodes_per_zone: usize,
    /// Backends per zone, placed round-robin over the zone's nodes.
    pub backends_per_zone: usize,
    /// Regions the zones are split over (1 or 2).
    pub regions: usize,
    /// Connections (or UDP exchanges) per node per Service.
    pub connections: u64,
}

impl Default for DemoConfig {
    fn default() -> Self {
        Self { zones: 3, nodes_per_zone: 2, backends_per_zone: 2, regions: 1, connections: 1000 }
    }
}

impl DemoConfig {
    /// Checks the shape.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(1..=26).contains(&self.zones) {
            anyhow::bail!("--zones must be 1 to 26");
        }
        if self.nodes_per_zone == 0 || self.backends_per_zone == 0 {
            anyhow::bail!("--nodes-per-zone and --backends-per-zone must be at least 1");
        }
        if !(1..=2).contains(&self.regions) || self.regions > self.zones {
            anyhow::bail!("--regions must be 1 or 2, and at most --zones");
        }
        if self.connections == 0 {
            anyhow::bail!("--connections must be at least 1");
        }
        Ok(())
    }
}

/// A simulated node.
#[derive(Clone, Debug)]
pub struct NodePlan {
    /// `node-a1`.
    pub name: String,
    /// `zone-a`.
    pub zone: String,
    /// `region-1`.
    pub region: String,
}

/// A backend (an echo server in its own namespace).
#[derive(Clone, Debug)]
pub struct BackendPlan {
    /// `zone-a-1`: what it answers with.
    pub name: String,
    /// Index of its node.
    pub node: usize,
}

/// How a Service routes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    /// No topology: every endpoint (kube-proxy's default).
    Default,
    /// `trafficDistribution: PreferClose`.
    PreferClose,
    /// `trafficDistribution: PreferSameNode`.
    PreferSameNode,
    /// Topology keys hostname, zone, `*`.
    TopologyKeys,
    /// A hard topology key no node carries: refused everywhere.
    HardKeys,
    /// `internalTrafficPolicy: Local`.
    Local,
    /// `service.kubernetes.io/topology-mode: Auto`, with hints as the EndpointSlice controller
    /// writes them.
    AutoHints,
}

/// Transport of a demo Service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TCP connections.
    Tcp,
    /// UDP request/response from unconnected sockets (like a resolver).
    Udp,
    /// A headless Service: each attempt resolves its name through the kube-dns ClusterIP (which
    /// every node steers to its own agent's responder), then connects over TCP to an answer.
    Dns,
}

/// A demo Service.
#[derive(Clone, Debug)]
pub struct ServicePlan {
    /// Service name.
    pub name: String,
    /// Routing.
    pub policy: Policy,
    /// Transport.
    pub transport: Transport,
    /// ClusterIP.
    pub vip: Ipv4Addr,
    /// The Service this one is the default-policy twin of.
    pub baseline_of: Option<String>,
}

/// Port of every Service.
pub const SERVICE_PORT: u16 = 80;
/// Port every backend listens on, TCP and UDP.
pub const BACKEND_PORT: u16 = 8080;
/// The kube-dns ClusterIP; its endpoint is the demo's stand-in CoreDNS.
pub const KUBE_DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 250);
/// The cluster domain.
pub const DOMAIN: &str = "cluster.local";

/// The Services the demo moves known volumes of bytes to (`demo::bytes`): `PreferClose`, and its
/// twin with no topology policy, on [`BYTES_PORT`] of every backend (a bulk server).
pub const BYTES_SERVICES: [(&str, Ipv4Addr, Policy); 2] = [
    ("bytes", Ipv4Addr::new(10, 96, 0, 240), Policy::PreferClose),
    ("bytes-baseline", Ipv4Addr::new(10, 96, 0, 241), Policy::Default),
];
/// The port of the bytes Services and of the backends' bulk servers.
pub const BYTES_PORT: u16 = 9000;

/// The label key of the hard-keys Service, carried by no node.
pub const HARD_KEY: &str = "example.com/rack";

/// Backends left out of the cluster file's EndpointSlices.
#[derive(Clone, Copy, Debug)]
pub enum Removed<'a> {
    /// None.
    Nothing,
    /// Those of a zone.
    Zone(&'a str),
    /// One, by name.
    Backend(&'a str),
}

/// The whole plan.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Nodes, zone by zone.
    pub nodes: Vec<NodePlan>,
    /// Backends, zone by zone.
    pub backends: Vec<BackendPlan>,
    /// Services: each policy, then its baseline twin.
    pub services: Vec<ServicePlan>,
}

impl Plan {
    /// The plan for `config`.
    pub fn new(config: &DemoConfig) -> Self {
        let mut nodes = Vec::new();
        let mut backends = Vec::new();
        for z in 0..config.zones {
            let letter = (b'a' + z as u8) as char;
            let region = if config.regions == 2 && z >= config.zones.div_ceil(2) { "region-2" } else { "region-1" };
            let first = nodes.len();
            for n in 0..config.nodes_per_zone {
                nodes.push(NodePlan {
                    name: format!("node-{letter}{}", n + 1),
                    zone: format!("zone-{letter}"),
                    region: region.into(),
                });
            }
            for b in 0..config.backends_per_zone {
                backends.push(BackendPlan {
                    name: format!("zone-{letter}-{}", b + 1),
                    node: first + b % config.nodes_per_zone,
                });
            }
        }
        let policies = [
            ("default", Policy::Default, Transport::Tcp),
            ("prefer-close", Policy::PreferClose, Transport::Tcp),
            ("prefer-same-node", Policy::PreferSameNode, Transport::Tcp),
            ("topology-keys", Policy::TopologyKeys, Transport::Tcp),
            ("hard-keys", Policy::HardKeys, Transport::Tcp),
            ("local", Policy::Local, Transport::Tcp),
            ("udp", Policy::PreferClose, Transport::Udp),
            ("dns", Policy::PreferClose, Transport::Dns),
            ("auto-hints", Policy::AutoHints, Transport::Tcp),
        ];
        let mut services = Vec::new();
        for (i, (name, policy, transport)) in policies.into_iter().enumerate() {
            let vip = |offset: u8| Ipv4Addr::new(10, 96, 0, 10 + 2 * i as u8 + offset);
            services.push(ServicePlan { name: name.into(), policy, transport, vip: vip(0), baseline_of: None });
            services.push(ServicePlan {
                name: format!("{name}-baseline"),
                policy: Policy::Default,
                transport,
                vip: vip(1),
                baseline_of: Some(name.into()),
            });
        }
        Self { nodes, backends, services }
    }

    /// The node a backend runs on.
    pub fn node_of(&self, backend: &str) -> Option<&NodePlan> {
        self.backends.iter().find(|b| b.name == backend).map(|b| &self.nodes[b.node])
    }

    /// The name a headless Service is resolved by.
    pub fn dns_name(service: &ServicePlan) -> String {
        format!("{}.demo.svc.{DOMAIN}", service.name)
    }

    /// The cluster as Kubernetes objects, with kube-dns answered by `coredns`; the backends
    /// `removed` names are left out of every slice.
    pub fn objects(&self, addresses: &[Ipv4Addr], coredns: Ipv4Addr, removed: Removed<'_>) -> Vec<Value> {
        let mut objects: Vec<Value> =
            self.nodes.iter().map(|n| objects::node(&n.name, &n.zone, Some(&n.region), "4")).collect();
        let mut kube_dns = objects::service("kube-system", "kube-dns", IpAddr::V4(KUBE_DNS), 53, "UDP", "dns");
        kube_dns["spec"]["ports"] = serde_json::json!([
            {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]);
        objects.push(kube_dns);
        let coredns_endpoint = EndpointSpec::new(IpAddr::V4(coredns), &self.nodes[0].name);
        let mut slice = objects::slice("kube-system", "kube-dns-1", "kube-dns", "dns", 53, "UDP", &[coredns_endpoint]);
        slice["ports"] = serde_json::json!([
            {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]);
        objects.push(slice);
        let present: Vec<(usize, &BackendPlan)> = self
            .backends
            .iter()
            .enumerate()
            .filter(|(_, b)| match removed {
                Removed::Nothing => true,
                Removed::Zone(zone) => self.nodes[b.node].zone != zone,
                Removed::Backend(name) => b.name != name,
            })
            .collect();
        let zones_with_endpoints: Vec<&str> = present.iter().map(|(_, b)| self.nodes[b.node].zone.as_str()).collect();
        // Endpoints as the EndpointSlice controller writes them for `policy`: for a preference,
        // hints of each endpoint's own zone; for Auto, only while every zone has endpoints (its
        // allocation would otherwise move endpoints between zones).
        let endpoints = |policy: Policy| -> Vec<EndpointSpec> {
            let hinted = match policy {
                Policy::PreferClose | Policy::PreferSameNode => true,
                Policy::AutoHints => self.nodes.iter().all(|n| zones_with_endpoints.contains(&n.zone.as_str())),
                _ => false,
            };
            present
                .iter()
                .map(|(i, backend)| {
                    let node = &self.nodes[backend.node];
                    let mut spec = EndpointSpec::new(IpAddr::V4(addresses[*i]), &node.name);
                    spec.zone = Some(node.zone.clone());
                    if hinted {
                        spec.hint_zones = vec![node.zone.clone()];
                    }
                    spec
                })
                .collect()
        };
        for service in &self.services {
            let protocol = match service.transport {
                Transport::Tcp | Transport::Dns => "TCP",
                Transport::Udp => "UDP",
            };
            let mut object =
                objects::service("demo", &service.name, IpAddr::V4(service.vip), SERVICE_PORT, protocol, "main");
            if service.transport == Transport::Dns {
                object["spec"]["clusterIP"] = "None".into();
                object["spec"]["clusterIPs"] = serde_json::json!(["None"]);
            }
            match service.policy {
                Policy::Default => {}
                Policy::PreferClose => object["spec"]["trafficDistribution"] = "PreferClose".into(),
                Policy::PreferSameNode => object["spec"]["trafficDistribution"] = "PreferSameNode".into(),
                Policy::TopologyKeys => objects::annotate(
                    &mut object,
                    "topology-agent.io/topology-keys",
                    "kubernetes.io/hostname,topology.kubernetes.io/zone,*",
                ),
                Policy::HardKeys => objects::annotate(&mut object, "topology-agent.io/topology-keys", HARD_KEY),
                Policy::Local => object["spec"]["internalTrafficPolicy"] = "Local".into(),
                Policy::AutoHints => objects::annotate(&mut object, "service.kubernetes.io/topology-mode", "Auto"),
            }
            objects.push(object);
            let slice_name = format!("{}-1", service.name);
            let endpoints = endpoints(service.policy);
            objects.push(objects::slice(
                "demo",
                &slice_name,
                &service.name,
                "main",
                BACKEND_PORT,
                protocol,
                &endpoints,
            ));
        }
        for (name, vip, policy) in BYTES_SERVICES {
            let mut object = objects::service("demo", name, IpAddr::V4(vip), BYTES_PORT, "TCP", "bulk");
            if policy == Policy::PreferClose {
                object["spec"]["trafficDistribution"] = "PreferClose".into();
            }
            objects.push(object);
            let endpoints = endpoints(policy);
            objects.push(objects::slice("demo", &format!("{name}-1"), name, "bulk", BYTES_PORT, "TCP", &endpoints));
        }
        objects
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_plan_has_six_nodes_six_backends_and_eighteen_services() {
        let plan = Plan::new(&DemoConfig::default());
        assert_eq!(plan.nodes.len(), 6);
        assert_eq!(plan.backends.len(), 6);
        assert_eq!(plan.services.len(), 18);
        assert_eq!(plan.node_of("zone-b-2").unwrap().name, "node-b2");
        let two_regions = Plan::new(&DemoConfig { zones: 4, regions: 2, ..DemoConfig::default() });
        assert_eq!(two_regions.nodes.iter().filter(|n| n.region == "region-2").count(), 4);
    }

    #[test]
    fn removing_a_zone_removes_its_endpoints_from_every_slice() {
        let plan = Plan::new(&DemoConfig::default());
        let addresses: Vec<Ipv4Addr> = (0..6).map(|i| Ipv4Addr::new(10, 244, 0, i + 1)).collect();
        let objects = plan.objects(&addresses, Ipv4Addr::new(10, 244, 9, 9), Removed::Zone("zone-a"));
        for slice in objects.iter().filter(|o| o["kind"] == "EndpointSlice" && o["metadata"]["namespace"] == "demo") {
            assert_eq!(slice["endpoints"].as_array().unwrap().len(), 4);
        }
    }
}
