//! The cluster as the policy sees it: Nodes, Services and EndpointSlices reduced to the fields that
//! decide routing. Bulk (managedFields, status of Pods, ...) never gets this far.

use std::{collections::BTreeMap, fmt, net::IpAddr, sync::Arc};

use super::bounds;
pub use super::labels::Labels;
use crate::Protocol;

/// `kubernetes.io/hostname`.
pub const LABEL_HOSTNAME: &str = "kubernetes.io/hostname";
/// `topology.kubernetes.io/zone`.
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// `topology.kubernetes.io/region`.
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Label joining an EndpointSlice to its Service.
pub const LABEL_SERVICE_NAME: &str = "kubernetes.io/service-name";

/// `namespace/name` of a namespaced object. Its parts are shared strings: a Service's key is held
/// by the state, its slices, the plan and the kernel's mirror, and a clone costs no copy.
/// Ordered by namespace, then name, as text.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ObjectKey {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
}

impl Ord for ObjectKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // The keys a tree compares mostly share their namespace's one copy (and a key found is
        // its own copy): the same string is equal without reading it.
        fn text(a: &Arc<str>, b: &Arc<str>) -> std::cmp::Ordering {
            if Arc::ptr_eq(a, b) { std::cmp::Ordering::Equal } else { a.cmp(b) }
        }
        text(&self.namespace, &other.namespace).then_with(|| text(&self.name, &other.name))
    }
}

impl PartialOrd for ObjectKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl ObjectKey {
    /// A key from its parts.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        Self { namespace: namespace.into(), name: name.into() }
    }
}

/// Text that is not `NAMESPACE/NAME`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not NAMESPACE/NAME")]
pub struct NotNamespaced(pub String);

impl std::str::FromStr for ObjectKey {
    type Err = NotNamespaced;

    /// Parses `namespace/name`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Self::new(namespace, name))
            }
            _ => Err(NotNamespaced(s.to_owned())),
        }
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// IP family of a ClusterIP, an EndpointSlice or an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// The family of an address.
    pub fn of(addr: &IpAddr) -> Self {
        if addr.is_ipv4() { Self::V4 } else { Self::V6 }
    }
}

/// A Node.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Node {
    /// Name.
    pub name: String,
    /// Labels (topology keys are read from here).
    pub labels: Labels,
    /// `status.allocatable.cpu` in millicores (0 when absent).
    pub allocatable_cpu_millis: u64,
    /// The Ready condition is True.
    pub ready: bool,
    /// `spec.podCIDRs`: where the node's own pods take their addresses (empty where the network
    /// plugin assigns addresses another way).
    pub pod_cidrs: Vec<super::Prefix>,
    /// `status.addresses` of type `InternalIP` or `ExternalIP`: where the node's own processes
    /// (and host-network pods) send from.
    pub addresses: Vec<IpAddr>,
}

impl Node {
    /// The value of a topology label, with `kubernetes.io/hostname` defaulting to the node name.
    pub fn topology_value(&self, key: &str) -> Option<&str> {
        match self.labels.get(key) {
            Some(value) => Some(value),
            None if key == LABEL_HOSTNAME => Some(&self.name),
            None => None,
        }
    }

    /// The node's zone, if labelled (an empty label is no zone).
    pub fn zone(&self) -> Option<&str> {
        self.labels.zone().map(|z| &**z).filter(|z| !z.is_empty())
    }

    /// The node's region, if labelled.
    pub fn region(&self) -> Option<&str> {
        self.labels.region().map(|r| &**r).filter(|r| !r.is_empty())
    }
}

/// `spec.trafficDistribution`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TrafficDistribution {
    /// Prefer endpoints in the same zone (the original name of `PreferSameZone`).
    PreferClose,
    /// Prefer endpoints in the same zone.
    PreferSameZone,
    /// Prefer endpoints on the same node, then in the same zone.
    PreferSameNode,
    /// A value this agent does not know; ignored, as kube-proxy ignores it.
    Unknown(String),
}

impl TrafficDistribution {
    /// Parses the field's value.
    pub fn parse(value: &str) -> Self {
        match value {
            "PreferClose" => Self::PreferClose,
            "PreferSameZone" => Self::PreferSameZone,
            "PreferSameNode" => Self::PreferSameNode,
            other => Self::Unknown(other.to_owned()),
        }
    }
}

/// One entry of a Service's `spec.ports` (the kernel's key is [`crate::desired::ServicePort`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortSpec {
    /// Port name ("" when the Service has a single unnamed port).
    pub name: String,
    /// Service port number.
    pub port: u16,
    /// Protocol.
    pub protocol: Protocol,
}

/// A Service of type ClusterIP (or any type with a ClusterIP).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Service {
    /// Namespace and name.
    pub key: ObjectKey,
    /// ClusterIPs, one per family; empty for headless and ExternalName Services.
    pub cluster_ips: Vec<IpAddr>,
    /// `clusterIP: None`: no ClusterIP; reached by name (the node-local DNS responder).
    pub headless: bool,
    /// Ports.
    pub ports: Vec<PortSpec>,
    /// `spec.internalTrafficPolicy: Local`.
    pub internal_traffic_local: bool,
    /// `spec.sessionAffinity: ClientIP`: seconds a client keeps its endpoint
    /// (`sessionAffinityConfig.clientIP.timeoutSeconds`, default 10800); `None`: no affinity.
    pub session_affinity_timeout_s: Option<u32>,
    /// `spec.trafficDistribution`.
    pub traffic_distribution: Option<TrafficDistribution>,
    /// Topology keys as written, and where: the `topology-agent.io/topology-keys` annotation or
    /// `spec.topologyKeys` (Kubernetes 1.17-1.21). Validated by the policy.
    pub topology_keys: Option<TopologyKeysSpec>,
    /// The Topology Aware Routing annotation value (`service.kubernetes.io/topology-mode`, else
    /// the older `service.kubernetes.io/topology-aware-hints`).
    pub topology_mode: Option<String>,
    /// Annotations of this agent (`topology-agent.io/...`) that the policy reads, bounded.
    pub agent_annotations: BTreeMap<String, String>,
    /// `type: ExternalName`: the name DNS answers with a CNAME (lowercase, no final dot).
    pub external_name: Option<String>,
    /// The label kube-proxy leaves a Service to another proxy by (`service-proxy-name`, or
    /// `headless`), and its value: the agent programs none of its ports either.
    pub other_proxy: Option<String>,
}

/// kube-proxy handles only Services without these labels: another proxy handles the others.
pub const LABELS_OTHER_PROXY: [&str; 2] =
    ["service.kubernetes.io/service-proxy-name", "service.kubernetes.io/headless"];

/// Turns capacity spillover on: `capacity`.
pub const ANNOTATION_SPILLOVER: &str = "topology-agent.io/spillover";
/// ε of spillover: the most any endpoint may get above its fair share, as a fraction (`0.1`) or
/// percentage (`10%`).
pub const ANNOTATION_MAX_OVERLOAD: &str = "topology-agent.io/max-overload";

/// Passive outlier ejection of the Service's backends (`on`, the default, or `off`): see
/// `topology_common::outlier`.
pub const ANNOTATION_OUTLIER_EJECTION: &str = "topology-agent.io/outlier-ejection";

/// Where the node's DNS responder answers a Service's names: `upstream` relays every query for
/// them to the cluster DNS (CoreDNS), for names an operator keeps there.
pub const ANNOTATION_DNS: &str = "topology-agent.io/dns";
/// The one value of [`ANNOTATION_DNS`].
pub const DNS_UPSTREAM: &str = "upstream";

impl Service {
    /// The Service's names are answered by the cluster DNS, not by the node's responder.
    pub fn dns_on_upstream(&self) -> bool {
        self.agent_annotations.get(ANNOTATION_DNS).is_some_and(|value| value.trim() == DNS_UPSTREAM)
    }

    /// The Service asks for a decision that depends on the demand of every zone (spillover), so
    /// any change of a Node's zone, CPU or readiness can move it.
    pub fn depends_on_demand(&self) -> bool {
        self.agent_annotations.contains_key(ANNOTATION_SPILLOVER)
    }

    /// The Service's topology keys name a Node label other than the zone, the hostname and the
    /// region, so its decision reads the labels of every Node (the others come with the
    /// EndpointSlices, and the region of each zone with a census of the Nodes).
    pub fn reads_node_labels(&self) -> bool {
        self.topology_keys
            .iter()
            .flat_map(|spec| &spec.keys)
            .any(|key| !matches!(key.trim(), "*" | LABEL_ZONE | LABEL_HOSTNAME | LABEL_REGION))
    }
}

/// Where topology keys came from, and their raw entries.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TopologyKeysSpec {
    /// `annotation` or `spec.topologyKeys`.
    pub source: TopologyKeysSource,
    /// The keys as written, in order: the first `MAX_TOPOLOGY_KEYS + 1` at most, each bounded.
    pub keys: Vec<String>,
    /// How many keys were written.
    pub written: usize,
}

impl TopologyKeysSpec {
    /// The keys written at `source`, keeping no more of them than their validation needs: one
    /// beyond the most allowed, each no longer than the longest valid key (see [`bounds`]).
    pub fn new<'a>(source: TopologyKeysSource, written: impl IntoIterator<Item = &'a str>) -> Self {
        let mut keys = Vec::new();
        let mut count = 0;
        for key in written {
            if count <= bounds::MAX_TOPOLOGY_KEYS {
                keys.push(bounds::bounded(key.trim(), bounds::MAX_TOPOLOGY_KEY_LEN));
            }
            count += 1;
        }
        Self { source, keys, written: count }
    }
}

/// Where a Service's topology keys came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TopologyKeysSource {
    /// The `topology-agent.io/topology-keys` annotation.
    Annotation,
    /// `spec.topologyKeys`.
    Spec,
}

impl fmt::Display for TopologyKeysSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Annotation => "annotation topology-agent.io/topology-keys",
            Self::Spec => "spec.topologyKeys",
        })
    }
}

/// One port of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlicePort {
    /// Port name, matched against the Service port's name.
    pub name: String,
    /// Target port number on the endpoints.
    pub port: u16,
    /// Protocol.
    pub protocol: Protocol,
}

/// One endpoint of an EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The endpoint's address (the first of `addresses`, as kube-proxy uses).
    pub address: IpAddr,
    /// `conditions.ready` (absent means true).
    pub ready: bool,
    /// `conditions.serving` (absent means true).
    pub serving: bool,
    /// `conditions.terminating` (absent means false).
    pub terminating: bool,
    /// `nodeName`; shared with every other endpoint on that node once in the cluster state.
    pub node_name: Option<Arc<str>>,
    /// `zone`; shared like `node_name`.
    pub zone: Option<Arc<str>>,
    /// Hints and hostname, which most endpoints have neither of: one pointer instead of 40 bytes
    /// (150,000 endpoints keep them). `None` when all are empty: see [`EndpointExtra::new`].
    pub extra: Option<Box<EndpointExtra>>,
}

/// What few endpoints carry.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct EndpointExtra {
    /// `hints.forZones[].name` (boxed slices, not vectors).
    pub hint_zones: Box<[String]>,
    /// `hints.forNodes[].name`.
    pub hint_nodes: Box<[String]>,
    /// `hostname`: the endpoint's DNS label under its Service.
    pub hostname: Option<Box<str>>,
}

impl EndpointExtra {
    /// The extra of an endpoint; `None` when it has no hints and no hostname, so that two equal
    /// endpoints compare equal however they were built.
    pub fn new(hint_zones: Box<[String]>, hint_nodes: Box<[String]>, hostname: Option<Box<str>>) -> Option<Box<Self>> {
        let extra = Self { hint_zones, hint_nodes, hostname };
        (extra != Self::default()).then(|| Box::new(extra))
    }
}

impl Endpoint {
    /// `hints.forZones[].name`.
    pub fn hint_zones(&self) -> &[String] {
        self.extra.as_ref().map_or(&[], |extra| &extra.hint_zones)
    }

    /// `hints.forNodes[].name`.
    pub fn hint_nodes(&self) -> &[String] {
        self.extra.as_ref().map_or(&[], |extra| &extra.hint_nodes)
    }

    /// `hostname`.
    pub fn hostname(&self) -> Option<&str> {
        self.extra.as_ref().and_then(|extra| extra.hostname.as_deref())
    }

    /// Replaces the hints and hostname (tests and generators; the API's are read whole).
    pub fn set_extra(&mut self, edit: impl FnOnce(&mut EndpointExtra)) {
        let mut extra = self.extra.take().map_or_else(EndpointExtra::default, |extra| *extra);
        edit(&mut extra);
        self.extra = EndpointExtra::new(extra.hint_zones, extra.hint_nodes, extra.hostname);
    }
}

/// An EndpointSlice of an IP family.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointSlice {
    /// Namespace and name.
    pub key: ObjectKey,
    /// The Service it belongs to (`kubernetes.io/service-name`), in the same namespace.
    pub service: Option<ObjectKey>,
    /// Address family; FQDN slices are not kept.
    pub family: Family,
    /// Ports.
    pub ports: Vec<SlicePort>,
    /// Endpoints.
    pub endpoints: Vec<Endpoint>,
    /// When the change this version carries happened, as its controller stamped it
    /// (`endpoints.kubernetes.io/last-change-trigger-time`): what network programming latency is
    /// measured from, as kube-proxy measures it.
    pub changed_at: Option<std::time::SystemTime>,
}

/// The annotation an EndpointSlice's controller stamps with the time of the change (a Pod's or
/// the Service's) that the slice's current version carries.
pub const ANNOTATION_TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Kind of a Kubernetes object this agent reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// v1 Node.
    Node,
    /// v1 Service.
    Service,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
}

impl Kind {
    /// Every kind the agent watches; nothing is programmed before each has been listed.
    pub const ALL: [Self; 3] = [Self::Node, Self::Service, Self::EndpointSlice];
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Node => "Node",
            Self::Service => "Service",
            Self::EndpointSlice => "EndpointSlice",
        })
    }
}

/// An object that cannot be used, with the field at fault.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {name}: {field}: {message}")]
pub struct ObjectError {
    /// Kind of the object.
    pub kind: Kind,
    /// `namespace/name`, or the name of a Node.
    pub name: String,
    /// Path of the offending field (`spec.clusterIPs[1]`).
    pub field: String,
    /// What is wrong.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_order_as_their_text_whether_or_not_they_share_it() {
        let shared: Arc<str> = "ns".into();
        let keys = [
            ObjectKey::new("a", "z"),
            ObjectKey { namespace: Arc::clone(&shared), name: "b".into() },
            ObjectKey::new("ns", "b"),
            ObjectKey { namespace: Arc::clone(&shared), name: "ba".into() },
            ObjectKey::new("ns", "a"),
            ObjectKey::new("nt", ""),
        ];
        for a in &keys {
            for b in &keys {
                let text = (&*a.namespace, &*a.name).cmp(&(&*b.namespace, &*b.name));
                assert_eq!(a.cmp(b), text, "{a:?} against {b:?}");
                assert_eq!(a == b, text.is_eq());
            }
        }
    }
}
