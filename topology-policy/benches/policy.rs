//! Policy speed: the full decision for one node over 10,000 Services x 10 endpoints (target
//! < 200 ms) and for one Service (target < 50 us), with the mix of modes and with every Service
//! under capacity spillover. `cargo xtask bench policy`.

use std::{collections::BTreeMap, hint::black_box, net::IpAddr};

use criterion::{Criterion, criterion_group, criterion_main};
use topology_model::{
    ClusterState, Endpoint, EndpointExtra, EndpointSlice, Family, Node, ObjectKey, PortSpec, Protocol, Service,
    SlicePort, TopologyKeysSource, TopologyKeysSpec, TrafficDistribution,
};
use topology_policy::{plan::NodePlan, policy};

const NODES: usize = 60;
const ZONES: usize = 3;

/// 60 nodes in 3 zones; `services` Services with 10 endpoints each, hinted like the EndpointSlice
/// controller does for PreferClose, and a mix of every mode (all spillover when `spill`).
fn cluster(services: usize, spill: bool) -> ClusterState {
    let mut state = ClusterState::default();
    for n in 0..NODES {
        let labels = BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), format!("node-{n}")),
            ("topology.kubernetes.io/zone".to_owned(), format!("zone-{}", n % ZONES)),
            ("topology.kubernetes.io/region".to_owned(), "region-0".to_owned()),
        ]);
        state.upsert_node(Node {
            name: format!("node-{n}"),
            labels: labels.into(),
            allocatable_cpu_millis: 8000,
            ready: true,
            pod_cidrs: Vec::new(),
            addresses: Vec::new(),
        });
    }
    for s in 0..services {
        let key = ObjectKey::new("bench", format!("svc-{s}"));
        let (traffic_distribution, topology_keys, topology_mode, internal_traffic_local) = match s % 5 {
            0 => (Some(TrafficDistribution::PreferClose), None, None, false),
            1 => (None, Some(keys(&["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"])), None, false),
            2 => (None, None, Some("Auto".to_owned()), false),
            3 => (Some(TrafficDistribution::PreferSameNode), None, None, false),
            _ => (None, None, None, s % 10 == 4),
        };
        state.upsert_service(Service {
            key: key.clone(),
            cluster_ips: vec![IpAddr::from([10, 96, (s >> 8) as u8, s as u8])],
            headless: false,
            ports: vec![PortSpec { name: "http".into(), port: 80, protocol: Protocol::Tcp }],
            internal_traffic_local,
            session_affinity_timeout_s: None,
            traffic_distribution,
            topology_keys,
            topology_mode,
            agent_annotations: if spill {
                BTreeMap::from([("topology-agent.io/spillover".to_owned(), "capacity".to_owned())])
            } else {
                BTreeMap::new()
            },
            external_name: None,
            other_proxy: None,
        });
        let endpoints = (0..10)
            .map(|e| {
                let node = (s * 7 + e * 13) % NODES;
                let zone = format!("zone-{}", node % ZONES);
                Endpoint {
                    address: IpAddr::from([10, (s >> 8) as u8 + 100, s as u8, e as u8]),
                    ready: true,
                    serving: true,
                    terminating: false,
                    node_name: Some(format!("node-{node}").into()),
                    zone: Some(zone.as_str().into()),
                    extra: EndpointExtra::new(Box::new([zone]), Box::new([format!("node-{node}")]), None),
                }
            })
            .collect();
        state.upsert_slice(EndpointSlice {
            key: ObjectKey::new("bench", format!("svc-{s}-abcde")),
            service: Some(key),
            family: Family::V4,
            ports: vec![SlicePort { name: "http".into(), port: 8080, protocol: Protocol::Tcp }],
            endpoints,
            changed_at: None,
        });
    }
    state
}

fn keys(keys: &[&str]) -> TopologyKeysSpec {
    TopologyKeysSpec::new(TopologyKeysSource::Annotation, keys.iter().copied())
}

fn bench(c: &mut Criterion) {
    let mixed = cluster(10_000, false);
    let spilling = cluster(10_000, true);
    let mut group = c.benchmark_group("policy");
    group.sample_size(20);
    for (name, state) in [("mixed modes", &mixed), ("all spillover", &spilling)] {
        group.bench_function(format!("10k services x 10 endpoints, one node, {name} (the whole node plan)"), |b| {
            b.iter(|| black_box(NodePlan::build(black_box(state), "node-1", None).expect("node exists")))
        });
    }
    group.finish();
    for (name, state) in [("PreferClose", &mixed), ("spillover", &spilling)] {
        let this = state.node("node-1").expect("node-1");
        let one = state.service(&ObjectKey::new("bench", "svc-0")).expect("svc-0");
        c.bench_function(&format!("policy/one service (10 endpoints, {name})"), |b| {
            b.iter(|| black_box(policy::compute_service(black_box(state), this, one)))
        });
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
