//! The control loop with events injected directly and a recording programmer.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::IpAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio_util::sync::CancellationToken;

mod initial;
mod scenarios;

use super::*;
use crate::{
    cluster::{Endpoint, EndpointSlice, Family, Node, ObjectError, PortSpec as SvcPort, Service, SlicePort},
    dataplane::ApplyReport,
    desired::{DesiredState, Protocol, ServicePort},
    events::LogOnly,
    source::{EventSender, Object, SourceEvent},
};

#[derive(Debug, Default)]
struct Recording {
    current: DesiredState,
    full: usize,
    partial: Vec<BTreeSet<ServicePort>>,
    /// What the partial applies had programmed when the first full apply came.
    before_full: Option<DesiredState>,
    /// Threads the partial applies ran on.
    partial_threads: BTreeSet<String>,
}

struct Recorder(Arc<Mutex<Recording>>);

impl Programmer for Recorder {
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        let mut recording = self.0.lock().unwrap();
        if recording.before_full.is_none() {
            recording.before_full = Some(recording.current.clone());
        }
        recording.current = desired.clone();
        recording.full += 1;
        ApplyReport::default()
    }

    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport {
        let mut recording = self.0.lock().unwrap();
        for port in changed {
            match desired.services.get(port) {
                Some(service) => recording.current.services.insert(*port, service.clone()),
                None => recording.current.services.remove(port),
            };
        }
        recording.partial.push(changed.clone());
        let thread = std::thread::current().name().unwrap_or("unnamed").to_owned();
        recording.partial_threads.insert(thread);
        ApplyReport::default()
    }

    fn observe(&self) -> Observation {
        Observation::default()
    }
}

fn node(name: &str, zone: &str) -> Object {
    let labels = BTreeMap::from([("topology.kubernetes.io/zone".to_owned(), zone.to_owned())]);
    Object::Node(Node { name: name.into(), labels: labels.into(), allocatable_cpu_millis: 1000, ready: true })
}

fn service(name: &str, vip: &str) -> Service {
    Service {
        key: ObjectKey::new("ns", name),
        cluster_ips: vec![vip.parse().unwrap()],
        headless: false,
        ports: vec![SvcPort { name: "http".into(), port: 80, protocol: Protocol::Tcp }],
        internal_traffic_local: false,
        session_affinity_timeout_s: None,
        traffic_distribution: None,
        topology_keys: None,
        topology_mode: None,
        agent_annotations: BTreeMap::new(),
        external_name: None,
        other_proxy: None,
    }
}

fn slice(name: &str, service: &str, addresses: &[&str]) -> EndpointSlice {
    EndpointSlice {
        key: ObjectKey::new("ns", name),
        service: Some(ObjectKey::new("ns", service)),
        family: Family::V4,
        ports: vec![SlicePort { name: "http".into(), port: 8080, protocol: Protocol::Tcp }],
        endpoints: addresses
            .iter()
            .map(|a| Endpoint {
                address: a.parse().unwrap(),
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some("a".into()),
                zone: None,
                extra: None,
            })
            .collect(),
    }
}

fn replace(kind: Kind, objects: Vec<Object>) -> SourceEvent {
    SourceEvent::Replace { kind, objects, invalid: vec![] }
}

fn port(vip: &str) -> ServicePort {
    ServicePort { vip: vip.parse::<IpAddr>().unwrap(), port: 80, protocol: Protocol::Tcp }
}

fn addresses(recording: &Recording, vip: &str) -> Option<Vec<String>> {
    recording.current.services.get(&port(vip)).map(|s| s.backends.iter().map(|b| b.addr.to_string()).collect())
}

/// Queues `events`, runs the controller until they are handled, and returns what it recorded.
fn run(events: Vec<SourceEvent>) -> Recording {
    let (sender, receiver) = EventSender::channel();
    for event in events {
        sender.send(event);
    }
    drop(sender);
    let recording = Arc::new(Mutex::new(Recording::default()));
    let controller = Controller::new(
        ControllerConfig { reconcile_interval: Duration::from_secs(3600), ..ControllerConfig::new("a") },
        Recorder(Arc::clone(&recording)),
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    );
    // With every sender gone, the loop ends once the queue is drained.
    controller.run(&receiver, &CancellationToken::new()).expect("controller");
    Arc::try_unwrap(recording).unwrap().into_inner().unwrap()
}

/// A controller running on its own thread, fed through `sender`, until `stop`.
struct Live {
    sender: EventSender,
    recording: Arc<Mutex<Recording>>,
    health: Arc<Health>,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    thread: std::thread::JoinHandle<Result<Recorder, ControllerError>>,
}

impl Live {
    /// Starts a controller for node `a` with `events` already queued.
    fn start(events: impl IntoIterator<Item = SourceEvent>) -> Self {
        let (sender, receiver) = EventSender::channel();
        for event in events {
            sender.send(event);
        }
        let recording = Arc::new(Mutex::new(Recording::default()));
        let health = Arc::new(Health::default());
        let metrics = Arc::new(Metrics::default());
        let controller = Controller::new(
            ControllerConfig::new("a"),
            Recorder(Arc::clone(&recording)),
            Arc::clone(&health),
            Arc::clone(&metrics),
            Box::new(LogOnly),
        );
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let thread = std::thread::spawn(move || controller.run(&receiver, &token));
        Self { sender, recording, health, metrics, shutdown, thread }
    }

    /// Waits up to 5 s for `check` to hold on what was recorded.
    fn wait(&self, check: impl Fn(&Recording) -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !check(&self.recording.lock().unwrap()) {
            assert!(std::time::Instant::now() < deadline, "{:?}", self.recording.lock().unwrap());
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
    let recomputed = live.metrics.services_recomputed.get();
    assert_eq!(recomputed, 2, "the full sync decides both Services");
    // A heartbeat converts to the Node the state holds: this node's and another's.
    for _ in 0..100 {
        live.sender.send(SourceEvent::Apply(node("a", "z1")));
        live.sender.send(SourceEvent::Apply(node("b", "z2")));
    }
    live.sender.send(SourceEvent::Apply(Object::EndpointSlice(slice("web-1", "web", &["10.1.0.9"]))));
    live.wait(|r| r.partial.len() == 1);
    assert_eq!(live.metrics.services_recomputed.get(), recomputed + 1, "only the slice's Service");
    // The first sight of b joined the demand; its repeats did nothing.
    assert_eq!(live.recording.lock().unwrap().full, 1);
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
    let recording = &live.recording;
    live.wait(|r| r.full == 1);
    assert!(live.health.readiness().is_ok());
    live.sender.send(SourceEvent::Apply(Object::EndpointSlice(slice("web-1", "web", &["10.1.0.9"]))));
    live.wait(|r| r.partial.len() == 1);
    assert_eq!(recording.lock().unwrap().partial[0], BTreeSet::from([port("10.96.0.1")]), "api is not touched");
    // A Node label change of another node touches the Services with endpoints there.
    live.sender.send(SourceEvent::Apply(node("b", "z2")));
    live.sender.send(SourceEvent::Apply(node("b", "z3")));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(recording.lock().unwrap().partial.len(), 1, "no endpoint on b, nothing to recompute");
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
    web.agent_annotations.insert(crate::policy::spillover::ANNOTATION_SPILLOVER.into(), "capacity".into());
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
    let recording = &live.recording;
    let kept = |r: &Recording| {
        let backends = &r.current.services[&port("10.96.0.1")].backends;
        let total: f64 = backends.iter().map(|b| f64::from(b.weight)).sum();
        f64::from(backends[0].weight) / total
    };
    live.wait(|r| r.full == 1);
    // Demand 50/50, endpoints 1/2: z1 keeps 1.1/3 of all traffic, 73 % of its own.
    let before = kept(&recording.lock().unwrap());
    assert!((before - 1.1 / 3.0 / 0.5).abs() < 1e-5, "{before}");
    // A new node in z1 (no endpoint on it) triples z1's demand share: z1 now keeps less of its
    // own traffic, and only web is re-programmed.
    live.sender.send(SourceEvent::Apply(node("c", "z1")));
    live.wait(|r| r.partial.len() == 1);
    assert_eq!(recording.lock().unwrap().partial[0], BTreeSet::from([port("10.96.0.1")]));
    let after = kept(&recording.lock().unwrap());
    assert!((after - 1.1 / 3.0 / (2.0 / 3.0)).abs() < 1e-5, "{after}");
    // A label-only change that leaves the demand as it was recomputes nothing.
    let Object::Node(mut relabelled) = node("c", "z1") else { unreachable!() };
    relabelled.labels.insert("team", "x");
    live.sender.send(SourceEvent::Apply(Object::Node(relabelled)));
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(recording.lock().unwrap().partial.len(), 1);
    live.stop();
}

#[test]
fn an_unusable_own_node_is_an_error_naming_its_field_not_node_not_found() {
    let error = crate::cluster::ObjectError {
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
        Recorder(Arc::default()),
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
    let (publisher, view) = crate::dns::DnsPublisher::new(Vec::new());
    let controller = Controller::new(
        ControllerConfig { reconcile_interval: Duration::from_secs(3600), ..ControllerConfig::new("a") },
        Recorder(Arc::default()),
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    )
    .with_dns(Some(publisher));
    controller.run(&receiver, &CancellationToken::new()).expect("controller");
    let published = Arc::clone(&view.borrow());
    let Some(crate::dns::view::Records::Headless(db)) = published.service("ns", "db") else {
        panic!("db is answered as headless: {published:?}");
    };
    let chosen: Vec<String> = db.addresses.choices.iter().map(|c| c.address.to_string()).collect();
    assert_eq!(chosen, ["10.1.0.1", "10.1.0.2"], "the slice update reached the view");
    assert!(matches!(published.service("ns", "web"), Some(crate::dns::view::Records::ClusterIp { .. })));
}
