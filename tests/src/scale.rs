//! The cluster Kubernetes itself supports at its limits (5,000 Nodes, 10,000 Services, 150,000
//! endpoints in slices of at most 100), with Nodes as real kubelets report them: labels,
//! annotations, managed fields, capacity and allocatable, conditions, addresses, node info and
//! the 50 container images a kubelet lists at most.

use std::net::{IpAddr, Ipv4Addr};

use serde_json::{Value, json};
use topology_kube::{
    fake_api::{FakeApi, rfc3339},
    objects::{self, EndpointSpec},
};

/// Zones of the cluster; Node `n` is in `ZONES[n % 3]`.
pub const ZONES: [&str; 3] = ["europe-west1-b", "europe-west1-c", "europe-west1-d"];
/// The region of every zone.
pub const REGION: &str = "europe-west1";
/// The namespace of the Services.
pub const NAMESPACE: &str = "scale";
/// Images a kubelet reports at most (`--node-status-max-images`).
const IMAGES: usize = 50;
/// Endpoints per EndpointSlice at most (the EndpointSlice controller's default).
pub const SLICE_LIMIT: usize = 100;

/// How big the cluster is.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Nodes.
    pub nodes: usize,
    /// Services with `small` endpoints (one slice each).
    pub small_services: usize,
    /// Endpoints of each small Service.
    pub small: usize,
    /// Services with `large` endpoints, in slices of at most [`SLICE_LIMIT`].
    pub large_services: usize,
    /// Endpoints of each large Service.
    pub large: usize,
}

impl Shape {
    /// Kubernetes' limits: 5,000 Nodes, 10,000 Services, 150,000 endpoints (9,500 Services with
    /// 10, 500 with 110 in two slices).
    pub const KUBERNETES: Self = Self { nodes: 5000, small_services: 9500, small: 10, large_services: 500, large: 110 };

    /// Services in all.
    pub fn services(&self) -> usize {
        self.small_services + self.large_services
    }

    /// Endpoints in all.
    pub fn endpoints(&self) -> usize {
        self.small_services * self.small + self.large_services * self.large
    }

    /// Endpoints of Service `s` (the large ones come last).
    pub fn endpoints_of(&self, s: usize) -> usize {
        if s < self.small_services { self.small } else { self.large }
    }

    /// The first endpoint number of Service `s`, so every endpoint has its own.
    fn first_endpoint(&self, s: usize) -> usize {
        let small = s.min(self.small_services);
        small * self.small + (s - small) * self.large
    }
}

/// Node `n`'s name.
pub fn node_name(n: usize) -> String {
    format!("gke-prod-pool-{:05}", n)
}

/// Service `s`'s ClusterIP (10.96.0.0/12).
pub fn vip(s: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 96 + (s >> 16) as u8, (s >> 8) as u8, s as u8))
}

/// Node `n` as its kubelet reports it: about 15 KiB of JSON, most of it the image list.
pub fn node(n: usize) -> Value {
    let name = node_name(n);
    let zone = ZONES[n % ZONES.len()];
    let now = rfc3339(std::time::SystemTime::now());
    let pod_cidr = format!("10.{}.{}.0/24", 64 + (n >> 8), n & 0xff);
    let internal_ip = format!("10.132.{}.{}", n >> 8, n & 0xff);
    let condition = |kind: &str, status: &str, reason: &str, message: &str| {
        json!({"type": kind, "status": status, "lastHeartbeatTime": now, "lastTransitionTime": "2026-11-01T08:00:00Z",
               "reason": reason, "message": message})
    };
    let images: Vec<Value> = (0..IMAGES)
        .map(|i| {
            let repository = format!("europe-docker.pkg.dev/prod-project/services/service-{:03}", (n + i * 7) % 400);
            json!({
                "names": [format!("{repository}@sha256:{:064x}", (n as u128 + 1) * 0x9e37_79b9_7f4a_7c15 + i as u128),
                          format!("{repository}:v1.{}.{}", i % 40, n % 10)],
                "sizeBytes": 20_000_000 + (i as u64 * 7_919_003 + n as u64 * 104_729) % 900_000_000
            })
        })
        .collect();
    let quantities = json!({"cpu": "8", "ephemeral-storage": "98831908Ki", "hugepages-1Gi": "0",
                            "hugepages-2Mi": "0", "memory": "32880596Ki", "pods": "110"});
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "uid": format!("6f1c{:04x}-1d2e-4b6a-9c1f-{:012x}", n & 0xffff, n * 7919),
            "creationTimestamp": "2026-11-01T08:00:00Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/instance-type": "n2-standard-8",
                "beta.kubernetes.io/os": "linux", "cloud.google.com/gke-nodepool": "prod-pool",
                "cloud.google.com/gke-os-distribution": "cos", "cloud.google.com/machine-family": "n2",
                "failure-domain.beta.kubernetes.io/region": REGION, "failure-domain.beta.kubernetes.io/zone": zone,
                "kubernetes.io/arch": "amd64", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "n2-standard-8",
                "topology.kubernetes.io/region": REGION, "topology.kubernetes.io/zone": zone
            },
            "annotations": {
                "container.googleapis.com/instance_id": format!("{}", 7_000_000_000_000_000_000u64 + n as u64),
                "csi.volume.kubernetes.io/nodeid": format!("{{\"pd.csi.storage.gke.io\":\"projects/prod-project/zones/{zone}/instances/{name}\"}}"),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true"
            },
            "managedFields": [
                {"manager": "kubelet", "operation": "Update", "apiVersion": "v1", "time": now,
                 "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:allocatable": {"f:cpu": {}, "f:memory": {}}, "f:capacity": {"f:cpu": {}},
                              "f:conditions": {"k:{\"type\":\"Ready\"}": {"f:lastHeartbeatTime": {}, "f:status": {}}},
                              "f:images": {}, "f:nodeInfo": {"f:bootID": {}}}}},
                {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
                 "time": "2026-11-01T08:00:10Z", "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:annotations": {"f:node.alpha.kubernetes.io/ttl": {}}},
                              "f:spec": {"f:podCIDR": {}, "f:podCIDRs": {".": {}, "v:\"10.64.0.0/24\"": {}}}}}
            ]
        },
        "spec": {
            "podCIDR": pod_cidr, "podCIDRs": [pod_cidr],
            "providerID": format!("gce://prod-project/{zone}/{name}")
        },
        "status": {
            "capacity": quantities,
            "allocatable": {"cpu": "7910m", "ephemeral-storage": "47093746742", "hugepages-1Gi": "0",
                            "hugepages-2Mi": "0", "memory": "29094740Ki", "pods": "110"},
            "conditions": [
                condition("FrequentContainerdRestart", "False", "NoFrequentContainerdRestart", "containerd is functioning properly"),
                condition("KernelDeadlock", "False", "KernelHasNoDeadlock", "kernel has no deadlock"),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                condition("Ready", "True", "KubeletReady", "kubelet is posting ready status. AppArmor enabled")
            ],
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "ExternalIP", "address": format!("34.76.{}.{}", n >> 8, n & 0xff)},
                {"type": "InternalDNS", "address": format!("{name}.{zone}.c.prod-project.internal")},
                {"type": "Hostname", "address": format!("{name}.{zone}.c.prod-project.internal")}
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "architecture": "amd64", "bootID": format!("{:032x}", n as u128 * 0x1f2e_3d4c_5b6a),
                "containerRuntimeVersion": "containerd://1.7.24", "kernelVersion": "6.6.56+",
                "kubeProxyVersion": "v1.33.5-gke.1080000", "kubeletVersion": "v1.33.5-gke.1080000",
                "machineID": format!("{:032x}", n as u128 * 0x7a6b_5c4d), "operatingSystem": "linux",
                "osImage": "Container-Optimized OS from Google", "systemUUID": format!("{:032x}", n as u128 * 0x3c4d)
            },
            "images": images
        }
    })
}

/// Service `s`'s slices at `generation` (each generation moves every endpoint to a new address,
/// as a rollout does).
pub fn slices(shape: &Shape, s: usize, generation: usize) -> Vec<Value> {
    let first = shape.first_endpoint(s);
    let endpoints: Vec<EndpointSpec> = (0..shape.endpoints_of(s))
        .map(|e| {
            let id = first + e + generation * shape.endpoints();
            let node = (s * 7 + e) % shape.nodes;
            let mut spec = EndpointSpec::new(
                IpAddr::V4(Ipv4Addr::new(10, 64 + ((id >> 16) & 0x3f) as u8, (id >> 8) as u8, id as u8)),
                &node_name(node),
            );
            spec.zone = Some(ZONES[node % ZONES.len()].into());
            spec
        })
        .collect();
    endpoints
        .chunks(SLICE_LIMIT)
        .enumerate()
        .map(|(n, chunk)| {
            let name = format!("svc-{s}-{n:05x}");
            objects::slice(NAMESPACE, &name, &format!("svc-{s}"), "http", 8080, "TCP", chunk)
        })
        .collect()
}

/// Fills `api` with the cluster.
pub fn populate(api: &FakeApi, shape: &Shape) {
    for n in 0..shape.nodes {
        api.apply(node(n));
    }
    for s in 0..shape.services() {
        api.apply(objects::service(NAMESPACE, &format!("svc-{s}"), vip(s), 80, "TCP", "http"));
        for slice in slices(shape, s, 0) {
            api.apply(slice);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_kubernetes_supports() {
        let shape = Shape::KUBERNETES;
        assert_eq!((shape.nodes, shape.services(), shape.endpoints()), (5000, 10_000, 150_000));
        let large = slices(&shape, 9999, 0);
        let sizes: Vec<usize> = large.iter().map(|s| s["endpoints"].as_array().unwrap().len()).collect();
        assert_eq!(sizes, [100, 10], "slices hold at most 100 endpoints");
        let node = serde_json::to_vec(&node(4321)).unwrap();
        assert!((12_000..24_000).contains(&node.len()), "a Node is {} bytes", node.len());
    }

    #[test]
    fn every_endpoint_has_its_own_address() {
        let shape = Shape { nodes: 10, small_services: 30, small: 10, large_services: 5, large: 110 };
        let mut seen = std::collections::BTreeSet::new();
        for generation in 0..2 {
            for s in 0..shape.services() {
                for slice in slices(&shape, s, generation) {
                    for endpoint in slice["endpoints"].as_array().unwrap() {
                        assert!(seen.insert(endpoint["addresses"][0].as_str().unwrap().to_owned()));
                    }
                }
            }
        }
        assert_eq!(seen.len(), 2 * shape.endpoints());
    }
}
