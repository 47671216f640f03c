//! Steering the cluster DNS to the node-local responder (root, real kernel, `dig`): a client
//! resolving through the kube-dns ClusterIP gets this node's topology-aware answer while the
//! responder answers, and CoreDNS's answer (through the kube-proxy stand-in) within a second or two
//! of the responder freezing or dying. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use serde_json::json;
use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    dns::{Dig, UPSTREAM_TTL, dig_from, start_dns_agent, start_upstream},
    fixture::Fixture,
    net::KubeProxyStandIn,
    require_root,
};

const DB: &str = "db.default.svc.cluster.local";
const KUBE_DNS: &str = "10.96.0.10:53";
/// What the CoreDNS stand-in answers for every name.
const COREDNS_ANSWER: &str = "192.0.2.7";
/// What this node's responder answers for `DB` (PreferClose, node-a is in zone-a).
const LOCAL_ANSWER: &str = "10.1.0.1";

fn kube_dns() -> SocketAddr {
    KUBE_DNS.parse().expect("kube-dns ClusterIP")
}

/// Nodes in two zones, kube-dns (UDP and TCP 53) with the stand-in CoreDNS as its endpoint, and
/// a headless `db` with one endpoint per zone.
fn objects(coredns: IpAddr) -> Vec<serde_json::Value> {
    let db_endpoint = |ip: &str, node: &str, zone: &str| {
        let mut spec = EndpointSpec::new(ip.parse::<IpAddr>().unwrap(), node);
        spec.zone = Some(zone.into());
        spec
    };
    let db_slice = objects::slice(
        "default",
        "db-1",
        "db",
        "pg",
        5432,
        "TCP",
        &[db_endpoint("10.1.0.1", "node-a", "zone-a"), db_endpoint("10.1.0.2", "node-b", "zone-b")],
    );
    let [dns_service, dns_slice] = objects::kube_dns(kube_dns().ip(), coredns, "node-b");
    vec![
        objects::node("node-a", "zone-a", None, "4"),
        objects::node("node-b", "zone-b", None, "4"),
        dns_service,
        dns_slice,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "None", "trafficDistribution": "PreferClose",
                     "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}
        }),
        db_slice,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "ext", "namespace": "default"},
            "spec": {"type": "ExternalName", "externalName": "db.example.org"}
        }),
    ]
}

/// `dig` through the kube-dns ClusterIP from the client, inside the cgroup the programs are on.
fn ask(fx: &Fixture, name: &str, extra: &[&str]) -> Dig {
    let mut args = vec!["+time=1"];
    args.extend_from_slice(extra);
    dig_from(Some(fx.client.netns.name()), Some(fx.cgroup.path()), kube_dns(), name, "A", &args)
}

/// Asks until the answer is `expect`; how long that took.
fn until_answer(fx: &Fixture, expect: &str, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let answer = ask(fx, DB, &[]);
        if answer.data == [expect] {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "still {answer:?} after {within:?}, waiting for {expect}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_cluster_dns_is_steered_to_the_node_responder_and_fails_open_to_coredns() {
    require_root!();
    let mut fx = Fixture::new(0);
    let (coredns, _coredns) = start_upstream(&mut fx.network, false, None, None);
    let coredns = SocketAddr::from((coredns.v4, 53));
    let node = fx.network.host("node");
    let proxy = KubeProxyStandIn::new(fx.client.netns.name());
    proxy.forward("udp", kube_dns(), coredns);
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &objects(coredns.ip()));

    // Without the agent, the ClusterIP is CoreDNS (through kube-proxy).
    assert_eq!(ask(&fx, DB, &[]).data, [COREDNS_ANSWER]);

    let mut agent = start_dns_agent(&fx, &node, &file, coredns);
    let steered = until_answer(&fx, LOCAL_ANSWER, Duration::from_secs(5));
    let answer = ask(&fx, DB, &[]);
    assert!(answer.answers[0].contains(" 5 IN A "), "this node's responder answered: {answer:?}");
    // TCP too (the kube-proxy stand-in forwards UDP only: only the steering can answer it).
    assert_eq!(ask(&fx, DB, &["+tcp"]).data, [LOCAL_ANSWER]);
    // Names the responder does not own go through it to CoreDNS, unchanged.
    let relayed = ask(&fx, "example.com", &[]);
    assert_eq!(relayed.data, [COREDNS_ANSWER], "{relayed:?}");
    assert!(relayed.answers[0].contains(&format!(" {UPSTREAM_TTL} IN A ")), "{relayed:?}");
    // An ExternalName Service: CoreDNS's CNAME, completed with the target's records from upstream
    // (a stub resolver does not chase a CNAME), never this node's NXDOMAIN.
    let external = ask(&fx, "ext.default.svc.cluster.local", &[]);
    assert_eq!(external.status, "NOERROR", "{external:?}");
    assert_eq!(external.data, [COREDNS_ANSWER, "db.example.org."], "{external:?}");
    assert!(external.answers.iter().any(|a| a.contains(" 5 IN CNAME ")), "{external:?}");

    // A frozen responder stops answering its probe: DNS goes back to CoreDNS, then returns.
    agent.signal(libc::SIGSTOP);
    let frozen = until_answer(&fx, COREDNS_ANSWER, Duration::from_secs(5));
    agent.signal(libc::SIGCONT);
    let thawed = until_answer(&fx, LOCAL_ANSWER, Duration::from_secs(5));

    // A dead agent: the same, with nobody left to clean up.
    agent.signal(libc::SIGKILL);
    agent.wait_exit(Duration::from_secs(5));
    let killed = until_answer(&fx, COREDNS_ANSWER, Duration::from_secs(5));
    eprintln!("steered after {steered:?}; frozen -> CoreDNS {frozen:?}; back {thawed:?}; killed -> CoreDNS {killed:?}");

    // A restarted agent steers again; a stopped one turns the steering off on its way out.
    let mut agent = start_dns_agent(&fx, &node, &file, coredns);
    until_answer(&fx, LOCAL_ANSWER, Duration::from_secs(5));
    agent.signal(libc::SIGTERM);
    agent.wait_exit(Duration::from_secs(10));
    assert_eq!(ask(&fx, DB, &[]).data, [COREDNS_ANSWER], "no steering is left behind a stopped agent");
}
