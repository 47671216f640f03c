//! Root test of real-time feedback end to end: backends with a real capacity limit, an agent whose
//! Service asks for `spillover: feedback`, clients that overload this node's zone and then calm
//! down. The kernel measures, the agent moves traffic out, and back. Run single-threaded
//! (`--test-threads=1`) with the other root tests.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    require_root,
    server::Capacity,
};

const VIP: &str = "10.96.0.60";

/// The feedback input the agent works with now, from `/debug/plan`.
fn input(agent: &Agent) -> serde_json::Value {
    let (status, body) = agent.get("/debug/plan").expect("/debug/plan");
    assert_eq!(status, 200, "{body}");
    let plan: serde_json::Value = serde_json::from_str(&body).expect("plan JSON");
    plan["services"][0]["feedback"]["input"].clone()
}

fn shift(agent: &Agent) -> f64 {
    input(agent)["shift"].as_f64().unwrap_or(0.0)
}

/// Polls until `done(shift)` or `within` passes; returns how long it took.
fn wait_for(agent: &Agent, within: Duration, what: &str, done: impl Fn(f64) -> bool) -> Duration {
    let started = Instant::now();
    loop {
        if done(shift(agent)) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "{what} within {within:?}: {}", input(agent));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn an_overloaded_zone_sheds_to_the_other_and_takes_its_traffic_back_once_calm() {
    require_root!();
    // Zone a: two backends of 2 workers × 40 ms (100 requests/s in all); zone b: two of 32.
    let slow = Some(Capacity { workers: 2, service: Duration::from_millis(40) });
    let fast = Some(Capacity { workers: 32, service: Duration::from_millis(40) });
    let fx = Fixture::with_capacities(&[slow, slow, fast, fast]);
    let zones = ["a", "a", "b", "b"];
    let nodes = vec![objects::node("node-a", "a", Some("r1"), "2"), objects::node("node-b", "b", Some("r1"), "2")];
    let endpoints: Vec<EndpointSpec> = fx
        .backends
        .iter()
        .zip(zones)
        .map(|(backend, zone)| EndpointSpec::new(backend.addr(false), &format!("node-{zone}")))
        .collect();
    let vip: IpAddr = VIP.parse().unwrap();
    let mut service = objects::service("default", "web", vip, 80, "TCP", "http");
    objects::annotate(&mut service, "topology-agent.io/spillover", "feedback");
    let slice = objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &endpoints);
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &[nodes, vec![service, slice]].concat());
    let mut agent = Agent::start(&AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()));
    agent.wait_ready(Duration::from_secs(10));
    let target = SocketAddr::new(vip, 80);
    let scratch = fx.scratch();

    // Calm: one client, a quarter of zone a's capacity. Everything stays in zone.
    let calm = fx.place().spawn_loop(target, &scratch, Duration::from_secs(90), false);
    std::thread::sleep(Duration::from_secs(4));
    assert_eq!(shift(&agent), 0.0, "{}", input(&agent));
    assert!(input(&agent)["measured"]["baselineUs"].as_f64().is_some(), "{}", input(&agent));

    // Surge: twelve clients wait on zone a's four workers; the agent moves traffic out.
    let surge: Vec<_> =
        (0..12).map(|_| fx.place().spawn_loop(target, &scratch, Duration::from_secs(60), false)).collect();
    let shed_after = wait_for(&agent, Duration::from_secs(15), "traffic moves out", |s| s > 0.0);
    std::thread::sleep(Duration::from_secs(4));
    let moved = shift(&agent);
    assert!(moved > 0.0 && moved <= 0.9, "{}", input(&agent));
    let mut surged = topology_tests::traffic::Report::default();
    for client in surge {
        surged.merge(&client.finish());
    }
    assert_eq!(surged.failures(), 0, "{surged:?}");
    let elsewhere = surged.landed_on("b2") + surged.landed_on("b3");
    assert!(elsewhere > 0, "zone b served some of the surge: {surged:?}");
    let (_, metrics) = agent.get("/metrics").expect("metrics");
    assert!(metrics.contains("topology_agent_feedback_shift_ratio{service=\"default/web\",port=\"80\""), "{metrics}");
    assert!(metrics.contains("topology_agent_backend_connections_in_flight{backend="), "{metrics}");

    // Calm again: the traffic comes back home.
    let back_after = wait_for(&agent, Duration::from_secs(20), "traffic comes back", |s| s == 0.0);
    let calm = calm.finish();
    assert_eq!(calm.failures(), 0, "{calm:?}");
    eprintln!(
        "feedback: moved out after {shed_after:?} ({:.0}% at the peak), back {back_after:?} after the surge; surge \
         {} connections, {elsewhere} served by zone b",
        moved * 100.0,
        surged.successes()
    );
}
