//! Conversion of API objects into the model: fields, defaults, and errors naming the field.

use super::*;
use crate::objects::{
    ANNOTATION_TRIGGER_TIME, EndpointSlice, PortSpec, Service, TopologyKeysSource, TrafficDistribution,
};

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
    assert_eq!(svc.ports[0], PortSpec { name: String::new(), port: 80, protocol: Protocol::Tcp });
    assert_eq!(svc.ports[1].protocol, Protocol::Udp);
    assert_eq!(svc.traffic_distribution, Some(TrafficDistribution::PreferClose));
    let keys = svc.topology_keys.unwrap();
    assert_eq!(keys.source, TopologyKeysSource::Annotation);
    assert_eq!(keys.keys, ["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"]);
    let written = keys.written;
    assert_eq!(svc.topology_mode.as_deref(), Some("auto"));
    // Only the agent's annotations the policy reads; the keys are kept once, parsed, above.
    assert_eq!(svc.agent_annotations.keys().collect::<Vec<_>>(), ["topology-agent.io/spillover"]);
    assert_eq!(written, 3);
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
    assert_eq!(error.to_string(), "Service default/web: spec.sessionAffinity: \"Cookie\" is neither None nor ClientIP");
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
    let bad_ip = service_from(serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"clusterIPs": ["10.96.0.10", "not-an-ip"]}}))
    .unwrap_err();
    assert_eq!(bad_ip.to_string(), "Service default/web: spec.clusterIPs[1]: \"not-an-ip\" is not an IP address");
    let bad_port = service_from(serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 70000}]}}))
    .unwrap_err();
    assert_eq!(bad_port.field, "spec.ports[0].port");
    let bad_policy =
        service_from(serde_json::json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"clusterIP": "10.96.0.10", "internalTrafficPolicy": "local"}}))
        .unwrap_err();
    assert_eq!(bad_policy.field, "spec.internalTrafficPolicy");
}

/// A list page as the API server sends it: the objects' whole JSON, decoded into the views.
const SERVICE_LIST: &str = r#"{"apiVersion": "v1", "kind": "ServiceList", "metadata": {"resourceVersion": "42"},
  "items": [
    {"metadata": {"name": "web", "namespace": "shop", "uid": "1", "resourceVersion": "40",
                  "annotations": {"topology-agent.io/spillover": "capacity", "kubectl.kubernetes.io/last-applied-configuration": "{}"},
                  "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}]},
     "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "ipFamilies": ["IPv4"],
              "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080}],
              "selector": {"app": "web"}, "sessionAffinity": "None", "type": "ClusterIP",
              "topologyKeys": ["kubernetes.io/hostname", "*"]},
     "status": {"loadBalancer": {}}},
    {"metadata": {"name": "bad", "namespace": "shop"},
     "spec": {"clusterIP": "10.96.0.11", "ports": [{"port": "eighty"}]}}
  ]}"#;

#[test]
fn a_service_list_decodes_whole_and_a_bad_spec_fails_its_service_alone() {
    let list: kube_core::ObjectList<ServiceView> = serde_json::from_str(SERVICE_LIST).unwrap();
    let web = service(&list.items[0]).unwrap();
    let value: serde_json::Value = serde_json::from_str(SERVICE_LIST).unwrap();
    assert_eq!(web, service_from_value(&value["items"][0]).unwrap(), "the API and a cluster file read the same");
    assert_eq!(web.key, ObjectKey::new("shop", "web"));
    assert_eq!(web.ports, [PortSpec { name: "http".into(), port: 80, protocol: Protocol::Tcp }]);
    assert_eq!(web.topology_keys.map(|keys| keys.keys.len()), Some(2));
    assert_eq!(web.agent_annotations.len(), 1);
    let bad = service(&list.items[1]).unwrap_err();
    assert_eq!((bad.name.as_str(), bad.field.as_str()), ("shop/bad", "spec.ports[0].port"));
    assert_eq!(service_from_value(&value["items"][1]).unwrap_err().field, "spec.ports[0].port");
    let event = r#"{"type": "MODIFIED", "object": {"metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 80}]}}}"#;
    let event: kube_core::WatchEvent<ServiceView> = serde_json::from_str(event).unwrap();
    let kube_core::WatchEvent::Modified(view) = event else { panic!("a modification") };
    assert_eq!(service(&view).unwrap().cluster_ips.len(), 1, "a watch event's spec is read as a list's");
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
    assert_eq!((a.hint_zones(), a.hint_nodes()), (&["z1".to_owned()][..], &["a".to_owned()][..]));
    assert!(!b.ready && b.serving && b.terminating);
    assert_eq!(b.node_name, None);
    assert_eq!(a.node_name.as_deref(), Some("a"));
    let full = slice_from(serde_json::json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-abc", "namespace": "shop", "generateName": "web-",
                     "ownerReferences": [{"kind": "Service", "name": "web", "uid": "1"}],
                     "labels": {"kubernetes.io/service-name": "web", "endpointslice.kubernetes.io/managed-by": "x"}},
        "addressType": "IPv4", "ports": null,
        "endpoints": [{"addresses": ["10.1.0.1"], "conditions": {"ready": true}, "nodeName": "a",
                       "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "shop", "uid": "2"},
                       "deprecatedTopology": {"kubernetes.io/hostname": "a"}, "hints": {"forZones": null}}]
    }))
    .unwrap()
    .unwrap();
    assert_eq!((full.endpoints.len(), full.ports.len()), (1, 0), "fields routing does not read are skipped");
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
    // Addresses that would send a host's connections back to itself are refused, named.
    for (family, address, kind) in [
        ("IPv4", "127.0.0.1", "a loopback"),
        ("IPv4", "169.254.169.254", "a link-local"),
        ("IPv4", "0.0.0.0", "the unspecified"),
        ("IPv6", "::1", "a loopback"),
        ("IPv6", "fe80::1", "a link-local"),
        ("IPv6", "ff02::1", "a multicast"),
        ("IPv6", "::ffff:127.0.0.1", "an IPv4-mapped loopback or link-local"),
    ] {
        let refused = slice_from(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "s"},
            "addressType": family, "endpoints": [{"addresses": [address]}]
        }))
        .unwrap_err();
        assert_eq!(refused.field, "endpoints[0].addresses[0]");
        assert!(refused.message.ends_with(&format!("is {kind} address, which no endpoint may have")), "{refused}");
    }
}

#[test]
fn headless_services_and_endpoint_hostnames() {
    let headless = service_from(serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "db", "namespace": "default"},
        "spec": {"clusterIP": "None", "clusterIPs": ["None"], "ports": [{"name": "pg", "port": 5432}]}
    }))
    .unwrap();
    assert!(headless.headless && headless.cluster_ips.is_empty());
    let external = service_from(serde_json::json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "ext", "namespace": "default"},
        "spec": {"type": "ExternalName", "externalName": "example.com", "clusterIP": "None"}
    }))
    .unwrap();
    assert!(!external.headless, "an ExternalName Service is not answered as headless");
    let slice = |hostname: &str| {
        slice_from(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "db-1", "namespace": "default"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.2"], "hostname": hostname}]
        }))
    };
    let named = slice("DB-1").unwrap().unwrap();
    assert_eq!((named.endpoints[0].hostname(), named.endpoints[1].hostname()), (None, Some("db-1")));
    let bad = slice("db_1").unwrap_err();
    assert_eq!(bad.to_string(), "EndpointSlice default/db-1: endpoints[1].hostname: \"db_1\" is not a DNS label");
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
    assert!(node.pod_cidrs.is_empty(), "a network plugin may assign addresses without podCIDRs");
}

#[test]
fn node_pod_cidrs_are_read_and_checked() {
    let read = |cidrs: serde_json::Value| {
        node(
            &serde_json::from_value(serde_json::json!({
                "apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
                "spec": {"podCIDR": "10.244.1.0/24", "podCIDRs": cidrs},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.132.0.1"},
                    {"type": "Hostname", "address": "node-a"}, {"type": "ExternalIP", "address": "2001:db8::1"},
                    {"type": "InternalIP", "address": "not-an-ip"}]}
            }))
            .unwrap(),
        )
    };
    let dual = read(serde_json::json!(["10.244.1.0/24", "fd00:10:244:1::/64"])).unwrap();
    assert_eq!(
        dual.pod_cidrs.iter().map(ToString::to_string).collect::<Vec<_>>(),
        ["10.244.1.0/24", "fd00:10:244:1::/64"]
    );
    assert_eq!(dual.addresses, ["10.132.0.1".parse::<std::net::IpAddr>().unwrap(), "2001:db8::1".parse().unwrap()]);
    let bad = read(serde_json::json!(["10.244.1.0/24", "10.244.1.0/40"])).unwrap_err();
    assert_eq!(
        bad.to_string(),
        "Node node-a: spec.podCIDRs[1]: \"10.244.1.0/40\" is not a prefix length for this family"
    );
}

/// A Node as a kubelet reports it, at `heartbeat`.
fn kubelet_node(heartbeat: &str, version: &str) -> serde_json::Value {
    let condition = |kind: &str, status: &str| {
        serde_json::json!({"type": kind, "status": status, "lastHeartbeatTime": heartbeat,
                           "lastTransitionTime": "2026-11-01T08:00:00Z", "reason": "KubeletReady", "message": "ok"})
    };
    serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": "node-a", "uid": "6f1c", "resourceVersion": version,
            "labels": {"topology.kubernetes.io/zone": "zone-a", "topology.kubernetes.io/region": "region-1"},
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            "managedFields": [{"manager": "kubelet", "operation": "Update", "time": heartbeat,
                               "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}}}}]
        },
        "spec": {"podCIDR": "10.64.0.0/24", "providerID": "gce://p/zone-a/node-a"},
        "status": {
            "capacity": {"cpu": "8", "memory": "32880596Ki"},
            "allocatable": {"cpu": "7910m", "memory": "29094740Ki", "pods": "110"},
            "conditions": [condition("MemoryPressure", "False"), condition("Ready", "True")],
            "addresses": [{"type": "InternalIP", "address": "10.132.0.1"}],
            "nodeInfo": {"kubeletVersion": "v1.33.5", "bootID": "b"},
            "images": [{"names": ["registry/app@sha256:0123", "registry/app:v1"], "sizeBytes": 123_456_789}]
        }
    })
}

#[test]
fn a_heartbeat_converts_to_the_same_node() {
    let read = |value: serde_json::Value| node(&serde_json::from_value(value).unwrap()).unwrap();
    let before = read(kubelet_node("2026-11-26T01:00:00Z", "100"));
    let after = read(kubelet_node("2026-11-26T01:00:10Z", "117"));
    assert_eq!(before, after, "nothing the agent reads changed");
    assert_eq!((before.allocatable_cpu_millis, before.ready, before.region()), (7910, true, Some("region-1")));
    let mut not_ready = kubelet_node("2026-11-26T01:00:20Z", "118");
    not_ready["status"]["conditions"][1]["status"] = "Unknown".into();
    assert!(!read(not_ready).ready, "a Ready condition that is not True is not ready");
}

#[test]
fn a_bad_allocatable_cpu_names_the_node_and_field() {
    let mut bad = kubelet_node("2026-11-26T01:00:00Z", "1");
    bad["status"]["allocatable"]["cpu"] = "lots".into();
    let error = node(&serde_json::from_value(bad).unwrap()).unwrap_err();
    assert_eq!((error.name.as_str(), error.field.as_str()), ("node-a", "status.allocatable.cpu"));
}

#[test]
fn a_service_kube_proxy_leaves_to_another_proxy_names_it() {
    let text = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: a, labels: {topology.kubernetes.io/zone: z}}}
- apiVersion: v1
  kind: Service
  metadata: {name: mesh, namespace: ns, labels: {service.kubernetes.io/service-proxy-name: my-proxy}}
  spec: {clusterIP: 10.96.0.1, ports: [{port: 80}]}
"#;
    let state = crate::yaml::parse(text, "proxies.yaml").unwrap();
    let mesh = state.service(&ObjectKey::new("ns", "mesh")).unwrap();
    assert_eq!(mesh.other_proxy.as_deref(), Some("service.kubernetes.io/service-proxy-name=my-proxy"));
}

#[test]
fn a_slice_keeps_its_controllers_change_stamp() {
    let mut view: EndpointSliceView = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web-1", "namespace": "ns", "annotations": {
            "endpoints.kubernetes.io/last-change-trigger-time": "2026-12-04T14:41:12.123456789Z"}},
        "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.1"]}],
    }))
    .unwrap();
    let slice = endpoint_slice(&view).unwrap().unwrap();
    let at = slice.changed_at.expect("stamped");
    assert_eq!(humantime::format_rfc3339_nanos(at).to_string(), "2026-12-04T14:41:12.123456789Z");
    // A stamp that does not parse leaves the change unmeasured; the slice is used all the same.
    view.metadata.annotations.as_mut().unwrap().insert(ANNOTATION_TRIGGER_TIME.into(), "yesterday".into());
    assert_eq!(endpoint_slice(&view).unwrap().unwrap().changed_at, None);
}
