//! What the demo measures: where real connections from every node landed, Service by Service,
//! next to what `explain` said; and how a zone's removal and return move new connections.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde::Serialize;

use super::{
    DemoNodes,
    cluster::wait_until,
    plan::{Policy, Removed, SERVICE_PORT, ServicePlan, Transport},
};
use crate::traffic::{Report, monotonic_ns};

/// Where attempts from one node (or all) to one Service ended, by locality of the backend.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Landing {
    /// On the client's node.
    pub same_node: u64,
    /// In the client's zone, another node.
    pub same_zone: u64,
    /// Another zone of the client's region.
    pub other_zone: u64,
    /// Another region.
    pub other_region: u64,
    /// Refused by the kernel (`ECONNREFUSED`): an empty backend set.
    pub refused: u64,
    /// Any other failure.
    pub failed: u64,
}

impl Landing {
    /// Attempts made.
    pub fn attempts(&self) -> u64 {
        self.delivered() + self.refused + self.failed
    }

    /// Attempts that reached a backend.
    pub fn delivered(&self) -> u64 {
        self.same_node + self.same_zone + self.other_zone + self.other_region
    }

    /// Share of delivered attempts that stayed in the client's zone.
    pub fn in_zone(&self) -> Option<f64> {
        let delivered = self.delivered();
        (delivered > 0).then(|| (self.same_node + self.same_zone) as f64 / delivered as f64)
    }

    fn add(&mut self, other: &Self) {
        self.same_node += other.same_node;
        self.same_zone += other.same_zone;
        self.other_zone += other.other_zone;
        self.other_region += other.other_region;
        self.refused += other.refused;
        self.failed += other.failed;
    }
}

/// Attempts from kube-proxy's node before the rest: when none is delivered, the Service is one
/// kube-proxy drops there, and these are its measurement.
const PROBE_ATTEMPTS: u64 = 5;

/// One Service measured from every node.
#[derive(Clone, Debug, Serialize)]
pub struct ServiceResult {
    /// Service name.
    pub name: String,
    /// Routing policy.
    #[serde(skip)]
    pub policy: Policy,
    /// Transport.
    #[serde(skip)]
    pub transport: Transport,
    /// The Service this is the baseline of.
    pub baseline_of: Option<String>,
    /// All nodes together.
    pub total: Landing,
    /// Per node, in plan order.
    pub per_node: Vec<Landing>,
    /// Delivered attempts per backend name.
    pub per_backend: BTreeMap<String, u64>,
    /// In-zone share of the backends `explain` chose, by weight, averaged over the nodes that
    /// do not refuse; `None` if every node refuses.
    pub expected_in_zone: Option<f64>,
    /// Nodes `explain` says refuse.
    pub expected_refusing_nodes: usize,
    /// `explain`'s reason on the first node.
    pub reason: String,
    /// From the real kube-proxy's node, for the Services it routes (not by DNS, not twins).
    pub kube_proxy: Option<Landing>,
}

/// Runs `connections` attempts from every node to every Service (nodes in parallel), calling
/// `progress(done, total)` after each Service.
pub fn measure(demo: &impl DemoNodes, connections: u64, progress: &mut dyn FnMut(usize, usize)) -> Vec<ServiceResult> {
    let plan = demo.plan();
    let explains: Vec<serde_json::Value> = (0..plan.nodes.len()).map(|i| demo.explain(i)).collect();
    let mut results = Vec::new();
    for (s, service) in plan.services.iter().enumerate() {
        let reports: Vec<Report> = std::thread::scope(|scope| {
            let handles: Vec<_> =
                (0..plan.nodes.len()).map(|n| scope.spawn(move || demo.traffic(n, s, connections))).collect();
            handles.into_iter().map(|h| h.join().expect("traffic thread")).collect()
        });
        let mut total = Landing::default();
        let mut per_node = Vec::new();
        let mut per_backend = BTreeMap::new();
        for (n, report) in reports.iter().enumerate() {
            let landing = classify(demo, n, report);
            total.add(&landing);
            per_node.push(landing);
            for (name, count) in &report.landed {
                *per_backend.entry(name.clone()).or_default() += count;
            }
        }
        let (expected_in_zone, expected_refusing_nodes, reason) = expected(&explains, service);
        let kube_proxy =
            demo.kube_proxy().filter(|_| service.baseline_of.is_none() && service.transport != Transport::Dns);
        let kube_proxy = kube_proxy.map(|(place, node)| {
            let target = SocketAddr::new(IpAddr::V4(service.vip), SERVICE_PORT);
            let run = |count| match service.transport {
                Transport::Udp => place.udp(target, count, crate::traffic::UdpMode::Unconnected),
                _ => place.tcp(target, count),
            };
            // A Service kube-proxy drops (itp Local, no backend on its node) times each attempt
            // out: a few tell, without waiting out the rest.
            let first = run(PROBE_ATTEMPTS);
            let report = if first.landed.is_empty() { first } else { run(connections) };
            landing(demo.plan(), node, &report)
        });
        results.push(ServiceResult {
            name: service.name.clone(),
            policy: service.policy,
            transport: service.transport,
            baseline_of: service.baseline_of.clone(),
            total,
            per_node,
            per_backend,
            expected_in_zone,
            expected_refusing_nodes,
            reason,
            kube_proxy,
        });
        progress(s + 1, plan.services.len());
    }
    results
}

/// Where one node's attempts landed.
fn classify(demo: &impl DemoNodes, node: usize, report: &Report) -> Landing {
    landing(demo.plan(), &demo.plan().nodes[node], report)
}

/// Where the attempts of a client on `client` landed.
fn landing(plan: &super::Plan, client: &super::plan::NodePlan, report: &Report) -> Landing {
    let mut landing = Landing::default();
    for (name, count) in &report.landed {
        let backend = plan.node_of(name).unwrap_or_else(|| panic!("unknown backend {name}"));
        let class = if backend.name == client.name {
            &mut landing.same_node
        } else if backend.zone == client.zone {
            &mut landing.same_zone
        } else if backend.region == client.region {
            &mut landing.other_zone
        } else {
            &mut landing.other_region
        };
        *class += count;
    }
    landing.refused = report.errno("ECONNREFUSED");
    landing.failed = report.failures() - landing.refused;
    landing
}

/// What `explain` said for a Service: expected in-zone share, refusing nodes, first reason. A
/// headless Service is read from what the node's DNS responder answers.
fn expected(explains: &[serde_json::Value], service: &ServicePlan) -> (Option<f64>, usize, String) {
    let mut shares = Vec::new();
    let mut refusing = 0;
    let mut reason = String::new();
    let vip = service.vip.to_string();
    let headless_name = format!("{}.demo.svc", service.name);
    for explain in explains {
        let (section, found): (&str, &dyn Fn(&serde_json::Value) -> bool) = match service.transport {
            Transport::Dns => ("headless", &|e| e["name"] == headless_name.as_str()),
            _ => ("services", &|e| e["clusterIPs"].as_array().is_some_and(|ips| ips.iter().any(|ip| ip == &vip))),
        };
        let Some(entry) = explain[section].as_array().into_iter().flatten().find(|e| found(e)) else {
            panic!("explain has no entry for {}", service.name);
        };
        if reason.is_empty() {
            let reasons = entry["reasons"].as_array().map(|r| r.iter().filter_map(|r| r.as_str()).collect::<Vec<_>>());
            reason = reasons.map_or_else(|| entry["reason"].as_str().unwrap_or_default().to_owned(), |r| r.join("; "));
        }
        if entry["reject"] == true || entry["answer"] == "nxdomain" {
            refusing += 1;
            continue;
        }
        let list = if service.transport == Transport::Dns { "addresses" } else { "backends" };
        let backends = entry[list].as_array().cloned().unwrap_or_default();
        let weight = |b: &serde_json::Value| b["weight"].as_f64().unwrap_or(0.0);
        let total: f64 = backends.iter().map(weight).sum();
        let close: f64 =
            backends.iter().filter(|b| b["locality"] == "node" || b["locality"] == "zone").map(weight).sum();
        if total > 0.0 {
            shares.push(close / total);
        }
    }
    let share = (!shares.is_empty()).then(|| shares.iter().sum::<f64>() / shares.len() as f64);
    (share, refusing, reason)
}

/// A zone's servers killed under load, their endpoints then removed (from the cluster file, or by
/// the EndpointSlice controller once the pods are reported not ready), and later restarted and
/// restored.
#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    /// Zone whose backends were killed.
    pub zone: String,
    /// Node the clients ran on (in that zone).
    pub node: String,
    /// Service dialled.
    pub service: String,
    /// Backend servers killed.
    pub killed: usize,
    /// How the cluster learned of it (`left cluster.yaml`, ...).
    pub removal: &'static str,
    /// From killing the servers to the cluster file without their endpoints being written: the
    /// cluster's detection, here immediate (on a real cluster, readiness probes' period ×
    /// failure threshold, or the pods' deletion).
    pub detected_after: Duration,
    /// From the file being written to new connections all landing elsewhere: the agent's part.
    pub moved_after: Duration,
    /// From restoring the file (servers running again) to new connections all in the zone again.
    pub back_after: Duration,
    /// Connections the looping client made meanwhile (one attempt about every millisecond).
    pub attempts: u64,
    /// Failed between the kill and the file update: no agent can know of it yet.
    pub failed_before_update: u64,
    /// Failed between the file update and the kernel holding the new set: while the agent reacted.
    pub failed_while_reacting: u64,
    /// Failed after the kernel held the new set, through the restore (should be none).
    pub failed_after: u64,
}

impl Failover {
    /// Every failed connection.
    pub fn failures(&self) -> u64 {
        self.failed_before_update + self.failed_while_reacting + self.failed_after
    }
}

/// Kills the first zone's servers while a client on that zone's first node connects in a loop to
/// the PreferClose Service, removes their endpoints, waits for new connections
/// to leave the zone; then restarts the servers, restores the endpoints, and waits for the return.
pub fn failover<D: DemoNodes>(demo: &mut D) -> Failover {
    let node = 0;
    let zone = demo.plan().nodes[node].zone.clone();
    let service = demo.plan().services.iter().position(|s| s.name == "prefer-close").expect("prefer-close");
    let target = SocketAddr::new(IpAddr::V4(demo.plan().services[service].vip), SERVICE_PORT);
    let in_zone = |demo: &D, name: &str| demo.plan().node_of(name).is_some_and(|n| n.zone == zone);
    let client = demo.place(node).spawn_loop_with(target, demo.dir(), Duration::from_secs(120), false, PACE, true);
    std::thread::sleep(Duration::from_millis(200));
    let killed_at = monotonic_ns();
    let killed = demo.kill_zone(&zone);
    demo.set_removed(Removed::Zone(&zone));
    let updated_at = monotonic_ns();
    let moved_after = wait_until(demo, node, service, Duration::from_secs(30), |r| {
        r.failures() == 0 && r.successes() > 0 && r.landed.keys().all(|name| !in_zone(demo, name))
    });
    let moved_at = updated_at + moved_after.as_nanos() as u64;
    demo.restart_zone(&zone);
    demo.set_removed(Removed::Nothing);
    let back_after = wait_until(demo, node, service, Duration::from_secs(30), |r| {
        r.failures() == 0 && r.successes() > 0 && r.landed.keys().all(|name| in_zone(demo, name))
    });
    let report = client.finish();
    let failed_in = |from: u64, to: u64| report.failed_at.iter().filter(|&&at| at >= from && at < to).count() as u64;
    Failover {
        node: demo.plan().nodes[node].name.clone(),
        service: demo.plan().services[service].name.clone(),
        killed,
        removal: demo.removal(),
        detected_after: Duration::from_nanos(updated_at - killed_at),
        moved_after,
        back_after,
        attempts: report.attempts,
        failed_before_update: failed_in(0, updated_at),
        failed_while_reacting: failed_in(updated_at, moved_at),
        failed_after: failed_in(moved_at, u64::MAX),
        zone,
    }
}

/// Pause between the failover client's attempts: about a thousand a second.
const PACE: Duration = Duration::from_millis(1);
