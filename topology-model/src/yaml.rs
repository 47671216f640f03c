//! The cluster from a YAML file: multi-document YAML or a `kind: List`, exactly as
//! `kubectl get nodes,services,endpointslices -A -o yaml` prints it. Other kinds are ignored.

use std::path::{Path, PathBuf};

use serde::Deserialize as _;
use serde_json::Value;

use super::{
    convert,
    objects::{Kind, ObjectError},
    state::ClusterState,
};

/// A file that cannot be used, located down to the document and field.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A document is not valid YAML, or not an object.
    #[error("{origin}: document {document}: {message}")]
    Document {
        /// File name.
        origin: String,
        /// 1-based document index.
        document: usize,
        /// What is wrong.
        message: String,
    },
    /// An object is malformed.
    #[error("{origin}: document {document}{}: {error}", item.map(|i| format!(", item {i}")).unwrap_or_default())]
    Object {
        /// File name.
        origin: String,
        /// 1-based document index.
        document: usize,
        /// 1-based index within a `kind: List`.
        item: Option<usize>,
        /// The object, field and problem.
        error: Box<ObjectError>,
    },
}

/// Reads and parses a cluster file.
pub fn load(path: &Path) -> Result<ClusterState, FileError> {
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Read { path: path.to_path_buf(), source })?;
    parse(&text, &path.display().to_string())
}

/// Parses cluster YAML; `origin` names it in errors.
pub fn parse(text: &str, origin: &str) -> Result<ClusterState, FileError> {
    let mut state = ClusterState::default();
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let document_number = index + 1;
        let doc_error =
            |message: String| FileError::Document { origin: origin.to_owned(), document: document_number, message };
        let yaml = serde_yaml::Value::deserialize(document).map_err(|e| doc_error(e.to_string()))?;
        if yaml.is_null() {
            continue;
        }
        let value = serde_json::to_value(&yaml).map_err(|e| doc_error(e.to_string()))?;
        let kind = kind_of(&value).map_err(|message| doc_error(message.into()))?;
        if kind.ends_with("List") {
            let items = value.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
            for (item, object) in items.iter().enumerate() {
                let kind = kind_of(object).map_err(|message| doc_error(format!("item {}: {message}", item + 1)))?;
                add(&mut state, kind, object).map_err(|error| FileError::Object {
                    origin: origin.to_owned(),
                    document: document_number,
                    item: Some(item + 1),
                    error: Box::new(error),
                })?;
            }
        } else {
            add(&mut state, kind, &value).map_err(|error| FileError::Object {
                origin: origin.to_owned(),
                document: document_number,
                item: None,
                error: Box::new(error),
            })?;
        }
    }
    Ok(state)
}

/// The `kind` of a raw object.
fn kind_of(raw: &Value) -> Result<&str, &'static str> {
    raw.get("kind").and_then(Value::as_str).ok_or("kind: missing; every document must be a Kubernetes object")
}

/// Adds one raw object to the state; other kinds than Node, Service and EndpointSlice are ignored.
fn add(state: &mut ClusterState, kind: &str, raw: &Value) -> Result<(), ObjectError> {
    match kind {
        "Node" => {
            let node: convert::NodeView = convert::typed(raw, Kind::Node)?;
            state.upsert_node(convert::node(&node)?);
        }
        "Service" => {
            state.upsert_service(convert::service_from_value(raw)?);
        }
        "EndpointSlice" => {
            let slice: convert::EndpointSliceView = convert::typed(raw, Kind::EndpointSlice)?;
            if let Some(slice) = convert::endpoint_slice(&slice)? {
                state.upsert_slice(slice);
            }
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::ObjectKey;

    const MULTI: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
---
# a comment-only document is skipped
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{name: http, port: 8080}]
endpoints: [{addresses: [10.1.0.1], nodeName: node-a}]
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: ignored}
"#;

    #[test]
    fn multi_document_yaml() {
        let state = parse(MULTI, "cluster.yaml").unwrap();
        assert_eq!(state.counts(), (1, 1, 1));
        assert_eq!(state.slices_of(&ObjectKey::new("default", "web")).count(), 1);
    }

    #[test]
    fn a_kubectl_list() {
        let list = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: node-a}
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: shop}
  spec: {clusterIP: 10.96.0.10, ports: [{port: 80}]}
"#;
        let state = parse(list, "list.yaml").unwrap();
        assert_eq!(state.counts(), (1, 1, 0));
    }

    #[test]
    fn errors_name_the_document_kind_object_and_field() {
        let bad = MULTI.replace("port: 8080", "port: eighty");
        let error = parse(&bad, "cluster.yaml").unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("cluster.yaml: document 4: EndpointSlice default/web-1: ports[0].port: "), "{text}");

        let bad_ip = MULTI.replace("clusterIP: 10.96.0.10", "clusterIP: 10.96.0.999");
        let text = parse(&bad_ip, "cluster.yaml").unwrap_err().to_string();
        assert_eq!(
            text,
            "cluster.yaml: document 2: Service default/web: spec.clusterIP: \"10.96.0.999\" is not an IP address"
        );

        let list = "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: a}}\n- {apiVersion: v1, kind: Service, metadata: {name: s}, spec: {ports: [{port: -1}]}}\n";
        let text = parse(list, "l.yaml").unwrap_err().to_string();
        assert!(text.starts_with("l.yaml: document 1, item 2: Service default/s: spec.ports[0].port"), "{text}");

        let not_yaml = parse("a: [unclosed", "x.yaml").unwrap_err();
        assert!(matches!(not_yaml, FileError::Document { document: 1, .. }), "{not_yaml}");

        let no_kind = parse("metadata: {name: x}\n", "k.yaml").unwrap_err().to_string();
        assert!(no_kind.contains("kind: missing"), "{no_kind}");
    }
}
