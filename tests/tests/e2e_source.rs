//! The Kubernetes source, in this process, against the real API server with a token of the
//! deploy's own ServiceAccount (root: the control plane's namespace): the initial list of a kind
//! comes page by page as the server pages it; after the API server's restart with etcd compacted
//! meanwhile, whatever the restarted server answers first — 410 Gone, or 403 while its
//! authorizer's caches fill — the source lists once and sends the relist whole; a Node's status heartbeats stop at the watch while a
//! label change reaches the controller. `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Node as NodeObject, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use topology_kube::{EventReceiver, EventSender, Object, SourceEvent, watch::KubeSource};
use topology_model::Kind;
use topology_tests::{
    kubernetes::{Binaries, Cluster, Component, nodes::NodeSpec},
    require_root,
};

const NS: &str = "lists";
/// More than two pages of 500.
const SERVICES: usize = 1_200;

fn cluster(nodes: &[NodeSpec]) -> Option<Cluster> {
    let binaries = Binaries::or_skip(module_path!())?;
    let cluster = Cluster::start(binaries, nodes);
    cluster.namespace(NS);
    cluster.deploy();
    Some(cluster)
}

/// Creates Services `svc-<from>` .. `svc-<to - 1>` (selectorless, nothing else), 32 at a time.
fn create_services(cluster: &Cluster, from: usize, to: usize) {
    let admin = cluster.admin();
    cluster.api().block(async move {
        let services: Api<Service> = Api::namespaced(admin, NS);
        futures::stream::iter(from..to)
            .map(|index| {
                let services = services.clone();
                async move {
                    let service: Service = serde_json::from_value(json!({
                        "metadata": {"name": format!("svc-{index:04}"), "namespace": NS},
                        "spec": {"ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
                    }))
                    .expect("a Service");
                    services.create(&PostParams::default(), &service).await.map(drop)
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<()>>()
            .await
            .expect("creating Services");
    });
}

/// The source of `node`'s view (every Node with `None`), started on the harness's runtime.
fn source(cluster: &Cluster, node: Option<&str>) -> (KubeSource, EventReceiver, CancellationToken) {
    let client = cluster.agent_client();
    let runtime = cluster.runtime();
    let _entered = runtime.enter();
    let (events, receiver) = EventSender::channel();
    let shutdown = CancellationToken::new();
    let source = KubeSource::start(&client, node, &events, &shutdown);
    (source, receiver, shutdown)
}

fn stop(cluster: &Cluster, source: KubeSource, shutdown: &CancellationToken) {
    shutdown.cancel();
    cluster.api().block(source.join());
}

/// `kind`'s list events (and staleness) until `replaced` replacements of it came, within 60 s.
fn list_events(receiver: &EventReceiver, kind: Kind, replaced: usize) -> Vec<(&'static str, usize)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut shapes = Vec::new();
    let mut seen = 0;
    while seen < replaced {
        let left = deadline.saturating_duration_since(Instant::now());
        let (_, event) = receiver.recv_timeout(left).unwrap_or_else(|_| panic!("only {shapes:?}"));
        let shape = match &event {
            SourceEvent::Listing(of) if *of == kind => ("listing", 0),
            SourceEvent::ListPage { kind: of, objects, .. } if *of == kind => ("page", objects.len()),
            SourceEvent::Replace { kind: of, objects, .. } if *of == kind => {
                seen += 1;
                ("replace", objects.len())
            }
            SourceEvent::Apply(object) if object.id().kind() == kind => ("apply", 1),
            _ => continue,
        };
        shapes.push(shape);
    }
    shapes
}

#[test]
fn the_initial_list_comes_page_by_page_and_a_relist_whole_and_once() {
    require_root!();
    let Some(mut cluster) = cluster(&[NodeSpec::new("node-a", "zone-a")]) else { return };
    create_services(&cluster, 0, SERVICES);
    let (source, receiver, shutdown) = source(&cluster, Some("node-a"));
    // Every Service of the cluster: these and `default/kubernetes`.
    let all = SERVICES + 1;
    let initial = list_events(&receiver, Kind::Service, 1);
    assert_eq!(initial, [("listing", 0), ("page", 500), ("page", 500), ("replace", all - 1000)]);

    // One more Service, seen as a watch event; then etcd compacted past every resourceVersion
    // while the API server is down: resuming gets 410 Gone, and the list again comes whole.
    create_services(&cluster, SERVICES, SERVICES + 1);
    assert_eq!(list_events(&receiver, Kind::Service, 0).len(), 0);
    let mark = cluster.audited().len();
    cluster.control_plane().stop(Component::ApiServer);
    cluster.compact_etcd();
    cluster.control_plane().start(Component::ApiServer);
    cluster.wait_api_ready(Duration::from_secs(90));
    let relisted = list_events(&receiver, Kind::Service, 1);
    let relisted: Vec<_> = relisted.into_iter().filter(|(shape, _)| *shape != "apply").collect();
    assert_eq!(relisted, [("replace", all + 1)], "a relist is never sent in pages");
    // The API server writes its audit log as it answers: the relist's requests, its first page
    // one list (the pages after it carry `continue`).
    let first_pages = |cluster: &mut Cluster| -> Vec<String> {
        cluster.audited()[mark..]
            .iter()
            .filter(|r| r.verb == "list" && r.resource == "services" && !r.uri.contains("continue="))
            .map(|r| r.uri.clone())
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while first_pages(&mut cluster).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let lists = first_pages(&mut cluster);
    assert_eq!(lists.len(), 1, "one list after the restart: {lists:?}");
    stop(&cluster, source, &shutdown);
}

/// Node events (not freshness, staleness or a census) within `within`.
fn node_events(receiver: &EventReceiver, within: Duration) -> Vec<SourceEvent> {
    let deadline = Instant::now() + within;
    let mut events = Vec::new();
    while let Ok((_, event)) = receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        match &event {
            SourceEvent::Apply(object) if object.id().kind() == Kind::Node => events.push(event),
            SourceEvent::Delete(id) if id.kind() == Kind::Node => events.push(event),
            _ => {}
        }
    }
    events
}

#[test]
fn node_heartbeats_stop_at_the_watch_and_a_label_change_does_not() {
    require_root!();
    let nodes =
        [NodeSpec::new("node-a", "zone-a"), NodeSpec::new("node-b", "zone-b"), NodeSpec::new("node-c", "zone-c")];
    let Some(cluster) = cluster(&nodes) else { return };
    let (source, receiver, shutdown) = source(&cluster, None);
    let initial = list_events(&receiver, Kind::Node, 1);
    assert_eq!(initial.last(), Some(&("replace", 3)), "{initial:?}");

    // Every Node reports its status five times, as kubelets do: a MODIFIED event each, with
    // nothing the agent reads changed.
    let admin = cluster.admin();
    let beats = cluster.api().block(async move {
        let nodes: Api<NodeObject> = Api::all(admin);
        let mut beats = 0;
        for _ in 0..5 {
            for name in ["node-a", "node-b", "node-c"] {
                let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
                let status = json!({"status": {"conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                }]}});
                nodes.patch_status(name, &PatchParams::default(), &Patch::Strategic(&status)).await.expect("status");
                beats += 1;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        beats
    });
    assert_eq!(node_events(&receiver, Duration::from_secs(2)).len(), 0, "{beats} heartbeats reached the controller");

    cluster.apply(&json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-b", "labels": {"topology.kubernetes.io/zone": "zone-x"}},
    }));
    match node_events(&receiver, Duration::from_secs(3)).as_slice() {
        [SourceEvent::Apply(Object::Node(node))] => {
            assert_eq!((node.name.as_str(), node.zone()), ("node-b", Some("zone-x")))
        }
        other => panic!("only the label change reaches the controller: {other:?}"),
    }
    stop(&cluster, source, &shutdown);
}
