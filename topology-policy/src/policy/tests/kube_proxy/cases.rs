//! Upstream's cases, in upstream's order and under upstream's names.

use super::{Ask, Case, Cond, Differs, Ep, GONE, L, R, READY, TERMINATING, UNREADY, Why, ep};

const A4: &[&str] = &["10.1.2.3", "10.1.2.4", "10.1.2.5", "10.1.2.6"];
const Z_A: &[&str] = &["10.1.2.3", "10.1.2.6"];
const BOTH: &[&str] = &["10.0.0.0", "10.0.0.1"];

fn as_written(ours: &'static [&'static str]) -> Vec<Differs> {
    vec![Differs { ask: Ask::AsWritten, ours, why: Why::HintsWhenAsked }]
}

/// Four ready endpoints hinted for zones a, b, c, a, as most zone cases have them.
fn four(local: [bool; 4]) -> Vec<Ep> {
    vec![
        ep("10.1.2.3", local[0], READY, &["zone-a"], &[]),
        ep("10.1.2.4", local[1], READY, &["zone-b"], &[]),
        ep("10.1.2.5", local[2], READY, &["zone-c"], &[]),
        ep("10.1.2.6", local[3], READY, &["zone-a"], &[]),
    ]
}

/// The same four, with node hints node-1 to node-4.
fn four_nodes() -> Vec<Ep> {
    vec![
        ep("10.1.2.3", R, READY, &["zone-a"], &["node-1"]),
        ep("10.1.2.4", R, READY, &["zone-b"], &["node-2"]),
        ep("10.1.2.5", R, READY, &["zone-c"], &["node-3"]),
        ep("10.1.2.6", R, READY, &["zone-a"], &["node-4"]),
    ]
}

fn two(first: (bool, Cond), second: (bool, Cond)) -> Vec<Ep> {
    vec![ep("10.0.0.0", first.0, first.1, &[], &[]), ep("10.0.0.1", second.0, second.1, &[], &[])]
}

pub(super) fn cases() -> Vec<Case> {
    let zone_a = Some("zone-a");
    vec![
        Case {
            name: "should use topology since all endpoints have hints, node has a zone label and and there are endpoints for the node's zone",
            zone: zone_a,
            endpoints: four([R; 4]),
            cluster: Some(Z_A),
            differs: as_written(A4),
            ..Case::default()
        },
        Case {
            name: "eTP: Local, topology ignored for Local endpoints",
            zone: zone_a,
            etp_local: true,
            node_port: true,
            endpoints: four([L, L, R, R]),
            cluster: Some(Z_A),
            local: Some(&["10.1.2.3", "10.1.2.4"]),
            differs: as_written(A4),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, topology ignored for Local endpoints",
            zone: zone_a,
            itp_local: true,
            node_port: true,
            endpoints: four([L, L, R, R]),
            cluster: Some(Z_A),
            local: Some(&["10.1.2.3", "10.1.2.4"]),
            ..Case::default()
        },
        Case {
            name: "empty node labels",
            endpoints: vec![ep("10.1.2.3", R, READY, &["zone-a"], &[])],
            cluster: Some(&["10.1.2.3"]),
            ..Case::default()
        },
        Case {
            name: "empty zone label",
            zone: Some(""),
            endpoints: vec![ep("10.1.2.3", R, READY, &["zone-a"], &[])],
            cluster: Some(&["10.1.2.3"]),
            ..Case::default()
        },
        Case {
            name: "node in different zone, no endpoint filtering",
            zone: Some("zone-b"),
            endpoints: vec![ep("10.1.2.3", R, READY, &["zone-a"], &[]), ep("10.1.2.5", R, READY, &["zone-c"], &[])],
            cluster: Some(&["10.1.2.3", "10.1.2.5"]),
            ..Case::default()
        },
        Case {
            name: "unready endpoint",
            zone: zone_a,
            endpoints: vec![
                ep("10.1.2.3", R, READY, &["zone-a"], &[]),
                ep("10.1.2.4", R, READY, &["zone-b"], &[]),
                ep("10.1.2.5", R, READY, &["zone-c"], &[]),
                ep("10.1.2.6", R, UNREADY, &["zone-a"], &[]),
            ],
            cluster: Some(&["10.1.2.3"]),
            differs: as_written(&["10.1.2.3", "10.1.2.4", "10.1.2.5"]),
            ..Case::default()
        },
        Case {
            name: "only unready endpoints in same zone (should not filter)",
            zone: zone_a,
            endpoints: vec![
                ep("10.1.2.3", R, UNREADY, &["zone-a"], &[]),
                ep("10.1.2.4", R, READY, &["zone-b"], &[]),
                ep("10.1.2.5", R, READY, &["zone-c"], &[]),
                ep("10.1.2.6", R, UNREADY, &["zone-a"], &[]),
            ],
            cluster: Some(&["10.1.2.4", "10.1.2.5"]),
            ..Case::default()
        },
        Case {
            name: "missing hints, no filtering applied",
            zone: zone_a,
            endpoints: vec![
                ep("10.1.2.3", R, READY, &["zone-a"], &[]),
                ep("10.1.2.4", R, READY, &["zone-b"], &[]),
                ep("10.1.2.5", R, READY, &[], &[]),
                ep("10.1.2.6", R, READY, &["zone-a"], &[]),
            ],
            cluster: Some(A4),
            differs: vec![
                Differs { ask: Ask::PreferClose, ours: Z_A, why: Why::OwnFields },
                Differs { ask: Ask::PreferSameZone, ours: Z_A, why: Why::OwnFields },
            ],
            ..Case::default()
        },
        Case {
            name: "multiple hints per endpoint, filtering includes any endpoint with zone included",
            zone: Some("zone-c"),
            endpoints: vec![
                ep("10.1.2.3", R, READY, &["zone-a", "zone-b", "zone-c"], &[]),
                ep("10.1.2.4", R, READY, &["zone-b", "zone-c"], &[]),
                ep("10.1.2.5", R, READY, &["zone-b", "zone-d"], &[]),
                ep("10.1.2.6", R, READY, &["zone-c"], &[]),
            ],
            cluster: Some(&["10.1.2.3", "10.1.2.4", "10.1.2.6"]),
            differs: as_written(A4),
            ..Case::default()
        },
        Case {
            name: "PreferSameNode falls back to same-zone when feature gate disabled",
            node: "node-1",
            zone: zone_a,
            endpoints: four_nodes(),
            cluster: Some(Z_A),
            differs: vec![
                Differs { ask: Ask::AsWritten, ours: A4, why: Why::HintsWhenAsked },
                Differs { ask: Ask::PreferSameNode, ours: &["10.1.2.3"], why: Why::SameNodeAlwaysOn },
            ],
            ..Case::default()
        },
        Case {
            name: "PreferSameNode available",
            same_node_gate: true,
            node: "node-1",
            zone: zone_a,
            endpoints: four_nodes(),
            cluster: Some(&["10.1.2.3"]),
            differs: as_written(A4),
            ..Case::default()
        },
        Case {
            name: "PreferSameNode ignored if some endpoints unhinted",
            same_node_gate: true,
            node: "node-1",
            zone: zone_a,
            endpoints: vec![
                ep("10.1.2.3", R, READY, &["zone-a"], &["node-1"]),
                ep("10.1.2.4", R, READY, &[], &[]),
                ep("10.1.2.5", R, READY, &["zone-c"], &["node-3"]),
                ep("10.1.2.6", R, READY, &["zone-a"], &["node-4"]),
            ],
            cluster: Some(A4),
            differs: vec![Differs { ask: Ask::PreferSameNode, ours: &["10.1.2.3"], why: Why::OwnFields }],
            ..Case::default()
        },
        Case {
            name: "PreferSameNode falls back to PreferSameZone if no endpoint for node",
            same_node_gate: true,
            node: "node-0",
            zone: zone_a,
            endpoints: four_nodes(),
            cluster: Some(Z_A),
            differs: as_written(A4),
            ..Case::default()
        },
        Case {
            name: "conflicting topology and localness require merging allEndpoints",
            zone: zone_a,
            etp_local: true,
            node_port: true,
            endpoints: vec![
                ep("10.0.0.0", L, READY, &["zone-a"], &[]),
                ep("10.0.0.1", L, READY, &["zone-b"], &[]),
                ep("10.0.0.2", R, READY, &["zone-a"], &[]),
                ep("10.0.0.3", R, READY, &["zone-b"], &[]),
            ],
            cluster: Some(&["10.0.0.0", "10.0.0.2"]),
            local: Some(BOTH),
            differs: as_written(&["10.0.0.0", "10.0.0.1", "10.0.0.2", "10.0.0.3"]),
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, with empty endpoints",
            itp_local: true,
            local: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, but all endpoints are remote",
            itp_local: true,
            endpoints: two((R, READY), (R, READY)),
            local: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, all endpoints are local",
            itp_local: true,
            endpoints: two((L, READY), (L, READY)),
            local: Some(BOTH),
            ..Case::default()
        },
        Case {
            name: "internalTrafficPolicy: Local, some endpoints are local",
            itp_local: true,
            endpoints: two((L, READY), (R, READY)),
            local: Some(&["10.0.0.0"]),
            ..Case::default()
        },
        Case {
            name: "Cluster traffic policy, endpoints not Ready",
            endpoints: two((R, UNREADY), (R, UNREADY)),
            cluster: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "Cluster traffic policy, some endpoints are Ready",
            endpoints: two((R, UNREADY), (R, READY)),
            cluster: Some(&["10.0.0.1"]),
            ..Case::default()
        },
        Case {
            name: "Cluster traffic policy, all endpoints are terminating",
            endpoints: two((R, TERMINATING), (R, TERMINATING)),
            cluster: Some(BOTH),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, eTP: Cluster, some endpoints local",
            itp_local: true,
            node_port: true,
            endpoints: two((L, READY), (R, READY)),
            cluster: Some(BOTH),
            local: Some(&["10.0.0.0"]),
            ..Case::default()
        },
        Case {
            name: "iTP: Cluster, eTP: Local, some endpoints local",
            etp_local: true,
            node_port: true,
            endpoints: two((L, READY), (R, READY)),
            cluster: Some(BOTH),
            local: Some(&["10.0.0.0"]),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, eTP: Local, some endpoints local",
            itp_local: true,
            etp_local: true,
            node_port: true,
            endpoints: two((L, READY), (R, READY)),
            cluster: Some(BOTH),
            local: Some(&["10.0.0.0"]),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, eTP: Local, all endpoints remote",
            itp_local: true,
            etp_local: true,
            node_port: true,
            endpoints: two((R, READY), (R, READY)),
            cluster: Some(BOTH),
            local: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "iTP: Local, eTP: Local, all endpoints remote and terminating",
            itp_local: true,
            etp_local: true,
            node_port: true,
            endpoints: two((R, TERMINATING), (R, TERMINATING)),
            cluster: Some(BOTH),
            local: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "iTP: Cluster, eTP: Local, with terminating endpoints",
            etp_local: true,
            node_port: true,
            endpoints: vec![
                ep("10.0.0.0", R, READY, &[], &[]),
                ep("10.0.0.1", L, GONE, &[], &[]),
                ep("10.0.0.2", L, TERMINATING, &[], &[]),
                ep("10.0.0.3", R, TERMINATING, &[], &[]),
            ],
            cluster: Some(&["10.0.0.0"]),
            local: Some(&["10.0.0.2"]),
            ..Case::default()
        },
        Case {
            name: "eTP ignored if not externally accessible",
            etp_local: true,
            endpoints: two((R, READY), (L, READY)),
            cluster: Some(BOTH),
            ..Case::default()
        },
        Case {
            name: "no cluster endpoints for iTP:Local internal-only service",
            itp_local: true,
            endpoints: two((R, READY), (L, READY)),
            local: Some(&["10.0.0.1"]),
            ..Case::default()
        },
        Case {
            name: "externalTrafficPolicy: Local, externally accessible, with empty endpoints",
            etp_local: true,
            node_port: true,
            cluster: Some(&[]),
            local: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "externalTrafficPolicy: Local, externally accessible, but all endpoints are remote",
            etp_local: true,
            node_port: true,
            endpoints: two((R, READY), (R, READY)),
            cluster: Some(BOTH),
            local: Some(&[]),
            ..Case::default()
        },
        Case {
            name: "externalTrafficPolicy: Local, externally accessible, all endpoints are local",
            etp_local: true,
            node_port: true,
            endpoints: two((L, READY), (L, READY)),
            cluster: Some(BOTH),
            local: Some(BOTH),
            ..Case::default()
        },
        Case {
            name: "externalTrafficPolicy: Local, externally accessible, some endpoints are local",
            etp_local: true,
            node_port: true,
            endpoints: two((L, READY), (R, READY)),
            cluster: Some(BOTH),
            local: Some(&["10.0.0.0"]),
            ..Case::default()
        },
    ]
}
