//! Passive outlier ejection through the real kernel (root, the agent's default): a backend whose
//! handshakes from this node's pods fail five times in a row — refused, unanswered, or answered by
//! an ICMP error — is avoided by this node's connect hooks for 10 s, then tried again, and
//! ejected for twice as long when it fails again. The evidence must come from two pods, from
//! sockets without a TTL of their own; a Service's ejections are its own; at most a tenth of a set is ejected; a Service may turn it
//! off, and so may the agent, ending ejections in force; a socket connected elsewhere charges its
//! failures to no backend. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::Duration,
};

use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    net::{ClientPlace, Host},
    require_root,
    traffic::Report,
};

const VIP: &str = "10.96.0.90:80";
/// The other tenant's Service, in its own namespace.
const TENANT_VIP: &str = "10.96.0.91:80";

/// The cluster: Service `default/web` over `fx`'s backends at [`VIP`] (with its ejection
/// annotation, if any), and each of `more`.
fn write(fx: &Fixture, file: &Path, ejection: Option<&str>, more: Vec<serde_json::Value>) {
    let vip: SocketAddr = VIP.parse().expect("VIP");
    let endpoints: Vec<EndpointSpec> =
        fx.backends.iter().map(|b| EndpointSpec::new(IpAddr::V4(b.host.v4), "node-a")).collect();
    let mut service = objects::service("default", "web", vip.ip(), vip.port(), "TCP", "http");
    if let Some(value) = ejection {
        objects::annotate(&mut service, "topology-agent.io/outlier-ejection", value);
    }
    let slice = objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &endpoints);
    let mut objects = vec![objects::node("node-a", "zone-a", None, "4"), service, slice];
    objects.extend(more);
    objects::write(file, &objects);
}

/// An agent (with ejection, the default) for `fx`'s backends behind [`VIP`].
fn start(fx: &Fixture, ejection: Option<&str>) -> Agent {
    start_with(fx, ejection, Vec::new(), &[])
}

/// An agent for `fx`'s backends behind [`VIP`], and `more` objects, with `args` added.
fn start_with(fx: &Fixture, ejection: Option<&str>, more: Vec<serde_json::Value>, args: &[&str]) -> Agent {
    let file = fx.scratch().join("cluster.yaml");
    write(fx, &file, ejection, more);
    let mut options = AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path());
    options.extra.extend(args.iter().map(|a| (*a).to_owned()));
    let mut agent = Agent::start(&options);
    agent.wait_ready(Duration::from_secs(20));
    agent
}

/// Two pods of the node: the fixture's client and another.
struct Pods {
    first: ClientPlace,
    second: ClientPlace,
    _second: Host,
}

impl Pods {
    fn new(fx: &mut Fixture) -> Self {
        let host = fx.network.host("c");
        Self { first: fx.place(), second: fx.place_in(&host), _second: host }
    }

    /// Connections to `target` from each pod in turn until one of its own fails: a run with a
    /// failure from each pod, whose failures from then on count to the threshold exactly.
    fn prime(&self, target: SocketAddr) -> Report {
        let mut report = Report::default();
        for place in [&self.first, &self.second] {
            for _ in 0..100 {
                let one = place.tcp(target, 1);
                report.merge(&one);
                if !one.errors.is_empty() {
                    break;
                }
            }
        }
        report
    }

    /// `count` TCP connections to `target`, half from each pod, at the same time.
    fn tcp(&self, target: SocketAddr, count: u64) -> Report {
        let (first, second) = (self.first.clone(), self.second.clone());
        let other = std::thread::spawn(move || second.tcp(target, count / 2));
        let mut report = first.tcp(target, count - count / 2);
        report.merge(&other.join().expect("the second pod's client"));
        report
    }
}

/// Runs `rule` (iptables arguments after `-A INPUT -p tcp --dport <backend port>`) in `backend`'s
/// namespace.
fn filter(backend: &topology_tests::fixture::Backend, rule: &[&str]) {
    iptables(backend.host.netns.name(), "INPUT", rule);
}

/// Appends `-A <chain> -p tcp --dport <backend port>` and `rule` in namespace `netns`.
fn iptables(netns: &str, chain: &str, rule: &[&str]) {
    let port = BACKEND_PORT.to_string();
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", netns, "iptables", "-A", chain, "-p", "tcp", "--dport", &port])
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
    let pods = Pods::new(&mut fx);
    let agent = start(&fx, None);
    let vip: SocketAddr = VIP.parse().unwrap();
    // Both serve: nothing fails, both are used.
    let calm = pods.tcp(vip, 100);
    assert!(calm.errors.is_empty() && calm.landed.len() == 2, "{calm:?}");

    // b0's process exits: its handshakes are refused. Five in a row, one from each pod at least,
    // eject it; after that every connection goes to b1.
    fx.backends[0].stop();
    let primed = pods.prime(vip);
    assert_eq!(primed.errors.get("ECONNREFUSED").copied(), Some(2), "{primed:?}");
    let outage = pods.first.tcp(vip, 300);
    assert_eq!(outage.errors.get("ECONNREFUSED").copied(), Some(3), "{outage:?}");
    assert_eq!(outage.landed.get("b1").copied(), Some(297), "{outage:?}");
    let ejected = pods.tcp(vip, 200);
    assert_eq!((ejected.errors.len(), ejected.landed.get("b1").copied()), (0, Some(200)), "{ejected:?}");
    // What the kernel holds, as /metrics and `status` say it.
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 1");
    let status = status(&fx);
    let b0 = format!("ejected {}:{BACKEND_PORT} for", fx.backends[0].host.v4);
    assert!(status.contains(&b0) && status.contains("(ejection 1) from 10.96.0.90:80/TCP"), "{status}");

    // 10 s later it is tried again, fails five times more and is ejected again, for 20 s.
    std::thread::sleep(Duration::from_millis(10_500));
    let primed = pods.prime(vip);
    let retried = pods.first.tcp(vip, 300);
    let refused = [&primed, &retried].map(|r| r.errors.get("ECONNREFUSED").copied().unwrap_or(0));
    assert_eq!(refused, [2, 3], "{primed:?} {retried:?}");
    std::thread::sleep(Duration::from_millis(10_500));
    let still = pods.tcp(vip, 200);
    assert!(still.errors.is_empty(), "the second ejection lasts 20 s: {still:?}");
}

#[test]
fn one_pods_failures_never_eject_and_a_second_pods_do() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    let agent = start(&fx, None);
    let vip: SocketAddr = VIP.parse().unwrap();
    fx.backends[0].stop();
    // One pod alone (its own policy, its own TTL, or a backend only it cannot reach look the
    // same): its failures never eject the backend for the node's other pods.
    let alone = pods.first.tcp(vip, 200);
    assert!(alone.errors.get("ECONNREFUSED").copied().unwrap_or(0) > 60, "{alone:?}");
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 0");
    // A second pod's first failure is the evidence: ejected at once.
    let second = pods.second.tcp(vip, 40);
    assert_eq!(second.errors.get("ECONNREFUSED").copied(), Some(1), "{second:?}");
    let after = pods.first.tcp(vip, 100);
    assert!(after.errors.is_empty(), "{after:?}");
}

#[test]
fn sockets_with_a_ttl_of_their_own_are_no_evidence() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    let agent = start(&fx, None);
    let vip: SocketAddr = VIP.parse().unwrap();
    fx.backends[0].stop();
    // Both pods' sockets set their own TTL (one too low for the path fails its own handshakes,
    // and the kernel cannot tell which): however many fail, nothing is ejected.
    for place in [&pods.first, &pods.second] {
        let own = place.tcp_with_ttl(vip, 100, 64);
        assert!(own.errors.get("ECONNREFUSED").copied().unwrap_or(0) > 25, "{own:?}");
    }
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 0");
    // The same failures from sockets with the node's TTL eject it.
    let _ = pods.tcp(vip, 100);
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 1");
}

#[test]
fn unanswered_handshakes_eject_too() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    let agent = start(&fx, None);
    // b0 drops every SYN (a node gone): the first retransmission, after 1 s, is the failure.
    filter(&fx.backends[0], &["-j", "DROP"]);
    let primed = pods.prime(VIP.parse().unwrap());
    assert_eq!(primed.errors.get("timeout").copied(), Some(2), "{primed:?}");
    // What the kernel counted of the two: when the run below does not eject, this tells a
    // failure never charged from a run restarted after it.
    let after_prime = status(&fx);
    let retransmitted = syn_retransmits(&fx);
    let outage = pods.first.tcp(VIP.parse().unwrap(), 100);
    // A timeout counts only if its SYN was retransmitted before the client gave up (1 s of 2):
    // when this fails, the kernel's count and the agent's view tell a late timer from a miss.
    let retransmitted = syn_retransmits(&fx) - retransmitted;
    assert_eq!(
        outage.errors.get("timeout").copied(),
        Some(3),
        "{outage:?}; SYNs retransmitted: {retransmitted}; status after the prime:\n{after_prime}\nnow:\n{}",
        status(&fx)
    );
    assert_eq!(outage.landed.get("b1").copied(), Some(97), "{outage:?}");
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 1");
}

#[test]
fn a_syn_the_clients_own_host_failed_to_send_is_no_evidence() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    let agent = start(&fx, None);
    // Both pods' own netfilter drops their SYNs: every retransmission fails in their own stack
    // (traced with its error from Linux 6.17, not traced before). The backends never saw them.
    for place in [&pods.first, &pods.second] {
        iptables(&place.netns, "OUTPUT", &["-j", "DROP"]);
    }
    let lost = pods.tcp(VIP.parse().unwrap(), 12);
    assert_eq!(lost.errors.get("timeout").copied(), Some(12), "{lost:?}");
    let metrics = agent.get("/metrics").expect("metrics").1;
    for gauge in ["topology_agent_backends_ejected 0", "topology_agent_backends_failing 0"] {
        assert!(metrics.lines().any(|line| line == gauge), "{gauge}; status:\n{}", status(&fx));
    }
}

#[test]
fn unreachable_handshakes_eject_too() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    let agent = start(&fx, None);
    // b0 answers with an ICMP host unreachable.
    filter(&fx.backends[0], &["-j", "REJECT", "--reject-with", "icmp-host-unreachable"]);
    let primed = pods.prime(VIP.parse().unwrap());
    assert_eq!(primed.errors.get("EHOSTUNREACH").copied(), Some(2), "{primed:?}");
    let outage = pods.first.tcp(VIP.parse().unwrap(), 200);
    assert_eq!(outage.errors.get("EHOSTUNREACH").copied(), Some(3), "{outage:?}");
    assert_eq!(outage.landed.get("b1").copied(), Some(197), "{outage:?}");
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 1");
}

#[test]
fn at_most_a_tenth_of_a_set_is_ejected() {
    require_root!();
    let mut fx = Fixture::new(10);
    let pods = Pods::new(&mut fx);
    let agent = start(&fx, None);
    let vip: SocketAddr = VIP.parse().unwrap();
    // Three of ten refuse. One may be ejected (a tenth): the other two keep their share, and
    // their clients see their failures, as without ejection.
    for backend in &mut fx.backends[..3] {
        backend.stop();
    }
    let _ = pods.tcp(vip, 300);
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 1");
    let capped = pods.tcp(vip, 400);
    let refused = capped.errors.get("ECONNREFUSED").copied().unwrap_or(0);
    assert!((40..=140).contains(&refused), "two of ten still refuse: {capped:?}");
    // The healthy seven share the rest.
    let healthy: Vec<u64> = (3..10).map(|i| capped.landed.get(&format!("b{i}")).copied().unwrap_or(0)).collect();
    assert!(healthy.iter().all(|&n| n >= 15), "{capped:?}");
    let status = status(&fx);
    assert_eq!(status.matches("ejected 10.").count(), 1, "{status}");
}

#[test]
fn a_services_ejections_are_its_own() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    // Another tenant's Service names the victim's pods as its endpoints, asks to eject at one
    // failure for 255 s, and its two pods refuse their own handshakes (their own netfilter
    // answers each SYN with a reset: seen on every kernel, where a SYN dropped in the pod is
    // retransmitted unseen before Linux 6.x's tracepoint reports failed retransmissions too).
    let tenant_vip: SocketAddr = TENANT_VIP.parse().unwrap();
    let mut evil = objects::service("tenant", "evil", tenant_vip.ip(), tenant_vip.port(), "TCP", "http");
    objects::annotate(&mut evil, "topology-agent.io/outlier-ejection", "failures=1,base=255s");
    let victims: Vec<EndpointSpec> =
        fx.backends.iter().map(|b| EndpointSpec::new(IpAddr::V4(b.host.v4), "node-a")).collect();
    let slice = objects::slice("tenant", "evil-1", "evil", "http", BACKEND_PORT, "TCP", &victims);
    let agent = start_with(&fx, None, vec![evil, slice], &[]);
    for place in [&pods.first, &pods.second] {
        iptables(&place.netns, "OUTPUT", &["-j", "REJECT", "--reject-with", "tcp-reset"]);
    }
    let attack = pods.tcp(tenant_vip, 12);
    assert_eq!(attack.errors.get("ECONNREFUSED").copied(), Some(12), "{attack:?}");
    // Ejected from the tenant's own Service, by its own settings...
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 1");
    let status = status(&fx);
    assert!(status.contains(&format!("from {TENANT_VIP}/TCP")), "{status}");
    // ...and from no other: the victim's Service still sends each pod its share.
    let other = fx.network.host("c");
    let used = fx.place_in(&other).tcp(VIP.parse().unwrap(), 200);
    let shares = (used.landed.get("b0").copied().unwrap_or(0), used.landed.get("b1").copied().unwrap_or(0));
    assert!(used.errors.is_empty() && shares.0 > 50 && shares.1 > 50, "{used:?}");
}

#[test]
fn a_service_may_tune_the_failures_that_eject_and_the_ejection_time() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    let _agent = start(&fx, Some("failures=2, base=2s"));
    let vip: SocketAddr = VIP.parse().unwrap();
    fx.backends[0].stop();
    // Two failures, one from each pod: ejected at the second.
    let primed = pods.prime(vip);
    assert_eq!(primed.errors.get("ECONNREFUSED").copied(), Some(2), "{primed:?}");
    let ejected = pods.tcp(vip, 100);
    assert!(ejected.errors.is_empty(), "{ejected:?}");
    // Tried again after 2 s: two more failures, then 4 s.
    std::thread::sleep(Duration::from_millis(2_300));
    let retried = pods.prime(vip);
    assert_eq!(retried.errors.get("ECONNREFUSED").copied(), Some(2), "{retried:?}");
    std::thread::sleep(Duration::from_millis(2_300));
    let still = pods.tcp(vip, 100);
    assert!(still.errors.is_empty(), "the second ejection lasts 4 s: {still:?}");
}

#[test]
fn a_service_may_turn_ejection_off() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    let _agent = start(&fx, Some("off"));
    fx.backends[0].stop();
    let outage = pods.tcp(VIP.parse().unwrap(), 300);
    let refused = outage.errors.get("ECONNREFUSED").copied().unwrap_or(0);
    assert!(refused > 100, "without ejection about half keep failing: {outage:?}");
}

#[test]
fn an_agent_started_with_ejection_off_ends_the_ejections_in_force() {
    require_root!();
    let mut fx = Fixture::new(2);
    let pods = Pods::new(&mut fx);
    let vip: SocketAddr = VIP.parse().unwrap();
    let agent = start(&fx, None);
    fx.backends[0].stop();
    let _ = pods.tcp(vip, 100);
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 1");
    drop(agent);
    // The connect hooks read the pinned ejections whether or not the tracing programs run: an
    // agent with ejection off must not leave the previous one's in force for 10 s.
    let agent = start_with(&fx, None, Vec::new(), &["--outlier-ejection", "off"]);
    let outage = pods.tcp(vip, 200);
    assert!(outage.errors.get("ECONNREFUSED").copied().unwrap_or(0) > 50, "{outage:?}");
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 0");
}

#[test]
fn a_socket_reconnected_elsewhere_charges_its_failures_to_no_backend() {
    require_root!();
    let mut fx = Fixture::new(2);
    let second = fx.network.host("c");
    let agent = start(&fx, None);
    let vip: SocketAddr = VIP.parse().unwrap();
    // One socket per pod, twelve times: through the Service to a healthy backend, the connection
    // dissolved (`connect(AF_UNSPEC)`), then a refused connect to a closed port of the pod's own
    // namespace. The socket keeps its cookie and its entry in the connections table: the
    // refusals were once charged to the backend the entry names, ejecting a healthy pod for every
    // client of the node.
    for (place, addr) in [(fx.place(), fx.client.v4), (fx.place_in(&second), second.v4)] {
        let attack = place.reconnect_elsewhere(vip, (addr, 1).into(), 12);
        assert_eq!(attack.successes(), 12, "{attack:?}");
        assert_eq!(attack.errors.get("ECONNREFUSED").copied(), Some(12), "{attack:?}");
    }
    assert_eq!(ejected_gauge(&agent), "topology_agent_backends_ejected 0");
    let status = status(&fx);
    for backend in &fx.backends {
        assert!(!status.contains(&format!("ejected {}:{BACKEND_PORT}", backend.host.v4)), "{status}");
    }
    // Every other connection still reaches both backends.
    let victim = fx.place().tcp(vip, 200);
    assert!(victim.errors.is_empty() && victim.landed.len() == 2, "{victim:?}");
}
