//! Side by side with the real kube-proxy on the real control plane (`cargo bench --bench
//! control_plane -- real`): a node running kube-proxy 1.35 in nftables mode, another in iptables
//! mode through the legacy `x_tables` backend, a third in iptables mode through the node's
//! iptables-nft (each with its defaults, as users run it: iptables syncs at most once a second), and a
//! node running the agent deployed from `deploy/`, in one zone; 10,000 selectorless Services × 10
//! endpoints written to the API server, each slice stamped with the time of its write
//! (`endpoints.kubernetes.io/last-change-trigger-time`, as the EndpointSlice controller stamps
//! its own). For each mode in turn, on the same two cores:
//! - the full sync: from its process starting to kube-proxy's first sync with nothing pending;
//!   the agent's (once, after nftables'), to its readiness (its first full programming; loading
//!   its programs included);
//! - a storm of EndpointSlice changes ([`RATE`]/s for [`STORM`], one endpoint of a random Service
//!   replaced each time, stamped when sent) on the real API server, both watching: kube-proxy's
//!   own `kubeproxy_network_programming_duration_seconds` against the agent's
//!   `topology_agent_network_programming_duration_seconds` — the same span, from the stamp to
//!   the rules or maps written — p50 / p99 of the storm's observations, interpolated within their
//!   buckets as `histogram_quantile` does (kube-proxy's finest bucket is 250 ms).

use std::{
    net::{Ipv4Addr, SocketAddr},
    time::{Duration, Instant},
};

use futures::StreamExt as _;
use topology_tests::kubernetes::{
    Binaries, Cluster,
    agents::AgentPod,
    bulk::change_endpoints,
    nodes::NodeSpec,
    proxy::{KubeProxy, ProxyMode, SyncPacing},
};

const NAMESPACE: &str = "bench";
const SERVICES: usize = 10_000;
const ENDPOINTS: usize = 10;
/// Changes per second asked of the API server, and for how long (changes the API server could
/// not take in that time are not sent: the rate reached is reported).
pub const RATE: usize = 1000;
pub const STORM: Duration = Duration::from_secs(60);
/// How long both may take to program the storm's changes after the last was sent.
const CATCH_UP: Duration = Duration::from_secs(600);
/// Changes in flight at most: beyond, the storm falls behind and says so.
const IN_FLIGHT: usize = 64;
/// kube-proxy's modes, each on a node of its own (iptables-nft, the slowest, last).
const MODES: [(ProxyMode, &str); 3] = [
    (ProxyMode::Nftables, "node-kp-nft"),
    (ProxyMode::IptablesLegacy, "node-kp-ipl"),
    (ProxyMode::Iptables, "node-kp-ipt"),
];
const AGENT_NODE: &str = "node-ag";
/// How long a kube-proxy's first sync may take: iptables mode with the iptables-nft backend
/// (Debian's, RHEL's and Ubuntu's default) spends longer than this in one `iptables-restore` of
/// 10,000 Services × 10 endpoints here; a session cannot wait for it.
const SYNC_LIMIT: Duration = Duration::from_secs(900);

/// (p50, p99, observations), the quantiles in seconds.
type Quantiles = (f64, f64, f64);

/// What one kube-proxy mode's run measured, beside the agent.
pub struct ProxyRun {
    pub mode: ProxyMode,
    /// `None`: its first sync had not finished within [`SYNC_LIMIT`] (then no storm is run).
    pub sync: Option<Duration>,
    pub changes: usize,
    pub storm: Duration,
    pub proxy: Quantiles,
    pub agent: Quantiles,
}

/// What the run measured.
pub struct Real {
    pub version: String,
    pub agent_sync: Duration,
    /// In the order of [`MODES`].
    pub runs: Vec<ProxyRun>,
}

/// Endpoint `n` of Service `index` (addresses outside every range the cluster routes).
fn endpoint(index: usize, n: usize) -> SocketAddr {
    let host = (index * ENDPOINTS + n) as u32;
    SocketAddr::from((Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 0, 0)) + host), 8080))
}

/// `None` without the built components.
pub fn run() -> Option<Real> {
    let binaries = Binaries::or_skip("control-plane bench: the real kube-proxy side by side")?;
    let nodes = MODES.map(|(_, node)| NodeSpec::new(node, "zone-a"));
    let mut cluster = Cluster::start(binaries, &nodes);
    cluster.add_node(NodeSpec::new(AGENT_NODE, "zone-a"));
    let version = cluster.binaries().kubernetes_version();
    cluster.deploy();
    cluster.namespace(NAMESPACE);
    let written = Instant::now();
    for from in (0..SERVICES).step_by(1000) {
        let endpoints: Vec<SocketAddr> = (0..ENDPOINTS).map(|n| endpoint(from, n)).collect();
        cluster.create_services(NAMESPACE, from, from + 1000, &endpoints);
    }
    eprintln!("real: {SERVICES} Services written in {:.0} s", written.elapsed().as_secs_f64());

    // Each mode on its own node, one after the other on the same two cores: its full sync, then
    // a storm measured on it and on the agent (started once, after the first full sync).
    let mut agent = None;
    let mut agent_sync = Duration::ZERO;
    let mut runs = Vec::new();
    for (round, (mode, node)) in MODES.into_iter().enumerate() {
        let started = Instant::now();
        let mut proxy = cluster.start_kube_proxy(node, mode, SyncPacing::Default);
        let synced = proxy.synced_within(SYNC_LIMIT);
        let sync = started.elapsed();
        eprintln!("real: full sync kube-proxy {} {sync:?}: {synced:?}", mode.label());
        if synced.is_err() {
            let none = (f64::NAN, f64::NAN, 0.0);
            runs.push(ProxyRun { mode, sync: None, changes: 0, storm: Duration::ZERO, proxy: none, agent: none });
            continue;
        }
        let agent = agent.get_or_insert_with(|| {
            let started = Instant::now();
            let agent = cluster.start_agent(AGENT_NODE, &[]);
            agent_sync = started.elapsed();
            eprintln!("real: full sync agent {agent_sync:?}");
            agent
        });
        let (changes, storm, proxy_q, agent_q) = storm(&cluster, &proxy, agent, round);
        runs.push(ProxyRun { mode, sync: Some(sync), changes, storm, proxy: proxy_q, agent: agent_q });
    }
    Some(Real { version, agent_sync, runs })
}

/// The storm (its `round`: each moves endpoints to addresses of its own), then both caught up:
/// the changes sent, the time they took, and (p50, p99, observations) of kube-proxy and the agent.
fn storm(
    cluster: &Cluster,
    proxy: &KubeProxy,
    agent: &AgentPod,
    round: usize,
) -> (usize, Duration, Quantiles, Quantiles) {
    let proxy_metric = "kubeproxy_network_programming_duration_seconds";
    let agent_metric = "topology_agent_network_programming_duration_seconds";
    let before = (
        buckets(&proxy.metrics().unwrap_or_default(), proxy_metric),
        buckets(&agent.metrics().unwrap_or_default(), agent_metric),
    );
    let asked = RATE * STORM.as_secs() as usize;
    let interval = Duration::from_secs(1) / RATE as u32;
    let (admin, started) = (cluster.admin(), Instant::now());
    // Changes are sent on schedule while the API server keeps up, and as fast as it answers
    // ([`IN_FLIGHT`] at a time) when it does not; none is sent after [`STORM`].
    let outcomes = cluster.api().block(async move {
        let start = tokio::time::Instant::now();
        futures::stream::iter(0..asked)
            .map(|i| {
                let admin = admin.clone();
                async move {
                    tokio::time::sleep_until(start + interval * i as u32).await;
                    if start.elapsed() > STORM {
                        return None;
                    }
                    // A spread of Services (a multiplicative hash of the change's number); one of
                    // its endpoints moved each time, to an address of this round's.
                    let index = i.wrapping_mul(2_654_435_761) % SERVICES;
                    let moved = |n: usize| endpoint(index, if n == 0 { SERVICES + round * 1000 + i % 1000 } else { n });
                    let endpoints = (0..ENDPOINTS).map(moved).collect();
                    Some(change_endpoints(admin, NAMESPACE.to_owned(), index, endpoints).await)
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .filter_map(|outcome| async move { outcome })
            .collect::<Vec<Result<(), String>>>()
            .await
    });
    let changes = outcomes.len();
    let failed: Vec<&String> = outcomes.iter().filter_map(|outcome| outcome.as_ref().err()).collect();
    let storm = started.elapsed();
    assert!(failed.is_empty(), "{} changes failed, the first: {}", failed.len(), failed[0]);
    // Both have caught up once their histograms count every change, or nothing is pending for
    // either (kube-proxy's syncs of 10,000 Services take minutes here: it is waited for, up to
    // [`CATCH_UP`]).
    let deadline = Instant::now() + CATCH_UP;
    let (proxy_after, agent_after) = loop {
        let after = (
            buckets(&proxy.metrics().unwrap_or_default(), proxy_metric),
            buckets(&agent.metrics().unwrap_or_default(), agent_metric),
        );
        let counted = |after: &[(f64, f64)], before: &[(f64, f64)]| total(after) - total(before);
        let proxy_pending = proxy.metric("kubeproxy_sync_proxy_rules_endpoint_changes_pending").unwrap_or(1.0);
        let proxy_done = counted(&after.0, &before.0) >= changes as f64 || proxy_pending == 0.0;
        if (proxy_done && counted(&after.1, &before.1) >= changes as f64) || Instant::now() > deadline {
            break after;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    (changes, storm, quantiles(&delta(&proxy_after, &before.0)), quantiles(&delta(&agent_after, &before.1)))
}

/// The cumulative buckets `(le, count)` of histogram `name` in a Prometheus text.
fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    text.lines()
        .filter_map(|line| line.strip_prefix(prefix.as_str()))
        .filter_map(|rest| {
            let le = rest.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, rest.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

fn total(buckets: &[(f64, f64)]) -> f64 {
    buckets.iter().find(|(le, _)| le.is_infinite()).map_or(0.0, |(_, count)| *count)
}

fn delta(after: &[(f64, f64)], before: &[(f64, f64)]) -> Vec<(f64, f64)> {
    after
        .iter()
        .map(|&(le, count)| (le, count - before.iter().find(|(b, _)| *b == le).map_or(0.0, |(_, c)| *c)))
        .collect()
}

/// p50, p99 (as `histogram_quantile`: linear within the bucket) and the count; a quantile in
/// the `+Inf` bucket is beyond the last bound: its negative says so.
fn quantiles(buckets: &[(f64, f64)]) -> Quantiles {
    let count = total(buckets);
    let at = |q: f64| {
        let rank = q * count;
        let mut lower = (0.0, 0.0);
        for &(le, cumulative) in buckets {
            if cumulative >= rank {
                if le.is_infinite() {
                    return -lower.0;
                }
                let within = if cumulative > lower.1 { (rank - lower.1) / (cumulative - lower.1) } else { 0.0 };
                return lower.0 + (le - lower.0) * within;
            }
            lower = (le, cumulative);
        }
        f64::NAN
    };
    (at(0.5), at(0.99), count)
}

/// A quantile in milliseconds: `>B` when beyond the histogram's last bound `B`.
fn ms(seconds: f64) -> String {
    if seconds.is_nan() {
        return "-".to_owned();
    }
    match seconds < 0.0 {
        true => format!(">{:.0}", -seconds * 1e3),
        false => format!("{:.1}", seconds * 1e3),
    }
}

/// A run's full sync for the table: `> limit` when it had not finished.
fn full_sync(run: &ProxyRun) -> String {
    match run.sync {
        Some(sync) => format!("{:.1} s", sync.as_secs_f64()),
        None => format!("> {} s (not finished)", SYNC_LIMIT.as_secs()),
    }
}

/// A run's full sync for the summary line: `>limit` when it had not finished.
fn seconds(run: &ProxyRun) -> String {
    match run.sync {
        Some(sync) => format!("{:.2}", sync.as_secs_f64()),
        None => format!(">{}", SYNC_LIMIT.as_secs()),
    }
}

/// The table and its summary line.
pub fn print(real: &Real) {
    println!(
        "\nside by side with the real kube-proxy ({}, nftables, then iptables mode through the legacy backend and \
         through iptables-nft, its defaults), on the real API server: {SERVICES} Services × {ENDPOINTS} endpoints\n",
        real.version
    );
    println!("| measurement | kube-proxy | topology-agent | target |");
    println!("| --- | ---: | ---: | ---: |");
    for run in &real.runs {
        let mode = run.mode.label();
        println!(
            "| {mode}: full sync, process start → first sync written (agent: ready; its programs loaded) | {} | {:.1} s | agent faster |",
            full_sync(run),
            real.agent_sync.as_secs_f64()
        );
        if run.sync.is_none() {
            println!("| {mode}: network programming under the storm | not measured: no first sync | | |");
            continue;
        }
        println!(
            "| {mode}: network programming, slice stamped → kernel, p50 ({} changes in {:.0} s, {RATE}/s asked) | {} ms | {} ms | |",
            run.changes,
            run.storm.as_secs_f64(),
            ms(run.proxy.0),
            ms(run.agent.0)
        );
        println!(
            "| {mode}: the same, p99 (observations: {:.0} / {:.0}) | {} ms | {} ms | ≤ 1/10 of kube-proxy's |",
            run.proxy.2,
            run.agent.2,
            ms(run.proxy.1),
            ms(run.agent.1)
        );
    }
    let of = |mode: ProxyMode| real.runs.iter().find(|run| run.mode == mode);
    let (Some(nft), Some(ipt), Some(ipl)) =
        (of(ProxyMode::Nftables), of(ProxyMode::Iptables), of(ProxyMode::IptablesLegacy))
    else {
        return;
    };
    println!(
        "\nreal: kp_sync_p99_ms={} sync_p99_ms={} kp_sync_p50_ms={} sync_p50_ms={} kp_full_sync_s={} \
         full_sync_s={:.2} changes_per_s={:.0} kp_ipt_sync_p99_ms={} agent_ipt_run_sync_p99_ms={} kp_ipt_full_sync_s={} \
         kp_ipl_sync_p99_ms={} agent_ipl_run_sync_p99_ms={} kp_ipl_full_sync_s={}",
        ms(nft.proxy.1),
        ms(nft.agent.1),
        ms(nft.proxy.0),
        ms(nft.agent.0),
        seconds(nft),
        real.agent_sync.as_secs_f64(),
        nft.changes as f64 / nft.storm.as_secs_f64().max(f64::MIN_POSITIVE),
        ms(ipt.proxy.1),
        ms(ipt.agent.1),
        seconds(ipt),
        ms(ipl.proxy.1),
        ms(ipl.agent.1),
        seconds(ipl),
    );
}
