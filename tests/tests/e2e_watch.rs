//! The agent's watch and controller, in this process, against the real API server with a token
//! of the deploy's own ServiceAccount (root: the control plane's namespace): adds, updates and
//! deletes of every kind the agent reads — Services, the slices the real EndpointSlice controller
//! writes from Pod objects, this Node and the others — reach what it programs; a burst of 1,000
//! Service updates converges to the last; a configuration it ignores, and any problem from a node
//! with the longest name, is reported in Events the real API server validates and admits; an
//! unknown node stops it with a clear error. The kernel is in-memory maps here: these tests are
//! about the watch (the e2e tier proves the kernel). `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    time::{Duration, Instant},
};

use k8s_openapi::api::{core::v1::Service, events::v1::Event};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams},
};
use serde_json::{Value, json};
use topology_kube::events::{KubeEvents, Problem, ProblemSink as _};
use topology_model::ObjectKey;
use topology_policy::desired::DesiredState;
use topology_tests::{
    kubernetes::{
        Binaries, Cluster,
        in_process::InProcessAgent,
        nodes::NodeSpec,
        pods::{Pod, PodSpec, echo_service},
    },
    require_root,
};

const NS: &str = "watch";

/// Two nodes, a (zone-a) and b (zone-b); the namespace; the deploy's objects (its RBAC).
fn cluster() -> Option<Cluster> {
    let binaries = Binaries::or_skip(module_path!())?;
    let cluster = Cluster::start(binaries, &[NodeSpec::new("node-a", "zone-a"), NodeSpec::new("node-b", "zone-b")]);
    cluster.namespace(NS);
    cluster.deploy();
    Some(cluster)
}

/// A Service selecting the `echo` pods, `extra` merged in; its ClusterIP, as the server gave it.
fn service(cluster: &Cluster, name: &str, extra: &Value) -> IpAddr {
    let stored = cluster.apply(&echo_service(NS, name, extra));
    stored["spec"]["clusterIP"].as_str().and_then(|ip| ip.parse().ok()).expect("a ClusterIP")
}

/// An `echo` pod on `node`, Running and Ready (no process: the kernel is not in this test).
fn ready_pod(cluster: &Cluster, node: &str, name: &str) -> Pod {
    let pod = cluster.create_pod(node, PodSpec::new(NS, name, "echo", &[8080]));
    cluster.report(&pod, true);
    pod
}

/// Backend addresses programmed for `vip` on port 80; `None` when it is not programmed.
fn backends(desired: &DesiredState, vip: IpAddr) -> Option<BTreeSet<IpAddr>> {
    desired
        .services
        .iter()
        .find(|(port, _)| port.vip == vip && port.port == 80)
        .map(|(_, service)| service.backends.iter().map(|b| b.addr).collect())
}

fn pods(pods: &[&Pod]) -> Option<BTreeSet<IpAddr>> {
    Some(pods.iter().map(|pod| IpAddr::V4(pod.ip)).collect())
}

/// Server-side applies `labels` (every label this test manages on the Node) to Node `name`.
fn label_node(cluster: &Cluster, name: &str, labels: &[(&str, &str)]) {
    let labels: serde_json::Map<String, Value> = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).into())).collect();
    cluster.apply(&json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}));
}

fn kubectl(cluster: &Cluster, args: &[&str]) {
    cluster.kubectl(args).unwrap_or_else(|error| panic!("kubectl {args:?}: {error}"));
}

#[test]
fn adds_updates_and_deletes_of_every_kind_reach_what_is_programmed() {
    require_root!();
    let Some(mut cluster) = cluster() else { return };
    let agent = InProcessAgent::start(&cluster, &cluster.agent_client(), "node-a");
    let a1 = ready_pod(&cluster, "node-a", "a1");
    let b1 = ready_pod(&cluster, "node-b", "b1");
    let web = service(&cluster, "web", &json!({"spec": {"trafficDistribution": "PreferClose"}}));
    agent.wait_for("this zone's pod, by the controller's hints", |d| backends(d, web) == pods(&[&a1]));
    assert_eq!(agent.readiness(), Ok(()));

    // Services: added (no pods: refuse), updated (no preference: every pod), deleted.
    let api = service(&cluster, "api", &json!({"spec": {"selector": {"app": "api"}}}));
    agent.wait_for("a Service without pods refuses", |d| backends(d, api) == Some(BTreeSet::new()));
    service(&cluster, "web", &json!({}));
    agent.wait_for("the Service's preference removed", |d| backends(d, web) == pods(&[&a1, &b1]));
    kubectl(&cluster, &["-n", NS, "delete", "service", "api"]);
    agent.wait_for("the Service deleted", |d| backends(d, api).is_none());

    // Pods, through the slices the controller writes: one added, one gone, one not ready.
    let b2 = ready_pod(&cluster, "node-b", "b2");
    agent.wait_for("a pod added", |d| backends(d, web) == pods(&[&a1, &b1, &b2]));
    cluster.remove_pod(a1);
    agent.wait_for("a pod gone", |d| backends(d, web) == pods(&[&b1, &b2]));
    cluster.report(&b1, false);
    agent.wait_for("a pod not ready", |d| backends(d, web) == pods(&[&b2]));
    cluster.remove_pod(b1);
    cluster.remove_pod(b2);
    agent.wait_for("no pod left: refuse", |d| backends(d, web) == Some(BTreeSet::new()));

    // This Node: a hard key on zones refuses node-b's pod until this node moves into zone-b.
    let keyed = |keys: &str| json!({"metadata": {"annotations": {"topology-agent.io/topology-keys": keys}}});
    service(&cluster, "web", &keyed("topology.kubernetes.io/zone"));
    let c1 = ready_pod(&cluster, "node-b", "c1");
    agent.wait_for("the zone key refuses another zone's pod", |d| backends(d, web) == Some(BTreeSet::new()));
    label_node(&cluster, "node-a", &[("topology.kubernetes.io/zone", "zone-b")]);
    agent.wait_for("this node's new zone", |d| backends(d, web) == pods(&[&c1]));

    // Other Nodes, watched while a key names a label only Nodes carry: node-b in this node's rack
    // makes its pod close, and out of it far again.
    label_node(&cluster, "node-a", &[("topology.kubernetes.io/zone", "zone-b"), ("example.com/rack", "r1")]);
    service(&cluster, "web", &keyed("example.com/rack"));
    agent.wait_for("node-b in no rack", |d| backends(d, web) == Some(BTreeSet::new()));
    label_node(&cluster, "node-b", &[("example.com/rack", "r1")]);
    agent.wait_for("node-b in this node's rack", |d| backends(d, web) == pods(&[&c1]));
    let node_c = cluster.add_node(NodeSpec::new("node-c", "zone-b")).spec.name.clone();
    label_node(&cluster, &node_c, &[("example.com/rack", "r1")]);
    label_node(&cluster, "node-b", &[]);
    agent.wait_for("node-b out of the rack", |d| backends(d, web) == Some(BTreeSet::new()));
    assert_eq!(agent.readiness(), Ok(()), "every step came through the watches, fresh");
}

#[test]
fn a_burst_of_1000_service_updates_converges_to_the_last() {
    require_root!();
    let Some(cluster) = cluster() else { return };
    let agent = InProcessAgent::start(&cluster, &cluster.agent_client(), "node-a");
    let a1 = ready_pod(&cluster, "node-a", "a1");
    let b1 = ready_pod(&cluster, "node-b", "b1");
    let web = service(&cluster, "web", &json!({"spec": {"trafficDistribution": "PreferClose"}}));
    agent.wait_for("this zone's pod", |d| backends(d, web) == pods(&[&a1]));
    let before = agent.applies();
    let admin = cluster.admin();
    let started = Instant::now();
    cluster.api().block(async move {
        let services: Api<Service> = Api::namespaced(admin, NS);
        // Preference on, off, on, ... ending off: the last of 1,000 updates has none.
        for round in 0..1000 {
            let distribution = if round % 2 == 0 { json!("PreferClose") } else { Value::Null };
            let patch = json!({"spec": {"trafficDistribution": distribution}});
            services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("a Service update");
        }
    });
    eprintln!("1000 Service updates made in {:.1} s", started.elapsed().as_secs_f64());
    agent.wait_for("the last update of the burst", |d| backends(d, web) == pods(&[&a1, &b1]));
    let applies = agent.applies() - before;
    eprintln!("1000 updates programmed in {applies} applies");
    assert!(applies <= 1000, "never more applies than updates: {applies}");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(backends(&agent.current(), web), pods(&[&a1, &b1]), "and it stays at the last");
}

/// The Events of the namespace: `(reason, note, regarding name, type, series count)`.
fn events(cluster: &Cluster) -> Vec<(String, String, String, String, i32)> {
    let admin = cluster.admin();
    let listed = cluster.api().block(async move {
        Api::<Event>::namespaced(admin, NS).list(&ListParams::default()).await.expect("listing Events")
    });
    listed
        .items
        .into_iter()
        .map(|event| {
            let regarding = event.regarding.and_then(|r| r.name).unwrap_or_default();
            let count = event.series.map_or(1, |series| series.count);
            (
                event.reason.unwrap_or_default(),
                event.note.unwrap_or_default(),
                regarding,
                event.type_.unwrap_or_default(),
                count,
            )
        })
        .collect()
}

fn wait_events(cluster: &Cluster, what: &str, done: impl Fn(&[(String, String, String, String, i32)]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let events = events(cluster);
        if done(&events) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: only {events:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn what_the_agent_ignores_is_reported_in_events_the_real_api_server_admits() {
    require_root!();
    let Some(cluster) = cluster() else { return };
    let client = cluster.agent_client();
    let agent = InProcessAgent::start(&cluster, &client, "node-a");
    let a1 = ready_pod(&cluster, "node-a", "a1");
    // An invalid topology-keys annotation ("*" must be last): ignored as a whole, reported, and
    // the Service programmed as if it were absent.
    let keys = json!({"metadata": {"annotations": {"topology-agent.io/topology-keys": "*,kubernetes.io/hostname"}}});
    let web = service(&cluster, "web", &keys);
    agent.wait_for("the Service, its keys ignored", |d| backends(d, web) == pods(&[&a1]));
    wait_events(&cluster, "the ignored keys reported", |events| {
        events.iter().any(|(reason, note, regarding, kind, _)| {
            reason == "IgnoredConfiguration"
                && note.contains("topology-keys ignored")
                && note.contains("\"*\" must be the last key")
                && regarding == "web"
                && kind == "Warning"
        })
    });

    // From a node with the longest name a node may have (253) and a note far past the limit: the
    // real API server validates the Event (`reportingInstance` at most 128, `note` at most 1 kB)
    // and admits it; the same problem again patches its series, which is validated too.
    let node = format!("{}.example.internal", "n".repeat(236));
    assert_eq!(node.len(), 253);
    let runtime = cluster.runtime();
    let (sink, _task) = {
        let _entered = runtime.enter();
        KubeEvents::start(client.clone(), &node)
    };
    let problem = Problem {
        service: ObjectKey::new(NS, "web"),
        reason: "MapFull",
        message: format!("spec.ports[0].port: {}", "é".repeat(900)),
    };
    sink.publish(&problem);
    wait_events(&cluster, "the long node's Event admitted", |events| {
        events.iter().any(|(reason, note, ..)| reason == "MapFull" && note.len() <= 1024)
    });
    sink.publish(&problem);
    wait_events(&cluster, "the repeat counted in the Event's series", |events| {
        events.iter().any(|(reason, .., count)| reason == "MapFull" && *count == 2)
    });
    let repeats = events(&cluster).iter().filter(|(reason, ..)| reason == "MapFull").count();
    assert_eq!(repeats, 1, "one Event, counted");
}

#[test]
fn an_unknown_node_stops_the_controller_with_a_clear_error() {
    require_root!();
    let Some(cluster) = cluster() else { return };
    let mut agent = InProcessAgent::start(&cluster, &cluster.agent_client(), "node-z");
    let Err(error) = agent.ended(Duration::from_secs(30)) else { panic!("an unknown node must stop the controller") };
    assert!(error.to_string().contains("node \"node-z\" is not in the cluster"), "{error}");
    assert_eq!(agent.applies(), 0, "nothing was programmed");
}
