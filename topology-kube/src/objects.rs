//! Kubernetes objects for test and demo clusters, written as a multi-document YAML file (each
//! document is JSON, which is YAML).

use std::{net::IpAddr, path::Path};

use serde_json::{Value, json};

/// A Ready Node with zone (and optionally region) labels and `cpu` allocatable.
pub fn node(name: &str, zone: &str, region: Option<&str>, cpu: &str) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": name, "topology.kubernetes.io/zone": zone});
    if let Some(region) = region {
        labels["topology.kubernetes.io/region"] = region.into();
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"cpu": cpu}, "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

/// A Service with one port named `port_name`.
pub fn service(namespace: &str, name: &str, cluster_ip: IpAddr, port: u16, protocol: &str, port_name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "annotations": {}},
        "spec": {
            "clusterIP": cluster_ip.to_string(), "clusterIPs": [cluster_ip.to_string()],
            "ports": [{"name": port_name, "port": port, "protocol": protocol}]
        }
    })
}

/// One endpoint of a slice.
#[derive(Clone, Debug)]
pub struct EndpointSpec {
    /// Address.
    pub address: IpAddr,
    /// Node name.
    pub node: String,
    /// Zone field (as the EndpointSlice controller writes it).
    pub zone: Option<String>,
    /// `hints.forZones`.
    pub hint_zones: Vec<String>,
    /// Ready condition.
    pub ready: bool,
}

impl EndpointSpec {
    /// A ready endpoint on `node`.
    pub fn new(address: IpAddr, node: &str) -> Self {
        Self { address, node: node.into(), zone: None, hint_zones: Vec::new(), ready: true }
    }

    fn to_json(&self) -> Value {
        let mut endpoint = json!({
            "addresses": [self.address.to_string()],
            "nodeName": self.node,
            "conditions": {"ready": self.ready, "serving": self.ready, "terminating": false}
        });
        if let Some(zone) = &self.zone {
            endpoint["zone"] = zone.clone().into();
        }
        if !self.hint_zones.is_empty() {
            let zones: Vec<Value> = self.hint_zones.iter().map(|z| json!({"name": z})).collect();
            endpoint["hints"] = json!({"forZones": zones});
        }
        endpoint
    }
}

/// An EndpointSlice of `service` with one port.
pub fn slice(
    namespace: &str,
    name: &str,
    service: &str,
    port_name: &str,
    port: u16,
    protocol: &str,
    endpoints: &[EndpointSpec],
) -> Value {
    let ipv6 = endpoints.first().is_some_and(|e| e.address.is_ipv6());
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "labels": {"kubernetes.io/service-name": service}},
        "addressType": if ipv6 { "IPv6" } else { "IPv4" },
        "ports": [{"name": port_name, "port": port, "protocol": protocol}],
        "endpoints": endpoints.iter().map(EndpointSpec::to_json).collect::<Vec<_>>()
    })
}

/// The cluster DNS as kubeadm names it: `kube-system/kube-dns` at `cluster_ip`, ports `dns`
/// (UDP 53) and `dns-tcp` (TCP 53), with one endpoint, `coredns` on `node`.
pub fn kube_dns(cluster_ip: IpAddr, coredns: IpAddr, node: &str) -> [Value; 2] {
    let ports = json!([
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"}
    ]);
    let mut dns_slice =
        slice("kube-system", "kube-dns-1", "kube-dns", "dns", 53, "UDP", &[EndpointSpec::new(coredns, node)]);
    dns_slice["ports"] = ports.clone();
    let service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "kube-dns", "namespace": "kube-system"},
        "spec": {"clusterIP": cluster_ip.to_string(), "ports": ports}
    });
    [service, dns_slice]
}

/// Sets an annotation on an object.
pub fn annotate(object: &mut Value, key: &str, value: &str) {
    object["metadata"]["annotations"][key] = value.into();
}

/// Writes the objects as one multi-document YAML file, atomically (write, then rename), as an
/// editor or a ConfigMap update would.
pub fn write(path: &Path, objects: &[Value]) {
    let text: String =
        objects.iter().map(|o| format!("---\n{}\n", serde_json::to_string_pretty(o).expect("JSON"))).collect();
    let temporary = path.with_extension("tmp");
    std::fs::write(&temporary, text).expect("write cluster file");
    std::fs::rename(&temporary, path).expect("rename cluster file");
}
