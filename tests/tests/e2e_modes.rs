//! Every mode end to end on the real control plane (root, real kernel): four nodes in three zones,
//! the agent deployed from `deploy/` on each with its ServiceAccount's token, one echo pod per
//! node (and one pod of another app in zone-a alone), and a Service per mode selecting them. The real EndpointSlice controller writes the
//! slices and hints; for every mode and every node, connections land exactly where the
//! controller's hints (or the mode's rule) say, where `explain` says, and where the node's kernel
//! holds; a hard key refuses where it matches nothing; the node's DNS answers a headless
//! Service by the same hints and an ExternalName Service with its CNAME. `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde_json::{Value, json};
use topology_tests::{
    dns::dig,
    kubernetes::{
        Binaries, Cluster, eventually,
        nodes::NodeSpec,
        observe::{Endpoint, explained_backends, kernel_backends, kernel_status},
        pods::{PodSpec, echo_service},
    },
    require_root,
};

const NS: &str = "modes";
const CONNECTIONS: u64 = 200;

/// A Service per mode: its name, what it adds to a plain Service, and whether the controller
/// hints its slices.
fn modes() -> Vec<(&'static str, Value, bool)> {
    vec![
        ("default", json!({}), false),
        // A hard key (no `*`): only zone-a has a pod; elsewhere connections are refused.
        (
            "hard-keys",
            json!({"metadata": {"annotations": {"topology-agent.io/topology-keys": "topology.kubernetes.io/zone"}},
                   "spec": {"selector": {"app": "only-a"}}}),
            false,
        ),
        // Capacity spillover decides from the Nodes' CPUs and the endpoints per zone: explain says.
        ("spill", json!({"metadata": {"annotations": {"topology-agent.io/spillover": "capacity"}}}), false),
        ("auto", json!({"metadata": {"annotations": {"service.kubernetes.io/topology-mode": "Auto"}}}), true),
        ("prefer-close", json!({"spec": {"trafficDistribution": "PreferClose"}}), true),
        ("prefer-same-zone", json!({"spec": {"trafficDistribution": "PreferSameZone"}}), true),
        ("prefer-same-node", json!({"spec": {"trafficDistribution": "PreferSameNode"}}), true),
        ("local", json!({"spec": {"internalTrafficPolicy": "Local"}}), false),
        (
            "keys",
            json!({"metadata": {"annotations": {
                "topology-agent.io/topology-keys": "kubernetes.io/hostname,topology.kubernetes.io/zone,*"}}}),
            false,
        ),
    ]
}

fn service(name: &str, extra: &Value) -> Value {
    echo_service(NS, name, extra)
}

/// Where a client on `node` (in `zone`) must land for Service `mode`, from the controller's
/// slices: the hints it wrote for the hinted modes, the mode's own rule otherwise.
fn expected(mode: &str, node: &str, zone: &str, endpoints: &[Endpoint]) -> BTreeSet<IpAddr> {
    let pick = |keep: &dyn Fn(&Endpoint) -> bool| endpoints.iter().filter(|e| keep(e)).map(|e| e.address).collect();
    match mode {
        "default" => pick(&|_| true),
        "hard-keys" => pick(&|e| e.zone.as_deref() == Some(zone)),
        "local" | "keys" => pick(&|e| e.node.as_deref() == Some(node)),
        "prefer-same-node" => {
            let own: BTreeSet<IpAddr> = pick(&|e| e.for_nodes.as_ref().is_some_and(|nodes| nodes.contains(node)));
            match own.is_empty() {
                false => own,
                true => pick(&|e| e.for_zones.as_ref().is_some_and(|zones| zones.contains(zone))),
            }
        }
        _ => pick(&|e| e.for_zones.as_ref().is_some_and(|zones| zones.contains(zone))),
    }
}

#[test]
fn every_mode_lands_where_the_controllers_hints_explain_and_the_kernel_say() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let nodes = [
        NodeSpec::new("node-a1", "zone-a"),
        NodeSpec::new("node-a2", "zone-a"),
        NodeSpec::new("node-b1", "zone-b"),
        NodeSpec::new("node-c1", "zone-c"),
    ];
    let cluster = Cluster::start(binaries, &nodes);
    cluster.deploy();
    cluster.namespace(NS);
    for (name, extra, _) in modes() {
        cluster.apply(&service(name, &extra));
    }
    let mut pods: Vec<_> = nodes
        .iter()
        .map(|node| {
            cluster.run_pod(&node.name, PodSpec::new(NS, &format!("echo-{}", &node.name[5..]), "echo", &[8080]))
        })
        .collect();
    let echo_pods = pods.len();
    pods.push(cluster.run_pod("node-a1", PodSpec::new(NS, "only-a1", "only-a", &[8080])));
    let pod_of: BTreeMap<IpAddr, String> = pods.iter().map(|pod| (IpAddr::V4(pod.ip), pod.spec.name.clone())).collect();
    for extra in [headless(), external_name()] {
        cluster.apply(&extra);
    }

    // The controller's slices: every pod ready in every Service's, hinted where the mode asks.
    let endpoints: BTreeMap<&str, Vec<Endpoint>> = modes()
        .into_iter()
        .map(|(name, _, hinted)| {
            let endpoints = eventually(&format!("{name}'s slices"), Duration::from_secs(60), || {
                let endpoints = cluster.endpoints(NS, name);
                let ready = endpoints.iter().filter(|e| e.ready && (!hinted || e.for_zones.is_some())).count();
                let selected = if name == "hard-keys" { 1 } else { echo_pods };
                match ready == selected {
                    true => Ok(endpoints),
                    false => Err(format!("{endpoints:?}")),
                }
            });
            (name, endpoints)
        })
        .collect();

    let agents: Vec<_> = nodes.iter().map(|node| cluster.start_agent(&node.name, &[])).collect();
    let mut table = Vec::new();
    for (node, agent) in nodes.iter().zip(&agents) {
        let client = cluster.client_on(&node.name);
        let pins = cluster.node(&node.name).pins().to_path_buf();
        for (mode, _, _) in modes() {
            let key = format!("{NS}/{mode}");
            let plan = agent.explain(&key);
            let explained = explained_backends(&plan);
            let want = match mode {
                // Spillover's shares come from the whole cluster's capacity: explain's are checked
                // against the kernel and the connections below.
                "spill" => {
                    assert!(plan["services"][0].get("spillover").is_some(), "spill on {}: {plan}", node.name);
                    explained.clone()
                }
                _ => expected(mode, &node.name, &node.zone, &endpoints[mode]),
            };
            if want.is_empty() {
                // Nothing this node may use: refused at connect.
                assert_eq!(plan["services"][0]["reject"], true, "{mode} on {}: {plan}", node.name);
                let ip: IpAddr =
                    plan["services"][0]["clusterIPs"][0].as_str().and_then(|ip| ip.parse().ok()).expect("a ClusterIP");
                let refused = eventually("refused", Duration::from_secs(30), || {
                    let report = client.place.tcp(SocketAddr::new(ip, 80), 20);
                    match report.errno("ECONNREFUSED") {
                        20 => Ok(report),
                        _ => Err(format!("{report:?}")),
                    }
                });
                assert!(refused.landed.is_empty());
                table.push(format!("{:<18} {:<8} refused", mode, node.name));
                continue;
            }
            // What explain says and what the kernel holds: the controller's choice, exactly.
            assert_eq!(explained, want, "explain {mode} on {}", node.name);
            let cluster_ip =
                eventually(&format!("{mode} programmed on {}", node.name), Duration::from_secs(30), || {
                    let status = kernel_status(&pins);
                    match kernel_backends(&status, &format!("{key}:")) == want {
                        true => Ok(status),
                        false => Err(format!("{status}")),
                    }
                });
            let cluster_ip: IpAddr = cluster_ip["services"]
                .as_array()
                .and_then(|ports| ports.iter().find(|p| p["service"].as_str().is_some_and(|s| s.starts_with(&key))))
                .and_then(|port| port["clusterIp"].as_str()?.parse().ok())
                .expect("the port's ClusterIP");
            // Where connections land.
            let report = client.place.tcp(SocketAddr::new(cluster_ip, 80), CONNECTIONS);
            assert_eq!(report.failures(), 0, "{mode} from {}: {report:?}", node.name);
            let reached: BTreeSet<&str> = report.landed.keys().map(String::as_str).collect();
            let wanted: BTreeSet<&str> = want.iter().map(|ip| pod_of[ip].as_str()).collect();
            assert_eq!(reached, wanted, "{mode} from {}: {report:?}", node.name);
            table.push(format!("{:<18} {:<8} {}", mode, node.name, wanted.into_iter().collect::<Vec<_>>().join(",")));
        }
    }
    // The node's DNS: a headless Service answered by the same hints, from each node's agent;
    // an ExternalName Service as its CNAME.
    let hinted = eventually("the headless Service's hints", Duration::from_secs(30), || {
        let endpoints = cluster.endpoints(NS, "echo-dns");
        match endpoints.iter().filter(|e| e.for_zones.is_some()).count() == echo_pods {
            true => Ok(endpoints),
            false => Err(format!("{endpoints:?}")),
        }
    });
    for (node, agent) in nodes.iter().zip(&agents) {
        let client = cluster.client_on(&node.name);
        let dns = SocketAddr::new(IpAddr::V4(agent.ip), 5353);
        let want: Vec<String> =
            expected("prefer-close", &node.name, &node.zone, &hinted).iter().map(ToString::to_string).collect();
        let name = format!("echo-dns.{NS}.svc.cluster.local");
        let answered = eventually(&format!("{name} from {}", node.name), Duration::from_secs(30), || {
            let answer = dig(Some(&client.place.netns), dns, &name, "A", &[]);
            match answer.data == want {
                true => Ok(answer),
                false => Err(format!("{answer:?}, want {want:?}")),
            }
        });
        table.push(format!("{:<18} {:<8} {}", "headless DNS", node.name, answered.data.join(",")));
        let outside = dig(Some(&client.place.netns), dns, &format!("outside.{NS}.svc.cluster.local"), "A", &[]);
        assert!(outside.answers.iter().any(|a| a.contains("CNAME") && a.contains(EXTERNAL)), "{outside:?}");
        // The DaemonSet's `--dns-clients=node`: a pod of another node reaches this agent's
        // address too, and is refused by the Node's podCIDRs the real API server holds.
        let other = nodes.iter().find(|n| n.name != node.name).expect("two nodes");
        let stranger = dig(Some(&cluster.client_on(&other.name).place.netns), dns, &name, "A", &[]);
        assert_eq!(
            stranger.status, "REFUSED",
            "{name} asked of {}'s agent from {}: {stranger:?}",
            node.name, other.name
        );
    }
    eprintln!("e2e modes on {}:\n{}", cluster.binaries().kubernetes_version(), table.join("\n"));
}

/// Where the ExternalName Service points.
const EXTERNAL: &str = "example.org.";

/// A headless Service of the echo pods, PreferClose: the node's DNS answers by the hints.
fn headless() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "echo-dns", "namespace": NS},
        "spec": {"clusterIP": "None", "selector": {"app": "echo"}, "trafficDistribution": "PreferClose",
                 "ports": [{"name": "http", "port": 8080}]},
    })
}

/// An ExternalName Service: a CNAME in the cluster domain.
fn external_name() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "outside", "namespace": NS},
        "spec": {"type": "ExternalName", "externalName": EXTERNAL.trim_end_matches('.')},
    })
}
