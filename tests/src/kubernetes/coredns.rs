//! The real CoreDNS 1.14 as a cluster runs it: a pod of `kube-system` labelled `k8s-app=kube-dns`
//! behind the `kube-dns` Service (UDP and TCP 53), whose slice the EndpointSlice controller writes
//! — so the agent's responder finds it as its upstream, as on a cluster. Its `kubernetes` plugin
//! reads this API server with a certificate of its own, bound to the rights CoreDNS's manifest
//! gives it; names outside the cluster go to `upstream`, a stand-in for the outside. The Corefile
//! is kubeadm's ([`Corefile::Kubeadm`]), or kubeadm's without `cache` and `loadbalance`
//! ([`Corefile::Compared`]) so that answers compare record for record.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use serde_json::json;

use super::{
    Cluster, eventually,
    pods::{Pod, PodSpec},
};
use crate::dns::dig;

/// The TTL of the `kubernetes` plugin's answers (kubeadm's Corefile).
pub const TTL: u32 = 30;

/// Which Corefile CoreDNS runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corefile {
    /// kubeadm's, as clusters run it: answers cached 30 s, records in rotating order.
    Kubeadm,
    /// kubeadm's without `cache` and `loadbalance`: every answer read from the objects, in order.
    Compared,
}

/// A running CoreDNS pod.
pub struct CoreDns {
    /// Its pod (its process is the pod's).
    pub pod: Pod,
    /// Its log.
    pub log: PathBuf,
}

impl CoreDns {
    /// Where it answers.
    pub fn address(&self) -> SocketAddr {
        SocketAddr::from((self.pod.ip, 53))
    }

    /// Its pod's address.
    pub fn ip(&self) -> Ipv4Addr {
        self.pod.ip
    }
}

impl Cluster {
    /// Applies CoreDNS's RBAC and the `kube-dns` Service, runs CoreDNS in a pod on `node`, waits
    /// until it answers from the API server's objects, and reports the pod Ready.
    pub fn start_coredns(&self, node: &str, upstream: SocketAddr, corefile: Corefile) -> CoreDns {
        for object in rbac() {
            self.apply(&object);
        }
        self.apply(&json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": {"k8s-app": "kube-dns"}},
            "spec": {"selector": {"k8s-app": "kube-dns"}, "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP"},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            ]},
        }));
        let mut spec = PodSpec::new("kube-system", "coredns", "coredns", &[53]);
        spec.labels.insert("k8s-app".to_owned(), "kube-dns".to_owned());
        let mut pod = self.create_pod(node, spec);
        let kubeconfig = self.client_kubeconfig("coredns", "system:coredns");
        let corefile_path = self.dir.join("Corefile");
        fs::write(&corefile_path, corefile_text(&kubeconfig, upstream, corefile)).expect("Corefile");
        let args = ["-conf".to_owned(), corefile_path.display().to_string()];
        let (process, log) =
            self.spawn_component("coredns", &args, pod.netns(), self.node(node).cgroup(), "coredns", None);
        pod.server = Some(process);
        let address = SocketAddr::from((pod.ip, 53));
        let netns = pod.netns().to_owned();
        // Ready once it answers a cluster name: its informers have synced.
        eventually(&format!("CoreDNS answering (log {})", log.display()), Duration::from_secs(60), || {
            let answer = dig(Some(&netns), address, "kubernetes.default.svc.cluster.local", "A", &[]);
            match answer.status.as_str() {
                "NOERROR" if !answer.data.is_empty() => Ok(()),
                _ => Err(format!("{answer:?}")),
            }
        });
        self.report(&pod, true);
        CoreDns { pod, log }
    }
}

/// kubeadm's Corefile for CoreDNS 1.14, its `kubernetes` plugin reading with `kubeconfig`, names
/// outside the cluster forwarded to `upstream`; `cache` and `loadbalance` as `corefile` says.
fn corefile_text(kubeconfig: &std::path::Path, upstream: SocketAddr, corefile: Corefile) -> String {
    let kubeadm = match corefile {
        Corefile::Kubeadm => "    cache 30\n    loadbalance\n",
        Corefile::Compared => "",
    };
    format!(
        ".:53 {{
    errors
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {}
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl {TTL}
    }}
    forward . {upstream}
{kubeadm}    loop
}}
",
        kubeconfig.display()
    )
}

/// The ClusterRole CoreDNS's own manifest gives it, bound to its certificate's user.
fn rbac() -> [serde_json::Value; 2] {
    [
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
            ],
        }),
        json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}],
        }),
    ]
}
