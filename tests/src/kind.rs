//! What the kind suite creates, rendered here so that it is checked where the suite cannot run:
//! the cluster's configuration (three workers in three zones, IPv4 or IPv6) and the workloads
//! whose behaviour only the agent explains — kube-proxy alone would route them otherwise:
//! - `echo-host`: one echo pod per worker (a DaemonSet: the control plane's taint keeps it off
//!   there) behind topology keys
//!   `kubernetes.io/hostname` only: each client reaches the pod on its own node, never another;
//! - `only-a`: one echo pod in zone-a behind the hard key `topology.kubernetes.io/zone`: a client
//!   in another zone is refused (kube-proxy would send it across zones);
//! - `spill`: the per-node echo pods with capacity-aware spillover: `explain` shows its plan;
//! - `outside`: an ExternalName Service, which the node's DNS answers with a CNAME;
//! - the namespace `locked`, whose egress policy allows DNS to the kube-dns pods alone (as many
//!   clusters' default-deny policies do): with steering on, its lookups go to the agent's pod and
//!   are dropped, until the policy also allows the agents, as `docs/operating.md` says.

use std::fmt::Write as _;

/// The zones of the workers, one each.
pub const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];
/// The echo server (answers `/hostname` with its pod's name).
pub const ECHO_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.52";
/// The client (wget, nslookup).
pub const CLIENT_IMAGE: &str = "docker.io/library/busybox:1.36";
/// Where `outside` points.
pub const EXTERNAL_NAME: &str = "echo-host.default.svc.cluster.local";

/// The IP family of a kind cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
}

impl Family {
    /// kind's `networking.ipFamily`.
    pub fn kind_name(self) -> &'static str {
        match self {
            Self::V4 => "ipv4",
            Self::V6 => "ipv6",
        }
    }
}

/// The kind cluster's configuration: a control plane and one worker per zone.
pub fn cluster_config(family: Family) -> String {
    let mut config = format!(
        "kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnetworking:\n  ipFamily: {}\nnodes:\n- role: control-plane\n",
        family.kind_name()
    );
    for zone in ZONES {
        let _ = write!(config, "- role: worker\n  labels:\n    topology.kubernetes.io/zone: {zone}\n");
    }
    config
}

/// The echo workloads and the Services the suite checks.
pub fn workloads() -> String {
    let echo = format!(
        "containers:\n      - {{name: echo, image: {ECHO_IMAGE}, args: [netexec, --http-port=8080], \
         ports: [{{containerPort: 8080}}]}}\n"
    );
    let service = |name: &str, selector: &str, annotations: &str| {
        format!(
            "apiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: default\n  annotations: {{{annotations}}}\n\
             spec:\n  selector: {{app: {selector}}}\n  ports: [{{name: http, port: 80, targetPort: 8080}}]\n"
        )
    };
    [
        format!(
            "apiVersion: apps/v1\nkind: DaemonSet\nmetadata: {{name: echo, namespace: default}}\nspec:\n  \
             selector: {{matchLabels: {{app: echo}}}}\n  template:\n    metadata: {{labels: {{app: echo}}}}\n    spec:\n      {echo}"
        ),
        format!(
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: echo-a, namespace: default}}\nspec:\n  \
             replicas: 1\n  selector: {{matchLabels: {{app: echo-a}}}}\n  template:\n    metadata: {{labels: {{app: echo-a}}}}\n    \
             spec:\n      nodeSelector: {{topology.kubernetes.io/zone: zone-a}}\n      {echo}"
        ),
        service("echo-host", "echo", "topology-agent.io/topology-keys: kubernetes.io/hostname"),
        service("only-a", "echo-a", "topology-agent.io/topology-keys: topology.kubernetes.io/zone"),
        service("spill", "echo", "topology-agent.io/spillover: capacity"),
        format!(
            "apiVersion: v1\nkind: Service\nmetadata: {{name: outside, namespace: default}}\n\
             spec: {{type: ExternalName, externalName: {EXTERNAL_NAME}}}\n"
        ),
    ]
    .join("---\n")
}

/// A client pod on `node` (named after its zone).
pub fn client_pod(zone: &str, node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: client-{zone}, namespace: default}}\nspec:\n  nodeName: {node}\n  \
         containers:\n  - {{name: c, image: {CLIENT_IMAGE}, command: [sleep, \"3600\"]}}\n"
    )
}

/// The namespace of the NetworkPolicy check.
pub const LOCKED: &str = "locked";

/// The egress rule for DNS that `docs/operating.md` gives (`allow_agent`), or the one many
/// clusters have: to the kube-dns pods alone.
pub fn dns_egress(allow_agent: bool) -> String {
    let mut to = String::from(
        "      - podSelector: {matchLabels: {k8s-app: kube-dns}}\n        \
         namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: kube-system}}\n",
    );
    let mut ports = String::from("{port: 53, protocol: UDP}, {port: 53, protocol: TCP}");
    if allow_agent {
        to.push_str(
            "      - podSelector: {matchLabels: {app.kubernetes.io/name: topology-agent}}\n        \
             namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: topology-agent}}\n",
        );
        ports.push_str(", {port: 5353, protocol: UDP}, {port: 5353, protocol: TCP}");
    }
    format!("egress:\n  - to:\n{to}    ports: [{ports}]\n")
}

/// The namespace `locked`: every pod's egress denied but DNS, as [`dns_egress`] allows it.
pub fn locked_namespace(allow_agent: bool) -> String {
    let egress: String = dns_egress(allow_agent).lines().map(|line| format!("  {line}\n")).collect();
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: {LOCKED}}}\n---\n\
         apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {{name: dns-only, namespace: {LOCKED}}}\n\
         spec:\n  podSelector: {{}}\n  policyTypes: [Egress]\n{egress}"
    )
}

/// A client pod on `node` in the namespace `locked`.
pub fn locked_client(node: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: client, namespace: {LOCKED}}}\nspec:\n  nodeName: {node}\n  \
         containers:\n  - {{name: c, image: {CLIENT_IMAGE}, command: [sleep, \"3600\"]}}\n"
    )
}
