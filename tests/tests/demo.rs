//! The demo, reduced (fewer connections), with the landing shares every policy must reach.
//! Root, real kernel, `--test-threads=1`.

use std::collections::BTreeMap;

use serde_json::Value;
use topology_tests::{
    demo::{self, DemoCluster, DemoConfig, Policy, ServiceResult},
    require_root,
};

fn result<'a>(results: &'a [ServiceResult], name: &str) -> &'a ServiceResult {
    results.iter().find(|r| r.name == name).unwrap_or_else(|| panic!("no result for {name}"))
}

/// (ClusterIP, port, protocol) -> (backend address, port) -> share of new connections.
type Shares = BTreeMap<(String, u64, String), BTreeMap<(String, u64), f64>>;

fn planned_shares(explain: &Value) -> Shares {
    let mut out = Shares::new();
    for entry in explain["services"].as_array().expect("services") {
        let backends: BTreeMap<_, _> = entry["backends"]
            .as_array()
            .expect("backends")
            .iter()
            .filter(|b| b["share"].as_f64().expect("share") > 0.0)
            .map(|b| ((text(&b["address"]), b["port"].as_u64().unwrap()), b["share"].as_f64().unwrap()))
            .collect();
        // A ClusterIP whose port another Service owns holds that Service's set, listed under it.
        let held_by_others: Vec<&Value> = entry["conflicts"].as_array().map_or(Vec::new(), |c| c.iter().collect());
        for ip in entry["clusterIPs"].as_array().expect("clusterIPs") {
            if held_by_others.iter().any(|conflict| conflict["clusterIP"] == *ip) {
                continue;
            }
            out.insert((text(ip), entry["port"].as_u64().unwrap(), text(&entry["protocol"])), backends.clone());
        }
    }
    out
}

fn held_shares(status: &Value) -> Shares {
    status["services"]
        .as_array()
        .expect("services")
        .iter()
        .map(|service| {
            let backends = service["backends"]
                .as_array()
                .expect("backends")
                .iter()
                .map(|b| ((text(&b["address"]), b["port"].as_u64().unwrap()), b["share"].as_f64().unwrap()))
                .collect();
            ((text(&service["clusterIp"]), service["port"].as_u64().unwrap(), text(&service["protocol"])), backends)
        })
        .collect()
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_else(|| panic!("not a string: {value}")).to_owned()
}

#[test]
fn the_reduced_demo_lands_every_policy_where_it_should() {
    require_root!();
    let config = DemoConfig { connections: 200, ..DemoConfig::default() };
    let dir = std::env::temp_dir().join(format!("topology-demo-test-{}", std::process::id()));
    let mut cluster = DemoCluster::start(&config, &dir);
    let results = demo::measure(&cluster, config.connections, &mut |_, _| {});
    let per_node_attempts = config.connections;
    eprintln!("{}", demo::report::table(&results));

    // Close policies keep (almost) everything in the zone: every zone has backends.
    for name in ["prefer-close", "topology-keys", "auto-hints", "udp", "dns", "prefer-same-node"] {
        let r = result(&results, name);
        assert_eq!(r.total.refused + r.total.failed, 0, "{name}: {:?}", r.total);
        let in_zone = r.total.in_zone().unwrap();
        assert!(in_zone >= 0.99, "{name}: {:.1}% in zone: {:?}", in_zone * 100.0, r.total);
    }
    // PreferSameNode: every node has a backend, so connections stay on the node.
    assert_eq!(result(&results, "prefer-same-node").total.same_node, per_node_attempts * 6);
    // Hard keys with no match refuse everything.
    let hard = result(&results, "hard-keys");
    assert_eq!(hard.total.refused, per_node_attempts * 6, "{:?}", hard.total);
    assert_eq!(hard.expected_refusing_nodes, 6);
    // Local stays on the node.
    let local = result(&results, "local");
    assert_eq!(local.total.same_node, local.total.attempts(), "{:?}", local.total);
    // The default spreads within 5 points of uniform over the six backends.
    let default = result(&results, "default");
    let delivered = default.total.delivered() as f64;
    for (backend, count) in &default.per_backend {
        let share = *count as f64 / delivered;
        assert!((share - 1.0 / 6.0).abs() <= 0.05, "default: {backend} got {:.1}%", share * 100.0);
    }
    assert_eq!(default.policy, Policy::Default);
    // Baselines spread too: about a third in zone.
    let baseline = result(&results, "prefer-close-baseline").total.in_zone().unwrap();
    assert!((0.2..0.5).contains(&baseline), "baseline in zone {baseline}");
    // What explain said matches what happened.
    for r in results.iter().filter(|r| r.expected_in_zone.is_some()) {
        let (said, got) = (r.expected_in_zone.unwrap(), r.total.in_zone().unwrap());
        assert!((said - got).abs() < 0.1, "{}: explain said {said:.2}, measured {got:.2}", r.name);
    }

    // Explain is what the kernel holds: on every node, for every ClusterIP and port, the same
    // backends with the same shares, read back from the maps by `status`.
    for node in 0..cluster.nodes() {
        let (planned, held) = (planned_shares(&cluster.explain(node)), held_shares(&cluster.status(node)));
        assert!(!planned.is_empty());
        assert_eq!(planned, held, "node {node}: explain and status disagree");
    }

    // Bytes: the agents' kernel counts hold what the clients moved (plus TCP's SYN and FINs:
    // 3 bytes a connection), `bytes` (PreferClose) crossing no zone, its twin about two thirds.
    let bytes = demo::bytes::measure(&cluster);
    eprintln!("{}", demo::bytes::line(&bytes));
    for b in &bytes {
        let connections = 6 * 40;
        assert_eq!(b.counted(), b.moved + 3 * connections, "{b:?}");
    }
    assert_eq!(bytes[0].cross_zone, 0, "{:?}", bytes[0]);
    assert!((0.5..0.85).contains(&bytes[1].cross_share()), "{:?}", bytes[1]);
    let expected = bytes[0].baseline_cross_zone / bytes[0].counted() as f64;
    assert!((expected - 2.0 / 3.0).abs() < 0.01, "the default would cross two thirds: {expected}");

    let failover = demo::failover(&mut cluster);
    eprintln!("{failover:?}");
    assert!(failover.killed > 0, "{failover:?}");
    // Connections to the dead servers fail until the kernel holds the new set; none after, and
    // none while the servers come back (their endpoints return only once they listen).
    assert!(failover.failed_while_reacting > 0, "the servers were really killed: {failover:?}");
    assert_eq!(failover.failed_after, 0, "{failover:?}");
    assert!(failover.attempts > 100, "{failover:?}");

    // One pod dies and the cluster takes 5 s to notice: each node's kernel ejects it after its
    // fifth failed handshake from there, every other connection goes to the live backends.
    let pod = demo::pod_failover(&mut cluster);
    eprintln!("{}", demo::pod_failover_line(&pod));
    assert!(pod.attempts > 1000, "{pod:?}");
    // No node sees more handshakes fail than the threshold; a connection established before the
    // kill and cut by it is no router's to avoid (one at most per node: its client holds one).
    assert!(pod.most_failed_per_node() <= u64::from(pod.threshold), "{pod:?}");
    assert!(pod.cut_by_the_kill <= pod.failed_before_update.len() as u64, "{pod:?}");
    assert!(pod.failed_before_update.iter().any(|(_, failed)| *failed > 0), "the pod was really killed: {pod:?}");
    assert_eq!(pod.failed_after, 0, "{pod:?}");

    demo::report::write(&dir, &config, &results, &failover, &pod, &bytes).expect("report");
    let report = std::fs::read_to_string(dir.join("report.md")).expect("report.md");
    assert!(report.contains("| `prefer-close` | PreferClose | 100.0% |"), "{report}");
    assert!(report.contains("## Cross-zone bytes, as the agents counted them"), "{report}");
    assert!(std::fs::read_to_string(dir.join("in-zone.svg")).expect("svg").starts_with("<svg"));
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
