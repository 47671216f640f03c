//! Golden scenarios through the control loop, without root: each `testdata/scenarios/*.txtar`
//! is a commented script of verbs and the files it names (see [`script`]). The controller
//! decides and programs the real writer over in-memory maps ([`MemoryKernel`]). Besides what a
//! script compares with its files, every step holds:
//! - after each `sync` and `reconcile`, the maps hold what was asked (each apply is checked as it happens, and
//!   the ports reported failed are the only exceptions), and the DNS view the controller
//!   published is the one built whole from the plan;
//! - at each `plan`, the controller's plan (built incrementally) is the one built whole from the
//!   same cluster.
//!
//! After a deliberate change, `UPDATE_GOLDEN=1 cargo test -p topology-agent scenarios` rewrites the
//! expectations in the files; review the diff.

use std::{
    fmt::Write as _,
    fs,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;
use topology_dataplane::{
    Capacities,
    memory::{MemoryMaps, assert_programmed},
};
use topology_dns::{DnsPublisher, DnsView};
use topology_model::yaml;
use topology_policy::plan::steering::Steering;

use super::{
    script::{self, Archive, Fault, Verb},
    *,
};

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

/// The agent a script drives: its setup, and once the cluster is seen, its controller.
struct Agent {
    node: String,
    capacities: Capacities,
    steering: Option<Steering>,
    running: Option<(Controller<MemoryKernel>, watch::Receiver<Arc<DnsView>>)>,
    /// The cluster as the last `cluster` left it.
    cluster: Option<ClusterState>,
}

impl Agent {
    fn new() -> Self {
        Self { node: String::new(), capacities: Capacities::default(), steering: None, running: None, cluster: None }
    }

    /// A controller over `kernel`, told the whole of `cluster` as the watch's lists.
    fn start(&mut self, kernel: MemoryKernel, cluster: &ClusterState) {
        let (publisher, published) = DnsPublisher::new(Vec::new());
        let mut controller = Controller::new(
            ControllerConfig { reconcile_interval: Duration::from_secs(3600), ..ControllerConfig::new(&self.node) },
            kernel,
            Arc::new(Health::default()),
            Arc::new(Metrics::default()),
            Box::new(LogOnly),
        )
        .with_steering(self.steering.clone())
        .with_dns(Some(publisher));
        for (kind, objects) in objects(cluster) {
            controller.receive(Instant::now(), replace(kind, objects));
        }
        self.running = Some((controller, published));
    }

    fn controller(&mut self) -> Result<&mut Controller<MemoryKernel>, String> {
        self.running.as_mut().map(|(controller, _)| controller).ok_or_else(|| "no cluster yet".to_owned())
    }

    fn cluster(&self) -> Result<&ClusterState, String> {
        self.cluster.as_ref().ok_or_else(|| "no cluster yet".to_owned())
    }

    /// Runs one verb; what it prints, for the verbs that compare with a file.
    fn step(&mut self, archive: &Archive, verb: &Verb) -> Result<Option<(String, String)>, String> {
        let setup =
            |running: bool| if running { Err("setup comes before the first `cluster`".to_owned()) } else { Ok(()) };
        match verb {
            Verb::Node(node) => setup(self.running.is_some()).map(|()| self.node.clone_from(node))?,
            Verb::Capacities(capacities) => setup(self.running.is_some()).map(|()| self.capacities = *capacities)?,
            Verb::Steering(service, responder) => setup(self.running.is_some())
                .map(|()| self.steering = Some(Steering { service: service.clone(), responder: *responder }))?,
            Verb::Cluster(file) => {
                let text = archive.file(file).ok_or_else(|| format!("no file {file}"))?;
                let state = yaml::parse(text, file).map_err(|error| error.to_string())?;
                match (self.running.as_mut(), &self.cluster) {
                    (Some((controller, _)), Some(before)) => {
                        for event in changes(before, &state) {
                            controller.receive(Instant::now(), event);
                        }
                    }
                    _ => self.start(MemoryKernel::new(self.capacities), &state),
                }
                self.cluster = Some(state);
            }
            Verb::Sync => self.sync(Controller::sync)?,
            Verb::Reconcile => self.sync(|controller| {
                controller.reconcile();
                Ok(())
            })?,
            Verb::Plan(file) => return self.plan().map(|plan| Some((file.clone(), plan))),
            Verb::Maps(file) => {
                let mut record = self.controller()?.programmer.record();
                let maps = format!("{}{}", std::mem::take(&mut record.log), record.writer.maps().dump());
                return Ok(Some((file.clone(), maps)));
            }
            Verb::Restart => {
                let cluster = self.cluster()?.clone();
                let (controller, _) = self.running.take().ok_or("no agent to restart")?;
                let maps = controller.programmer.record().writer.maps().clone();
                drop(controller);
                self.start(MemoryKernel::adopting(maps), &cluster);
            }
            Verb::Fault(fault) => {
                let mut record = self.controller()?.programmer.record();
                let maps: &mut MemoryMaps = record.writer.maps_mut();
                maps.failing = match fault {
                    Fault::Map(map) => Some(map),
                    Fault::Grace | Fault::None => None,
                };
                maps.grace.fail = *fault == Fault::Grace;
            }
        }
        Ok(None)
    }

    /// `sync` (or another job that programs), and what holds after it.
    fn sync(
        &mut self,
        job: impl FnOnce(&mut Controller<MemoryKernel>) -> Result<(), ControllerError>,
    ) -> Result<(), String> {
        let steering = self.steering.clone();
        let node = self.node.clone();
        let cluster = self.cluster()?.clone();
        let (controller, published) = self.running.as_mut().ok_or("no cluster yet")?;
        job(controller).map_err(|error| error.to_string())?;
        let record = controller.programmer.record();
        assert_programmed(record.writer.kernel(), controller.plan.desired(), &record.failing, &record.stranded, "sync");
        let whole = NodePlan::build(&cluster, &node, steering).map_err(|error| error.to_string())?;
        if **published.borrow() != DnsView::build(&cluster, &whole, Vec::new()) {
            return Err("the DNS view published is not the one built whole from the plan".into());
        }
        Ok(())
    }

    /// The plan as explain prints it, which must be the one built whole.
    fn plan(&mut self) -> Result<String, String> {
        let (node, steering) = (self.node.clone(), self.steering.clone());
        let cluster = self.cluster()?.clone();
        let controller = self.controller()?;
        let this = controller.intake.state.node(&node).ok_or("the node is not in the cluster")?;
        let report = explain::report(&controller.intake.state, this, &controller.plan, None);
        let json = serde_json::to_string_pretty(&report).map_err(|error| error.to_string())?;
        let whole = explain::explain(&cluster, &node, None, steering.as_ref()).map_err(|error| error.to_string())?;
        if json != serde_json::to_string_pretty(&whole).map_err(|error| error.to_string())? {
            return Err(format!("the incremental plan is not the whole one:\n{json}"));
        }
        Ok(json + "\n")
    }
}

/// Runs the scenario in `text`: the archive with its expectations as this run found them.
fn run(path: &Path, text: &str) -> Archive {
    let archive = Archive::parse(text);
    let steps = script::parse(&archive.script).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let mut found = archive.clone();
    let mut agent = Agent::new();
    for step in &steps {
        match agent.step(&archive, &step.verb) {
            Ok(Some((file, contents))) => found.set(&file, contents),
            Ok(None) => {}
            Err(error) => panic!("{}:{}: {:?}: {error}", path.display(), step.line, step.verb),
        }
    }
    found
}

/// The first line where `expected` and `found` differ, if any.
fn first_difference(path: &Path, expected: &Archive, found: &Archive) -> Option<String> {
    for (name, contents) in &found.files {
        let old = expected.file(name).unwrap_or_default();
        let line = old.lines().zip(contents.lines()).position(|(e, a)| e != a);
        let line = line.or_else(|| {
            (old.lines().count() != contents.lines().count()).then(|| old.lines().count().min(contents.lines().count()))
        });
        if let Some(at) = line {
            return Some(format!(
                "{} ({name}), line {}:\n  expected {:?}\n    actual {:?}",
                path.display(),
                at + 1,
                old.lines().nth(at),
                contents.lines().nth(at)
            ));
        }
    }
    None
}

#[test]
fn scenarios_match_their_expectations() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/scenarios");
    let mut cases: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "txtar"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 13, "the scenarios are missing from {}", root.display());
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut stale = Vec::new();
    for path in cases {
        let text = fs::read_to_string(&path).unwrap();
        let found = run(&path, &text);
        if update {
            fs::write(&path, found.to_string()).unwrap();
        } else {
            stale.extend(first_difference(&path, &Archive::parse(&text), &found));
        }
    }
    let mut message = String::new();
    for difference in &stale {
        let _ = writeln!(message, "{difference}");
    }
    assert!(stale.is_empty(), "scenarios differ (UPDATE_GOLDEN=1 to accept):\n{message}");
}
