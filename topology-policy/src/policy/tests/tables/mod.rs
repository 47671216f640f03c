//! One table per mode. Each row: the Service, the endpoints, the node deciding, and what it must
//! choose (addresses) or refuse (empty).

mod hints;
mod keys;

use topology_model::{Endpoint, Service};

use super::world::*;
use crate::{
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
