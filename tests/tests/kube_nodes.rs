//! The Node watch asks for what the Services read, against the in-process fake API server (no
//! root): this node's own Node and a census of the others unless some Service reads other Nodes'
//! labels (every Node's metadata) or uses spillover (whole Nodes: allocatable CPU, Ready),
//! switching as Services come and go; and what each saves of the bytes every kubelet status
//! report costs each agent. It stays on the fake for that measurement: the fake counts the bytes
//! it sends of each resource, at a status rate it drives; the real API server's watch cache is
//! held to the same scopes in `e2e_churn.rs` (field selector, census from `resourceVersion=0`).
//!
//! Tier: fake-api (no root; the in-process fake API server, in parallel).

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;
use topology_kube::{
    EventReceiver, EventSender, Object, SourceEvent,
    fake_api::{FakeApi, Resource},
    objects,
    watch::KubeSource,
};
use topology_model::{Kind, Node, census::Census};
use topology_tests::scale;

const NODES: usize = 40;

fn ip(text: &str) -> IpAddr {
    text.parse().expect("IP")
}

/// The Nodes of the next relist of Nodes `receiver` gets within 20 s.
async fn next_node_list(receiver: EventReceiver) -> (EventReceiver, Vec<Node>) {
    tokio::task::spawn_blocking(move || {
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
                    let nodes = nodes.into_iter().filter_map(|o| if let Object::Node(n) = o { Some(n) } else { None });
                    return (receiver, nodes.collect());
                }
                _ => {}
            }
        }
    })
    .await
    .expect("receiver")
}

fn whole(nodes: &[Node]) -> bool {
    assert_eq!(nodes.len(), NODES);
    nodes.iter().all(|n| n.ready && n.allocatable_cpu_millis > 0)
}

/// The census the agent took next, within 20 s.
async fn next_census(receiver: EventReceiver) -> (EventReceiver, Option<Census>) {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if let (_, SourceEvent::Census(census)) = receiver.recv_timeout(left).expect("a census") {
                return (receiver, census);
            }
        }
    })
    .await
    .expect("receiver")
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_watches_its_own_node_unless_a_service_reads_the_others() {
    let api = FakeApi::start().await;
    (0..NODES).for_each(|n| api.apply(scale::node(n)));
    api.apply(objects::service("shop", "web", ip("10.96.0.10"), 80, "TCP", "http"));
    let (events, receiver) = EventSender::channel();
    let shutdown = CancellationToken::new();
    let this = scale::node_name(3);
    let source = KubeSource::start(&api.client(), Some(&this), &events, &shutdown);
    drop(events);

    // No Service reads other Nodes: a census of them first, then this Node's own watch.
    let (receiver, census) = next_census(receiver).await;
    let census = census.expect("a census while the agent watches its own Node");
    assert_eq!(census.nodes(), NODES);
    assert_eq!(census.rank(&this), (3, NODES));
    assert!(!census.regions().is_empty() && census.regions().values().all(|r| r == "europe-west1"), "{census:?}");
    let (receiver, nodes) = next_node_list(receiver).await;
    assert_eq!(nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), [this.as_str()], "this Node alone");
    assert!(nodes[0].labels.zone().is_some() && nodes[0].allocatable_cpu_millis == 0, "its metadata");
    let heartbeats = api.heartbeats(Duration::from_secs(1));
    let own_bytes = bytes_over(&api, Duration::from_secs(3)).await;

    // Topology keys on a label only Nodes carry: every Node's metadata, watched.
    let mut keyed = objects::service("shop", "keyed", ip("10.96.0.12"), 80, "TCP", "http");
    objects::annotate(&mut keyed, "topology-agent.io/topology-keys", "cloud.google.com/gke-nodepool, *");
    api.apply(keyed);
    let (receiver, census) = next_census(receiver).await;
    assert_eq!(census, None, "every Node is watched: no census");
    let (receiver, nodes) = next_node_list(receiver).await;
    assert!(nodes.len() == NODES && nodes.iter().all(|n| n.allocatable_cpu_millis == 0), "every Node's metadata");
    assert!(nodes.iter().all(|n| n.labels.get("cloud.google.com/gke-nodepool").is_some()), "with every label");
    let metadata_bytes = bytes_over(&api, Duration::from_secs(3)).await;

    // Spillover: every Node whole.
    let mut spilling = objects::service("shop", "spill", ip("10.96.0.11"), 80, "TCP", "http");
    objects::annotate(&mut spilling, "topology-agent.io/spillover", "capacity");
    api.apply(spilling);
    let (receiver, nodes) = next_node_list(receiver).await;
    assert!(whole(&nodes), "a spillover Service: the Nodes' status, for the demand of each zone");
    let whole_bytes = bytes_over(&api, Duration::from_secs(3)).await;
    drop(heartbeats);
    eprintln!(
        "Node bytes per second at {NODES} status reports/s: own Node {own_bytes:.0}, metadata {metadata_bytes:.0}, \
         whole {whole_bytes:.0}"
    );
    assert!(metadata_bytes * 5.0 < whole_bytes, "metadata {metadata_bytes:.0} B/s, whole {whole_bytes:.0} B/s");
    assert!(own_bytes * 10.0 < metadata_bytes, "own Node {own_bytes:.0} B/s, metadata {metadata_bytes:.0} B/s");

    api.delete(Resource::Services, "shop", "spill");
    let (receiver, nodes) = next_node_list(receiver).await;
    assert!(nodes.len() == NODES && nodes.iter().all(|n| n.allocatable_cpu_millis == 0), "back to metadata");
    api.delete(Resource::Services, "shop", "keyed");
    let (receiver, census) = next_census(receiver).await;
    assert_eq!(census.map(|c| c.nodes()), Some(NODES), "a census again");
    let (_receiver, nodes) = next_node_list(receiver).await;
    assert_eq!(nodes.len(), 1, "and this Node alone");
    // Two censuses, and one watch list per change of scope.
    assert_eq!(api.lists(Resource::Nodes), 2 + 5);
    shutdown.cancel();
    source.join().await;
}

/// Bytes per second the fake sent of Nodes over `window`.
async fn bytes_over(api: &FakeApi, window: Duration) -> f64 {
    let before = api.bytes_sent(Resource::Nodes);
    tokio::time::sleep(window).await;
    (api.bytes_sent(Resource::Nodes) - before) as f64 / window.as_secs_f64()
}
