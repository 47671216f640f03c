//! `cargo xtask bench dns`: the node-local DNS responder under dnsperf (root, the real control
//! plane, the optimized agent deployed from `deploy/` on a node). Queries per second and latency
//! for (c) headless and ClusterIP names, and for names relayed to the cluster's CoreDNS in two
//! mixes — (a) 90 % from a set of 1,000 names, 10 % unique, as a node's pods ask; (b) every name
//! unique — beside unbound (a caching resolver on the node forwarding to the same CoreDNS, on the
//! same CPUs) and CoreDNS asked directly, at 50,000/s and again at the rate CoreDNS sustains
//! (measured first, as fast as it answers; the responder and CoreDNS asked directly then take
//! three turns, as CoreDNS's rate drifts from run to run, and the turn with the median ratio is
//! the target's figure; in these rows, and in mix (a) once more at the end, dnsperf runs on the
//! node's CPU beside the responder, as pods do, and CoreDNS has its CPU to itself, as on other
//! nodes); and the control loop's event-to-kernel latency while the responder is
//! loaded, against idle. "NOERROR per s" counts what the clients could use: a
//! client with 768 relayed queries in flight (the 1,024 less the quarter kept for the node's
//! other pods) has more wait for a slot in its queue (256, at most 1 s), as unbound queues them,
//! and gets SERVFAIL past that; dnsperf is one client. Beside each row: the responder's upstream
//! queries meanwhile as it timed them (their p90 is the floor of mix (a)'s p99: no relay answers
//! an uncached name before its upstream does), its congestion window over its upstreams' smoothed
//! round trip at the end of the run (`dns_upstream_window`, `dns_upstream_round_trip_seconds`:
//! the rate the window allows, by Little's law) and the agent's CPU time over the run's (one CPU
//! is 100 %), and the queries CoreDNS's socket had no room for (`RcvbufErrors` in its pod's
//! namespace), and CoreDNS's CPU time beside how busy its CPU was (at 100 %, CoreDNS's rate is
//! what that CPU gives it). The last lines give the service index's grace periods by who waited
//! (the control loop, or the helper thread), and the responder's own count of each outcome, of
//! the queries it queued and of its upstream retries.
//!
//! Mix (a) at the end takes three turns, the responder then unbound in each, offered half of what
//! the node's CPU answers with dnsperf beside the responder (headless names as fast as they are
//! answered; at most 50,000/s): the generator shares that CPU, and offered more the figure would
//! be the queue of a full CPU, whoever answers. Each run is twice: cold (1,000 popular names nobody has asked: the run's first tenth of a second waits for
//! CoreDNS to forward them all, as after a node's resolver starts) and warm (25 s after the cold
//! run began, the same popular names and new unique ones: a node's steady state, the run holding
//! the popular names' expiry, CoreDNS's `cache 30` having given them 30 s when first asked, as
//! every 30 s of that state does). The warm p99 after the run's first 0.2 s is the target's
//! figure (the turn with the median), those 0.2 s their own: dnsperf's start, where it paces its
//! first 1,000 sends (a sleep after every other one: ~21 a millisecond here, whatever the rate
//! asked) and then sends the queries it fell behind by at once (at 30,000/s, ~900 over 15 ms
//! from 45 ms in; a capture of its sockets shows the answers caught up by 85 ms). The cold
//! start is its own figure too: the time until a 100 ms stretch of answers (by their count:
//! dnsperf offers at a constant rate) first has its p99 under 2 ms, and the answers of 2 ms or
//! more before it. The summary's `relayed_*` and `unbound_*` keys are the warm runs'
//! (their p99 after the first 0.2 s), `relayed_start_*` the warm run's first 0.2 s,
//! `relayed_cold_*` the cold ones' (the turn with the median p99), `relayed_shared_cpu_p99_ms`
//! the first mix (a) row's (dnsperf on CoreDNS's CPU, cold).
//!
//! The upstream is the real CoreDNS 1.14 with kubeadm's Corefile, on another node, behind
//! `kube-dns` (the agent finds it there, as on a cluster), forwarding names outside the cluster to
//! a stand-in for the outside. The Services are on the real API server (headless ones with
//! PreferClose, five endpoints per zone; the churned Service's slice patched every 100 ms).
//! NodeLocal DNSCache is not beside unbound: `k8s.io/dns` is not served by the Go module proxy
//! here (403 on its versions), and nothing is downloaded from elsewhere.
//!
//! The agent and unbound get the node's CPUs (all but the last); everything else — dnsperf,
//! CoreDNS, the outside, the control plane — the last. A relayed name costs the node the
//! responder's work, not CoreDNS's, which runs on other nodes (on a 2-CPU machine a CoreDNS on
//! the responder's CPU would charge the node for its work too). CoreDNS asked directly runs in
//! the same place, so those rows differ by the responder alone. The turns at CoreDNS's rate run
//! dnsperf on the node's CPU instead, beside the responder, in both rows: CoreDNS's rate is
//! what its CPU gives it, and a dnsperf sharing that CPU would hand it its queries in batches
//! (a run of sends before CoreDNS is scheduled) that queries from another CPU never come in.

#[path = "dns/measure.rs"]
mod measure;
#[path = "dns/mix_a.rs"]
mod mix_a;

use std::{
    net::{Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use measure::{Upstreams, row};
use mix_a::{Resolver, mix};
use topology_tests::{
    dns::{dig, start_upstream},
    dnsperf::{HistogramReading, Load, Perf, dnsperf},
    kubernetes::{
        Binaries, Cluster,
        agents::AgentPod,
        bulk::{Placed, change_endpoints},
        coredns::Corefile,
        eventually,
        nodes::NodeSpec,
    },
    sandbox::{is_root, pin_process, pin_this_thread},
    unbound,
};

/// Headless Services answered, ten endpoints each, half per zone.
const HEADLESS: usize = 200;
/// Offered load of the latency rows: the throughput target.
const TARGET_QPS: u32 = 50_000;
const SECONDS: u32 = 10;
/// Turns of the responder and CoreDNS asked directly at CoreDNS's rate.
const PAIRS: usize = 3;
const EVENT_TO_KERNEL: &str = "topology_agent_event_to_kernel_seconds";
const NAMESPACE: &str = "bench";
const NODE: &str = "node-a";

/// Headless Service `s`'s endpoints: ten, alternating between the two nodes and zones.
fn headless_endpoints(s: usize) -> Vec<Placed> {
    (0..10u8)
        .map(|e| {
            let (node, zone) = if e % 2 == 0 { (NODE, "zone-a") } else { ("node-b", "zone-b") };
            Placed { ip: Ipv4Addr::new(10, 1, s as u8, e), node: node.into(), zone: zone.into() }
        })
        .collect()
}

fn queries(path: &Path, names: impl Iterator<Item = String>) {
    let text: String = names.map(|name| format!("{name} A\n")).collect();
    std::fs::write(path, text).expect("query file");
}

/// Moves `svc-0`'s endpoint every 100 ms for `seconds` (a patch of its slice on the API
/// server); what the agent's event-to-kernel histogram recorded meanwhile.
fn churn(cluster: &Cluster, agent: &AgentPod, seconds: u32) -> (u64, f64, f64) {
    let before = HistogramReading::parse(&agent.metrics().expect("metrics"), EVENT_TO_KERNEL);
    let started = Instant::now();
    let mut generation = 1u8;
    while started.elapsed() < Duration::from_secs(u64::from(seconds)) {
        generation = generation % 200 + 1;
        let endpoint = SocketAddr::from(([10, 2, 0, generation], 8080));
        cluster.api().block(change_endpoints(cluster.admin(), NAMESPACE.into(), 0, vec![endpoint])).expect("churn");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    HistogramReading::parse(&agent.metrics().expect("metrics"), EVENT_TO_KERNEL).since(&before)
}

fn main() {
    if !is_root() {
        eprintln!("SKIPPED DNS benchmark: needs root");
        return;
    }
    let Some(binaries) = Binaries::or_skip("DNS benchmark") else { return };
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let (server_cpus, load_cpu) =
        if cpus > 1 { (format!("0-{}", cpus - 2), Some(cpus - 1)) } else { ("0".into(), None) };
    // What this process starts from here on runs on the load CPU unless placed elsewhere.
    if let Some(cpu) = load_cpu {
        pin_this_thread(cpu);
    }
    let nodes = [NodeSpec::new(NODE, "zone-a"), NodeSpec::new("node-b", "zone-b")];
    let mut cluster = Cluster::start(binaries, &nodes);
    let version = cluster.binaries().kubernetes_version();
    let (outside, _outside) = start_upstream(cluster.network(), false, None, load_cpu);
    cluster.reach_pods_from(&outside);
    let coredns = cluster.start_coredns("node-b", SocketAddr::from((outside.v4, 53)), Corefile::Kubeadm);
    cluster.namespace(NAMESPACE);
    cluster.create_headless(NAMESPACE, "h", HEADLESS, 5432, headless_endpoints);
    cluster.create_services(NAMESPACE, 0, 1, &[SocketAddr::from(([10, 2, 0, 0], 8080))]);
    cluster.deploy();
    let mut agent = cluster.start_agent(NODE, &["--dns-steer=off", "--dns-source-qps=0"]);
    pin_process(agent.pid().expect("the agent runs"), &server_cpus);
    let client_pod = cluster.client_on(NODE);
    let responder = SocketAddr::from((agent.ip, 5353));
    let last = format!("h{}.{NAMESPACE}.svc.cluster.local", HEADLESS - 1);
    eventually("the responder answering every headless Service", Duration::from_secs(60), || {
        let answer = dig(Some(&client_pod.place.netns), responder, &last, "A", &[]);
        (answer.data.len() == 5).then_some(()).ok_or(format!("{answer:?}"))
    });

    let scratch = cluster.dir().join("dns-bench");
    std::fs::create_dir_all(&scratch).expect("scratch");
    let headless = scratch.join("headless.txt");
    queries(&headless, (0..HEADLESS).map(|s| format!("h{s}.{NAMESPACE}.svc.cluster.local")));
    let cluster_ip = scratch.join("clusterip.txt");
    queries(&cluster_ip, std::iter::once(format!("svc-0.{NAMESPACE}.svc.cluster.local")));
    let repeated = scratch.join("mix-a.txt");
    let count = u64::from(TARGET_QPS) * u64::from(SECONDS);
    mix(&repeated, "pop", "a-", 9, count);
    // Every run of unique names asks names nobody has asked: nothing is cached anywhere.
    let unique = |prefix: &str| {
        let path = scratch.join(format!("unique-{prefix}.txt"));
        mix(&path, "pop", prefix, 0, count);
        path
    };
    let threads = server_cpus.split('-').next_back().and_then(|n| n.parse::<usize>().ok()).map_or(1, |n| n + 1);
    let node = cluster.node(NODE);
    let anchor = SocketAddr::from((node.address(), 5300));
    let _unbound = unbound::start(node.netns(), anchor, coredns.address(), threads, &server_cpus, &scratch);

    println!("{version}, CoreDNS 1.14 (kubeadm's Corefile) on another node as the upstream");
    let load = load_cpu.map_or("every CPU".to_owned(), |cpu| format!("CPU {cpu}"));
    println!(
        "agent and unbound on CPUs {server_cpus}; dnsperf (but where a row says otherwise), CoreDNS and the control \
         plane on {load}\n"
    );
    println!(
        "| queries | offered | answered per s | NOERROR per s | p50 ms | p99 ms | lost | rcodes | the responder's \
         upstream meanwhile: asked: p50 / p90 / p99 ms; the window over the smoothed round trip after; the agent's CPU | dropped by CoreDNS's full socket \
         | CoreDNS's CPU (its CPU busy) |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |");
    let offered = format!("{TARGET_QPS}/s");
    let client = Load { netns: &client_pod.place.netns, cpu: load_cpu };
    let run = |server, file: &Path, qps| dnsperf(client, server, file, SECONDS, qps);
    let upstreams = Upstreams { agent: &agent, coredns: &coredns, load_cpu };
    let responder_run = |file: &Path, qps| upstreams.measure(true, || run(responder, file, qps));
    let other_run = |server, file: &Path, qps| upstreams.measure(false, || run(server, file, qps));
    // The rate rows: dnsperf on the node's CPU, as a node's pods run beside its responder, and
    // CoreDNS with its CPU to itself, as on other nodes — the same for the responder and CoreDNS
    // asked directly. (A dnsperf on CoreDNS's CPU hands it its queries in batches, each run of
    // its sends a batch, which the responder on another CPU cannot: CoreDNS then pays a wake-up
    // a query, twice the kernel time and a quarter more CPU in all for each.)
    let beside = Load { netns: &client_pod.place.netns, cpu: load_cpu.map(|_| 0) };
    let at_rate =
        |server, file: &Path, qps, relayed| upstreams.measure(relayed, || dnsperf(beside, server, file, SECONDS, qps));
    let headless_perf = responder_run(&headless, TARGET_QPS);
    row("(c) headless A (this node's choice)", &offered, &headless_perf);
    let cluster_ip_perf = responder_run(&cluster_ip, TARGET_QPS);
    row("(c) ClusterIP A", &offered, &cluster_ip_perf);
    let relayed = responder_run(&repeated, TARGET_QPS);
    row("(a) relayed, 90 % of 1,000 names: responder", &offered, &relayed);
    let anchored = other_run(anchor, &repeated, TARGET_QPS);
    row("(a) relayed, 90 % of 1,000 names: unbound", &offered, &anchored);
    row("(b) relayed, every name unique: responder", &offered, &responder_run(&unique("b-"), TARGET_QPS));
    row("(b) relayed, every name unique: unbound", &offered, &other_run(anchor, &unique("c-"), TARGET_QPS));
    let direct = other_run(coredns.address(), &unique("d-"), TARGET_QPS);
    row("(b) every name unique, CoreDNS asked directly", &offered, &direct);
    let fastest = upstreams.measure(true, || dnsperf(client, responder, &headless, 5, 0));
    row("(c) headless A, as fast as it answers", "max", &fastest);
    let capacity = upstreams.measure(false, || dnsperf(beside, coredns.address(), &unique("e-"), 5, 0));
    row("CoreDNS directly, as fast as it answers, dnsperf on the node's CPU", "max", &capacity);
    let shared = upstreams.measure(true, || dnsperf(beside, responder, &headless, 5, 0));
    row("(c) headless A, as fast as it answers, dnsperf on the node's CPU", "max", &shared);
    let shared_qps = mix_a::offered(shared.perf.noerror_qps(), TARGET_QPS);
    // Unique names at the rate CoreDNS sustains: what relaying through the node costs. CoreDNS's
    // rate drifts between runs by more than the difference measured (a sixth, from one run to
    // the next), so the responder and CoreDNS asked directly take turns, and the pair with the
    // median ratio is the figure.
    let sustained = (capacity.perf.noerror_qps() as u32).max(100);
    let at_capacity = format!("{sustained}/s");
    let anchored_unique = at_rate(anchor, &unique("g-"), sustained, false);
    row("(b) every name unique at CoreDNS's rate, dnsperf on the node's CPU: unbound", &at_capacity, &anchored_unique);
    let mut pairs: Vec<(Perf, Perf)> = (1..=PAIRS)
        .map(|pair| {
            let what =
                |who| format!("(b) every name unique at CoreDNS's rate, dnsperf on the node's CPU, turn {pair}: {who}");
            let through = at_rate(responder, &unique(&format!("f{pair}-")), sustained, true);
            row(&what("responder"), &at_capacity, &through);
            let direct = at_rate(coredns.address(), &unique(&format!("h{pair}-")), sustained, false);
            row(&what("CoreDNS asked directly"), &at_capacity, &direct);
            (through.perf, direct.perf)
        })
        .collect();
    let ratio = |(through, direct): &(Perf, Perf)| through.noerror_qps() / direct.noerror_qps().max(1.0);
    let ratios: Vec<String> = pairs.iter().map(|pair| format!("{:.2}", ratio(pair))).collect();
    pairs.sort_by(|a, b| ratio(a).total_cmp(&ratio(b)));
    let (unique_perf, direct) = pairs.swap_remove(pairs.len() / 2);
    // Mix (a) placed the same way, cold and warm: CoreDNS's CPU no longer carries dnsperf's
    // 50,000 a second.
    let resolvers = [
        Resolver { name: "responder", address: responder, relayed: true },
        Resolver { name: "unbound", address: anchor, relayed: false },
    ];
    let mix_a_turns = mix_a::turns(PAIRS, &resolvers, &scratch, shared_qps, |server, file, relayed| {
        at_rate(server, file, shared_qps, relayed)
    });
    mix_a::print(&resolvers, &mix_a_turns);
    let (warm, anchored_warm) = {
        let warm_p99 = |turn: &mix_a::Turn| turn.steady.p99_ms;
        (mix_a::median(&mix_a_turns[0], warm_p99), mix_a::median(&mix_a_turns[1], warm_p99))
    };
    let floor = relayed.upstream_p90_ms.unwrap_or(f64::NAN);
    let (headless_perf, cluster_ip_perf, relayed, anchored) =
        (headless_perf.perf, cluster_ip_perf.perf, relayed.perf, anchored.perf);

    // The control loop while the responder answers at the target rate, against idle.
    let idle = churn(&cluster, &agent, SECONDS);
    let (loaded, perf) = std::thread::scope(|scope| {
        let perf = scope.spawn(|| dnsperf(client, responder, &headless, SECONDS + 1, TARGET_QPS));
        std::thread::sleep(Duration::from_millis(500));
        let loaded = churn(&cluster, &agent, SECONDS);
        (loaded, perf.join().expect("dnsperf"))
    });
    println!();
    println!(
        "| control loop (an EndpointSlice change every 100 ms) | events | event to kernel mean ms | p99 ms (bucket bound) |"
    );
    println!("| --- | ---: | ---: | ---: |");
    println!("| DNS idle | {} | {:.2} | {:.2} |", idle.0, idle.1, idle.2);
    println!("| DNS answering {:.0}/s | {} | {:.2} | {:.2} |", perf.qps, loaded.0, loaded.1, loaded.2);
    let metrics = agent.metrics().expect("metrics");
    let grace: Vec<&str> =
        metrics.lines().filter(|line| line.starts_with("topology_agent_grace_periods_total{")).collect();
    println!("\nthe service index's grace periods over the whole run, by who waited: {}", grace.join(", "));
    println!("\nthe responder's queries by outcome over the whole run: {}", outcomes(&metrics));
    let rss = agent_rss_kib(agent.pid().expect("the agent runs"));
    println!("\nagent RSS after the runs: {:.1} MiB", rss as f64 / 1024.0);
    let turns = |resolver: usize, figure: &dyn Fn(&mix_a::Turn) -> String| {
        mix_a_turns[resolver].iter().map(figure).collect::<Vec<_>>().join(" / ")
    };
    println!(
        "\ntargets: relayed (a), dnsperf on the node's CPU, offered {shared_qps}/s (half of the {:.0}/s that CPU \
         answers with dnsperf beside the responder), warm (the median of the turns' p99 after the first 0.2 s): \
         {:.0} NOERROR/s against unbound's {:.0}/s, p99 {:.2} ms (< 2; the turns' {}; unbound's {:.2}), {} \
         lost (0; unbound's {}); the first 0.2 s (dnsperf's start), the turns' p99 {} ms, {} answers ≥ 2 ms; \
         cold, the turns' p99 {} ms, {} answers ≥ 2 ms, a 100 ms stretch's p99 under 2 ms after {} s (unbound's p99 {} \
         ms, lost {}); dnsperf on CoreDNS's CPU, cold: p99 {:.2} ms (its upstream's p90 meanwhile, the floor, \
         {floor:.2} ms), {} lost (unbound's {:.2} ms, {} lost); unique (b) at CoreDNS's rate {:.2} × CoreDNS asked directly (≥ 0.9; the median of \
         the turns' {})",
        shared.perf.noerror_qps(),
        warm.warm.noerror_qps(),
        anchored_warm.warm.noerror_qps(),
        warm.steady.p99_ms,
        turns(0, &|turn| format!("{:.2}", turn.steady.p99_ms)),
        anchored_warm.steady.p99_ms,
        warm.warm.lost,
        anchored_warm.warm.lost,
        turns(0, &|turn| format!("{:.2}", turn.start.p99_ms)),
        turns(0, &|turn| turn.start.slow.to_string()),
        turns(0, &|turn| format!("{:.2}", turn.cold.quantile_ms(0.99))),
        turns(0, &|turn| turn.settling.slow.to_string()),
        turns(0, &|turn| format!("{:.1}", turn.settling.after)),
        turns(1, &|turn| format!("{:.2}", turn.cold.quantile_ms(0.99))),
        turns(1, &|turn| turn.cold.lost.to_string()),
        relayed.quantile_ms(0.99),
        relayed.lost,
        anchored.quantile_ms(0.99),
        anchored.lost,
        unique_perf.noerror_qps() / direct.noerror_qps(),
        ratios.join(", ")
    );
    let cold = mix_a::median(&mix_a_turns[0], |turn| turn.cold.quantile_ms(0.99));
    println!(
        "\ndns: headless_qps={:.0} clusterip_qps={:.0} relayed_offered_qps={shared_qps} relayed_qps={:.0} relayed_p99_ms={:.2} relayed_lost={} \
         relayed_start_p99_ms={:.2} relayed_start_slow={} relayed_cold_p99_ms={:.2} relayed_cold_slow={} relayed_shared_cpu_p99_ms={:.2} unique_qps={:.0} \
         unbound_qps={:.0} unbound_p99_ms={:.2} unbound_lost={} upstream_qps={:.0} nodelocal_qps=unbuildable",
        headless_perf.qps,
        cluster_ip_perf.qps,
        warm.warm.noerror_qps(),
        warm.steady.p99_ms,
        warm.warm.lost,
        warm.start.p99_ms,
        warm.start.slow,
        cold.cold.quantile_ms(0.99),
        cold.settling.slow,
        relayed.quantile_ms(0.99),
        unique_perf.noerror_qps(),
        anchored_warm.warm.noerror_qps(),
        anchored_warm.steady.p99_ms,
        anchored_warm.warm.lost,
        direct.noerror_qps()
    );
    agent.stop();
}

/// `topology_agent_dns_queries_total` summed by outcome, the queries queued and the upstream
/// retries, from `metrics`.
fn outcomes(metrics: &str) -> String {
    let mut by_outcome = std::collections::BTreeMap::<String, f64>::new();
    for line in metrics.lines().filter(|line| line.starts_with("topology_agent_dns_queries_total{")) {
        let outcome = line.split("outcome=\"").nth(1).and_then(|rest| rest.split('"').next());
        let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
        if let (Some(outcome), Some(value)) = (outcome, value) {
            *by_outcome.entry(outcome.to_owned()).or_default() += value;
        }
    }
    let total = |name: &str| {
        let prefix = format!("topology_agent_dns_{name}_total ");
        metrics.lines().find_map(|line| line.strip_prefix(prefix.as_str())).unwrap_or("?").to_owned()
    };
    let mut text: Vec<String> = by_outcome.iter().map(|(outcome, n)| format!("{outcome} {n:.0}")).collect();
    text.push(format!("queued {}", total("relay_queued")));
    text.push(format!("upstream retries {}", total("upstream_retries")));
    text.join(", ")
}

fn agent_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")).map(str::to_owned))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}
