//! The golden scenarios' runner: each `topology-agent/testdata/scenarios/*.txtar` is a commented
//! script of verbs and the files it names ([`script`]), run through the control loop over a
//! [`ScenarioKernel`] — the in-memory maps ([`MemoryKernel`], the agent's unit tests) or the
//! kernel's (the root run in `tests/tests/scenarios.rs`, held to the in-memory run step by
//! step). Besides what a script compares with its files, every step holds:
//! - after each `sync` and `reconcile`, the maps hold what was asked (the ports reported failed
//!   excepted), and the DNS view the controller published is the one built whole from the plan;
//! - at each `plan`, the controller's plan (built incrementally) is the one built whole from the
//!   same cluster.

pub mod script;

use std::{
    collections::BTreeSet,
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::sync::watch;
use topology_dataplane::{
    Capacities, LoadCounters,
    memory::{MemoryMaps, assert_programmed},
};
use topology_dns::{DnsPublisher, DnsView};
use topology_kube::{Object, SourceEvent, events::LogOnly};
use topology_model::{ClusterState, Kind, yaml};
use topology_policy::{
    explain,
    plan::{NodePlan, steering::Steering},
};

use self::script::{Archive, Fault, Verb};
use super::{
    Controller, ControllerConfig, ControllerError, Health, Programmer,
    recording::{Failures, MemoryKernel},
};
use crate::metrics::Metrics;

/// What a scenario runs on: a programmer whose maps can be read back, restarted over, and made
/// to fail.
pub trait ScenarioKernel: Programmer + Sized {
    /// The maps now, in their in-memory form.
    fn maps(&self) -> MemoryMaps;
    /// One line per apply since the last call (as `memory::describe` prints them).
    fn take_log(&mut self) -> String;
    /// The ports whose last write failed.
    fn failures(&self) -> Failures;
    /// The kernel a restarted agent opens over the same maps.
    fn restart(self) -> Self;
    /// Makes writes fail (or stop failing); an error where this kernel cannot.
    fn fault(&mut self, fault: Fault) -> Result<(), String>;
    /// Adds `load` to what the load signal measured of `backend`; an error where this kernel
    /// cannot be told.
    fn measure(&mut self, backend: SocketAddr, load: LoadCounters) -> Result<(), String>;
}

impl ScenarioKernel for MemoryKernel {
    fn maps(&self) -> MemoryMaps {
        self.record().writer.maps().clone()
    }

    fn take_log(&mut self) -> String {
        std::mem::take(&mut self.record().log)
    }

    fn failures(&self) -> Failures {
        self.record().failures.clone()
    }

    fn restart(self) -> Self {
        MemoryKernel::adopting(self.maps())
    }

    fn fault(&mut self, fault: Fault) -> Result<(), String> {
        let mut record = self.record();
        let maps = record.writer.maps_mut();
        maps.failing = match fault {
            Fault::Map(map) => Some(map),
            Fault::Grace | Fault::None => None,
        };
        maps.grace.fail = fault == Fault::Grace;
        Ok(())
    }

    fn measure(&mut self, backend: SocketAddr, load: LoadCounters) -> Result<(), String> {
        let mut record = self.record();
        let counters = record.load.entry(backend).or_default();
        counters.connects += load.connects;
        counters.closed += load.closed;
        counters.refused += load.refused;
        counters.lifetime_us += load.lifetime_us;
        Ok(())
    }
}

/// How a run prints the maps: [`MemoryMaps::dump`] for the golden files, or
/// [`MemoryMaps::dump_held`] where the kernel's maps are compared.
pub type Print = fn(&MemoryMaps) -> String;

/// Runs the scenario `text` (from `origin`) over kernels `open` makes for the capacities the
/// script asks: the archive with every expectation as this run found it, or the step that failed.
pub fn run<K: ScenarioKernel>(
    origin: &str,
    text: &str,
    open: &mut dyn FnMut(Capacities) -> K,
    print: Print,
) -> Result<Archive, String> {
    let archive = Archive::parse(text);
    let steps = script::parse(&archive.script).map_err(|error| format!("{origin}: {error}"))?;
    // A file no step reads or writes is a stale expectation or a misspelt name: never kept.
    let named: BTreeSet<&str> = steps.iter().filter_map(|step| step.verb.file()).collect();
    if let Some((unused, _)) = archive.files.iter().find(|(name, _)| !named.contains(name.as_str())) {
        return Err(format!("{origin}: no step reads or writes file {unused}"));
    }
    let mut found = archive.clone();
    let mut agent = Agent::new(print);
    for step in &steps {
        match agent.step(&archive, &step.verb, open) {
            Ok(Some((file, contents))) => found.set(&file, contents),
            Ok(None) => {}
            Err(error) => return Err(format!("{origin}:{}: {:?}: {error}", step.line, step.verb)),
        }
    }
    Ok(found)
}

/// The first line where file `name` of `expected` and `found` differ, for each file that does.
pub fn differences(origin: &str, expected: &Archive, found: &Archive) -> Vec<String> {
    let mut differences = Vec::new();
    for (name, contents) in &found.files {
        let old = expected.file(name).unwrap_or_default();
        let (old_lines, new_lines): (Vec<_>, Vec<_>) = (old.lines().collect(), contents.lines().collect());
        let at = (0..old_lines.len().max(new_lines.len())).find(|&at| old_lines.get(at) != new_lines.get(at));
        if let Some(at) = at {
            differences.push(format!(
                "{origin} ({name}), line {}:\n  expected {:?}\n    actual {:?}",
                at + 1,
                old_lines.get(at),
                new_lines.get(at)
            ));
        }
    }
    differences
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

/// The agent a script drives: its setup, and once the cluster is seen, its controller.
struct Agent<K: ScenarioKernel> {
    node: String,
    capacities: Capacities,
    steering: Option<Steering>,
    running: Option<(Controller<K>, watch::Receiver<Arc<DnsView>>)>,
    /// The cluster as the last `cluster` left it.
    cluster: Option<ClusterState>,
    /// The feedback controller's clock, milliseconds: one interval more at each `feedback`.
    feedback_ms: u64,
    print: Print,
}

impl<K: ScenarioKernel> Agent<K> {
    fn new(print: Print) -> Self {
        let capacities = Capacities::default();
        Self { node: String::new(), capacities, steering: None, running: None, cluster: None, feedback_ms: 0, print }
    }

    /// A controller over `kernel`, told the whole of `cluster` as the watch's lists.
    fn start(&mut self, kernel: K, cluster: &ClusterState) {
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
            controller.receive(Instant::now(), SourceEvent::Replace { kind, objects, invalid: Vec::new() });
        }
        self.running = Some((controller, published));
    }

    fn controller(&mut self) -> Result<&mut Controller<K>, String> {
        self.running.as_mut().map(|(controller, _)| controller).ok_or_else(|| "no cluster yet".to_owned())
    }

    fn cluster(&self) -> Result<&ClusterState, String> {
        self.cluster.as_ref().ok_or_else(|| "no cluster yet".to_owned())
    }

    /// Runs one verb; what it prints, for the verbs that compare with a file.
    fn step(
        &mut self,
        archive: &Archive,
        verb: &Verb,
        open: &mut dyn FnMut(Capacities) -> K,
    ) -> Result<Option<(String, String)>, String> {
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
                    _ => self.start(open(self.capacities), &state),
                }
                self.cluster = Some(state);
            }
            Verb::Sync => self.sync(Controller::sync)?,
            Verb::Reconcile => self.sync(|controller| {
                controller.reconcile();
                Ok(())
            })?,
            Verb::Traffic(traffic) => {
                let kernel = &mut self.controller()?.programmer;
                for backend in &traffic.backends {
                    let load = LoadCounters {
                        connects: traffic.connects + traffic.refused,
                        closed: traffic.closed,
                        refused: traffic.refused,
                        lifetime_us: traffic.closed * traffic.latency_us,
                        ..LoadCounters::default()
                    };
                    kernel.measure(*backend, load)?;
                }
            }
            Verb::Feedback => {
                self.feedback_ms += self.controller()?.feedback.interval().as_millis() as u64;
                let now_ms = self.feedback_ms;
                self.sync(|controller| controller.look_at_feedback(now_ms))?;
            }
            Verb::Plan(file) => return self.plan().map(|plan| Some((file.clone(), plan))),
            Verb::Maps(file) => {
                let print = self.print;
                let kernel = &mut self.controller()?.programmer;
                let maps = format!("{}{}", kernel.take_log(), print(&kernel.maps()));
                return Ok(Some((file.clone(), maps)));
            }
            Verb::Restart => {
                let cluster = self.cluster()?.clone();
                let (controller, _) = self.running.take().ok_or("no agent to restart")?;
                self.start(controller.programmer.restart(), &cluster);
            }
            Verb::Fault(fault) => self.controller()?.programmer.fault(*fault)?,
        }
        Ok(None)
    }

    /// `sync` (or another job that programs), and what holds after it.
    fn sync(&mut self, job: impl FnOnce(&mut Controller<K>) -> Result<(), ControllerError>) -> Result<(), String> {
        let steering = self.steering.clone();
        let node = self.node.clone();
        let cluster = self.cluster()?.clone();
        let (controller, published) = self.running.as_mut().ok_or("no cluster yet")?;
        job(controller).map_err(|error| error.to_string())?;
        let Failures { failing, stranded } = controller.programmer.failures();
        let held = controller.programmer.maps().kernel_state();
        assert_programmed(&held, controller.plan.desired(), &failing, &stranded, "the maps after the step");
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
        // The plan built whole from the same cluster, with the feedback controller's inputs as
        // they stand.
        let inputs = controller.plan.feedback().clone();
        let whole = NodePlan::build_with_feedback(&cluster, &node, steering, inputs).map_err(|e| e.to_string())?;
        let this = cluster.node(&node).ok_or("the node is not in the cluster")?;
        let whole = explain::report(&cluster, this, &whole, None);
        if json != serde_json::to_string_pretty(&whole).map_err(|error| error.to_string())? {
            return Err(format!("the incremental plan is not the whole one:\n{json}"));
        }
        Ok(json + "\n")
    }
}
