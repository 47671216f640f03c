//! A rolling update of the agent with the cluster DNS steered to it (root, real kernel): resolvers
//! asking 1,000 names a second through the kube-dns ClusterIP — a headless Service's name the
//! responder answers, and unique names it relays to an upstream that takes 300 ms, so hundreds are
//! in flight at any moment — each on a fresh socket and with one try, lose no query while the old
//! agent hands the steering back to CoreDNS (it answers what was already sent before it closes
//! its sockets) and the new one, at a new address, takes it over. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    dns::{Lookups, dig_from, start_dns_agent, start_upstream_after},
    fixture::Fixture,
    net::{KubeProxyStandIn, probe_binary},
    require_root,
    sandbox::ProcessGuard,
};

const DB: &str = "db.default.svc.cluster.local";
const KUBE_DNS: &str = "10.96.0.10:53";
const COREDNS_ANSWER: &str = "192.0.2.7";
const LOCAL_ANSWER: &str = "10.1.0.1";

fn objects(coredns: IpAddr) -> Vec<serde_json::Value> {
    let mut endpoint = EndpointSpec::new("10.1.0.1".parse::<IpAddr>().unwrap(), "node-a");
    endpoint.zone = Some("zone-a".into());
    let [dns_service, dns_slice] = objects::kube_dns(KUBE_DNS.parse::<SocketAddr>().unwrap().ip(), coredns, "node-b");
    vec![
        objects::node("node-a", "zone-a", None, "4"),
        objects::node("node-b", "zone-b", None, "4"),
        dns_service,
        dns_slice,
        serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "default"},
            "spec": {"clusterIP": "None", "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]}
        }),
        objects::slice("default", "db-1", "db", "pg", 5432, "TCP", &[endpoint]),
    ]
}

/// Waits until the ClusterIP answers `expect` (the responder's answer, or CoreDNS's).
fn until_answer(fx: &Fixture, expect: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let dig = dig_from(
            Some(fx.client.netns.name()),
            Some(fx.cgroup.path()),
            KUBE_DNS.parse().unwrap(),
            DB,
            "A",
            &["+time=1"],
        );
        if dig.data == [expect] {
            return;
        }
        assert!(Instant::now() < deadline, "still {dig:?}, waiting for {expect}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_rolling_update_with_dns_steered_loses_no_query() {
    require_root!();
    let mut fx = Fixture::new(0);
    let (coredns, _coredns) = start_upstream_after(&mut fx.network, false, None, None, Duration::from_millis(300));
    let coredns = SocketAddr::from((coredns.v4, 53));
    let (old_pod, new_pod) = (fx.network.host("pod"), fx.network.host("pod"));
    let proxy = KubeProxyStandIn::new(fx.client.netns.name());
    proxy.forward("udp", KUBE_DNS.parse().unwrap(), coredns);
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &objects(coredns.ip()));
    let mut old = start_dns_agent(&fx, &old_pod, &file, coredns);
    until_answer(&fx, LOCAL_ANSWER);

    let resolver = |name: &str| {
        let mut command = Command::new(probe_binary());
        command.args(["--netns", fx.client.netns.name(), "--cgroup"]).arg(fx.cgroup.path());
        command.args(["client", "--target", KUBE_DNS, "--timeout-ms", "2000"]);
        // 300 ms for a relayed name (the slow upstream, or CoreDNS itself): 512 threads ask.
        command.args(["lookups", "--rate", "1000", "--seconds", "12", "--threads", "512", "--name", name]);
        ProcessGuard::new(command.stdout(Stdio::piped()).spawn().expect("spawn a resolver"))
    };
    let (local, relayed) = (resolver(DB), resolver("q{n}.example.com"));

    std::thread::sleep(Duration::from_secs(2));
    // The rolling update: the old pod is told to stop, then the new one starts at a new address.
    old.signal(libc::SIGTERM);
    old.wait_exit(Duration::from_secs(10));
    let mut new = start_dns_agent(&fx, &new_pod, &file, coredns);
    until_answer(&fx, LOCAL_ANSWER);

    let report = |resolver: ProcessGuard| -> Lookups {
        serde_json::from_slice(&resolver.wait_output(Duration::from_secs(30))).expect("a resolver's report")
    };
    let (local, relayed) = (report(local), report(relayed));
    eprintln!("{local:?}\n{relayed:?}");
    for lookups in [&local, &relayed] {
        assert!(lookups.made >= 11_000, "{lookups:?}");
        assert_eq!(lookups.failed, 0, "no query dropped or timed out through the handover: {lookups:?}");
    }
    assert!(local.answers.get(COREDNS_ANSWER).is_some_and(|n| *n > 0), "CoreDNS answered meanwhile: {local:?}");
    assert!(local.answers.get(LOCAL_ANSWER).is_some_and(|n| *n > 1000), "the responders answered: {local:?}");
    assert_eq!(relayed.answers.get(COREDNS_ANSWER), Some(&relayed.made), "every relayed name answered: {relayed:?}");
    new.signal(libc::SIGTERM);
    new.wait_exit(Duration::from_secs(10));
}
