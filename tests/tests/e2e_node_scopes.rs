//! The Node watch asks the real API server for what the Services read (root: the control plane's
//! namespace), the source in this process with a token of the deploy's ServiceAccount: this
//! node's own Node and a census of the others unless some Service reads other Nodes' labels
//! (every Node's metadata) or uses spillover (whole Nodes: allocatable CPU, Ready), switching as
//! Services come and go; and what each scope saves of the bytes 40 Nodes' status reports cost the
//! agent, counted in its client as the answers arrive. `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use topology_kube::{EventReceiver, EventSender, Object, SourceEvent, watch::KubeSource};
use topology_model::{Kind, Node, census::Census};
use topology_tests::{
    kubernetes::{Binaries, Cluster, counted::Received},
    require_root, scale,
};

const NODES: usize = 40;
const NS: &str = "shop";

/// Node `n` as a cluster's kubelet registers it, then reports its status (about 15 KiB).
fn create_nodes(cluster: &Cluster) {
    let admin = cluster.admin();
    cluster.api().block(async move {
        let nodes: Api<NodeObject> = Api::all(admin);
        for n in 0..NODES {
            let mut object = scale::node(n);
            let status = object.as_object_mut().and_then(|o| o.remove("status")).expect("a status");
            for field in ["uid", "creationTimestamp", "managedFields"] {
                object["metadata"].as_object_mut().expect("metadata").remove(field);
            }
            let node: NodeObject = serde_json::from_value(object).expect("a Node");
            nodes.create(&PostParams::default(), &node).await.expect("creating a Node");
            let name = scale::node_name(n);
            let patch = Patch::Merge(json!({"status": status}));
            nodes.patch_status(&name, &PatchParams::default(), &patch).await.expect("its status");
        }
    });
}

/// Every Node reports its status once a second (a new heartbeat time), until cancelled; the
/// reports made so far are counted.
fn heartbeats(cluster: &Cluster) -> (CancellationToken, Arc<AtomicU64>) {
    let (admin, stop, reports) = (cluster.admin(), CancellationToken::new(), Arc::new(AtomicU64::new(0)));
    let (stopped, reported) = (stop.clone(), Arc::clone(&reports));
    cluster.api().spawn(async move {
        let nodes: Api<NodeObject> = Api::all(admin);
        while !stopped.is_cancelled() {
            let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
            for n in 0..NODES {
                let status = json!({"status": {"conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                }]}});
                let name = scale::node_name(n);
                if nodes.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status)).await.is_ok() {
                    reported.fetch_add(1, Ordering::Relaxed);
                }
            }
            tokio::select! {
                () = stopped.cancelled() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    });
    (stop, reports)
}

/// The Nodes of the next relist of Nodes, within 20 s.
fn next_node_list(receiver: &EventReceiver) -> Vec<Node> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut nodes = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (_, event) = receiver.recv_timeout(left).expect("a list of Nodes");
        match event {
            SourceEvent::Listing(Kind::Node) => nodes.clear(),
            SourceEvent::ListPage { kind: Kind::Node, objects, .. } => nodes.extend(objects),
            SourceEvent::Replace { kind: Kind::Node, objects, .. } => {
                nodes.extend(objects);
                return nodes
                    .into_iter()
                    .filter_map(|o| if let Object::Node(n) = o { Some(n) } else { None })
                    .collect();
            }
            _ => {}
        }
    }
}

/// The census the agent took next, within 20 s.
fn next_census(receiver: &EventReceiver) -> Option<Census> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if let (_, SourceEvent::Census(census)) = receiver.recv_timeout(left).expect("a census") {
            return census;
        }
    }
}

fn whole(nodes: &[Node]) -> bool {
    assert_eq!(nodes.len(), NODES);
    nodes.iter().all(|n| n.ready && n.allocatable_cpu_millis > 0)
}

/// Bytes the agent's client received of Nodes per status report in the cluster, over 5 s.
fn bytes_per_report(received: &Received, reports: &AtomicU64) -> f64 {
    let before = (received.bytes("nodes"), reports.load(Ordering::Relaxed));
    std::thread::sleep(Duration::from_secs(5));
    let after = (received.bytes("nodes"), reports.load(Ordering::Relaxed));
    (after.0 - before.0) as f64 / (after.1 - before.1).max(1) as f64
}

fn service(cluster: &Cluster, name: &str, annotations: Value) {
    cluster.apply(&json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS, "annotations": annotations},
        "spec": {"ports": [{"name": "http", "port": 80}]},
    }));
}

fn delete_service(cluster: &Cluster, name: &str) {
    cluster.kubectl(&["-n", NS, "delete", "service", name]).unwrap_or_else(|e| panic!("deleting {name}: {e}"));
}

/// The agent's lists of Nodes (first pages) audited so far, once the log has them all.
fn node_lists(cluster: &mut Cluster, at_least: usize) -> usize {
    let count = |cluster: &mut Cluster| {
        let audited = cluster.audited();
        audited.iter().filter(|r| r.verb == "list" && r.resource == "nodes" && !r.uri.contains("continue=")).count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while count(cluster) < at_least && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(1));
    count(cluster)
}

#[test]
fn an_agent_watches_its_own_node_unless_a_service_reads_the_others() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let mut cluster = Cluster::start(binaries, &[]);
    cluster.namespace(NS);
    cluster.deploy();
    create_nodes(&cluster);
    service(&cluster, "web", json!({}));
    let (client, received) = cluster.counted_agent_client();
    let this = scale::node_name(3);
    let (events, receiver) = EventSender::channel();
    let shutdown = CancellationToken::new();
    let source = {
        let runtime = cluster.runtime();
        let _entered = runtime.enter();
        KubeSource::start(&client, Some(&this), &events, &shutdown)
    };
    drop(events);

    // No Service reads other Nodes: a census of them first, then this Node's own watch.
    let census = next_census(&receiver).expect("a census while the agent watches its own Node");
    assert_eq!(census.nodes(), NODES);
    assert_eq!(census.rank(&this), (3, NODES));
    assert!(!census.regions().is_empty() && census.regions().values().all(|r| r == "europe-west1"), "{census:?}");
    let nodes = next_node_list(&receiver);
    assert_eq!(nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), [this.as_str()], "this Node alone");
    assert!(nodes[0].labels.zone().is_some() && nodes[0].allocatable_cpu_millis == 0, "its metadata");
    let (beating, reports) = heartbeats(&cluster);
    let own_bytes = bytes_per_report(&received, &reports);

    // Topology keys on a label only Nodes carry: every Node's metadata, watched.
    service(&cluster, "keyed", json!({"topology-agent.io/topology-keys": "cloud.google.com/gke-nodepool, *"}));
    assert_eq!(next_census(&receiver), None, "every Node is watched: no census");
    let nodes = next_node_list(&receiver);
    assert!(nodes.len() == NODES && nodes.iter().all(|n| n.allocatable_cpu_millis == 0), "every Node's metadata");
    assert!(nodes.iter().all(|n| n.labels.get("cloud.google.com/gke-nodepool").is_some()), "with every label");
    let metadata_bytes = bytes_per_report(&received, &reports);

    // Spillover: every Node whole.
    service(&cluster, "spill", json!({"topology-agent.io/spillover": "capacity"}));
    let nodes = next_node_list(&receiver);
    assert!(whole(&nodes), "a spillover Service: the Nodes' status, for the demand of each zone");
    let whole_bytes = bytes_per_report(&received, &reports);
    beating.cancel();
    eprintln!(
        "Node bytes received per status report of {NODES} Nodes: own Node {own_bytes:.0}, metadata \
         {metadata_bytes:.0}, whole {whole_bytes:.0}"
    );
    // A Node's metadata still carries its managedFields, whose status entry names every field a
    // kubelet reports (each image among them) and changes with each report: about a quarter of
    // the whole Node here, which no request can leave out.
    assert!(metadata_bytes * 3.0 < whole_bytes, "metadata {metadata_bytes:.0} B, whole {whole_bytes:.0} B");
    assert!(own_bytes * 10.0 < metadata_bytes, "own Node {own_bytes:.0} B, metadata {metadata_bytes:.0} B");

    delete_service(&cluster, "spill");
    let nodes = next_node_list(&receiver);
    assert!(nodes.len() == NODES && nodes.iter().all(|n| n.allocatable_cpu_millis == 0), "back to metadata");
    delete_service(&cluster, "keyed");
    assert_eq!(next_census(&receiver).map(|c| c.nodes()), Some(NODES), "a census again");
    assert_eq!(next_node_list(&receiver).len(), 1, "and this Node alone");
    // Two censuses, and one watch list per change of scope.
    assert_eq!(node_lists(&mut cluster, 2 + 5), 2 + 5, "the agent's lists of Nodes");
    shutdown.cancel();
    cluster.api().block(source.join());
}
