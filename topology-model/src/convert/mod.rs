//! Kubernetes objects into the cluster model, read through lean views of the API's JSON that build
//! only the fields routing uses. Each error names the object and the field.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::objects::{Kind, ObjectError, ObjectKey};
use crate::{Protocol, UnknownProtocol};

mod meta;
mod node;
mod service;
mod slice;
mod text;

pub use self::{
    node::{NodeView, node},
    service::{DEFAULT_AFFINITY_TIMEOUT_S, ServiceView, service, service_from_value},
    slice::{EndpointSliceView, endpoint_slice},
};

/// Annotation carrying topology keys (KEP-536) on clusters without `spec.topologyKeys`.
pub const ANNOTATION_TOPOLOGY_KEYS: &str = "topology-agent.io/topology-keys";
/// Topology Aware Routing annotation (Kubernetes 1.27+).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// Topology Aware Hints annotation (Kubernetes 1.23-1.26).
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// This agent's own annotations that the policy reads: the only ones kept, bounded.
pub const AGENT_ANNOTATIONS: [&str; 4] = [
    crate::objects::ANNOTATION_SPILLOVER,
    crate::objects::ANNOTATION_MAX_OVERLOAD,
    crate::objects::ANNOTATION_DNS,
    crate::objects::ANNOTATION_OUTLIER_EJECTION,
];

/// Deserializes a raw object into its view; an error names the failing field.
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

/// `namespace/name`; an object without a namespace is in `default`.
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
