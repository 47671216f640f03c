//! Cross-zone accounting through the real kernel (root, the agent's default): the bytes of the
//! TCP connections the hooks rewrote, per Service port, this node's zone and the backend's, as
//! `topology_agent_bytes_total` shows them, against what the clients moved and what the client's
//! interface carried; a connection held open is counted as it goes, not only when it ends.
//!
//! The kernel counts in TCP sequence space: a connection closed in order adds two bytes to
//! `to_backend` beyond its payload (its SYN and its FIN) and one to `from_backend` (the
//! backend's FIN), so the counts are checked to the byte against that.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    accounting::{self, Key},
    agent::{Agent, AgentOptions},
    bulk::{self, BulkServer, Transfer},
    fixture::Fixture,
    require_root,
};

/// The bulk servers' port, behind both Services.
const BULK_PORT: u16 = 9000;
/// `near` (b0, on node-a in zone-a, this node) and `far` (b1, on node-b in zone-b).
const NEAR: &str = "10.96.0.70:9000";
const FAR: &str = "10.96.0.71:9000";
/// `both` has b0 and b1, with `trafficDistribution: PreferClose`.
const BOTH: &str = "10.96.0.72:9000";
/// `refused` has b0 on a port nothing listens on.
const REFUSED: &str = "10.96.0.75:9000";
const CLOSED_PORT: u16 = 9009;
const MIB: u64 = 1 << 20;

/// An agent on node-a for `fx`'s two backends behind the three Services, with a bulk
/// server on each.
fn start(fx: &Fixture) -> (Agent, Vec<BulkServer>) {
    let file = fx.scratch().join("cluster.yaml");
    let mut objects = vec![objects::node("node-a", "zone-a", None, "4"), objects::node("node-b", "zone-b", None, "4")];
    let endpoint = |backend: usize, node| EndpointSpec::new(IpAddr::V4(fx.backends[backend].host.v4), node);
    for (name, vip, endpoints, port) in [
        ("near", NEAR, vec![endpoint(0, "node-a")], BULK_PORT),
        ("far", FAR, vec![endpoint(1, "node-b")], BULK_PORT),
        ("both", BOTH, vec![endpoint(0, "node-a"), endpoint(1, "node-b")], BULK_PORT),
        ("refused", REFUSED, vec![endpoint(0, "node-a")], CLOSED_PORT),
    ] {
        let vip: SocketAddr = vip.parse().unwrap();
        let mut service = objects::service("default", name, vip.ip(), vip.port(), "TCP", "bulk");
        if name == "both" {
            service["spec"]["trafficDistribution"] = "PreferClose".into();
        }
        objects.push(service);
        objects.push(objects::slice("default", &format!("{name}-1"), name, "bulk", port, "TCP", &endpoints));
    }
    objects::write(&file, &objects);
    let servers = fx.backends.iter().map(|b| BulkServer::start(&b.host, BULK_PORT, false)).collect();
    let mut agent = Agent::start(&AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()));
    agent.wait_ready(Duration::from_secs(20));
    (agent, servers)
}

/// `topology_agent_bytes_total` from this node's zone, but the `both` Service's.
fn counted(agent: &Agent) -> BTreeMap<Key, u64> {
    accounting::counted(agent, "zone-a", Some("default/both:"))
}

/// Waits until the counts reach `expected`; the last counts.
fn counted_within(agent: &Agent, expected: &BTreeMap<Key, u64>) -> BTreeMap<Key, u64> {
    accounting::counted_within(agent, "zone-a", Some("default/both:"), expected)
}

fn key(service: &str, zone: &str, direction: &str) -> Key {
    accounting::key(&format!("default/{service}:bulk"), zone, direction)
}

#[test]
fn the_bytes_counted_are_the_bytes_sent_per_service_and_zone() {
    require_root!();
    let fx = Fixture::new(2);
    let (agent, _servers) = start(&fx);
    let place = fx.place();
    let before = accounting::interface_tx(fx.client.netns.name()).0;
    // Short and bulk, both ways: many 1 MiB requests to the near Service, one 1 GiB upload and
    // a 64 MiB download from the far one.
    let small = Transfer { send: MIB, receive: 64 * 1024, hold: Duration::ZERO };
    let near = bulk::finish(bulk::spawn(&place, NEAR.parse().unwrap(), small, 20), Duration::from_secs(60));
    let large = Transfer { send: 1024 * MIB, receive: 64 * MIB, hold: Duration::ZERO };
    let far = bulk::finish(bulk::spawn(&place, FAR.parse().unwrap(), large, 1), Duration::from_secs(120));
    assert!(near.errors.is_empty() && far.errors.is_empty(), "{near:?} {far:?}");
    assert_eq!((near.completed, far.completed), (20, 1));
    let sent = accounting::interface_tx(fx.client.netns.name()).0 - before;

    // Per connection: its SYN and FIN to the backend, the backend's FIN back (see the top).
    let expected = BTreeMap::from([
        (key("near", "zone-a", "to_backend"), near.sent + 2 * 20),
        (key("near", "zone-a", "from_backend"), near.received + 20),
        (key("far", "zone-b", "to_backend"), far.sent + 2),
        (key("far", "zone-b", "from_backend"), far.received + 1),
    ]);
    let counted = counted_within(&agent, &expected);
    assert_eq!(counted, expected, "counted (left) against moved (right)");
    // What the interface carried out: the payloads, their headers and the ACKs of what came back.
    let to_backends: u64 = counted.iter().filter(|((_, _, d), _)| d == "to_backend").map(|(_, v)| v).sum();
    let error = sent.abs_diff(to_backends) as f64 / sent as f64;
    assert!(error <= 0.02, "the interface sent {sent} bytes, the counts say {to_backends} ({:.2} %)", error * 100.0);
}

#[test]
fn a_connection_held_open_is_counted_as_it_goes() {
    require_root!();
    let fx = Fixture::new(2);
    let (agent, _servers) = start(&fx);
    // One connection sending 40 MiB over 25 s: the sweeps (every 10 s) count it while it is open.
    let held = Transfer { send: 40 * MIB, receive: 0, hold: Duration::from_secs(25) };
    let client = bulk::spawn(&fx.place(), FAR.parse().unwrap(), held, 1);
    let deadline = Instant::now() + Duration::from_secs(22);
    let mut seen = 0;
    while Instant::now() < deadline && seen == 0 {
        std::thread::sleep(Duration::from_millis(500));
        seen = counted(&agent).get(&key("far", "zone-b", "to_backend")).copied().unwrap_or(0);
    }
    let report = bulk::finish(client, Duration::from_secs(60));
    assert!(report.errors.is_empty() && report.completed == 1, "{report:?}");
    assert!(seen > 0 && seen < report.sent, "counted while open: {seen} of {} bytes", report.sent);
    let total = BTreeMap::from([
        (key("far", "zone-b", "to_backend"), report.sent + 2),
        (key("far", "zone-b", "from_backend"), 1),
    ]);
    assert_eq!(counted_within(&agent, &total), total, "counted (left) against moved (right)");
}

/// `name{service="…"} value` lines of /metrics, by service.
fn per_service(agent: &Agent, name: &str) -> BTreeMap<String, f64> {
    let metrics = agent.get("/metrics").expect("metrics").1;
    let prefix = format!("{name}{{service=\"");
    metrics
        .lines()
        .filter_map(|line| line.strip_prefix(&prefix))
        .filter_map(|rest| {
            let (service, value) = rest.split_once("\"} ")?;
            Some((service.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn what_crossed_zones_and_what_the_routing_saved_per_service() {
    require_root!();
    let fx = Fixture::new(2);
    let (agent, _servers) = start(&fx);
    let place = fx.place();
    // 8 MiB up each to far (another zone) and to both (PreferClose: this zone's endpoint only).
    let upload = Transfer { send: 8 * MIB, receive: 0, hold: Duration::ZERO };
    let far = bulk::finish(bulk::spawn(&place, FAR.parse().unwrap(), upload, 1), Duration::from_secs(60));
    let both = bulk::finish(bulk::spawn(&place, BOTH.parse().unwrap(), upload, 1), Duration::from_secs(60));
    // Sequence space, both directions: SYN and FIN up, FIN back.
    let (far_bytes, both_bytes) = (far.sent + 3, both.sent + 3);
    let deadline = Instant::now() + Duration::from_secs(30);
    let (mut crossed, mut baseline) = (BTreeMap::new(), BTreeMap::new());
    while Instant::now() < deadline {
        crossed = per_service(&agent, "topology_agent_cross_zone_bytes_total");
        baseline = per_service(&agent, "topology_agent_cross_zone_bytes_baseline_total");
        if baseline.get("default/both:bulk").is_some_and(|&b| b > 0.0) && crossed.contains_key("default/far:bulk") {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    // far crossed all it moved, as the default would have; both crossed nothing, where the
    // default (one endpoint in each zone) would have sent half across.
    assert_eq!(crossed.get("default/far:bulk"), Some(&(far_bytes as f64)), "{crossed:?}");
    assert_eq!(baseline.get("default/far:bulk"), Some(&(far_bytes as f64)), "{baseline:?}");
    assert_eq!(crossed.get("default/both:bulk"), Some(&0.0), "{crossed:?}");
    assert_eq!(baseline.get("default/both:bulk"), Some(&(both_bytes as f64 / 2.0)), "{baseline:?}");
    // The same, as `status --cost` prints it from the agent's /debug/cost.
    let status = |args: &[&str]| {
        let output = std::process::Command::new(topology_tests::net::agent_binary())
            .args(["status", "--cost", "--agent", &agent.http.to_string()])
            .args(args)
            .output()
            .expect("status --cost");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let report: serde_json::Value = serde_json::from_str(&status(&["--output", "json"])).expect("a JSON report");
    let row = |service: &str| {
        let rows = report["services"].as_array().expect("services");
        rows.iter().find(|r| r["service"] == service).cloned().unwrap_or_default()
    };
    assert_eq!(row("default/both:bulk")["total"]["inZone"], both_bytes, "{report}");
    assert_eq!(row("default/far:bulk")["total"]["crossZone"], far_bytes, "{report}");
    let table = status(&["--cost-per-gb", "0.02"]);
    assert!(table.contains("at $0.02/GB each way") && table.contains("default/far:bulk"), "{table}");
}

#[test]
fn a_socket_that_connects_elsewhere_after_a_refused_connect_counts_nothing_for_the_service() {
    require_root!();
    let fx = Fixture::new(2);
    let (agent, _servers) = start(&fx);
    let place = fx.place();
    // Refused through the Service, then connected on the same socket to b1's own address: the
    // socket keeps its entry in the connections table, but its peer is not that backend.
    let direct = SocketAddr::from((fx.backends[1].host.v4, topology_tests::fixture::BACKEND_PORT));
    let report = place.reconnect(REFUSED.parse().unwrap(), direct);
    assert_eq!(report.errors.get("ECONNREFUSED"), Some(&1), "{report:?}");
    assert_eq!(report.landed.values().sum::<u64>(), 1, "{report:?}");
    // A transfer through another Service after it, counted in the same reading or a later one.
    let upload = Transfer { send: MIB, receive: 0, hold: Duration::ZERO };
    let near = bulk::finish(bulk::spawn(&place, NEAR.parse().unwrap(), upload, 1), Duration::from_secs(60));
    let expected = BTreeMap::from([
        (key("near", "zone-a", "to_backend"), near.sent + 2),
        (key("near", "zone-a", "from_backend"), 1),
    ]);
    let counted = counted_within(&agent, &expected);
    assert_eq!(counted, expected, "nothing counted for default/refused");
}
