//! The Node watch asks for what the Services read, against the in-process fake API server (no
//! root): Nodes' metadata (labels) unless some Service uses spillover, whole Nodes (allocatable
//! CPU, Ready) while one does, switching as Services come and go; and what that saves of the
//! bytes every kubelet status report costs each agent.

use std::{
    net::IpAddr,
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;
use topology_agent::{
    cluster::{Kind, Node},
    source::{EventReceiver, EventSender, Object, SourceEvent, kube::KubeSource},
};
use topology_tests::{
    cluster,
    fake_api::{FakeApi, Resource},
    scale,
};

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

#[tokio::test(flavor = "multi_thread")]
async fn nodes_are_watched_whole_only_while_a_service_uses_spillover() {
    let api = FakeApi::start().await;
    (0..NODES).for_each(|n| api.apply(scale::node(n)));
    api.apply(cluster::service("shop", "web", ip("10.96.0.10"), 80, "TCP", "http"));
    let (events, receiver) = EventSender::channel();
    let shutdown = CancellationToken::new();
    let source = KubeSource::start(&api.client(), &events, &shutdown);
    drop(events);

    let (receiver, nodes) = next_node_list(receiver).await;
    assert!(nodes.iter().all(|n| !n.ready && n.allocatable_cpu_millis == 0), "metadata only at first");
    assert!(nodes.iter().all(|n| n.labels.zone().is_some()), "with every label");
    // What each status report of a kubelet costs: a tenth of the whole Node or less.
    let heartbeats = api.heartbeats(Duration::from_secs(1));
    let metadata_bytes = bytes_over(&api, Duration::from_secs(3)).await;

    let mut spilling = cluster::service("shop", "spill", ip("10.96.0.11"), 80, "TCP", "http");
    cluster::annotate(&mut spilling, "topology-agent.io/spillover", "capacity");
    api.apply(spilling);
    let (receiver, nodes) = next_node_list(receiver).await;
    assert!(whole(&nodes), "a spillover Service: the Nodes' status, for the demand of each zone");
    let whole_bytes = bytes_over(&api, Duration::from_secs(3)).await;
    drop(heartbeats);
    eprintln!(
        "Node bytes per second at {NODES} status reports/s: metadata {metadata_bytes:.0}, whole {whole_bytes:.0}"
    );
    assert!(metadata_bytes * 5.0 < whole_bytes, "metadata {metadata_bytes:.0} B/s, whole {whole_bytes:.0} B/s");

    api.delete(Resource::Services, "shop", "spill");
    let (_receiver, nodes) = next_node_list(receiver).await;
    assert!(nodes.iter().all(|n| n.allocatable_cpu_millis == 0), "back to metadata once no Service needs more");
    assert_eq!(api.lists(Resource::Nodes), 3, "one list per change of need");
    shutdown.cancel();
    source.join().await;
}

/// Bytes per second the fake sent of Nodes over `window`.
async fn bytes_over(api: &FakeApi, window: Duration) -> f64 {
    let before = api.bytes_sent(Resource::Nodes);
    tokio::time::sleep(window).await;
    (api.bytes_sent(Resource::Nodes) - before) as f64 / window.as_secs_f64()
}
