//! Topology Aware Routing hints and `trafficDistribution`, with and without hints.

use super::*;

#[test]
fn topology_aware_hints_follow_kube_proxy() {
    use PolicyKind::{Default, TopologyAwareHints as Hints};
    let auto = || service("web").mode("Auto");
    let partial = || {
        let mut e = endpoints(true);
        e[3].set_extra(|extra| extra.hint_zones = Box::default());
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
            x.set_extra(|extra| extra.hint_nodes = Box::default());
        }
        e
    };
    let partial = || {
        let mut e = endpoints(true);
        e[0].set_extra(|extra| (extra.hint_zones, extra.hint_nodes) = (Box::default(), Box::default()));
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
