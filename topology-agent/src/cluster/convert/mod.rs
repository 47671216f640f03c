//! Kubernetes objects (k8s-openapi types, or raw JSON for fields newer clients no longer model)
//! into the cluster model. Each error names the object and the field.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::{
    api::{
        core::v1::{Service as K8sService, ServiceSpec},
        discovery::v1::EndpointSlice as K8sEndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::model::{
    Endpoint, EndpointSlice, Family, Kind, LABEL_SERVICE_NAME, ObjectError, ObjectKey, PortSpec, Service, SlicePort,
    TopologyKeysSource, TopologyKeysSpec, TrafficDistribution,
};
use crate::desired::{Protocol, UnknownProtocol};

mod node;

pub use self::node::{NodeView, node};

/// Annotation carrying topology keys (KEP-536) on clusters without `spec.topologyKeys`.
pub const ANNOTATION_TOPOLOGY_KEYS: &str = "topology-agent.io/topology-keys";
/// Topology Aware Routing annotation (Kubernetes 1.27+).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// Topology Aware Hints annotation (Kubernetes 1.23-1.26).
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// Prefix of this agent's own annotations.
pub const AGENT_ANNOTATION_PREFIX: &str = "topology-agent.io/";

/// A Service into the model. `spec_topology_keys` is `spec.topologyKeys` when the object carries it
/// (read from the raw object: current API types no longer have the field).
pub fn service(service: &K8sService, spec_topology_keys: Option<Vec<String>>) -> Result<Service, ObjectError> {
    let key = object_key(&service.metadata);
    let error =
        |field: String, message: String| ObjectError { kind: Kind::Service, name: key.to_string(), field, message };
    if key.name.is_empty() {
        return Err(error("metadata.name".into(), "missing".into()));
    }
    let spec = service.spec.clone().unwrap_or_default();

    let mut cluster_ips = Vec::new();
    let external_name = spec.type_.as_deref() == Some("ExternalName");
    let (ips, field) = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => (ips.clone(), "spec.clusterIPs"),
        _ => (spec.cluster_ip.clone().into_iter().collect(), "spec.clusterIP"),
    };
    for (i, ip) in ips.iter().enumerate() {
        if ip == "None" || ip.is_empty() || external_name {
            continue;
        }
        let parsed: IpAddr =
            ip.parse().map_err(|_| error(indexed(field, i), format!("{ip:?} is not an IP address")))?;
        cluster_ips.push(parsed);
    }

    let mut ports = Vec::new();
    for (i, port) in spec.ports.iter().flatten().enumerate() {
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

    let session_affinity_timeout_s =
        session_affinity(&spec).map_err(|(field, message)| error(field.into(), message))?;

    let annotations = service.metadata.annotations.clone().unwrap_or_default();
    let topology_keys = match annotations.get(ANNOTATION_TOPOLOGY_KEYS) {
        Some(value) if !value.trim().is_empty() => Some(TopologyKeysSpec {
            source: TopologyKeysSource::Annotation,
            keys: value.split(',').map(|key| key.trim().to_owned()).collect(),
        }),
        _ => spec_topology_keys
            .filter(|keys| !keys.is_empty())
            .map(|keys| TopologyKeysSpec { source: TopologyKeysSource::Spec, keys }),
    };
    let topology_mode = [ANNOTATION_TOPOLOGY_MODE, ANNOTATION_TOPOLOGY_AWARE_HINTS]
        .iter()
        .find_map(|name| annotations.get(*name).filter(|v| !v.is_empty()).cloned());
    let agent_annotations: BTreeMap<String, String> =
        annotations.into_iter().filter(|(name, _)| name.starts_with(AGENT_ANNOTATION_PREFIX)).collect();

    let headless = !external_name && ips.iter().any(|ip| ip == "None");
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
    })
}

/// kube-proxy's default `sessionAffinityConfig.clientIP.timeoutSeconds` (3 hours).
pub const DEFAULT_AFFINITY_TIMEOUT_S: u32 = 10_800;
/// The API server's upper bound on `sessionAffinityConfig.clientIP.timeoutSeconds` (one day).
const MAX_AFFINITY_TIMEOUT_S: i32 = 86_400;

/// `spec.sessionAffinity` and its timeout; an error names the field.
fn session_affinity(spec: &ServiceSpec) -> Result<Option<u32>, (&'static str, String)> {
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

/// An EndpointSlice into the model; `None` for FQDN slices, which carry no addresses to route to.
pub fn endpoint_slice(slice: &K8sEndpointSlice) -> Result<Option<EndpointSlice>, ObjectError> {
    let key = object_key(&slice.metadata);
    let error = |field: String, message: String| ObjectError {
        kind: Kind::EndpointSlice,
        name: key.to_string(),
        field,
        message,
    };
    if key.name.is_empty() {
        return Err(error("metadata.name".into(), "missing".into()));
    }
    let family = match slice.address_type.as_str() {
        "IPv4" => Family::V4,
        "IPv6" => Family::V6,
        "FQDN" => return Ok(None),
        other => {
            return Err(error("addressType".into(), format!("{other:?} is not IPv4, IPv6 or FQDN")));
        }
    };
    let service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(LABEL_SERVICE_NAME))
        .filter(|name| !name.is_empty())
        .map(|name| ObjectKey::new(key.namespace.clone(), name.clone()));

    let mut ports = Vec::new();
    for (i, port) in slice.ports.iter().flatten().enumerate() {
        // A port without a number means "all ports", which kube-proxy does not route either.
        let Some(number) = port.port.filter(|&p| p != 0) else {
            continue;
        };
        let number = u16::try_from(number)
            .map_err(|_| error(format!("ports[{i}].port"), format!("{number} is not a port number")))?;
        let protocol = protocol(port.protocol.as_deref())
            .map_err(|unknown| error(format!("ports[{i}].protocol"), unknown.to_string()))?;
        ports.push(SlicePort { name: port.name.clone().unwrap_or_default(), port: number, protocol });
    }

    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        // Named only on error: a list of 500,000 endpoints formats none.
        let field = || format!("endpoints[{i}].addresses[0]");
        let text =
            endpoint.addresses.first().ok_or_else(|| error(format!("endpoints[{i}].addresses"), "empty".into()))?;
        let address: IpAddr = text.parse().map_err(|_| error(field(), format!("{text:?} is not an IP address")))?;
        if Family::of(&address) != family {
            return Err(error(field(), format!("{address} is not an {} address", slice.address_type)));
        }
        let hostname = match endpoint.hostname.as_deref().filter(|h| !h.is_empty()) {
            Some(name) if !is_dns_label(name) => {
                return Err(error(format!("endpoints[{i}].hostname"), format!("{name:?} is not a DNS label")));
            }
            name => name.map(|name| name.to_ascii_lowercase().into_boxed_str()),
        };
        let conditions = endpoint.conditions.clone().unwrap_or_default();
        let hints = endpoint.hints.clone().unwrap_or_default();
        endpoints.push(Endpoint {
            address,
            // As kube-proxy reads them: ready and serving default to true, terminating to false.
            ready: conditions.ready.unwrap_or(true),
            serving: conditions.serving.unwrap_or(true),
            terminating: conditions.terminating.unwrap_or(false),
            node_name: endpoint.node_name.as_deref().filter(|n| !n.is_empty()).map(Into::into),
            zone: endpoint.zone.as_deref().filter(|z| !z.is_empty()).map(Into::into),
            hint_zones: hints.for_zones.unwrap_or_default().into_iter().map(|z| z.name).collect(),
            hint_nodes: hints.for_nodes.unwrap_or_default().into_iter().map(|n| n.name).collect(),
            hostname,
        });
    }
    Ok(Some(EndpointSlice { key, service, family, ports, endpoints }))
}

/// An RFC 1123 label (what the API server allows in `hostname`), case-insensitively.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}

/// A Service from its raw JSON: the k8s-openapi type for everything current, plus
/// `spec.topologyKeys`, which current API types no longer carry.
pub fn service_from_value(raw: &serde_json::Value) -> Result<Service, ObjectError> {
    let typed_service: K8sService = typed(raw, Kind::Service)?;
    let keys = spec_topology_keys(raw).map_err(|invalid| ObjectError {
        kind: Kind::Service,
        name: name_of(raw),
        field: "spec.topologyKeys".into(),
        message: invalid.to_string(),
    })?;
    service(&typed_service, keys)
}

/// Deserializes a raw object into its k8s-openapi type; an error names the failing field.
pub fn typed<T: serde::de::DeserializeOwned>(raw: &serde_json::Value, kind: Kind) -> Result<T, ObjectError> {
    serde_path_to_error::deserialize(raw).map_err(|error| {
        let field = error.path().to_string();
        ObjectError {
            kind,
            name: name_of(raw),
            field: if field == "." { "(object)".into() } else { field },
            message: error.into_inner().to_string(),
        }
    })
}

/// `namespace/name`, or `name` for a Node, as far as the raw object says.
pub fn name_of(raw: &serde_json::Value) -> String {
    let name = raw.pointer("/metadata/name").and_then(serde_json::Value::as_str).unwrap_or("(unnamed)");
    match raw.pointer("/metadata/namespace").and_then(serde_json::Value::as_str) {
        Some(namespace) if raw.get("kind").and_then(serde_json::Value::as_str) != Some("Node") => {
            format!("{namespace}/{name}")
        }
        _ => name.to_owned(),
    }
}

/// `spec.topologyKeys` of a raw Service object, if present.
pub fn spec_topology_keys(raw: &serde_json::Value) -> Result<Option<Vec<String>>, TopologyKeysFieldError> {
    match raw.pointer("/spec/topologyKeys") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or_else(|| TopologyKeysFieldError::Item(item.to_string())))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(TopologyKeysFieldError::NotAList(other.to_string())),
    }
}

/// `spec.topologyKeys` that is not a list of strings.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TopologyKeysFieldError {
    /// The field is something else than a list.
    #[error("{0} is not a list of strings")]
    NotAList(String),
    /// An entry is not a string.
    #[error("{0} is not a string")]
    Item(String),
}

fn object_key(metadata: &ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        metadata.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into()),
        metadata.name.clone().unwrap_or_default(),
    )
}

/// A port's protocol; absent means TCP.
fn protocol(value: Option<&str>) -> Result<Protocol, UnknownProtocol> {
    value.map_or(Ok(Protocol::Tcp), str::parse)
}

fn indexed(field: &str, index: usize) -> String {
    if field == "spec.clusterIP" { field.to_owned() } else { format!("{field}[{index}]") }
}

/// Why a quantity cannot be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// Not a number with a suffix.
    #[error("{0:?} is not a quantity")]
    NotAQuantity(String),
    /// Below zero.
    #[error("{0:?} is negative")]
    Negative(String),
    /// `e`/`E` followed by something else than an integer.
    #[error("{0:?} has an invalid exponent")]
    Exponent(String),
    /// A suffix Kubernetes does not define.
    #[error("{quantity:?} has an unknown suffix {suffix:?}")]
    Suffix {
        /// The quantity.
        quantity: String,
        /// Its suffix.
        suffix: String,
    },
}

/// A Kubernetes quantity (`resource.Quantity`) as thousandths, rounded up as `MilliValue()` does:
/// a sign, a decimal number (`2`, `1.5`, `.5`), and a binary SI suffix (`Ki` … `Ei`), a decimal SI
/// suffix (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal exponent (`e3`, `E-2`).
/// Negative quantities are refused; values beyond `u64` saturate.
pub fn cpu_millis(quantity: &str) -> Result<u64, QuantityError> {
    let text = quantity.trim();
    let invalid = || QuantityError::NotAQuantity(text.to_owned());
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    if unsigned.starts_with('-') {
        return Err(QuantityError::Negative(text.to_owned()));
    }
    let digits = unsigned.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(digits);
    if number.is_empty() || number == "." || number.matches('.').count() > 1 {
        return Err(invalid());
    }
    let value: f64 = number.parse().map_err(|_| invalid())?;
    // Thousandths per unit of the suffix.
    let scale = match suffix {
        "" => 1e3,
        "n" => 1e-6,
        "u" => 1e-3,
        "m" => 1.0,
        "k" => 1e6,
        "M" => 1e9,
        "G" => 1e12,
        "T" => 1e15,
        "P" => 1e18,
        "E" => 1e21,
        "Ki" => 1e3 * 1024.0,
        "Mi" => 1e3 * 1024f64.powi(2),
        "Gi" => 1e3 * 1024f64.powi(3),
        "Ti" => 1e3 * 1024f64.powi(4),
        "Pi" => 1e3 * 1024f64.powi(5),
        "Ei" => 1e3 * 1024f64.powi(6),
        exponent if exponent.starts_with(['e', 'E']) => {
            let power: i32 = exponent[1..].parse().map_err(|_| QuantityError::Exponent(text.to_owned()))?;
            1e3 * 10f64.powi(power.clamp(-40, 40))
        }
        other => return Err(QuantityError::Suffix { quantity: text.to_owned(), suffix: other.to_owned() }),
    };
    let millis = (value * scale).ceil();
    // `as` saturates: a quantity beyond u64 is as much CPU as can be counted.
    Ok(if millis.is_finite() { millis as u64 } else { u64::MAX })
}

#[cfg(test)]
mod tests;
