//! Kubernetes objects (k8s-openapi types, or raw JSON for fields newer clients no longer model)
//! into the cluster model. Each error names the object and the field.

use std::{collections::BTreeMap, net::IpAddr};

use k8s_openapi::{
    api::{
        core::v1::{Node as K8sNode, Service as K8sService, ServiceSpec},
        discovery::v1::EndpointSlice as K8sEndpointSlice,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::model::{
    Endpoint, EndpointSlice, Family, Kind, LABEL_SERVICE_NAME, Node, ObjectError, ObjectKey, Service, ServicePort,
    SlicePort, TopologyKeysSource, TopologyKeysSpec, TrafficDistribution,
};
use crate::desired::Protocol;

/// Annotation carrying topology keys (KEP-536) on clusters without `spec.topologyKeys`.
pub const ANNOTATION_TOPOLOGY_KEYS: &str = "topology-agent.io/topology-keys";
/// Topology Aware Routing annotation (Kubernetes 1.27+).
pub const ANNOTATION_TOPOLOGY_MODE: &str = "service.kubernetes.io/topology-mode";
/// Topology Aware Hints annotation (Kubernetes 1.23-1.26).
pub const ANNOTATION_TOPOLOGY_AWARE_HINTS: &str = "service.kubernetes.io/topology-aware-hints";
/// Prefix of this agent's own annotations.
pub const AGENT_ANNOTATION_PREFIX: &str = "topology-agent.io/";

/// A Node into the model.
pub fn node(node: &K8sNode) -> Result<Node, ObjectError> {
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
    let allocatable_cpu_millis = match status.and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get("cpu")) {
        Some(quantity) => cpu_millis(&quantity.0).map_err(|message| error("status.allocatable.cpu", message))?,
        None => 0,
    };
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|conditions| conditions.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True");
    Ok(Node { name, labels: node.metadata.labels.clone().unwrap_or_default(), allocatable_cpu_millis, ready })
}

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
            .map_err(|message| error(format!("spec.ports[{i}].protocol"), message))?;
        ports.push(ServicePort { name: port.name.clone().unwrap_or_default(), port: number, protocol });
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

    Ok(Service {
        key,
        cluster_ips,
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
        let protocol =
            protocol(port.protocol.as_deref()).map_err(|message| error(format!("ports[{i}].protocol"), message))?;
        ports.push(SlicePort { name: port.name.clone().unwrap_or_default(), port: number, protocol });
    }

    let mut endpoints = Vec::with_capacity(slice.endpoints.len());
    for (i, endpoint) in slice.endpoints.iter().enumerate() {
        let field = format!("endpoints[{i}].addresses[0]");
        let text =
            endpoint.addresses.first().ok_or_else(|| error(format!("endpoints[{i}].addresses"), "empty".into()))?;
        let address: IpAddr =
            text.parse().map_err(|_| error(field.clone(), format!("{text:?} is not an IP address")))?;
        if Family::of(&address) != family {
            return Err(error(field, format!("{address} is not an {} address", slice.address_type)));
        }
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
        });
    }
    Ok(Some(EndpointSlice { key, service, family, ports, endpoints }))
}

/// A Service from its raw JSON: the k8s-openapi type for everything current, plus
/// `spec.topologyKeys`, which current API types no longer carry.
pub fn service_from_value(raw: &serde_json::Value) -> Result<Service, ObjectError> {
    let typed_service: K8sService = typed(raw, Kind::Service)?;
    let keys = spec_topology_keys(raw).map_err(|message| ObjectError {
        kind: Kind::Service,
        name: name_of(raw),
        field: "spec.topologyKeys".into(),
        message,
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
pub fn spec_topology_keys(raw: &serde_json::Value) -> Result<Option<Vec<String>>, String> {
    match raw.pointer("/spec/topologyKeys") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned).ok_or_else(|| format!("{item} is not a string")))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(format!("{other} is not a list of strings")),
    }
}

fn object_key(metadata: &ObjectMeta) -> ObjectKey {
    ObjectKey::new(
        metadata.namespace.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| "default".into()),
        metadata.name.clone().unwrap_or_default(),
    )
}

/// A port's protocol; absent means TCP.
fn protocol(value: Option<&str>) -> Result<Protocol, String> {
    value.map_or(Ok(Protocol::Tcp), str::parse)
}

fn indexed(field: &str, index: usize) -> String {
    if field == "spec.clusterIP" { field.to_owned() } else { format!("{field}[{index}]") }
}

/// A Kubernetes quantity (`resource.Quantity`) as thousandths, rounded up as `MilliValue()` does:
/// a sign, a decimal number (`2`, `1.5`, `.5`), and a binary SI suffix (`Ki` … `Ei`), a decimal SI
/// suffix (`n`, `u`, `m`, none, `k`, `M`, `G`, `T`, `P`, `E`) or a decimal exponent (`e3`, `E-2`).
/// Negative quantities are refused; values beyond `u64` saturate.
pub fn cpu_millis(quantity: &str) -> Result<u64, String> {
    let text = quantity.trim();
    let invalid = || format!("{text:?} is not a quantity");
    let unsigned = text.strip_prefix('+').unwrap_or(text);
    if unsigned.starts_with('-') {
        return Err(format!("{text:?} is negative"));
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
            let power: i32 = exponent[1..].parse().map_err(|_| format!("{text:?} has an invalid exponent"))?;
            1e3 * 10f64.powi(power.clamp(-40, 40))
        }
        other => return Err(format!("{text:?} has an unknown suffix {other:?}")),
    };
    let millis = (value * scale).ceil();
    // `as` saturates: a quantity beyond u64 is as much CPU as can be counted.
    Ok(if millis.is_finite() { millis as u64 } else { u64::MAX })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service_from(json: serde_json::Value) -> Result<Service, ObjectError> {
        service_from_value(&json)
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(cpu_millis("4"), Ok(4000));
        assert_eq!(cpu_millis("3500m"), Ok(3500));
        assert_eq!(cpu_millis("1.5"), Ok(1500));
        assert_eq!(cpu_millis("250000u"), Ok(250));
        assert!(cpu_millis("four").is_err());
        assert!(cpu_millis("4x").is_err());
        for (quantity, millis) in [
            ("500m", 500),
            ("2", 2000),
            ("2k", 2_000_000),
            ("1e3", 1_000_000),
            ("1E-3", 1),
            (".5", 500),
            ("0.5Ki", 512_000),
            ("+1", 1000),
            ("0.0001", 1),
            ("1n", 1),
            ("9E", u64::MAX),
        ] {
            assert_eq!(cpu_millis(quantity), Ok(millis), "{quantity}");
        }
        for bad in ["-1", "", ".", "1..2", "1e", "1ee3", "Ki", "1 Ki"] {
            assert!(cpu_millis(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn service_fields_and_defaults() {
        let svc = service_from(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "annotations": {
                "topology-agent.io/topology-keys": "kubernetes.io/hostname, topology.kubernetes.io/zone,*",
                "service.kubernetes.io/topology-aware-hints": "auto",
                "topology-agent.io/spillover": "capacity",
                "unrelated": "x"}},
            "spec": {"clusterIPs": ["10.96.0.10", "fd00::10"], "ports": [{"port": 80}, {"name": "dns", "port": 53, "protocol": "UDP"}],
                     "internalTrafficPolicy": "Cluster", "trafficDistribution": "PreferClose"}
        }))
        .unwrap();
        assert_eq!(svc.key, ObjectKey::new("default", "web"));
        assert_eq!(svc.cluster_ips.len(), 2);
        assert_eq!(svc.ports[0], ServicePort { name: String::new(), port: 80, protocol: Protocol::Tcp });
        assert_eq!(svc.ports[1].protocol, Protocol::Udp);
        assert_eq!(svc.traffic_distribution, Some(TrafficDistribution::PreferClose));
        let keys = svc.topology_keys.unwrap();
        assert_eq!(keys.source, TopologyKeysSource::Annotation);
        assert_eq!(keys.keys, ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"]);
        assert_eq!(svc.topology_mode.as_deref(), Some("auto"));
        assert_eq!(svc.agent_annotations.len(), 2);
        assert_eq!(svc.session_affinity_timeout_s, None);
    }

    #[test]
    fn session_affinity_defaults_to_three_hours_and_bad_values_name_the_field() {
        let with = |spec: serde_json::Value| {
            service_from(
                serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"}, "spec": spec}),
            )
        };
        let default = with(serde_json::json!({"clusterIP": "10.96.0.1", "sessionAffinity": "ClientIP"})).unwrap();
        assert_eq!(default.session_affinity_timeout_s, Some(10_800));
        let set = with(serde_json::json!({"sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 60}}}))
        .unwrap();
        assert_eq!(set.session_affinity_timeout_s, Some(60));
        assert_eq!(with(serde_json::json!({"sessionAffinity": "None"})).unwrap().session_affinity_timeout_s, None);
        let error = with(serde_json::json!({"sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}}}))
        .unwrap_err();
        assert_eq!(
            error.to_string(),
            "Service default/web: spec.sessionAffinityConfig.clientIP.timeoutSeconds: 0 is not between 1 and 86400"
        );
        let error = with(serde_json::json!({"sessionAffinity": "Cookie"})).unwrap_err();
        assert_eq!(
            error.to_string(),
            "Service default/web: spec.sessionAffinity: \"Cookie\" is neither None nor ClientIP"
        );
    }

    #[test]
    fn spec_topology_keys_are_read_from_the_raw_object() {
        let svc = service_from(serde_json::json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": "shop"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}], "topologyKeys": ["kubernetes.io/hostname", "*"]}
        }))
        .unwrap();
        let keys = svc.topology_keys.unwrap();
        assert_eq!((keys.source, keys.keys.len()), (TopologyKeysSource::Spec, 2));
    }

    #[test]
    fn topology_mode_wins_over_the_older_annotation() {
        let svc = service_from(serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "web", "annotations": {"service.kubernetes.io/topology-mode": "Auto",
                "service.kubernetes.io/topology-aware-hints": "disabled"}},
            "spec": {"clusterIP": "10.96.0.10"}
        }))
        .unwrap();
        assert_eq!(svc.topology_mode.as_deref(), Some("Auto"));
    }

    #[test]
    fn headless_and_external_name_services_have_no_cluster_ip() {
        for spec in [
            serde_json::json!({"clusterIP": "None", "ports": [{"port": 80}]}),
            serde_json::json!({"type": "ExternalName", "externalName": "example.com"}),
        ] {
            let svc = service_from(
                serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "h"}, "spec": spec}),
            )
            .unwrap();
            assert!(svc.cluster_ips.is_empty());
        }
    }

    #[test]
    fn service_errors_name_the_field() {
        let bad_ip =
            service_from(serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"clusterIPs": ["10.96.0.10", "not-an-ip"]}}))
            .unwrap_err();
        assert_eq!(bad_ip.to_string(), "Service default/web: spec.clusterIPs[1]: \"not-an-ip\" is not an IP address");
        let bad_port =
            service_from(serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 70000}]}}))
            .unwrap_err();
        assert_eq!(bad_port.field, "spec.ports[0].port");
        let bad_policy =
            service_from(serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
            "spec": {"clusterIP": "10.96.0.10", "internalTrafficPolicy": "local"}}))
            .unwrap_err();
        assert_eq!(bad_policy.field, "spec.internalTrafficPolicy");
    }

    fn slice_from(json: serde_json::Value) -> Result<Option<EndpointSlice>, ObjectError> {
        endpoint_slice(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn endpoint_slice_conditions_default_as_kube_proxy_reads_them() {
        let slice = slice_from(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}, {"name": "all"}],
            "endpoints": [
                {"addresses": ["10.1.0.1"], "nodeName": "a", "zone": "z1", "hints": {"forZones": [{"name": "z1"}], "forNodes": [{"name": "a"}]}},
                {"addresses": ["10.1.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}}
            ]
        }))
        .unwrap()
        .unwrap();
        assert_eq!(slice.service, Some(ObjectKey::new("shop", "web")));
        assert_eq!(slice.ports.len(), 1, "a port without a number is not routable");
        let (a, b) = (&slice.endpoints[0], &slice.endpoints[1]);
        assert!(a.ready && a.serving && !a.terminating);
        assert_eq!((a.hint_zones.clone(), a.hint_nodes.clone()), (vec!["z1".to_owned()], vec!["a".to_owned()]));
        assert!(!b.ready && b.serving && b.terminating);
        assert_eq!(b.node_name, None);
        assert_eq!(a.node_name.as_deref(), Some("a"));
    }

    #[test]
    fn endpoint_slice_errors_name_the_field_and_fqdn_is_skipped() {
        let wrong_family = slice_from(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s"},
            "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["fd00::1"]}]
        }))
        .unwrap_err();
        assert_eq!(wrong_family.field, "endpoints[1].addresses[0]");
        assert!(wrong_family.message.contains("not an IPv4 address"), "{wrong_family}");
        let fqdn = slice_from(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s"},
            "addressType": "FQDN", "endpoints": [{"addresses": ["example.com"]}]
        }))
        .unwrap();
        assert_eq!(fqdn, None);
    }

    #[test]
    fn node_topology_and_capacity() {
        let node = node(
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": "zone-a"}},
                "status": {"allocatable": {"cpu": "3500m"}, "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap(),
        )
        .unwrap();
        assert_eq!((node.allocatable_cpu_millis, node.ready), (3500, true));
        assert_eq!(node.zone(), Some("zone-a"));
        assert_eq!(node.topology_value("kubernetes.io/hostname"), Some("node-a"), "hostname defaults to the name");
        assert_eq!(node.region(), None);
    }
}
