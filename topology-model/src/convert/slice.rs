//! An EndpointSlice as the agent reads it, decoded straight from the API's JSON: per endpoint its
//! address, conditions, node, zone, hints and hostname. Target references, deprecated topology,
//! managed fields and the rest are skipped by the parser without being built: a full list of
//! 500,000 endpoints allocates what routing keeps, not the objects' whole trees.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;

use super::{
    meta::{lean_metadata, null_as_default, view_resource},
    object_key, protocol,
    text::{FirstAddress, SharedName},
};
use crate::objects::{
    ANNOTATION_TRIGGER_TIME, Endpoint, EndpointExtra, EndpointSlice, Family, Kind, LABEL_SERVICE_NAME, ObjectError,
    ObjectKey, SlicePort,
};

/// The fields of an EndpointSlice routing reads.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSliceView {
    /// Name, namespace, resourceVersion and labels only.
    #[serde(default, deserialize_with = "lean_metadata")]
    pub metadata: ObjectMeta,
    /// `IPv4`, `IPv6` or `FQDN`.
    #[serde(default)]
    pub address_type: String,
    /// The endpoints.
    #[serde(default, deserialize_with = "null_as_default")]
    pub endpoints: Vec<EndpointView>,
    /// The ports.
    #[serde(default, deserialize_with = "null_as_default")]
    pub ports: Vec<SlicePortView>,
}

view_resource!(EndpointSliceView, Namespace, "EndpointSlice", "discovery.k8s.io", "v1", "endpointslices");

/// One endpoint.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EndpointView {
    /// Its first address (the one kube-proxy uses); the others are skipped.
    #[serde(deserialize_with = "null_as_default")]
    pub addresses: FirstAddress,
    /// `ready`, `serving`, `terminating`.
    pub conditions: Option<ConditionsView>,
    /// `hostname` (DNS names of headless Services).
    pub hostname: Option<String>,
    /// `nodeName`, shared with the other endpoints on that node.
    pub node_name: Option<SharedName>,
    /// `zone`, shared likewise.
    pub zone: Option<SharedName>,
    /// `hints`.
    pub hints: Option<HintsView>,
}

/// An endpoint's conditions; absent ones take kube-proxy's defaults.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct ConditionsView {
    /// `ready`.
    pub ready: Option<bool>,
    /// `serving`.
    pub serving: Option<bool>,
    /// `terminating`.
    pub terminating: Option<bool>,
}

/// An endpoint's topology hints.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct HintsView {
    /// `forZones[].name`.
    #[serde(deserialize_with = "null_as_default")]
    pub for_zones: Vec<Named>,
    /// `forNodes[].name`.
    #[serde(deserialize_with = "null_as_default")]
    pub for_nodes: Vec<Named>,
}

/// An entry of a hint list.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct Named {
    /// The zone or node.
    #[serde(default)]
    pub name: String,
}

/// A port of the slice.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(default)]
pub struct SlicePortView {
    /// Its name (matched against the Service port's).
    pub name: Option<String>,
    /// Its number; absent means all ports.
    pub port: Option<i32>,
    /// Absent means TCP.
    pub protocol: Option<String>,
}

/// An EndpointSlice into the model; `None` for FQDN slices, which carry no addresses to route to.
pub fn endpoint_slice(slice: &EndpointSliceView) -> Result<Option<EndpointSlice>, ObjectError> {
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
        .map(|name| ObjectKey::new(key.namespace.clone(), name.as_str()));

    let mut ports = Vec::with_capacity(slice.ports.len());
    for (i, port) in slice.ports.iter().enumerate() {
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
        let address = match &endpoint.addresses {
            FirstAddress::Ip(address) => *address,
            FirstAddress::Missing => return Err(error(format!("endpoints[{i}].addresses"), "empty".into())),
            FirstAddress::Invalid(text) => return Err(error(field(), format!("{text:?} is not an IP address"))),
        };
        if Family::of(&address) != family {
            return Err(error(field(), format!("{address} is not an {} address", slice.address_type)));
        }
        if let Some(kind) = unroutable(&address) {
            // As the API server's own validation of endpoint addresses: such a backend would be
            // the connecting host itself (or nothing), and redirect host processes' connections.
            return Err(error(field(), format!("{address} is {kind} address, which no endpoint may have")));
        }
        let hostname = match endpoint.hostname.as_deref().filter(|h| !h.is_empty()) {
            Some(name) if !is_dns_label(name) => {
                return Err(error(format!("endpoints[{i}].hostname"), format!("{name:?} is not a DNS label")));
            }
            name => name.map(|name| name.to_ascii_lowercase().into_boxed_str()),
        };
        let conditions = endpoint.conditions.as_ref();
        let hints = endpoint.hints.as_ref();
        let names = |list: Option<&Vec<Named>>| list.into_iter().flatten().map(|n| n.name.clone()).collect();
        endpoints.push(Endpoint {
            address,
            // As kube-proxy reads them: ready and serving default to true, terminating to false.
            ready: conditions.and_then(|c| c.ready).unwrap_or(true),
            serving: conditions.and_then(|c| c.serving).unwrap_or(true),
            terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
            node_name: endpoint.node_name.as_ref().filter(|n| !n.0.is_empty()).map(|n| n.0.clone()),
            zone: endpoint.zone.as_ref().filter(|z| !z.0.is_empty()).map(|z| z.0.clone()),
            extra: EndpointExtra::new(names(hints.map(|h| &h.for_zones)), names(hints.map(|h| &h.for_nodes)), hostname),
        });
    }
    // A stamp that does not parse only leaves the change unmeasured, as in kube-proxy.
    let changed_at = slice
        .metadata
        .annotations
        .as_ref()
        .and_then(|annotations| annotations.get(ANNOTATION_TRIGGER_TIME))
        .and_then(|stamp| humantime::parse_rfc3339_weak(stamp).ok());
    Ok(Some(EndpointSlice { key, service, family, ports, endpoints, changed_at }))
}

/// What kind of address no endpoint may have, if `address` is one: loopback, link-local,
/// unspecified or multicast.
fn unroutable(address: &std::net::IpAddr) -> Option<&'static str> {
    use std::net::IpAddr;
    match address {
        _ if address.is_loopback() => Some("a loopback"),
        _ if address.is_unspecified() => Some("the unspecified"),
        _ if address.is_multicast() => Some("a multicast"),
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local"),
        IpAddr::V6(v6) if v6.is_unicast_link_local() => Some("a link-local"),
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback() || v4.is_link_local()) => {
            Some("an IPv4-mapped loopback or link-local")
        }
        _ => None,
    }
}

/// An RFC 1123 label (what the API server allows in `hostname`), case-insensitively.
fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        && bytes[0] != b'-'
        && bytes[bytes.len() - 1] != b'-'
}
