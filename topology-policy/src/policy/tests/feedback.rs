//! Feedback: the static plan without a measurement, and the controller's shift, ejections and
//! panic applied to it.

use std::collections::BTreeMap;

use topology_model::{ClusterState, Family, ObjectKey};

use super::world::*;
use crate::{
    feedback::{Inputs, PortInput, PortKey},
    policy::{self, PolicyKind, Selection, spillover::ANNOTATION_SPILLOVER},
};

// In `world()` from a1: zone a has half the demand and half the endpoints (10.0.1.1, 10.0.1.2),
// so the capacity plan keeps everything in zone; b (10.0.2.1) shares a's region, c (10.0.3.1)
// does not.

fn state(mode: &str) -> ClusterState {
    let mut svc = service("web");
    svc.agent_annotations.insert(ANNOTATION_SPILLOVER.into(), mode.into());
    with(svc, endpoints(false))
}

fn decide_with(input: Option<PortInput>) -> Selection {
    let state = state("feedback");
    let this = state.node("a1").unwrap();
    let svc = state.service(&ObjectKey::new("ns", "web")).unwrap();
    let mut inputs = Inputs::new();
    if let Some(input) = input {
        inputs.insert(PortKey { service: svc.key.clone(), port: 80, family: Family::V4 }, input);
    }
    let mut selections = policy::compute_service_with(&state, this, svc, &inputs);
    assert_eq!(selections.len(), 1);
    selections.remove(0).selection
}

fn shares(selection: &Selection) -> BTreeMap<String, f64> {
    let total: f64 = selection.backends.iter().map(|b| b.weight).sum();
    selection.backends.iter().map(|b| (b.address.to_string(), b.weight / total)).collect()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn without_a_measurement_the_capacity_plan_stands() {
    let capacity = decide(&state("capacity"), "a1");
    let feedback = decide_with(None);
    assert_eq!(feedback.policy, PolicyKind::Feedback);
    assert_eq!(shares(&feedback), shares(&capacity));
    assert!(feedback.reason.starts_with("feedback: no measurement yet; static plan: spillover"), "{}", feedback.reason);
    let report = feedback.feedback.as_ref().unwrap();
    assert_eq!(report.near.iter().map(|a| a.to_string()).collect::<Vec<_>>(), ["10.0.1.1:8080", "10.0.1.2:8080"]);
    assert_eq!(report.far.len(), 2);
    assert!(report.input.is_none());
    assert!(decide(&state("capacity"), "a1").feedback.is_none(), "capacity alone reports no feedback");
}

#[test]
fn a_shift_moves_that_share_to_this_region_first() {
    let input = PortInput { shift: 0.4, reason: "zone at 3.0×".into(), ..Default::default() };
    let selection = decide_with(Some(input));
    let shares = shares(&selection);
    assert!(close(shares["10.0.1.1"], 0.3) && close(shares["10.0.1.2"], 0.3), "{shares:?}");
    assert!(close(shares["10.0.2.1"], 0.4), "b shares the region: {shares:?}");
    assert!(!shares.contains_key("10.0.3.1"), "{shares:?}");
    assert!(selection.reason.starts_with("feedback: zone at 3.0×; static plan: spillover"), "{}", selection.reason);
}

#[test]
fn a_limit_holds_this_regions_other_zones_in_reserve_for_the_connect_hook() {
    let plain = decide_with(Some(PortInput { reason: "zone at 1.0×".into(), ..Default::default() }));
    assert_eq!(chosen(&plain), addrs(&["10.0.1.1", "10.0.1.2"]), "no limit, no reserve");
    let input = PortInput { spill_at: 4, reason: "zone at 1.0×".into(), ..Default::default() };
    let state = state("feedback");
    let svc = state.service(&ObjectKey::new("ns", "web")).unwrap();
    let key = PortKey { service: svc.key.clone(), port: 80, family: Family::V4 };
    let inputs: Inputs = [(key, input)].into_iter().collect();
    let selected = policy::compute_service_with(&state, state.node("a1").unwrap(), svc, &inputs);
    let selection = &selected[0].selection;
    assert_eq!(chosen(selection), addrs(&["10.0.1.1", "10.0.1.2", "10.0.2.1"]), "b shares the region; c does not");
    let shares = shares(selection);
    assert!(close(shares["10.0.1.1"], 0.5) && shares["10.0.2.1"] < 1e-8, "{shares:?}");
    assert!(selection.reason.contains("1 other-zone endpoints held in reserve"), "{}", selection.reason);
    assert_eq!(selected[0].options.spill_at, 4, "the kernel gets the limit");
    let kernel = crate::plan::weights::integer_weights(&selected[0]);
    let weights: Vec<u32> = kernel.iter().map(|b| b.weight).collect();
    assert_eq!(weights, [1_000_000, 1_000_000, 1], "the least weight the kernel holds");
}

#[test]
fn ejected_backends_are_left_out_and_a_plan_with_none_left_uses_the_rest() {
    let one = PortInput { ejected: vec!["10.0.1.1:8080".parse().unwrap()], ..Default::default() };
    assert_eq!(chosen(&decide_with(Some(one))), addrs(&["10.0.1.2"]));
    let both = PortInput {
        ejected: vec!["10.0.1.1:8080".parse().unwrap(), "10.0.1.2:8080".parse().unwrap()],
        shift: 0.5,
        ..Default::default()
    };
    let selection = decide_with(Some(both));
    assert_eq!(chosen(&selection), addrs(&["10.0.2.1", "10.0.3.1"]), "{}", selection.reason);
    assert!(selection.reason.contains("every backend of the static plan ejected"), "{}", selection.reason);
}

#[test]
fn panic_uses_every_endpoint_equally() {
    let input = PortInput { panic: true, reason: "panic: 3 of 4 endpoints failing".into(), ..Default::default() };
    let selection = decide_with(Some(input));
    assert_eq!(chosen(&selection), addrs(&["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.3.1"]));
    assert!(shares(&selection).values().all(|s| close(*s, 0.25)));
    assert!(selection.reason.starts_with("feedback: panic"), "{}", selection.reason);
}

#[test]
fn an_unknown_mode_names_both_modes() {
    let selection = decide(&state("latency"), "a1");
    assert_eq!(selection.policy, PolicyKind::Default);
    assert!(
        selection.warnings.iter().any(|w| w.contains("the modes are \"capacity\" and \"feedback\"")),
        "{:?}",
        selection.warnings
    );
}
