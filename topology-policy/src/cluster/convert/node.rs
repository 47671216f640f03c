//! A Node as the agent reads it: name, labels, `status.allocatable.cpu` and the Ready condition,
//! decoded straight from the API's JSON. The rest — the images a kubelet lists (most of a Node's
//! bytes), managed fields, addresses, node info — is skipped by the parser without being built,
//! so the status heartbeat every kubelet sends costs the agent a scan, not a tree of allocations.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::{
    cpu_millis,
    meta::{lean_metadata, view_resource},
};
use crate::cluster::model::{Kind, Node, ObjectError};

/// The fields of a Node the agent uses; a `kube::Resource`, so the watchers list and watch it.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct NodeView {
    /// Name, resourceVersion and labels (and the few annotations) only.
    #[serde(default, deserialize_with = "lean_metadata")]
    pub metadata: ObjectMeta,
    /// Allocatable CPU and conditions only.
    #[serde(default)]
    pub status: Option<NodeStatusView>,
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
    Ok(Node { name, labels: node.metadata.labels.clone().unwrap_or_default().into(), allocatable_cpu_millis, ready })
}
