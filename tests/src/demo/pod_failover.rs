//! The failover of one pod: a backend dies (SIGKILL) while two client pods on every node connect
//! in a loop to the `default` Service (every backend in every node's set), and the cluster takes
//! [`DETECTION`] to notice — the readiness probes' period × failure threshold on a real cluster —
//! before its endpoint leaves the slices. Until then only passive outlier ejection can help: each
//! node's kernel avoids the backend after its fifth failed handshake in a row from that node,
//! once both pods have seen one fail.

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
    /// Per node, what ejection bounds its failures by: the threshold, or as many as had failed
    /// when the second pod first failed if more, and one more that was in flight then from the
    /// other pod; `u64::MAX` where only one pod failed (no evidence: nothing bounds it).
    pub bounds: Vec<u64>,
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
    // Two pods per node: ejection takes two pods' evidence.
    let clients: Vec<_> = (0..demo.nodes())
        .map(|node| {
            [demo.place(node), demo.second_place(node)]
                .map(|place| place.spawn_loop_with(target, demo.dir(), Duration::from_secs(60), false, PACE, true))
        })
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
        bounds: Vec::new(),
    };
    for (node, pods) in clients.into_iter().enumerate() {
        let reports = pods.map(|client| client.finish());
        let mut failed_times = Vec::new();
        let mut firsts = Vec::new();
        for report in &reports {
            failover.attempts += report.attempts;
            let before: Vec<u64> = report.failed_at.iter().copied().filter(|&at| at < updated_at).collect();
            let cut = report.broken_at.iter().filter(|&&at| at < updated_at).count() as u64;
            failover.cut_by_the_kill += cut;
            failover.failed_after += (report.failed_at.len() - before.len()) as u64;
            let handshakes = without_cut(before, &report.broken_at);
            firsts.push(handshakes.iter().min().copied());
            failed_times.extend(handshakes);
        }
        let name = demo.plan().nodes[node].name.clone();
        failover.failed_before_update.push((name, failed_times.len() as u64));
        failover.bounds.push(bound(&failed_times, &firsts, CONSECUTIVE_FAILURES));
    }
    failover
}

/// The pod failover in one line.
/// The failure times `failed` without those of connections cut after their handshake: each cut
/// (stamped as it is seen) is the first failure at or after its stamp.
fn without_cut(mut failed: Vec<u64>, cut: &[u64]) -> Vec<u64> {
    failed.sort_unstable();
    for at in cut {
        if let Some(index) = failed.iter().position(|failure| failure >= at) {
            failed.remove(index);
        }
    }
    failed
}

/// What ejection bounds a node's handshake failures `failed` (both pods') by, the pods' first
/// failures being `firsts` (see [`PodFailover::bounds`]).
fn bound(failed: &[u64], firsts: &[Option<u64>], threshold: u32) -> u64 {
    let (Some(Some(a)), Some(Some(b))) = (firsts.first(), firsts.get(1)) else {
        return u64::MAX;
    };
    let second = (*a).max(*b);
    let until_second = failed.iter().filter(|&&at| at <= second).count() as u64;
    until_second.max(u64::from(threshold)) + 1
}

pub fn pod_failover_line(f: &PodFailover) -> String {
    let failed: u64 = f.failed_before_update.iter().map(|(_, failed)| failed).sum();
    format!(
        "failover: one pod ({}) killed, its endpoint removed {:.0} s later (the readiness probes' delay); {} \
         connections from two pods on each of {} nodes to `{}`, {failed} failed before the update (per node ≤ \
         {} once both pods had failed: at most {} — outlier ejection) and {} established before the kill were cut \
         by it, {} after",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_connection_is_the_first_failure_after_its_stamp() {
        assert_eq!(without_cut(vec![30, 10, 21], &[20]), [10, 30]);
        assert_eq!(without_cut(vec![10], &[20]), [10]);
    }

    #[test]
    fn the_bound_is_the_threshold_or_the_failures_until_the_second_pods_first_and_one_in_flight() {
        // Both pods failed early: the threshold, and one more in flight.
        assert_eq!(bound(&[1, 2, 3, 4, 5], &[Some(1), Some(2)], 5), 6);
        // The second pod failed first at 7, after six failures of the first: seven, and one more.
        assert_eq!(bound(&[1, 2, 3, 4, 5, 6, 7], &[Some(1), Some(7)], 5), 8);
        // One pod never failed: nothing bounds it.
        assert_eq!(bound(&[1, 2], &[Some(1), None], 5), u64::MAX);
    }
}
