//! A Node as the agent reads it: name, labels, `status.allocatable.cpu`, the Ready condition,
//! `spec.podCIDRs` and the IP addresses, decoded straight from the API's JSON. The rest — the
//! images a kubelet lists (most of a Node's bytes), managed fields, node info — is skipped by the
//! parser without being built, so the status heartbeat every kubelet sends costs the agent a scan,
//! not a tree of allocations.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::{
    cpu_millis,
    meta::{lean_metadata, view_resource},
};
use crate::{
    objects::{Kind, Node, ObjectError},
    prefix::PrefixError,
};

/// The fields of a Node the agent uses; a `kube::Resource`, so the watchers list and watch it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeView {
    /// Name, resourceVersion and labels (and the few annotations) only.
    #[serde(default, deserialize_with = "lean_metadata")]
    pub metadata: ObjectMeta,
    /// Allocatable CPU and conditions only.
    #[serde(default)]
    pub status: Option<NodeStatusView>,
    /// The pod CIDRs only.
    #[serde(default)]
    pub spec: Option<NodeSpecView>,
}

/// What the agent reads of `spec`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeSpecView {
    /// `spec.podCIDRs`.
    #[serde(default, rename = "podCIDRs")]
    pub pod_cidrs: Option<Vec<String>>,
}

/// What the agent reads of `status`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeStatusView {
    /// `status.allocatable`, its `cpu` alone.
    #[serde(default)]
    pub allocatable: Option<Allocatable>,
    /// `status.conditions`, their type and status alone.
    #[serde(default)]
    pub conditions: Option<Vec<Condition>>,
    /// `status.addresses`.
    #[serde(default)]
    pub addresses: Option<Vec<NodeAddress>>,
}

/// One of `status.addresses`.
#[derive(Clone, Debug, Deserialize)]
pub struct NodeAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// The address, as written.
    pub address: String,
}

/// `status.allocatable.cpu`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Allocatable {
    /// The quantity as written (`7910m`, `8`).
    #[serde(default)]
    pub cpu: Option<String>,
}

/// A Node condition's type and status.
#[derive(Clone, Debug, Deserialize)]
pub struct Condition {
    /// `Ready`, `MemoryPressure`, ...
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
}

view_resource!(NodeView, Cluster, "Node", "", "v1", "nodes");

/// A Node into the model.
pub fn node(node: &NodeView) -> Result<Node, ObjectError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let error = |field: &str, message: String| ObjectError {
        kind: Kind::Node,
        name: name.clone(),
        field: field.into(),
        message,
    };
    if name.is_empty() {
        return Err(error("metadata.name", "missing".into()));
    }
    let status = node.status.as_ref();
    let allocatable_cpu_millis = match status.and_then(|s| s.allocatable.as_ref()).and_then(|a| a.cpu.as_ref()) {
        Some(quantity) => {
            cpu_millis(quantity).map_err(|invalid| error("status.allocatable.cpu", invalid.to_string()))?
        }
        None => 0,
    };
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    let pod_cidrs = node
        .spec
        .as_ref()
        .and_then(|spec| spec.pod_cidrs.as_deref())
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, cidr)| cidr.parse().map_err(|e: PrefixError| error(&format!("spec.podCIDRs[{i}]"), e.to_string())))
        .collect::<Result<_, _>>()?;
    // IP addresses only, as kube-proxy reads them: a Hostname or an unparsable entry is skipped
    // rather than losing the Node (the API server does not check these).
    let addresses = status
        .and_then(|s| s.addresses.as_deref())
        .unwrap_or_default()
        .iter()
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .filter_map(|a| a.address.parse().ok())
        .collect();
    Ok(Node {
        name,
        labels: node.metadata.labels.clone().unwrap_or_default().into(),
        allocatable_cpu_millis,
        ready,
        pod_cidrs,
        addresses,
    })
}
