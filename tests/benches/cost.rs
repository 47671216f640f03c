//! `cargo xtask bench cost`: what cross-zone accounting counts and what it costs, in one run,
//! through the real kernel (the agent's dataplane with `--byte-accounting on`, two backends, a
//! client namespace and cgroup).
//!
//! - Accuracy: bulk transfers of 1 MiB to 1 GiB through a Service (uploads, with a download of a
//!   sixteenth), short and held open for 12 s while the sweep runs as the agent runs it; the
//!   bytes counted against the bytes the clients wrote and read.
//! - The connect: TCP `connect()` p50 through the hook with the accounting program attached and
//!   detached, alternating round by round (it is node-wide, so it cannot be interleaved connect by
//!   connect); and the program's own run time per TCP socket destroyed (BPF statistics).
//! - The sweep: 100,000 connections open through the hook in the client namespace (and their
//!   server ends in the backends': 200,000 TCP sockets), swept in every namespace: the sweeping
//!   thread's CPU time per sweep, and as the agent sweeps (namespaces where none of ours was
//!   found one time in six), the interval it takes at that cost (10 s, longer past 0.5 % of a
//!   core) and its share of one core.
//! - `udp_nohook_us`: the bare UDP `connect()` p50 (no programs) in the same run, the unit the
//!   connect's delta is also given in.
//! - UDP (`--byte-accounting all`): datagrams of connected and unconnected sockets through a
//!   Service, counted against what moved; the tracepoints' own run time per datagram through a
//!   Service and per send or receive of another socket (a TCP transfer's), and what the send
//!   hook adds to leave each datagram for them (BPF statistics, UDP accounting on against off).
//!
//! Root only; everything lives in a sandbox removed at the end. `TOPOLOGY_BENCH_QUICK=1` holds
//! 10,000 connections for the sweep, not 100,000.

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use aya::{
    programs::loaded_programs,
    sys::{Stats, enable_stats},
};
use topology_agent::sockets::sweep::{IDLE_EVERY, next_wait, thread_cpu};
use topology_common::ByteCount;
use topology_dataplane::{ByteAccounting, BytesSweep, CountedBytes, Dataplane, LoadOptions, LoadSignal};
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, Locality, PortOptions, ServicePort, WeightedBackend};
use topology_tests::{
    bulk::{self, BulkServer, HeldConnections, Transfer},
    datagrams::{self, DatagramServer, Exchange},
    fixture::{BACKEND_PORT, Fixture},
    net::ClientPlace,
    netns,
    sandbox::{CgroupGuard, is_root, run},
};

const BULK_PORT: u16 = 9000;
const HOLD_PORT: u16 = 9001;
const DATAGRAM_PORT: u16 = 9002;
const MIB: u64 = 1 << 20;
/// Connections held open for the sweep (`TOPOLOGY_BENCH_QUICK`: the second).
const SOCKETS: [u64; 2] = [100_000, 10_000];
/// Rounds of the connect comparison, each with the program attached and detached (and of the
/// send hook's, with UDP accounting on and off).
const ROUNDS: usize = 24;
const CONNECTS: u64 = 5_000;

fn vip(port: u16) -> SocketAddr {
    SocketAddr::from(([10, 96, 0, 60], port))
}

fn desired(fx: &Fixture) -> DesiredState {
    let mut desired = DesiredState::default();
    for (port, target, protocol) in [
        (80, BACKEND_PORT, Protocol::Tcp),
        (BULK_PORT, BULK_PORT, Protocol::Tcp),
        (HOLD_PORT, HOLD_PORT, Protocol::Tcp),
        (DATAGRAM_PORT, DATAGRAM_PORT, Protocol::Udp),
    ] {
        let backends = fx
            .backends
            .iter()
            .map(|b| WeightedBackend { addr: IpAddr::V4(b.host.v4), port: target, weight: 1, locality: Locality::Zone })
            .collect();
        let key = ServicePort { vip: vip(port).ip(), port, protocol };
        let name = format!("default/cost:{port}");
        desired.services.insert(key, DesiredService { name, backends, options: PortOptions::default() });
    }
    desired
}

/// Both directions summed over every count.
fn total(counted: &[CountedBytes]) -> ByteCount {
    counted.iter().fold(ByteCount::default(), |sum, c| ByteCount {
        to_backend: sum.to_backend + c.bytes.to_backend,
        from_backend: sum.from_backend + c.bytes.from_backend,
    })
}

/// Runs `sweep` in the namespace `name` (the host's when `None`); returns it, the sweeping
/// thread's CPU time, and the connections of ours it found.
fn sweep_in(sweep: BytesSweep, name: Option<&str>) -> (BytesSweep, Duration, u64) {
    let run = move || {
        let mut sweep = sweep;
        let started = thread_cpu();
        let ours = sweep.run_here().expect("sweep");
        let cpu = thread_cpu() - started;
        (sweep, cpu, ours)
    };
    match name {
        Some(name) => netns::run_in(name, run),
        None => run(),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A distribution-free 95 % confidence interval of the median of `values` (order statistics,
/// the sign test's normal approximation).
fn median_interval(values: &[f64]) -> (f64, f64) {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len() as f64;
    let k = ((n - 1.96 * n.sqrt()) / 2.0).floor().max(0.0) as usize;
    (sorted[k], sorted[sorted.len() - 1 - k])
}

fn p50_us(mut ns: Vec<u64>) -> f64 {
    ns.sort_unstable();
    ns[ns.len() / 2] as f64 / 1000.0
}

/// The run time and runs so far of the programs named `names` (statistics must be on).
fn runs_of(names: &[&str]) -> (Duration, u64) {
    loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str().is_some_and(|name| names.contains(&name)))
        .fold((Duration::ZERO, 0), |(time, runs), p| (time + p.run_time(), runs + p.run_count()))
}

/// Nanoseconds per run of the programs named `names` while `work` runs.
fn ns_per_run(names: &[&str], work: impl FnOnce()) -> f64 {
    let before = runs_of(names);
    work();
    let after = runs_of(names);
    (after.0 - before.0).as_nanos() as f64 / (after.1 - before.1).max(1) as f64
}

/// The UDP accounting programs.
const UDP_PROGRAMS: [&str; 2] =
    [topology_common::program_names::BYTES_SENT, topology_common::program_names::BYTES_RECEIVED];

fn main() {
    if !is_root() {
        eprintln!("SKIPPED cost benchmark: needs root");
        return;
    }
    // SAFETY: single-threaded here; the probe path is read by every client spawned below.
    unsafe { std::env::set_var("TOPOLOGY_PROBE", env!("CARGO_BIN_EXE_topology-probe")) };
    let quick = std::env::var_os("TOPOLOGY_BENCH_QUICK").is_some();
    let wanted = SOCKETS[usize::from(quick)];
    let fx = Fixture::new(2);
    for backend in &fx.backends {
        // The holding servers never accept: their accept queues hold the connections (set before
        // they listen).
        run("ip", &["netns", "exec", backend.host.netns.name(), "sysctl", "-qw", "net.core.somaxconn=65535"]);
    }
    let _servers: Vec<BulkServer> = fx
        .backends
        .iter()
        .flat_map(|b| [BulkServer::start(&b.host, BULK_PORT, false), BulkServer::start(&b.host, HOLD_PORT, true)])
        .collect();
    let _datagram_servers: Vec<DatagramServer> =
        fx.backends.iter().map(|b| DatagramServer::start(&b.host, &[DATAGRAM_PORT])).collect();
    // The load signal off: `tcp_closed` then runs for accounting alone, and is detached with it.
    let config = |byte_accounting| {
        let mut config = fx.config();
        config.programs =
            LoadOptions { byte_accounting, outlier_ejection: true, load_signal: LoadSignal::Off, ..config.programs };
        config
    };
    let mut dp = Dataplane::open(&config(ByteAccounting::All)).expect("open the dataplane");
    assert!(dp.apply(&desired(&fx)).failed.is_empty());
    let place = ClientPlace { cpu: Some(0), ..fx.place() };

    // Accuracy.
    println!("| transfer | connections | sent (bytes) | counted | error | received | counted | error |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let mut error_pct: f64 = 0.0;
    let mut sweep = Some(dp.bytes_sweep().expect("load the sweep"));
    for (size, connections, hold) in
        [(MIB, 20, 0), (16 * MIB, 4, 0), (256 * MIB, 2, 0), (1024 * MIB, 1, 0), (64 * MIB, 1, 12)]
    {
        let before = total(&dp.bytes().expect("read the counts"));
        let transfer = Transfer { send: size, receive: size / 16, hold: Duration::from_secs(hold) };
        let client = bulk::spawn(&place, vip(BULK_PORT), transfer, connections);
        if hold > 0 {
            // The agent's sweeps, while the connection is open.
            for _ in 0..2 {
                std::thread::sleep(Duration::from_secs(hold / 3));
                sweep = Some(sweep_in(sweep.take().unwrap(), Some(fx.client.netns.name())).0);
            }
        }
        let report = bulk::finish(client, Duration::from_secs(300));
        assert!(report.errors.is_empty(), "{report:?}");
        std::thread::sleep(Duration::from_millis(200));
        let after = total(&dp.bytes().expect("read the counts"));
        let counted = after.since(&before);
        let error = |counted: u64, moved: u64| 100.0 * counted.abs_diff(moved) as f64 / moved as f64;
        let (up, down) = (error(counted.to_backend, report.sent), error(counted.from_backend, report.received));
        error_pct = error_pct.max(up).max(down);
        let held = if hold > 0 { format!(", held {hold} s") } else { String::new() };
        println!(
            "| {} MiB up, {} KiB down{held} | {connections} | {} | {} | {up:.5} % | {} | {} | {down:.5} % |",
            size / MIB,
            size / 16 / 1024,
            report.sent,
            counted.to_backend,
            report.received,
            counted.from_backend,
        );
    }
    // UDP: connected sockets in bulk, and one unconnected socket as a resolver uses it.
    for (what, exchange) in [
        (
            "UDP connected, 32 KiB datagrams",
            Exchange { count: 32, size: 32 * 1024, reply: 64, connected: true, peek: false },
        ),
        (
            "UDP connected, 32 KiB datagrams",
            Exchange { count: 32 * 1024, size: 32 * 1024, reply: 64, connected: true, peek: false },
        ),
        (
            "UDP unconnected, 512-byte queries",
            Exchange { count: 16 * 1024, size: 512, reply: 1024, connected: false, peek: false },
        ),
    ] {
        let before = total(&dp.bytes().expect("read the counts"));
        let moved =
            datagrams::finish(datagrams::spawn(&place, &[vip(DATAGRAM_PORT)], exchange), Duration::from_secs(300));
        let counted = total(&dp.bytes().expect("read the counts")).since(&before);
        let (sent, received) = (moved[0].sent, moved[0].received);
        let error = |counted: u64, moved: u64| 100.0 * counted.abs_diff(moved) as f64 / moved.max(1) as f64;
        let (up, down) = (error(counted.to_backend, sent), error(counted.from_backend, received));
        error_pct = error_pct.max(up).max(down);
        println!(
            "| {what}: {} KiB up, {} KiB down | {} datagrams | {sent} | {} | {up:.5} % | {received} | {} | {down:.5} % |",
            sent / 1024,
            received / 1024,
            exchange.count,
            counted.to_backend,
            counted.from_backend,
        );
    }

    // The connect, attached and detached by turns; the program's own time per socket destroyed.
    let _stats = enable_stats(Stats::RunTime).expect("enable BPF run-time statistics");
    let targets = [vip(80)];
    let (mut on, mut off, mut deltas) = (Vec::new(), Vec::new(), Vec::new());
    let mut destroyed = (Duration::ZERO, 0);
    drop(dp);
    for round in 0..ROUNDS {
        let mut p50 = [0.0; 2];
        for accounting in if round % 2 == 0 { [true, false] } else { [false, true] } {
            let mode = if accounting { ByteAccounting::Tcp } else { ByteAccounting::Off };
            let dp = Dataplane::open(&config(mode)).expect("reopen the dataplane");
            let before = runs_of(&[topology_common::program_names::TCP_CLOSED]);
            let report = place.timed_tcp(&targets, CONNECTS);
            assert!(report.errors.is_empty(), "{report:?}");
            if accounting {
                let after = runs_of(&[topology_common::program_names::TCP_CLOSED]);
                destroyed = (destroyed.0 + (after.0 - before.0), destroyed.1 + (after.1 - before.1));
            }
            p50[usize::from(accounting)] = p50_us(report.connect_ns);
            drop(dp);
        }
        off.push(p50[0]);
        on.push(p50[1]);
        deltas.push(p50[1] - p50[0]);
    }
    let spread = |v: &[f64]| v.iter().copied().fold(f64::MIN, f64::max) - v.iter().copied().fold(f64::MAX, f64::min);
    let on_spread = spread(&on);
    let delta_interval = median_interval(&deltas);
    let (on, off, connect_delta) = (median(on), median(off), median(deltas));
    let close_ns = destroyed.0.as_nanos() as f64 / destroyed.1.max(1) as f64;

    // UDP's tracepoints: per datagram of ours, per send or receive of any other socket; the send
    // hook with and without leaving each datagram for them.
    let queries = Exchange { count: 20_000, size: 512, reply: 512, connected: false, peek: false };
    let resolve = || {
        let moved =
            datagrams::finish(datagrams::spawn(&place, &[vip(DATAGRAM_PORT)], queries), Duration::from_secs(120));
        assert_eq!(moved[0].lost, 0, "{moved:?}");
    };
    let sendmsg = [topology_common::program_names::SENDMSG4];
    let mut send_hook_deltas = Vec::new();
    for round in 0..ROUNDS {
        let mut ns = [0.0; 2];
        let modes = [ByteAccounting::Tcp, ByteAccounting::All];
        for n in if round % 2 == 0 { [0, 1] } else { [1, 0] } {
            let _dp = Dataplane::open(&config(modes[n])).expect("reopen the dataplane");
            ns[n] = ns_per_run(&sendmsg, resolve);
        }
        send_hook_deltas.push(ns[1] - ns[0]);
    }
    let send_hook_delta_ns = median(send_hook_deltas);
    let dp = Dataplane::open(&config(ByteAccounting::All)).expect("reopen the dataplane");
    let udp_datagram_ns = ns_per_run(&UDP_PROGRAMS, resolve);
    let upload = Transfer { send: 256 * MIB, receive: 16 * MIB, hold: Duration::ZERO };
    let udp_other_ns = ns_per_run(&UDP_PROGRAMS, || {
        let report = bulk::finish(bulk::spawn(&place, vip(BULK_PORT), upload, 1), Duration::from_secs(120));
        assert!(report.errors.is_empty(), "{report:?}");
    });

    // The sweep over 100,000 open connections.
    run("ip", &["netns", "exec", fx.client.netns.name(), "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65535"]);

    let started = Instant::now();
    let held = HeldConnections::open(&place, &[vip(HOLD_PORT)], wanted);
    let opened_in = started.elapsed();
    let sockets = held.open;
    assert!(sockets * 100 >= wanted * 99, "only {sockets} of {wanted} connections opened");
    let mut namespaces: Vec<Option<String>> = vec![None, Some(fx.client.netns.name().to_owned())];
    namespaces.extend(fx.backends.iter().map(|b| Some(b.host.netns.name().to_owned())));
    // Each sweep of every namespace: its CPU, and the part spent where none of ours was found
    // (which the agent sweeps one time in `IDLE_EVERY`).
    let (mut sweeps, mut holding) = (Vec::new(), 0);
    let mut sweep = sweep.take().unwrap();
    for _ in 0..6 {
        let (mut cpu, mut idle, mut found) = (Duration::ZERO, Duration::ZERO, 0);
        for name in &namespaces {
            let (back, spent, ours) = sweep_in(sweep, name.as_deref());
            sweep = back;
            cpu += spent;
            if ours == 0 {
                idle += spent;
            } else {
                found += 1;
            }
        }
        holding = found;
        sweeps.push((cpu, idle));
    }
    let first = sweeps.remove(0).0;
    sweeps.sort();
    let (steady, idle) = sweeps[sweeps.len() / 2];
    let as_agent = steady - idle + idle / IDLE_EVERY;
    let interval = next_wait(as_agent);
    let iterator_cpu_pct = 100.0 * as_agent.as_secs_f64() / interval.as_secs_f64();
    drop(held);
    drop(dp);

    // The unit: a bare UDP connect, no programs.
    let bare = CgroupGuard::new(&format!("{}-bare", fx.id));
    let bare_place = ClientPlace { cgroup: bare.path().to_path_buf(), ..place.clone() };
    let direct: Vec<SocketAddr> = fx.backends.iter().map(|b| SocketAddr::from((b.host.v4, BACKEND_PORT))).collect();
    let udp_nohook_us = p50_us(bare_place.timed_udp_connect(&direct, 5_000).connect_ns);

    println!();
    println!("| figure | value |");
    println!("| --- | ---: |");
    println!("| TCP connect p50 through the hook, accounting attached (median of {ROUNDS} rounds) | {on:.2} µs |");
    println!("| the same, accounting detached | {off:.2} µs |");
    println!("| the rounds' p50s spread over (attached) | {on_spread:.2} µs |");
    println!(
        "| median of the rounds' differences, attached minus detached [95 % interval] | {connect_delta:+.2} µs \
         [{:+.2}, {:+.2}] |",
        delta_interval.0, delta_interval.1
    );
    println!("| the accounting program per TCP socket destroyed (its own run time) | {close_ns:.0} ns |");
    println!("| UDP: the tracepoints per send or receive of a datagram through a Service | {udp_datagram_ns:.0} ns |");
    println!("| UDP: the tracepoints per send or receive of another socket (a TCP upload's) | {udp_other_ns:.0} ns |");
    println!(
        "| UDP: the send hook per datagram, UDP accounting on minus off (median of {ROUNDS} paired rounds) | \
         {send_hook_delta_ns:+.0} ns |"
    );
    println!("| connections open for the sweep (opened in {:.1} s) | {} |", opened_in.as_secs_f64(), sockets);
    println!(
        "| one sweep of every namespace, CPU, first (makes each socket's storage) | {:.1} ms |",
        first.as_secs_f64() * 1e3
    );
    println!("| one sweep of every namespace, CPU, after | {:.1} ms |", steady.as_secs_f64() * 1e3);
    println!(
        "| a sweep as the agent runs it ({holding} of {} namespaces hold connections of ours; the others \
         one time in {IDLE_EVERY}), CPU | {:.1} ms |",
        namespaces.len(),
        as_agent.as_secs_f64() * 1e3
    );
    println!("| the interval the agent sweeps at, at this cost | {:.0} s |", interval.as_secs_f64());
    println!("| the sweeps' share of one core | {iterator_cpu_pct:.2} % |");
    println!("| UDP connect p50, no programs | {udp_nohook_us:.2} µs |");
    println!();
    println!(
        "cost: error_pct={error_pct:.5} connect_delta_us={:.2} iterator_cpu_pct={iterator_cpu_pct:.2} sockets={sockets} \
         udp_nohook_us={udp_nohook_us:.2} close_ns={close_ns:.0} udp_datagram_ns={udp_datagram_ns:.0} \
         udp_other_ns={udp_other_ns:.0} udp_send_hook_ns={send_hook_delta_ns:.0}",
        connect_delta,
    );
}
