//! `cargo xtask bench datapath`: connect() latency from a client namespace to a backend, side by
//! side in one run: no hook; our hook with 10 / 1,000 / 10,000 / 30,000 / 50,000 services
//! installed (each with TCP and UDP port 80: 100,000 service ports at the most); a
//! kube-proxy-shaped iptables ruleset (KUBE-SERVICES -> KUBE-SVC-* -> KUBE-SEP-* with
//! `statistic --mode random`) with the same service counts up to 30,000, and kube-proxy's
//! nftables mode (a `service-ips` verdict map, `numgen random mod N` per service) at every count,
//! each inside a namespace; and the rules the real kube-proxy 1.35 programs in each mode for the
//! same Services on the real API server (`datapath/real_proxy.rs`), loaded as it wrote them.
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
//! The run goes in phases, one node at a time: each hooked node (a dataplane with its own cgroup
//! and pinned maps) is installed for its phase and removed after it, since the programs at a
//! socket's end trace the whole machine and a node runs one dataplane; the rows without our
//! programs (no hook, the rulesets) have a phase of their own. Within a phase the rounds run its
//! rows in a new random order each time, so drift of the machine spreads evenly; every hooked row
//! is compared pair by pair with a cgroup without programs, so drift between phases cancels.
//! Every hooked node but one also has a TCP port under feedback, so the load signal measures
//! there, as on a node that uses feedback anywhere (its connections are counted by the connect
//! hook and where their socket ends; nothing runs on any other connect); the row without it shows
//! what a node that measures nothing pays. A Service under feedback has its own row. The rulesets
//! compared are kube-proxy's iptables and nftables modes.
//!
//! Root only; everything lives in a sandbox removed at the end. `TOPOLOGY_BENCH_QUICK=1` runs only
//! the 10-service rows; `TOPOLOGY_BENCH_COUNTS=50000` (a comma-separated list) runs those counts,
//! and `TOPOLOGY_BENCH_RULES=0` leaves the iptables and nftables rows out.

#[path = "datapath/empty.rs"]
mod empty;
#[path = "datapath/nodes.rs"]
mod nodes;
#[path = "datapath/outlier.rs"]
mod outlier;
#[path = "datapath/real_proxy.rs"]
mod real_proxy;
#[path = "datapath/report.rs"]
mod report;
#[path = "datapath/rules.rs"]
mod rules;
#[path = "datapath/scenario.rs"]
mod scenario;

use std::{net::SocketAddr, path::PathBuf, time::Instant};

use aya::sys::{Stats, enable_stats};
use nodes::{HookedNode, Node, target};
use report::print_table;
use rules::{load_iptables, load_nftables};
use scenario::Scenario;
use topology_tests::{
    fixture::{BACKEND_PORT, Fixture},
    kubernetes::proxy::ProxyMode,
    net::{ClientPlace, Host, Server, ServerOptions},
    sandbox::{CgroupGuard, is_root, run},
    traffic::Timed,
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
const KP_IPTABLES: &str = "kube-proxy 1.35 iptables mode, its own rules";
const KP_NFTABLES: &str = "kube-proxy 1.35 nftables mode, its own rules";

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
    let plain = CgroupGuard::new(&format!("{}-plain", fx.id));
    let client = ClientPlace {
        netns: fx.client.netns.name().to_owned(),
        cgroup: plain.path().to_path_buf(),
        cpu: Some(CLIENT_CPU),
    };
    let no_hook: (PathBuf, Vec<SocketAddr>) = (plain.path().to_path_buf(), backends.clone());
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;

    // The phase without our programs: no hook (the run's unit of CPU speed and the rulesets'
    // baseline, round by round) and the rulesets, each in a namespace of its own.
    let mut plain_rows: Vec<Scenario> = [Timed::Tcp, Timed::UdpConnect]
        .map(|kind| Scenario::new(kind, NO_HOOK, None, client.clone(), backends.clone()))
        .into();
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
            let place = ClientPlace { netns: host.netns.name().to_owned(), ..client.clone() };
            plain_rows.push(Scenario::new(Timed::Tcp, name, Some(count), place, vec![target(count)]));
            rule_hosts.push(host);
        }
    }
    // The real kube-proxy's rules at the same counts, loaded as it programmed them.
    let captured = if rules { real_proxy::capture(counts, IPTABLES_MAX, &backends) } else { Vec::new() };
    for captured in captured {
        let host = fx.network.host("kp");
        run("ip", &["-n", host.netns.name(), "route", "add", "10.96.0.0/12", "dev", "eth0"]);
        let name = match captured.mode {
            ProxyMode::Nftables => KP_NFTABLES,
            ProxyMode::Iptables | ProxyMode::IptablesLegacy => KP_IPTABLES,
        };
        real_proxy::load(host.netns.name(), &captured);
        let place = ClientPlace { netns: host.netns.name().to_owned(), ..client.clone() };
        plain_rows.push(Scenario::new(Timed::Tcp, name, Some(captured.count), place, vec![captured.target]));
        rule_hosts.push(host);
    }
    measure("no programs", &mut plain_rows, &mut seed);
    drop(rule_hosts);

    // Every count with a port under feedback on the node; the largest once more without, and
    // twice more in the states of outlier ejection that cost a connect anything.
    let largest = *counts.last().expect("counts");
    let nodes = counts
        .iter()
        .map(|&count| (count, Node::Feedback))
        .chain([Node::Unmeasured, Node::PeerFailing, Node::ChosenFailing].map(|node| (largest, node)));
    let mut hooked_rows = Vec::new();
    // The outlier ejection programs' runs, and the connects of the phases they were attached in.
    let mut outlier_runs = (0, 0);
    for (count, node) in nodes {
        let hooked = HookedNode::install(&fx, count, node, &backends);
        let mut rows = hooked.rows(&client, &no_hook, largest);
        // What the kernel's cgroup hook costs before any program work (an empty program), and
        // the not-a-service cgroup interleaved with it: the program's own part of a connect
        // elsewhere. Beside the largest node under feedback, whose not-a-service row it is.
        let empty =
            (count == largest && node == Node::Feedback).then(|| empty::EmptyHook::attach(&format!("{}-empty", fx.id)));
        if let Some(empty) = &empty {
            for kind in [Timed::Tcp, Timed::UdpConnect] {
                let place = ClientPlace { cgroup: empty.cgroup.path().to_path_buf(), ..client.clone() };
                let mut row = Scenario::new(kind, EMPTY_PROGRAM, None, place, backends.clone());
                row.baseline = Some(no_hook.clone());
                row.batches = if kind == Timed::Tcp { HEADLINE_BATCHES } else { 1 };
                rows.push(row);
            }
            let place = ClientPlace { cgroup: hooked.cgroup.path().to_path_buf(), ..client.clone() };
            let mut row = Scenario::new(Timed::Tcp, OVER_EMPTY, Some(largest), place, backends.clone());
            row.baseline = Some((empty.cgroup.path().to_path_buf(), backends.clone()));
            row.hook = Some(hooked.layout().link("connect4"));
            row.batches = HEADLINE_BATCHES;
            rows.push(row);
        }
        let before = hooked.outlier_runs();
        measure(&format!("{count} services, {node:?}"), &mut rows, &mut seed);
        // Every connection of the phase succeeded: the outlier programs, run-time statistics on
        // or off, must not have run once.
        outlier_runs.0 += hooked.outlier_runs() - before;
        outlier_runs.1 += rows.iter().map(|s| (s.samples_ns.len() + s.baseline_ns.len()) as u64).sum::<u64>();
        hooked_rows.extend(rows);
    }
    drop(plain);
    drop(servers);
    // The table: no hook, the hooked rows, then the rulesets.
    let rulesets = plain_rows.split_off(2);
    let scenarios: Vec<Scenario> = plain_rows.into_iter().chain(hooked_rows).chain(rulesets).collect();
    print_table(&scenarios, outlier_runs);
}

/// One phase's rows measured: a warm-up round each, `ROUNDS` rounds running them in a new random
/// order each time (so no row always runs first or after another), then `HOOK_ROUNDS` with the
/// kernel's BPF run-time statistics on (they add two clock reads to every program run, which must
/// not land in the latencies).
fn measure(phase: &str, rows: &mut [Scenario], seed: &mut u64) {
    let started = Instant::now();
    for row in rows.iter_mut() {
        row.round(WARMUP, usize::MAX);
    }
    let mut order: Vec<usize> = (0..rows.len()).collect();
    for _ in 0..ROUNDS {
        for i in (1..order.len()).rev() {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            order.swap(i, (*seed % (i as u64 + 1)) as usize);
        }
        for &index in &order {
            let row = &mut rows[index];
            row.round(PER_ROUND * row.batches, DISCARD);
        }
    }
    let _stats = enable_stats(Stats::RunTime).expect("enable BPF run-time statistics");
    for _ in 0..HOOK_ROUNDS {
        for row in rows.iter_mut() {
            row.hook_round(PER_ROUND);
        }
    }
    eprintln!("phase {phase}: {} rows in {:.0} s", rows.len(), started.elapsed().as_secs_f64());
}
