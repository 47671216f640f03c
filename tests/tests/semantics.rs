//! Service semantics the rewrite must keep (root, real kernel): `sessionAffinity: ClientIP`
//! inside the chosen set, and Services the agent does not handle passing untouched to kube-proxy.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use topology_dataplane::Dataplane;
use topology_kube::objects::{self, EndpointSpec};
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, PortOptions};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture, service},
    net::{ClientPlace, KubeProxyStandIn, Server, agent_binary},
    require_root,
    sandbox::run,
    traffic::Report,
};

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

/// The one backend every attempt of `report` landed on.
fn only_backend(report: &Report) -> String {
    assert_eq!(report.failures(), 0, "{report:?}");
    assert_eq!(report.landed.len(), 1, "one client, one backend: {report:?}");
    report.landed.keys().next().cloned().expect("a backend")
}

#[test]
fn client_ip_affinity_keeps_each_client_on_its_backend_until_it_leaves_the_set() {
    require_root!();
    let mut fx = Fixture::new(3);
    let second = fx.network.host("c");
    let elsewhere = ClientPlace { netns: second.netns.name().to_owned(), ..fx.place() };
    let port = service("10.96.0.40", 80, Protocol::Tcp);
    let affinity = PortOptions { affinity_timeout_s: Some(60), ..Default::default() };
    // Backend `i` gets weight `i + skew`: a new skew is a new set with the same members.
    let desired = |backends: &[usize], skew: u32| {
        let mut desired = DesiredState::default();
        let backends = backends.iter().map(|&i| fx.backends[i].weighted(false, i as u32 + skew)).collect();
        desired.services.insert(port, DesiredService { name: "test/sticky".into(), backends, options: affinity });
        desired
    };
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    assert!(dp.apply(&desired(&[0, 1, 2], 1)).failed.is_empty());

    let kept = only_backend(&fx.place().tcp(addr("10.96.0.40:80"), 200));
    let other = only_backend(&elsewhere.tcp(addr("10.96.0.40:80"), 200));
    assert_eq!(only_backend(&elsewhere.tcp(addr("10.96.0.40:80"), 50)), other, "the second client is stable too");

    // A new set with the same members (new weights) keeps every client where it was.
    assert_eq!(dp.apply(&desired(&[0, 1, 2], 5)).updated, 1);
    assert_eq!(only_backend(&fx.place().tcp(addr("10.96.0.40:80"), 50)), kept);

    // The kept backend leaves: the client moves once, and stays on its new backend.
    let remaining: Vec<usize> = (0..3).filter(|&i| fx.backends[i].name != kept).collect();
    assert!(dp.apply(&desired(&remaining, 1)).failed.is_empty());
    let moved = only_backend(&fx.place().tcp(addr("10.96.0.40:80"), 200));
    assert_ne!(moved, kept, "a backend that left is never kept");
    assert_eq!(only_backend(&fx.place().tcp(addr("10.96.0.40:80"), 100)), moved);

    // Without affinity the same client spreads over the set.
    let spread = desired(&[0, 1, 2], 1);
    let mut plain = spread.clone();
    plain.services.get_mut(&port).expect("port").options = PortOptions::default();
    assert!(dp.apply(&plain).failed.is_empty());
    let report = fx.place().tcp(addr("10.96.0.40:80"), 200);
    assert_eq!(report.landed.len(), 3, "no affinity, every backend: {report:?}");
}

#[test]
fn services_the_agent_does_not_handle_pass_untouched_to_kube_proxy() {
    require_root!();
    let mut fx = Fixture::new(2);
    let fallback_host = fx.network.host("f");
    let _fallback = Server::start(&fallback_host, "fallback", &[BACKEND_PORT]);
    let fallback = SocketAddr::new(IpAddr::V4(fallback_host.v4), BACKEND_PORT);
    let proxy = KubeProxyStandIn::new(fx.client.netns.name());
    for vip in ["10.96.0.50:80", "10.96.0.51:80", "10.96.0.52:80"] {
        proxy.forward("tcp", addr(vip), fallback);
    }
    let b0 = EndpointSpec::new(IpAddr::V4(fx.backends[0].host.v4), "node-a");
    let b1 = EndpointSpec::new(IpAddr::V4(fx.backends[1].host.v4), "node-a");
    // A headless Service: no ClusterIP to rewrite; its endpoints are dialled directly.
    let mut headless = objects::service("default", "headless", "10.96.0.99".parse().unwrap(), 80, "TCP", "http");
    headless["spec"]["clusterIP"] = "None".into();
    headless["spec"]["clusterIPs"] = serde_json::json!(["None"]);
    // An ExternalName Service is a DNS alias; an address written next to it is ignored.
    let mut external = objects::service("default", "external", "10.96.0.51".parse().unwrap(), 80, "TCP", "http");
    external["spec"]["type"] = "ExternalName".into();
    external["spec"]["externalName"] = "example.com".into();
    // Two ClusterIP Services where the maps hold one: the second is not programmed.
    let first = objects::service("default", "first", "10.96.0.50".parse().unwrap(), 80, "TCP", "http");
    let overflow = objects::service("default", "overflow", "10.96.0.52".parse().unwrap(), 80, "TCP", "http");
    let file = fx.scratch().join("cluster.yaml");
    let slices = ["headless", "external", "first", "overflow"]
        .map(|name| objects::slice("default", name, name, "http", BACKEND_PORT, "TCP", &[b0.clone(), b1.clone()]));
    let mut objects = vec![objects::node("node-a", "zone-a", None, "4"), headless, external, first, overflow];
    objects.extend(slices);
    objects::write(&file, &objects);
    let agent = Agent::start(&AgentOptions {
        extra: vec!["--capacity".into(), "topo_svc4=1".into()],
        ..AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path())
    });
    let ready = loop {
        match agent.get("/readyz") {
            Ok((503, body)) if body.contains("failed to program") => break body,
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    assert!(ready.contains("1 service port failed to program (10.96.0.5"), "{ready}");
    assert!(ready.contains("map topo_svc4 is full"), "{ready}");
    let metrics = agent.get("/metrics").expect("metrics").1;
    assert!(metrics.contains("topology_agent_failed_service_ports 1"), "{metrics}");

    let programmed = if ready.contains("10.96.0.52") { "10.96.0.50:80" } else { "10.96.0.52:80" };
    let skipped = if programmed == "10.96.0.50:80" { "10.96.0.52:80" } else { "10.96.0.50:80" };
    let rewritten = fx.place().tcp(addr(programmed), 40);
    assert_eq!(rewritten.landed_on("b0") + rewritten.landed_on("b1"), 40, "{rewritten:?}");
    for (target, what) in [(skipped, "the port the maps could not take"), ("10.96.0.51:80", "ExternalName")] {
        let report = fx.place().tcp(addr(target), 20);
        assert_eq!(report.landed_on("fallback"), 20, "{what} goes to kube-proxy: {report:?}");
        assert_eq!(report.peer_mismatch, 0, "and getpeername shows what was dialled: {report:?}");
    }
    let direct = fx.place().tcp(fx.backends[0].socket(false), 20);
    assert_eq!((direct.landed_on("b0"), direct.peer_mismatch), (20, 0), "a headless endpoint: {direct:?}");
    let status = run(
        &agent_binary().to_string_lossy(),
        &["status", "--pin-path", &fx.pins.path().to_string_lossy(), "--output", "json"],
    );
    let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
    assert_eq!(status["services"].as_array().map(Vec::len), Some(1), "only one port programmed: {status}");
}
