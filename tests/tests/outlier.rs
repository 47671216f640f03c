//! Passive outlier ejection through the real kernel (root, the agent's default): a backend whose
//! handshakes from this node fail five times in a row — refused, unanswered, or answered by an
//! ICMP error — is avoided by this node's connect hooks for 10 s, then tried again, and ejected
//! for twice as long when it fails again; a set more than half ejected is used whole; a Service
//! may turn it off; a socket connected elsewhere charges its failures to no backend.
//! `--test-threads=1`.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use topology_tests::{
    agent::{Agent, AgentOptions},
    cluster::{self, EndpointSpec},
    fixture::{BACKEND_PORT, Fixture},
    require_root,
};

const VIP: &str = "10.96.0.90:80";

fn write(fx: &Fixture, file: &Path, ejection: Option<&str>) {
    let vip: SocketAddr = VIP.parse().expect("VIP");
    let endpoints: Vec<EndpointSpec> =
        fx.backends.iter().map(|b| EndpointSpec::new(IpAddr::V4(b.host.v4), "node-a")).collect();
    let mut service = cluster::service("default", "web", vip.ip(), vip.port(), "TCP", "http");
    if let Some(value) = ejection {
        cluster::annotate(&mut service, "topology-agent.io/outlier-ejection", value);
    }
    let slice = cluster::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &endpoints);
    cluster::write(file, &[cluster::node("node-a", "zone-a", None, "4"), service, slice]);
}

/// An agent (with ejection, the default) for `fx`'s backends behind [`VIP`].
fn start(fx: &Fixture, ejection: Option<&str>) -> Agent {
    let file = fx.scratch().join("cluster.yaml");
    write(fx, &file, ejection);
    let options = AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path());
    let mut agent = Agent::start(&options);
    agent.wait_ready(Duration::from_secs(20));
    agent
}

/// Runs `rule` (iptables arguments after `-A INPUT -p tcp --dport <backend port>`) in `backend`'s
/// namespace.
fn filter(backend: &topology_tests::fixture::Backend, rule: &[&str]) {
    let port = BACKEND_PORT.to_string();
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", backend.host.netns.name(), "iptables", "-A", "INPUT", "-p", "tcp", "--dport", &port])
        .args(rule)
        .output()
        .expect("run iptables");
    assert!(output.status.success(), "iptables: {}", String::from_utf8_lossy(&output.stderr));
}

/// SYNs the client's namespace retransmitted so far (`TcpExt: TCPSynRetrans`).
fn syn_retransmits(fx: &Fixture) -> u64 {
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", fx.client.netns.name(), "cat", "/proc/net/netstat"])
        .output()
        .expect("read the client's netstat");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut tcp_ext = text.lines().filter(|line| line.starts_with("TcpExt:"));
    let (names, values) = (tcp_ext.next().unwrap_or_default(), tcp_ext.next().unwrap_or_default());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(name, _)| *name == "TCPSynRetrans")
        .and_then(|(_, value)| value.parse().ok())
        .expect("TcpExt TCPSynRetrans")
}

/// `topology-agent status` of `fx`'s dataplane.
fn status(fx: &Fixture) -> String {
    let status = std::process::Command::new(topology_tests::net::agent_binary())
        .args(["status", "--pin-path"])
        .arg(fx.pins.path())
        .output()
        .expect("status");
    String::from_utf8_lossy(&status.stdout).into_owned()
}

fn ejected_gauge(agent: &Agent) -> String {
    let metrics = agent.get("/metrics").expect("metrics").1;
    metrics.lines().find(|l| l.starts_with("topology_agent_backends_ejected ")).unwrap_or_default().to_owned()
}

#[test]
fn a_refusing_backend_is_ejected_after_five_failures_tried_again_and_ejected_longer() {
    require_root!();
    let mut fx = Fixture::new(2);
    let agent = start(&fx, None);
    let vip: SocketAddr = VIP.parse().unwrap();
    // Both serve: nothing fails, both are used.
    let calm = fx.place().tcp(vip, 100);
    assert!(calm.errors.is_empty() && calm.landed.len() == 2, "{calm:?}");

    // b0's process exits: its handshakes are refused. Five in a row eject it; after that every
    // connection goes to b1.
    fx.backends[0].stop();
    let outage = fx.place().tcp(vip, 300);
    assert_eq!(outage.errors.get("ECONNREFUSED").copied(), Some(5), "{outage:?}");
    assert_eq!(outage.landed.get("b1").copied(), Some(295), "{outage:?}");
    let ejected = fx.place().tcp(vip, 200);
    assert_eq!((ejected.errors.len(), ejected.landed.get("b1").copied()), (0, Some(200)), "{ejected:?}");
    // What the kernel holds, as /metrics and `status` say it.
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 1");
    let status = status(&fx);
    let b0 = format!("ejected {}:{BACKEND_PORT} for", fx.backends[0].host.v4);
    assert!(status.contains(&b0) && status.contains("(ejection 1)"), "{status}");

    // 10 s later it is tried again, fails five times more and is ejected again, for 20 s.
    std::thread::sleep(Duration::from_millis(10_500));
    let retried = fx.place().tcp(vip, 300);
    assert_eq!(retried.errors.get("ECONNREFUSED").copied(), Some(5), "{retried:?}");
    std::thread::sleep(Duration::from_millis(10_500));
    let still = fx.place().tcp(vip, 200);
    assert!(still.errors.is_empty(), "the second ejection lasts 20 s: {still:?}");
}

#[test]
fn unanswered_and_unreachable_handshakes_eject_too() {
    require_root!();
    let fx = Fixture::new(4);
    let agent = start(&fx, None);
    // b0 drops every SYN (a node gone: the first retransmission, after 1 s, is the failure); b1
    // answers with an ICMP host unreachable. Half the set: both are avoided.
    filter(&fx.backends[0], &["-j", "DROP"]);
    filter(&fx.backends[1], &["-j", "REJECT", "--reject-with", "icmp-host-unreachable"]);
    let retransmitted = syn_retransmits(&fx);
    let outage = fx.place().tcp(VIP.parse().unwrap(), 200);
    // A timeout counts only if its SYN was retransmitted before the client gave up (1 s of 2):
    // when this fails, the kernel's count and the agent's view tell a late timer from a miss.
    let retransmitted = syn_retransmits(&fx) - retransmitted;
    assert_eq!(
        outage.errors.get("timeout").copied(),
        Some(5),
        "{outage:?}; SYNs retransmitted: {retransmitted}; status:\n{}",
        status(&fx)
    );
    assert_eq!(outage.errors.get("EHOSTUNREACH").copied(), Some(5), "{outage:?}");
    let live = outage.landed.get("b2").copied().unwrap_or(0) + outage.landed.get("b3").copied().unwrap_or(0);
    assert_eq!(live, 190, "{outage:?}");
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 2");
}

#[test]
fn a_set_more_than_half_ejected_is_used_whole() {
    require_root!();
    let mut fx = Fixture::new(4);
    let agent = start(&fx, None);
    let vip: SocketAddr = VIP.parse().unwrap();
    // Two of four refuse: ejected, half the set, avoided.
    fx.backends[0].stop();
    fx.backends[1].stop();
    let half = fx.place().tcp(vip, 200);
    assert_eq!(half.errors.get("ECONNREFUSED").copied(), Some(10), "{half:?}");
    // A third: once it is ejected too, more than half the set is, and the whole set is used
    // again (the panic threshold): about three connections in four fail.
    fx.backends[2].stop();
    let _ = fx.place().tcp(vip, 100);
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 3");
    let whole = fx.place().tcp(vip, 200);
    let (refused, live) = (whole.errors.get("ECONNREFUSED").copied().unwrap_or(0), whole.landed.get("b3").copied());
    assert!(refused > 100 && live.is_some_and(|n| (20..100).contains(&n)), "{whole:?}");
}

#[test]
fn a_service_may_tune_the_failures_that_eject_and_the_ejection_time() {
    require_root!();
    let mut fx = Fixture::new(2);
    let _agent = start(&fx, Some("failures=2, base=2s"));
    let vip: SocketAddr = VIP.parse().unwrap();
    fx.backends[0].stop();
    let outage = fx.place().tcp(vip, 100);
    assert_eq!(outage.errors.get("ECONNREFUSED").copied(), Some(2), "{outage:?}");
    // Tried again after 2 s: two more failures, then 4 s.
    std::thread::sleep(Duration::from_millis(2_300));
    let retried = fx.place().tcp(vip, 100);
    assert_eq!(retried.errors.get("ECONNREFUSED").copied(), Some(2), "{retried:?}");
    std::thread::sleep(Duration::from_millis(2_300));
    let still = fx.place().tcp(vip, 100);
    assert!(still.errors.is_empty(), "the second ejection lasts 4 s: {still:?}");
}

#[test]
fn a_service_may_turn_ejection_off() {
    require_root!();
    let mut fx = Fixture::new(2);
    let _agent = start(&fx, Some("off"));
    fx.backends[0].stop();
    let outage = fx.place().tcp(VIP.parse().unwrap(), 300);
    let refused = outage.errors.get("ECONNREFUSED").copied().unwrap_or(0);
    assert!(refused > 100, "without ejection about half keep failing: {outage:?}");
}

#[test]
fn a_socket_reconnected_elsewhere_charges_its_failures_to_no_backend() {
    require_root!();
    let fx = Fixture::new(2);
    let agent = start(&fx, None);
    let vip: SocketAddr = VIP.parse().unwrap();
    // One socket, twelve times: through the Service to a healthy backend, the connection
    // dissolved (`connect(AF_UNSPEC)`), then a refused connect to a closed port of the client's
    // own namespace. The socket keeps its cookie and its entry in the connections table: the
    // refusals were once charged to the backend the entry names, ejecting a healthy pod for every
    // client of the node.
    let closed: SocketAddr = (fx.client.v4, 1).into();
    let attack = fx.place().reconnect_elsewhere(vip, closed, 12);
    assert_eq!(attack.successes(), 12, "{attack:?}");
    assert_eq!(attack.errors.get("ECONNREFUSED").copied(), Some(12), "{attack:?}");
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 0");
    let status = status(&fx);
    for backend in &fx.backends {
        assert!(!status.contains(&format!("ejected {}:{BACKEND_PORT}", backend.host.v4)), "{status}");
    }
    // Every other connection still reaches both backends.
    let victim = fx.place().tcp(vip, 200);
    assert!(victim.errors.is_empty() && victim.landed.len() == 2, "{victim:?}");
}
