//! The real Kubernetes on this machine: etcd, kube-apiserver and kube-controller-manager built
//! from their own Go modules (`cargo xtask setup`), started in a network namespace of their own;
//! nodes as namespaces and cgroups whose Node objects the harness keeps Ready; pods as processes
//! whose Pod objects it moves through their life. No kubelet and no container runtime; the real
//! EndpointSlice controller writes every slice and every hint — the harness never writes one.
//!
//! Everything is torn down on drop (on panic too): processes, namespaces, cgroups, pins and the
//! scratch directory; names carry the test's pid, so a killed run's leftovers are swept by the
//! next run (`sandbox::sweep_stale`). Nothing leaves the machine: no namespace has a default
//! route, and the host's own network is not connected.

pub mod agents;
mod api;
pub mod binaries;
pub mod bulk;
mod components;
pub mod control_plane;
pub mod coredns;
pub mod counted;
pub mod in_process;
mod kubeconfig;
pub mod load;
pub mod network;
pub mod nodes;
pub mod observe;
mod pki;
pub mod pods;
pub mod proxy;

use std::{
    net::Ipv4Addr,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, Instant},
};

pub use api::{ApiClients, ApplyError, describe};
pub use binaries::Binaries;
pub use control_plane::Component;
use control_plane::ControlPlane;
use kube::Client;
pub use kubeconfig::Credentials;
use nodes::{Node, NodeSpec};
use pki::Pki;
use pods::{Pod, PodSpec};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::{
    net::{ClientPlace, Host, Network, probe_binary},
    netns,
    sandbox::{CgroupGuard, PinGuard, ProcessGuard, unique_id},
};

/// A running cluster. Dropping it tears everything down.
pub struct Cluster {
    id: String,
    dir: PathBuf,
    binaries: Binaries,
    pki: Pki,
    admin_kubeconfig: PathBuf,
    // Dropped in this order: the clients and heartbeats, the nodes (cgroups with their pods'
    // processes, pins, namespaces), the control plane's processes, its namespace, the fabric.
    api: ApiClients,
    nodes: Vec<Node>,
    control_plane: ControlPlane,
    control_plane_host: Host,
    network: Network,
}

impl Cluster {
    /// Starts etcd, the API server and the controller manager, waits until the API server is
    /// ready and the controllers have done their first work (the `default` ServiceAccount and CA
    /// ConfigMap exist), then registers `nodes`.
    pub fn start(binaries: Binaries, nodes: &[NodeSpec]) -> Self {
        let id = unique_id();
        let dir = std::env::temp_dir().join(format!("{id}-cluster"));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        let pki = Pki::generate(&dir.join("pki"));
        let mut network = Network::new(&id);
        let address = network::control_plane_address();
        let control_plane_host = network.host_at("cp", (address, 24), (network::underlay_v6(address), 64));
        let cgroup = CgroupGuard::new(&format!("{id}-cp"));
        let mut control_plane =
            ControlPlane::new(binaries.clone(), &dir, control_plane_host.netns.name(), address, &pki, cgroup);
        let admin_kubeconfig = dir.join("admin.kubeconfig");
        let admin = pki.client("admin", "kubernetes-admin", Some("system:masters"));
        kubeconfig::write(
            &admin_kubeconfig,
            &control_plane.server(),
            &pki.ca.cert,
            "kubernetes-admin",
            &Credentials::Certificate(admin),
        );
        control_plane.start(Component::Etcd);
        control_plane.start(Component::ApiServer);
        let api = ApiClients::new(control_plane_host.netns.name(), &admin_kubeconfig);
        let mut cluster = Self {
            id,
            dir,
            binaries,
            pki,
            admin_kubeconfig,
            api,
            nodes: Vec::new(),
            control_plane,
            control_plane_host,
            network,
        };
        cluster.wait_api_ready(Duration::from_secs(90));
        cluster.control_plane.start(Component::ControllerManager);
        cluster.wait_namespace_ready("default", Duration::from_secs(90));
        for spec in nodes {
            cluster.add_node(spec.clone());
        }
        cluster
    }

    /// The scratch directory (kubeconfigs, certificates, logs, etcd's data).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The components' binaries.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The admin's kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The API server's URL.
    pub fn server(&self) -> String {
        self.control_plane.server()
    }

    /// The control plane's processes.
    pub fn control_plane(&mut self) -> &mut ControlPlane {
        &mut self.control_plane
    }

    /// The harness's clients (blocking calls in the control plane's namespace).
    pub fn api(&self) -> &ApiClients {
        &self.api
    }

    /// The admin's client.
    pub fn admin(&self) -> Client {
        self.api.admin()
    }

    /// Restarts a control-plane component (SIGTERM, then start again) and waits until the API
    /// server is ready again.
    pub fn restart(&mut self, component: Component) {
        self.control_plane.stop(component);
        self.control_plane.start(component);
        if component != Component::ControllerManager {
            self.wait_api_ready(Duration::from_secs(90));
        }
    }

    /// Compacts etcd past every resourceVersion handed out (see [`ControlPlane::compact_etcd`]).
    pub fn compact_etcd(&self) -> u64 {
        self.control_plane.compact_etcd()
    }

    /// Waits until the API server's `/readyz` says ok.
    pub fn wait_api_ready(&mut self, timeout: Duration) {
        let control_plane = &mut self.control_plane;
        self.api.wait_ready(timeout, || control_plane.running(Component::ApiServer));
    }

    /// Server-side applies an object as the admin; returns what the server stored.
    pub fn apply(&self, object: &Value) -> Value {
        self.api.apply(object)
    }

    /// Creates a namespace and waits until pods can be admitted into it (its `default`
    /// ServiceAccount, which admission requires, and its CA ConfigMap exist).
    pub fn namespace(&self, name: &str) {
        self.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}));
        self.wait_namespace_ready(name, Duration::from_secs(60));
    }

    fn wait_namespace_ready(&self, namespace: &str, timeout: Duration) {
        let admin = self.admin();
        let namespace = namespace.to_owned();
        eventually(&format!("namespace {namespace}'s ServiceAccount and CA"), timeout, || {
            let (admin, namespace) = (admin.clone(), namespace.clone());
            self.api.block(async move {
                use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
                let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(admin.clone(), &namespace);
                let maps: kube::Api<ConfigMap> = kube::Api::namespaced(admin, &namespace);
                let account = accounts.get_opt("default").await.map_err(|e| e.to_string())?;
                let ca = maps.get_opt("kube-root-ca.crt").await.map_err(|e| e.to_string())?;
                match (account, ca) {
                    (Some(_), Some(_)) => Ok(()),
                    _ => Err("not yet".to_owned()),
                }
            })
        });
    }

    /// Adds a node: its namespace on the underlay, its cgroup, its credentials and its Ready
    /// Node object, kept Ready from now on.
    pub fn add_node(&mut self, spec: NodeSpec) -> &Node {
        let index = u8::try_from(self.nodes.len() + 1).expect("at most 200 nodes");
        assert!(index < 200, "at most 199 nodes");
        let address = network::node_address(index);
        let host = self.network.host_at(&format!("n{index}"), (address, 24), (network::underlay_v6(address), 64));
        network::enable_forwarding(host.netns.name());
        let others: Vec<u8> = self.nodes.iter().map(|node| node.index).collect();
        network::route_pod_cidrs(host.netns.name(), &others, None);
        // Every other node and the control plane learn the new node's pod CIDR.
        for node in &self.nodes {
            network::route_pod_cidrs(node.netns(), &[index], None);
        }
        network::route_pod_cidrs(self.control_plane_host.netns.name(), &[index], None);
        let user = format!("system:node:{}", spec.name);
        let files = self.pki.client(&format!("node-{}", spec.name), &user, Some("system:nodes"));
        let kubeconfig = self.dir.join(format!("node-{}.kubeconfig", spec.name));
        kubeconfig::write(&kubeconfig, &self.server(), &self.pki.ca.cert, &user, &Credentials::Certificate(files));
        let client = self.api.client_of(&kubeconfig);
        let netns_dir = self.dir.join("netns").join(&spec.name);
        std::fs::create_dir_all(&netns_dir).unwrap_or_else(|e| panic!("creating {}: {e}", netns_dir.display()));
        let heartbeat = CancellationToken::new();
        let version = self.binaries.kubernetes_version().trim_start_matches("Kubernetes ").to_owned();
        let (admin, node_client, registered, stop) = (self.admin(), client.clone(), spec.clone(), heartbeat.clone());
        self.api.block(nodes::register(admin, node_client, registered, index, version, stop));
        self.nodes.push(Node {
            spec,
            index,
            client,
            kubeconfig,
            next_pod: std::sync::atomic::AtomicU8::new(2),
            heartbeat,
            netns_dir,
            pins: PinGuard::new(&format!("{}-n{index}", self.id)),
            cgroup: CgroupGuard::new(&format!("{}-n{index}", self.id)),
            host,
            proxied: std::sync::atomic::AtomicBool::new(false),
        });
        self.nodes.last().expect("just added")
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> &Node {
        self.nodes.iter().find(|node| node.spec.name == name).unwrap_or_else(|| panic!("no node {name}"))
    }

    /// Runs a pod on `node`: its object, its namespace and server, then Running and Ready.
    pub fn run_pod(&self, node: &str, spec: PodSpec) -> Pod {
        let mut pod = self.create_pod(node, spec);
        self.start_server(&mut pod);
        self.report(&pod, true);
        pod
    }

    /// Creates a pod's object and namespace on `node`, starting nothing (Pending).
    pub fn create_pod(&self, node: &str, spec: PodSpec) -> Pod {
        let node = self.node(node);
        let uid = self.api.block(pods::create(self.admin(), pods::pod_object(&spec, &node.spec.name)));
        let (ip, ip6, netns) = node.attach_pod();
        Pod { spec, node: node.spec.name.clone(), ip, ip6, uid, node_client: node.client.clone(), server: None, netns }
    }

    /// Starts the pod's server (answering with the pod's name on its ports, TCP and UDP) in the
    /// node's cgroup.
    pub fn start_server(&self, pod: &mut Pod) {
        let node = self.node(&pod.node);
        let mut command = Command::new(probe_binary());
        command.args(["--netns", pod.netns()]).arg("--cgroup").arg(node.cgroup());
        command.args(["serve", "--name", &pod.spec.name]);
        for port in &pod.spec.ports {
            for address in [format!("{}:{port}", pod.ip), format!("[{}]:{port}", pod.ip6)] {
                command.args(["--tcp", &address, "--udp", &address]);
            }
        }
        pod.server = Some(ProcessGuard::spawn_ready(&mut command, &format!("pod {}", pod.key())));
    }

    /// Kills the pod's server (SIGKILL, as when its container dies), telling the cluster nothing.
    pub fn kill_server(&self, pod: &mut Pod) {
        pod.server.take();
    }

    /// Whether the pod's server runs.
    pub fn serving(&self, pod: &Pod) -> bool {
        pod.server.is_some()
    }

    /// Reports the pod Running, Ready or not, as its node.
    pub fn report(&self, pod: &Pod, ready: bool) {
        let node = self.node(&pod.node);
        let (namespace, name) = (pod.spec.namespace.clone(), pod.spec.name.clone());
        let ips = (pod.ip, pod.ip6);
        self.api.block(pods::report(pod.node_client.clone(), namespace, name, ips, node.address(), ready));
    }

    /// Deletes the pod gracefully (it is terminating, still serving, until [`Cluster::remove_pod`]).
    pub fn delete_pod(&self, pod: &Pod) {
        self.api.block(pods::delete_gracefully(self.admin(), pod.spec.namespace.clone(), pod.spec.name.clone()));
    }

    /// Stops the pod's process and removes its object for good, as its node does at the end of a
    /// termination.
    pub fn remove_pod(&self, mut pod: Pod) {
        pod.server.take();
        let (client, namespace, name, uid) =
            (pod.node_client.clone(), pod.spec.namespace.clone(), pod.spec.name.clone(), pod.uid.clone());
        self.api.block(pods::remove(client, namespace, name, uid));
    }

    /// A client process's place on `node`: a pod network namespace (an address of the node's pod
    /// CIDR, no Pod object: only the node matters to where its connections go) in the node's
    /// cgroup, where the agent's programs see its sockets.
    pub fn client_on(&self, node: &str) -> ClientPod {
        let node = self.node(node);
        let (ip, ip6, netns) = node.attach_pod();
        let place = ClientPlace { netns: netns.name().to_owned(), cgroup: node.cgroup().to_path_buf(), cpu: None };
        ClientPod { ip, ip6, place, _netns: netns }
    }

    /// `kubectl ARGS` as the admin, in the control plane's namespace; its stdout, or its stderr
    /// as the error.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let mut command = Command::new("kubectl");
        command.arg("--kubeconfig").arg(&self.admin_kubeconfig).args(args);
        netns::enter_on_spawn(&mut command, self.control_plane_host.netns.name());
        let output = command.output().map_err(|e| format!("kubectl: {e}"))?;
        match output.status.success() {
            true => Ok(String::from_utf8_lossy(&output.stdout).into_owned()),
            false => Err(String::from_utf8_lossy(&output.stderr).into_owned()),
        }
    }

    /// The cluster's fabric, for hosts beside it (a stand-in for the outside).
    pub fn network(&mut self) -> &mut Network {
        &mut self.network
    }

    /// Gives `host` (beside the cluster on its fabric, a stand-in for the outside) the routes a
    /// VPC carries: every present node's pod CIDR through that node, so that pods reach it through
    /// their node and its answers find them.
    pub fn reach_pods_from(&self, host: &Host) {
        let nodes: Vec<u8> = self.nodes.iter().map(|node| node.index).collect();
        network::route_pod_cidrs(host.netns.name(), &nodes, None);
    }

    /// The control plane's namespace.
    pub fn control_plane_netns(&self) -> &str {
        self.control_plane_host.netns.name()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for node in &self.nodes {
            node.heartbeat.cancel();
        }
        if std::thread::panicking() {
            // The next run's sweep removes the directory: what it says goes to the test's output.
            let logs = self.dir.join("logs");
            let mut files: Vec<PathBuf> =
                std::fs::read_dir(&logs).into_iter().flatten().flatten().map(|entry| entry.path()).collect();
            files.sort();
            for file in files {
                let text = std::fs::read_to_string(&file).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(25).collect();
                eprintln!("--- the last lines of {} ---", file.display());
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client's place on a node (see [`Cluster::client_on`]); its namespace goes with it.
pub struct ClientPod {
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its IPv6 address.
    pub ip6: std::net::Ipv6Addr,
    /// Where its probe clients run.
    pub place: ClientPlace,
    _netns: crate::sandbox::NetnsGuard,
}

/// Retries `check` until it passes, or panics with its last answer after `timeout`.
pub fn eventually<T>(what: &str, timeout: Duration, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => panic!("{what}: not after {timeout:?}: {why}"),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}
