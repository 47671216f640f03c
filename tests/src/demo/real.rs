//! The demo on the real Kubernetes (`cargo xtask demo --control-plane real`): the same plan —
//! zones, nodes, backends, a Service per policy beside its twin — on the control plane of
//! `crate::kubernetes`. The Services are applied to the real API server (with the plan's
//! ClusterIPs), the backends are Pods selected by them, the real EndpointSlice controller writes
//! the slices and hints, and each node runs the agent as `deploy/` deploys it. A backend that dies
//! is reported not ready, as kubelet reports a failed readiness probe; the controller does the
//! rest. One more node, in the first zone, runs the real kube-proxy (nftables, its defaults) and
//! no agent: each Service measured from it is the report's kube-proxy column. It has one CPU, so
//! the controller's hints (by zone CPU) stay as the plan's nodes make them.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::{
    DemoNodes,
    plan::{BACKEND_PORT, BYTES_SERVICES, DemoConfig, KUBE_DNS, NodePlan, Plan, Removed},
};
use crate::{
    kubernetes::{
        Binaries, ClientPod, Cluster,
        agents::AgentPod,
        nodes::NodeSpec,
        pods::{Pod, PodSpec},
        proxy::{KubeProxy, ProxyMode, SyncPacing},
    },
    net::ClientPlace,
};

/// The demo's namespace, as the plan's DNS names have it.
const NAMESPACE: &str = "demo";
/// The label every backend Pod carries and every demo Service selects.
const APP: &str = "demo-backend";

/// The demo running on the real control plane; torn down on drop.
pub struct RealDemo {
    plan: Plan,
    dir: PathBuf,
    /// `Kubernetes v1.35.4`, as kube-apiserver says.
    pub version: String,
    clients: Vec<ClientPod>,
    /// Per node, a second client pod.
    neighbours: Vec<ClientPod>,
    agents: Vec<AgentPod>,
    pods: Vec<Pod>,
    /// The kube-proxy node, its client pod and its kube-proxy.
    proxy_node: NodePlan,
    proxy_client: ClientPod,
    _kube_proxy: KubeProxy,
    // Dropped last: its processes, namespaces and cgroups.
    cluster: Cluster,
}

impl RealDemo {
    /// Starts the control plane, applies `deploy/` and the plan, runs a Pod per backend and the
    /// agent on every node; returns once every agent is ready.
    pub fn start(config: &DemoConfig, dir: &Path, binaries: Binaries) -> Self {
        let plan = Plan::new(config);
        std::fs::create_dir_all(dir).expect("demo directory");
        let version = binaries.kubernetes_version();
        let nodes: Vec<NodeSpec> =
            plan.nodes.iter().map(|node| NodeSpec::new(&node.name, &node.zone).in_region(&node.region)).collect();
        let mut cluster = Cluster::start(binaries, &nodes);
        let first = &plan.nodes[0];
        let proxy_node = NodePlan {
            name: format!("kube-proxy-{}", first.zone.trim_start_matches("zone-")),
            zone: first.zone.clone(),
            region: first.region.clone(),
        };
        cluster.add_node(NodeSpec::new(&proxy_node.name, &proxy_node.zone).in_region(&proxy_node.region).with_cpu(1));
        cluster.deploy();
        cluster.namespace(NAMESPACE);
        for object in services(&plan) {
            cluster.apply(&object);
        }
        let pods = plan
            .backends
            .iter()
            .map(|backend| {
                let node = &plan.nodes[backend.node].name;
                cluster.run_pod(node, PodSpec::new(NAMESPACE, &backend.name, APP, &[BACKEND_PORT]))
            })
            .collect();
        let agents = plan.nodes.iter().map(|node| cluster.start_agent(&node.name, &[])).collect();
        let clients = plan.nodes.iter().map(|node| cluster.client_on(&node.name)).collect();
        let neighbours = plan.nodes.iter().map(|node| cluster.client_on(&node.name)).collect();
        let mut kube_proxy = cluster.start_kube_proxy(&proxy_node.name, ProxyMode::Nftables, SyncPacing::Default);
        kube_proxy.wait_synced(std::time::Duration::from_secs(120));
        let proxy_client = cluster.client_on(&proxy_node.name);
        Self {
            plan,
            dir: dir.to_path_buf(),
            version,
            clients,
            neighbours,
            agents,
            pods,
            proxy_node,
            proxy_client,
            _kube_proxy: kube_proxy,
            cluster,
        }
    }

    fn backends_in(&self, zone: &str) -> Vec<usize> {
        (0..self.plan.backends.len()).filter(|&i| self.plan.nodes[self.plan.backends[i].node].zone == zone).collect()
    }
}

/// The plan's Services as the real API server takes them: the demo's, selecting the backend Pods
/// (with the plan's ClusterIPs, inside the API server's range), and `kube-system/kube-dns` at the
/// plan's address, which every node's agent steers to its own responder. No EndpointSlice: the
/// controller writes them.
fn services(plan: &Plan) -> Vec<Value> {
    let bytes: Vec<&str> = BYTES_SERVICES.iter().map(|(name, ..)| *name).collect();
    // The plan's slices are written for addresses of its own; only its Services are taken here.
    let addresses = vec![std::net::Ipv4Addr::UNSPECIFIED; plan.backends.len()];
    let mut objects: Vec<Value> = plan
        .objects(&addresses, KUBE_DNS, Removed::Nothing)
        .into_iter()
        .filter(|object| object["kind"] == "Service" && object["metadata"]["namespace"] == NAMESPACE)
        .filter(|object| !bytes.contains(&object["metadata"]["name"].as_str().unwrap_or_default()))
        .map(|mut object| {
            object["spec"]["selector"] = json!({"app": APP});
            object["spec"]["ports"][0]["targetPort"] = BACKEND_PORT.into();
            object
        })
        .collect();
    objects.push(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system"},
        "spec": {"clusterIP": KUBE_DNS.to_string(), "ports": [
            {"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]},
    }));
    objects
}

impl DemoNodes for RealDemo {
    fn plan(&self) -> &Plan {
        &self.plan
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn place(&self, index: usize) -> ClientPlace {
        self.clients[index].place.clone()
    }

    fn second_place(&self, index: usize) -> ClientPlace {
        self.neighbours[index].place.clone()
    }

    fn kube_proxy(&self) -> Option<(ClientPlace, &NodePlan)> {
        Some((self.proxy_client.place.clone(), &self.proxy_node))
    }

    fn explain(&self, index: usize) -> Value {
        let agent = &self.agents[index];
        let kubeconfig = agent.kubeconfig.to_string_lossy();
        let dns = format!("{}:5353", agent.ip);
        let text = agent
            .exec(&[
                "explain",
                "--kubeconfig",
                &kubeconfig,
                "--node",
                &agent.node,
                "--dns-listen",
                &dns,
                "--output",
                "json",
            ])
            .unwrap_or_else(|error| panic!("explain on {}: {error}", agent.node));
        serde_json::from_str(&text).expect("explain JSON")
    }

    fn kill_zone(&mut self, zone: &str) -> usize {
        let in_zone = self.backends_in(zone);
        for &i in &in_zone {
            self.cluster.kill_server(&mut self.pods[i]);
        }
        in_zone.len()
    }

    fn restart_zone(&mut self, zone: &str) {
        for i in self.backends_in(zone) {
            self.restart_backend(i);
        }
    }

    fn kill_backend(&mut self, index: usize) {
        self.cluster.kill_server(&mut self.pods[index]);
    }

    fn restart_backend(&mut self, index: usize) {
        if !self.cluster.serving(&self.pods[index]) {
            self.cluster.start_server(&mut self.pods[index]);
        }
    }

    fn set_removed(&self, removed: Removed<'_>) {
        for (i, pod) in self.pods.iter().enumerate() {
            let backend = &self.plan.backends[i];
            let out = match removed {
                Removed::Nothing => false,
                Removed::Zone(zone) => self.plan.nodes[backend.node].zone == zone,
                Removed::Backend(name) => backend.name == name,
            };
            self.cluster.report(pod, !out);
        }
    }

    fn removal(&self) -> &'static str {
        "left the EndpointSlices (the pods reported not ready, the real EndpointSlice controller's update)"
    }
}
