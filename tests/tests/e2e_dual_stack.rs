//! A dual-stack cluster end to end on the real control plane (root, real kernel): the API server
//! allocates ClusterIPs from an IPv4 and an IPv6 range, every pod has an address of each family,
//! and the real EndpointSlice controller writes one slice per family, each hinted on its own.
//! Three nodes in two zones, the agent deployed from `deploy/` on each: a `RequireDualStack`
//! Service with `trafficDistribution: PreferClose` lands, through either ClusterIP, on the pods
//! its family's slice hints for the client's zone; an IPv6-only Service with
//! `internalTrafficPolicy: Local` lands on the node's own pod; and each agent's `explain` names
//! both ClusterIPs. `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde_json::json;
use topology_tests::{
    kubernetes::{
        Binaries, Cluster, eventually,
        nodes::NodeSpec,
        observe::Endpoint,
        pods::{PodSpec, echo_service},
    },
    require_root,
};

const NS: &str = "dual";
const CONNECTIONS: u64 = 100;

/// The ClusterIPs the API server gave `service`, in its order (the primary family first).
fn cluster_ips(service: &serde_json::Value) -> Vec<IpAddr> {
    service["spec"]["clusterIPs"]
        .as_array()
        .map(|ips| ips.iter().filter_map(|ip| ip.as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// The endpoints of `service`'s slices of `ip`'s family, once every pod is ready in them (and
/// hinted, if `hinted`).
fn slices_of(cluster: &Cluster, service: &str, ipv6: bool, pods: usize, hinted: bool) -> Vec<Endpoint> {
    eventually(&format!("{service}'s IPv{} slice", if ipv6 { 6 } else { 4 }), Duration::from_secs(60), || {
        let endpoints: Vec<Endpoint> =
            cluster.endpoints(NS, service).into_iter().filter(|e| e.address.is_ipv6() == ipv6).collect();
        let ready = endpoints.iter().filter(|e| e.ready && (!hinted || e.for_zones.is_some())).count();
        match ready == pods {
            true => Ok(endpoints),
            false => Err(format!("{endpoints:?}")),
        }
    })
}

#[test]
fn both_families_land_where_their_own_slices_say() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let nodes =
        [NodeSpec::new("node-a1", "zone-a"), NodeSpec::new("node-a2", "zone-a"), NodeSpec::new("node-b1", "zone-b")];
    let cluster = Cluster::start(binaries, &nodes);
    cluster.deploy();
    cluster.namespace(NS);
    let dual = cluster.apply(&echo_service(
        NS,
        "dual",
        &json!({"spec": {"ipFamilyPolicy": "RequireDualStack", "ipFamilies": ["IPv4", "IPv6"],
                         "trafficDistribution": "PreferClose"}}),
    ));
    let v6_only = cluster.apply(&echo_service(
        NS,
        "v6-local",
        &json!({"spec": {"ipFamilyPolicy": "SingleStack", "ipFamilies": ["IPv6"], "internalTrafficPolicy": "Local"}}),
    ));
    let dual_ips = cluster_ips(&dual);
    assert!(dual_ips.len() == 2 && dual_ips[0].is_ipv4() && dual_ips[1].is_ipv6(), "{dual}");
    let v6_ip = cluster_ips(&v6_only);
    assert!(v6_ip.len() == 1 && v6_ip[0].is_ipv6(), "{v6_only}");

    let pods: Vec<_> = nodes
        .iter()
        .map(|node| {
            cluster.run_pod(&node.name, PodSpec::new(NS, &format!("echo-{}", &node.name[5..]), "echo", &[8080]))
        })
        .collect();
    let pod_of: BTreeMap<IpAddr, String> = pods
        .iter()
        .flat_map(|pod| [(IpAddr::V4(pod.ip), pod.spec.name.clone()), (IpAddr::V6(pod.ip6), pod.spec.name.clone())])
        .collect();
    // The controller's slices, one per family, each hinted.
    let slices = [false, true].map(|ipv6| slices_of(&cluster, "dual", ipv6, pods.len(), true));
    for (family, endpoints) in ["IPv4", "IPv6"].iter().zip(&slices) {
        assert!(
            endpoints.iter().all(|e| pod_of.contains_key(&e.address)),
            "the {family} slice holds the pods' {family} addresses: {endpoints:?}"
        );
    }
    let _ = slices_of(&cluster, "v6-local", true, pods.len(), false);

    let agents: Vec<_> = nodes.iter().map(|node| cluster.start_agent(&node.name, &[])).collect();
    let mut table = Vec::new();
    for (node, agent) in nodes.iter().zip(&agents) {
        let client = cluster.client_on(&node.name);
        let plan = agent.explain(&format!("{NS}/dual"));
        let explained: BTreeSet<IpAddr> = plan["services"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|port| port["clusterIPs"].as_array().cloned().unwrap_or_default())
            .filter_map(|ip| ip.as_str()?.parse().ok())
            .collect();
        assert_eq!(explained, dual_ips.iter().copied().collect(), "explain on {}: {plan}", node.name);
        for (cluster_ip, endpoints) in dual_ips.iter().zip(&slices) {
            // This zone's pods, as this family's slice hints them.
            let want: BTreeSet<&str> = endpoints
                .iter()
                .filter(|e| e.for_zones.as_ref().is_some_and(|zones| zones.contains(&node.zone)))
                .map(|e| pod_of[&e.address].as_str())
                .collect();
            assert!(!want.is_empty(), "the {cluster_ip} slice hints something for {}", node.zone);
            let target = SocketAddr::new(*cluster_ip, 80);
            let report = eventually(&format!("{target} from {}", node.name), Duration::from_secs(30), || {
                let report = client.place.tcp(target, CONNECTIONS);
                let reached: BTreeSet<&str> = report.landed.keys().map(String::as_str).collect();
                match report.failures() == 0 && reached == want {
                    true => Ok(report),
                    false => Err(format!("{report:?}, want {want:?}")),
                }
            });
            assert_eq!(report.peer_mismatch, 0, "the socket's peer is the ClusterIP it asked for: {report:?}");
            table.push(format!("{:<26} {:<8} {}", target, node.name, want.into_iter().collect::<Vec<_>>().join(",")));
        }
        // IPv6 alone, internal traffic policy Local: the node's own pod, over IPv6.
        let own = format!("echo-{}", &node.name[5..]);
        let target = SocketAddr::new(v6_ip[0], 80);
        let report = eventually(&format!("{target} from {}", node.name), Duration::from_secs(30), || {
            let report = client.place.tcp(target, CONNECTIONS);
            match report.failures() == 0 && report.landed.keys().eq([&own]) {
                true => Ok(report),
                false => Err(format!("{report:?}, want {own}")),
            }
        });
        assert_eq!(report.landed[&own], CONNECTIONS);
        table.push(format!("{:<26} {:<8} {own}", target, node.name));
    }
    eprintln!("dual-stack, where each ClusterIP's connections landed:\n{}", table.join("\n"));
}
