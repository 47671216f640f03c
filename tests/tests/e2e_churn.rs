//! The agents' watches against the real API server's watch cache (root, real kernel): 100
//! Services created, changed and half deleted reach every node's kernel through the watches
//! alone — no list after the first; an agent watches its own Node alone (a field selector) and
//! reads the others from a census the watch cache answers (`resourceVersion=0`), which is where
//! the regions of other zones come from (region keys included), until topology keys name another
//! Node label and it watches every Node. `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    time::Duration,
};

use serde_json::{Value, json};
use topology_tests::{
    kubernetes::{
        Binaries, Cluster, eventually,
        nodes::NodeSpec,
        observe::{explained_backends, kernel_status},
        pods::PodSpec,
    },
    require_root,
};

const NS: &str = "churn";
const SERVICES: usize = 100;

fn service(n: usize, port: u16) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("svc-{n:03}"), "namespace": NS},
        "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": port, "targetPort": 8080}]},
    })
}

/// The Service ports of `NS` a node's kernel holds: name → port.
fn held(cluster: &Cluster, node: &str) -> BTreeMap<String, u64> {
    let status = kernel_status(cluster.node(node).pins());
    status["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|port| {
            let name = port["service"].as_str()?.strip_prefix(&format!("{NS}/"))?;
            let name = name.split(':').next()?.to_owned();
            Some((name, port["port"].as_u64()?))
        })
        .collect()
}

fn wait_held(cluster: &Cluster, nodes: &[NodeSpec], what: &str, want: &BTreeMap<String, u64>) {
    for node in nodes {
        eventually(&format!("{what} on {}", node.name), Duration::from_secs(60), || {
            let held = held(cluster, &node.name);
            match &held == want {
                true => Ok(()),
                false => Err(format!("{} of {} held", held.len(), want.len())),
            }
        });
    }
}

#[test]
fn a_hundred_services_churned_reach_every_kernel_through_the_watches_alone() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let nodes = [NodeSpec::new("node-a1", "zone-a"), NodeSpec::new("node-b1", "zone-b")];
    let mut cluster = Cluster::start(binaries, &nodes);
    cluster.deploy();
    cluster.namespace(NS);
    let _pods: Vec<_> = nodes
        .iter()
        .map(|node| {
            cluster.run_pod(&node.name, PodSpec::new(NS, &format!("echo-{}", &node.name[5..]), "echo", &[8080]))
        })
        .collect();
    let _agents: Vec<_> = nodes.iter().map(|node| cluster.start_agent(&node.name, &[])).collect();
    let mark = cluster.audited().len();

    let started = std::time::Instant::now();
    for n in 0..SERVICES {
        cluster.apply(&service(n, 80));
    }
    let all: BTreeMap<String, u64> = (0..SERVICES).map(|n| (format!("svc-{n:03}"), 80)).collect();
    wait_held(&cluster, &nodes, "100 Services created", &all);
    let created = started.elapsed();
    for n in 0..SERVICES {
        cluster.apply(&service(n, 81));
    }
    let moved: BTreeMap<String, u64> = (0..SERVICES).map(|n| (format!("svc-{n:03}"), 81)).collect();
    wait_held(&cluster, &nodes, "100 Services' ports changed", &moved);
    for n in (0..SERVICES).step_by(2) {
        cluster.kubectl(&["-n", NS, "delete", "service", &format!("svc-{n:03}"), "--wait=false"]).expect("delete");
    }
    let half: BTreeMap<String, u64> = (1..SERVICES).step_by(2).map(|n| (format!("svc-{n:03}"), 81)).collect();
    wait_held(&cluster, &nodes, "50 Services deleted", &half);

    // Through the watches alone: no agent listed anything while 250 changes went by.
    let lists: Vec<String> = cluster
        .audited()
        .into_iter()
        .skip(mark)
        .filter(|request| request.verb == "list" && request.by_the_agent())
        .map(|request| format!("{} {}", request.pod, request.uri))
        .collect();
    assert!(lists.is_empty(), "the agents listed during the churn: {lists:?}");
    eprintln!(
        "100 Services on both kernels {:.1} s after the first apply; 100 changed, 50 deleted; 0 lists",
        created.as_secs_f64()
    );
}

#[test]
fn an_agent_watches_its_own_node_and_learns_other_zones_regions_from_a_census_of_the_watch_cache() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    // zone-a and zone-c in region r1, zone-b in r2.
    let nodes = [
        NodeSpec::new("node-a1", "zone-a").in_region("r1"),
        NodeSpec::new("node-b1", "zone-b").in_region("r2"),
        NodeSpec::new("node-c1", "zone-c").in_region("r1"),
    ];
    let mut cluster = Cluster::start(binaries, &nodes);
    cluster.deploy();
    cluster.namespace(NS);
    let pods: Vec<_> = nodes
        .iter()
        .map(|node| {
            cluster.run_pod(&node.name, PodSpec::new(NS, &format!("echo-{}", &node.name[5..]), "echo", &[8080]))
        })
        .collect();
    let spread = |name: &str, annotations: Value| {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NS, "annotations": annotations},
            "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
        })
    };
    cluster.apply(&spread("spread", json!({})));
    let agent = cluster.start_agent("node-a1", &[]);

    // An endpoint's zone comes from its slice; the zone's region only from the Nodes, which this
    // agent does not watch: its census says zone-c is in its region and zone-b is not.
    let locality: BTreeMap<String, String> = agent.explain(&format!("{NS}/spread"))["services"][0]["backends"]
        .as_array()
        .expect("backends")
        .iter()
        .map(|b| {
            (b["zone"].as_str().unwrap_or_default().to_owned(), b["locality"].as_str().unwrap_or_default().to_owned())
        })
        .collect();
    let expected: BTreeMap<String, String> = [("zone-a", "node"), ("zone-b", "other"), ("zone-c", "region")]
        .map(|(z, l)| (z.to_owned(), l.to_owned()))
        .into();
    assert_eq!(locality, expected);
    let nodes_asked = |cluster: &mut Cluster| -> Vec<_> {
        cluster
            .audited()
            .into_iter()
            .filter(|r| r.resource == "nodes" && r.pod == agent.name && r.by_the_agent())
            .collect()
    };
    let requests = nodes_asked(&mut cluster);
    let own = "fieldSelector=metadata.name%3Dnode-a1";
    let watches: Vec<_> = requests.iter().filter(|r| r.verb == "watch").collect();
    assert!(!watches.is_empty() && watches.iter().all(|r| r.uri.contains(own)), "{requests:?}");
    let census: Vec<_> = requests.iter().filter(|r| r.verb == "list" && !r.uri.contains("fieldSelector")).collect();
    assert_eq!(census.len(), 1, "{requests:?}");
    assert_eq!(census[0].resource_version(), Some("0"), "a census not from the watch cache: {census:?}");

    // Keys by region: still from the census, no wider watch.
    let mark = requests.len();
    cluster.apply(&spread("regional", json!({"topology-agent.io/topology-keys": "topology.kubernetes.io/region"})));
    let want: BTreeSet<IpAddr> =
        pods.iter().filter(|pod| pod.node != "node-b1").map(|pod| IpAddr::V4(pod.ip)).collect();
    eventually("region r1's endpoints", Duration::from_secs(30), || {
        let explained = explained_backends(&agent.explain(&format!("{NS}/regional")));
        match explained == want {
            true => Ok(()),
            false => Err(format!("{explained:?}")),
        }
    });
    let since: Vec<_> = nodes_asked(&mut cluster).into_iter().skip(mark).collect();
    assert!(since.iter().all(|r| r.uri.contains(own)), "region keys widened the Node watch: {since:?}");

    // Keys naming another Node label need every Node's labels: the agent widens its watch.
    let mark = mark + since.len();
    cluster.apply(&spread("racked", json!({"topology-agent.io/topology-keys": "topology.example.com/rack,*"})));
    eventually("a watch of every Node", Duration::from_secs(30), || {
        let widened: Vec<_> = nodes_asked(&mut cluster).into_iter().skip(mark).collect();
        match widened.iter().any(|r| r.verb == "watch" && !r.uri.contains("fieldSelector")) {
            true => Ok(()),
            false => Err(format!("{widened:?}")),
        }
    });
    eprintln!(
        "node requests of {}:\n{}",
        agent.name,
        nodes_asked(&mut cluster).iter().map(|r| format!("{} {}", r.verb, r.uri)).collect::<Vec<_>>().join("\n")
    );
}
