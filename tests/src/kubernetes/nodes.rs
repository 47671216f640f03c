//! Nodes without a kubelet: a network namespace on the underlay (the node's "host"), a child
//! cgroup (the node's cgroup root, where its agent attaches and its pods run), and a Node object
//! the harness keeps Ready as a kubelet would — registered with zone and region labels, a pod
//! CIDR, capacity and allocatable CPU, its status and its Lease renewed with the node's own
//! credentials (`system:node:<name>`, so Node authorization and NodeRestriction apply).

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    path::PathBuf,
    time::Duration,
};

use k8s_openapi::api::{coordination::v1::Lease, core::v1::Node as NodeObject};
use kube::{
    Client,
    api::{Api, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::network;
use crate::{
    net::Host,
    sandbox::{CgroupGuard, PinGuard},
};

/// How often the harness renews each node's Lease, as kubelet does (every 10 s of a 40 s lease).
const LEASE_RENEWAL: Duration = Duration::from_secs(10);
/// How often it reports the node's status when nothing changed (kubelet: 5 minutes at most).
const STATUS_REPORT: Duration = Duration::from_secs(60);

/// A node to make.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    /// Its name (`kubernetes.io/hostname` too).
    pub name: String,
    /// `topology.kubernetes.io/zone`.
    pub zone: String,
    /// `topology.kubernetes.io/region`, if any.
    pub region: Option<String>,
    /// Allocatable CPUs (what the EndpointSlice controller weighs zones by for hints).
    pub cpu: u32,
}

impl NodeSpec {
    /// A node of 4 CPUs in `zone`, without a region.
    pub fn new(name: &str, zone: &str) -> Self {
        Self { name: name.to_owned(), zone: zone.to_owned(), region: None, cpu: 4 }
    }

    /// The same in `region`.
    pub fn in_region(mut self, region: &str) -> Self {
        self.region = Some(region.to_owned());
        self
    }

    /// The same with `cpu` allocatable CPUs.
    pub fn with_cpu(mut self, cpu: u32) -> Self {
        self.cpu = cpu;
        self
    }
}

/// A node of the cluster.
pub struct Node {
    /// What it was made as.
    pub spec: NodeSpec,
    /// Its number (1-based): its address and pod CIDR derive from it.
    pub index: u8,
    /// Its client, with the node's credentials.
    pub(super) client: Client,
    /// Its kubeconfig (the node's credentials).
    pub kubeconfig: PathBuf,
    pub(super) next_pod: std::sync::atomic::AtomicU8,
    pub(super) heartbeat: CancellationToken,
    /// The directory of its pods' namespace files, as a runtime pins them in the node's
    /// `/run/netns` (links to `ip netns`'s files, which every node shares here).
    pub(super) netns_dir: PathBuf,
    /// Its pin directory, for its agent.
    pub(super) pins: PinGuard,
    /// Its cgroup root.
    pub(super) cgroup: CgroupGuard,
    /// Its namespace on the underlay.
    pub(super) host: Host,
    /// Whether kube-proxy runs here: its pods route the ClusterIP range to it.
    pub(super) proxied: std::sync::atomic::AtomicBool,
}

impl Node {
    /// Its address on the underlay.
    pub fn address(&self) -> Ipv4Addr {
        network::node_address(self.index)
    }

    /// Its network namespace's name (the node's host network).
    pub fn netns(&self) -> &str {
        self.host.netns.name()
    }

    /// Its cgroup root: the agent attaches here, its pods' processes run here.
    pub fn cgroup(&self) -> &std::path::Path {
        self.cgroup.path()
    }

    /// Its agent's pin directory.
    pub fn pins(&self) -> &std::path::Path {
        self.pins.path()
    }

    /// Lists a pod's namespace among the node's.
    fn adopt_netns(&self, name: &str) {
        let link = self.netns_dir.join(name);
        std::os::unix::fs::symlink(crate::netns::path(name), &link)
            .unwrap_or_else(|e| panic!("linking {}: {e}", link.display()));
    }

    /// A pod namespace on this node with the next free address of its pod CIDR: its address, and
    /// the namespace, listed among the node's.
    pub(super) fn attach_pod(&self) -> (Ipv4Addr, Ipv6Addr, crate::sandbox::NetnsGuard) {
        let (ip, n) = self.allocate_pod_address();
        let ip6 = network::pod_address_v6(self.index, n);
        let netns = network::attach_pod(self.netns(), &format!("p{n}"), ip, ip6);
        if self.proxied.load(std::sync::atomic::Ordering::Relaxed) {
            super::proxy::route_services(netns.name());
        }
        self.adopt_netns(netns.name());
        (ip, ip6, netns)
    }

    /// The next free address of its pod CIDR.
    fn allocate_pod_address(&self) -> (Ipv4Addr, u8) {
        let n = self.next_pod.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        assert!((2..255).contains(&n), "node {} has no pod address left", self.spec.name);
        (network::pod_address(self.index, n), n)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.heartbeat.cancel();
    }
}

/// The Node object as a cluster's provisioning creates it: labels a kubelet may set on itself,
/// and the pod CIDR node IPAM would assign.
pub fn node_object(spec: &NodeSpec, index: u8) -> Value {
    let mut labels = json!({
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "topology.kubernetes.io/zone": spec.zone,
    });
    if let Some(region) = &spec.region {
        labels["topology.kubernetes.io/region"] = region.as_str().into();
    }
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "spec": {"podCIDR": network::pod_cidr(index), "podCIDRs": [network::pod_cidr(index), network::pod_cidr_v6(index)]},
    })
}

/// The node's status as its kubelet reports it: Ready, its address, what it has.
fn node_status(spec: &NodeSpec, index: u8, kubelet_version: &str) -> Value {
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let condition = |kind: &str, status: &str, reason: &str| json!({"type": kind, "status": status, "reason": reason, "lastHeartbeatTime": now, "lastTransitionTime": now});
    let resources = json!({"cpu": spec.cpu.to_string(), "memory": "16Gi", "pods": "110", "ephemeral-storage": "100Gi"});
    json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("Ready", "True", "KubeletReady"),
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": network::node_address(index).to_string()},
            {"type": "Hostname", "address": spec.name},
        ],
        "nodeInfo": {
            "kubeletVersion": kubelet_version, "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": "amd64", "containerRuntimeVersion": "none://topology-e2e", "kernelVersion": "",
            "osImage": "topology-agent e2e", "machineID": "", "systemUUID": "", "bootID": "",
        },
    }})
}

/// Registers the node (its object by the admin, its status and Lease by the node) and keeps it
/// Ready until `stop` is cancelled.
pub async fn register(
    admin: Client,
    node: Client,
    spec: NodeSpec,
    index: u8,
    version: String,
    stop: CancellationToken,
) {
    let nodes: Api<NodeObject> = Api::all(admin);
    let object: NodeObject = serde_json::from_value(node_object(&spec, index)).expect("a Node");
    nodes.create(&PostParams::default(), &object).await.unwrap_or_else(|e| panic!("creating Node {}: {e}", spec.name));
    report_status(&node, &spec, index, &version).await;
    renew_lease(&node, &spec.name).await;
    tokio::spawn(async move {
        let mut since_status = Duration::ZERO;
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(LEASE_RENEWAL) => {}
            }
            renew_lease(&node, &spec.name).await;
            since_status += LEASE_RENEWAL;
            if since_status >= STATUS_REPORT {
                since_status = Duration::ZERO;
                report_status(&node, &spec, index, &version).await;
            }
        }
    });
}

async fn report_status(node: &Client, spec: &NodeSpec, index: u8, version: &str) {
    let nodes: Api<NodeObject> = Api::all(node.clone());
    let status = node_status(spec, index, version);
    if let Err(error) = nodes.patch_status(&spec.name, &PatchParams::default(), &Patch::Merge(&status)).await {
        // The API server may be restarting (a test restarts it): the next report retries.
        eprintln!("node {}: reporting status: {error}", spec.name);
    }
}

async fn renew_lease(node: &Client, name: &str) {
    let leases: Api<Lease> = Api::namespaced(node.clone(), "kube-node-lease");
    let now = humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string();
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": name, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": now},
    });
    if let Err(error) = leases.patch(name, &PatchParams::apply("kubelet").force(), &Patch::Apply(&lease)).await {
        eprintln!("node {name}: renewing its Lease: {error}");
    }
}
