//! Properties over random clusters: results are usable endpoints, only hard modes refuse, and
//! input order does not matter.

use proptest::prelude::*;
use topology_model::{Endpoint, Service};

use super::world::*;
use crate::policy::{
    PolicyKind, Selection,
    keys::TopologyKey,
    spillover::{ANNOTATION_MAX_OVERLOAD, ANNOTATION_SPILLOVER},
};

const NODES: [&str; 8] = ["a1", "a2", "a3", "b1", "c1", "d1", "nz", "empty-zone"];
const KEYS: [&str; 3] = ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "topology.kubernetes.io/region"];

fn arb_endpoint() -> impl Strategy<Value = Endpoint> {
    (0u8..10, 0usize..NODES.len() + 2, 0u8..4, proptest::option::of(0usize..5), proptest::bool::ANY).prop_map(
        |(last, node, condition, hint_zone, hint_node)| {
            // Node indexes past the list: an unknown node, or no nodeName at all.
            let node_name = NODES.get(node).copied().unwrap_or(if node == NODES.len() { "ghost" } else { "" });
            let mut e = ep(&format!("10.0.0.{last}"), node_name);
            match condition {
                0 => e = e.unready(),
                1 => e = e.terminating(),
                _ => {}
            }
            if let Some(zone) = hint_zone {
                e = e.for_zones(&[["a", "b", "c", "d", "x"][zone]]);
            }
            if hint_node && !node_name.is_empty() {
                e = e.for_nodes(&[node_name]);
            }
            e
        },
    )
}

fn arb_service() -> impl Strategy<Value = Service> {
    (
        prop::bool::weighted(0.15),
        proptest::option::of((proptest::sample::subsequence(KEYS.to_vec(), 1..=3), prop::bool::ANY)),
        proptest::option::of(prop::sample::select(vec!["Auto", "disabled"])),
        proptest::option::of(prop::sample::select(vec!["PreferClose", "PreferSameZone", "PreferSameNode", "Bogus"])),
        proptest::option::of(prop::sample::select(vec!["0", "0.1", "25%", "bogus"])),
    )
        .prop_map(|(local, keys, mode, distribution, spillover)| {
            let mut svc = service("web");
            if local {
                svc = svc.local();
            }
            if let Some((mut keys, star)) = keys {
                if star {
                    keys.push("*");
                }
                svc = svc.keys(&keys);
            }
            if let Some(mode) = mode {
                svc = svc.mode(mode);
            }
            if let Some(distribution) = distribution {
                svc = svc.distribution(distribution);
            }
            if let Some(max_overload) = spillover {
                svc.agent_annotations.insert(ANNOTATION_SPILLOVER.into(), "capacity".into());
                svc.agent_annotations.insert(ANNOTATION_MAX_OVERLOAD.into(), max_overload.into());
            }
            svc
        })
}

/// True when the mode may refuse although usable endpoints exist.
fn hard(service: &Service, selection: &Selection) -> bool {
    match selection.policy {
        PolicyKind::Local => true,
        PolicyKind::TopologyKeys | PolicyKind::Spillover => {
            let keys = service.topology_keys.as_ref().map(|spec| crate::policy::keys::parse_spec(spec).unwrap());
            // Spillover without keys is cluster-wide; with keys, only "*" makes it so.
            let cluster_wide = keys
                .as_ref()
                .map_or(selection.policy == PolicyKind::Spillover, |keys| keys.last() == Some(&TopologyKey::Any));
            !cluster_wide
        }
        _ => false,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn results_are_usable_endpoints_and_only_hard_modes_refuse(
        svc in arb_service(),
        endpoints in prop::collection::vec(arb_endpoint(), 0..12),
        node in prop::sample::select(NODES.to_vec()),
    ) {
        let state = with(svc.clone(), endpoints.clone());
        let selection = decide(&state, node);
        let any_ready = endpoints.iter().any(|e| e.ready);
        let usable = |e: &Endpoint| if any_ready { e.ready } else { !e.ready && e.serving && e.terminating };
        for backend in &selection.backends {
            let listed: Vec<&Endpoint> = endpoints.iter().filter(|e| e.address == backend.address).collect();
            prop_assert!(!listed.is_empty(), "{} is not an endpoint", backend.address);
            if selection.policy == PolicyKind::Local {
                prop_assert!(listed.iter().any(|e| e.ready || (e.serving && e.terminating)));
                prop_assert_eq!(backend.node.as_deref(), Some(node));
            } else {
                prop_assert!(listed.iter().any(|e| usable(e)), "{} is not usable: {}", backend.address, selection.reason);
            }
        }
        let has_usable = endpoints.iter().any(usable);
        if has_usable && !hard(&svc, &selection) {
            prop_assert!(!selection.reject, "{:?} refused with usable endpoints: {}", selection.policy, selection.reason);
        }
        prop_assert_eq!(selection.reject, selection.backends.is_empty());
    }

    #[test]
    fn the_result_does_not_depend_on_input_order(
        svc in arb_service(),
        endpoints in prop::collection::vec(arb_endpoint(), 0..12),
        node in prop::sample::select(NODES.to_vec()),
        split in 0usize..12,
    ) {
        let reference = decide(&with(svc.clone(), endpoints.clone()), node);

        let mut reversed = endpoints.clone();
        reversed.reverse();
        prop_assert_eq!(&decide(&with(svc.clone(), reversed), node), &reference);

        // The same endpoints spread over two slices, second half first.
        let split = split.min(endpoints.len());
        let mut state = with(svc.clone(), endpoints[split..].to_vec());
        state.upsert_slice(slice("web-0", "web", 8080, endpoints[..split].to_vec()));
        prop_assert_eq!(&decide(&state, node), &reference);
    }
}
