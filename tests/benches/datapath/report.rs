//! The datapath bench's tables and its one-line summary.

use topology_tests::traffic::Timed;

use super::{
    EMPTY_PROGRAM, HEADLINE_BATCHES, HOOK, HOOK_FEEDBACK, HOOK_PEER_FAILING, HOOK_ROUNDS, HOOK_UNMEASURED_NODE,
    IPTABLES, KP_IPTABLES, KP_NFTABLES, NFTABLES, NO_HOOK, NOT_A_SERVICE, OVER_EMPTY, PER_ROUND, ROUNDS, Scenario,
};

fn percentile(sorted: &[u64], q: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0
}

pub fn median(mut ns: Vec<u64>) -> u64 {
    ns.sort_unstable();
    ns[ns.len() / 2]
}

/// p50 and p99 in µs, and the sample count.
fn summary(ns: &[u64]) -> (f64, f64, usize) {
    let mut ns = ns.to_vec();
    ns.sort_unstable();
    (percentile(&ns, 0.5), percentile(&ns, 0.99), ns.len())
}

/// The median and quartiles, in µs, of per-round deltas.
fn quartiles_us(deltas: &[i64]) -> (f64, f64, f64) {
    let mut deltas = deltas.to_vec();
    deltas.sort_unstable();
    let at = |q: f64| deltas[((deltas.len() as f64 - 1.0) * q).round() as usize] as f64 / 1000.0;
    (at(0.5), at(0.25), at(0.75))
}

/// A scenario's p50 over no hook (µs): against its interleaved baseline, else the no-hook row's.
fn over_no_hook(scenario: &Scenario, no_hook: &Scenario) -> f64 {
    let p50 = summary(&scenario.samples_ns).0;
    let base = if scenario.baseline.is_some() { &scenario.baseline_ns } else { &no_hook.samples_ns };
    p50 - summary(base).0
}

pub fn print_table(scenarios: &[Scenario], outlier_runs: (u64, u64)) {
    let find = |kind: Timed, name: &str, services: Option<usize>| {
        scenarios.iter().find(|s| s.kind == kind && s.name == name && s.services == services)
    };
    println!(
        "\nconnect() latency: one phase per hooked node (its dataplane alone installed, as on a node: the programs at \
         a socket's end trace the whole machine) and one without our programs (no hook, the rulesets); in each, \
         {ROUNDS} rounds of its rows in a new random order each round; client pinned to CPU 0, the two backends to CPU 1, each in its own namespace on a bridge; the ClusterIP dialled is the middle service of \
         the list. Every hooked node but one also has a TCP port under feedback, so the load signal measures there \
         (the connect hook counts a measured connection's start, the program at a TCP socket's end its end), as on a \
         node that uses feedback anywhere. Hooked rows are interleaved: each client process \
         alternates, pair by pair in a random order, between the hooked cgroup and a cgroup without programs dialling \
         the backends directly; \"over no hook\" compares the two sides of those pairs (pooled p50s, and the median \
         [quartiles] of the per-round p50 differences). Other rows are compared with the no-hook row's own processes, \
         round by round. The TCP rows of the summary line's hook figures (at the largest count) run \
         {HEADLINE_BATCHES} × {PER_ROUND} connects a round, the others {PER_ROUND}. The hook's run time per call is the kernel's own count (BPF run-time statistics, \
         {HOOK_ROUNDS} extra rounds, includes two clock reads); so is the program's at a TCP socket's end \
         (`tcp_destroy_sock`, node-wide: accounting and the load signal; per run, i.e. per TCP socket, the mean over \
         every socket of those rounds, the row's and its baseline's, clients' and servers', each after its connect \
         returned)\n"
    );
    for (kind, title) in [
        (Timed::Tcp, "TCP connect() (handshake through the bridge)"),
        (Timed::UdpConnect, "UDP connect() (no packet: route lookup plus the hook)"),
    ] {
        let Some(no_hook) = find(kind, NO_HOOK, None) else { continue };
        println!("{title}\n");
        println!(
            "| scenario | services | samples | p50 (µs) | p99 (µs) | no-hook p50 beside it (µs) | p50 over no hook (µs) \
             | per round: median [quartiles] (µs) | iptables p50 / this p50 | nftables p50 / this p50 | hook run time \
             (ns/call) | at a socket's end (ns/socket) |"
        );
        println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
        for scenario in scenarios.iter().filter(|s| s.kind == kind) {
            let (p50, p99, samples) = summary(&scenario.samples_ns);
            // The baseline beside it (interleaved), else the no-hook row's own processes.
            let (beside, deltas) = if scenario.baseline.is_some() {
                (format!("{:.2}", summary(&scenario.baseline_ns).0), scenario.round_delta_ns.clone())
            } else {
                let deltas = scenario
                    .round_p50_ns
                    .iter()
                    .zip(&no_hook.round_p50_ns)
                    .map(|(&this, &base)| this as i64 - base as i64)
                    .collect();
                (String::new(), deltas)
            };
            let (over, rounds) = if std::ptr::eq(scenario, no_hook) {
                ("–".to_owned(), String::new())
            } else {
                let (median, low, high) = quartiles_us(&deltas);
                (format!("{:+.2}", over_no_hook(scenario, no_hook)), format!("{median:+.2} [{low:+.2}, {high:+.2}]"))
            };
            let ratio = |rules: &str| match (scenario.name == HOOK, find(Timed::Tcp, rules, scenario.services)) {
                (true, Some(other)) if kind == Timed::Tcp => format!("{:.1}×", summary(&other.samples_ns).0 / p50),
                _ => String::new(),
            };
            println!(
                "| {} | {} | {samples} | {p50:.2} | {p99:.2} | {beside} | {over} | {rounds} | {} | {} | {} | {} |",
                scenario.name,
                scenario.services.map_or("–".into(), |s| s.to_string()),
                ratio(IPTABLES),
                ratio(NFTABLES),
                scenario.hook_ns().map_or(String::new(), |ns| format!("{ns:.0}")),
                scenario.load_ns().map_or(String::new(), |ns| format!("{ns:.0}")),
            );
        }
        println!();
    }
    let (runs, connects) = outlier_runs;
    println!(
        "Passive outlier ejection: its tracing programs ran {runs} times over the {connects} connects of the hooked nodes' phases (they run \
         only where a handshake fails); the rows \"another backend of the node failing\" (one bit test more per \
         connect) and \"its backends failing\" (a lookup, the connection counted) show what the connect hook adds \
         while some backend of the node is failing.\n"
    );
    println!("{}", summary_line(scenarios));
}

/// `datapath: …`: each figure the p50 over no hook at the largest service count (µs); iptables
/// and nftables at 10,000 services (or the largest count run); the bare UDP connect's own p50 as
/// the in-run unit of CPU speed; an empty program's TCP connect (the kernel's hook alone), and the
/// not-a-service connect over it (the program's own part).
fn summary_line(scenarios: &[Scenario]) -> String {
    let largest = scenarios.iter().filter_map(|s| s.services).max().unwrap_or(0);
    let at_count = |kind: Timed, name: &str, services: Option<usize>| {
        let no_hook = scenarios.iter().find(|s| s.kind == kind && s.name == NO_HOOK)?;
        let scenario = scenarios.iter().find(|s| s.kind == kind && s.name == name && s.services == services)?;
        Some(over_no_hook(scenario, no_hook))
    };
    let at = |kind: Timed, name: &str, services: usize| at_count(kind, name, Some(services));
    let rules_at = scenarios
        .iter()
        .filter(|s| s.name == IPTABLES)
        .filter_map(|s| s.services)
        .filter(|&n| n <= 10_000)
        .max()
        .unwrap_or(0);
    let figure = |value: Option<f64>| value.map_or("–".to_owned(), |v| format!("{v:.2}"));
    let udp_nohook =
        scenarios.iter().find(|s| s.kind == Timed::UdpConnect && s.name == NO_HOOK).map(|s| summary(&s.samples_ns).0);
    format!(
        "datapath: tcp_us={} tcp_feedback_us={} tcp_unmeasured_node_us={} udp_us={} not_service_us={} nft_us_10k={} \
         iptables_us_10k={} udp_nohook_us={} outlier_us={} empty_program_us={} not_service_over_empty_us={} \
         kp_nft_us_10k={} kp_ipt_us_10k={} services={largest}",
        figure(at(Timed::Tcp, HOOK, largest)),
        figure(at(Timed::Tcp, HOOK_FEEDBACK, largest)),
        figure(at(Timed::Tcp, HOOK_UNMEASURED_NODE, largest)),
        figure(at(Timed::UdpConnect, HOOK, largest)),
        figure(at(Timed::Tcp, NOT_A_SERVICE, largest)),
        figure(at(Timed::Tcp, NFTABLES, rules_at)),
        figure(at(Timed::Tcp, IPTABLES, rules_at)),
        figure(udp_nohook),
        figure(at(Timed::Tcp, HOOK_PEER_FAILING, largest).zip(at(Timed::Tcp, HOOK, largest)).map(|(f, h)| f - h)),
        figure(at_count(Timed::Tcp, EMPTY_PROGRAM, None)),
        figure(at(Timed::Tcp, OVER_EMPTY, largest)),
        figure(at(Timed::Tcp, KP_NFTABLES, rules_at)),
        figure(at(Timed::Tcp, KP_IPTABLES, rules_at)),
    )
}
