//! The demo, reduced (fewer connections), with the landing shares every policy must reach.
//! Root, real kernel, `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::collections::BTreeMap;

use serde_json::Value;
use topology_tests::{
    demo::{self, DemoCluster, DemoConfig, DemoNodes as _},
    require_root,
};

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

    demo::expect::landings(&results, cluster.nodes() as u64, per_node_attempts);

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
    demo::expect::failover(&failover);
    let pod = demo::pod_failover(&mut cluster);
    eprintln!("{}", demo::pod_failover_line(&pod));
    demo::expect::pod_failover(&pod);

    let measured = demo::report::Measured {
        results: &results,
        failover: &failover,
        pod: &pod,
        bytes: Some(&bytes),
        control_plane: "the embedded one",
    };
    demo::report::write(&dir, &config, &measured).expect("report");
    let report = std::fs::read_to_string(dir.join("report.md")).expect("report.md");
    assert!(report.contains("| `prefer-close` | PreferClose | 100.0% |"), "{report}");
    assert!(report.contains("## Cross-zone bytes, as the agents counted them"), "{report}");
    assert!(std::fs::read_to_string(dir.join("in-zone.svg")).expect("svg").starts_with("<svg"));
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}
