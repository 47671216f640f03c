//! Many Services at once on the real API server, for the benches that compare with kube-proxy at
//! scale: selectorless Services (`svc-<i>`, TCP port 80) each with one EndpointSlice of the given
//! endpoints, as an operator publishes endpoints outside the cluster. The EndpointSlice
//! controller leaves such slices alone (their `managed-by` is not its own), so what kube-proxy
//! and the agent read is exactly what was written. Each slice is stamped with the time it is
//! written (`endpoints.kubernetes.io/last-change-trigger-time`, as the controller stamps its
//! own), which kube-proxy's and the agent's network programming latency are measured from.
//! Requests run [`CONCURRENCY`] at a time.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::{core::v1::Service, discovery::v1::EndpointSlice};
use kube::{
    Client,
    api::{Api, PostParams},
};
use serde_json::json;

use super::Cluster;

/// Requests in flight: below the API server's default of 400 mutating requests, enough to keep
/// its two cores busy.
const CONCURRENCY: usize = 32;
/// The `endpointslice.kubernetes.io/managed-by` of the slices written here.
const MANAGER: &str = "bench.topology-agent.io";
/// The annotation of the change a slice's version carries.
const TRIGGER_TIME: &str = "endpoints.kubernetes.io/last-change-trigger-time";

/// Now, as the EndpointSlice controller stamps a change (RFC 3339, nanoseconds).
fn stamp() -> String {
    humantime::format_rfc3339_nanos(std::time::SystemTime::now()).to_string()
}

impl Cluster {
    /// Creates Services `svc-<from>` to `svc-<to - 1>` in `namespace` (which must exist), each
    /// with one ready endpoint per address of `endpoints` (their port is the slice's); returns
    /// their ClusterIPs in order.
    pub fn create_services(&self, namespace: &str, from: usize, to: usize, endpoints: &[SocketAddr]) -> Vec<IpAddr> {
        let (admin, namespace, endpoints) = (self.admin(), namespace.to_owned(), endpoints.to_vec());
        self.api().block(async move {
            futures::stream::iter(from..to)
                .map(|index| create_one(admin.clone(), namespace.clone(), index, endpoints.clone()))
                .buffered(CONCURRENCY)
                .try_collect::<Vec<IpAddr>>()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        })
    }
}

/// One endpoint of a headless Service written here: its address, node and zone.
#[derive(Clone, Debug)]
pub struct Placed {
    /// Its address.
    pub ip: Ipv4Addr,
    /// Its `nodeName`.
    pub node: String,
    /// Its `zone`.
    pub zone: String,
}

impl Cluster {
    /// Creates headless Services `<prefix><i>` for `i` in `0..count` in `namespace` (which must
    /// exist), `trafficDistribution: PreferClose`, TCP port `port`, each with one slice of the
    /// ready endpoints `endpoints(i)` returns.
    pub fn create_headless(
        &self,
        namespace: &str,
        prefix: &str,
        count: usize,
        port: u16,
        endpoints: impl Fn(usize) -> Vec<Placed>,
    ) {
        let admin = self.admin();
        let made: Vec<_> = (0..count)
            .map(|index| {
                create_headless_one(
                    admin.clone(),
                    namespace.to_owned(),
                    format!("{prefix}{index}"),
                    port,
                    endpoints(index),
                )
            })
            .collect();
        self.api().block(async move {
            futures::stream::iter(made)
                .buffered(CONCURRENCY)
                .try_collect::<Vec<()>>()
                .await
                .unwrap_or_else(|e| panic!("{e}"))
        });
    }
}

async fn create_headless_one(
    admin: Client,
    namespace: String,
    name: String,
    port: u16,
    endpoints: Vec<Placed>,
) -> Result<(), String> {
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": "None", "trafficDistribution": "PreferClose",
                 "ports": [{"name": "tcp", "protocol": "TCP", "port": port}]},
    }))
    .expect("a Service");
    Api::<Service>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &service)
        .await
        .map_err(|e| format!("creating Service {namespace}/{name}: {e}"))?;
    let addresses: Vec<_> = endpoints
        .iter()
        .map(|endpoint| {
            json!({"addresses": [endpoint.ip.to_string()], "conditions": {"ready": true},
                   "nodeName": endpoint.node, "zone": endpoint.zone})
        })
        .collect();
    let slice = stamped_slice(&namespace, &name, addresses, ("tcp", port));
    Api::<EndpointSlice>::namespaced(admin, &namespace)
        .create(&PostParams::default(), &slice)
        .await
        .map(drop)
        .map_err(|e| format!("creating EndpointSlice {namespace}/{name}-1: {e}"))
}

/// The one slice (`<service>-1`) of a Service written here, stamped now.
fn stamped_slice(
    namespace: &str,
    service: &str,
    endpoints: Vec<serde_json::Value>,
    port: (&str, u16),
) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{service}-1"), "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service, "endpointslice.kubernetes.io/managed-by": MANAGER},
            "annotations": {TRIGGER_TIME: stamp()},
        },
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": port.0, "protocol": "TCP", "port": port.1}],
    }))
    .expect("an EndpointSlice")
}

/// Replaces the endpoints of Service `svc-<index>`'s slice, stamped now, as the admin.
pub async fn change_endpoints(
    admin: Client,
    namespace: String,
    index: usize,
    endpoints: Vec<SocketAddr>,
) -> Result<(), String> {
    let addresses: Vec<_> = endpoints
        .iter()
        .map(|endpoint| json!({"addresses": [endpoint.ip().to_string()], "conditions": {"ready": true}}))
        .collect();
    let patch = json!({"metadata": {"annotations": {TRIGGER_TIME: stamp()}}, "endpoints": addresses});
    let name = format!("svc-{index}-1");
    Api::<EndpointSlice>::namespaced(admin, &namespace)
        .patch(&name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .map(drop)
        .map_err(|e| format!("changing EndpointSlice {namespace}/{name}: {e}"))
}

async fn create_one(
    admin: Client,
    namespace: String,
    index: usize,
    endpoints: Vec<SocketAddr>,
) -> Result<IpAddr, String> {
    let name = format!("svc-{index}");
    let port = endpoints.first().map_or(80, SocketAddr::port);
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": port}]},
    }))
    .expect("a Service");
    let created = Api::<Service>::namespaced(admin.clone(), &namespace)
        .create(&PostParams::default(), &service)
        .await
        .map_err(|e| format!("creating Service {namespace}/{name}: {e}"))?;
    let cluster_ip = created
        .spec
        .and_then(|spec| spec.cluster_ip)
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| format!("Service {namespace}/{name} has no ClusterIP"))?;
    let addresses: Vec<_> = endpoints
        .iter()
        .map(|endpoint| json!({"addresses": [endpoint.ip().to_string()], "conditions": {"ready": true}}))
        .collect();
    let slice = stamped_slice(&namespace, &name, addresses, ("http", port));
    Api::<EndpointSlice>::namespaced(admin, &namespace)
        .create(&PostParams::default(), &slice)
        .await
        .map_err(|e| format!("creating EndpointSlice {namespace}/{name}-1: {e}"))?;
    Ok(cluster_ip)
}
