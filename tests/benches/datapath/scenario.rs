//! One row of the datapath bench: a way of reaching the backends, its rounds of connects, and
//! what the kernel counted its programs running.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use aya::programs::{
    links::{FdLink, PinnedLink},
    loaded_programs,
};
use topology_tests::{
    net::ClientPlace,
    traffic::{Report, Timed},
};

use super::{INTERLEAVE_BLOCK, report::median};

/// One way of reaching the backends, and every connect() duration measured for it.
pub struct Scenario {
    pub kind: Timed,
    pub name: &'static str,
    pub services: Option<usize>,
    pub place: ClientPlace,
    /// Each connect dials one of these at random.
    pub targets: Vec<SocketAddr>,
    /// Interleaved with connects from this cgroup (no programs) to these addresses.
    pub baseline: Option<(PathBuf, Vec<SocketAddr>)>,
    pub samples_ns: Vec<u64>,
    /// Connects per round, in units of `PER_ROUND`.
    pub batches: u64,
    /// The interleaved baseline's samples.
    pub baseline_ns: Vec<u64>,
    /// The median of each measured round, in round order (a phase's rounds run each of its
    /// scenarios once).
    pub round_p50_ns: Vec<u64>,
    /// Per round, this round's median minus its baseline's: the interleaved baseline's, else the
    /// no-hook scenario's of the same round.
    pub round_delta_ns: Vec<i64>,
    /// The pinned link of the `connect4` program these connects run through, if hooked.
    pub hook: Option<PathBuf>,
    /// The hook's own run time and runs over the run-time rounds, as the kernel counts them.
    pub hook_run: (Duration, u64),
    /// The program at a TCP socket's end (`tcp_destroy_sock`, node-wide: accounting, the load
    /// signal) of the same dataplane, and its run time and runs over the run-time rounds (every
    /// socket's end of the round: the row's and its baseline's, clients' and servers').
    pub load: Option<PathBuf>,
    pub load_run: (Duration, u64),
}

impl Scenario {
    pub fn new(
        kind: Timed,
        name: &'static str,
        services: Option<usize>,
        place: ClientPlace,
        targets: Vec<SocketAddr>,
    ) -> Self {
        Self {
            kind,
            name,
            services,
            place,
            targets,
            baseline: None,
            samples_ns: Vec::new(),
            batches: 1,
            baseline_ns: Vec::new(),
            round_p50_ns: Vec::new(),
            round_delta_ns: Vec::new(),
            hook: None,
            hook_run: Default::default(),
            load: None,
            load_run: (Duration::ZERO, 0),
        }
    }

    /// `count` connects (pairs, if interleaved) from one client process; the first `discard`
    /// are not kept.
    pub fn round(&mut self, count: u64, discard: usize) {
        let report: Report = match (&self.baseline, self.kind) {
            (Some((cgroup, targets)), kind) => {
                self.place.interleaved(kind, &self.targets, cgroup, targets, count, INTERLEAVE_BLOCK)
            }
            (None, Timed::Tcp) => self.place.timed_tcp(&self.targets, count),
            (None, Timed::UdpConnect) => self.place.timed_udp_connect(&self.targets, count),
        };
        assert_eq!(report.failures(), 0, "{} ({:?}): {:?}", self.name, self.services, report.errors);
        let kept: Vec<u64> = report.connect_ns.iter().skip(discard).copied().collect();
        if kept.is_empty() {
            return;
        }
        self.samples_ns.extend(&kept);
        self.round_p50_ns.push(median(kept));
        if self.baseline.is_some() {
            let base: Vec<u64> = report.baseline_ns.iter().skip(discard).copied().collect();
            self.baseline_ns.extend(&base);
            self.round_delta_ns.push(*self.round_p50_ns.last().expect("pushed") as i64 - median(base) as i64);
        }
    }

    /// A round whose latencies are not kept, adding the hook's own run time (kernel BPF stats must
    /// be on) to `hook_run`.
    pub fn hook_round(&mut self, count: u64) {
        let Some(link) = self.hook.clone() else { return };
        let before = run_stats(&link);
        let load_before = self.load.as_deref().map(run_stats);
        let kept = (self.samples_ns.len(), self.baseline_ns.len(), self.round_p50_ns.len(), self.round_delta_ns.len());
        self.round(count, 0);
        self.samples_ns.truncate(kept.0);
        self.baseline_ns.truncate(kept.1);
        self.round_p50_ns.truncate(kept.2);
        self.round_delta_ns.truncate(kept.3);
        let after = run_stats(&link);
        self.hook_run.0 += after.0 - before.0;
        self.hook_run.1 += after.1 - before.1;
        if let (Some(load), Some(before)) = (self.load.as_deref(), load_before) {
            let after = run_stats(load);
            self.load_run.0 += after.0 - before.0;
            self.load_run.1 += after.1 - before.1;
        }
    }

    /// Mean run time of the program at a socket's end per run (per TCP socket), in nanoseconds.
    pub fn load_ns(&self) -> Option<f64> {
        let (time, runs) = self.load_run;
        (self.kind == Timed::Tcp && runs > 0).then(|| time.as_nanos() as f64 / runs as f64)
    }

    /// Mean run time of the hook per call, in nanoseconds.
    pub fn hook_ns(&self) -> Option<f64> {
        let (time, runs) = self.hook_run;
        (runs > 0).then(|| time.as_nanos() as f64 / runs as f64)
    }
}

/// Cumulative run time and run count of the program behind the pinned link at `link`.
pub fn run_stats(link: &Path) -> (Duration, u64) {
    let link = FdLink::from(PinnedLink::from_pin(link).expect("open pinned link"));
    let id = link.info().expect("link info").program_id();
    let program = loaded_programs()
        .filter_map(Result::ok)
        .find(|program| program.id() == id)
        .expect("the linked program is loaded");
    (program.run_time(), program.run_count())
}
