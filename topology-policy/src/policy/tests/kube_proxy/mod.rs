//! kube-proxy's own table, `TestCategorizeEndpoints` (kubernetes `pkg/proxy/topology_test.go`),
//! run against our engine: every case, under upstream's name, in our own test code.
//!
//! Source: the newest version we could read, Antrea's port (`antrea-io/antrea`
//! `pkg/agent/proxy/topology_test.go`, August 2026), which tracks kube-proxy ≥ 1.33: hints read
//! whatever the Service says, KEP-3015 `forNodes` hints behind the `PreferSameTrafficDistribution`
//! gate, and the serving-and-terminating fallback. Antrea abbreviates a few names ("eTP" for
//! "externalTrafficPolicy"); its "conflicting topology and localness" case swaps iTP and eTP,
//! which gives the same sets, and is written here as kubernetes wrote it.
//!
//! Reading a row. Upstream computes the endpoints for in-cluster traffic (`cluster`) and for this
//! node's local traffic (`local`). A connection to a ClusterIP from this node uses `local` under
//! `internalTrafficPolicy: Local`, else `cluster` — and that is the set our engine must choose.
//! (`externalTrafficPolicy` and NodePorts shape only external traffic, which stays kube-proxy's:
//! we rewrite only `connect()` to ClusterIPs. They are kept so each row reads as upstream's.)
//!
//! Upstream's endpoints carry only conditions, hints and "is local". A real EndpointSlice also
//! carries `nodeName` and `zone`, which our `trafficDistribution` mode reads when hints are
//! partial, so each endpoint gets them as the EndpointSlice controller writes them: `nodeName` =
//! this node when local, else its one node hint; `zone` = its one zone hint.
//!
//! Each row runs as upstream wrote it (the Service asks for nothing), and once for each way a
//! Service asks for the hints the row carries (the EndpointSlice controller writes zone hints for
//! `topology-mode: Auto`, `PreferClose` and `PreferSameZone`, node hints for `PreferSameNode`).
//! Every run must give upstream's set, except where the row lists a documented difference.

use std::collections::BTreeMap;

mod cases;

use cases::cases;
use topology_model::{
    ClusterState, Endpoint, EndpointExtra, EndpointSlice, Family, Node, ObjectKey, Protocol, SlicePort,
    objects::LABEL_ZONE,
};

use super::world::{ServiceExt, addrs, chosen, decide, service};

/// How a Service asks for topology.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ask {
    /// As upstream's row: no annotation, no `trafficDistribution`.
    AsWritten,
    /// `service.kubernetes.io/topology-mode: Auto`.
    Auto,
    /// `spec.trafficDistribution` of that name.
    PreferClose,
    PreferSameZone,
    PreferSameNode,
}

/// A deliberate difference from kube-proxy. Each has its one line in `docs/policy.md`.
#[derive(Clone, Copy, Debug)]
enum Why {
    /// Hints only when asked.
    HintsWhenAsked,
    /// Own fields when hints are partial.
    OwnFields,
    /// No feature gate.
    SameNodeAlwaysOn,
}

impl Why {
    const ALL: [Why; 3] = [Why::HintsWhenAsked, Why::OwnFields, Why::SameNodeAlwaysOn];

    /// The line of `docs/policy.md`, verbatim.
    fn line(self) -> &'static str {
        match self {
            Why::HintsWhenAsked => {
                "Hints are read only when the Service asks for them (`topology-mode` or `trafficDistribution`); kube-proxy ≥ 1.31 reads any hints present."
            }
            Why::OwnFields => {
                "`trafficDistribution` falls back to each endpoint's own `zone` / `nodeName` when hints are missing or partial; kube-proxy then applies no topology."
            }
            Why::SameNodeAlwaysOn => {
                "`PreferSameNode` is always honoured; kube-proxy honours `forNodes` hints only with its `PreferSameTrafficDistribution` feature gate."
            }
        }
    }
}

/// Where our set differs from upstream's for one way of asking.
struct Differs {
    ask: Ask,
    ours: &'static [&'static str],
    why: Why,
}

/// An endpoint's conditions: ready, serving, terminating.
#[derive(Clone, Copy)]
struct Cond(bool, bool, bool);

const READY: Cond = Cond(true, true, false);
const UNREADY: Cond = Cond(false, true, false);
const TERMINATING: Cond = Cond(false, true, true);
const GONE: Cond = Cond(false, false, false);

/// Upstream's `makeTestEndpointInfo(ip, 80, isLocal, ready, serving, terminating, zoneHints, nodeHints)`.
struct Ep {
    ip: &'static str,
    local: bool,
    cond: Cond,
    zones: &'static [&'static str],
    nodes: &'static [&'static str],
}

const fn ep(
    ip: &'static str,
    local: bool,
    cond: Cond,
    zones: &'static [&'static str],
    nodes: &'static [&'static str],
) -> Ep {
    Ep { ip, local, cond, zones, nodes }
}

const L: bool = true;
const R: bool = false;

#[derive(Default)]
struct Case {
    name: &'static str,
    /// kube-proxy's `PreferSameTrafficDistribution` gate (upstream's `preferSameEnabled`).
    same_node_gate: bool,
    /// Upstream's `nodeName` ("" there: a name of our own, the node must exist).
    node: &'static str,
    /// The node's zone label; `None`: no labels at all.
    zone: Option<&'static str>,
    itp_local: bool,
    etp_local: bool,
    node_port: bool,
    endpoints: Vec<Ep>,
    /// Upstream's `clusterEndpoints` and `localEndpoints` (`None`: nil, the set is not used).
    cluster: Option<&'static [&'static str]>,
    local: Option<&'static [&'static str]>,
    differs: Vec<Differs>,
}

impl Case {
    fn node_name(&self) -> &'static str {
        if self.node.is_empty() { "this-node" } else { self.node }
    }

    /// The set kube-proxy uses for a connection to the ClusterIP from this node.
    fn upstream(&self) -> &'static [&'static str] {
        let set = if self.itp_local { self.local } else { self.cluster };
        set.unwrap_or_else(|| panic!("{}: upstream computes no set for in-cluster traffic", self.name))
    }

    /// The ways a Service asks for the hints this row carries.
    fn asks(&self) -> Vec<Ask> {
        let mut asks = vec![Ask::AsWritten];
        if self.endpoints.iter().any(|e| !e.nodes.is_empty()) {
            asks.push(Ask::PreferSameNode);
        } else if self.endpoints.iter().any(|e| !e.zones.is_empty()) {
            asks.extend([Ask::Auto, Ask::PreferClose, Ask::PreferSameZone]);
        }
        asks
    }

    fn state(&self, ask: Ask) -> ClusterState {
        let this = self.node_name();
        let mut labels = BTreeMap::from([("kubernetes.io/hostname".to_owned(), this.to_owned())]);
        if let Some(zone) = self.zone {
            labels.insert(LABEL_ZONE.into(), zone.into());
        }
        let mut state = ClusterState::default();
        state.upsert_node(Node {
            name: this.into(),
            labels: labels.into(),
            allocatable_cpu_millis: 4000,
            ready: true,
            pod_cidrs: Vec::new(),
            addresses: Vec::new(),
        });
        let mut svc = service("svc");
        svc.internal_traffic_local = self.itp_local;
        svc = match ask {
            Ask::AsWritten => svc,
            Ask::Auto => svc.mode("Auto"),
            Ask::PreferClose => svc.distribution("PreferClose"),
            Ask::PreferSameZone => svc.distribution("PreferSameZone"),
            Ask::PreferSameNode => svc.distribution("PreferSameNode"),
        };
        state.upsert_service(svc);
        let one = |list: &[&str]| (list.len() == 1).then(|| list[0].into());
        let endpoints = self
            .endpoints
            .iter()
            .map(|e| Endpoint {
                address: e.ip.parse().unwrap(),
                ready: e.cond.0,
                serving: e.cond.1,
                terminating: e.cond.2,
                node_name: if e.local { Some(this.into()) } else { one(e.nodes) },
                zone: one(e.zones),
                extra: EndpointExtra::new(
                    e.zones.iter().map(|z| (*z).to_owned()).collect(),
                    e.nodes.iter().map(|n| (*n).to_owned()).collect(),
                    None,
                ),
            })
            .collect();
        state.upsert_slice(EndpointSlice {
            key: ObjectKey::new("ns", "svc-1"),
            service: Some(ObjectKey::new("ns", "svc")),
            family: Family::V4,
            ports: vec![SlicePort { name: "http".into(), port: 80, protocol: Protocol::Tcp }],
            endpoints,
            changed_at: None,
        });
        state
    }
}

/// Upstream's table, every row and every way of asking.
#[test]
fn kube_proxy_categorize_endpoints_table() {
    let cases = cases();
    assert_eq!(cases.len(), 34, "every upstream case, once");
    let mut runs = 0;
    for case in &cases {
        // The row is transcribed as upstream's model reads it: which sets kube-proxy computes
        // (`UsesClusterEndpoints`, `UsesLocalEndpoints`), and what its gate makes of node hints.
        assert_eq!(case.cluster.is_some(), !case.itp_local || case.node_port, "{}: cluster set", case.name);
        assert_eq!(case.local.is_some(), case.itp_local || (case.etp_local && case.node_port), "{}: local", case.name);
        if !case.same_node_gate && case.endpoints.iter().any(|e| !e.nodes.is_empty()) {
            assert!(
                case.differs.iter().any(|d| d.ask == Ask::PreferSameNode && matches!(d.why, Why::SameNodeAlwaysOn)),
                "{}: node hints with kube-proxy's gate off differ from us",
                case.name
            );
        }
        for ask in case.asks() {
            let differs = case.differs.iter().find(|d| d.ask == ask);
            let expect = differs.map_or(case.upstream(), |d| d.ours);
            let selection = decide(&case.state(ask), case.node_name());
            assert_eq!(
                chosen(&selection),
                addrs(expect),
                "{} ({ask:?}){}: {}",
                case.name,
                differs.map(|d| format!(", differs from kube-proxy: {}", d.why.line())).unwrap_or_default(),
                selection.reason
            );
            assert_eq!(selection.reject, expect.is_empty(), "{} ({ask:?}): {}", case.name, selection.reason);
            runs += 1;
        }
        for d in &case.differs {
            assert!(case.asks().contains(&d.ask), "{}: a difference for {:?}, which is not run", case.name, d.ask);
            assert_ne!(addrs(d.ours), addrs(case.upstream()), "{}: a listed difference that is none", case.name);
        }
    }
    assert!(runs > cases.len() * 2, "{runs} runs");
}

/// Each difference is stated in `docs/policy.md`, in one line.
#[test]
fn readme_lists_every_difference_from_kube_proxy() {
    let readme = include_str!("../../../../../docs/policy.md");
    for why in Why::ALL {
        assert!(
            readme.lines().any(|line| line == format!("- {}", why.line())),
            "docs/policy.md lacks: - {}",
            why.line()
        );
    }
}
