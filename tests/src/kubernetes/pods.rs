//! Pods without a container runtime: a Pod object bound to a node (`spec.nodeName`, created by
//! the admin as the scheduler's binding would leave it), and a process in a network namespace of
//! its own behind the node's, which the harness moves through a pod's life with the node's own
//! credentials, as kubelet does: Running with its IP and Ready, not Ready, terminating (graceful
//! delete: still serving, as the EndpointSlice controller then reports it), gone.

use std::{
    collections::BTreeMap,
    net::{Ipv4Addr, Ipv6Addr},
};

use k8s_openapi::api::core::v1::Pod as PodObject;
use kube::{
    Client,
    api::{Api, DeleteParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde_json::{Value, json};

use crate::sandbox::{NetnsGuard, ProcessGuard};

/// What a pod runs and is labelled with.
#[derive(Clone, Debug)]
pub struct PodSpec {
    /// Its namespace.
    pub namespace: String,
    /// Its name (what its server answers with, so a connection names where it landed).
    pub name: String,
    /// Its labels (what Services select).
    pub labels: BTreeMap<String, String>,
    /// Ports its server answers on, TCP and UDP.
    pub ports: Vec<u16>,
}

impl PodSpec {
    /// A pod `name` in `namespace` labelled `app=<app>`, serving `ports`.
    pub fn new(namespace: &str, name: &str, app: &str, ports: &[u16]) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            labels: BTreeMap::from([("app".to_owned(), app.to_owned())]),
            ports: ports.to_vec(),
        }
    }
}

/// A pod: its object's identity, its address and its process.
pub struct Pod {
    /// Its spec.
    pub spec: PodSpec,
    /// The node it is bound to.
    pub node: String,
    /// Its IPv4 address.
    pub ip: Ipv4Addr,
    /// Its IPv6 address (every pod has both: the cluster is dual-stack).
    pub ip6: Ipv6Addr,
    /// Its object's uid.
    pub uid: String,
    pub(super) node_client: Client,
    pub(super) server: Option<ProcessGuard>,
    pub(super) netns: NetnsGuard,
}

impl Pod {
    /// Its network namespace.
    pub fn netns(&self) -> &str {
        self.netns.name()
    }

    /// Its process's id, while it runs one.
    pub fn pid(&self) -> Option<u32> {
        self.server.as_ref().map(ProcessGuard::id)
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.spec.namespace, self.spec.name)
    }
}

/// The Pod object: bound to `node`, its container declaring the ports it serves.
pub fn pod_object(spec: &PodSpec, node: &str) -> Value {
    let ports: Vec<Value> = spec
        .ports
        .iter()
        .flat_map(|port| ["TCP", "UDP"].map(|protocol| json!({"containerPort": port, "protocol": protocol})))
        .collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": spec.name, "namespace": spec.namespace, "labels": spec.labels},
        "spec": {
            "nodeName": node,
            "containers": [{"name": "app", "image": "registry.invalid/topology-e2e/echo:1", "ports": ports}],
            "terminationGracePeriodSeconds": 30,
            "enableServiceLinks": false,
            "automountServiceAccountToken": false,
        },
    })
}

/// Creates the Pod object as the admin; returns its uid.
pub async fn create(admin: Client, object: Value) -> String {
    let namespace = object["metadata"]["namespace"].as_str().expect("namespace").to_owned();
    let pods: Api<PodObject> = Api::namespaced(admin, &namespace);
    let pod: PodObject = serde_json::from_value(object).expect("a Pod");
    let name = pod.metadata.name.clone().unwrap_or_default();
    let created = pods
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating Pod {namespace}/{name}: {e}"));
    created.metadata.uid.expect("the server gives every object a uid")
}

/// Reports the pod Running with its address, and Ready or not, as its node.
pub async fn report(
    node_client: Client,
    namespace: String,
    name: String,
    ips: (Ipv4Addr, Ipv6Addr),
    host: Ipv4Addr,
    ready: bool,
) {
    let (ip, ip6) = ips;
    let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let truth = if ready { "True" } else { "False" };
    let condition = |kind: &str, status: &str| json!({"type": kind, "status": status, "lastTransitionTime": now});
    let status = json!({"status": {
        "phase": "Running",
        "hostIP": host.to_string(), "hostIPs": [{"ip": host.to_string()}],
        "podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}, {"ip": ip6.to_string()}],
        "startTime": now,
        "conditions": [
            condition("PodReadyToStartContainers", "True"),
            condition("Initialized", "True"),
            condition("Ready", truth),
            condition("ContainersReady", truth),
            condition("PodScheduled", "True"),
        ],
        "containerStatuses": [{
            "name": "app", "image": "registry.invalid/topology-e2e/echo:1", "imageID": "",
            "ready": ready, "started": true, "restartCount": 0,
            "state": {"running": {"startedAt": now}},
        }],
    }});
    let pods: Api<PodObject> = Api::namespaced(node_client, &namespace);
    pods.patch_status(&name, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .unwrap_or_else(|e| panic!("reporting Pod {namespace}/{name}'s status: {e}"));
}

/// Deletes the pod gracefully as a user does (`kubectl delete`): it stays, terminating.
pub async fn delete_gracefully(admin: Client, namespace: String, name: String) {
    let pods: Api<PodObject> = Api::namespaced(admin, &namespace);
    let params = DeleteParams { grace_period_seconds: Some(30), ..DeleteParams::default() };
    pods.delete(&name, &params).await.unwrap_or_else(|e| panic!("deleting Pod {namespace}/{name}: {e}"));
}

/// Removes the object for good once its process is gone, as kubelet does after a termination.
pub async fn remove(node_client: Client, namespace: String, name: String, uid: String) {
    let pods: Api<PodObject> = Api::namespaced(node_client, &namespace);
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: Some(uid), resource_version: None }),
        ..DeleteParams::default()
    };
    pods.delete(&name, &params).await.unwrap_or_else(|e| panic!("removing Pod {namespace}/{name}: {e}"));
}

/// A Service `namespace/name` selecting `app=echo` pods, port `http` 80 to their 8080, with
/// `extra` merged in (objects merged key by key, anything else replaced).
pub fn echo_service(namespace: &str, name: &str, extra: &Value) -> Value {
    let mut service = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "annotations": {}},
        "spec": {"selector": {"app": "echo"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    });
    merge(&mut service, extra);
    service
}

/// Merges `from` into `into`: objects key by key, anything else replaced.
pub fn merge(into: &mut Value, from: &Value) {
    match (into, from) {
        (Value::Object(into), Value::Object(from)) => {
            for (key, value) in from {
                merge(into.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
        (into, from) => *into = from.clone(),
    }
}
