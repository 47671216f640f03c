//! Sockets to backends that are gone (root, real kernel): a connected UDP socket whose backend
//! leaves the service's set is destroyed, the application sees an error, reconnects and lands
//! on a live backend; with `--terminate-sockets all`, so is a TCP connection, and only one whose
//! backend left. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use serde_json::json;
use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    require_root,
};

const VIP: &str = "10.96.0.70:53";
const TCP_VIP: &str = "10.96.0.71:80";

fn write(fx: &Fixture, file: &Path, backends: &[usize]) {
    write_port(fx, file, backends, VIP, &["UDP"]);
}

/// The service at `vip` with one port per protocol of `protocols`, over `backends`.
fn write_port(fx: &Fixture, file: &Path, backends: &[usize], vip: &str, protocols: &[&str]) {
    let vip: SocketAddr = vip.parse().expect("VIP");
    let endpoints: Vec<EndpointSpec> =
        backends.iter().map(|&i| EndpointSpec::new(IpAddr::V4(fx.backends[i].host.v4), "node-a")).collect();
    let mut service = objects::service("default", "dns", vip.ip(), vip.port(), protocols[0], "dns");
    let mut slice = objects::slice("default", "dns-1", "dns", "dns", BACKEND_PORT, protocols[0], &endpoints);
    let port = |name: &str, port: u16, protocol: &str| json!({"name": name, "port": port, "protocol": protocol});
    service["spec"]["ports"] =
        protocols.iter().map(|p| port(&p.to_lowercase(), vip.port(), p)).collect::<Vec<_>>().into();
    slice["ports"] = protocols.iter().map(|p| port(&p.to_lowercase(), BACKEND_PORT, p)).collect::<Vec<_>>().into();
    objects::write(file, &[objects::node("node-a", "zone-a", None, "4"), service, slice]);
}

#[test]
fn a_connected_udp_socket_to_a_removed_backend_is_destroyed_and_reconnects_to_a_live_one() {
    require_root!();
    let fx = Fixture::new(2);
    let file = fx.scratch().join("cluster.yaml");
    write(&fx, &file, &[0, 1]);
    let mut agent = Agent::start(&AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()));
    agent.wait_ready(Duration::from_secs(20));

    let scratch = fx.scratch();
    let stream =
        fx.place().udp_stream(VIP.parse().unwrap(), &scratch, Duration::from_secs(30), Duration::from_millis(10));
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    // Remove b0: a socket on b0 must end and come back on b1; one on b1 goes on. Then b0 returns
    // and b1 leaves: by then the socket is on b1 either way, and must end and come back on b0.
    write(&fx, &file, &[1]);
    let removed_b0 = started.elapsed().as_millis() as u64;
    std::thread::sleep(Duration::from_millis(1500));
    write(&fx, &file, &[0]);
    let removed_b1 = started.elapsed().as_millis() as u64;
    std::thread::sleep(Duration::from_millis(1500));
    let seen = stream.finish();
    eprintln!(
        "removed b0 at {removed_b0} ms, b1 at {removed_b1} ms; stream: switches {:?}, errors {:?}",
        seen.switches, seen.errors_at
    );

    // Every removal of the backend the socket was on ends it within a second, and the new
    // socket lands on the backend still in the set.
    let on_at = |ms: u64| seen.switches.iter().rev().find(|(at, _)| *at <= ms).map(|(_, name)| name.clone());
    for (removed, gone, live) in [(removed_b0, "b0", "b1"), (removed_b1, "b1", "b0")] {
        if on_at(removed).as_deref() != Some(gone) {
            continue;
        }
        let error = seen
            .errors_at
            .iter()
            .find(|(at, _)| *at >= removed)
            .unwrap_or_else(|| panic!("no error after {gone} left: {seen:?}"));
        assert!(
            error.0 - removed <= 1000,
            "the application saw an error {} ms after {gone} left: {seen:?}",
            error.0 - removed
        );
        let next =
            seen.switches.iter().find(|(at, _)| *at >= error.0).unwrap_or_else(|| panic!("no reconnect: {seen:?}"));
        assert_eq!(next.1, live, "the reconnect lands on the live backend: {seen:?}");
    }
    assert!(seen.errors_at.len() <= 2, "one error per removal at most: {seen:?}");
    assert!(!seen.errors_at.is_empty(), "the stream was on one of the removed backends: {seen:?}");
    let metrics = agent.get("/metrics").expect("metrics").1;
    assert!(
        metrics.lines().any(|l| l.starts_with("topology_agent_sockets_terminated_total{protocol=\"UDP\"} ")),
        "{metrics}"
    );
}

#[test]
fn with_all_a_tcp_connection_ends_when_its_backend_leaves_and_only_then() {
    require_root!();
    let fx = Fixture::new(2);
    let file = fx.scratch().join("cluster.yaml");
    let vip: SocketAddr = TCP_VIP.parse().expect("VIP");
    write_port(&fx, &file, &[0], TCP_VIP, &["TCP", "UDP"]);
    let mut options = AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path());
    options.extra = vec!["--terminate-sockets".into(), "all".into()];
    let mut agent = Agent::start(&options);
    agent.wait_ready(Duration::from_secs(20));
    let terminated = |agent: &mut Agent| {
        let metrics = agent.get("/metrics").expect("metrics").1;
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("topology_agent_sockets_terminated_total{protocol=\"TCP\"} "))
            .map_or(0.0, |v| v.trim().parse::<f64>().expect("a number"))
    };

    // (The holder also holds UDP sockets to the same port, which UDP termination ends as well:
    // the TCP count alone is checked.) A connection on b0 (the only backend); b0 leaves for b1: it is ended (the translation of an
    // unmeasured connection is found by its cookie). One on b1 then stays through b0's return.
    let on_b0 = fx.place().hold(vip);
    write_port(&fx, &file, &[1], TCP_VIP, &["TCP", "UDP"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while terminated(&mut agent) < 1.0 {
        assert!(Instant::now() < deadline, "the connection to b0 was not ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(on_b0);
    let on_b1 = fx.place().hold(vip);
    write_port(&fx, &file, &[1, 0], TCP_VIP, &["TCP", "UDP"]);
    std::thread::sleep(Duration::from_millis(1500));
    let report = on_b1.check();
    assert_eq!((report.failures(), report.peer_mismatch), (0, 0), "the connection to b1 goes on: {report:?}");
    assert_eq!(terminated(&mut agent), 1.0, "only the connection whose backend left was ended");
}

/// A DaemonSet pod without `hostPID` or `hostNetwork` — here the agent in a PID namespace and a
/// network namespace of its own — sees itself as `/proc/1`, so the host's network namespace, where
/// host-network pods and the node's processes connect, is reachable only as the file
/// `--host-netns` names (the DaemonSet mounts the host's `/proc/1/ns/net` there). The client's
/// namespace plays the host's, found through no other path: its connected UDP socket is ended
/// when its backend leaves only when `--host-netns` names it.
#[test]
fn a_pod_without_the_hosts_pids_ends_host_sockets_through_host_netns() {
    require_root!();
    for reachable in [false, true] {
        let mut fx = Fixture::new(2);
        let pod = fx.network.host("agentpod");
        let file = fx.scratch().join("cluster.yaml");
        write(&fx, &file, &[0]);
        let no_pins = fx.scratch().join("no-netns-pins");
        std::fs::create_dir_all(&no_pins).expect("directory");
        let mut options = AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path());
        options.netns = Some(pod.netns.name());
        options.wrapper = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--"].map(String::from).into();
        options.extra = vec!["--netns-dir".into(), no_pins.display().to_string()];
        if reachable {
            let host = topology_tests::netns::path(fx.client.netns.name());
            options.extra.extend(["--host-netns".into(), host.display().to_string()]);
        }
        let mut agent = Agent::start(&options);
        agent.wait_ready(Duration::from_secs(20));
        let scratch = fx.scratch();
        let stream =
            fx.place().udp_stream(VIP.parse().unwrap(), &scratch, Duration::from_secs(4), Duration::from_millis(10));
        std::thread::sleep(Duration::from_millis(500));
        write(&fx, &file, &[1]);
        std::thread::sleep(Duration::from_millis(2500));
        let seen = stream.finish();
        eprintln!("--host-netns given: {reachable}; stream: switches {:?}, errors {:?}", seen.switches, seen.errors_at);
        assert_eq!(seen.switches.first().map(|(_, name)| name.as_str()), Some("b0"), "{seen:?}");
        if reachable {
            assert!(!seen.errors_at.is_empty(), "the socket on b0 was not ended: {seen:?}");
            assert_eq!(seen.switches.last().map(|(_, name)| name.as_str()), Some("b1"), "{seen:?}");
        } else {
            assert!(seen.errors_at.is_empty(), "without --host-netns the agent cannot reach it: {seen:?}");
        }
        drop(agent);
    }
}

/// The UDP Service at [`VIP`] with `PreferClose`, this node in zone-a: `near` endpoints on it,
/// `far` ones on a node of zone-b, the far ones serving but terminating when `terminating`.
fn write_zoned(fx: &Fixture, file: &Path, near: &[usize], far: &[usize], terminating: bool) {
    let vip: SocketAddr = VIP.parse().expect("VIP");
    let spec = |i: usize, node: &str, zone: &str| {
        let mut spec = EndpointSpec::new(IpAddr::V4(fx.backends[i].host.v4), node);
        spec.zone = Some(zone.into());
        spec
    };
    let endpoints: Vec<EndpointSpec> = far
        .iter()
        .map(|&i| spec(i, "node-b", "zone-b"))
        .chain(near.iter().map(|&i| spec(i, "node-a", "zone-a")))
        .collect();
    let mut service = objects::service("default", "dns", vip.ip(), vip.port(), "UDP", "dns");
    service["spec"]["trafficDistribution"] = "PreferClose".into();
    let mut slice = objects::slice("default", "dns-1", "dns", "dns", BACKEND_PORT, "UDP", &endpoints);
    if terminating {
        for n in 0..far.len() {
            slice["endpoints"][n]["conditions"] = json!({"ready": false, "serving": true, "terminating": true});
        }
    }
    let nodes = [objects::node("node-a", "zone-a", None, "4"), objects::node("node-b", "zone-b", None, "4")];
    objects::write(file, &[nodes[0].clone(), nodes[1].clone(), service, slice]);
}

/// A backend the topology stops choosing still serves its Service: a closer endpoint becoming
/// ready, or the backend terminating while it serves, must not end the sockets connected to it
/// (resets to healthy backends, cilium#48259; terminating pods cut before their grace period,
/// cilium#48348). Once it stops serving — gone from the slices, the set not changing then — they
/// are ended, and reconnect to the near one.
#[test]
fn only_a_backend_that_left_its_service_ends_its_sockets() {
    require_root!();
    let fx = Fixture::new(2);
    let file = fx.scratch().join("cluster.yaml");
    write_zoned(&fx, &file, &[], &[0], false);
    let mut agent = Agent::start(&AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()));
    agent.wait_ready(Duration::from_secs(20));
    let scratch = fx.scratch();
    let stream =
        fx.place().udp_stream(VIP.parse().unwrap(), &scratch, Duration::from_secs(8), Duration::from_millis(10));
    let started = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    // b1 ready on this node: PreferClose draws it alone; b0 still serves.
    write_zoned(&fx, &file, &[1], &[0], false);
    std::thread::sleep(Duration::from_millis(1500));
    // b0 terminating, still serving.
    write_zoned(&fx, &file, &[1], &[0], true);
    std::thread::sleep(Duration::from_millis(1500));
    let kept_until = started.elapsed().as_millis() as u64;
    // b0 gone from the slices.
    write_zoned(&fx, &file, &[1], &[], false);
    let removed = started.elapsed().as_millis() as u64;
    std::thread::sleep(Duration::from_millis(2000));
    let seen = stream.finish();
    eprintln!("b0 removed at {removed} ms; stream: switches {:?}, errors {:?}", seen.switches, seen.errors_at);
    let before_removal: Vec<_> = seen.errors_at.iter().filter(|(at, _)| *at < kept_until).collect();
    assert!(before_removal.is_empty(), "a socket to a serving backend was ended: {seen:?}");
    assert_eq!(seen.switches.first().map(|(_, name)| name.as_str()), Some("b0"), "{seen:?}");
    let error = seen.errors_at.iter().find(|(at, _)| *at >= removed).unwrap_or_else(|| panic!("not ended: {seen:?}"));
    assert!(error.0 - removed <= 1000, "ended {} ms after b0 left: {seen:?}", error.0 - removed);
    assert_eq!(seen.switches.last().map(|(_, name)| name.as_str()), Some("b1"), "{seen:?}");
}
