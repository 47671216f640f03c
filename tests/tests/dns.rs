//! The DNS responder (root, real sockets, `dig`): two simulated nodes in different zones, each
//! running an agent in its own network namespace, give different answers for the same headless
//! name; names the agent does not own go to the upstream and come back unchanged; a dead
//! upstream is SERVFAIL, not a hang. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use serde_json::json;
use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    dns::{UPSTREAM_TTL, dig, start_upstream},
    net::{Host, Network},
    require_root,
    sandbox::{CgroupGuard, PinGuard, ProcessGuard, unique_id},
};

const DB: &str = "db.default.svc.cluster.local";

/// A headless Service `db` (PreferClose, named port `pg`) with db-0 in zone-a, db-1 in zone-b;
/// a ClusterIP Service `web`.
fn objects(with_db_0: bool) -> Vec<serde_json::Value> {
    let mut db = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "db", "namespace": "default"},
        "spec": {"clusterIP": "None", "trafficDistribution": "PreferClose",
                 "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}
    });
    db["spec"]["clusterIPs"] = json!(["None"]);
    let endpoint = |ip: &str, node: &str, zone: &str, host: &str| {
        let mut spec = EndpointSpec::new(ip.parse::<IpAddr>().unwrap(), node);
        spec.zone = Some(zone.into());
        let mut value = objects::slice("default", "x", "db", "pg", 5432, "TCP", &[spec])["endpoints"][0].clone();
        value["hostname"] = host.into();
        value
    };
    let mut endpoints = vec![endpoint("10.1.0.2", "node-b", "zone-b", "db-1")];
    if with_db_0 {
        endpoints.insert(0, endpoint("10.1.0.1", "node-a", "zone-a", "db-0"));
    }
    let mut slice = objects::slice("default", "db-abc", "db", "pg", 5432, "TCP", &[]);
    slice["endpoints"] = json!(endpoints);
    vec![
        objects::node("node-a", "zone-a", None, "4"),
        objects::node("node-b", "zone-b", None, "4"),
        db,
        slice,
        objects::service("default", "web", "10.96.0.80".parse().unwrap(), 80, "TCP", "http"),
        objects::slice(
            "default",
            "web-abc",
            "web",
            "http",
            8080,
            "TCP",
            &[EndpointSpec::new("10.1.0.9".parse().unwrap(), "node-b")],
        ),
    ]
}

/// One simulated node: a namespace, and an agent in it serving DNS on its address, port 53.
struct Node {
    agent: Agent,
    host: Host,
    _cgroup: CgroupGuard,
    _pins: PinGuard,
}

impl Node {
    fn start(network: &mut Network, id: &str, name: &str, file: &std::path::Path, upstream: SocketAddr) -> Self {
        let host = network.host(&name[5..]);
        let cgroup = CgroupGuard::new(&format!("{id}-{name}"));
        let pins = PinGuard::new(&format!("{id}-{name}"));
        let mut agent = Agent::start(&AgentOptions {
            netns: Some(host.netns.name()),
            extra: vec![
                "--dns-listen".into(),
                format!("{}:53", host.v4),
                "--dns-upstream".into(),
                upstream.to_string(),
            ],
            ..AgentOptions::new(file, name, cgroup.path(), pins.path())
        });
        agent.wait_ready(Duration::from_secs(30));
        Self { agent, host, _cgroup: cgroup, _pins: pins }
    }

    fn dns(&self) -> SocketAddr {
        SocketAddr::from((self.host.v4, 53))
    }

    fn dig(&self, name: &str, rtype: &str, extra: &[&str]) -> topology_tests::dns::Dig {
        dig(Some(self.host.netns.name()), self.dns(), name, rtype, extra)
    }
}

/// A network, the cluster file and the stand-in upstream (answering, or `silent`).
struct World {
    id: String,
    network: Network,
    file: std::path::PathBuf,
    upstream: SocketAddr,
    _upstream: (Host, ProcessGuard),
    _scratch: tempfile::TempDir,
}

impl World {
    fn new(silent: bool) -> Self {
        let id = unique_id();
        let mut network = Network::new(&id);
        let scratch = tempfile::tempdir().expect("scratch dir");
        let file = scratch.path().join("cluster.yaml");
        objects::write(&file, &objects(true));
        let stand_in = start_upstream(&mut network, silent, None, None);
        let upstream = SocketAddr::from((stand_in.0.v4, 53));
        Self { id, network, file, upstream, _upstream: stand_in, _scratch: scratch }
    }

    fn node(&mut self, name: &str) -> Node {
        Node::start(&mut self.network, &self.id, name, &self.file, self.upstream)
    }
}

#[test]
fn each_node_answers_a_headless_name_with_its_own_zone() {
    require_root!();
    let mut world = World::new(false);
    let file = world.file.clone();
    let a = world.node("node-a");
    let b = world.node("node-b");

    // The same name, different answers: each node's policy (PreferClose) chose its own zone.
    for (node, expect) in [(&a, "10.1.0.1"), (&b, "10.1.0.2")] {
        for transport in [&[][..], &["+tcp"][..]] {
            let answer = node.dig(DB, "A", transport);
            assert_eq!(
                (answer.status.as_str(), answer.data.clone()),
                ("NOERROR", vec![expect.to_owned()]),
                "{answer:?}"
            );
            assert!(answer.answers[0].contains(" 5 IN A "), "TTL 5: {answer:?}");
        }
    }
    // SRV targets are chosen the same way; per-endpoint names and ClusterIPs as CoreDNS has them.
    let srv = a.dig(&format!("_pg._tcp.{DB}"), "SRV", &[]);
    assert_eq!(srv.data, ["0 10000 5432 db-0.db.default.svc.cluster.local."], "{srv:?}");
    assert_eq!(a.dig("db-1.db.default.svc.cluster.local", "A", &[]).data, ["10.1.0.2"]);
    assert_eq!(b.dig("WEB.default.svc.Cluster.Local", "A", &[]).data, ["10.96.0.80"]);
    assert_eq!(a.dig("nope.default.svc.cluster.local", "A", &[]).status, "NXDOMAIN");
    assert_eq!(a.dig(DB, "AAAA", &[]).status, "NOERROR", "NODATA");

    // A change reaches the answers: db-0 leaves, node-a's zone is empty, PreferClose takes all.
    objects::write(&file, &objects(false));
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let answer = a.dig(DB, "A", &[]);
        if answer.data == ["10.1.0.2"] {
            break;
        }
        assert!(Instant::now() < deadline, "node-a still answers {answer:?}");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Everything else goes to the upstream and comes back as it answered (its TTL, its address).
    let relayed = b.dig("example.com", "A", &[]);
    assert_eq!(relayed.data, ["192.0.2.7"], "{relayed:?}");
    assert!(relayed.answers[0].contains(&format!(" {UPSTREAM_TTL} IN A ")), "{relayed:?}");
    // Asked again, it comes from the cache of relayed answers, its TTL counting down.
    let again = b.dig("EXAMPLE.com", "A", &[]);
    assert_eq!(again.data, ["192.0.2.7"], "{again:?}");
    let metrics = b.agent.get("/metrics").expect("metrics").1;
    assert!(metrics.contains("topology_agent_dns_queries_total{type=\"A\",outcome=\"cached\"} 1"), "{metrics}");
    assert!(metrics.contains("topology_agent_dns_cache_hits_total 1"), "{metrics}");
    let metrics = a.agent.get("/metrics").expect("metrics").1;
    assert!(metrics.contains("topology_agent_dns_queries_total{type=\"A\",outcome=\"answer\"}"), "{metrics}");
    assert!(metrics.contains("topology_agent_dns_answered_endpoints_total{locality=\"node\"}"), "{metrics}");
}

#[test]
fn a_dead_or_silent_upstream_is_servfail_not_a_hang() {
    require_root!();
    let mut world = World::new(true);
    let a = world.node("node-a");
    let answer = a.dig("example.com", "A", &[]);
    assert_eq!(answer.status, "SERVFAIL", "{answer:?}");
    assert!(answer.elapsed < Duration::from_secs(3), "answered in {:?}", answer.elapsed);
    // Our own names never wait on the upstream.
    let local = a.dig(DB, "A", &[]);
    assert_eq!(local.data, ["10.1.0.1"]);
    assert!(local.elapsed < Duration::from_secs(1));
}
