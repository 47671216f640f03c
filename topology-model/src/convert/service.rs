//! A Service as the agent reads it. The list's parser only finds where each `spec` ends and keeps
//! its text; [`service`] then reads the few fields routing needs from it. Two things follow: a
//! Service whose spec cannot be read is skipped alone with an error naming the field (not the
//! list page it came in), and nothing else of the object (status, managed fields, fields the
//! agent does not use) is ever built. `spec.topologyKeys`, which current API types no longer
//! model, is read like any other field.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::{
    AGENT_ANNOTATIONS, ANNOTATION_TOPOLOGY_AWARE_HINTS, ANNOTATION_TOPOLOGY_KEYS, ANNOTATION_TOPOLOGY_MODE,
    meta::{lean_metadata, null_as_default, view_resource},
    object_key, protocol,
};
use crate::{
    bounds,
    objects::{
        Kind, LABELS_OTHER_PROXY, ObjectError, PortSpec, Service, TopologyKeysSource, TopologyKeysSpec,
        TrafficDistribution,
    },
};

/// A Service from the API: its metadata (lean) and its spec's text, read by [`service`].
#[derive(Clone, Debug, Default, Deserialize)]
pub struct ServiceView {
    /// Name, namespace, resourceVersion and annotations only.
    #[serde(default, deserialize_with = "lean_metadata")]
    pub metadata: ObjectMeta,
    /// `spec` as written.
    #[serde(default)]
    pub spec: Option<Box<RawValue>>,
}

view_resource!(ServiceView, Namespace, "Service", "", "v1", "services");

/// The fields of `spec` routing reads; the rest is skipped unbuilt.
#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SpecView {
    #[serde(rename = "type")]
    type_: Option<String>,
    #[serde(rename = "clusterIP")]
    cluster_ip: Option<String>,
    #[serde(rename = "clusterIPs", deserialize_with = "null_as_default")]
    cluster_ips: Vec<String>,
    #[serde(deserialize_with = "null_as_default")]
    ports: Vec<PortView>,
    internal_traffic_policy: Option<String>,
    session_affinity: Option<String>,
    session_affinity_config: Option<AffinityConfig>,
    traffic_distribution: Option<String>,
    /// Kubernetes 1.17-1.21 (KEP-536's alpha field).
    topology_keys: Option<Vec<String>>,
    external_name: Option<String>,
}

#[derive(Debug, Deserialize)]
struct PortView {
    #[serde(default)]
    name: Option<String>,
    port: i32,
    #[serde(default)]
    protocol: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct AffinityConfig {
    #[serde(rename = "clientIP")]
    client_ip: Option<ClientIpConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
struct ClientIpConfig {
    timeout_seconds: Option<i32>,
}

/// A Service from the API into the model.
pub fn service(view: &ServiceView) -> Result<Service, ObjectError> {
    let spec = match &view.spec {
        // Read plainly, and again with the path tracked only to name the field that failed: the
        // tracking cost a twentieth of decoding a list.
        Some(text) => serde_json::from_str(text.get()).or_else(|_| {
            let mut parser = serde_json::Deserializer::from_str(text.get());
            serde_path_to_error::deserialize(&mut parser)
                .map_err(|error| spec_error(&view.metadata, &error.path().to_string(), error.inner()))
        })?,
        None => SpecView::default(),
    };
    from_parts(&view.metadata, &spec)
}

/// A Service from its raw JSON (a cluster file): the same fields as from the API.
pub fn service_from_value(raw: &serde_json::Value) -> Result<Service, ObjectError> {
    let metadata = match raw.get("metadata") {
        Some(metadata) => lean_metadata(metadata).map_err(|error| ObjectError {
            kind: Kind::Service,
            name: super::name_of(raw),
            field: "metadata".into(),
            message: error.to_string(),
        })?,
        None => ObjectMeta::default(),
    };
    let spec = match raw.get("spec") {
        Some(spec) => serde_path_to_error::deserialize(spec)
            .map_err(|error| spec_error(&metadata, &error.path().to_string(), error.inner()))?,
        None => SpecView::default(),
    };
    from_parts(&metadata, &spec)
}

fn spec_error(metadata: &ObjectMeta, path: &str, error: &serde_json::Error) -> ObjectError {
    ObjectError {
        kind: Kind::Service,
        name: object_key(metadata).to_string(),
        field: if path == "." { "spec".into() } else { format!("spec.{path}") },
        message: error.to_string(),
    }
}

fn from_parts(metadata: &ObjectMeta, spec: &SpecView) -> Result<Service, ObjectError> {
    let key = object_key(metadata);
    let error =
        |field: String, message: String| ObjectError { kind: Kind::Service, name: key.to_string(), field, message };
    if key.name.is_empty() {
        return Err(error("metadata.name".into(), "missing".into()));
    }

    let mut cluster_ips = Vec::new();
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let (ips, field) = match (&spec.cluster_ips, &spec.cluster_ip) {
        (ips, _) if !ips.is_empty() => (ips.as_slice(), "spec.clusterIPs"),
        (_, ip) => (ip.as_slice(), "spec.clusterIP"),
    };
    for (i, ip) in ips.iter().enumerate() {
        if ip == "None" || ip.is_empty() || external_name {
            continue;
        }
        let parsed: IpAddr =
            ip.parse().map_err(|_| error(indexed(field, i), format!("{ip:?} is not an IP address")))?;
        cluster_ips.push(parsed);
    }

    let mut ports = Vec::with_capacity(spec.ports.len());
    for (i, port) in spec.ports.iter().enumerate() {
        let number = u16::try_from(port.port)
            .ok()
            .filter(|&p| p != 0)
            .ok_or_else(|| error(format!("spec.ports[{i}].port"), format!("{} is not a port number", port.port)))?;
        let protocol = protocol(port.protocol.as_deref())
            .map_err(|unknown| error(format!("spec.ports[{i}].protocol"), unknown.to_string()))?;
        ports.push(PortSpec { name: port.name.clone().unwrap_or_default(), port: number, protocol });
    }

    let internal_traffic_local = match spec.internal_traffic_policy.as_deref() {
        None | Some("Cluster") => false,
        Some("Local") => true,
        Some(other) => {
            return Err(error("spec.internalTrafficPolicy".into(), format!("{other:?} is neither Cluster nor Local")));
        }
    };

    let session_affinity_timeout_s = session_affinity(spec).map_err(|(field, message)| error(field.into(), message))?;

    let empty = BTreeMap::new();
    let annotations = metadata.annotations.as_ref().unwrap_or(&empty);
    // Every value is bounded before it is kept (see `bounds`): a tenant's annotation is held,
    // warned about and logged on every node.
    let topology_keys = match annotations.get(ANNOTATION_TOPOLOGY_KEYS) {
        Some(value) if !value.trim().is_empty() => {
            Some(TopologyKeysSpec::new(TopologyKeysSource::Annotation, value.split(',')))
        }
        _ => spec
            .topology_keys
            .as_ref()
            .filter(|keys| !keys.is_empty())
            .map(|keys| TopologyKeysSpec::new(TopologyKeysSource::Spec, keys.iter().map(String::as_str))),
    };
    let topology_mode = [ANNOTATION_TOPOLOGY_MODE, ANNOTATION_TOPOLOGY_AWARE_HINTS]
        .iter()
        .find_map(|name| annotations.get(*name).filter(|v| !v.is_empty()))
        .map(|mode| bounds::bounded(mode, bounds::MAX_SHORT_VALUE));
    let agent_annotations: BTreeMap<String, String> = AGENT_ANNOTATIONS
        .iter()
        .filter_map(|name| {
            Some(((*name).to_owned(), bounds::bounded(annotations.get(*name)?, bounds::MAX_SHORT_VALUE)))
        })
        .collect();

    let headless = !external_name && ips.iter().any(|ip| ip == "None");
    let other_proxy = metadata.labels.as_ref().and_then(|labels| {
        LABELS_OTHER_PROXY.iter().find_map(|label| {
            let value = labels.get(*label)?;
            Some(format!("{label}={}", bounds::bounded(value, bounds::MAX_SHORT_VALUE)))
        })
    });
    let external_name = match spec.external_name.as_deref() {
        Some(target) if external_name => {
            Some(external_target(target).map_err(|why| error("spec.externalName".into(), why.to_string()))?)
        }
        _ => None,
    };
    Ok(Service {
        key,
        cluster_ips,
        headless,
        ports,
        internal_traffic_local,
        session_affinity_timeout_s,
        traffic_distribution: spec.traffic_distribution.as_deref().map(TrafficDistribution::parse),
        topology_keys,
        topology_mode,
        agent_annotations,
        external_name,
        other_proxy,
    })
}

/// `spec.externalName` is not a DNS name.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a DNS name")]
struct NotDnsName(String);

/// `spec.externalName` as a DNS name the responder can answer with (lowercase, no final dot): at
/// most 253 characters of labels of letters, digits, `-` and `_`.
fn external_target(target: &str) -> Result<String, NotDnsName> {
    let name = target.trim_end_matches('.').to_ascii_lowercase();
    let valid_label = |label: &str| {
        (1..=63).contains(&label.len()) && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if name.is_empty() || name.len() > 253 || !name.split('.').all(valid_label) {
        return Err(NotDnsName(bounds::bounded(target, bounds::MAX_SHORT_VALUE)));
    }
    Ok(name)
}

/// kube-proxy's default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10_800;
/// The API server's upper bound on `sessionAffinityConfig.clientIP.timeoutSeconds` (one day).
const MAX_AFFINITY_TIMEOUT_S: i32 = 86_400;

/// `spec.sessionAffinity` and its timeout; an error names the field.
fn session_affinity(spec: &SpecView) -> Result<Option<u32>, (&'static str, String)> {
    match spec.session_affinity.as_deref() {
        None | Some("None") => Ok(None),
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|config| config.client_ip.as_ref())
                .and_then(|client| client.timeout_seconds);
            match timeout {
                None => Ok(Some(DEFAULT_AFFINITY_TIMEOUT_S)),
                Some(seconds) if (1..=MAX_AFFINITY_TIMEOUT_S).contains(&seconds) => Ok(Some(seconds as u32)),
                Some(seconds) => Err((
                    "spec.sessionAffinityConfig.clientIP.timeoutSeconds",
                    format!("{seconds} is not between 1 and {MAX_AFFINITY_TIMEOUT_S}"),
                )),
            }
        }
        Some(other) => Err(("spec.sessionAffinity", format!("{other:?} is neither None nor ClientIP"))),
    }
}

fn indexed(field: &str, index: usize) -> String {
    if field == "spec.clusterIP" { field.to_owned() } else { format!("{field}[{index}]") }
}
