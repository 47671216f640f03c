//! One table per mode. Each row: the Service, the endpoints, the node deciding, and what it must
//! choose (addresses) or refuse (empty).

use super::world::*;
use crate::{
    cluster::{Endpoint, Service},
    desired::Locality,
    policy::{PolicyKind, Selection},
};

struct Row {
    name: &'static str,
    service: Service,
    endpoints: Vec<Endpoint>,
    node: &'static str,
    expect: &'static [&'static str],
    policy: PolicyKind,
}

fn check(rows: Vec<Row>) {
    for row in rows {
        let state = with(row.service, row.endpoints);
        let selection = decide(&state, row.node);
        assert_eq!(chosen(&selection), addrs(row.expect), "{}: {}", row.name, selection.reason);
        assert_eq!(selection.reject, row.expect.is_empty(), "{}: {}", row.name, selection.reason);
        assert_eq!(selection.policy, row.policy, "{}: {}", row.name, selection.reason);
        assert!(selection.backends.iter().all(|b| b.weight == 1.0), "{}: equal weights", row.name);
    }
}

const ALL: &[&str] = &["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.3.1"];
const ZONE_A: &[&str] = &["10.0.1.1", "10.0.1.2"];
const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";
const REGION: &str = "topology.kubernetes.io/region";

#[test]
fn topology_keys_follow_the_kep_536_test_plan() {
    use PolicyKind::{Default, TopologyKeys as Keys};
    let svc = || service("web");
    let rows = vec![
        Row { name: "no keys", service: svc(), endpoints: endpoints(false), node: "a1", expect: ALL, policy: Default },
        Row {
            name: "hard hostname, local endpoint",
            service: svc().keys(&[HOST]),
            endpoints: endpoints(false),
            node: "a1",
            expect: &["10.0.1.1"],
            policy: Keys,
        },
        Row {
            name: "hard hostname, no local endpoint",
            service: svc().keys(&[HOST]),
            endpoints: endpoints(false),
            node: "a3",
            expect: &[],
            policy: Keys,
        },
        Row {
            name: "hard zone, zone has endpoints",
            service: svc().keys(&[ZONE]),
            endpoints: endpoints(false),
            node: "a3",
            expect: ZONE_A,
            policy: Keys,
        },
        Row {
            name: "hard zone, zone empty",
            service: svc().keys(&[ZONE]),
            endpoints: endpoints(false),
            node: "d1",
            expect: &[],
            policy: Keys,
        },
        Row {
            name: "hard zone, node without zone label",
            service: svc().keys(&[ZONE]),
            endpoints: endpoints(false),
            node: "nz",
            expect: &[],
            policy: Keys,
        },
        Row {
            name: "only *",
            service: svc().keys(&["*"]),
            endpoints: endpoints(false),
            node: "d1",
            expect: ALL,
            policy: Keys,
        },
        Row {
            name: "hostname then zone: node matches",
            service: svc().keys(&[HOST, ZONE]),
            endpoints: endpoints(false),
            node: "a2",
            expect: &["10.0.1.2"],
            policy: Keys,
        },
        Row {
            name: "hostname then zone: zone matches",
            service: svc().keys(&[HOST, ZONE]),
            endpoints: endpoints(false),
            node: "a3",
            expect: ZONE_A,
            policy: Keys,
        },
        Row {
            name: "hostname then zone: nothing matches",
            service: svc().keys(&[HOST, ZONE]),
            endpoints: endpoints(false),
            node: "d1",
            expect: &[],
            policy: Keys,
        },
        Row {
            name: "zone then region: region matches",
            service: svc().keys(&[ZONE, REGION]),
            endpoints: endpoints(false),
            node: "d1",
            expect: &["10.0.3.1"],
            policy: Keys,
        },
        Row {
            name: "zone then region: node without zone uses region",
            service: svc().keys(&[ZONE, REGION]),
            endpoints: endpoints(false),
            node: "nz",
            expect: &["10.0.1.1", "10.0.1.2", "10.0.2.1"],
            policy: Keys,
        },
        Row {
            name: "several keys plus *: falls to *",
            service: svc().keys(&[HOST, ZONE, "*"]),
            endpoints: endpoints(false),
            node: "d1",
            expect: ALL,
            policy: Keys,
        },
        Row {
            name: "several keys plus *: zone wins",
            service: svc().keys(&[HOST, ZONE, "*"]),
            endpoints: endpoints(false),
            node: "a3",
            expect: ZONE_A,
            policy: Keys,
        },
        Row {
            name: "spec.topologyKeys",
            service: svc().spec_keys(&[HOST, "*"]),
            endpoints: endpoints(false),
            node: "b1",
            expect: &["10.0.2.1"],
            policy: Keys,
        },
        Row {
            name: "any label key",
            service: svc().keys(&["example.com/rack", "*"]),
            endpoints: endpoints(false),
            node: "a1",
            expect: ALL,
            policy: Keys,
        },
        Row {
            name: "zone from the endpoint's own field when its node is unknown",
            service: svc().keys(&[ZONE]),
            endpoints: vec![ep("10.0.9.1", "ghost").zone("a"), ep("10.0.9.2", "ghost2").zone("b")],
            node: "a1",
            expect: &["10.0.9.1"],
            policy: Keys,
        },
        Row {
            name: "hostname from nodeName when the node is unknown",
            service: svc().keys(&[HOST]),
            endpoints: vec![ep("10.0.9.1", "a1"), ep("10.0.9.2", "")],
            node: "a1",
            expect: &["10.0.9.1"],
            policy: Keys,
        },
        Row {
            name: "endpoint without nodeName never matches hostname",
            service: svc().keys(&[HOST]),
            endpoints: vec![ep("10.0.9.2", "")],
            node: "a1",
            expect: &[],
            policy: Keys,
        },
        Row {
            name: "unready endpoints are not usable",
            service: svc().keys(&[HOST, "*"]),
            endpoints: vec![ep("10.0.1.1", "a1").unready(), ep("10.0.2.1", "b1")],
            node: "a1",
            expect: &["10.0.2.1"],
            policy: Keys,
        },
        Row {
            name: "terminating fallback keeps topology",
            service: svc().keys(&[ZONE]),
            endpoints: vec![
                ep("10.0.1.1", "a1").terminating(),
                ep("10.0.2.1", "b1").terminating(),
                ep("10.0.2.2", "b1").unready(),
            ],
            node: "a2",
            expect: &["10.0.1.1"],
            policy: Keys,
        },
        Row {
            name: "no endpoints at all",
            service: svc().keys(&["*"]),
            endpoints: vec![],
            node: "a1",
            expect: &[],
            policy: Keys,
        },
    ];
    check(rows);
}

#[test]
fn invalid_topology_keys_are_ignored_as_a_whole_and_reported() {
    let seventeen: Vec<String> = (0..17).map(|i| format!("example.com/k{i}")).collect();
    let seventeen: Vec<&str> = seventeen.iter().map(String::as_str).collect();
    let cases: Vec<(&str, Vec<&str>, &str)> = vec![
        ("too many", seventeen, "17 keys; at most 16 are allowed"),
        ("* not last", vec!["*", HOST], "\"*\" must be the last key"),
        ("duplicate", vec![HOST, ZONE, HOST], "appears more than once"),
        ("empty entry", vec![HOST, "", ZONE], "\"\" is not a valid label key"),
        ("space", vec!["bad key"], "\"bad key\" is not a valid label key"),
        ("uppercase prefix", vec!["Example.com/zone"], "not a lowercase DNS subdomain"),
        ("two slashes", vec!["a/b/c"], "\"a/b/c\" is not a valid label key"),
        ("name too long", vec!["x".repeat(64).leak()], "1 to 63 characters"),
    ];
    for (name, keys, why) in cases {
        let state = with(service("web").keys(&keys).distribution("PreferClose"), endpoints(false));
        let selection = decide(&state, "a1");
        assert_eq!(selection.policy, PolicyKind::PreferClose, "{name}: routes as if the keys were absent");
        assert_eq!(chosen(&selection), addrs(ZONE_A), "{name}");
        assert_eq!(selection.warnings.len(), 1, "{name}: {:?}", selection.warnings);
        let warning = &selection.warnings[0];
        assert!(warning.starts_with("annotation topology-agent.io/topology-keys ignored: "), "{name}: {warning}");
        assert!(warning.contains(why), "{name}: {warning}");
    }
}

#[test]
fn topology_aware_hints_follow_kube_proxy() {
    use PolicyKind::{Default, TopologyAwareHints as Hints};
    let auto = || service("web").mode("Auto");
    let partial = || {
        let mut e = endpoints(true);
        e[3].hint_zones.clear();
        e
    };
    let rows = vec![
        Row {
            name: "all hinted",
            service: auto(),
            endpoints: endpoints(true),
            node: "a3",
            expect: ZONE_A,
            policy: Hints,
        },
        Row {
            name: "older annotation, lower case",
            service: service("web").mode("auto"),
            endpoints: endpoints(true),
            node: "b1",
            expect: &["10.0.2.1"],
            policy: Hints,
        },
        Row {
            name: "any non-disabled value",
            service: service("web").mode("PreferZone"),
            endpoints: endpoints(true),
            node: "b1",
            expect: &["10.0.2.1"],
            policy: Hints,
        },
        Row {
            name: "disabled",
            service: service("web").mode("disabled"),
            endpoints: endpoints(true),
            node: "b1",
            expect: ALL,
            policy: Default,
        },
        Row {
            name: "Disabled",
            service: service("web").mode("Disabled"),
            endpoints: endpoints(true),
            node: "b1",
            expect: ALL,
            policy: Default,
        },
        Row { name: "partial hints", service: auto(), endpoints: partial(), node: "a1", expect: ALL, policy: Hints },
        Row { name: "no hints", service: auto(), endpoints: endpoints(false), node: "a1", expect: ALL, policy: Hints },
        Row {
            name: "zone not represented",
            service: auto(),
            endpoints: endpoints(true),
            node: "d1",
            expect: ALL,
            policy: Hints,
        },
        Row {
            name: "node without zone label",
            service: auto(),
            endpoints: endpoints(true),
            node: "nz",
            expect: ALL,
            policy: Hints,
        },
        Row {
            name: "node with an empty zone label",
            service: auto(),
            endpoints: endpoints(true),
            node: "empty-zone",
            expect: ALL,
            policy: Hints,
        },
        Row {
            name: "unready endpoints without hints do not disable",
            service: auto(),
            endpoints: {
                let mut e = endpoints(true);
                e.push(ep("10.0.1.9", "a1").unready());
                e
            },
            node: "a1",
            expect: ZONE_A,
            policy: Hints,
        },
        Row {
            name: "hint for another zone than the endpoint's",
            service: auto(),
            endpoints: vec![ep("10.0.1.1", "a1").for_zones(&["b"]), ep("10.0.2.1", "b1").for_zones(&["a"])],
            node: "a1",
            expect: &["10.0.2.1"],
            policy: Hints,
        },
        Row {
            name: "serving-and-terminating fallback is not filtered (kube-proxy)",
            service: auto(),
            endpoints: vec![
                ep("10.0.1.1", "a1").terminating().for_zones(&["a"]),
                ep("10.0.2.1", "b1").terminating().for_zones(&["b"]),
            ],
            node: "a2",
            expect: &["10.0.1.1", "10.0.2.1"],
            policy: Hints,
        },
        Row {
            name: "precedence over trafficDistribution",
            service: auto().distribution("PreferSameNode"),
            endpoints: partial(),
            node: "a1",
            expect: ALL,
            policy: Hints,
        },
        Row { name: "no endpoints", service: auto(), endpoints: vec![], node: "a1", expect: &[], policy: Hints },
    ];
    check(rows);
}

#[test]
fn traffic_distribution_with_and_without_hints() {
    use PolicyKind::{PreferClose as Close, PreferSameNode as SameNode, PreferSameZone as SameZone};
    let no_node_hints = || {
        let mut e = endpoints(true);
        for x in &mut e {
            x.hint_nodes.clear();
        }
        e
    };
    let partial = || {
        let mut e = endpoints(true);
        e[0].hint_zones.clear();
        e[0].hint_nodes.clear();
        e
    };
    let td = |value| service("web").distribution(value);
    let rows = vec![
        Row {
            name: "PreferClose, hints",
            service: td("PreferClose"),
            endpoints: endpoints(true),
            node: "a3",
            expect: ZONE_A,
            policy: Close,
        },
        Row {
            name: "PreferClose, no hints",
            service: td("PreferClose"),
            endpoints: endpoints(false),
            node: "a3",
            expect: ZONE_A,
            policy: Close,
        },
        Row {
            name: "PreferClose, partial hints",
            service: td("PreferClose"),
            endpoints: partial(),
            node: "a3",
            expect: ZONE_A,
            policy: Close,
        },
        Row {
            name: "PreferClose, empty zone",
            service: td("PreferClose"),
            endpoints: endpoints(false),
            node: "d1",
            expect: ALL,
            policy: Close,
        },
        Row {
            name: "PreferClose, node without zone",
            service: td("PreferClose"),
            endpoints: endpoints(true),
            node: "nz",
            expect: ALL,
            policy: Close,
        },
        Row {
            name: "PreferClose, endpoint zone field only",
            service: td("PreferClose"),
            endpoints: vec![ep("10.0.9.1", "ghost").zone("b"), ep("10.0.9.2", "ghost").zone("c")],
            node: "b1",
            expect: &["10.0.9.1"],
            policy: Close,
        },
        Row {
            name: "PreferSameZone, hints",
            service: td("PreferSameZone"),
            endpoints: endpoints(true),
            node: "b1",
            expect: &["10.0.2.1"],
            policy: SameZone,
        },
        Row {
            name: "PreferSameZone, no hints",
            service: td("PreferSameZone"),
            endpoints: endpoints(false),
            node: "c1",
            expect: &["10.0.3.1"],
            policy: SameZone,
        },
        Row {
            name: "PreferSameNode, hints, local",
            service: td("PreferSameNode"),
            endpoints: endpoints(true),
            node: "a2",
            expect: &["10.0.1.2"],
            policy: SameNode,
        },
        Row {
            name: "PreferSameNode, no hints, local",
            service: td("PreferSameNode"),
            endpoints: endpoints(false),
            node: "a2",
            expect: &["10.0.1.2"],
            policy: SameNode,
        },
        Row {
            name: "PreferSameNode, zone hints only",
            service: td("PreferSameNode"),
            endpoints: no_node_hints(),
            node: "a1",
            expect: &["10.0.1.1"],
            policy: SameNode,
        },
        Row {
            name: "PreferSameNode falls back to zone",
            service: td("PreferSameNode"),
            endpoints: endpoints(true),
            node: "a3",
            expect: ZONE_A,
            policy: SameNode,
        },
        Row {
            name: "PreferSameNode falls back to all",
            service: td("PreferSameNode"),
            endpoints: endpoints(false),
            node: "d1",
            expect: ALL,
            policy: SameNode,
        },
        Row {
            name: "PreferSameNode, node without zone",
            service: td("PreferSameNode"),
            endpoints: endpoints(false),
            node: "nz",
            expect: ALL,
            policy: SameNode,
        },
        Row {
            name: "terminating fallback is not filtered (kube-proxy)",
            service: td("PreferClose"),
            endpoints: vec![ep("10.0.1.1", "a1").terminating(), ep("10.0.2.1", "b1").terminating()],
            node: "b1",
            expect: &["10.0.1.1", "10.0.2.1"],
            policy: Close,
        },
        Row {
            name: "no endpoints",
            service: td("PreferClose"),
            endpoints: vec![],
            node: "a1",
            expect: &[],
            policy: Close,
        },
    ];
    check(rows);
}

#[test]
fn an_unknown_traffic_distribution_is_ignored_with_a_warning() {
    let state = with(service("web").distribution("PreferNearby"), endpoints(false));
    let selection = decide(&state, "a1");
    assert_eq!(selection.policy, PolicyKind::Default);
    assert_eq!(chosen(&selection), addrs(ALL));
    assert_eq!(selection.warnings.len(), 1);
    assert!(selection.warnings[0].contains("\"PreferNearby\" ignored"), "{:?}", selection.warnings);
}

#[test]
fn internal_traffic_policy_local_and_default() {
    use PolicyKind::{Default, Local};
    let rows = vec![
        Row {
            name: "local endpoint",
            service: service("web").local(),
            endpoints: endpoints(true),
            node: "b1",
            expect: &["10.0.2.1"],
            policy: Local,
        },
        Row {
            name: "no local endpoint",
            service: service("web").local(),
            endpoints: endpoints(true),
            node: "a3",
            expect: &[],
            policy: Local,
        },
        Row {
            name: "topology is not applied",
            service: service("web").local().keys(&[ZONE]).mode("Auto"),
            endpoints: endpoints(true),
            node: "c1",
            expect: &["10.0.3.1"],
            policy: Local,
        },
        Row {
            name: "local terminating when no local is ready",
            service: service("web").local(),
            endpoints: vec![ep("10.0.1.1", "a1").terminating(), ep("10.0.2.1", "b1")],
            node: "a1",
            expect: &["10.0.1.1"],
            policy: Local,
        },
        Row {
            name: "local unready is not usable",
            service: service("web").local(),
            endpoints: vec![ep("10.0.1.1", "a1").unready(), ep("10.0.2.1", "b1")],
            node: "a1",
            expect: &[],
            policy: Local,
        },
        Row {
            name: "default: ready only",
            service: service("web"),
            endpoints: vec![ep("10.0.1.1", "a1").unready(), ep("10.0.1.2", "a2").terminating(), ep("10.0.2.1", "b1")],
            node: "a1",
            expect: &["10.0.2.1"],
            policy: Default,
        },
        Row {
            name: "default: serving-and-terminating fallback",
            service: service("web"),
            endpoints: vec![ep("10.0.1.1", "a1").unready(), ep("10.0.1.2", "a2").terminating()],
            node: "a1",
            expect: &["10.0.1.2"],
            policy: Default,
        },
        Row {
            name: "default: nothing usable",
            service: service("web"),
            endpoints: vec![ep("10.0.1.1", "a1").unready()],
            node: "a1",
            expect: &[],
            policy: Default,
        },
    ];
    check(rows);
}

#[test]
fn each_backend_carries_its_locality() {
    let state = with(service("web"), endpoints(false));
    let selection: Selection = decide(&state, "a1");
    let locality = |addr: &str| selection.backends.iter().find(|b| b.address.to_string() == addr).unwrap().locality;
    assert_eq!(locality("10.0.1.1"), Locality::Node);
    assert_eq!(locality("10.0.1.2"), Locality::Zone);
    assert_eq!(locality("10.0.2.1"), Locality::Region);
    assert_eq!(locality("10.0.3.1"), Locality::Other);
    let from_nz = decide(&state, "nz");
    assert!(from_nz.backends.iter().all(|b| b.locality != Locality::Zone), "no zone label, no zone locality");
}

#[test]
fn reasons_say_which_mode_level_and_fallback() {
    let reason = |svc: Service, node: &str| decide(&with(svc, endpoints(false)), node).reason;
    assert_eq!(reason(service("web"), "a1"), "default: all 4 ready endpoints");
    assert_eq!(
        reason(service("web").keys(&[HOST, ZONE, "*"]), "a3"),
        "topology keys [kubernetes.io/hostname,topology.kubernetes.io/zone,*]: kubernetes.io/hostname=a3 matched none; \
         topology.kubernetes.io/zone=a matched 2 of 4 ready endpoints"
    );
    assert_eq!(
        reason(service("web").keys(&[HOST]), "d1"),
        "topology keys [kubernetes.io/hostname]: kubernetes.io/hostname=d1 matched none; no \"*\" fallback, so connections are refused"
    );
    assert_eq!(
        reason(service("web").distribution("PreferSameNode"), "a3"),
        "PreferSameNode: no endpoint on node a3 (from each endpoint's nodeName: hints missing on 4 of 4); \
         2 of 4 ready endpoints in zone a (from each endpoint's zone: hints missing on 4 of 4)"
    );
    assert_eq!(
        reason(service("web").mode("Auto"), "a1"),
        "topology-aware hints (Auto) not applied: endpoint 10.0.1.1 has no zone hint; all 4 ready endpoints"
    );
    assert_eq!(
        reason(service("web").local(), "d1"),
        "internalTrafficPolicy Local: no ready or serving-and-terminating endpoint on d1; connections are refused"
    );
}
