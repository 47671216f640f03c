//! Topology keys (KEP-536): the test plan, and invalid keys.

use super::*;

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
