//! The kernel check of capacity spillover: the weights the policy computes for one node, programmed
//! into the real datapath, divide 100,000 connections within ±2 points of each weight.
//! Run single-threaded (`--test-threads=1`) with the other root tests.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::net::{IpAddr, SocketAddr};

use topology_dataplane::Dataplane;
use topology_kube::objects::{self, EndpointSpec};
use topology_model::yaml;
use topology_policy::{
    plan::weights::desired_state,
    policy::{self, PolicyKind},
};
use topology_tests::{
    fixture::{BACKEND_PORT, Fixture},
    require_root,
};

const CONNECTIONS: u64 = 100_000;

#[test]
fn spillover_weights_hold_over_100000_connects() {
    require_root!();
    // This node's zone a (region r1) has 8 of 12 CPUs and 1 of 5 endpoints; b (r1) and c (r2)
    // have 2 CPUs and 2 endpoints each. With ε = 0.1, a keeps 1.1/5 of all traffic, fills b (its
    // region) to capacity, and sends the rest to c: three different per-endpoint weights.
    let fx = Fixture::new(5);
    let zones = ["a", "b", "b", "c", "c"];
    let nodes = vec![
        objects::node("node-a", "a", Some("r1"), "8"),
        objects::node("node-b", "b", Some("r1"), "2"),
        objects::node("node-c", "c", Some("r2"), "2"),
    ];
    let endpoints: Vec<EndpointSpec> = fx
        .backends
        .iter()
        .zip(zones)
        .map(|(backend, zone)| EndpointSpec::new(backend.addr(false), &format!("node-{zone}")))
        .collect();
    let vip: IpAddr = "10.96.0.40".parse().unwrap();
    let mut service = objects::service("default", "web", vip, 80, "TCP", "http");
    objects::annotate(&mut service, "topology-agent.io/spillover", "capacity");
    objects::annotate(&mut service, "topology-agent.io/max-overload", "10%");
    let slice = objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &endpoints);
    let path = fx.scratch().join("cluster.yaml");
    objects::write(&path, &[nodes, vec![service, slice]].concat());

    let state = yaml::load(&path).expect("cluster file");
    let selections = policy::compute(&state, "node-a").expect("policy");
    let selection = &selections[0].selection;
    assert_eq!(selection.policy, PolicyKind::Spillover, "{}", selection.reason);
    let total: f64 = selection.backends.iter().map(|b| b.weight).sum();
    let weight =
        |address: IpAddr| selection.backends.iter().find(|b| b.address == address).map_or(0.0, |b| b.weight / total);
    // The plan, worked out by hand: demand a 2/3, capacity per zone 1.1/5 per endpoint.
    let (demand_a, per_endpoint) = (8.0 / 12.0, 1.1 / 5.0);
    let to_b = 2.0 * per_endpoint - 2.0 / 12.0;
    let to_c = demand_a - per_endpoint - to_b;
    let (b, c) = (to_b / 2.0 / demand_a, to_c / 2.0 / demand_a);
    let expected = [per_endpoint / demand_a, b, b, c, c];
    for (backend, want) in fx.backends.iter().zip(expected) {
        assert!((weight(backend.addr(false)) - want).abs() < 1e-6, "{}: {}", backend.name, selection.reason);
    }

    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let report = dp.apply(&desired_state(&selections));
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let result = fx.place().tcp(SocketAddr::new(vip, 80), CONNECTIONS);
    assert_eq!(result.failures(), 0, "{result:?}");
    for backend in &fx.backends {
        let share = result.landed_on(&backend.name) as f64 / CONNECTIONS as f64;
        let want = weight(backend.addr(false));
        assert!((share - want).abs() <= 0.02, "{}: share {share:.4}, weight {want:.4}", backend.name);
        eprintln!("{}: weight {want:.4}, share {share:.4}", backend.name);
    }
}
