//! `cargo xtask bench datapath`: connect() latency from a client namespace to a backend, side by
//! side in one run: no hook; our hook with 10 / 1,000 / 10,000 / 30,000 / 50,000 services
//! installed (each with TCP and UDP port 80: 100,000 service ports at the most); a
//! kube-proxy-shaped iptables ruleset (KUBE-SERVICES -> KUBE-SVC-* -> KUBE-SEP-* with
//! `statistic --mode random`) with the same service counts up to 30,000, and kube-proxy's
//! nftables mode (a `service-ips` verdict map, `numgen random mod N` per service) at every count,
//! each inside a namespace.
//!
//! Every connect dials one of the two backends at random, directly (no hook) or through a
//! ClusterIP the hook balances over them, so each scenario reaches the same servers in the same
//! mix and differs only in how the destination is chosen. A fourth kind of row, the hook attached
//! but the destination not a service, shows the hook's fixed cost apart from the rewrite; a fifth,
//! an empty program attached, the kernel's own cost of running a cgroup hook at all; a sixth, the
//! fourth interleaved with the fifth, what the program adds to the kernel's hook.
//!
//! The hook's cost is measured interleaved: one client process alternates, connect by connect in
//! a random order per pair, between the hooked cgroup (dialling the ClusterIP) and a cgroup with
//! no programs (dialling a backend directly), so both sides of every pair share the process, the
//! CPU and the moment, and the machine's drift cancels pair by pair. Each move between cgroups is
//! followed by one untimed connect, so every timed connect follows a connect from the same cgroup,
//! as in a connect loop.
//!
//! Two measurements:
//! - TCP `connect()` (SYN to established, through a bridge): what an application waits for, and
//!   where iptables pays its rule walk;
//! - UDP `connect()`, which sends nothing: the route lookup plus the cgroup hook alone, so the
//!   hook's own cost is not hidden under the handshake's noise.
//!
//! Every scenario exists at once (each hooked one has its own cgroup and pinned maps) and the
//! rounds run them in a new random order each time, so drift of the machine spreads evenly.
//! Every hooked node but one also has a TCP port under feedback, so the load signal measures
//! there, as on a node that uses feedback anywhere (its connections are counted by the connect
//! hook and where their socket ends; nothing runs on any other connect); the row without it shows
//! what a node that measures nothing pays. A Service under feedback has its own row. The rulesets compared are kube-proxy's iptables and nftables modes.
//!
//! Root only; everything lives in a sandbox removed at the end. `TOPOLOGY_BENCH_QUICK=1` runs only
//! the 10-service rows; `TOPOLOGY_BENCH_COUNTS=50000` (a comma-separated list) runs those counts,
//! and `TOPOLOGY_BENCH_RULES=0` leaves the iptables and nftables rows out.

#[path = "datapath/empty.rs"]
mod empty;
#[path = "datapath/outlier.rs"]
mod outlier;
#[path = "datapath/report.rs"]
mod report;
#[path = "datapath/rules.rs"]
mod rules;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use aya::{
    programs::{
        links::{FdLink, PinnedLink},
        loaded_programs,
    },
    sys::{Stats, enable_stats},
};
use report::{median, print_table};
use rules::{load_iptables, load_nftables, vip};
use topology_agent::{
    dataplane::{Dataplane, DataplaneConfig, PinLayout},
    desired::{DesiredService, DesiredState, Locality, PortOptions, Protocol, ServicePort, WeightedBackend},
};
use topology_tests::{
    fixture::{BACKEND_PORT, Fixture},
    net::{ClientPlace, Host, Server, ServerOptions},
    sandbox::{CgroupGuard, PinGuard, is_root, run},
    traffic::{Report, Timed},
};

/// Services installed; each has TCP and UDP port 80, so 50,000 are 100,000 service ports.
const COUNTS: [usize; 5] = [10, 1_000, 10_000, 30_000, 50_000];
/// The largest ruleset the iptables rows load: kube-proxy's iptables mode is not run at 50,000
/// Services (its restore and rule walk are the reason IPVS and nftables modes exist).
const IPTABLES_MAX: usize = 30_000;
const QUICK_COUNTS: [usize; 1] = [10];
const WARMUP: u64 = 300;
const ROUNDS: u64 = 40;
const PER_ROUND: u64 = 550;
/// Connects per round, in units of `PER_ROUND`, of the TCP rows the summary line's hook figures
/// come from: a tenth of a microsecond in a 23 µs handshake needs the samples (the standard
/// error of a pooled p50 difference falls with their square root).
const HEADLINE_BATCHES: u64 = 3;
/// Rounds of every hooked scenario with the kernel's BPF run-time statistics on.
const HOOK_ROUNDS: u64 = 4;
/// Connects at the start of each client process that are not counted (cold caches).
const DISCARD: usize = 50;
const CLIENT_CPU: usize = 0;
/// Timed connects per stay in one cgroup of an interleaved client (each stay starts with one
/// untimed connect, so the move between cgroups is not measured).
const INTERLEAVE_BLOCK: u64 = 1;
const SERVER_CPU: usize = 1;

/// One way of reaching the backends, and every connect() duration measured for it.
struct Scenario {
    kind: Timed,
    name: &'static str,
    services: Option<usize>,
    place: ClientPlace,
    /// Each connect dials one of these at random.
    targets: Vec<SocketAddr>,
    /// Interleaved with connects from this cgroup (no programs) to these addresses.
    baseline: Option<(PathBuf, Vec<SocketAddr>)>,
    samples_ns: Vec<u64>,
    /// Connects per round, in units of `PER_ROUND`.
    batches: u64,
    /// The interleaved baseline's samples.
    baseline_ns: Vec<u64>,
    /// The median of each measured round, in round order (rounds run every scenario once).
    round_p50_ns: Vec<u64>,
    /// Per round, this round's median minus its baseline's: the interleaved baseline's, else the
    /// no-hook scenario's of the same round.
    round_delta_ns: Vec<i64>,
    /// The pinned link of the `connect4` program these connects run through, if hooked.
    hook: Option<PathBuf>,
    /// The hook's own run time and runs over the run-time rounds, as the kernel counts them.
    hook_run: (Duration, u64),
    /// The program at a TCP socket's end (`tcp_destroy_sock`: accounting, the load signal) of the
    /// same dataplane, and its run time over `hook_connects` connects (each ends a client's
    /// socket and a server's).
    load: Option<PathBuf>,
    load_run: Duration,
    hook_connects: u64,
}

const NO_HOOK: &str = "no hook, direct to the backends";
const HOOK: &str = "topology-agent hook";
const HOOK_FEEDBACK: &str = "topology-agent hook, a Service under feedback (measured)";
const HOOK_UNMEASURED_NODE: &str = "topology-agent hook, no port measured on the node";
const NOT_A_SERVICE: &str = "hook attached, not a service (direct to the backends)";
const EMPTY_PROGRAM: &str = "an empty connect4 program attached (the kernel's hook alone; direct to the backends)";
const OVER_EMPTY: &str = "hook attached, not a service, beside the empty program (\"over no hook\": over the empty program; the program's own part)";
const HOOK_PEER_FAILING: &str = "topology-agent hook, another backend of the node failing (outlier ejection)";
const HOOK_CHOSEN_FAILING: &str = "topology-agent hook, its backends failing (outlier ejection)";
const IPTABLES: &str = "iptables, kube-proxy shaped";
const NFTABLES: &str = "nftables, kube-proxy shaped";

impl Scenario {
    fn new(
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
            load_run: Duration::ZERO,
            hook_connects: 0,
        }
    }

    /// `count` connects from one client process; the first `discard` are not kept.
    /// `count` connects (pairs, if interleaved) from one client process; the first `discard`
    /// are not kept.
    fn round(&mut self, count: u64, discard: usize) {
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
    fn hook_round(&mut self, count: u64) {
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
            self.load_run += run_stats(load).0 - before.0;
            self.hook_connects += count;
        }
    }

    /// Run time of the program at a socket's end per connect (the client's socket and the
    /// server's).
    fn load_ns(&self) -> Option<f64> {
        (self.kind == Timed::Tcp && self.hook_connects > 0)
            .then(|| self.load_run.as_nanos() as f64 / self.hook_connects as f64)
    }

    /// Mean run time of the hook per call, in nanoseconds.
    fn hook_ns(&self) -> Option<f64> {
        let (time, runs) = self.hook_run;
        (runs > 0).then(|| time.as_nanos() as f64 / runs as f64)
    }
}

/// Cumulative run time and run count of the program behind the pinned link at `link`.
fn run_stats(link: &Path) -> (Duration, u64) {
    let link = FdLink::from(PinnedLink::from_pin(link).expect("open pinned link"));
    let id = link.info().expect("link info").program_id();
    let program = loaded_programs()
        .filter_map(Result::ok)
        .find(|program| program.id() == id)
        .expect("the linked program is loaded");
    (program.run_time(), program.run_count())
}

fn main() {
    if !is_root() {
        eprintln!("SKIPPED datapath benchmark: needs root");
        return;
    }
    // SAFETY: single-threaded here; the probe path is read by every client spawned below.
    unsafe { std::env::set_var("TOPOLOGY_PROBE", env!("CARGO_BIN_EXE_topology-probe")) };
    let quick = std::env::var_os("TOPOLOGY_BENCH_QUICK").is_some();
    let chosen: Option<Vec<usize>> = std::env::var("TOPOLOGY_BENCH_COUNTS").ok().map(|list| {
        list.split(',').map(|count| count.trim().parse().expect("TOPOLOGY_BENCH_COUNTS: numbers")).collect()
    });
    let counts: &[usize] = match &chosen {
        Some(counts) => counts,
        None if quick => &QUICK_COUNTS,
        None => &COUNTS,
    };
    let rules = std::env::var("TOPOLOGY_BENCH_RULES").map_or(true, |value| value != "0");

    let mut fx = Fixture::new(0);
    // Two backends pinned to one CPU and every client pinned to the other: the scheduler cannot
    // add noise by moving them around, and every scenario reaches the same two servers.
    let servers: Vec<(Server, Host)> = (0..2)
        .map(|i| {
            let host = fx.network.host("b");
            let options = ServerOptions { cpu: Some(SERVER_CPU), ..ServerOptions::default() };
            (Server::start_with(&host, &format!("b{i}"), &[BACKEND_PORT], &options), host)
        })
        .collect();
    let backends: Vec<SocketAddr> = servers.iter().map(|(_, host)| SocketAddr::from((host.v4, BACKEND_PORT))).collect();
    let client = fx.client.netns.name().to_owned();
    let place = |netns: &str, cgroup: &CgroupGuard| ClientPlace {
        netns: netns.to_owned(),
        cgroup: cgroup.path().to_path_buf(),
        cpu: Some(CLIENT_CPU),
    };

    let plain = CgroupGuard::new(&format!("{}-plain", fx.id));
    let no_hook = || Some((plain.path().to_path_buf(), backends.clone()));
    let mut scenarios = Vec::new();
    for kind in [Timed::Tcp, Timed::UdpConnect] {
        scenarios.push(Scenario::new(kind, NO_HOOK, None, place(&client, &plain), backends.clone()));
    }
    let mut hooked = Vec::new();
    let mut largest_feedback = None;
    let mut tracing_links = Vec::new();
    let largest = *counts.last().expect("counts");
    // Every count with a port under feedback on the node; the largest once more without, and
    // twice more in the states of outlier ejection that cost a connect anything.
    let nodes = counts
        .iter()
        .map(|&count| (count, Node::Feedback))
        .chain([Node::Unmeasured, Node::PeerFailing, Node::ChosenFailing].map(|node| (largest, node)));
    for (count, node) in nodes {
        let name = format!("{}-hook{count}{}", fx.id, node.suffix());
        let cgroup = CgroupGuard::new(&name);
        let pins = PinGuard::new(&name);
        let mut config =
            DataplaneConfig { pin_path: pins.path().to_path_buf(), cgroup: cgroup.path().to_path_buf(), ..fx.config() };
        // The default holds 65,536 IPv4 service ports; more take one flag (`--capacity`).
        config.capacities.services_v4 = config.capacities.services_v4.max((2 * count + 1).next_power_of_two() as u32);
        // The outlier ejection programs trace the whole machine, whichever cgroup: loaded once, as
        // on a node, by the largest node under feedback.
        let feedback = node != Node::Unmeasured;
        config.outlier_ejection = node == Node::Feedback && count == largest;
        let mut dp = Dataplane::open(&config).expect("open dataplane");
        let report = dp.apply(&services(count, &backends, feedback));
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        // Links are pinned: the programs stay attached after the handle is dropped.
        drop(dp);
        let layout = PinLayout::new(pins.path());
        let link = layout.link("connect4");
        let load = layout.link(topology_common::program_names::TCP_CLOSED);
        let load = load.exists().then_some(load);
        let mut hooked_row = |kind: Timed, name: &'static str, targets: Vec<SocketAddr>| {
            let mut row = Scenario::new(kind, name, Some(count), place(&client, &cgroup), targets);
            row.baseline = no_hook();
            row.hook = Some(link.clone());
            row.load = load.clone();
            if kind == Timed::Tcp && count == largest && matches!(name, HOOK | HOOK_FEEDBACK | NOT_A_SERVICE) {
                row.batches = HEADLINE_BATCHES;
            }
            scenarios.push(row);
        };
        match node {
            Node::Unmeasured => hooked_row(Timed::Tcp, HOOK_UNMEASURED_NODE, vec![target(count)]),
            Node::PeerFailing | Node::ChosenFailing => {
                let state = if node == Node::PeerFailing { outlier::State::Elsewhere } else { outlier::State::Chosen };
                outlier::Maps::open(&layout).enter(state, &backends);
                let name = if node == Node::PeerFailing { HOOK_PEER_FAILING } else { HOOK_CHOSEN_FAILING };
                hooked_row(Timed::Tcp, name, vec![target(count)]);
            }
            Node::Feedback => {
                for kind in [Timed::Tcp, Timed::UdpConnect] {
                    hooked_row(kind, HOOK, vec![target(count)]);
                    if count == largest {
                        // The hook's fixed cost: it runs and looks the destination up, but rewrites nothing.
                        hooked_row(kind, NOT_A_SERVICE, backends.clone());
                    }
                }
                hooked_row(Timed::Tcp, HOOK_FEEDBACK, vec![SocketAddr::new(vip(count), 80)]);
                if config.outlier_ejection {
                    tracing_links =
                        topology_common::program_names::OUTLIER.iter().map(|(name, _)| layout.link(name)).collect();
                }
            }
        }
        if node == Node::Feedback && count == largest {
            largest_feedback = Some((cgroup.path().to_path_buf(), link.clone()));
        }
        hooked.push((pins, cgroup));
    }
    // What the kernel's cgroup hook costs before any program work: an empty program.
    let empty = empty::EmptyHook::attach(&format!("{}-empty", fx.id));
    for kind in [Timed::Tcp, Timed::UdpConnect] {
        let mut row = Scenario::new(kind, EMPTY_PROGRAM, None, place(&client, &empty.cgroup), backends.clone());
        row.baseline = no_hook();
        row.batches = if kind == Timed::Tcp { HEADLINE_BATCHES } else { 1 };
        scenarios.push(row);
    }
    // The hook's own part of a connect elsewhere: the not-a-service cgroup interleaved with the
    // empty program's, both dialling the backends.
    let (cgroup, link) = largest_feedback.expect("the largest node under feedback");
    let place_hooked = ClientPlace { netns: client.clone(), cgroup, cpu: Some(CLIENT_CPU) };
    let mut row = Scenario::new(Timed::Tcp, OVER_EMPTY, Some(largest), place_hooked, backends.clone());
    row.baseline = Some((empty.cgroup.path().to_path_buf(), backends.clone()));
    row.hook = Some(link);
    row.batches = HEADLINE_BATCHES;
    scenarios.push(row);
    assert_eq!(tracing_links.len(), 3, "the outlier ejection programs are loaded");
    let tracing_runs = || tracing_links.iter().map(|link| run_stats(link).1).sum::<u64>();
    let tracing_before = tracing_runs();
    let mut rule_hosts = Vec::new();
    let rulesets = [
        (IPTABLES, IPTABLES_MAX, load_iptables as fn(&str, usize, &[SocketAddr])),
        (NFTABLES, usize::MAX, load_nftables),
    ];
    for (name, max, load) in rulesets.into_iter().filter(|_| rules) {
        for &count in counts.iter().filter(|&&count| count <= max) {
            let host = fx.network.host("rules");
            // kube-proxy nodes have a route to the service range (their default route); DNAT in
            // OUTPUT rewrites before the packet leaves, and this route stays inside the sandbox.
            run("ip", &["-n", host.netns.name(), "route", "add", "10.96.0.0/12", "dev", "eth0"]);
            let started = Instant::now();
            load(host.netns.name(), count, &backends);
            eprintln!("{name}: {count} services loaded in {:.1} s", started.elapsed().as_secs_f64());
            let place = place(host.netns.name(), &plain);
            scenarios.push(Scenario::new(Timed::Tcp, name, Some(count), place, vec![target(count)]));
            rule_hosts.push(host);
        }
    }

    for scenario in &mut scenarios {
        scenario.round(WARMUP, usize::MAX);
    }
    let mut order: Vec<usize> = (0..scenarios.len()).collect();
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    for round in 1..=ROUNDS {
        // A different order every round, so no scenario always runs first or after another.
        for i in (1..order.len()).rev() {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            order.swap(i, (seed % (i as u64 + 1)) as usize);
        }
        for &index in &order {
            let scenario = &mut scenarios[index];
            scenario.round(PER_ROUND * scenario.batches, DISCARD);
        }
        if round % 10 == 0 {
            eprintln!("round {round}/{ROUNDS} done");
        }
    }
    // The hook's own cost as the kernel measures it, in rounds of their own: BPF run-time stats
    // add two clock reads to every run, which must not land in the latencies above.
    {
        let _stats = enable_stats(Stats::RunTime).expect("enable BPF run-time statistics");
        for _ in 0..HOOK_ROUNDS {
            for scenario in &mut scenarios {
                scenario.hook_round(PER_ROUND);
            }
        }
    }
    // Every connection of the run succeeded: the outlier programs, run-time statistics on or
    // off, must not have run once.
    let connects: u64 = scenarios.iter().map(|s| (s.samples_ns.len() + s.baseline_ns.len()) as u64).sum();
    let outlier_runs = (tracing_runs() - tracing_before, connects);
    drop(rule_hosts);
    drop(hooked);
    drop(empty);
    drop(plain);
    drop(servers);
    print_table(&scenarios, outlier_runs);
}

/// The hooked nodes: each count's with a port under feedback, and at the largest count one
/// measuring nothing and two in the states of outlier ejection that cost a connect anything.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Node {
    Feedback,
    Unmeasured,
    PeerFailing,
    ChosenFailing,
}

impl Node {
    fn suffix(self) -> &'static str {
        match self {
            Node::Feedback => "",
            Node::Unmeasured => "u",
            Node::PeerFailing => "p",
            Node::ChosenFailing => "c",
        }
    }
}

/// The ClusterIP the client dials: the service in the middle of the list (average position in
/// the iptables chain).
fn target(count: usize) -> SocketAddr {
    SocketAddr::new(vip(count / 2), 80)
}

/// `count` services, each with TCP and UDP port 80 over the two backends; with `feedback`, one
/// more (index `count`) whose TCP port is under feedback (measured by the load signal).
fn services(count: usize, backends: &[SocketAddr], feedback: bool) -> DesiredState {
    let mut desired = DesiredState::default();
    let weighted: Vec<WeightedBackend> = backends
        .iter()
        .map(|b| WeightedBackend { addr: b.ip(), port: b.port(), weight: 1, locality: Locality::Zone })
        .collect();
    for index in 0..count {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            desired.services.insert(
                ServicePort { vip: vip(index), port: 80, protocol },
                DesiredService {
                    name: format!("bench/svc-{index}:{protocol}"),
                    backends: weighted.clone(),
                    ..Default::default()
                },
            );
        }
    }
    if feedback {
        desired.services.insert(
            ServicePort { vip: vip(count), port: 80, protocol: Protocol::Tcp },
            DesiredService {
                name: "bench/feedback:TCP".into(),
                backends: weighted,
                // Under feedback: measured, and with the per-connection limit, so each connect
                // also reads the drawn backend's connections in flight.
                options: PortOptions { measured: true, spill_at: 4, ..PortOptions::default() },
            },
        );
    }
    desired
}
