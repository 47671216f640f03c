//! The real control plane (root, real kernel): kube-apiserver, kube-controller-manager and etcd
//! built from their own modules, the agent deployed from `deploy/` as a user deploys it, its
//! connections routed by the slices and hints the real EndpointSlice controller wrote.
//! `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{net::SocketAddr, time::Duration};

use serde_json::{Value, json};
use topology_tests::{
    kubernetes::{Binaries, Cluster, eventually, nodes::NodeSpec, pods::PodSpec},
    require_root,
};

#[test]
fn the_agent_deployed_from_deploy_routes_by_the_real_controllers_slices() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let version = binaries.kubernetes_version();
    let nodes =
        [NodeSpec::new("node-a1", "zone-a"), NodeSpec::new("node-b1", "zone-b"), NodeSpec::new("node-c1", "zone-c")];
    let cluster = Cluster::start(binaries, &nodes);

    // The API server says what it is: the version the binaries were built as.
    let served: Value = serde_json::from_str(&cluster.kubectl(&["get", "--raw", "/version"]).expect("/version"))
        .expect("/version JSON");
    assert_eq!(format!("Kubernetes {}", served["gitVersion"].as_str().expect("gitVersion")), version);

    let applied = cluster.deploy();
    for object in [
        "namespace/topology-agent",
        "serviceaccount/topology-agent",
        "clusterrole.rbac.authorization.k8s.io/topology-agent",
        "clusterrolebinding.rbac.authorization.k8s.io/topology-agent",
        "resourcequota/topology-agent-critical-pods",
        "daemonset.apps/topology-agent",
    ] {
        assert!(applied.contains(&format!("{object} serverside-applied")), "{object} not applied: {applied}");
    }

    cluster.namespace("e2e");
    let service = cluster.apply(&json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "echo", "namespace": "e2e"},
        "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                 "trafficDistribution": "PreferClose"},
    }));
    let cluster_ip: std::net::IpAddr =
        service["spec"]["clusterIP"].as_str().expect("a ClusterIP").parse().expect("an IP");
    let _pods: Vec<_> = nodes
        .iter()
        .map(|node| cluster.run_pod(&node.name, PodSpec::new("e2e", &format!("echo-{}", node.zone), "echo", &[8080])))
        .collect();

    // The EndpointSlice controller's slice: every pod ready, hinted to its own zone.
    eventually("the controller's slice with hints", Duration::from_secs(30), || {
        let text = cluster.kubectl(&[
            "-n",
            "e2e",
            "get",
            "endpointslices",
            "-l",
            "kubernetes.io/service-name=echo",
            "-o",
            "json",
        ])?;
        let list: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let endpoints: Vec<&Value> = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|slice| slice["endpoints"].as_array().into_iter().flatten())
            .collect();
        let hinted = endpoints.iter().filter(|endpoint| {
            endpoint["conditions"]["ready"] == true && endpoint["hints"]["forZones"][0]["name"] == endpoint["zone"]
        });
        match hinted.count() {
            3 => Ok(()),
            n => Err(format!("{n} of 3 endpoints ready and hinted: {text}")),
        }
    });

    let agents: Vec<_> = nodes.iter().map(|node| cluster.start_agent(&node.name, &[])).collect();
    for node in &nodes {
        let client = cluster.client_on(&node.name);
        let target = SocketAddr::new(cluster_ip, 80);
        let report =
            eventually(&format!("{}'s connections stay in {}", node.name, node.zone), Duration::from_secs(30), || {
                let report = client.place.tcp(target, 50);
                match report.landed_on(&format!("echo-{}", node.zone)) {
                    50 => Ok(report),
                    _ => Err(format!("{report:?}")),
                }
            });
        assert_eq!(report.failures(), 0);
    }
    drop(agents);
}
