//! The control loop's one test programmer: the real writer over in-memory maps, recording what
//! it was asked. Every apply is checked as it happens: the maps hold what was asked (to rounding)
//! except the ports reported failed, and the index never misleads a program. Tests read the
//! record while the loop runs on another thread.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
};

use topology_dataplane::{
    ApplyReport, Capacities, DataplaneError, KernelState, LoadCounters, MeasuredBackend, Writer,
    memory::{MemoryMaps, assert_programmed, describe},
    verify_index,
};
use topology_policy::desired::{DesiredState, ServicePort};

use super::{Observation, Programmer};

/// What the controller asked of the programmer, and what the maps hold.
pub struct Record {
    /// What the kernel is asked to hold now (the last full apply, with the changes since).
    pub current: DesiredState,
    /// Full applies.
    pub full: usize,
    /// The ports of each partial apply.
    pub partial: Vec<BTreeSet<ServicePort>>,
    /// What was asked before the first full apply (partial applies of the full sync).
    pub before_full: Option<DesiredState>,
    /// Threads the partial applies ran on.
    pub partial_threads: BTreeSet<String>,
    /// One line per apply, as the golden scenarios keep them.
    pub log: String,
    /// The ports whose last write failed.
    pub failures: Failures,
    /// What the load signal measured per backend (cumulative, as the kernel's counters are).
    pub load: BTreeMap<SocketAddr, LoadCounters>,
    /// The writer over the in-memory maps.
    pub writer: Writer<MemoryMaps>,
}

impl Record {
    /// Applies of either kind.
    pub fn applies(&self) -> usize {
        self.full + self.partial.len()
    }

    /// The backend addresses asked for `port`, in the order given.
    pub fn addresses(&self, port: &ServicePort) -> Option<Vec<String>> {
        self.current.services.get(port).map(|s| s.backends.iter().map(|b| b.addr.to_string()).collect())
    }

    /// Books an apply of `attempted` ports (`None`: all) and checks the maps.
    fn book(&mut self, what: &str, attempted: Option<&BTreeSet<ServicePort>>, report: ApplyReport) -> ApplyReport {
        self.failures.book(&mut self.log, what, attempted, &report);
        let Failures { failing, stranded } = &self.failures;
        assert_programmed(self.writer.kernel(), &self.current, failing, stranded, what);
        if let Err(error) = verify_index(self.writer.maps(), self.writer.kernel()) {
            panic!("{what}: {error}");
        }
        report
    }
}

/// The ports whose last write failed, as a programmer keeps them from apply to apply.
#[derive(Clone, Debug, Default)]
pub struct Failures {
    /// Ports whose last write failed: the kernel holds nothing for them, or their new set.
    pub failing: BTreeSet<ServicePort>,
    /// Failed ports whose outdated entry could not be withdrawn either.
    pub stranded: BTreeSet<ServicePort>,
}

impl Failures {
    /// Books `report`, an apply (`what`) of `attempted` ports (`None`: all): its line in `log`,
    /// and the ports it failed in place of those it attempted.
    pub fn book(
        &mut self,
        log: &mut String,
        what: &str,
        attempted: Option<&BTreeSet<ServicePort>>,
        report: &ApplyReport,
    ) {
        let _ = write!(log, "{what}: {}", describe(report));
        match attempted {
            Some(ports) => {
                self.failing.retain(|port| !ports.contains(port));
                self.stranded.retain(|port| !ports.contains(port));
            }
            None => {
                self.failing.clear();
                self.stranded.clear();
            }
        }
        self.failing.extend(report.failed.iter().map(|(port, _)| *port));
        self.stranded.extend(report.stranded.iter().copied());
    }
}

impl std::fmt::Debug for Record {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Record")
            .field("current", &self.current)
            .field("full", &self.full)
            .field("partial", &self.partial)
            .field("failures", &self.failures)
            .finish_non_exhaustive()
    }
}

/// The programmer; clones share one record.
#[derive(Clone, Debug)]
pub struct MemoryKernel(Arc<Mutex<Record>>);

impl MemoryKernel {
    /// Empty in-memory maps of `capacities`.
    pub fn new(capacities: Capacities) -> Self {
        let writer = Writer::adopt(MemoryMaps::new(capacities), KernelState::default())
            .expect("empty in-memory maps are adopted");
        Self::over(writer)
    }

    /// The maps a stopped agent left, taken over as a restarted agent takes over the kernel's:
    /// read back, and adopted by a new writer.
    pub fn adopting(maps: MemoryMaps) -> Self {
        let kernel = maps.kernel_state();
        Self::over(Writer::adopt(maps, kernel).expect("the maps a writer left are adopted"))
    }

    fn over(writer: Writer<MemoryMaps>) -> Self {
        Self(Arc::new(Mutex::new(Record {
            current: DesiredState::default(),
            full: 0,
            partial: Vec::new(),
            before_full: None,
            partial_threads: BTreeSet::new(),
            log: String::new(),
            failures: Failures::default(),
            load: BTreeMap::new(),
            writer,
        })))
    }

    /// The record, once no clone is left.
    pub fn into_record(self) -> Record {
        match Arc::try_unwrap(self.0) {
            Ok(record) => record.into_inner().unwrap_or_else(std::sync::PoisonError::into_inner),
            Err(_) => panic!("a clone of the in-memory kernel is still held"),
        }
    }

    /// The record, locked.
    pub fn record(&self) -> MutexGuard<'_, Record> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Default for MemoryKernel {
    fn default() -> Self {
        Self::new(Capacities::default())
    }
}

impl Programmer for MemoryKernel {
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        let mut record = self.record();
        if record.before_full.is_none() {
            record.before_full = Some(record.current.clone());
        }
        record.current = desired.clone();
        record.full += 1;
        let report = record.writer.apply(desired);
        record.book("apply", None, report)
    }

    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport {
        let mut record = self.record();
        for port in changed {
            match desired.services.get(port) {
                Some(service) => record.current.services.insert(*port, service.clone()),
                None => record.current.services.remove(port),
            };
        }
        record.partial.push(changed.clone());
        let thread = std::thread::current().name().unwrap_or("unnamed").to_owned();
        record.partial_threads.insert(thread);
        let report = record.writer.apply_changes(changed.iter().map(|port| (*port, desired.services.get(port))));
        record.book(&format!("apply {} changed", changed.len()), Some(changed), report)
    }

    fn backend_load(&self) -> Result<Vec<MeasuredBackend>, DataplaneError> {
        let record = self.record();
        Ok(record
            .load
            .iter()
            .map(|(backend, load)| MeasuredBackend {
                backend: *backend,
                in_flight: load.connects.saturating_sub(load.closed + load.refused + load.timed_out),
                load: *load,
            })
            .collect())
    }

    fn observe(&mut self) -> Observation {
        let mut record = self.record();
        let usage = record.writer.usage();
        Observation {
            services: (usage.services_v4 + usage.services_v6) as usize,
            backends: usage.slots as usize,
            maps: Vec::new(),
            grace: record.writer.grace_periods(),
        }
    }
}
