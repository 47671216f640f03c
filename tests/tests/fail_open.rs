//! Fail open and uninstall (root, real kernel): once the agent is gone for `--fail-open-after`,
//! connections go to the ClusterIP untouched, where kube-proxy answers; a restarted agent takes
//! over again; `topology-agent cleanup` leaves nothing behind. `--test-threads=1`.
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
    net::{KubeProxyStandIn, Server, agent_binary},
    require_root,
    sandbox::run,
};

const VIP: &str = "10.96.0.10:80";

fn vip() -> SocketAddr {
    VIP.parse().expect("VIP")
}

fn start(fx: &Fixture, file: &std::path::Path) -> Agent {
    Agent::start(&AgentOptions {
        extra: vec!["--fail-open-after".into(), "2s".into()],
        ..AgentOptions::new(file, "node-a", fx.cgroup.path(), fx.pins.path())
    })
}

fn status(fx: &Fixture) -> serde_json::Value {
    let pins = fx.pins.path().to_string_lossy().into_owned();
    let json = run(&agent_binary().to_string_lossy(), &["status", "--pin-path", &pins, "--output", "json"]);
    serde_json::from_str(&json).expect("status JSON")
}

#[test]
fn a_dead_agent_fails_open_to_kube_proxy_and_a_restarted_one_takes_over() {
    require_root!();
    let mut fx = Fixture::new(1);
    let fallback_host = fx.network.host("f");
    let _fallback = Server::start(&fallback_host, "fallback", &[BACKEND_PORT]);
    let proxy = KubeProxyStandIn::new(fx.client.netns.name());
    proxy.forward("tcp", vip(), SocketAddr::new(IpAddr::V4(fallback_host.v4), BACKEND_PORT));

    let file = fx.scratch().join("cluster.yaml");
    let b0 = EndpointSpec::new(IpAddr::V4(fx.backends[0].host.v4), "node-a");
    objects::write(
        &file,
        &[
            objects::node("node-a", "zone-a", None, "4"),
            objects::service("default", "web", vip().ip(), vip().port(), "TCP", "http"),
            objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &[b0]),
        ],
    );
    let mut agent = start(&fx, &file);
    agent.wait_ready(Duration::from_secs(20));
    assert_eq!(fx.place().tcp(vip(), 20).landed_on("b0"), 20, "the agent rewrites");

    let scratch = fx.scratch();
    let looping = fx.place().spawn_loop(vip(), &scratch, Duration::from_secs(60), false);
    agent.signal(libc::SIGKILL);
    agent.wait_exit(Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(3));
    let failed_open = fx.place().tcp(vip(), 50);
    assert_eq!(failed_open.landed_on("fallback"), 50, "3 s after SIGKILL, kube-proxy answers: {failed_open:?}");
    let held = status(&fx);
    assert_eq!(held["heartbeat"]["remainingNs"], 0, "{held}");
    assert!(held["node"]["failOpen"].as_u64().unwrap_or(0) >= 50, "counted: {held}");

    let restarted = Instant::now();
    let mut agent = start(&fx, &file);
    let resumed = loop {
        let batch = fx.place().tcp(vip(), 5);
        if batch.landed_on("b0") == 5 {
            break restarted.elapsed();
        }
        assert!(restarted.elapsed() < Duration::from_secs(10), "rewriting never resumed: {batch:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    // How soon is a figure (printed below), not a timed assertion: a loaded CI machine verifies
    // the programs more slowly. The property is that rewriting resumes and nothing fails.
    let report = looping.finish();
    assert_eq!(report.failures(), 0, "no connection failed through the hand-overs: {report:?}");
    assert!(report.landed_on("fallback") > 0 && report.landed_on("b0") > 0, "{report:?}");
    agent.wait_ready(Duration::from_secs(10));
    let metrics = agent.get("/metrics").expect("metrics").1;
    assert!(metrics.contains("topology_agent_kernel_failing_open 0"), "{metrics}");
    let fail_open = metrics.lines().find_map(|l| l.strip_prefix("topology_agent_kernel_fail_open_total "));
    assert!(fail_open.and_then(|v| v.parse::<u64>().ok()).is_some_and(|v| v >= 50), "{metrics}");
    eprintln!("rewriting resumed {resumed:?} after the restart; loop: {report:?}");

    // Uninstall: the agent stops, the cleanup command removes links, pins and maps.
    agent.signal(libc::SIGTERM);
    agent.wait_exit(Duration::from_secs(10));
    let pins = fx.pins.path().to_string_lossy().into_owned();
    let out = run(&agent_binary().to_string_lossy(), &["cleanup", "--pin-path", &pins]);
    // The eight socket-address programs, the three outlier ejection programs and the accounting
    // program: no port is measured, so the load signal is not attached.
    assert!(out.starts_with("detached 12 programs, removed "), "{out}");
    assert!(!fx.pins.path().exists(), "no pin is left");
    let attached = run("bpftool", &["cgroup", "show", &fx.cgroup.path().to_string_lossy()]);
    assert!(attached.trim().is_empty(), "nothing stays attached: {attached}");
    let after = fx.place().tcp(vip(), 20);
    assert_eq!(after.landed_on("fallback"), 20, "connections are untouched after the uninstall: {after:?}");
    let again = run(&agent_binary().to_string_lossy(), &["cleanup", "--pin-path", &pins]);
    assert!(again.starts_with("detached 0 programs, removed 0 map pins"), "idempotent: {again}");
}
