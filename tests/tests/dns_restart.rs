//! A restarted agent never breaks the node's DNS (root, real kernel, `dig`): until it has a
//! complete, current view it steers nothing — not from an empty view (which would answer NXDOMAIN
//! for every cluster name), not to the address its predecessor's entry names (which may be a dead
//! pod's) — and a steering heartbeat that names another address than the entry steers nothing
//! either. Queries go to CoreDNS through kube-proxy meanwhile. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use serde_json::json;
use topology_kube::{
    fake_api::write_kubeconfig,
    objects::{self, EndpointSpec},
};
use topology_tests::{
    agent::{Agent, AgentOptions},
    dns::{Dig, dig_from, start_upstream},
    fixture::Fixture,
    net::{Host, KubeProxyStandIn},
    require_root,
    sandbox::run,
};

const DB: &str = "db.default.svc.cluster.local";
const KUBE_DNS: &str = "10.96.0.10:53";
/// What the CoreDNS stand-in answers for every name.
const COREDNS_ANSWER: &str = "192.0.2.7";
/// What this node's responder answers for `DB`.
const LOCAL_ANSWER: &str = "10.1.0.1";

fn kube_dns() -> SocketAddr {
    KUBE_DNS.parse().expect("kube-dns ClusterIP")
}

/// kube-dns (UDP and TCP 53) with the stand-in CoreDNS as its endpoint, and a headless `db`.
fn objects(coredns: IpAddr) -> Vec<serde_json::Value> {
    let [dns_service, dns_slice] = objects::kube_dns(kube_dns().ip(), coredns, "node-b");
    let db = EndpointSpec::new(LOCAL_ANSWER.parse::<IpAddr>().unwrap(), "node-a");
    vec![
        objects::node("node-a", "zone-a", None, "4"),
        objects::node("node-b", "zone-b", None, "4"),
        dns_service,
        dns_slice,
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}
        }),
        objects::slice("default", "db-1", "db", "pg", 5432, "TCP", &[db]),
    ]
}

/// An agent on `node` serving DNS at `listen`, from `source`: a cluster file, or a kubeconfig.
fn start(fx: &Fixture, node: &Host, source: &std::path::Path, kube: bool, listen: u16, upstream: SocketAddr) -> Agent {
    Agent::start(&AgentOptions {
        netns: Some(node.netns.name()),
        kubeconfig: kube.then_some(source),
        extra: vec![
            "--dns-listen".into(),
            format!("{}:{listen}", node.v4),
            "--dns-upstream".into(),
            upstream.to_string(),
        ],
        ..AgentOptions::new(source, "node-a", fx.cgroup.path(), fx.pins.path())
    })
}

fn ask(fx: &Fixture, name: &str) -> Dig {
    dig_from(Some(fx.client.netns.name()), Some(fx.cgroup.path()), kube_dns(), name, "A", &["+time=1"])
}

/// Asks until the answer is `expect`, up to `within`.
fn until_answer(fx: &Fixture, expect: &str, within: Duration) {
    let started = Instant::now();
    loop {
        let answer = ask(fx, DB);
        if answer.data == [expect] {
            return;
        }
        assert!(started.elapsed() < within, "still {answer:?} after {within:?}, waiting for {expect}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// For `during`, every answer through the ClusterIP is CoreDNS's: no NXDOMAIN from an empty view,
/// no timeout at a dead address.
fn always_coredns(fx: &Fixture, during: Duration, what: &str) {
    let started = Instant::now();
    let mut asked = 0;
    while started.elapsed() < during {
        let answer = ask(fx, DB);
        assert_eq!(answer.data, [COREDNS_ANSWER], "{what}: after {asked} answers, {answer:?}");
        asked += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds, the programs' clock.
fn coarse_now_ns() -> u64 {
    let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec to write and a valid clock id.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut now) };
    now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64
}

#[test]
fn a_restarted_agent_steers_nothing_until_it_has_a_current_view() {
    require_root!();
    let mut fx = Fixture::new(0);
    let (coredns, _coredns) = start_upstream(&mut fx.network, false, None, None);
    let coredns = SocketAddr::from((coredns.v4, 53));
    let node = fx.network.host("node");
    let proxy = KubeProxyStandIn::new(fx.client.netns.name());
    proxy.forward("udp", kube_dns(), coredns);
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &objects(coredns.ip()));
    // An API server nobody answers at: the restarted agent never gets a view.
    let kubeconfig = fx.scratch().join("kubeconfig");
    write_kubeconfig(&kubeconfig, "http://127.0.0.1:9");

    let mut first = start(&fx, &node, &file, false, 53, coredns);
    first.wait_ready(Duration::from_secs(30));
    until_answer(&fx, LOCAL_ANSWER, Duration::from_secs(5));
    first.signal(libc::SIGKILL);
    first.wait_exit(Duration::from_secs(5));

    // A new pod IP (here: another port) and no view: the old entry names a dead responder.
    let mut moved = start(&fx, &node, &kubeconfig, true, 5353, coredns);
    std::thread::sleep(Duration::from_millis(500));
    always_coredns(&fx, Duration::from_secs(3), "restarted at a new address without a view");
    moved.signal(libc::SIGKILL);
    moved.wait_exit(Duration::from_secs(5));

    // The same address and no view: its responder would answer every cluster name NXDOMAIN.
    let mut same = start(&fx, &node, &kubeconfig, true, 53, coredns);
    std::thread::sleep(Duration::from_millis(500));
    always_coredns(&fx, Duration::from_secs(3), "restarted at the same address without a view");
    let (status, body) = same.get("/readyz").expect("readyz");
    assert_eq!(status, 503, "{body}");
    same.signal(libc::SIGKILL);
    same.wait_exit(Duration::from_secs(5));

    // With a view, steering comes back.
    let mut healthy = start(&fx, &node, &file, false, 53, coredns);
    healthy.wait_ready(Duration::from_secs(30));
    until_answer(&fx, LOCAL_ANSWER, Duration::from_secs(5));

    // A fresh heartbeat naming another responder than the entry steers nothing: with the agent
    // frozen (no prober to rewrite it), the heartbeat is made to name port 5353 for 30 s.
    healthy.signal(libc::SIGSTOP);
    let deadline = coarse_now_ns() + 30_000_000_000;
    let mut value: Vec<u8> = deadline.to_le_bytes().to_vec();
    value.extend(node.v4.octets());
    value.extend([0u8; 12]);
    value.extend(5353u16.to_le_bytes());
    value.extend([0u8; 6]);
    let path = fx.pins.path().join("maps/topo_dns_steer").to_string_lossy().into_owned();
    let mut args = vec!["map", "update", "pinned", &path, "key", "0", "0", "0", "0", "value"];
    let bytes: Vec<String> = value.iter().map(u8::to_string).collect();
    args.extend(bytes.iter().map(String::as_str));
    run("bpftool", &args);
    always_coredns(&fx, Duration::from_secs(2), "the heartbeat names another responder than the entry");
    healthy.signal(libc::SIGCONT);
    until_answer(&fx, LOCAL_ANSWER, Duration::from_secs(5));
}
