//! The golden scenarios (`topology-agent/testdata/scenarios/*.txtar`) on the kernel's maps
//! (root): each script runs through the control loop twice, over the in-memory maps and over
//! maps the real programs were loaded with (pinned in this test's directory, attached to its
//! cgroup), and at every step the two must agree — the plan, what each apply did, and every
//! entry, slot, name, option and index position the kernel holds, read back from it. `restart`
//! is real here: the dataplane is dropped and opened again over its pins, as a restarted agent
//! adopts them. The unit test holds the in-memory run to the files; this holds the kernel to the
//! in-memory run. Scripts with `fault` (which the kernel's maps cannot be made to do on demand) or
//! `traffic` (the kernel measures the load itself) run in memory only, and are named. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{collections::BTreeSet, fs, net::SocketAddr, path::Path};

use topology_agent::controller::{
    Observation, Programmer,
    recording::{Failures, MemoryKernel},
    scenario::{
        self, ScenarioKernel,
        script::{self, Archive, Fault, Verb},
    },
};
use topology_dataplane::{ApplyReport, Capacities, Dataplane, DataplaneConfig, LoadCounters, memory::MemoryMaps};
use topology_policy::desired::{DesiredState, ServicePort};
use topology_tests::{fixture::Fixture, require_root};

/// The real dataplane, each apply logged and its failures kept as the in-memory kernel keeps them.
struct Kernel {
    dataplane: Option<Dataplane>,
    config: DataplaneConfig,
    log: String,
    failures: Failures,
}

impl Kernel {
    fn open(config: DataplaneConfig) -> Self {
        let dataplane = Dataplane::open(&config).expect("load the programs over this test's pins");
        Self { dataplane: Some(dataplane), config, log: String::new(), failures: Failures::default() }
    }

    fn dataplane(&mut self) -> &mut Dataplane {
        self.dataplane.as_mut().expect("open")
    }

    /// Books an apply of `attempted` ports (`None`: all), as the in-memory kernel does.
    fn book(&mut self, what: &str, attempted: Option<&BTreeSet<ServicePort>>, report: ApplyReport) -> ApplyReport {
        self.failures.book(&mut self.log, what, attempted, &report);
        report
    }
}

impl Programmer for Kernel {
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        let report = self.dataplane().apply(desired);
        self.book("apply", None, report)
    }

    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport {
        let report = Programmer::apply_changes(self.dataplane(), desired, changed);
        self.book(&format!("apply {} changed", changed.len()), Some(changed), report)
    }

    fn observe(&mut self) -> Observation {
        self.dataplane().observe()
    }
}

impl ScenarioKernel for Kernel {
    fn maps(&self) -> MemoryMaps {
        self.dataplane.as_ref().expect("open").snapshot().expect("read the kernel's maps")
    }

    fn take_log(&mut self) -> String {
        std::mem::take(&mut self.log)
    }

    fn failures(&self) -> Failures {
        self.failures.clone()
    }

    fn restart(mut self) -> Self {
        // The pins outlive the agent: dropped, then opened again over them.
        drop(self.dataplane.take());
        Self::open(self.config.clone())
    }

    fn fault(&mut self, _fault: Fault) -> Result<(), String> {
        Err("the kernel's maps cannot be made to fail on demand".into())
    }

    fn measure(&mut self, _backend: SocketAddr, _load: LoadCounters) -> Result<(), String> {
        Err("the kernel measures the load itself".into())
    }
}

/// Whether the script tells the kernel what only the in-memory one can be told: a fault, or the
/// load it measured.
fn in_memory_only(text: &str) -> bool {
    let steps = script::parse(&Archive::parse(text).script).expect("the unit test parses every script");
    steps.iter().any(|step| matches!(step.verb, Verb::Fault(_) | Verb::Traffic(_)))
}

#[test]
fn every_scenario_holds_the_kernels_maps_to_the_in_memory_ones() {
    require_root!();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../topology-agent/testdata/scenarios");
    let mut cases: Vec<_> = fs::read_dir(&root)
        .expect("the scenarios")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "txtar"))
        .collect();
    cases.sort();
    let (mut ran, mut in_memory, mut differences) = (0, Vec::new(), Vec::new());
    for path in &cases {
        let (origin, text) = (path.display().to_string(), fs::read_to_string(path).expect("read"));
        if in_memory_only(&text) {
            in_memory.push(origin);
            continue;
        }
        let memory = scenario::run(&origin, &text, &mut MemoryKernel::new, MemoryMaps::dump_held)
            .unwrap_or_else(|error| panic!("in memory: {error}"));
        // Each script its own pins and cgroup: its capacities are its own.
        let fixture = Fixture::new(0);
        let mut open = |capacities: Capacities| {
            let mut config = fixture.config();
            config.programs.capacities = capacities;
            Kernel::open(config)
        };
        let kernel = scenario::run(&origin, &text, &mut open, MemoryMaps::dump_held)
            .unwrap_or_else(|error| panic!("on the kernel's maps: {error}"));
        differences.extend(scenario::differences(&origin, &memory, &kernel));
        ran += 1;
    }
    eprintln!("{ran} scenarios on the kernel's maps; in memory only (faults, measured load): {in_memory:?}");
    assert!(ran >= 14, "{ran} of {} scenarios ran on the kernel's maps", cases.len());
    assert!(differences.is_empty(), "the kernel's maps differ from the in-memory ones:\n{}", differences.join("\n"));
}
