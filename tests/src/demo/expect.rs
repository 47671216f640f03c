//! What the demo must show, whichever control plane feeds it: the landing shares every policy
//! must reach, and failovers that fail no connection once the kernel holds the new set.

use super::{Failover, PodFailover, Policy, ServiceResult};

fn result<'a>(results: &'a [ServiceResult], name: &str) -> &'a ServiceResult {
    results.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no result for {name}"))
}

/// Panics unless every Service of the default plan landed as its policy says, from `nodes`
/// nodes of `per_node` attempts each.
pub fn landings(results: &[ServiceResult], nodes: u64, per_node: u64) {
    // Close policies keep (almost) everything in the zone: every zone has backends.
    for name in ["prefer-close", "topology-keys", "auto-hints", "udp", "dns", "prefer-same-node"] {
        let r = result(results, name);
        assert_eq!(r.total.refused + r.total.failed, 0, "{name}: {:?}", r.total);
        let in_zone = r.total.in_zone().unwrap();
        assert!(in_zone >= 0.99, "{name}: {:.1}% in zone: {:?}", in_zone * 100.0, r.total);
    }
    // PreferSameNode: every node has a backend, so connections stay on the node.
    assert_eq!(result(results, "prefer-same-node").total.same_node, per_node * nodes);
    // Hard keys with no match refuse everything.
    let hard = result(results, "hard-keys");
    assert_eq!(hard.total.refused, per_node * nodes, "{:?}", hard.total);
    assert_eq!(hard.expected_refusing_nodes as u64, nodes);
    // Local stays on the node.
    let local = result(results, "local");
    assert_eq!(local.total.same_node, local.total.attempts(), "{:?}", local.total);
    // The default spreads within 5 points of uniform over the plan's backends.
    let default = result(results, "default");
    let delivered = default.total.delivered() as f64;
    for (backend, count) in &default.per_backend {
        let share = *count as f64 / delivered;
        assert!((share - 1.0 / 6.0).abs() <= 0.05, "default: {backend} got {:.1}%", share * 100.0);
    }
    assert_eq!(default.policy, Policy::Default);
    // Baselines spread too: about a third in zone.
    let baseline = result(results, "prefer-close-baseline").total.in_zone().unwrap();
    assert!((0.2..0.5).contains(&baseline), "baseline in zone {baseline}");
    // What explain said matches what happened.
    for r in results.iter().filter(|r| r.expected_in_zone.is_some()) {
        let (said, got) = (r.expected_in_zone.unwrap(), r.total.in_zone().unwrap());
        assert!((said - got).abs() < 0.1, "{}: explain said {said:.2}, measured {got:.2}", r.name);
    }
}

/// Panics unless a zone's failover failed nothing once the kernel held the new set.
pub fn failover(failover: &Failover) {
    assert!(failover.killed > 0, "{failover:?}");
    // Connections to the dead servers fail until the kernel holds the new set; none after, and
    // none while the servers come back (their endpoints return only once they listen).
    let failed = failover.failed_before_update + failover.failed_while_reacting;
    assert!(failed > 0, "the servers were really killed: {failover:?}");
    assert_eq!(failover.failed_after, 0, "{failover:?}");
    assert!(failover.attempts > 100, "{failover:?}");
}

/// Panics unless one pod's death cost each node at most what outlier ejection bounds it by.
pub fn pod_failover(pod: &PodFailover) {
    // One pod dies and the cluster takes 5 s to notice: each node's kernel ejects it after its
    // fifth failed handshake from there, every other connection goes to the live backends.
    assert!(pod.attempts > 1000, "{pod:?}");
    // No node sees more handshakes fail than ejection bounds them by (the threshold once both of
    // its pods have seen one fail); a connection established before the kill and cut by it is no
    // router's to avoid (one at most per pod: each holds one).
    for ((node, failed), bound) in pod.failed_before_update.iter().zip(&pod.bounds) {
        assert!(failed <= bound, "{node}: {failed} failed, bound {bound}: {pod:?}");
    }
    assert!(pod.cut_by_the_kill <= 2 * pod.failed_before_update.len() as u64, "{pod:?}");
    assert!(pod.failed_before_update.iter().any(|(_, failed)| *failed > 0), "the pod was really killed: {pod:?}");
    assert_eq!(pod.failed_after, 0, "{pod:?}");
}
