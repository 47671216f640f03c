//! The failover of one pod: a backend dies (SIGKILL) while a client on every node connects in a
//! loop to the `default` Service (every backend in every node's set), and the cluster takes
//! [`DETECTION`] to notice — the readiness probes' period × failure threshold on a real cluster —
//! before its endpoint leaves `cluster.yaml`. Until then only passive outlier ejection can help:
//! each node's kernel avoids the backend after its fifth failed handshake from that node.

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde::Serialize;
use topology_common::outlier::CONSECUTIVE_FAILURES;

use super::{
    DemoNodes,
    cluster::wait_until,
    plan::{Removed, SERVICE_PORT},
};
use crate::traffic::monotonic_ns;

/// From the kill to the endpoint leaving the file.
pub const DETECTION: Duration = Duration::from_secs(5);
/// Pause between each node's attempts: about 500 a second per node.
const PACE: Duration = Duration::from_millis(2);

/// What one pod's death cost, per node.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodFailover {
    /// The backend killed.
    pub backend: String,
    /// The Service the clients connected to.
    pub service: String,
    /// Until its endpoint left the file.
    pub detection: Duration,
    /// Connections the clients made, over all nodes.
    pub attempts: u64,
    /// Per node: connections whose handshake failed before the endpoint update (what outlier
    /// ejection bounds).
    pub failed_before_update: Vec<(String, u64)>,
    /// Connections established before the kill and cut by it, over all nodes (at most one per
    /// node: each node's client holds one connection at a time).
    pub cut_by_the_kill: u64,
    /// Failed after the update, over all nodes (should be none).
    pub failed_after: u64,
    /// The ejection threshold: failed handshakes in a row from one node.
    pub threshold: u32,
}

impl PodFailover {
    /// The most any node saw fail before the endpoint update.
    pub fn most_failed_per_node(&self) -> u64 {
        self.failed_before_update.iter().map(|(_, failed)| *failed).max().unwrap_or(0)
    }
}

/// Kills the first backend, waits [`DETECTION`], removes its endpoint, waits for every node to
/// leave it; then restarts it and restores the endpoint.
pub fn pod_failover(demo: &mut impl DemoNodes) -> PodFailover {
    let victim = 0;
    let backend = demo.plan().backends[victim].name.clone();
    let service = demo.plan().services.iter().position(|s| s.name == "default").expect("default");
    let target = SocketAddr::new(IpAddr::V4(demo.plan().services[service].vip), SERVICE_PORT);
    let clients: Vec<_> = (0..demo.nodes())
        .map(|node| demo.place(node).spawn_loop_with(target, demo.dir(), Duration::from_secs(60), false, PACE, true))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    demo.kill_backend(victim);
    std::thread::sleep(DETECTION);
    let updated_at = monotonic_ns();
    demo.set_removed(Removed::Backend(&backend));
    for node in 0..demo.nodes() {
        wait_until(demo, node, service, Duration::from_secs(30), |r| {
            r.failures() == 0 && r.successes() > 0 && !r.landed.contains_key(&backend)
        });
    }
    demo.restart_backend(victim);
    demo.set_removed(Removed::Nothing);
    let mut failover = PodFailover {
        backend: backend.clone(),
        service: demo.plan().services[service].name.clone(),
        detection: DETECTION,
        attempts: 0,
        failed_before_update: Vec::new(),
        cut_by_the_kill: 0,
        failed_after: 0,
        threshold: CONSECUTIVE_FAILURES,
    };
    for (node, client) in clients.into_iter().enumerate() {
        let report = client.finish();
        failover.attempts += report.attempts;
        let before = report.failed_at.iter().filter(|&&at| at < updated_at).count() as u64;
        let cut = report.broken_at.iter().filter(|&&at| at < updated_at).count() as u64;
        failover.failed_before_update.push((demo.plan().nodes[node].name.clone(), before - cut));
        failover.cut_by_the_kill += cut;
        failover.failed_after += report.failed_at.len() as u64 - before;
    }
    failover
}

/// The pod failover in one line.
pub fn pod_failover_line(f: &PodFailover) -> String {
    let failed: u64 = f.failed_before_update.iter().map(|(_, failed)| failed).sum();
    format!(
        "failover: one pod ({}) killed, its endpoint removed {:.0} s later (the readiness probes' delay); {} \
         connections from {} nodes to `{}`, {failed} failed before the update (per node ≤ {}: at most {} — \
         outlier ejection) and {} established before the kill were cut by it, {} after",
        f.backend,
        f.detection.as_secs_f64(),
        f.attempts,
        f.failed_before_update.len(),
        f.service,
        f.threshold,
        f.most_failed_per_node(),
        f.cut_by_the_kill,
        f.failed_after
    )
}
