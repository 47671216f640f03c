//! Cross-zone accounting of UDP through the real kernel (root, `--byte-accounting all`): the
//! datagrams of connected and unconnected sockets through a Service, counted per Service port,
//! this node's zone and the backend's, against what the clients moved and what the client's
//! interface carried. Datagrams a socket sends to a backend directly, and answers it only peeks
//! at, count nothing. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    collections::BTreeMap,
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    accounting::{self, Key},
    agent::{Agent, AgentOptions},
    datagrams::{self, DatagramServer, Exchange},
    fixture::Fixture,
    kernel, require_root,
};

/// The datagram servers' port behind both Services, and one no Service has.
const PORT: u16 = 9000;
const DIRECT_PORT: u16 = 9001;
/// `near` (b0, on node-a in zone-a, this node) and `far` (b1, on node-b in zone-b).
const NEAR: &str = "10.96.0.73:9000";
const FAR: &str = "10.96.0.74:9000";
const KIB: usize = 1024;

/// An agent counting UDP on node-a, for `fx`'s two backends behind the two Services, with a
/// datagram server on each.
fn start(fx: &Fixture) -> (Agent, Vec<DatagramServer>) {
    let file = fx.scratch().join("cluster.yaml");
    let mut objects = vec![objects::node("node-a", "zone-a", None, "4"), objects::node("node-b", "zone-b", None, "4")];
    for (name, vip, backend, node) in [("near", NEAR, 0, "node-a"), ("far", FAR, 1, "node-b")] {
        let vip: SocketAddr = vip.parse().unwrap();
        let endpoints = [EndpointSpec::new(IpAddr::V4(fx.backends[backend].host.v4), node)];
        objects.push(objects::service("default", name, vip.ip(), vip.port(), "UDP", "dgram"));
        objects.push(objects::slice("default", &format!("{name}-1"), name, "dgram", PORT, "UDP", &endpoints));
    }
    objects::write(&file, &objects);
    let servers = fx.backends.iter().map(|b| DatagramServer::start(&b.host, &[PORT, DIRECT_PORT])).collect();
    let mut options = AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path());
    options.extra = vec!["--byte-accounting".into(), "all".into()];
    let mut agent = Agent::start(&options);
    agent.wait_ready(Duration::from_secs(20));
    (agent, servers)
}

/// Whether this kernel can count UDP: the agent's word for it must agree with the release (the
/// `udp_*` tracepoints have a socket argument from Linux 6.3). Below, the test ends there.
fn udp_accounting(agent: &Agent) -> bool {
    let release = kernel::release();
    let on = agent.kernel_feature("udp_accounting");
    assert_eq!(on, release.at_least(6, 3), "the agent's topology_agent_kernel_feature on {}", release.text);
    if !on {
        println!(
            "SKIPPED: {} has no udp_* tracepoint with a socket argument (Linux 6.3); the agent runs without UDP \
             accounting and says so",
            release.text
        );
    }
    on
}

fn key(service: &str, zone: &str, direction: &str) -> Key {
    accounting::key(&format!("default/{service}:dgram"), zone, direction)
}

/// Waits until the counts reach `expected`; the last counts.
fn counted_within(agent: &Agent, expected: &BTreeMap<Key, u64>) -> BTreeMap<Key, u64> {
    accounting::counted_within(agent, "zone-a", None, expected)
}

#[test]
fn the_datagrams_counted_are_the_datagrams_moved_per_service_and_zone() {
    require_root!();
    let fx = Fixture::new(2);
    let (agent, _servers) = start(&fx);
    if !udp_accounting(&agent) {
        return;
    }
    let place = fx.place();
    let direct = SocketAddr::from((fx.backends[1].host.v4, DIRECT_PORT));
    let before = accounting::interface_tx(fx.client.netns.name());
    // Bulk, connected: 1 GiB up to the far Service in 32 KiB datagrams, 64 bytes back for each.
    let bulk = Exchange { count: 32 * KIB as u64, size: 32 * KIB, reply: 64, connected: true, peek: false };
    let far = datagrams::finish(datagrams::spawn(&place, &[FAR.parse().unwrap()], bulk), Duration::from_secs(120));
    // A resolver's socket, unconnected: 1 MiB to each of both Services and to a backend directly
    // in 512-byte queries, 1 KiB answers each peeked at, then received.
    let queries = Exchange { count: 2 * KIB as u64, size: 512, reply: 1024, connected: false, peek: true };
    let targets = [NEAR.parse().unwrap(), FAR.parse().unwrap(), direct];
    let mixed = datagrams::finish(datagrams::spawn(&place, &targets, queries), Duration::from_secs(60));
    let (after, packets) = accounting::interface_tx(fx.client.netns.name());
    let (after, packets) = (after - before.0, packets - before.1);
    assert!(far.iter().chain(&mixed).all(|m| m.lost == 0), "{far:?} {mixed:?}");
    assert_eq!(far[0].sent, 1 << 30);
    assert!(mixed.iter().all(|m| m.sent == 1 << 20 && m.received == 2 << 20), "{mixed:?}");

    let expected = BTreeMap::from([
        (key("near", "zone-a", "to_backend"), mixed[0].sent),
        (key("near", "zone-a", "from_backend"), mixed[0].received),
        (key("far", "zone-b", "to_backend"), far[0].sent + mixed[1].sent),
        (key("far", "zone-b", "from_backend"), far[0].received + mixed[1].received),
    ]);
    let counted = counted_within(&agent, &expected);
    assert_eq!(counted, expected, "counted (left) against moved (right): nothing of the direct datagrams or peeks");
    // What the interface carried: every payload, each datagram's UDP header, and each packet's
    // Ethernet and IPv4 headers (fragments included). The direct datagrams are not counted.
    let datagrams: u64 = far[0].sent / (32 * KIB) as u64 + mixed.iter().map(|m| m.sent / 512).sum::<u64>();
    let payload = after.saturating_sub(packets * (14 + 20) + datagrams * 8);
    let counted_up: u64 = counted.iter().filter(|((_, _, d), _)| d == "to_backend").map(|(_, v)| v).sum();
    let through_services = payload.saturating_sub(mixed[2].sent);
    let error = through_services.abs_diff(counted_up) as f64 / through_services as f64;
    assert!(
        error <= 0.02,
        "the interface carried {through_services} payload bytes through the Services, the counts say {counted_up} \
         ({:.3} %)",
        error * 100.0
    );
}

#[test]
fn the_udp_programs_come_and_go_with_the_flag_across_restarts() {
    require_root!();
    let fx = Fixture::new(2);
    let links = fx.pins.path().join("links");
    let udp_links =
        || topology_common::program_names::UDP_ACCOUNTING.iter().filter(|(name, _)| links.join(name).exists()).count();
    let (mut agent, servers) = start(&fx);
    if !udp_accounting(&agent) {
        assert_eq!(udp_links(), 0, "a kernel without the tracepoints has no UDP program attached");
        return;
    }
    assert_eq!(udp_links(), 2, "`all` attaches both UDP programs");
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_exit(Duration::from_secs(10)).success());
    drop(servers);
    // The same flags again: a restart keeps them, and datagrams are still counted.
    let (agent, _servers) = start(&fx);
    assert_eq!(udp_links(), 2);
    let one = Exchange { count: 10, size: 100, reply: 10, connected: false, peek: false };
    let moved = datagrams::finish(datagrams::spawn(&fx.place(), &[FAR.parse().unwrap()], one), Duration::from_secs(30));
    let expected = BTreeMap::from([
        (key("far", "zone-b", "to_backend"), moved[0].sent),
        (key("far", "zone-b", "from_backend"), moved[0].received),
    ]);
    assert_eq!(counted_within(&agent, &expected), expected);
    drop(agent);
    // The default (`tcp`) detaches them.
    let file = fx.scratch().join("cluster.yaml");
    let mut agent = Agent::start(&AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()));
    agent.wait_ready(Duration::from_secs(20));
    assert_eq!(udp_links(), 0, "`tcp` leaves no UDP program attached");
    assert!(links.join(topology_common::program_names::TCP_CLOSED).exists());
}
