//! The full sync of a large cluster through the real kernel (root): deciding and writing on two
//! threads over the maps a previous agent left — its stale Service removed, its changed one
//! swapped, every other port written once — and connections reach the backends the plan chose.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use tokio_util::sync::CancellationToken;
use topology_agent::{
    controller::{Controller, ControllerConfig, Health, Observation, PIPELINE_FROM, Programmer},
    metrics::Metrics,
};
use topology_dataplane::{ApplyReport, Dataplane};
use topology_kube::{EventSender, Object, SourceEvent, events::LogOnly};
use topology_model::{Kind, Protocol};
use topology_policy::{
    desired::{DesiredService, DesiredState, ServicePort},
    testing::{self, ServiceExt, SliceExt},
};
use topology_tests::{
    fixture::{BACKEND_PORT, Fixture, service},
    require_root,
};

/// Services in the cluster: enough for the two-thread full sync.
const SERVICES: usize = PIPELINE_FROM + 200;
/// A port only the previous agent programmed.
const STALE: &str = "10.96.250.1";

fn vip(index: usize) -> String {
    format!("10.96.{}.{}", index / 200, index % 200 + 1)
}

/// What the controller asked of the dataplane, and on which thread.
#[derive(Debug, Default)]
struct Calls {
    /// (thread, ports) of every partial apply.
    partial: Vec<(String, usize)>,
    /// (added, updated, removed, failed) of each apply that ended a full sync.
    completed: Vec<(usize, usize, usize, usize)>,
}

fn summary(report: &ApplyReport) -> (usize, usize, usize, usize) {
    (report.added, report.updated, report.removed, report.failed.len())
}

/// The real dataplane, its calls recorded.
struct Recorded {
    dataplane: Dataplane,
    calls: Arc<Mutex<Calls>>,
}

impl Programmer for Recorded {
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        let report = self.dataplane.apply(desired);
        self.calls.lock().unwrap().completed.push(summary(&report));
        report
    }

    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport {
        let thread = std::thread::current().name().unwrap_or("unnamed").to_owned();
        self.calls.lock().unwrap().partial.push((thread, changed.len()));
        Programmer::apply_changes(&mut self.dataplane, desired, changed)
    }

    fn complete(&mut self, desired: &DesiredState, retry: &BTreeSet<ServicePort>) -> ApplyReport {
        let report = self.dataplane.complete(desired, retry);
        self.calls.lock().unwrap().completed.push(summary(&report));
        report
    }

    fn reserve(&mut self, ports: usize) {
        Programmer::reserve(&mut self.dataplane, ports);
    }

    fn observe(&mut self) -> Observation {
        self.dataplane.observe()
    }
}

/// The cluster: one node, `SERVICES` Services each with one slice of both backends.
fn cluster(fx: &Fixture) -> Vec<SourceEvent> {
    let node = testing::node("node-a", "z1", "");
    let services =
        (0..SERVICES).map(|i| Object::Service(testing::service(&format!("svc-{i:05}")).at("bench", &vip(i))));
    let endpoints: Vec<_> =
        fx.backends.iter().map(|backend| testing::ep(&backend.addr(false).to_string(), "node-a")).collect();
    let slices = (0..SERVICES).map(|i| {
        let name = format!("svc-{i:05}");
        Object::EndpointSlice(
            testing::slice(&format!("{name}-x1"), &name, BACKEND_PORT, endpoints.clone()).within("bench"),
        )
    });
    let replace = |kind, objects: Vec<Object>| SourceEvent::Replace { kind, objects, invalid: vec![] };
    vec![
        replace(Kind::Node, vec![Object::Node(node)]),
        replace(Kind::Service, services.collect()),
        replace(Kind::EndpointSlice, slices.collect()),
    ]
}

#[test]
fn a_large_full_sync_over_a_previous_agents_maps_writes_while_it_decides_and_removes_the_stale() {
    require_root!();
    let fx = Fixture::new(2);
    // The previous agent: a Service since deleted, and svc-00000 on b1 alone.
    let mut previous = DesiredState::default();
    for (ip, backend) in [(STALE.to_owned(), &fx.backends[0]), (vip(0), &fx.backends[1])] {
        let service = DesiredService {
            name: format!("bench/{ip}"),
            backends: vec![backend.weighted(false, 1)],
            ..Default::default()
        };
        previous.services.insert(service_port(&ip), service);
    }
    Dataplane::open(&fx.config()).expect("open").apply(&previous);

    let (events, receiver) = EventSender::channel();
    for event in cluster(&fx) {
        events.send(event);
    }
    drop(events);
    let calls = Arc::new(Mutex::new(Calls::default()));
    let dataplane = Dataplane::open(&fx.config()).expect("adopt the previous agent's maps");
    let controller = Controller::new(
        ControllerConfig { reconcile_interval: Duration::from_secs(3600), ..ControllerConfig::new("node-a") },
        Recorded { dataplane, calls: Arc::clone(&calls) },
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    );
    // Every sender gone: the loop ends once the queue is handled.
    let programmer = controller.run(&receiver, &CancellationToken::new()).expect("controller");

    let calls = calls.lock().unwrap();
    let threads: BTreeSet<&str> = calls.partial.iter().map(|(thread, _)| thread.as_str()).collect();
    assert_eq!(threads, BTreeSet::from(["topology-writer"]), "written on the writer thread: {calls:?}");
    assert!(calls.partial.len() >= 2, "written in pieces while deciding: {calls:?}");
    assert_eq!(calls.partial.iter().map(|(_, ports)| ports).sum::<usize>(), SERVICES, "each port handed over once");
    let [completed] = &calls.completed[..] else { panic!("one completion: {calls:?}") };
    assert_eq!(*completed, (0, 0, 1, 0), "completing removes the stale port and writes nothing else");
    drop(programmer);

    let snapshot = topology_dataplane::read_pins(fx.pins.path()).expect("snapshot");
    assert_eq!(snapshot.kernel.services.len(), SERVICES);
    assert!(!snapshot.kernel.services.contains_key(&service_port(STALE)));
    let place = fx.place();
    for index in [0, SERVICES - 1] {
        let report = place.tcp(SocketAddr::new(vip(index).parse::<IpAddr>().unwrap(), 80), 40);
        assert_eq!(report.successes(), 40, "svc-{index}: {report:?}");
        for backend in &fx.backends {
            assert!(report.landed_on(&backend.name) > 0, "svc-{index} reaches {}: {report:?}", backend.name);
        }
    }
    let gone = place.tcp(SocketAddr::new(STALE.parse().unwrap(), 80), 3);
    assert_eq!(gone.errno("ENETUNREACH"), 3, "the stale port is no longer rewritten: {gone:?}");
}

fn service_port(ip: &str) -> ServicePort {
    service(ip, 80, Protocol::Tcp)
}
