//! `cargo xtask bench dns`: the node-local DNS responder under dnsperf (root, namespaces, the
//! optimized agent). Queries per second and latency for (c) headless and ClusterIP names, and
//! for names relayed to the upstream in two mixes — (a) 90 % from a set of 1,000 names, 10 %
//! unique, as a node's pods ask; (b) every name unique — beside unbound (a caching resolver
//! forwarding to the same stand-in upstream, on the same CPUs) and the upstream asked directly;
//! and the control loop's event-to-kernel latency while the responder is loaded, against idle.
//!
//! The agent and unbound get the node's CPUs (all but the last); the load generator and the
//! stand-in upstream the last. The upstream stands for the cluster's CoreDNS, which runs on other
//! nodes: a relayed name costs the node the responder's work, not the upstream's (on a 2-CPU
//! machine an upstream on the responder's CPU would charge the node for CoreDNS's work too). The
//! upstream asked directly runs in the same place, so those rows differ by the responder alone.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use serde_json::{Value, json};
use topology_tests::{
    agent::{Agent, AgentOptions},
    cluster::{self, EndpointSpec},
    dns::start_upstream,
    dnsperf::{HistogramReading, Load, Perf, dnsperf},
    fixture::Fixture,
    sandbox::is_root,
    unbound,
};

/// Headless Services answered, ten endpoints each, half per zone.
const HEADLESS: usize = 200;
/// Offered load of the latency rows: the throughput target.
const TARGET_QPS: u32 = 50_000;
const SECONDS: u32 = 10;
const EVENT_TO_KERNEL: &str = "topology_agent_event_to_kernel_seconds";

fn objects(web_generation: u8) -> Vec<Value> {
    let mut objects = vec![cluster::node("node-a", "zone-a", None, "4"), cluster::node("node-b", "zone-b", None, "4")];
    for s in 0..HEADLESS {
        let name = format!("h{s}");
        objects.push(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
            "spec": {"clusterIP": "None", "trafficDistribution": "PreferClose",
                     "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}
        }));
        let endpoints: Vec<EndpointSpec> = (0..10)
            .map(|e| {
                let (node, zone) = if e % 2 == 0 { ("node-a", "zone-a") } else { ("node-b", "zone-b") };
                let mut spec = EndpointSpec::new(IpAddr::V4(Ipv4Addr::new(10, 1, s as u8, e)), node);
                spec.zone = Some(zone.into());
                spec
            })
            .collect();
        objects.push(cluster::slice("default", &format!("{name}-1"), &name, "pg", 5432, "TCP", &endpoints));
    }
    // The Service the control-plane measurement changes: its endpoint moves every 100 ms.
    objects.push(cluster::service("default", "web", "10.96.0.80".parse().unwrap(), 80, "TCP", "http"));
    let web = EndpointSpec::new(IpAddr::V4(Ipv4Addr::new(10, 2, 0, web_generation)), "node-a");
    objects.push(cluster::slice("default", "web-1", "web", "http", 8080, "TCP", &[web]));
    objects
}

/// Queries of a relayed mix: `popular` of every ten from a set of 1,000 names, the rest unique.
fn mix(path: &Path, prefix: &str, popular: u64) {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    queries(
        path,
        (0..u64::from(TARGET_QPS) * u64::from(SECONDS)).map(|n| {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            if (state >> 33) % 10 < popular {
                format!("pop{}.example.com", (state >> 40) % 1000)
            } else {
                format!("{prefix}{n}.example.com")
            }
        }),
    );
}

fn queries(path: &Path, names: impl Iterator<Item = String>) {
    let text: String = names.map(|name| format!("{name} A\n")).collect();
    std::fs::write(path, text).expect("query file");
}

fn row(what: &str, offered: &str, perf: &Perf) {
    println!(
        "| {what} | {offered} | {:.0} | {:.3} | {:.3} | {} | {:?} |",
        perf.qps,
        perf.quantile_ms(0.5),
        perf.quantile_ms(0.99),
        perf.lost,
        perf.rcodes
    );
}

/// Moves `web`'s endpoint every 100 ms for `seconds`; what the agent's event-to-kernel
/// histogram recorded meanwhile.
fn churn(agent: &Agent, file: &Path, seconds: u32) -> (u64, f64, f64) {
    let before = HistogramReading::parse(&agent.get("/metrics").expect("metrics").1, EVENT_TO_KERNEL);
    let started = Instant::now();
    let mut generation = 1u8;
    while started.elapsed() < Duration::from_secs(u64::from(seconds)) {
        generation = generation % 200 + 1;
        cluster::write(file, &objects(generation));
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    HistogramReading::parse(&agent.get("/metrics").expect("metrics").1, EVENT_TO_KERNEL).since(&before)
}

fn main() {
    if !is_root() {
        eprintln!("SKIPPED DNS benchmark: needs root");
        return;
    }
    let mut fx = Fixture::new(0);
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let (server_cpus, load_cpu) =
        if cpus > 1 { (format!("0-{}", cpus - 2), Some(cpus - 1)) } else { ("0".into(), None) };
    let (upstream_host, _upstream) = start_upstream(&mut fx.network, false, None, load_cpu);
    let upstream = SocketAddr::from((upstream_host.v4, 53));
    let node = fx.network.host("node");
    let responder = SocketAddr::from((node.v4, 53));
    let scratch = fx.scratch();
    let file = scratch.join("cluster.yaml");
    cluster::write(&file, &objects(0));
    let mut agent = Agent::start(&AgentOptions {
        netns: Some(node.netns.name()),
        extra: ["--dns-listen", &responder.to_string(), "--dns-upstream", &upstream.to_string()]
            .into_iter()
            .chain(["--dns-steer", "off", "--dns-source-qps", "0"])
            .map(str::to_owned)
            .collect(),
        wrapper: vec!["taskset".into(), "-c".into(), server_cpus.clone()],
        ..AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path())
    });
    agent.wait_ready(Duration::from_secs(30));
    let client = Load { netns: fx.client.netns.name(), cpu: load_cpu };
    let headless = scratch.join("headless.txt");
    queries(&headless, (0..HEADLESS).map(|s| format!("h{s}.default.svc.cluster.local")));
    let cluster_ip = scratch.join("clusterip.txt");
    queries(&cluster_ip, std::iter::once("web.default.svc.cluster.local".to_owned()));
    let repeated = scratch.join("mix-a.txt");
    mix(&repeated, "a-", 9);
    let unique = scratch.join("mix-b.txt");
    mix(&unique, "b-", 0);
    let unique_unbound = scratch.join("mix-b-unbound.txt");
    mix(&unique_unbound, "c-", 0);
    let threads = server_cpus.split('-').next_back().and_then(|n| n.parse::<usize>().ok()).map_or(1, |n| n + 1);
    let anchor = SocketAddr::from((node.v4, 5300));
    let _unbound = unbound::start(node.netns.name(), anchor, upstream, threads, &server_cpus, &scratch);

    println!("agent and unbound on CPUs {server_cpus}, dnsperf and the upstream on CPU {load_cpu:?}\n");
    println!("| queries | offered | answered per s | p50 ms | p99 ms | lost | rcodes |");
    println!("| --- | ---: | ---: | ---: | ---: | ---: | --- |");
    let offered = format!("{TARGET_QPS}/s");
    let run = |server, file: &Path| dnsperf(client, server, file, SECONDS, TARGET_QPS);
    let headless_perf = run(responder, &headless);
    row("(c) headless A (this node's choice)", &offered, &headless_perf);
    let cluster_ip_perf = run(responder, &cluster_ip);
    row("(c) ClusterIP A", &offered, &cluster_ip_perf);
    let relayed = run(responder, &repeated);
    row("(a) relayed, 90 % of 1,000 names: responder", &offered, &relayed);
    let anchored = run(anchor, &repeated);
    row("(a) relayed, 90 % of 1,000 names: unbound", &offered, &anchored);
    let unique_perf = run(responder, &unique);
    row("(b) relayed, every name unique: responder", &offered, &unique_perf);
    row("(b) relayed, every name unique: unbound", &offered, &run(anchor, &unique_unbound));
    let direct = run(upstream, &unique);
    row("(b) every name unique, upstream asked directly", &offered, &direct);
    row("(c) headless A, as fast as it answers", "max", &dnsperf(client, responder, &headless, 5, 0));
    row("upstream directly, as fast as it answers", "max", &dnsperf(client, upstream, &unique, 5, 0));

    // The control loop while the responder answers at the target rate, against idle.
    let idle = churn(&agent, &file, SECONDS);
    let (loaded, perf) = std::thread::scope(|scope| {
        let perf = scope.spawn(|| dnsperf(client, responder, &headless, SECONDS + 1, TARGET_QPS));
        std::thread::sleep(Duration::from_millis(500));
        let loaded = churn(&agent, &file, SECONDS);
        (loaded, perf.join().expect("dnsperf"))
    });
    println!();
    println!(
        "| control loop (an EndpointSlice change every 100 ms) | events | event to kernel mean ms | p99 ms (bucket bound) |"
    );
    println!("| --- | ---: | ---: | ---: |");
    println!("| DNS idle | {} | {:.2} | {:.2} |", idle.0, idle.1, idle.2);
    println!("| DNS answering {:.0}/s | {} | {:.2} | {:.2} |", perf.qps, loaded.0, loaded.1, loaded.2);
    let rss = agent_rss_kib(agent.pid());
    println!("\nagent RSS after the runs: {:.1} MiB", rss as f64 / 1024.0);
    println!(
        "\ndns: headless_qps={:.0} clusterip_qps={:.0} relayed_qps={:.0} relayed_p99_ms={:.2} relayed_lost={} \
         unique_qps={:.0} unbound_qps={:.0} unbound_p99_ms={:.2} upstream_qps={:.0}",
        headless_perf.qps,
        cluster_ip_perf.qps,
        relayed.qps,
        relayed.quantile_ms(0.99),
        relayed.lost,
        unique_perf.qps,
        anchored.qps,
        anchored.quantile_ms(0.99),
        direct.qps
    );
    agent.signal(libc::SIGTERM);
    agent.wait_exit(Duration::from_secs(10));
}

fn agent_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("VmRSS:")).map(str::to_owned))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}
