//! What the demo measures: where real connections from every node landed, Service by Service,
//! next to what `explain` said; and how a zone's removal and return move new connections.

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde::Serialize;

use super::{
    cluster::{DemoCluster, wait_until},
    plan::{Policy, SERVICE_PORT, ServicePlan, Transport},
};
use crate::traffic::Report;

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
}

/// Runs `connections` attempts from every node to every Service (nodes in parallel), calling
/// `progress(done, total)` after each Service.
pub fn measure(demo: &DemoCluster, connections: u64, progress: &mut dyn FnMut(usize, usize)) -> Vec<ServiceResult> {
    let plan = &demo.plan;
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
        });
        progress(s + 1, plan.services.len());
    }
    results
}

/// Where one node's attempts landed.
fn classify(demo: &DemoCluster, node: usize, report: &Report) -> Landing {
    let client = &demo.plan.nodes[node];
    let mut landing = Landing::default();
    for (name, count) in &report.landed {
        let backend = demo.plan.node_of(name).unwrap_or_else(|| panic!("unknown backend {name}"));
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

/// A zone's backends removed from the cluster file and restored, with a client looping meanwhile.
#[derive(Clone, Debug, Serialize)]
pub struct Failover {
    /// Zone whose backends were removed.
    pub zone: String,
    /// Node the clients ran on (in that zone).
    pub node: String,
    /// Service dialled.
    pub service: String,
    /// From writing the file without the zone to new connections all landing elsewhere.
    pub moved_after: Duration,
    /// From restoring the file to new connections all landing in the zone again.
    pub back_after: Duration,
    /// Connections the looping client made meanwhile.
    pub attempts: u64,
    /// Of which failed.
    pub failures: u64,
}

/// Removes the first zone's backends from `cluster.yaml` while a client on that zone's first node
/// connects in a loop to the PreferClose Service; then restores them.
pub fn failover(demo: &DemoCluster) -> Failover {
    let node = 0;
    let zone = demo.plan.nodes[node].zone.clone();
    let service = demo.plan.services.iter().position(|s| s.name == "prefer-close").expect("prefer-close");
    let target = SocketAddr::new(IpAddr::V4(demo.plan.services[service].vip), SERVICE_PORT);
    let in_zone = |name: &str| demo.plan.node_of(name).is_some_and(|n| n.zone == zone);
    let client = demo.place(node).spawn_loop(target, &demo.dir, Duration::from_secs(120), false);
    demo.write_cluster(Some(&zone));
    let moved_after = wait_until(demo, node, service, Duration::from_secs(30), |r| {
        r.failures() == 0 && r.successes() > 0 && r.landed.keys().all(|name| !in_zone(name))
    });
    demo.write_cluster(None);
    let back_after = wait_until(demo, node, service, Duration::from_secs(30), |r| {
        r.failures() == 0 && r.successes() > 0 && r.landed.keys().all(|name| in_zone(name))
    });
    let report = client.finish();
    Failover {
        zone,
        node: demo.plan.nodes[node].name.clone(),
        service: demo.plan.services[service].name.clone(),
        moved_after,
        back_after,
        attempts: report.attempts,
        failures: report.failures(),
    }
}
