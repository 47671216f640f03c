//! Pods living and dying on the real control plane (root, real kernel): a rolling update made of
//! Pod objects (a new pod Ready, the old one deleted gracefully — terminating, still serving —
//! then gone) under load; a zone losing its pod and getting it back; a Service whose every pod is
//! terminating. The real EndpointSlice controller reports each step; the agents follow it.
//! `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde_json::json;
use topology_tests::{
    kubernetes::{
        Binaries, Cluster, eventually,
        load::{Load, total},
        nodes::NodeSpec,
        observe::{kernel_backends, kernel_status},
        pods::{Pod, PodSpec},
    },
    require_root,
};

const NS: &str = "life";

fn nodes() -> [NodeSpec; 3] {
    [NodeSpec::new("node-a1", "zone-a"), NodeSpec::new("node-b1", "zone-b"), NodeSpec::new("node-c1", "zone-c")]
}

/// A cluster with the agent on every node, and a PreferClose Service `name` selecting `app`.
fn start(name: &str, app: &str) -> (Cluster, IpAddr) {
    let binaries = Binaries::locate().expect("checked by the caller");
    let cluster = Cluster::start(binaries, &nodes());
    cluster.deploy();
    cluster.namespace(NS);
    let service = cluster.apply(&json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"app": app}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                 "trafficDistribution": "PreferClose"},
    }));
    let ip = service["spec"]["clusterIP"].as_str().and_then(|ip| ip.parse().ok()).expect("a ClusterIP");
    (cluster, ip)
}

/// Waits until every node's kernel holds exactly what `wanted` says of it for `service`.
fn wait_kernels(cluster: &Cluster, service: &str, what: &str, wanted: impl Fn(&str, &BTreeSet<IpAddr>) -> bool) {
    eventually(what, Duration::from_secs(30), || {
        for node in cluster.nodes() {
            let held = kernel_backends(&kernel_status(node.pins()), &format!("{NS}/{service}:"));
            if !wanted(&node.spec.name, &held) {
                return Err(format!("{}'s kernel holds {held:?}", node.spec.name));
            }
        }
        Ok(())
    });
}

#[test]
fn a_rolling_update_of_pod_objects_loses_no_connection_and_keeps_every_zone_home() {
    require_root!();
    if Binaries::or_skip(module_path!()).is_none() {
        return;
    }
    let (cluster, ip) = start("web", "web");
    let pod = |node: &NodeSpec, version: u32| {
        PodSpec::new(NS, &format!("web-v{version}-{}", &node.name[5..]), "web", &[8080])
    };
    let mut old: Vec<Pod> = nodes().iter().map(|node| cluster.run_pod(&node.name, pod(node, 1))).collect();
    let _agents: Vec<_> = nodes().iter().map(|node| cluster.start_agent(&node.name, &[])).collect();
    wait_kernels(&cluster, "web", "v1 programmed", |_, held| held.len() == 1);
    let clients: Vec<_> = nodes().iter().map(|node| cluster.client_on(&node.name)).collect();
    let loads: Vec<Load> = clients
        .iter()
        .map(|client| Load::start(client.place.clone(), SocketAddr::new(ip, 80), Duration::from_secs(120)))
        .collect();

    // One node at a time, as a Deployment's rollout does with maxSurge 1: the new pod Ready, the
    // old one deleted gracefully (terminating while it still serves), gone once no kernel holds it.
    let mut new = Vec::new();
    for node in nodes() {
        let replacement = cluster.run_pod(&node.name, pod(&node, 2));
        let retiring = old.remove(0);
        let retiring_ip = IpAddr::V4(retiring.ip);
        cluster.delete_pod(&retiring);
        eventually("the slice says it is terminating", Duration::from_secs(30), || {
            let endpoints = cluster.endpoints(NS, "web");
            match endpoints.iter().find(|e| e.address == retiring_ip) {
                Some(e) if e.terminating && e.serving && !e.ready => Ok(()),
                other => Err(format!("{other:?}")),
            }
        });
        wait_kernels(&cluster, "web", "the retiring pod out of every kernel", |_, held| {
            !held.contains(&retiring_ip) && !held.is_empty()
        });
        cluster.remove_pod(retiring);
        new.push(replacement);
    }
    std::thread::sleep(Duration::from_secs(1));
    for ((node, load), client) in nodes().iter().zip(loads).zip(&clients) {
        let batches = load.stop();
        let all = total(&batches);
        assert_eq!(all.failures(), 0, "from {}: {all:?}", node.name);
        let zone = &node.zone[5..];
        assert!(
            all.landed.keys().all(|pod| pod.ends_with(&format!("-{zone}1"))),
            "{} left its zone during the rollout: {all:?}",
            node.name
        );
        let after = client.place.tcp(SocketAddr::new(ip, 80), 50);
        assert_eq!(after.landed_on(&format!("web-v2-{zone}1")), 50, "from {}: {after:?}", node.name);
        eprintln!("{}: {} connections during the rollout, 0 failed, all in {}", node.name, all.attempts, node.zone);
    }
}

#[test]
fn a_zone_losing_its_pod_goes_elsewhere_and_comes_home_when_it_is_back() {
    require_root!();
    if Binaries::or_skip(module_path!()).is_none() {
        return;
    }
    let (cluster, ip) = start("api", "api");
    let spec = |node: &NodeSpec, n: u32| PodSpec::new(NS, &format!("api-{}-{n}", &node.name[5..]), "api", &[8080]);
    let mut pods: Vec<Pod> = nodes().iter().map(|node| cluster.run_pod(&node.name, spec(node, 1))).collect();
    let _agents: Vec<_> = nodes().iter().map(|node| cluster.start_agent(&node.name, &[])).collect();
    wait_kernels(&cluster, "api", "one pod per zone programmed", |_, held| held.len() == 1);
    let b = cluster.client_on("node-b1");
    let target = SocketAddr::new(ip, 80);
    assert_eq!(b.place.tcp(target, 50).landed_on("api-b1-1"), 50);

    // zone-b's pod fails its readiness probe, as kubelet reports it: Ready false.
    let lost = pods.remove(1);
    cluster.report(&lost, false);
    let lost_ip = IpAddr::V4(lost.ip);
    wait_kernels(&cluster, "api", "zone-b's pod out of every kernel", |_, held| !held.contains(&lost_ip));
    let away = b.place.tcp(target, 100);
    assert_eq!(away.failures(), 0, "{away:?}");
    let reached: BTreeSet<&str> = away.landed.keys().map(String::as_str).collect();
    assert_eq!(reached, BTreeSet::from(["api-a1-1", "api-c1-1"]), "no pod in zone-b: every zone's");
    cluster.remove_pod(lost);

    // A new pod in zone-b: home again.
    let back = cluster.run_pod("node-b1", spec(&nodes()[1], 2));
    let back_ip = IpAddr::V4(back.ip);
    wait_kernels(&cluster, "api", "zone-b's new pod programmed", |node, held| {
        node != "node-b1" || held == &BTreeSet::from([back_ip])
    });
    assert_eq!(b.place.tcp(target, 50).landed_on("api-b1-2"), 50);
}

#[test]
fn a_service_whose_every_pod_is_terminating_keeps_serving_until_they_are_gone() {
    require_root!();
    if Binaries::or_skip(module_path!()).is_none() {
        return;
    }
    let (cluster, ip) = start("drain", "drain");
    let pod = cluster.run_pod("node-a1", PodSpec::new(NS, "drain-a1", "drain", &[8080]));
    let _agent = cluster.start_agent("node-a1", &[]);
    let a = cluster.client_on("node-a1");
    let target = SocketAddr::new(ip, 80);
    eventually("programmed", Duration::from_secs(30), || match a.place.tcp(target, 10).landed_on("drain-a1") {
        10 => Ok(()),
        n => Err(format!("{n} of 10")),
    });
    // Deleted gracefully: not ready, still serving. With no ready endpoint anywhere, the
    // terminating ones that serve are used (KEP-1669), as kube-proxy does.
    cluster.delete_pod(&pod);
    eventually("terminating and serving", Duration::from_secs(30), || match cluster.endpoints(NS, "drain").first() {
        Some(e) if e.terminating && e.serving && !e.ready => Ok(()),
        other => Err(format!("{other:?}")),
    });
    std::thread::sleep(Duration::from_secs(2));
    let draining = a.place.tcp(target, 50);
    assert_eq!(draining.landed_on("drain-a1"), 50, "{draining:?}");
    // Gone: nothing serves, and the agent refuses at connect instead of letting it time out.
    cluster.remove_pod(pod);
    eventually("refused once gone", Duration::from_secs(30), || {
        let report = a.place.tcp(target, 5);
        match report.errno("ECONNREFUSED") {
            5 => Ok(()),
            _ => Err(format!("{report:?}")),
        }
    });
}
