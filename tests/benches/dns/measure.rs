//! One run of the DNS bench and what the responder's upstream and CoreDNS did meanwhile; a row
//! of the bench's table.

use std::time::Instant;

use topology_tests::{
    dnsperf::{HistogramReading, Perf},
    kubernetes::{agents::AgentPod, coredns::CoreDns},
};

const UPSTREAM: &str = "topology_agent_dns_upstream_seconds";

/// One run, and what the upstreams did meanwhile.
pub struct Measured {
    pub perf: Perf,
    /// The responder's upstream queries, as it timed them (`dns_upstream_seconds`): how many,
    /// p50 / p90 / p99 in ms, linear within a bucket; `None` when the responder was not asked.
    pub upstream: Option<String>,
    /// Their p90, ms.
    pub upstream_p90_ms: Option<f64>,
    /// Queries CoreDNS's socket had no room for (its netns's `Udp: RcvbufErrors`).
    pub dropped: u64,
    /// CoreDNS's CPU time and its CPU's busy time over the run's, in % of one CPU.
    pub coredns_cpu: f64,
    pub load_cpu_busy: f64,
}

/// Where the upstream's side of a run is read.
pub struct Upstreams<'a> {
    pub agent: &'a AgentPod,
    pub coredns: &'a CoreDns,
    /// CoreDNS's CPU, the control plane's too (and dnsperf's, but where a row says otherwise).
    pub load_cpu: Option<usize>,
}

impl Upstreams<'_> {
    /// `load`, with CoreDNS's drops meanwhile and, when `relayed` (the responder is asked), what
    /// its upstream answered. The p90 is the floor of the p99 of a mix with 10 % unique names: no
    /// relay answers an uncached name before its upstream does.
    pub fn measure(&self, relayed: bool, load: impl FnOnce() -> Perf) -> Measured {
        let metrics = || HistogramReading::parse(&self.agent.metrics().expect("metrics"), UPSTREAM);
        let netns = self.coredns.pod.netns();
        let (before, dropped) = (relayed.then(metrics), receive_buffer_errors(netns));
        let pid = self.agent.pid().expect("the agent runs");
        let coredns = self.coredns.pod.pid().expect("CoreDNS runs");
        let busy = || self.load_cpu.map_or(0.0, busy_seconds);
        let (cpu_before, coredns_before, busy_before) = (cpu_seconds(pid), cpu_seconds(coredns), busy());
        let started = Instant::now();
        let perf = load();
        let share = |seconds: f64| 100.0 * seconds / started.elapsed().as_secs_f64();
        let cpu = share(cpu_seconds(pid) - cpu_before);
        let (coredns_cpu, load_cpu_busy) = (share(cpu_seconds(coredns) - coredns_before), share(busy() - busy_before));
        let dropped = receive_buffer_errors(netns) - dropped;
        let (upstream, upstream_p90_ms) = before.map_or((None, None), |before| {
            let text = self.agent.metrics().expect("metrics");
            let after = HistogramReading::parse(&text, UPSTREAM);
            let ms = |q| after.quantile_since(&before, q) * 1e3;
            let gauge = |name: &str| {
                let prefix = format!("topology_agent_dns_upstream_{name} ");
                text.lines().find_map(|line| line.strip_prefix(prefix.as_str())).and_then(|v| v.parse::<f64>().ok())
            };
            let window = gauge("window").map_or("?".to_owned(), |window| format!("{window:.0}"));
            let round_trip = gauge("round_trip_seconds").map_or("?".to_owned(), |rtt| format!("{:.2} ms", rtt * 1e3));
            match after.count.saturating_sub(before.count) {
                0 => (Some("0".to_owned()), None),
                asked => {
                    let (p50, p90, p99) = (ms(0.5), ms(0.9), ms(0.99));
                    let text =
                        format!("{asked}: {p50:.2} / {p90:.2} / {p99:.2}; {window} over {round_trip}; {cpu:.0} %");
                    (Some(text), Some(ms(0.9)))
                }
            }
        });
        Measured { perf, upstream, upstream_p90_ms, dropped, coredns_cpu, load_cpu_busy }
    }
}

/// `Udp: RcvbufErrors` of network namespace `netns`: datagrams its sockets had no room for.
fn receive_buffer_errors(netns: &str) -> u64 {
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", netns, "cat", "/proc/net/snmp"])
        .output()
        .expect("ip netns exec");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut udp = text.lines().filter(|line| line.starts_with("Udp:"));
    let (Some(names), Some(values)) = (udp.next(), udp.next()) else { return 0 };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find_map(|(name, value)| (name == "RcvbufErrors").then(|| value.parse().unwrap_or(0)))
        .unwrap_or(0)
}

pub fn row(what: &str, offered: &str, measured: &Measured) {
    let perf = &measured.perf;
    println!(
        "| {what} | {offered} | {:.0} | {:.0} | {:.3} | {:.3} | {} | {:?} | {} | {} | {:.0} % ({:.0} %) |",
        perf.qps,
        perf.noerror_qps(),
        perf.quantile_ms(0.5),
        perf.quantile_ms(0.99),
        perf.lost,
        perf.rcodes,
        measured.upstream.as_deref().unwrap_or("-"),
        measured.dropped,
        measured.coredns_cpu,
        measured.load_cpu_busy
    );
}

/// CPU time process `pid` has used, all its threads, in seconds (`utime` + `stime`).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect();
    let ticks: u64 = fields.get(11..13).map_or(0, |t| t.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    ticks as f64 / per_second as f64
}

/// Time CPU `cpu` has spent busy (all but idle and I/O wait), in seconds.
fn busy_seconds(cpu: usize) -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let label = format!("cpu{cpu}");
    let Some(line) = stat.lines().find(|line| line.split_whitespace().next() == Some(label.as_str())) else {
        return 0.0;
    };
    let ticks: Vec<u64> = line.split_whitespace().skip(1).filter_map(|v| v.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal guest guest_nice; guest time is in user's.
    let busy: u64 = ticks.iter().take(8).enumerate().filter(|(n, _)| *n != 3 && *n != 4).map(|(_, t)| t).sum();
    // SAFETY: sysconf reads a constant of the system.
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
    busy as f64 / per_second as f64
}
