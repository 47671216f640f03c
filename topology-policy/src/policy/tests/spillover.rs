//! Spillover: the plan each node takes its row from, the scopes topology keys give it, the modes
//! it replaces or yields to, and the property that makes it safe: the nodes' loads add up to at
//! most (1 + ε) of the fair share on every endpoint.

use std::collections::BTreeMap;

use proptest::prelude::*;
use topology_model::{ClusterState, Service};

use super::world::*;
use crate::policy::{
    PolicyKind, Selection,
    spillover::{ANNOTATION_MAX_OVERLOAD, ANNOTATION_SPILLOVER, parse_max_overload},
};

fn spilling(max_overload: Option<&str>) -> Service {
    let mut svc = service("web");
    svc.agent_annotations.insert(ANNOTATION_SPILLOVER.into(), "capacity".into());
    if let Some(value) = max_overload {
        svc.agent_annotations.insert(ANNOTATION_MAX_OVERLOAD.into(), value.into());
    }
    svc
}

/// Weights by address, normalised to sum to 1.
fn shares(selection: &Selection) -> BTreeMap<String, f64> {
    let total: f64 = selection.backends.iter().map(|b| b.weight).sum();
    selection.backends.iter().map(|b| (b.address.to_string(), b.weight / total)).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

// In `world()`, zones a (3 nodes), b, c and d (1 node each) have demand 50 %, 16.7 %, 16.7 % and
// 16.7 %; endpoints: a 2, b 1, c 1; a, b in region r1, c, d in r2.

#[test]
fn a_zone_within_capacity_keeps_everything() {
    let selection = decide(&with(spilling(None), endpoints(false)), "a1");
    assert_eq!(selection.policy, PolicyKind::Spillover);
    assert_eq!(chosen(&selection), addrs(&["10.0.1.1", "10.0.1.2"]), "{}", selection.reason);
    let report = selection.spillover.as_ref().unwrap();
    assert!(close(report.kept, 1.0) && report.spilled.is_empty());
    assert!(close(report.demand_share, 0.5) && close(report.endpoint_share, 0.5));
    assert!(
        selection.reason.starts_with("spillover (max overload 10%, cluster-wide): zone a has 50% of demand"),
        "{}",
        selection.reason
    );
}

#[test]
fn a_zone_without_endpoints_fills_its_region_first_then_the_least_loaded() {
    // d's 1/6 of the traffic: c (same region) can take 1.1/4 - 1/6 = 0.1083; the remaining 0.0583
    // goes to b, the least loaded zone with headroom (a sits at 0.25 per endpoint, b at 0.167).
    let selection = decide(&with(spilling(None), endpoints(false)), "d1");
    let shares = shares(&selection);
    let d = 1.0 / 6.0;
    let to_c = 1.1 / 4.0 - d;
    assert!(close(shares["10.0.3.1"], to_c / d), "{shares:?}: {}", selection.reason);
    assert!(close(shares["10.0.2.1"], (d - to_c) / d), "{shares:?}");
    assert!(!shares.contains_key("10.0.1.1"), "zone a gets nothing: {shares:?}");
    let report = selection.spillover.unwrap();
    assert_eq!(report.spilled.iter().map(|s| s.zone.as_str()).collect::<Vec<_>>(), ["c", "b"]);
    assert!(close(report.kept, 0.0));
}

#[test]
fn a_saturated_zone_spills_only_its_surplus() {
    // Only one endpoint in zone a: a keeps 1.1/3 of all traffic, spills 0.5 - 0.367.
    let eps = vec![ep("10.0.1.1", "a1"), ep("10.0.2.1", "b1"), ep("10.0.3.1", "c1")];
    let selection = decide(&with(spilling(Some("10%")), eps), "a2");
    let shares = shares(&selection);
    let kept = 1.1 / 3.0;
    assert!(close(shares["10.0.1.1"], kept / 0.5), "{shares:?}: {}", selection.reason);
    let report = selection.spillover.unwrap();
    assert!(close(report.kept, kept / 0.5));
    assert!(close(report.in_zone, report.bound), "{report:?}");
    let a = report.zones.iter().find(|z| z.zone == "a").unwrap();
    assert!(close(a.load_factor.unwrap(), 1.1), "{a:?}");
    assert!(report.zones.iter().all(|z| z.load_factor.is_none_or(|f| f <= 1.1 + 1e-9)), "{report:?}");
}

#[test]
fn epsilon_zero_balances_exactly_and_a_larger_one_keeps_more() {
    let eps = vec![ep("10.0.1.1", "a1"), ep("10.0.2.1", "b1"), ep("10.0.3.1", "c1")];
    let strict = decide(&with(spilling(Some("0")), eps.clone()), "a1").spillover.unwrap();
    assert!(strict.zones.iter().all(|z| z.load_factor.is_none_or(|f| close(f, 1.0))), "{strict:?}");
    let loose = decide(&with(spilling(Some("0.5")), eps), "a1").spillover.unwrap();
    assert!(close(loose.kept, 1.0), "1.5/3 = 50 % is exactly zone a's demand: {loose:?}");
}

#[test]
fn topology_keys_bound_the_scope() {
    // [zone, region] from d1: region r2 only, so c takes all of d's traffic.
    let svc = spilling(None).keys(&["topology.kubernetes.io/zone", "topology.kubernetes.io/region"]);
    let selection = decide(&with(svc, endpoints(false)), "d1");
    assert_eq!(chosen(&selection), addrs(&["10.0.3.1"]), "{}", selection.reason);
    assert!(selection.reason.contains("region r2"), "{}", selection.reason);
    // [hostname, zone]: the hostname key does not apply, with a note; scope is zone a only.
    let svc = spilling(None).keys(&["kubernetes.io/hostname", "topology.kubernetes.io/zone"]);
    let selection = decide(&with(svc, endpoints(false)), "a1");
    assert_eq!(chosen(&selection), addrs(&["10.0.1.1", "10.0.1.2"]));
    assert!(selection.warnings[0].starts_with("topology key kubernetes.io/hostname is not used"), "{selection:?}");
    // [hostname] alone gives no scope: the keys decide, with a warning.
    let svc = spilling(None).keys(&["kubernetes.io/hostname"]);
    let selection = decide(&with(svc, endpoints(false)), "a1");
    assert_eq!((selection.policy, chosen(&selection)), (PolicyKind::TopologyKeys, addrs(&["10.0.1.1"])));
    assert!(selection.warnings.iter().any(|w| w.contains("give this node no zone, region")), "{selection:?}");
    // A region scope without endpoints refuses, as the keys would.
    let svc = spilling(None).keys(&["topology.kubernetes.io/region"]);
    let selection = decide(&with(svc, vec![ep("10.0.1.1", "a1")]), "d1");
    assert!(selection.reject, "{}", selection.reason);
}

#[test]
fn it_replaces_preferences_and_yields_to_local() {
    let selection = decide(&with(spilling(None).distribution("PreferClose"), endpoints(false)), "d1");
    assert!(selection.reason.contains("instead of PreferClose"), "{}", selection.reason);
    let selection = decide(&with(spilling(None).distribution("PreferSameNode"), endpoints(false)), "a1");
    assert_eq!(selection.policy, PolicyKind::Spillover);
    assert!(selection.warnings[0].contains("PreferSameNode: the node preference is not kept"), "{selection:?}");
    let selection = decide(&with(spilling(None).mode("Auto"), endpoints(true)), "d1");
    assert!(selection.reason.contains("instead of topology-aware hints"), "{}", selection.reason);
    let selection = decide(&with(spilling(None).local(), endpoints(false)), "a1");
    assert_eq!(selection.policy, PolicyKind::Local);
    assert!(selection.warnings[0].contains("internalTrafficPolicy Local"), "{selection:?}");
}

#[test]
fn bad_annotations_are_named_and_never_turn_routing_off() {
    let selection = decide(&with(spilling(Some("lots")), endpoints(false)), "a1");
    assert_eq!(selection.policy, PolicyKind::Spillover);
    assert_eq!(
        selection.warnings,
        ["annotation topology-agent.io/max-overload \"lots\" ignored: not a number (write 0.1 or 10%); using 0.1"]
    );
    assert!(close(selection.spillover.unwrap().max_overload, 0.1));
    let mut svc = service("web");
    svc.agent_annotations.insert(ANNOTATION_SPILLOVER.into(), "capacty".into());
    let selection = decide(&with(svc, endpoints(false)), "a1");
    assert_eq!(selection.policy, PolicyKind::Default);
    assert!(selection.warnings[0].contains("\"capacty\" ignored"), "{selection:?}");
    let mut svc = service("web");
    svc.agent_annotations.insert(ANNOTATION_MAX_OVERLOAD.into(), "0.2".into());
    let selection = decide(&with(svc, endpoints(false)), "a1");
    assert!(selection.warnings[0].contains("has no effect without"), "{selection:?}");
    let mut svc = service("web");
    svc.agent_annotations.insert("topology-agent.io/dns".into(), "coredns".into());
    let selection = decide(&with(svc, endpoints(false)), "a1");
    assert_eq!(
        selection.warnings,
        ["annotation topology-agent.io/dns \"coredns\" ignored: the one value is \"upstream\""],
        "the DNS annotation's bad value is named, and routing is untouched"
    );
    assert_eq!(selection.policy, PolicyKind::Default);
    assert_eq!(parse_max_overload(" 5 % "), Ok(0.05));
    assert!(parse_max_overload("-0.1").is_err() && parse_max_overload("11").is_err());
    assert!(parse_max_overload("NaN").is_err());
}

#[test]
fn without_a_zone_or_demand_every_endpoint_counts_equally() {
    let selection = decide(&with(spilling(None), endpoints(false)), "nz");
    assert_eq!(chosen(&selection), addrs(&["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.3.1"]));
    assert!(selection.reason.contains("node nz has no zone label"), "{}", selection.reason);
    let mut state = with(spilling(None), endpoints(false));
    let names: Vec<String> = state.nodes().map(|n| n.name.clone()).collect();
    for name in names {
        let mut node = state.node(&name).unwrap().clone();
        node.ready = false;
        state.upsert_node(node);
    }
    let selection = decide(&state, "a1");
    assert!(selection.reason.contains("no Ready node with allocatable CPU"), "{}", selection.reason);
    assert_eq!(selection.backends.len(), 4);
}

/// A random cluster: zones with a region, nodes with CPU (some not Ready), endpoints per zone.
#[derive(Clone, Debug)]
struct Layout {
    zones: Vec<ZoneLayout>,
    max_overload: f64,
}

#[derive(Clone, Debug)]
struct ZoneLayout {
    region: u8,
    /// CPUs and Ready, per node.
    nodes: Vec<(u32, bool)>,
    endpoints: usize,
}

fn arb_layout() -> impl Strategy<Value = Layout> {
    let zone = (0u8..2, prop::collection::vec((1u32..8, prop::bool::weighted(0.9)), 1..4), 0usize..6)
        .prop_map(|(region, nodes, endpoints)| ZoneLayout { region, nodes, endpoints });
    (prop::collection::vec(zone, 2..5), prop::sample::select(vec![0.0, 0.05, 0.1, 0.5]))
        .prop_map(|(zones, max_overload)| Layout { zones, max_overload })
}

fn build(layout: &Layout) -> ClusterState {
    let mut state = ClusterState::default();
    let mut eps = Vec::new();
    for (z, zone) in layout.zones.iter().enumerate() {
        for (n, (cpus, ready)) in zone.nodes.iter().enumerate() {
            let mut node = node(&format!("z{z}n{n}"), &format!("z{z}"), &format!("r{}", zone.region));
            node.allocatable_cpu_millis = u64::from(*cpus) * 1000;
            node.ready = *ready;
            state.upsert_node(node);
        }
        for e in 0..zone.endpoints {
            eps.push(ep(&format!("10.0.{z}.{}", e + 1), &format!("z{z}n0")));
        }
    }
    let mut svc = spilling(Some(&layout.max_overload.to_string()));
    svc.key.name = "web".into();
    state.upsert_service(svc);
    state.upsert_slice(slice("web-1", "web", 8080, eps));
    state
}

/// A zone scaling from 0 to 30 pods while zones b and c keep 10 each (equal demand everywhere):
/// at no step does any pod — the first local one above all — get more than (1 + ε) of its fair
/// share of the cluster's traffic (cilium#46633 sent a zone's whole traffic to its first pod).
#[test]
fn a_zone_scaling_from_zero_never_overloads_its_first_pods() {
    let zone = |endpoints: usize| ZoneLayout { region: 0, nodes: vec![(4, true)], endpoints };
    for local in 0..=30 {
        let layout = Layout { zones: vec![zone(local), zone(10), zone(10)], max_overload: 0.1 };
        let state = build(&layout);
        let fair = 1.0 / (local + 20) as f64;
        let mut load: BTreeMap<String, f64> = BTreeMap::new();
        for z in 0..3 {
            for (address, weight) in shares(&decide(&state, &format!("z{z}n0"))) {
                *load.entry(address).or_default() += weight / 3.0;
            }
        }
        let (most, heaviest) =
            load.iter().map(|(a, l)| (*l, a.clone())).fold((0.0, String::new()), |m, x| if x.0 > m.0 { x } else { m });
        assert!(most <= fair * 1.1 + 1e-9, "{local} local pods: {heaviest} gets {most:.4}, fair {fair:.4}");
        if local > 0 {
            // The local pods keep what they can: their zone's third of the traffic up to their bound.
            let shares = shares(&decide(&state, "z0n0"));
            let kept: f64 = shares.iter().filter(|(a, _)| a.starts_with("10.0.0.")).map(|(_, w)| w).sum();
            let expected = (local as f64 * fair * 1.1 * 3.0).min(1.0);
            assert!((kept - expected).abs() < 1e-6, "{local} local pods keep {kept:.4}, expected {expected:.4}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every zone's nodes take their row of the one global plan; weighting each row by the zone's
    /// demand gives every endpoint at most (1 + ε) of its fair share, and keeps exactly the bound.
    #[test]
    fn the_nodes_loads_add_up_to_the_plan(layout in arb_layout()) {
        let state = build(&layout);
        let total_endpoints: usize = layout.zones.iter().map(|z| z.endpoints).sum();
        prop_assume!(total_endpoints > 0);
        let demand: BTreeMap<String, f64> =
            state.demand().zones().map(|(zone, d)| (zone.to_owned(), d.cpu_millis as f64)).collect();
        let total_demand: f64 = demand.values().sum();
        prop_assume!(total_demand > 0.0);
        let mut load: BTreeMap<String, f64> = BTreeMap::new();
        let mut in_zone = 0.0;
        let mut bound = None;
        for (zone, cpu) in &demand {
            let selection = decide(&state, &format!("{zone}n0"));
            prop_assert_eq!(selection.policy, PolicyKind::Spillover);
            let share = cpu / total_demand;
            for (address, weight) in shares(&selection) {
                *load.entry(address.clone()).or_default() += share * weight;
                if address.starts_with(&format!("10.0.{}.", &zone[1..])) {
                    in_zone += share * weight;
                }
            }
            let report = selection.spillover.unwrap();
            prop_assert!(bound.is_none_or(|b: f64| close(b, report.bound)), "every node sees the same plan");
            bound = Some(report.bound);
        }
        let fair = 1.0 / total_endpoints as f64;
        for (address, l) in &load {
            prop_assert!(*l <= fair * (1.0 + layout.max_overload) + 1e-9, "{} gets {} of fair {}", address, l, fair);
        }
        prop_assert!((load.values().sum::<f64>() - 1.0).abs() < 1e-9, "all traffic lands: {:?}", load);
        prop_assert!(close(in_zone, bound.unwrap()), "in zone {} vs bound {:?}", in_zone, bound);
    }
}
