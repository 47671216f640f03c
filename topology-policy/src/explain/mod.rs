//! `topology-agent explain`: the policy's decision for every Service port, as a table or as the
//! stable JSON documented in `docs/explain-json.md`. It prints exactly what the agent programs.

mod headless;
mod table;

use std::net::IpAddr;

pub use headless::{AddressEntry, Answer, HeadlessEntry};
use serde::Serialize;
use topology_model::{ClusterState, Family, Node, ObjectKey, Protocol};

use crate::{
    desired::{Locality, PortOptions, ServicePort},
    plan::{NodePlan, alias, steering::Steering, weights::integer_weights},
    policy::{self, PolicyError, PolicyKind, PortSelection, feedback::FeedbackReport, spillover::SpilloverReport},
};

/// The decisions of one node.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct ExplainReport {
    /// The node deciding.
    pub node: String,
    /// One entry per Service port and IP family.
    pub services: Vec<ServiceEntry>,
    /// What this node's DNS responder answers for each headless Service.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub headless: Vec<HeadlessEntry>,
    /// Services the agent never programs, and why: kube-proxy alone routes them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_to_kube_proxy: Vec<LeftEntry>,
}

/// A Service the agent leaves to kube-proxy.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct LeftEntry {
    /// `namespace/name`.
    pub service: String,
    /// Why.
    pub reason: String,
}

/// The decision for one Service port and family.
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceEntry {
    /// `namespace/name`.
    pub service: String,
    /// Service port.
    pub port: u16,
    /// Protocol.
    pub protocol: Protocol,
    /// Port name ("" when unnamed).
    pub port_name: String,
    /// ClusterIPs of this family.
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Vec<String>,
    /// Mode that decided.
    pub policy: PolicyKind,
    /// Why.
    pub reason: String,
    /// Connections are refused.
    pub reject: bool,
    /// Backends and weights.
    pub backends: Vec<BackendEntry>,
    /// Inputs ignored, and why.
    pub warnings: Vec<String>,
    /// The spillover plan, when spillover decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spillover: Option<SpilloverReport>,
    /// What feedback measured and moved, when feedback decided.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub feedback: Option<FeedbackReport>,
    /// Session affinity and DNS steering the programs apply on top of the choice.
    pub options: PortOptions,
    /// ClusterIPs whose port another Service already owns: the kernel holds that Service's set.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<Conflict>,
}

/// A port of this entry that another Service owns.
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    /// The ClusterIP.
    #[serde(rename = "clusterIP")]
    pub cluster_ip: String,
    /// `namespace/name` of the Service holding it (the first to claim it).
    pub held_by: String,
}

/// One backend.
#[derive(Debug, Serialize, serde::Deserialize)]
pub struct BackendEntry {
    /// Address.
    pub address: String,
    /// Target port.
    pub port: u16,
    /// Node of the endpoint, if known.
    pub node: Option<String>,
    /// Zone of the endpoint, if known.
    pub zone: Option<String>,
    /// Relative weight, as the policy decided it.
    pub weight: f64,
    /// Share of this node's new connections the kernel gives it (0..1), from the same table the
    /// dataplane writes: what `status` reports once programmed.
    pub share: f64,
    /// Where it is relative to the deciding node.
    pub locality: Locality,
    /// This node's kernel avoids it now (outlier ejection): in the running agent's answer only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ejected: Option<Ejected>,
}

/// An ejection in force on the deciding node.
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ejected {
    /// How long it is avoided still.
    pub for_seconds: f64,
    /// Which ejection of the backend this is (each doubles the time, from 10 s to 5 min).
    pub ejection: u32,
}

/// Errors of `explain`.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    /// The policy could not run.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// `--service` names no Service.
    #[error("service {0} is not in the cluster")]
    UnknownService(ObjectKey),
}

/// The report for `node`, optionally for one Service; `steering`: the cluster DNS steered to this
/// node's responder, as `run --dns-listen` programs it. It prints the node's plan, the same the
/// agent programs: decisions, the kernel's shares, and ports another Service owns.
pub fn explain(
    state: &ClusterState,
    node: &str,
    service: Option<&ObjectKey>,
    steering: Option<&Steering>,
) -> Result<ExplainReport, ExplainError> {
    let this = state.node(node).ok_or_else(|| PolicyError::UnknownNode(node.to_owned()))?;
    if let Some(key) = service
        && state.service(key).is_none()
    {
        return Err(ExplainError::UnknownService(key.clone()));
    }
    let plan = NodePlan::build(state, node, steering.cloned())?;
    Ok(report(state, this, &plan, service))
}

/// The report of a plan already built for `this` node from `state` (the running agent's own:
/// what its kernel holds), optionally for one Service.
pub fn report(state: &ClusterState, this: &Node, plan: &NodePlan, service: Option<&ObjectKey>) -> ExplainReport {
    let wanted = |key: &ObjectKey| service.is_none_or(|wanted| wanted == key);
    ExplainReport {
        node: this.name.clone(),
        services: plan
            .all_selections()
            .filter(|(key, _)| wanted(key))
            .flat_map(|(_, selections)| selections.iter().map(|selected| entry(plan, selected)))
            .collect(),
        headless: headless::entries(plan, service),
        left_to_kube_proxy: state
            .services()
            .filter(|s| wanted(&s.key))
            .filter_map(|s| Some(LeftEntry { service: s.key.to_string(), reason: policy::left_to_kube_proxy(s)? }))
            .collect(),
    }
}

fn entry(plan: &NodePlan, selected: &PortSelection) -> ServiceEntry {
    let selection = &selected.selection;
    let ipv4 = selected.family == Family::V4;
    let port_of = |vip: &IpAddr| ServicePort { vip: *vip, port: selected.port.port, protocol: selected.port.protocol };
    let conflicts: Vec<Conflict> = selected
        .cluster_ips
        .iter()
        .filter_map(|vip| {
            let owner = plan.owner(&port_of(vip))?;
            (*owner != selected.service).then(|| Conflict { cluster_ip: vip.to_string(), held_by: owner.to_string() })
        })
        .collect();
    // The kernel's entry where this Service owns the port; what it would get where it does not.
    let owned = selected.cluster_ips.iter().find_map(|vip| {
        let port = port_of(vip);
        (plan.owner(&port) == Some(&selected.service)).then(|| plan.entry(&port)).flatten()
    });
    let backends = owned.map_or_else(|| integer_weights(selected), |entry| entry.backends.clone());
    let drawn = alias::drawn(&alias::build(&backends), ipv4);
    let share = |address: IpAddr, port: u16| {
        drawn.iter().find(|b| b.addr == address && b.port == port).map_or(0.0, |b| f64::from(b.weight) / 1e6)
    };
    ServiceEntry {
        service: selected.service.to_string(),
        port: selected.port.port,
        protocol: selected.port.protocol,
        port_name: selected.port.name.clone(),
        cluster_ips: selected.cluster_ips.iter().map(ToString::to_string).collect(),
        policy: selection.policy,
        reason: selection.reason.clone(),
        reject: selection.reject,
        backends: selection
            .backends
            .iter()
            .map(|b| BackendEntry {
                address: b.address.to_string(),
                port: b.port,
                node: b.node.as_deref().map(str::to_owned),
                zone: b.zone.as_deref().map(str::to_owned),
                weight: b.weight,
                share: share(b.address, b.port),
                locality: b.locality,
                ejected: None,
            })
            .collect(),
        warnings: selection.warnings.clone(),
        spillover: selection.spillover.as_deref().cloned(),
        feedback: selection.feedback.as_deref().cloned(),
        options: selected.options,
        conflicts,
    }
}

#[cfg(test)]
mod tests {
    use topology_model::yaml;

    use super::*;

    const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}}
- {apiVersion: v1, kind: Node, metadata: {name: node-b, labels: {topology.kubernetes.io/zone: zone-b}}}
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default}
  spec: {clusterIPs: [10.96.0.10], ports: [{name: http, port: 80, protocol: TCP}], trafficDistribution: PreferClose}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - {addresses: [10.1.2.3], nodeName: node-b, zone: zone-a}
  - {addresses: [10.1.9.9], nodeName: node-b}
"#;

    #[test]
    fn the_json_has_the_documented_shape() {
        let state = yaml::parse(CLUSTER, "c.yaml").unwrap();
        let report = explain(&state, "node-a", None, None).unwrap();
        let json = serde_json::to_value(&report).unwrap();
        // Node labels win over the endpoint's zone field: node-b is in zone-b, so nothing is close.
        assert_eq!(json["node"], "node-a");
        let web = &json["services"][0];
        assert_eq!(web["service"], "default/web");
        assert_eq!(web["port"], 80);
        assert_eq!(web["protocol"], "TCP");
        assert_eq!(web["portName"], "http");
        assert_eq!(web["clusterIPs"], serde_json::json!(["10.96.0.10"]));
        assert_eq!(web["policy"], "PreferClose");
        assert_eq!(web["reject"], false);
        let backend = &web["backends"][0];
        assert_eq!(backend["address"], "10.1.2.3");
        assert_eq!(backend["port"], 8080);
        assert_eq!(backend["node"], "node-b");
        assert_eq!(backend["zone"], "zone-b");
        assert_eq!(backend["weight"], 1.0);
        assert_eq!(backend["share"], 0.5, "two equal backends: half each, as the kernel draws them");
        assert!(web.get("conflicts").is_none(), "no conflicts, no field");
        assert!(web["reason"].as_str().unwrap().starts_with("PreferClose: no endpoint in zone zone-a"), "{web}");
    }

    #[test]
    fn a_port_another_service_owns_is_named_with_its_owner() {
        let copy = "- {apiVersion: v1, kind: Service, metadata: {name: copy, namespace: default}, spec: {clusterIP: \
                    10.96.0.10, ports: [{port: 80}]}}\n";
        let state = yaml::parse(&format!("{CLUSTER}{copy}"), "c.yaml").unwrap();
        let report = explain(&state, "node-a", Some(&ObjectKey::new("default", "web")), None).unwrap();
        let json = serde_json::to_value(&report).unwrap();
        let conflicts = &json["services"][0]["conflicts"];
        assert_eq!(conflicts, &serde_json::json!([{"clusterIP": "10.96.0.10", "heldBy": "default/copy"}]));
        assert!(report.table().contains("conflict: 10.96.0.10:80/TCP is programmed for Service default/copy"));
        // Its shares are what it would get; the kernel holds copy's (refused: no endpoints).
        assert_eq!(json["services"][0]["backends"][0]["share"], 0.5);
    }

    #[test]
    fn spillover_shows_its_plan() {
        let cluster = r#"
apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}
  status: {allocatable: {cpu: "6"}, conditions: [{type: Ready, status: "True"}]}
- apiVersion: v1
  kind: Node
  metadata: {name: node-b, labels: {topology.kubernetes.io/zone: zone-b}}
  status: {allocatable: {cpu: "2"}, conditions: [{type: Ready, status: "True"}]}
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default, annotations: {topology-agent.io/spillover: capacity}}
  spec: {clusterIPs: [10.96.0.10], ports: [{name: http, port: 80, protocol: TCP}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: http, port: 8080, protocol: TCP}]
  endpoints:
  - {addresses: [10.1.0.1], nodeName: node-a}
  - {addresses: [10.2.0.1], nodeName: node-b}
  - {addresses: [10.2.0.2], nodeName: node-b}
"#;
        let state = yaml::parse(cluster, "c.yaml").unwrap();
        let report = explain(&state, "node-a", None, None).unwrap();
        let json = serde_json::to_value(&report).unwrap();
        let web = &json["services"][0];
        assert_eq!(web["policy"], "Spillover");
        let plan = &web["spillover"];
        // Demand 75 % in zone-a, 1 of 3 endpoints: zone-a keeps 1.1 / 3 of all traffic.
        assert_eq!(plan["zone"], "zone-a");
        assert_eq!(plan["demandShare"], 0.75);
        assert!((plan["kept"].as_f64().unwrap() - 1.1 / 3.0 / 0.75).abs() < 1e-9, "{plan}");
        assert_eq!(plan["spilled"][0]["zone"], "zone-b");
        assert_eq!(plan["zones"][0]["loadFactor"], 1.1);
        assert_eq!(plan["maxOverload"], 0.1);
        assert!(plan["inZone"].as_f64().unwrap() <= plan["bound"].as_f64().unwrap() + 1e-12);
        let table = report.table();
        assert!(table.contains("plan: 61.7% of all traffic stays in zone (bound 61.7%)"), "{table}");
        assert!(table.contains("zone-a"), "{table}");
        let plain = explain(&yaml::parse(CLUSTER, "c.yaml").unwrap(), "node-a", None, None).unwrap();
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json["services"][0].get("spillover").is_none(), "only spillover decisions carry a plan");
    }

    #[test]
    fn affinity_and_the_api_servers_service_left_to_kube_proxy_are_shown() {
        let cluster = CLUSTER.replace(
            "trafficDistribution: PreferClose}",
            "trafficDistribution: PreferClose, sessionAffinity: ClientIP,\n         sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}}",
        ) + "- {apiVersion: v1, kind: Service, metadata: {name: kubernetes, namespace: default},\n   spec: {clusterIP: 10.96.0.1, ports: [{name: https, port: 443}]}}\n";
        let state = yaml::parse(&cluster, "c.yaml").unwrap();
        let report = explain(&state, "node-a", None, None).unwrap();
        let json = serde_json::to_value(&report).unwrap();
        let web = json["services"].as_array().unwrap().iter().find(|s| s["service"] == "default/web").unwrap();
        assert_eq!(web["options"], serde_json::json!({"affinityTimeoutS": 600}));
        let programmed = json["services"].as_array().unwrap();
        assert!(programmed.iter().all(|s| s["service"] != "default/kubernetes"), "never programmed");
        assert_eq!(json["left_to_kube_proxy"][0]["service"], "default/kubernetes");
        let table = report.table();
        assert!(table.contains("session affinity: ClientIP, 600 s"), "{table}");
        assert!(table.contains("default/kubernetes  left to kube-proxy: the API server's Service"), "{table}");
    }

    #[test]
    fn one_service_or_an_error_naming_it() {
        let state = yaml::parse(CLUSTER, "c.yaml").unwrap();
        let report = explain(&state, "node-b", Some(&ObjectKey::new("default", "web")), None).unwrap();
        assert_eq!(report.services.len(), 1);
        assert_eq!(report.services[0].backends.len(), 2, "both endpoints are in zone-b");
        let table = report.table();
        assert!(table.contains("default/web:http  80/TCP 10.96.0.10  PreferClose"), "{table}");
        let missing = explain(&state, "node-b", Some(&ObjectKey::new("default", "nope")), None).unwrap_err();
        assert_eq!(missing.to_string(), "service default/nope is not in the cluster");
        assert!(explain(&state, "node-z", None, None).is_err());
    }

    #[test]
    fn a_headless_service_shows_the_dns_answer_of_this_node() {
        let cluster = CLUSTER.to_owned()
            + "- {apiVersion: v1, kind: Service, metadata: {name: db, namespace: default},\n   spec: {clusterIP: None, \
               trafficDistribution: PreferClose, ports: [{name: pg, port: 5432}]}}\n- apiVersion: discovery.k8s.io/v1\n  \
               kind: EndpointSlice\n  metadata: {name: db-1, namespace: default, labels: {kubernetes.io/service-name: \
               db}}\n  addressType: IPv4\n  ports: [{name: pg, port: 5432}]\n  endpoints:\n  - {addresses: \
               [10.1.0.1], hostname: db-0, nodeName: node-a}\n  - {addresses: [10.1.0.2], hostname: db-1, nodeName: \
               node-b}\n";
        let state = yaml::parse(&cluster, "c.yaml").unwrap();
        let report = explain(&state, "node-b", Some(&ObjectKey::new("default", "db")), None).unwrap();
        assert!(report.services.is_empty(), "a headless Service has no port the hooks rewrite");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["headless"][0]["name"], "db.default.svc");
        assert_eq!(json["headless"][0]["answer"], "all");
        assert_eq!(
            json["headless"][0]["addresses"],
            serde_json::json!([{"address": "10.1.0.2", "label": "db-1", "weight": 1.0, "locality": "node"}])
        );
        let table = report.table();
        assert!(table.contains("default/db  headless: DNS db.default.svc.<cluster domain>  PreferClose"), "{table}");
        assert!(table.contains("10.1.0.2                     node    name db-1"), "{table}");
        // Without headless Services the JSON keeps its shape.
        let plain =
            serde_json::to_value(explain(&state, "node-b", Some(&ObjectKey::new("default", "web")), None).unwrap());
        assert!(plain.unwrap().get("headless").is_none());
    }

    #[test]
    fn the_cluster_dns_steered_to_this_nodes_responder_is_shown_as_programmed() {
        let cluster = CLUSTER.to_owned()
            + "- {apiVersion: v1, kind: Service, metadata: {name: kube-dns, namespace: kube-system},\n   spec: \
               {clusterIP: 10.96.0.53, ports: [{name: dns, port: 53, protocol: UDP}, {name: metrics, port: 9153}]}}\n";
        let state = yaml::parse(&cluster, "c.yaml").unwrap();
        let steering =
            Steering { service: ObjectKey::new("kube-system", "kube-dns"), responder: "10.0.0.5:53".parse().unwrap() };
        let report = explain(&state, "node-a", None, Some(&steering)).unwrap();
        let json = serde_json::to_value(&report).unwrap();
        let dns: Vec<&serde_json::Value> =
            json["services"].as_array().unwrap().iter().filter(|s| s["service"] == "kube-system/kube-dns").collect();
        assert_eq!(dns[0]["policy"], "LocalDns");
        assert_eq!(dns[0]["options"], serde_json::json!({"localDns": true}));
        assert_eq!(dns[0]["backends"][0]["address"], "10.0.0.5");
        assert_eq!(dns[1]["policy"], "Default", "the metrics port is not steered");
        assert!(report.table().contains("steered to this node's DNS responder at 10.0.0.5:53"));
    }
}
