//! One pod cannot take the node's DNS relay from the others (root, real kernel): a pod asking
//! unique names outside the cluster as fast as its rate allows, of an upstream slow enough that
//! they stay in flight, cannot take the slots kept for the others; another pod's lookup, asked
//! meanwhile, is relayed and answered instead of getting SERVFAIL at once; what a pod asks beyond
//! its slots waits in its queue and is answered as they free. Nor can it push the
//! others' answers out of the cache beyond its share; and with `--dns-clients node` a pod of
//! another node gets REFUSED. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::Duration,
};

use topology_kube::objects;
use topology_tests::{
    agent::Agent,
    dns::{Lookups, dig, start_dns_agent, start_dns_agent_with, start_upstream, start_upstream_after},
    fixture::Fixture,
    net::probe_binary,
    require_root,
    sandbox::ProcessGuard,
};

/// What the stand-in upstream answers every name with.
const ANSWER: &str = "192.0.2.7";

#[test]
fn one_pods_flood_of_unique_names_leaves_the_relay_to_the_others() {
    require_root!();
    let mut fx = Fixture::new(0);
    // An upstream that answers 1.5 s after each query: whatever is asked stays in flight.
    let (upstream, _upstream) = start_upstream_after(&mut fx.network, false, None, None, Duration::from_millis(1500));
    let upstream = SocketAddr::from((upstream.v4, 53));
    let (dns_pod, tenant, victim) = (fx.network.host("pod"), fx.network.host("pod"), fx.network.host("pod"));
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &[objects::node("node-a", "zone-a", None, "4")]);
    let _agent = start_dns_agent(&fx, &dns_pod, &file, upstream);
    let server = SocketAddr::from((dns_pod.v4, 53));

    // The tenant: 2,000 unique names in a second, each waiting for its answer.
    let mut command = Command::new(probe_binary());
    command.args(["--netns", tenant.netns.name(), "client", "--target", &server.to_string(), "--timeout-ms", "4000"]);
    command.args(["lookups", "--rate", "2000", "--seconds", "1", "--threads", "1500", "--name", "t{n}.example.com"]);
    let flood = ProcessGuard::new(command.stdout(Stdio::piped()).spawn().expect("spawn the flood"));
    std::thread::sleep(Duration::from_millis(600));

    // Meanwhile another pod asks one name: relayed, and answered when the upstream answers.
    let asked = dig(Some(victim.netns.name()), server, "v1.example.com", "A", &[]);
    assert_eq!(
        (asked.status.as_str(), asked.data.as_slice()),
        ("NOERROR", [ANSWER.to_owned()].as_slice()),
        "{asked:?}"
    );

    let flooded: Lookups = serde_json::from_slice(&flood.wait_output(Duration::from_secs(30))).expect("report");
    eprintln!("the flood: {flooded:?}; the other pod's lookup: {asked:?}");
    // The tenant got its share relayed and answered; the rest of its burst waited in its queue
    // for a slot in vain (the upstream holds them all 1.5 s) or, past the queue, SERVFAIL at once.
    let answered = flooded.answers.get(ANSWER).copied().unwrap_or(0);
    assert!(answered >= 64, "at least its share relayed: {flooded:?}");
    assert!(flooded.failed > 0, "beyond its share, refused: {flooded:?}");
}

#[test]
fn a_pods_burst_beyond_its_slots_waits_for_them_and_is_answered() {
    require_root!();
    let mut fx = Fixture::new(0);
    // An upstream that answers 1 s after each query.
    let (upstream, _upstream) = start_upstream_after(&mut fx.network, false, None, None, Duration::from_secs(1));
    let upstream = SocketAddr::from((upstream.v4, 53));
    let (dns_pod, pod) = (fx.network.host("pod"), fx.network.host("pod"));
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &[objects::node("node-a", "zone-a", None, "4")]);
    let agent = start_dns_agent(&fx, &dns_pod, &file, upstream);
    let server = SocketAddr::from((dns_pod.v4, 53));

    // 1,000 unique names in a second: 768 relayed at once (all but the others' reserve), the
    // last 232 wait in the pod's queue until the first answers free their slots.
    let mut command = Command::new(probe_binary());
    command.args(["--netns", pod.netns.name(), "client", "--target", &server.to_string(), "--timeout-ms", "4000"]);
    command.args(["lookups", "--rate", "1000", "--seconds", "1", "--threads", "1100", "--name", "b{n}.example.com"]);
    let burst = ProcessGuard::new(command.stdout(Stdio::piped()).spawn().expect("spawn the burst"));
    let burst: Lookups = serde_json::from_slice(&burst.wait_output(Duration::from_secs(30))).expect("report");
    let queued = counter(&agent, "dns_relay_queued");
    eprintln!("the burst: {burst:?}; queued: {queued}");
    assert_eq!((burst.made, burst.failed), (1000, 0), "every lookup answered: {burst:?}");
    assert_eq!(burst.answers.get(ANSWER).copied(), Some(1000), "{burst:?}");
    assert!((150..=256).contains(&queued), "those beyond the slots waited: {queued}");
    let (_, metrics) = agent.get("/metrics").expect("metrics");
    assert!(!metrics.contains("outcome=\"source_overloaded\""), "none refused:\n{metrics}");
}

/// The value of the unlabelled counter `name` in `agent`'s metrics.
fn counter(agent: &Agent, name: &str) -> u64 {
    value(agent, &format!("{name}_total"))
}

/// The value of the unlabelled metric `name` in `agent`'s metrics.
fn value(agent: &Agent, name: &str) -> u64 {
    let (_, metrics) = agent.get("/metrics").expect("metrics");
    let prefix = format!("topology_agent_{name} ");
    metrics.lines().find_map(|line| line.strip_prefix(&prefix)).map_or(0, |value| value.trim().parse().expect(name))
}

#[test]
fn one_pods_unique_names_take_only_its_share_of_the_cache() {
    require_root!();
    let mut fx = Fixture::new(0);
    let (upstream, _upstream) = start_upstream(&mut fx.network, false, None, None);
    let upstream = SocketAddr::from((upstream.v4, 53));
    let (dns_pod, tenant, victim) = (fx.network.host("pod"), fx.network.host("pod"), fx.network.host("pod"));
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &[objects::node("node-a", "zone-a", None, "4")]);
    // 1 MiB of cache: one client's share (1/8) is about 400 answers.
    let agent = start_dns_agent_with(&fx, &dns_pod, &file, upstream, &["--dns-cache-mib", "1"]);
    let server = SocketAddr::from((dns_pod.v4, 53));

    // The victim's names, cached.
    let names: Vec<String> = (0..150).map(|n| format!("p{n}.example.com")).collect();
    for name in &names {
        assert_eq!(dig(Some(victim.netns.name()), server, name, "A", &[]).status, "NOERROR", "{name}");
    }
    let victims_bytes = value(&agent, "dns_cache_bytes");
    // The tenant: 12,000 unique names, about twice the cache's worth of answers.
    let mut command = Command::new(probe_binary());
    command.args(["--netns", tenant.netns.name(), "client", "--target", &server.to_string(), "--timeout-ms", "4000"]);
    command.args(["lookups", "--rate", "3000", "--seconds", "4", "--threads", "64", "--name", "u{n}.example.com"]);
    let flood = ProcessGuard::new(command.stdout(Stdio::piped()).spawn().expect("spawn the flood"));
    let flooded: Lookups = serde_json::from_slice(&flood.wait_output(Duration::from_secs(60))).expect("report");
    let (over_share, evictions) = (counter(&agent, "dns_cache_over_share"), counter(&agent, "dns_cache_evictions"));
    let bytes = value(&agent, "dns_cache_bytes");
    eprintln!(
        "the flood: made {} failed {}; its own answers evicted for its new ones: {evictions}, not kept: {over_share}; \
         the cache {bytes} bytes, the victim's {victims_bytes}",
        flooded.made, flooded.failed
    );
    assert!(flooded.answers.get(ANSWER).copied().unwrap_or(0) >= 11_000, "the flood was answered: {flooded:?}");

    // The victim's answers are still there: each name again is a cache hit.
    let hits = counter(&agent, "dns_cache_hits");
    for name in &names {
        assert_eq!(dig(Some(victim.netns.name()), server, name, "A", &[]).status, "NOERROR", "{name}");
    }
    let kept = counter(&agent, "dns_cache_hits") - hits;
    assert!(kept >= 145, "{kept} of {} of the victim's answers survived the flood", names.len());
    // Beyond its share (1 MiB / 8) its answers took the place of its own, unused since.
    assert!(bytes <= victims_bytes + (1 << 20) / 8, "the flood kept {} bytes", bytes - victims_bytes);
    assert!(evictions + over_share >= 9_000, "most of the flood's answers took the place of its own: {evictions}");
}

#[test]
fn with_dns_clients_node_a_pod_of_another_node_is_refused() {
    require_root!();
    let mut fx = Fixture::new(0);
    let (upstream, _upstream) = start_upstream(&mut fx.network, false, None, None);
    let upstream = SocketAddr::from((upstream.v4, 53));
    let (dns_pod, own_pod) = (fx.network.host("pod"), fx.network.host("pod"));
    // On the same wire, outside this node's pod CIDR: a pod of another node.
    let stranger =
        fx.network.host_at("stranger", ("10.244.9.9".parse().unwrap(), 16), ("fd00:244::909".parse().unwrap(), 64));
    let file = fx.scratch().join("cluster.yaml");
    let mut node = objects::node("node-a", "zone-a", None, "4");
    node["spec"] = serde_json::json!({"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]});
    node["status"]["addresses"] = serde_json::json!([{"type": "InternalIP", "address": "10.244.200.1"}]);
    objects::write(&file, &[node]);
    let agent = start_dns_agent_with(&fx, &dns_pod, &file, upstream, &["--dns-clients", "node"]);
    let server = SocketAddr::from((dns_pod.v4, 53));

    for (name, rtype) in [("outside.example.com", "A"), ("kubernetes.default.svc.cluster.local", "A")] {
        let own = dig(Some(own_pod.netns.name()), server, name, rtype, &[]);
        assert_ne!(own.status, "REFUSED", "this node's pod is answered: {own:?}");
        for extra in [&[][..], &["+tcp"][..]] {
            let other = dig(Some(stranger.netns.name()), server, name, rtype, extra);
            assert_eq!(other.status, "REFUSED", "{name} {extra:?}: {other:?}");
            assert!(other.elapsed < Duration::from_secs(1), "refused at once: {other:?}");
        }
    }
    let (_, metrics) = agent.get("/metrics").expect("metrics");
    assert!(metrics.contains("outcome=\"refused_client\"} 4"), "{metrics}");
}
