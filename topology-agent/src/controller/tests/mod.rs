//! The control loop with events injected directly, programming the real writer over in-memory
//! maps ([`recording::MemoryKernel`]).

use std::{collections::BTreeSet, net::IpAddr, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

mod initial;
mod scenarios;

use topology_kube::{EventSender, Invalid, Object, SourceEvent, events::LogOnly};
use topology_model::{EndpointSlice, Kind, ObjectError, Protocol, Service};
use topology_policy::{
    desired::ServicePort,
    testing::{self, ServiceExt},
};

use super::{recording::MemoryKernel, *};

type Recording = recording::Record;

fn node(name: &str, zone: &str) -> Object {
    Object::Node(testing::node(name, zone, ""))
}

/// `ns/<name>`, port `http` 80 on `vip`.
fn service(name: &str, vip: &str) -> Service {
    testing::service(name).at("ns", vip)
}

/// `ns/<name>` of `service`, port `http` 8080, a ready endpoint on node `a` per address.
fn slice(name: &str, service: &str, addresses: &[&str]) -> EndpointSlice {
    testing::slice(name, service, 8080, addresses.iter().map(|address| testing::ep(address, "a")).collect())
}

fn replace(kind: Kind, objects: Vec<Object>) -> SourceEvent {
    SourceEvent::Replace { kind, objects, invalid: vec![] }
}

fn port(vip: &str) -> ServicePort {
    ServicePort { vip: vip.parse::<IpAddr>().unwrap(), port: 80, protocol: Protocol::Tcp }
}

fn addresses(recording: &Recording, vip: &str) -> Option<Vec<String>> {
    recording.addresses(&port(vip))
}

/// Queues `events`, runs the controller until they are handled, and returns what it recorded.
fn run(events: Vec<SourceEvent>) -> Recording {
    let (sender, receiver) = EventSender::channel();
    for event in events {
        sender.send(event);
    }
    drop(sender);
    let controller = Controller::new(
        ControllerConfig { reconcile_interval: Duration::from_secs(3600), ..ControllerConfig::new("a") },
        MemoryKernel::default(),
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    );
    // With every sender gone, the loop ends once the queue is drained.
    controller.run(&receiver, &CancellationToken::new()).expect("controller").into_record()
}

/// A controller running on its own thread, fed through `sender`, until `stop`.
struct Live {
    sender: EventSender,
    kernel: MemoryKernel,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    thread: std::thread::JoinHandle<Result<MemoryKernel, ControllerError>>,
}

impl Live {
    /// Starts a controller for node `a` with `events` already queued.
    fn start(events: impl IntoIterator<Item = SourceEvent>) -> Self {
        let (sender, receiver) = EventSender::channel();
        for event in events {
            sender.send(event);
        }
        let kernel = MemoryKernel::default();
        let health = Arc::new(Health::default());
        let metrics = Arc::new(Metrics::default());
        let controller = Controller::new(
            ControllerConfig::new("a"),
            kernel.clone(),
            Arc::clone(&health),
            Arc::clone(&metrics),
            Box::new(LogOnly),
        );
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let thread = std::thread::spawn(move || controller.run(&receiver, &token));
        Self { sender, kernel, health, metrics, shutdown, thread }
    }

    /// Waits up to 5 s for `check` to hold on what was recorded.
    fn wait(&self, check: impl Fn(&Recording) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !check(&self.kernel.record()) {
            assert!(std::time::Instant::now() < deadline, "{:?}", self.kernel.record().current);
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(self) {
        self.shutdown.cancel();
        self.thread.join().unwrap().unwrap();
    }
}

fn initial() -> Vec<SourceEvent> {
    vec![
        replace(Kind::Node, vec![node("a", "z1")]),
        replace(
            Kind::Service,
            vec![Object::Service(service("web", "10.96.0.1")), Object::Service(service("api", "10.96.0.2"))],
        ),
        replace(
            Kind::EndpointSlice,
            vec![
                Object::EndpointSlice(slice("web-1", "web", &["10.1.0.1"])),
                Object::EndpointSlice(slice("api-1", "api", &["10.2.0.1"])),
            ],
        ),
    ]
}

#[test]
fn a_queued_burst_is_programmed_in_one_batch() {
    let mut events = initial();
    for i in 0..500 {
        let address = format!("10.1.{}.{}", i / 200, i % 200 + 1);
        events.push(SourceEvent::Apply(Object::EndpointSlice(slice("web-1", "web", &[address.as_str()]))));
    }
    let recording = run(events);
    assert_eq!((recording.full, recording.partial.len()), (1, 0), "one full programming, nothing else");
    assert_eq!(addresses(&recording, "10.96.0.1"), Some(vec!["10.1.2.100".to_owned()]), "the last update wins");
}

#[test]
fn node_heartbeats_cost_no_recompute() {
    let live = Live::start(initial());
    live.wait(|r| r.full == 1);
    let recomputed = live.metrics.control.services_recomputed.get();
    assert_eq!(recomputed, 2, "the full sync decides both Services");
    // A heartbeat converts to the Node the state holds: this node's and another's.
    for _ in 0..100 {
        live.sender.send(SourceEvent::Apply(node("a", "z1")));
        live.sender.send(SourceEvent::Apply(node("b", "z2")));
    }
    live.sender.send(SourceEvent::Apply(Object::EndpointSlice(slice("web-1", "web", &["10.1.0.9"]))));
    live.wait(|r| r.partial.len() == 1);
    assert_eq!(live.metrics.control.services_recomputed.get(), recomputed + 1, "only the slice's Service");
    // The first sight of b joined the demand; its repeats did nothing.
    assert_eq!(live.kernel.record().full, 1);
    live.stop();
}

#[test]
fn nothing_is_programmed_until_every_kind_is_listed() {
    let mut events = initial();
    events.remove(2);
    let recording = run(events);
    assert_eq!(recording.full + recording.partial.len(), 0);
}

#[test]
fn later_changes_apply_only_the_affected_ports() {
    let live = Live::start(initial());
    let recording = &live.kernel;
    live.wait(|r| r.full == 1);
    // The loop books the apply after it returns.
    live.wait(|_| live.health.readiness().is_ok());
    live.sender.send(SourceEvent::Apply(Object::EndpointSlice(slice("web-1", "web", &["10.1.0.9"]))));
    live.wait(|r| r.partial.len() == 1);
    assert_eq!(recording.record().partial[0], BTreeSet::from([port("10.96.0.1")]), "api is not touched");
    // A Node label change of another node touches the Services with endpoints there.
    live.sender.send(SourceEvent::Apply(node("b", "z2")));
    live.sender.send(SourceEvent::Apply(node("b", "z3")));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(recording.record().partial.len(), 1, "no endpoint on b, nothing to recompute");
    live.stop();
}

#[test]
fn a_relist_keeps_the_last_good_version_of_an_invalid_object() {
    let mut events = initial();
    let error = ObjectError {
        kind: Kind::Service,
        name: "ns/web".into(),
        field: "spec.clusterIPs[0]".into(),
        message: "bad".into(),
    };
    let invalid = Invalid {
        id: ObjectId::Service(ObjectKey::new("ns", "web")),
        service: Some(ObjectKey::new("ns", "web")),
        error,
    };
    // The relist no longer has `api` (deleted) and cannot read `web`.
    events.push(SourceEvent::Replace { kind: Kind::Service, objects: vec![], invalid: vec![invalid] });
    let recording = run(events);
    assert_eq!(
        addresses(&recording, "10.96.0.1"),
        Some(vec!["10.1.0.1".to_owned()]),
        "web keeps its last good version"
    );
    assert_eq!(addresses(&recording, "10.96.0.2"), None, "api is gone");
}

#[test]
fn two_services_claiming_one_cluster_ip_do_not_fight() {
    // Within one batch the Service whose name sorts first holds the port; later claims wait.
    let mut events = initial();
    events.push(SourceEvent::Apply(Object::Service(service("zz-copy", "10.96.0.1"))));
    events.push(SourceEvent::Apply(Object::EndpointSlice(slice("copy-1", "zz-copy", &["10.9.0.1"]))));
    let recording = run(events);
    assert_eq!(addresses(&recording, "10.96.0.1"), Some(vec!["10.1.0.1".to_owned()]), "the holder keeps it");

    let mut events = initial();
    events.push(SourceEvent::Apply(Object::Service(service("zz-copy", "10.96.0.1"))));
    events.push(SourceEvent::Apply(Object::EndpointSlice(slice("copy-1", "zz-copy", &["10.9.0.1"]))));
    events.push(SourceEvent::Delete(ObjectId::Service(ObjectKey::new("ns", "web"))));
    let recording = run(events);
    assert_eq!(
        addresses(&recording, "10.96.0.1"),
        Some(vec!["10.9.0.1".to_owned()]),
        "released to the waiting Service"
    );
}

#[test]
fn a_demand_change_anywhere_recomputes_the_spillover_services() {
    // web spills by capacity over an endpoint in z1 (on a) and two in z2 (on b); api does not.
    let mut web = service("web", "10.96.0.1");
    web.agent_annotations.insert(topology_policy::policy::spillover::ANNOTATION_SPILLOVER.into(), "capacity".into());
    let mut web_slice = slice("web-1", "web", &["10.1.0.1", "10.1.0.2", "10.1.0.3"]);
    for endpoint in &mut web_slice.endpoints[1..] {
        endpoint.node_name = Some("b".into());
    }
    let live = Live::start([
        replace(Kind::Node, vec![node("a", "z1"), node("b", "z2")]),
        replace(Kind::Service, vec![Object::Service(web), Object::Service(service("api", "10.96.0.2"))]),
        replace(
            Kind::EndpointSlice,
            vec![Object::EndpointSlice(web_slice), Object::EndpointSlice(slice("api-1", "api", &["10.2.0.1"]))],
        ),
    ]);
    let recording = &live.kernel;
    let kept = |r: &Recording| {
        let backends = &r.current.services[&port("10.96.0.1")].backends;
        let total: f64 = backends.iter().map(|b| f64::from(b.weight)).sum();
        f64::from(backends[0].weight) / total
    };
    live.wait(|r| r.full == 1);
    // Demand 50/50, endpoints 1/2: z1 keeps 1.1/3 of all traffic, 73 % of its own.
    let before = kept(&recording.record());
    assert!((before - 1.1 / 3.0 / 0.5).abs() < 1e-5, "{before}");
    // A new node in z1 (no endpoint on it) triples z1's demand share: z1 now keeps less of its
    // own traffic, and only web is re-programmed.
    live.sender.send(SourceEvent::Apply(node("c", "z1")));
    live.wait(|r| r.partial.len() == 1);
    assert_eq!(recording.record().partial[0], BTreeSet::from([port("10.96.0.1")]));
    let after = kept(&recording.record());
    assert!((after - 1.1 / 3.0 / (2.0 / 3.0)).abs() < 1e-5, "{after}");
    // A label-only change that leaves the demand as it was recomputes nothing.
    let Object::Node(mut relabelled) = node("c", "z1") else { unreachable!() };
    relabelled.labels.insert("team", "x");
    live.sender.send(SourceEvent::Apply(Object::Node(relabelled)));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(recording.record().partial.len(), 1);
    live.stop();
}

#[test]
fn an_unusable_own_node_is_an_error_naming_its_field_not_node_not_found() {
    let error = topology_model::ObjectError {
        kind: Kind::Node,
        name: "a".into(),
        field: "status.allocatable.cpu".into(),
        message: "\"lots\" is not a quantity".into(),
    };
    let invalid = Invalid { id: ObjectId::Node("a".into()), service: None, error };
    let (sender, receiver) = EventSender::channel();
    sender.send(SourceEvent::Replace { kind: Kind::Node, objects: vec![], invalid: vec![invalid] });
    for kind in [Kind::Service, Kind::EndpointSlice] {
        sender.send(replace(kind, vec![]));
    }
    drop(sender);
    let controller = Controller::new(
        ControllerConfig::new("a"),
        MemoryKernel::default(),
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    );
    let Err(error) = controller.run(&receiver, &CancellationToken::new()) else { panic!("must stop") };
    assert_eq!(
        error.to_string(),
        "this node's Node object cannot be used: Node a: status.allocatable.cpu: \"lots\" is not a quantity; the \
         agent cannot route without knowing where it is"
    );
}

#[test]
fn the_dns_view_follows_the_cluster() {
    let (sender, receiver) = EventSender::channel();
    let mut db = service("db", "10.96.0.9");
    db.cluster_ips.clear();
    db.headless = true;
    sender.send(replace(Kind::Node, vec![node("a", "z1")]));
    sender.send(replace(Kind::Service, vec![Object::Service(db), Object::Service(service("web", "10.96.0.1"))]));
    sender.send(replace(Kind::EndpointSlice, vec![Object::EndpointSlice(slice("db-1", "db", &["10.1.0.1"]))]));
    sender.send(SourceEvent::Apply(Object::EndpointSlice(slice("db-1", "db", &["10.1.0.1", "10.1.0.2"]))));
    drop(sender);
    let (publisher, view) = topology_dns::DnsPublisher::new(Vec::new());
    let controller = Controller::new(
        ControllerConfig { reconcile_interval: Duration::from_secs(3600), ..ControllerConfig::new("a") },
        MemoryKernel::default(),
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    )
    .with_dns(Some(publisher));
    controller.run(&receiver, &CancellationToken::new()).expect("controller");
    let published = Arc::clone(&view.borrow());
    let Some(topology_dns::view::Records::Headless(db)) = published.service("ns", "db") else {
        panic!("db is answered as headless: {published:?}");
    };
    let chosen: Vec<String> = db.addresses.choices.iter().map(|c| c.address.to_string()).collect();
    assert_eq!(chosen, ["10.1.0.1", "10.1.0.2"], "the slice update reached the view");
    assert!(matches!(published.service("ns", "web"), Some(topology_dns::view::Records::ClusterIp { .. })));
}

/// The `_count` and `_sum` of `topology_agent_network_programming_duration_seconds`.
fn programming(metrics: &Metrics) -> (u64, f64) {
    let text = metrics.encode();
    let value = |suffix: &str| {
        let name = format!("topology_agent_network_programming_duration_seconds_{suffix} ");
        text.lines().find_map(|line| line.strip_prefix(name.as_str())?.parse::<f64>().ok()).unwrap_or(-1.0)
    };
    (value("count") as u64, value("sum"))
}

#[test]
fn a_slice_change_is_measured_from_its_stamp_to_the_kernel() {
    let now = std::time::SystemTime::now();
    let stamped = |name: &str, address: &str, ago: u64| {
        let mut slice = slice(name, "web", &[address]);
        slice.changed_at = Some(now - Duration::from_secs(ago));
        Object::EndpointSlice(slice)
    };
    let mut events = initial();
    // Stamped, but taken in by the first sync: not measured, as kube-proxy.
    events.push(SourceEvent::Apply(stamped("web-1", "10.1.0.7", 600)));
    let live = Live::start(events);
    live.wait(|r| r.full == 1);
    assert_eq!(programming(&live.metrics), (0, 0.0));
    live.sender.send(SourceEvent::Apply(stamped("web-1", "10.1.0.8", 2)));
    live.wait(|r| r.partial.len() == 1);
    // Observed right after the apply the recording shows.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while programming(&live.metrics).0 == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (count, sum) = programming(&live.metrics);
    assert_eq!(count, 1);
    assert!((2.0..5.0).contains(&sum), "{sum} s from a stamp 2 s old");
    // The same slice again changes nothing: nothing to measure; no stamp, nothing measured.
    live.sender.send(SourceEvent::Apply(stamped("web-1", "10.1.0.8", 2)));
    live.sender.send(SourceEvent::Apply(Object::EndpointSlice(slice("web-1", "web", &["10.1.0.9"]))));
    live.wait(|r| r.partial.len() == 2);
    let metrics = Arc::clone(&live.metrics);
    live.stop();
    assert_eq!(programming(&metrics).0, 1);
}
