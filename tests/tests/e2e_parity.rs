//! Live parity with the real kube-proxy (root, real kernel, the real control plane): two nodes of
//! one zone, one running kube-proxy 1.35 as users run it (nftables mode, then iptables), the other the agent
//! deployed from `deploy/`; an echo pod on every node of three zones; a Service per mode. From
//! each of the two nodes, 1,000 connections per Service: both must reach the same backends —
//! named relative to the client's node, so "own node" is each one's own pod — with shares equal
//! within sampling error, for every mode kube-proxy implements. The modes kube-proxy does not
//! implement (topology keys, spillover) are rows that differ by design. The rows are the table
//! in `docs/policy.md`: a test fails when one changes (`TOPOLOGY_UPDATE_DOCS=1` rewrites it).
//! `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use serde_json::{Value, json};
use topology_tests::{
    kubernetes::{
        Binaries, Cluster, eventually,
        nodes::NodeSpec,
        observe::{explained_backends, kernel_backends, kernel_status},
        pods::{PodSpec, echo_service},
        proxy::{ProxyMode, SyncPacing},
    },
    require_root,
    traffic::Report,
};

const NS: &str = "parity";
const CONNECTIONS: u64 = 1000;
/// The node running kube-proxy, and its neighbour in zone-a running the agent.
const PROXY_NODE: &str = "node-kp";
const AGENT_NODE: &str = "node-ag";
/// How far apart two shares of 1,000 draws may be: 4.5 standard deviations of their difference
/// (a false alarm in about 1 of 150,000 comparisons).
const SIGMAS: f64 = 4.5;

/// Whether kube-proxy implements a mode (a row that must match), or ignores what the Service asks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Parity,
    ByDesign(&'static str),
}

/// A Service per mode: its name, what it adds to a plain Service of the echo pods, its kind.
fn modes() -> Vec<(&'static str, Value, Kind)> {
    use Kind::{ByDesign, Parity};
    let annotated = |key: &str, value: &str| json!({"metadata": {"annotations": {key: value}}});
    vec![
        ("default", json!({}), Parity),
        ("auto", annotated("service.kubernetes.io/topology-mode", "Auto"), Parity),
        ("prefer-close", json!({"spec": {"trafficDistribution": "PreferClose"}}), Parity),
        ("prefer-same-zone", json!({"spec": {"trafficDistribution": "PreferSameZone"}}), Parity),
        ("prefer-same-node", json!({"spec": {"trafficDistribution": "PreferSameNode"}}), Parity),
        ("local", json!({"spec": {"internalTrafficPolicy": "Local"}}), Parity),
        // Every endpoint terminating but serving: both fall back to them.
        ("terminating", json!({"spec": {"selector": {"app": "leaving"}}}), Parity),
        ("affinity", json!({"spec": {"sessionAffinity": "ClientIP"}}), Parity),
        (
            "keys",
            annotated("topology-agent.io/topology-keys", "kubernetes.io/hostname,topology.kubernetes.io/zone,*"),
            ByDesign("topology keys (KEP-536) are the agent's; kube-proxy ignores the annotation"),
        ),
        (
            "spill",
            annotated("topology-agent.io/spillover", "capacity"),
            ByDesign("capacity spillover is the agent's; kube-proxy ignores the annotation"),
        ),
    ]
}

fn service(name: &str, extra: &Value) -> Value {
    echo_service(NS, name, extra)
}

/// Where a client's connections landed, each backend named relative to the client's node: its
/// own node's pod, its zone peer's (the other of the two compared nodes), or the pod's name.
fn relative(report: &Report, client_node: &str, node_of: &BTreeMap<String, String>) -> BTreeMap<String, u64> {
    let peer = if client_node == PROXY_NODE { AGENT_NODE } else { PROXY_NODE };
    let mut landed = BTreeMap::new();
    for (pod, count) in &report.landed {
        let node = node_of.get(pod).map(String::as_str);
        let name = match node {
            Some(node) if node == client_node => "own node".to_owned(),
            Some(node) if node == peer => "zone peer".to_owned(),
            _ => pod.clone(),
        };
        *landed.entry(name).or_insert(0) += count;
    }
    landed
}

/// The backends that differ in share beyond sampling error (two-proportion test).
fn unequal_shares(a: &BTreeMap<String, u64>, b: &BTreeMap<String, u64>) -> Vec<String> {
    let (n_a, n_b) = (a.values().sum::<u64>() as f64, b.values().sum::<u64>() as f64);
    let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    names
        .into_iter()
        .filter(|name| {
            let (x, y) = (a.get(*name).copied().unwrap_or(0) as f64, b.get(*name).copied().unwrap_or(0) as f64);
            let pooled = (x + y) / (n_a + n_b);
            let sigma = (pooled * (1.0 - pooled) * (1.0 / n_a + 1.0 / n_b)).sqrt();
            (x / n_a - y / n_b).abs() > SIGMAS * sigma.max(1e-9)
        })
        .map(|name| format!("{name}: {}/{} vs {}/{}", a.get(name).unwrap_or(&0), n_a, b.get(name).unwrap_or(&0), n_b))
        .collect()
}

fn set(landed: &BTreeMap<String, u64>) -> String {
    landed.keys().cloned().collect::<Vec<_>>().join(", ")
}

fn shares(landed: &BTreeMap<String, u64>) -> String {
    let total = landed.values().sum::<u64>().max(1) as f64;
    landed.iter().map(|(name, n)| format!("{name} {:.0}%", *n as f64 * 100.0 / total)).collect::<Vec<_>>().join(", ")
}

#[test]
fn every_mode_kube_proxy_implements_reaches_the_same_backends_in_the_same_shares() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let nodes = [
        NodeSpec::new(PROXY_NODE, "zone-a"),
        NodeSpec::new(AGENT_NODE, "zone-a"),
        NodeSpec::new("node-b", "zone-b"),
        NodeSpec::new("node-c", "zone-c"),
    ];
    let cluster = Cluster::start(binaries, &nodes);
    let version = cluster.binaries().kubernetes_version();
    cluster.deploy();
    cluster.namespace(NS);
    for (name, extra, _) in modes() {
        cluster.apply(&service(name, &extra));
    }
    let mut node_of = BTreeMap::new();
    let mut pods = Vec::new();
    for node in &nodes {
        let name = format!("echo-{}", &node.name[5..]);
        node_of.insert(name.clone(), node.name.clone());
        pods.push(cluster.run_pod(&node.name, PodSpec::new(NS, &name, "echo", &[8080])));
    }
    // Two pods of another app, deleted: terminating, still serving, as during a rollout's end.
    for node in ["node-b", "node-c"] {
        let name = format!("leaving-{}", &node[5..]);
        node_of.insert(name.clone(), node.to_owned());
        let pod = cluster.run_pod(node, PodSpec::new(NS, &name, "leaving", &[8080]));
        cluster.delete_pod(&pod);
        pods.push(pod);
    }
    for (name, extra, _) in modes() {
        let hinted = extra["spec"]["trafficDistribution"].is_string()
            || extra["metadata"]["annotations"]["service.kubernetes.io/topology-mode"].is_string();
        eventually(&format!("{name}'s slices"), Duration::from_secs(60), || {
            let endpoints = cluster.endpoints(NS, name);
            let settled = match name {
                "terminating" => endpoints.iter().filter(|e| !e.ready && e.serving && e.terminating).count() == 2,
                _ => endpoints.iter().filter(|e| e.ready && (!hinted || e.for_zones.is_some())).count() == nodes.len(),
            };
            settled.then_some(()).ok_or_else(|| format!("{endpoints:?}"))
        });
    }

    let agent = cluster.start_agent(AGENT_NODE, &[]);
    let pins = cluster.node(AGENT_NODE).pins().to_path_buf();
    let by_agent = cluster.client_on(AGENT_NODE);
    let mut targets = BTreeMap::new();
    let mut agent_landed = BTreeMap::new();
    for (mode, _, _) in modes() {
        let key = format!("{NS}/{mode}");
        let explained = explained_backends(&agent.explain(&key));
        eventually(&format!("{mode} programmed on {AGENT_NODE}"), Duration::from_secs(30), || {
            let status = kernel_status(&pins);
            (kernel_backends(&status, &format!("{key}:")) == explained).then_some(()).ok_or_else(|| status.to_string())
        });
        let ip = cluster
            .kubectl(&["-n", NS, "get", "service", mode, "-o", "jsonpath={.spec.clusterIP}"])
            .ok()
            .and_then(|ip| ip.trim().parse::<IpAddr>().ok())
            .unwrap_or_else(|| panic!("Service {key}'s ClusterIP"));
        let target = SocketAddr::new(ip, 80);
        let report = by_agent.place.tcp(target, CONNECTIONS);
        assert_eq!(report.failures(), 0, "{mode} through the agent: {report:?}");
        agent_landed.insert(mode, relative(&report, AGENT_NODE, &node_of));
        targets.insert(mode, target);
    }
    // kube-proxy in each mode on the same node, one after the other (each mode's start removes
    // the other's rules).
    let mut proxy_landed = BTreeMap::new();
    for proxy_mode in [ProxyMode::Nftables, ProxyMode::Iptables] {
        let mut proxy = cluster.start_kube_proxy(PROXY_NODE, proxy_mode, SyncPacing::Default);
        proxy.wait_synced(Duration::from_secs(60));
        proxy.owns_the_rules().unwrap_or_else(|why| panic!("{why}"));
        let by_proxy = cluster.client_on(PROXY_NODE);
        for (mode, _, _) in modes() {
            let report = by_proxy.place.tcp(targets[mode], CONNECTIONS);
            assert_eq!(report.failures(), 0, "{mode} through kube-proxy ({}): {report:?}", proxy_mode.flag());
            proxy_landed.insert((proxy_mode, mode), relative(&report, PROXY_NODE, &node_of));
        }
    }

    let mut rows = Vec::new();
    let mut log = Vec::new();
    let mut failures = Vec::new();
    for (mode, _, kind) in modes() {
        let ag = &agent_landed[mode];
        let (nft, ipt) = (&proxy_landed[&(ProxyMode::Nftables, mode)], &proxy_landed[&(ProxyMode::Iptables, mode)]);
        log.push(format!("{mode:<17} nftables: {}; iptables: {}; agent: {}", shares(nft), shares(ipt), shares(ag)));
        let verdict = match kind {
            Kind::ByDesign(why) => format!("differs by design: {why}"),
            // One client address: each keeps one backend for every connection.
            Kind::Parity if mode == "affinity" => {
                if [nft, ipt, ag].iter().any(|landed| landed.len() != 1) {
                    failures.push(format!("{mode}: one backend each, got {nft:?}, {ipt:?} and {ag:?}"));
                }
                rows.push(format!("| `{mode}` | one backend, kept | one backend, kept | one backend, kept | same |"));
                continue;
            }
            Kind::Parity => {
                for (proxy_mode, kp) in [("nftables", nft), ("iptables", ipt)] {
                    if kp.keys().ne(ag.keys()) {
                        failures.push(format!(
                            "{mode}: kube-proxy {proxy_mode} reached {}, the agent {}",
                            set(kp),
                            set(ag)
                        ));
                    }
                    let unequal = unequal_shares(kp, ag);
                    if !unequal.is_empty() {
                        failures.push(format!("{mode}: {proxy_mode}'s shares and the agent's differ: {unequal:?}"));
                    }
                }
                "same backends, equal shares".to_owned()
            }
        };
        rows.push(format!("| `{mode}` | {} | {} | {} | {verdict} |", set(nft), set(ipt), set(ag)));
    }
    eprintln!("live parity with kube-proxy ({version}), {CONNECTIONS} connections each:\n{}", log.join("\n"));
    assert!(failures.is_empty(), "kube-proxy and the agent differ:\n{}", failures.join("\n"));
    check_table(&version, &rows);
}

/// Compares the rows with `docs/policy.md`'s table (or rewrites it when asked).
fn check_table(version: &str, rows: &[String]) {
    const BEGIN: &str = "<!-- live-parity:begin (cargo test -p topology-tests --test e2e_parity) -->\n";
    const END: &str = "<!-- live-parity:end -->";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/policy.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table = format!(
        "{BEGIN}Measured on {version}'s kube-proxy (its defaults, `--proxy-mode=nftables`, then \
         `iptables`, on one node) and the agent on another node of the same zone, {CONNECTIONS} connections \
         each; backends named from the client's node.\n\n\
         | Service | kube-proxy nftables | kube-proxy iptables | the agent | |\n|---|---|---|---|---|\n{}\n",
        rows.join("\n")
    );
    let (start, end) = match (doc.find(BEGIN), doc.find(END)) {
        (Some(start), Some(end)) if start < end => (start, end),
        _ => panic!("{} has no live-parity markers", path.display()),
    };
    if std::env::var_os("TOPOLOGY_UPDATE_DOCS").is_some() {
        let updated = format!("{}{table}{}", &doc[..start], &doc[end..]);
        std::fs::write(&path, updated).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    assert_eq!(
        &doc[start..end],
        table,
        "docs/policy.md's live parity table changed: read the difference, then rerun with TOPOLOGY_UPDATE_DOCS=1"
    );
}
