//! Golden scenarios through the control loop, without root: each case under
//! `testdata/scenarios/<case>/` is a node, map capacities, optional DNS steering and a sequence of
//! cluster files. The first file is taken in as the initial lists, each later one as the events
//! a watch would bring (every object applied, those gone deleted), and the controller decides
//! and programs the real writer over in-memory maps ([`MemoryKernel`]). After each step:
//! - `expected.plan` keeps the controller's plan as `explain --output json` prints it, and it
//!   must equal the plan built whole from the same file (incremental equals whole);
//! - `expected.maps` keeps what each apply did and the map contents, which must hold the plan;
//! - the DNS view the controller published must be the one built whole from that plan.
//!
//! After a deliberate change, `UPDATE_GOLDEN=1 cargo test -p topology-agent scenarios` rewrites the
//! files; review the diff.

use std::{fmt::Write as _, fs, path::Path, time::Instant};

use serde::Deserialize;
use topology_dataplane::{
    Capacities,
    memory::{assert_programmed, golden},
};
use topology_dns::{DnsPublisher, DnsView};
use topology_model::yaml;
use topology_policy::plan::steering::Steering;

use super::*;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    node: String,
    capacities: Capacities,
    /// `namespace/name` of the cluster DNS Service and the responder's address.
    #[serde(default)]
    steering: Option<(String, std::net::SocketAddr)>,
    steps: Vec<String>,
}

/// Every object of `state`, as a source sends them.
fn objects(state: &ClusterState) -> [(Kind, Vec<Object>); 3] {
    [
        (Kind::Node, state.nodes().cloned().map(Object::Node).collect()),
        (Kind::Service, state.services().cloned().map(Object::Service).collect()),
        (Kind::EndpointSlice, state.slices().cloned().map(Object::EndpointSlice).collect()),
    ]
}

/// The events a watch brings from `before` to `after`: every object applied, those gone deleted.
fn changes(before: &ClusterState, after: &ClusterState) -> Vec<SourceEvent> {
    let ids = |state: &ClusterState| -> BTreeSet<String> {
        objects(state)
            .into_iter()
            .flat_map(|(_, objects)| objects.iter().map(|o| o.id().to_string()).collect::<Vec<_>>())
            .collect()
    };
    let kept = ids(after);
    let mut events: Vec<SourceEvent> = objects(before)
        .into_iter()
        .flat_map(|(_, objects)| objects)
        .filter(|object| !kept.contains(&object.id().to_string()))
        .map(|object| SourceEvent::Delete(object.id()))
        .collect();
    events.extend(objects(after).into_iter().flat_map(|(_, objects)| objects).map(SourceEvent::Apply));
    events
}

/// Runs one case; what `expected.plan` and `expected.maps` should hold.
fn run_case(dir: &Path) -> (String, String) {
    let case: Case = serde_yaml::from_str(&fs::read_to_string(dir.join("case.yaml")).unwrap())
        .unwrap_or_else(|error| panic!("{}/case.yaml: {error}", dir.display()));
    let steering = case.steering.as_ref().map(|(service, responder)| {
        let (namespace, name) = service.split_once('/').expect("steering: namespace/name");
        Steering { service: ObjectKey::new(namespace, name), responder: *responder }
    });
    let kernel = MemoryKernel::new(case.capacities);
    let (publisher, published) = DnsPublisher::new(Vec::new());
    let mut controller = Controller::new(
        ControllerConfig { reconcile_interval: Duration::from_secs(3600), ..ControllerConfig::new(&case.node) },
        kernel,
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    )
    .with_steering(steering.clone())
    .with_dns(Some(publisher));
    let (mut plans, mut maps) = (String::new(), String::new());
    let mut before: Option<ClusterState> = None;
    for step in &case.steps {
        let state = yaml::load(&dir.join(step)).unwrap_or_else(|error| panic!("{error}"));
        let events = match &before {
            None => objects(&state).into_iter().map(|(kind, objects)| replace(kind, objects)).collect(),
            Some(before) => changes(before, &state),
        };
        for event in events {
            controller.receive(Instant::now(), event);
        }
        controller.sync().unwrap_or_else(|error| panic!("{step}: {error}"));

        let this = controller.intake.state.node(&case.node).expect("the node is in every step");
        let report = explain::report(&controller.intake.state, this, &controller.plan, None);
        let json = serde_json::to_string_pretty(&report).unwrap();
        let whole = explain::explain(&state, &case.node, None, steering.as_ref()).unwrap();
        assert_eq!(
            json,
            serde_json::to_string_pretty(&whole).unwrap(),
            "{step}: the incremental plan is the whole one"
        );
        let _ = write!(plans, "## {step}\n{json}\n\n");

        let whole_plan = NodePlan::build(&state, &case.node, steering.clone()).unwrap();
        assert_eq!(**published.borrow(), DnsView::build(&state, &whole_plan, Vec::new()), "{step}: the DNS view");

        // Each apply was checked against what it was asked; the plan is what was asked.
        let mut record = controller.programmer.record();
        assert_programmed(record.writer.kernel(), controller.plan.desired(), &record.failing, &record.stranded, step);
        let _ = write!(maps, "## {step}\n{}{}\n", std::mem::take(&mut record.log), record.writer.maps().dump());
        drop(record);
        before = Some(state);
    }
    (plans, maps)
}

#[test]
fn scenarios_match_the_golden_files() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/scenarios");
    let mut cases: Vec<_> = fs::read_dir(&root).unwrap().map(|entry| entry.unwrap().path()).collect();
    cases.sort();
    assert!(cases.len() >= 10, "the scenarios are missing from {}", root.display());
    let mut stale = Vec::new();
    for dir in cases {
        let (plans, maps) = run_case(&dir);
        stale.extend(golden(&dir.join("expected.plan"), &plans));
        stale.extend(golden(&dir.join("expected.maps"), &maps));
    }
    assert!(stale.is_empty(), "scenarios differ (UPDATE_GOLDEN=1 to accept):\n{}", stale.join("\n"));
}
