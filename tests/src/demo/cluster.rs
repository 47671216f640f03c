//! The demo cluster in the kernel: a client namespace and a cgroup per simulated node, a
//! namespace and an echo server per backend, one agent per node with its own pins, all reading
//! `cluster.yaml`. Everything is removed on drop, or left running by [`DemoCluster::keep`].

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use topology_kube::objects;

use super::plan::{BACKEND_PORT, BYTES_PORT, DemoConfig, Plan, Removed, SERVICE_PORT};
use crate::{
    agent::{Agent, AgentOptions},
    net::{ClientPlace, Host, Network, Server, ServerOptions, agent_binary},
    sandbox::{CgroupGuard, PinGuard, ProcessGuard, run, unique_id},
    traffic::Report,
};

/// Everything the demo created, in drop order.
pub struct DemoCluster {
    /// The plan.
    pub plan: Plan,
    /// Where `cluster.yaml`, the logs and the report go.
    pub dir: PathBuf,
    /// The cluster file every agent reads.
    pub cluster_file: PathBuf,
    /// Unique prefix of every kernel object the demo made.
    pub id: String,
    addresses: Vec<Ipv4Addr>,
    coredns: Ipv4Addr,
    agents: Vec<Agent>,
    _coredns: (Host, ProcessGuard),
    /// Per backend of the plan, its server (`None` while killed).
    servers: Vec<Option<Server>>,
    /// Per backend, its bulk server (`demo::bytes`).
    _bulk_servers: Vec<crate::bulk::BulkServer>,
    pins: Vec<PinGuard>,
    node_cgroups: Vec<CgroupGuard>,
    infra: CgroupGuard,
    backend_hosts: Vec<Host>,
    node_hosts: Vec<Host>,
    /// Per node, another pod's namespace (its clients run in the node's cgroup too).
    pod_hosts: Vec<Host>,
    _network: Network,
}

impl DemoCluster {
    /// Builds the cluster and starts one agent per node; returns once every agent is ready.
    pub fn start(config: &DemoConfig, dir: &Path) -> Self {
        let plan = Plan::new(config);
        std::fs::create_dir_all(dir.join("logs")).expect("demo directory");
        let id = unique_id();
        let mut network = Network::new(&id);
        // Agents and servers run here: cleanup kills whatever is left in it.
        let infra = CgroupGuard::new(&format!("{id}-infra"));
        let node_hosts: Vec<Host> = plan.nodes.iter().map(|_| network.host("n")).collect();
        let pod_hosts: Vec<Host> = plan.nodes.iter().map(|_| network.host("p")).collect();
        let backend_hosts: Vec<Host> = plan.backends.iter().map(|_| network.host("b")).collect();
        let servers = plan
            .backends
            .iter()
            .zip(&backend_hosts)
            .map(|(backend, host)| Some(start_server(dir, &infra, host, &backend.name)))
            .collect();
        let bulk_servers = backend_hosts
            .iter()
            .map(|host| crate::bulk::BulkServer::start_in(host, BYTES_PORT, false, Some(infra.path())))
            .collect();
        let addresses: Vec<Ipv4Addr> = backend_hosts.iter().map(|h| h.v4).collect();
        // The cluster DNS every name outside the demo's Services goes to.
        let coredns = crate::dns::start_upstream(&mut network, false, Some(infra.path()), None);
        let cluster_file = dir.join("cluster.yaml");
        objects::write(&cluster_file, &plan.objects(&addresses, coredns.0.v4, Removed::Nothing));

        let node_cgroups: Vec<CgroupGuard> =
            plan.nodes.iter().map(|n| CgroupGuard::new(&format!("{id}-{}", n.name))).collect();
        let pins: Vec<PinGuard> = plan.nodes.iter().map(|n| PinGuard::new(&format!("{id}-{}", n.name))).collect();
        let mut agents: Vec<Agent> = plan
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                let log = dir.join("logs").join(format!("agent-{}.log", node.name));
                // Each agent answers DNS on its node's address; the node's kube-dns traffic is
                // steered to it.
                let host = &node_hosts[i];
                Agent::start(&AgentOptions {
                    log: Some(&log),
                    home: Some(infra.path()),
                    netns: Some(host.netns.name()),
                    extra: vec![
                        "--dns-listen".into(),
                        format!("{}:53", host.v4),
                        "--dns-upstream".into(),
                        format!("{}:53", coredns.0.v4),
                    ],
                    ..AgentOptions::new(&cluster_file, &node.name, node_cgroups[i].path(), pins[i].path())
                })
            })
            .collect();
        for agent in &mut agents {
            agent.wait_ready(Duration::from_secs(30));
        }
        Self {
            plan,
            dir: dir.to_path_buf(),
            cluster_file,
            id,
            addresses,
            coredns: coredns.0.v4,
            agents,
            _coredns: coredns,
            servers,
            _bulk_servers: bulk_servers,
            pins,
            node_cgroups,
            infra,
            backend_hosts,
            node_hosts,
            pod_hosts,
            _network: network,
        }
    }

    fn backends_in(&self, zone: &str) -> Vec<usize> {
        (0..self.plan.backends.len())
            .filter(|&i| self.plan.node_of(&self.plan.backends[i].name).is_some_and(|n| n.zone == zone))
            .collect()
    }

    /// `topology-agent status --output json` of node `index`'s pins: what its kernel holds.
    pub fn status(&self, index: usize) -> serde_json::Value {
        let pins = self.pins[index].path().to_string_lossy().into_owned();
        let json = run(&agent_binary().to_string_lossy(), &["status", "--pin-path", &pins, "--output", "json"]);
        serde_json::from_str(&json).expect("status JSON")
    }

    /// Every agent's `/metrics`, in node order.
    pub fn agent_metrics(&self) -> Vec<String> {
        self.agents.iter().map(|agent| agent.get("/metrics").map(|(_, text)| text).unwrap_or_default()).collect()
    }

    /// Commands to explore a kept demo, and to remove it.
    pub fn explore_commands(&self) -> Vec<String> {
        let agent = agent_binary().display().to_string();
        let probe = crate::net::probe_binary().display().to_string();
        let first = &self.plan.nodes[0].name;
        let service = &self.plan.services[2];
        vec![
            format!("bpftool cgroup show {}", self.node_cgroups[0].path().display()),
            format!("bpftool map dump pinned {}/maps/topo_svc4", self.pins[0].path().display()),
            format!("{agent} status --pin-path {}", self.pins[0].path().display()),
            format!("{agent} explain --cluster {} --node {first}", self.cluster_file.display()),
            format!(
                "{probe} --netns {} --cgroup {} client --target {}:{SERVICE_PORT} tcp --count 10",
                self.node_hosts[0].netns.name(),
                self.node_cgroups[0].path().display(),
                service.vip
            ),
            format!(
                "edit {} and watch the agents follow (logs in {})",
                self.cluster_file.display(),
                self.dir.join("logs").display()
            ),
            "cargo xtask demo --clean    # remove it all".to_owned(),
        ]
    }

    /// Leaves everything running: agents, servers, namespaces, cgroups and pins. The next
    /// `cargo xtask demo` (or `--clean`) removes it, since its creator is gone by then.
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl super::DemoNodes for DemoCluster {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where clients of node `index` run.
    fn place(&self, index: usize) -> ClientPlace {
        ClientPlace {
            netns: self.node_hosts[index].netns.name().to_owned(),
            cgroup: self.node_cgroups[index].path().to_path_buf(),
            cpu: None,
        }
    }

    fn second_place(&self, index: usize) -> ClientPlace {
        ClientPlace {
            netns: self.pod_hosts[index].netns.name().to_owned(),
            cgroup: self.node_cgroups[index].path().to_path_buf(),
            cpu: None,
        }
    }

    /// `topology-agent explain --output json` for node `index`, with the DNS steering its agent runs.
    fn explain(&self, index: usize) -> serde_json::Value {
        let json = run(
            &agent_binary().to_string_lossy(),
            &[
                "explain",
                "--cluster",
                &self.cluster_file.to_string_lossy(),
                "--node",
                &self.plan.nodes[index].name,
                "--dns-listen",
                &format!("{}:53", self.node_hosts[index].v4),
                "--output",
                "json",
            ],
        );
        serde_json::from_str(&json).expect("explain JSON")
    }

    /// Kills the servers of `zone`'s backends (SIGKILL, as when a zone's pods die), leaving their
    /// endpoints in the cluster file; returns how many.
    fn kill_zone(&mut self, zone: &str) -> usize {
        let in_zone = self.backends_in(zone);
        for &i in &in_zone {
            // Dropping the server kills its process and waits for it.
            self.servers[i] = None;
        }
        in_zone.len()
    }

    /// Starts the killed servers of `zone` again; returns once they listen.
    fn restart_zone(&mut self, zone: &str) {
        for i in self.backends_in(zone) {
            if self.servers[i].is_none() {
                let name = &self.plan.backends[i].name;
                self.servers[i] = Some(start_server(&self.dir, &self.infra, &self.backend_hosts[i], name));
            }
        }
    }

    /// Kills backend `index`'s server (SIGKILL, as when a pod dies), leaving its endpoint in the
    /// cluster file.
    fn kill_backend(&mut self, index: usize) {
        self.servers[index] = None;
    }

    /// Starts backend `index`'s server again, if killed; returns once it listens.
    fn restart_backend(&mut self, index: usize) {
        if self.servers[index].is_none() {
            let name = &self.plan.backends[index].name;
            self.servers[index] = Some(start_server(&self.dir, &self.infra, &self.backend_hosts[index], name));
        }
    }

    /// Rewrites `cluster.yaml`, leaving out the backends `removed` names.
    fn set_removed(&self, removed: Removed<'_>) {
        objects::write(&self.cluster_file, &self.plan.objects(&self.addresses, self.coredns, removed));
    }

    fn removal(&self) -> &'static str {
        "left `cluster.yaml`"
    }
}

/// A backend's echo server, in the demo's infrastructure cgroup, logging to `logs/`.
fn start_server(dir: &Path, infra: &CgroupGuard, host: &Host, name: &str) -> Server {
    let log = dir.join("logs").join(format!("server-{name}.log"));
    let options = ServerOptions { cpu: None, home: Some(infra.path()), log: Some(&log), capacity: None };
    Server::start_with(host, name, &[BACKEND_PORT], &options)
}

/// Waits until connections from `node` to `service` satisfy `done` (checked on bursts of 20),
/// and returns how long that took.
pub fn wait_until(
    demo: &impl super::DemoNodes,
    node: usize,
    service: usize,
    within: Duration,
    done: impl Fn(&Report) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let report = demo.traffic(node, service, 20);
        if done(&report) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "no change within {within:?}: {report:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
