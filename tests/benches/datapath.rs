//! `cargo xtask bench datapath`: connect() latency from a client namespace to a backend, side by
//! side in one run: no hook; our hook with 10 / 1,000 / 10,000 / 30,000 services installed; and a
//! kube-proxy-shaped iptables ruleset (KUBE-SERVICES -> KUBE-SVC-* -> KUBE-SEP-* with
//! `statistic --mode random`) with the same service counts, inside a namespace.
//!
//! Two measurements:
//! - TCP `connect()` (SYN to established, through a bridge): what an application waits for, and
//!   where iptables pays its rule walk;
//! - UDP `connect()`, which sends nothing: the route lookup plus the cgroup hook alone, so the
//!   hook's own cost is not hidden under the handshake's noise.
//!
//! Every scenario exists at once (each hooked one has its own cgroup and pinned maps) and the
//! rounds run them in a new random order each time, so drift of the machine spreads evenly.
//! Root only; everything lives in a sandbox removed at the end. `TOPOLOGY_BENCH_QUICK=1` runs only
//! the 10-service rows.

use std::{
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, SocketAddr},
    process::{Command, Stdio},
};

use topology_agent::{
    dataplane::{Dataplane, DataplaneConfig},
    desired::{DesiredService, DesiredState, Locality, Protocol, ServicePort, WeightedBackend},
};
use topology_tests::{
    fixture::{BACKEND_PORT, Fixture},
    net::{ClientPlace, Host, Server, ServerOptions},
    sandbox::{CgroupGuard, PinGuard, is_root, run},
    traffic::Report,
};

const COUNTS: [usize; 4] = [10, 1_000, 10_000, 30_000];
const QUICK_COUNTS: [usize; 1] = [10];
const WARMUP: u64 = 300;
const ROUNDS: u64 = 40;
const PER_ROUND: u64 = 550;
/// Connects at the start of each client process that are not counted (cold caches).
const DISCARD: usize = 50;
const CLIENT_CPU: usize = 0;
const SERVER_CPU: usize = 1;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tcp,
    UdpConnect,
}

/// One way of reaching the backends, and every connect() duration measured for it.
struct Scenario {
    kind: Kind,
    name: &'static str,
    services: Option<usize>,
    place: ClientPlace,
    /// Dialled in turn, a share of each round each.
    targets: Vec<SocketAddr>,
    samples_ns: Vec<u64>,
}

impl Scenario {
    /// `count` connects split over the targets, one client process each; the first `discard` of
    /// each process are not kept.
    fn round(&mut self, count: u64, discard: usize) {
        let per_target = count / self.targets.len() as u64;
        for target in self.targets.clone() {
            let report: Report = match self.kind {
                Kind::Tcp => self.place.timed_tcp(target, per_target),
                Kind::UdpConnect => self.place.timed_udp_connect(target, per_target),
            };
            assert_eq!(report.failures(), 0, "{} ({:?}): {:?}", self.name, self.services, report.errors);
            self.samples_ns.extend(report.connect_ns.iter().skip(discard));
        }
    }
}

fn main() {
    if !is_root() {
        eprintln!("SKIPPED datapath benchmark: needs root");
        return;
    }
    // SAFETY: single-threaded here; the probe path is read by every client spawned below.
    unsafe { std::env::set_var("TOPOLOGY_PROBE", env!("CARGO_BIN_EXE_topology-probe")) };
    let quick = std::env::var_os("TOPOLOGY_BENCH_QUICK").is_some();
    let counts: &[usize] = if quick { &QUICK_COUNTS } else { &COUNTS };

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
    let mut scenarios = Vec::new();
    for kind in [Kind::Tcp, Kind::UdpConnect] {
        scenarios.push(Scenario {
            kind,
            name: "no hook (direct to the backends)",
            services: None,
            place: place(&client, &plain),
            targets: backends.clone(),
            samples_ns: Vec::new(),
        });
    }
    let mut hooked = Vec::new();
    for &count in counts {
        let cgroup = CgroupGuard::new(&format!("{}-hook{count}", fx.id));
        let pins = PinGuard::new(&format!("{}-hook{count}", fx.id));
        let config =
            DataplaneConfig { pin_path: pins.path().to_path_buf(), cgroup: cgroup.path().to_path_buf(), ..fx.config() };
        let mut dp = Dataplane::open(&config).expect("open dataplane");
        let report = dp.apply(&services(count, &backends));
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        // Links are pinned: the programs stay attached after the handle is dropped.
        drop(dp);
        for kind in [Kind::Tcp, Kind::UdpConnect] {
            scenarios.push(Scenario {
                kind,
                name: "topology-agent hook",
                services: Some(count),
                place: place(&client, &cgroup),
                targets: vec![target(count)],
                samples_ns: Vec::new(),
            });
        }
        hooked.push((pins, cgroup));
    }
    let mut iptables_hosts = Vec::new();
    for &count in counts {
        let host = fx.network.host("ipt");
        // kube-proxy nodes have a route to the service range (their default route); DNAT in OUTPUT
        // rewrites before the packet leaves, and this route stays inside the sandbox.
        run("ip", &["-n", host.netns.name(), "route", "add", "10.96.0.0/12", "dev", "eth0"]);
        load_iptables(host.netns.name(), count, &backends);
        scenarios.push(Scenario {
            kind: Kind::Tcp,
            name: "iptables, kube-proxy shaped",
            services: Some(count),
            place: place(host.netns.name(), &plain),
            targets: vec![target(count)],
            samples_ns: Vec::new(),
        });
        iptables_hosts.push(host);
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
            scenarios[index].round(PER_ROUND, DISCARD);
        }
        if round % 10 == 0 {
            eprintln!("round {round}/{ROUNDS} done");
        }
    }
    drop(iptables_hosts);
    drop(hooked);
    drop(plain);
    drop(servers);
    print_table(&scenarios);
}

/// The ClusterIP the client dials: the service in the middle of the list (average position in
/// the iptables chain).
fn target(count: usize) -> SocketAddr {
    SocketAddr::new(vip(count / 2), 80)
}

fn vip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 96 + (index >> 16) as u8, (index >> 8) as u8, index as u8))
}

/// `count` services, each with TCP and UDP port 80 over the two backends.
fn services(count: usize, backends: &[SocketAddr]) -> DesiredState {
    let mut desired = DesiredState::default();
    let weighted: Vec<WeightedBackend> = backends
        .iter()
        .map(|b| WeightedBackend { addr: b.ip(), port: b.port(), weight: 1, locality: Locality::Zone })
        .collect();
    for index in 0..count {
        for protocol in [Protocol::Tcp, Protocol::Udp] {
            desired.services.insert(
                ServicePort { vip: vip(index), port: 80, protocol },
                DesiredService { name: format!("bench/svc-{index}:{protocol}"), backends: weighted.clone() },
            );
        }
    }
    desired
}

fn load_iptables(netns: &str, count: usize, backends: &[SocketAddr]) {
    let mut rules = String::from("*nat\n:KUBE-SERVICES - [0:0]\n:KUBE-MARK-MASQ - [0:0]\n");
    for index in 0..count {
        let _ = writeln!(rules, ":KUBE-SVC-{index:08X} - [0:0]");
        for b in 0..backends.len() {
            let _ = writeln!(rules, ":KUBE-SEP-{index:08X}-{b} - [0:0]");
        }
    }
    rules.push_str("-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n");
    rules.push_str("-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000\n");
    for index in 0..count {
        let _ = writeln!(
            rules,
            "-A KUBE-SERVICES -d {}/32 -p tcp -m comment --comment \"bench/svc-{index}:http cluster IP\" -m tcp --dport 80 -j KUBE-SVC-{index:08X}",
            vip(index)
        );
        for (b, backend) in backends.iter().enumerate() {
            let remaining = backends.len() - b;
            let comment = format!("-m comment --comment \"bench/svc-{index}:http -> {backend}\"");
            if remaining > 1 {
                let _ = writeln!(
                    rules,
                    "-A KUBE-SVC-{index:08X} {comment} -m statistic --mode random --probability {:.11} -j KUBE-SEP-{index:08X}-{b}",
                    1.0 / remaining as f64
                );
            } else {
                let _ = writeln!(rules, "-A KUBE-SVC-{index:08X} {comment} -j KUBE-SEP-{index:08X}-{b}");
            }
            let _ = writeln!(rules, "-A KUBE-SEP-{index:08X}-{b} -s {}/32 -j KUBE-MARK-MASQ", backend.ip());
            let _ = writeln!(rules, "-A KUBE-SEP-{index:08X}-{b} -p tcp -m tcp -j DNAT --to-destination {backend}");
        }
    }
    rules.push_str("COMMIT\n");
    let mut child = Command::new("ip")
        .args(["netns", "exec", netns, "iptables-restore"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("iptables-restore");
    std::io::Write::write_all(child.stdin.as_mut().expect("stdin"), rules.as_bytes()).expect("write rules");
    drop(child.stdin.take());
    assert!(child.wait().expect("iptables-restore").success(), "iptables-restore failed");
}

fn percentile(sorted: &[u64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0
}

fn print_table(scenarios: &[Scenario]) {
    let stats = |s: &Scenario| {
        let mut ns = s.samples_ns.clone();
        ns.sort_unstable();
        (percentile(&ns, 0.5), percentile(&ns, 0.99), ns.len())
    };
    let find = |kind: Kind, name: &str, services: Option<usize>| {
        scenarios.iter().find(|s| s.kind == kind && s.name.starts_with(name) && s.services == services).map(stats)
    };
    println!(
        "\nconnect() latency: {ROUNDS} rounds, scenarios in a new random order each round; client pinned to CPU \
         {CLIENT_CPU}, the two backends to CPU {SERVER_CPU}, each in its own namespace on a bridge; the ClusterIP \
         dialled is the middle service of the list\n"
    );
    for (kind, title) in [
        (Kind::Tcp, "TCP connect() (handshake through the bridge)"),
        (Kind::UdpConnect, "UDP connect() (no packet: route lookup plus the hook)"),
    ] {
        let baseline = find(kind, "no hook", None).map_or(0.0, |s| s.0);
        println!("{title}\n");
        println!(
            "| scenario | services | samples | p50 (µs) | p99 (µs) | p50 over no hook (µs) | iptables p50 / this p50 |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        for scenario in scenarios.iter().filter(|s| s.kind == kind) {
            let (p50, p99, samples) = stats(scenario);
            let ratio = match (scenario.name.starts_with("topology"), find(Kind::Tcp, "iptables", scenario.services)) {
                (true, Some(ipt)) if kind == Kind::Tcp => format!("{:.1}×", ipt.0 / p50),
                _ => String::new(),
            };
            println!(
                "| {} | {} | {samples} | {p50:.2} | {p99:.2} | {:+.2} | {ratio} |",
                scenario.name,
                scenario.services.map_or("–".into(), |s| s.to_string()),
                p50 - baseline,
            );
        }
        println!();
    }
}
