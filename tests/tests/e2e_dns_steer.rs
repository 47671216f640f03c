//! The cluster DNS steered to the node's responder, with the real kube-proxy and the real CoreDNS
//! (root, real kernel, the real control plane): CoreDNS 1.14 with kubeadm's Corefile on one node
//! behind `kube-dns`, kube-proxy 1.35 (nftables, as users run it) and the agent deployed from
//! `deploy/` on another, a headless `db` with one pod per zone. From a pod of the agent's node,
//! through the kube-dns ClusterIP: kube-proxy's CoreDNS before the agent comes; the agent's
//! topology-aware answer (this zone's pod only, UDP and TCP) while it runs, names outside the
//! cluster and an ExternalName relayed through CoreDNS unchanged; CoreDNS again within seconds of
//! the agent freezing, dying, or stopping — and no steering left behind it. `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use serde_json::json;
use topology_tests::{
    dns::{Dig, dig_from, start_upstream},
    kubernetes::{
        Binaries, ClientPod, Cluster,
        coredns::{Corefile, TTL},
        eventually,
        nodes::NodeSpec,
        pods::PodSpec,
        proxy::{ProxyMode, SyncPacing},
    },
    require_root,
};

const NS: &str = "dns";
const DB: &str = "db.dns.svc.cluster.local";
const NODE: &str = "node-a";
/// What the stand-in for the outside answers for every name.
const OUTSIDE_ANSWER: &str = "192.0.2.7";

/// `dig` through the kube-dns ClusterIP from the client pod, in its node's cgroup.
fn ask(client: &ClientPod, kube_dns: SocketAddr, name: &str, extra: &[&str]) -> Dig {
    let mut args = vec!["+time=1", "+tries=1"];
    args.extend_from_slice(extra);
    dig_from(Some(&client.place.netns), Some(&client.place.cgroup), kube_dns, name, "A", &args)
}

/// Asks `DB` until the answer's addresses are `expect`; how long that took.
fn until_answer(client: &ClientPod, kube_dns: SocketAddr, expect: &[String], within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let answer = ask(client, kube_dns, DB, &[]);
        if answer.data == expect {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "still {answer:?} after {within:?}, waiting for {expect:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn the_cluster_dns_is_steered_to_the_responder_and_back_to_coredns_through_kube_proxy() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let nodes = [NodeSpec::new(NODE, "zone-a"), NodeSpec::new("node-b", "zone-b")];
    let mut cluster = Cluster::start(binaries, &nodes);
    let (outside, _outside) = start_upstream(cluster.network(), false, None, None);
    cluster.reach_pods_from(&outside);
    let _coredns = cluster.start_coredns("node-b", SocketAddr::from((outside.v4, 53)), Corefile::Kubeadm);
    cluster.namespace(NS);
    cluster.apply(&json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": NS},
        "spec": {"clusterIP": "None", "trafficDistribution": "PreferClose", "selector": {"app": "db"},
                 "ports": [{"name": "pg", "port": 5432, "protocol": "TCP"}]},
    }));
    cluster.apply(&json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext", "namespace": NS},
        "spec": {"type": "ExternalName", "externalName": "db.example.org"},
    }));
    let near = cluster.run_pod(NODE, PodSpec::new(NS, "db-a", "db", &[5432]));
    let far = cluster.run_pod("node-b", PodSpec::new(NS, "db-b", "db", &[5432]));
    let mut coredns_answer = vec![near.ip.to_string(), far.ip.to_string()];
    coredns_answer.sort();
    let local_answer = vec![near.ip.to_string()];
    let cluster_ip =
        cluster.kubectl(&["-n", "kube-system", "get", "service", "kube-dns", "-o", "jsonpath={.spec.clusterIP}"]);
    let kube_dns = SocketAddr::from((
        cluster_ip.expect("kube-dns").trim().parse::<std::net::IpAddr>().expect("its ClusterIP"),
        53,
    ));

    // Before the agent: the ClusterIP is CoreDNS, through kube-proxy (nothing else routes it).
    let mut proxy = cluster.start_kube_proxy(NODE, ProxyMode::Nftables, SyncPacing::Default);
    proxy.wait_synced(Duration::from_secs(60));
    proxy.owns_the_rules().unwrap_or_else(|why| panic!("kube-proxy programmed the node: {why}"));
    let client = cluster.client_on(NODE);
    eventually("CoreDNS through kube-proxy answering both db pods", Duration::from_secs(30), || {
        let answer = ask(&client, kube_dns, DB, &[]);
        (answer.data == coredns_answer).then_some(()).ok_or(format!("{answer:?}"))
    });
    let answer = ask(&client, kube_dns, DB, &[]);
    assert!(answer.answers.iter().all(|a| a.contains(&format!(" {TTL} IN A "))), "CoreDNS answered: {answer:?}");

    // The agent, as deployed: the node's queries to the ClusterIP are its responder's.
    cluster.deploy();
    let agent = cluster.start_agent(NODE, &[]);
    let steered = until_answer(&client, kube_dns, &local_answer, Duration::from_secs(10));
    let answer = ask(&client, kube_dns, DB, &[]);
    assert!(answer.answers[0].contains(" 5 IN A "), "this node's responder answered: {answer:?}");
    assert_eq!(ask(&client, kube_dns, DB, &["+tcp"]).data, local_answer, "over TCP too");
    // Names it does not own go through it to CoreDNS and on to the outside, unchanged.
    let relayed = ask(&client, kube_dns, "example.com", &[]);
    assert_eq!(relayed.data, [OUTSIDE_ANSWER], "{relayed:?}");
    // An ExternalName: CoreDNS's CNAME with the target's records (a stub does not chase it).
    let external = ask(&client, kube_dns, &format!("ext.{NS}.svc.cluster.local"), &[]);
    assert_eq!(external.status, "NOERROR", "{external:?}");
    assert_eq!(external.data, [OUTSIDE_ANSWER, "db.example.org."], "{external:?}");

    // A frozen responder: CoreDNS within seconds, then the responder again.
    agent.signal(libc::SIGSTOP);
    let frozen = until_answer(&client, kube_dns, &coredns_answer, Duration::from_secs(5));
    agent.signal(libc::SIGCONT);
    let thawed = until_answer(&client, kube_dns, &local_answer, Duration::from_secs(5));
    // A dead agent, with nobody left to clean up.
    agent.signal(libc::SIGKILL);
    let killed = until_answer(&client, kube_dns, &coredns_answer, Duration::from_secs(5));
    eprintln!("steered after {steered:?}; frozen -> CoreDNS {frozen:?}; back {thawed:?}; killed -> CoreDNS {killed:?}");
    cluster.remove_agent(agent);

    // Its successor steers again; stopped, it leaves no steering behind.
    let mut agent = cluster.start_agent(NODE, &[]);
    until_answer(&client, kube_dns, &local_answer, Duration::from_secs(10));
    agent.stop();
    assert_eq!(ask(&client, kube_dns, DB, &[]).data, coredns_answer, "no steering left behind a stopped agent");
    proxy.wait_synced(Duration::from_secs(30));
}
