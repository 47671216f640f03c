//! What one tenant, one restart or one full map can do to a node (root, real kernel, the agent's
//! binary): a tenant whose Service fills the slots array gives room back when another namespace's
//! endpoints move, and its own withdrawn port goes to kube-proxy, never to an old set.
//! `--test-threads=1`.
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
    net::{KubeProxyStandIn, Server},
    require_root,
};

const VICTIM: &str = "10.96.0.10:80";
const HOG: &str = "10.96.0.99:80";
/// Slots in the test's slots array: the victim's one and the hog's fifteen fill it.
const SLOTS: u32 = 16;

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("a socket address")
}

/// The victim Service on `victim_endpoint`, and another tenant's Service with fifteen endpoints.
fn cluster(victim_endpoint: IpAddr) -> Vec<serde_json::Value> {
    let hog_endpoints: Vec<EndpointSpec> =
        (1..=15).map(|last| EndpointSpec::new(IpAddr::from([10, 255, 0, last]), "node-a")).collect();
    vec![
        objects::node("node-a", "zone-a", None, "4"),
        objects::service("default", "web", addr(VICTIM).ip(), 80, "TCP", "http"),
        objects::slice(
            "default",
            "web-1",
            "web",
            "http",
            BACKEND_PORT,
            "TCP",
            &[EndpointSpec::new(victim_endpoint, "node-a")],
        ),
        objects::service("tenant", "hog", addr(HOG).ip(), 80, "TCP", "http"),
        objects::slice("tenant", "hog-1", "hog", "http", BACKEND_PORT, "TCP", &hog_endpoints),
    ]
}

#[test]
fn a_full_slots_array_is_shared_out_and_never_keeps_an_old_set() {
    require_root!();
    let mut fx = Fixture::new(2);
    let (old, moved) = (IpAddr::V4(fx.backends[0].host.v4), IpAddr::V4(fx.backends[1].host.v4));
    // kube-proxy's answer for both ClusterIPs: a server of its own, so a landing there says the
    // agent left the port alone.
    let fallback_host = fx.network.host("f");
    let _fallback = Server::start(&fallback_host, "fallback", &[BACKEND_PORT]);
    let proxy = KubeProxyStandIn::new(fx.client.netns.name());
    for vip in [VICTIM, HOG] {
        proxy.forward("tcp", addr(vip), SocketAddr::new(IpAddr::V4(fallback_host.v4), BACKEND_PORT));
    }
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &cluster(old));
    let mut agent = Agent::start(&AgentOptions {
        extra: vec!["--capacity".into(), format!("topo_slots={SLOTS}")],
        ..AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path())
    });
    agent.wait_ready(Duration::from_secs(20));
    assert_eq!(fx.place().tcp(addr(VICTIM), 20).landed_on("b0"), 20, "the agent routes the victim");

    // The victim's endpoint moves and its new set finds no free slot: the tenant, holding 15 of
    // 16 slots (over an equal share of 8), gives its set back, and the victim's is written.
    objects::write(&file, &cluster(moved));
    let started = Instant::now();
    loop {
        let batch = fx.place().tcp(addr(VICTIM), 10);
        assert_eq!(batch.failures(), 0, "{batch:?}");
        if batch.landed_on("b1") == 10 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the victim's new set was not programmed after the move: {batch:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = fx.place().tcp(addr(VICTIM), 50);
    assert_eq!(after.landed_on("b1"), 50, "the agent routes the moved victim, by its new set: {after:?}");
    // The tenant's port holds nothing: kube-proxy answers it (its old set would fail: those
    // endpoints do not exist).
    let hog = fx.place().tcp(addr(HOG), 20);
    assert_eq!(hog.landed_on("fallback"), 20, "the withdrawn port goes to kube-proxy: {hog:?}");

    // Not silent: readiness, the gauge and the failure counter say so.
    let (status, body) = agent.get("/readyz").expect("readyz");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains(&format!("{HOG}/TCP: map topo_slots is full and namespace tenant holds 15")), "{body}");
    let metrics = agent.get("/metrics").expect("metrics").1;
    assert!(metrics.contains("topology_agent_failed_service_ports 1"), "{metrics}");
    assert!(metrics.contains("topology_agent_apply_failures_total{reason=\"MapFull\"}"), "{metrics}");
    // The heartbeat goes on: every other port keeps its topology.
    assert!(metrics.contains("topology_agent_view_current 1"), "{metrics}");
}
