//! The control plane failing under the agents (root, real kernel): the API server restarted, etcd
//! restarted, and etcd compacted while the API server was down, each under load from every node.
//! No connection fails (the kernel keeps what it was given), and the API server's own audit log
//! says what each agent asked of it afterwards: watches resumed from their resourceVersion, at
//! most one list per watched kind — and exactly one, consistent, after 410 Gone — never a storm.
//! `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::{IpAddr, SocketAddr},
    time::Duration,
};

use serde_json::json;
use topology_tests::{
    kubernetes::{
        Binaries, Cluster, Component,
        agents::AgentPod,
        eventually,
        load::{Load, total},
        nodes::NodeSpec,
        observe::{Audited, kernel_backends, kernel_status},
        pods::PodSpec,
    },
    require_root,
};

const NS: &str = "steady";
/// The kinds each agent lists and watches.
const KINDS: [&str; 3] = ["services", "endpointslices", "nodes"];

/// Per agent pod and kind: (lists, watches) among `requests`.
fn requests_by_pod(requests: &[Audited]) -> BTreeMap<(String, String), (usize, usize)> {
    let mut counts: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    for request in requests.iter().filter(|r| r.by_the_agent() && KINDS.contains(&r.resource.as_str())) {
        let entry = counts.entry((request.pod.clone(), request.resource.clone())).or_default();
        match request.verb.as_str() {
            "list" if request.stage == "ResponseComplete" => entry.0 += 1,
            "watch" if request.stage == "ResponseStarted" => entry.1 += 1,
            _ => {}
        }
    }
    counts
}

/// Waits until every agent pod has listed every kind after `mark`; names the agents' 410 lines
/// when one has not.
fn relisted(cluster: &mut Cluster, pods: &[String], mark: usize, agents: &[AgentPod]) {
    eventually("every agent relisted every kind after the compaction", Duration::from_secs(60), || {
        let since: Vec<Audited> = cluster.audited().into_iter().skip(mark).collect();
        let counts = requests_by_pod(&since);
        for pod in pods {
            for kind in KINDS {
                if counts.get(&(pod.clone(), kind.to_owned())).is_none_or(|(lists, _)| *lists == 0) {
                    let log = agents.iter().find(|agent| &agent.name == pod).map(|agent| {
                        let text = std::fs::read_to_string(&agent.log).unwrap_or_default();
                        text.lines().filter(|line| line.contains("410") || line.contains("relist")).count()
                    });
                    return Err(format!("{pod} has not listed {kind}: {counts:?}; 410/relist lines: {log:?}"));
                }
            }
        }
        Ok(())
    });
}

/// Waits until every agent pod has a watch of every kind opened after `mark`.
fn watches_back(cluster: &mut Cluster, pods: &[String], mark: usize, what: &str) {
    eventually(what, Duration::from_secs(90), || {
        let since: Vec<Audited> = cluster.audited().into_iter().skip(mark).collect();
        let counts = requests_by_pod(&since);
        for pod in pods {
            for kind in KINDS {
                if counts.get(&(pod.clone(), kind.to_owned())).is_none_or(|(_, watches)| *watches == 0) {
                    return Err(format!("{pod} has no {kind} watch yet: {counts:?}"));
                }
            }
        }
        Ok(())
    });
}

/// Lines of an agent's log saying a watch got 410 Gone.
fn gone_lines(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log).unwrap_or_default().lines().filter(|line| line.contains("(410 Gone)")).count()
}

#[test]
fn the_control_plane_restarted_under_load_fails_no_connection_and_costs_no_relist_storm() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let nodes =
        [NodeSpec::new("node-a1", "zone-a"), NodeSpec::new("node-b1", "zone-b"), NodeSpec::new("node-c1", "zone-c")];
    let mut cluster = Cluster::start(binaries, &nodes);
    cluster.deploy();
    cluster.namespace(NS);
    let service = cluster.apply(&json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": NS},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}],
                 "trafficDistribution": "PreferClose"},
    }));
    let ip: IpAddr = service["spec"]["clusterIP"].as_str().and_then(|ip| ip.parse().ok()).expect("a ClusterIP");
    let _pods: Vec<_> = nodes
        .iter()
        .map(|node| cluster.run_pod(&node.name, PodSpec::new(NS, &format!("web-{}", &node.name[5..]), "web", &[8080])))
        .collect();
    let agents: Vec<_> = nodes.iter().map(|node| cluster.start_agent(&node.name, &[])).collect();
    let pods: Vec<String> = agents.iter().map(|agent| agent.name.clone()).collect();
    eventually("every node's pod programmed", Duration::from_secs(30), || {
        match cluster
            .nodes()
            .iter()
            .all(|n| kernel_backends(&kernel_status(n.pins()), &format!("{NS}/web:")).len() == 1)
        {
            true => Ok(()),
            false => Err("not yet".to_owned()),
        }
    });
    let clients: Vec<_> = nodes.iter().map(|node| cluster.client_on(&node.name)).collect();
    let loads: Vec<Load> = clients
        .iter()
        .map(|client| Load::start(client.place.clone(), SocketAddr::new(ip, 80), Duration::from_secs(300)))
        .collect();

    let mut summary = Vec::new();
    for step in ["the API server restarted", "etcd restarted", "etcd compacted while the API server was down"] {
        let mark = cluster.audited().len();
        let gone_before: usize = agents.iter().map(|agent| gone_lines(&agent.log)).sum();
        match step {
            "the API server restarted" => cluster.restart(Component::ApiServer),
            "etcd restarted" => cluster.restart(Component::Etcd),
            _ => {
                cluster.control_plane().stop(Component::ApiServer);
                let revision = cluster.control_plane().compact_etcd();
                eprintln!("etcd compacted at revision {revision}");
                cluster.control_plane().start(Component::ApiServer);
                cluster.wait_api_ready(Duration::from_secs(90));
            }
        }
        // A restarted API server ends every watch; etcd restarting under it need not (its watch
        // cache resumes from etcd), and then the agents have nothing to do.
        if step != "etcd restarted" {
            watches_back(&mut cluster, &pods, mark, &format!("every agent watching again after {step}"));
        }
        if step.starts_with("etcd compacted") {
            // Every resume point was compacted away: each kind's 410 Gone is answered by one list,
            // which may wait for the backoff the outage grew.
            relisted(&mut cluster, &pods, mark, &agents);
        }
        // Give a storm, if there were one, the time to show.
        std::thread::sleep(Duration::from_secs(10));
        let since: Vec<Audited> = cluster.audited().into_iter().skip(mark).collect();
        let counts = requests_by_pod(&since);
        for ((pod, kind), (lists, watches)) in &counts {
            assert!(*lists <= 1, "after {step}, {pod} listed {kind} {lists} times: {since:?}");
            if step.starts_with("etcd compacted") {
                // Its resourceVersion was compacted away: 410 Gone, then exactly one list.
                assert_eq!(*lists, 1, "after {step}, {pod} listed {kind} {lists} times");
            }
            summary.push(format!("{step:<45} {pod:<24} {kind:<15} {lists} list, {watches} watch"));
        }
        // A 410 comes inside the watch's stream (its HTTP status is 200): the agents say it.
        let gone: usize = agents.iter().map(|agent| gone_lines(&agent.log)).sum::<usize>() - gone_before;
        summary.push(format!("{step:<45} 410 Gone, in the agents' logs: {gone}"));
    }

    // The view is current after it all: a second pod in zone-a reaches node-a1's kernel.
    let second = cluster.run_pod("node-a1", PodSpec::new(NS, "web-a1-2", "web", &[8080]));
    eventually("the new pod programmed on node-a1", Duration::from_secs(30), || {
        let held: BTreeSet<IpAddr> =
            kernel_backends(&kernel_status(cluster.node("node-a1").pins()), &format!("{NS}/web:"));
        match held.contains(&IpAddr::V4(second.ip)) {
            true => Ok(()),
            false => Err(format!("{held:?}")),
        }
    });
    for (node, load) in nodes.iter().zip(loads) {
        let all = total(&load.stop());
        assert_eq!(all.failures(), 0, "from {}: {all:?}", node.name);
        summary.push(format!("{}: {} connections through the three, 0 failed", node.name, all.attempts));
    }
    eprintln!("{}", summary.join("\n"));
}
