//! What the e2e tier compares: the slices the EndpointSlice controller wrote (read from the API
//! server), the plan the agent explains, and what its node's kernel holds.

use std::{collections::BTreeSet, net::IpAddr};

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use serde_json::Value;

use super::{Cluster, agents::AgentPod};
use crate::net::agent_binary;

/// One endpoint of a Service's slices, as the controller wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Its first address.
    pub address: IpAddr,
    /// `nodeName`.
    pub node: Option<String>,
    /// `zone`.
    pub zone: Option<String>,
    /// `conditions.ready` (unset reads as ready, as the API says).
    pub ready: bool,
    /// `conditions.serving`.
    pub serving: bool,
    /// `conditions.terminating`.
    pub terminating: bool,
    /// `hints.forZones`, if hinted.
    pub for_zones: Option<BTreeSet<String>>,
    /// `hints.forNodes`, if hinted.
    pub for_nodes: Option<BTreeSet<String>>,
}

impl Cluster {
    /// Every endpoint of the slices of Service `namespace/service`, as stored now.
    pub fn endpoints(&self, namespace: &str, service: &str) -> Vec<Endpoint> {
        let (admin, namespace, selector) =
            (self.admin(), namespace.to_owned(), format!("kubernetes.io/service-name={service}"));
        let slices = self
            .api()
            .block(async move {
                Api::<EndpointSlice>::namespaced(admin, &namespace).list(&ListParams::default().labels(&selector)).await
            })
            .unwrap_or_else(|e| panic!("listing the slices of {service}: {e}"));
        slices
            .items
            .iter()
            .flat_map(|slice| slice.endpoints.iter())
            .filter_map(|endpoint| {
                let conditions = endpoint.conditions.clone().unwrap_or_default();
                let hints = endpoint.hints.as_ref();
                Some(Endpoint {
                    address: endpoint.addresses.first()?.parse().ok()?,
                    node: endpoint.node_name.clone(),
                    zone: endpoint.zone.clone(),
                    ready: conditions.ready.unwrap_or(true),
                    serving: conditions.serving.unwrap_or(conditions.ready.unwrap_or(true)),
                    terminating: conditions.terminating.unwrap_or(false),
                    for_zones: hints
                        .and_then(|h| h.for_zones.as_ref())
                        .map(|zones| zones.iter().map(|zone| zone.name.clone()).collect()),
                    for_nodes: hints
                        .and_then(|h| h.for_nodes.as_ref())
                        .map(|nodes| nodes.iter().map(|node| node.name.clone()).collect()),
                })
            })
            .collect()
    }
}

impl AgentPod {
    /// `topology-agent explain` in the agent's pod, listing from the API server with its own
    /// token, for `service` (`namespace/name`): its JSON.
    pub fn explain(&self, service: &str) -> Value {
        let kubeconfig = self.kubeconfig.to_string_lossy();
        let text = self
            .exec(&[
                "explain",
                "--kubeconfig",
                &kubeconfig,
                "--node",
                &self.node,
                "--service",
                service,
                "--output",
                "json",
            ])
            .unwrap_or_else(|error| panic!("explain {service} on {}: {error}", self.node));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("explain JSON: {e}: {text}"))
    }
}

/// The backends a Service port's explained plan gives a share of this node's connections.
pub fn explained_backends(explained: &Value) -> BTreeSet<IpAddr> {
    explained["services"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|port| port["backends"].as_array().into_iter().flatten())
        .filter(|backend| backend["share"].as_f64().unwrap_or(0.0) > 0.0)
        .filter_map(|backend| backend["address"].as_str()?.parse().ok())
        .collect()
}

/// `topology-agent status --output json` of a node's pins: what its kernel holds.
pub fn kernel_status(pins: &std::path::Path) -> Value {
    let output = std::process::Command::new(agent_binary())
        .args(["status", "--output", "json", "--pin-path"])
        .arg(pins)
        .output()
        .expect("run topology-agent status");
    assert!(output.status.success(), "status: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).expect("status JSON")
}

/// The backends the kernel gives a share to, for the Service port `prefix` names
/// (`namespace/name:`).
pub fn kernel_backends(status: &Value, prefix: &str) -> BTreeSet<IpAddr> {
    status["services"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|port| port["service"].as_str().is_some_and(|name| name.starts_with(prefix)))
        .flat_map(|port| port["backends"].as_array().into_iter().flatten())
        .filter(|backend| backend["share"].as_f64().unwrap_or(1.0) > 0.0)
        .filter_map(|backend| backend["address"].as_str()?.parse().ok())
        .collect()
}

/// One request of the agents, as the API server audited it (stage `ResponseComplete`, or
/// `ResponseStarted` for a watch still open).
#[derive(Clone, Debug)]
pub struct Audited {
    /// `list`, `watch`, `get`, `create`, `patch`, ...
    pub verb: String,
    /// `services`, `endpointslices`, `nodes`, `events`, ...
    pub resource: String,
    /// The request's URI (its query names the resourceVersion asked from).
    pub uri: String,
    /// The answer's code.
    pub code: u16,
    /// The agent pod whose bound token made it.
    pub pod: String,
    /// The audit stage.
    pub stage: String,
    /// Its User-Agent: `topology-agent/v… (linux/amd64) run` for the agent's own requests,
    /// `… explain` for `explain` in its pod.
    pub user_agent: String,
}

impl Audited {
    /// Whether the running agent made it (not `explain` with the same token).
    pub fn by_the_agent(&self) -> bool {
        self.user_agent.starts_with("topology-agent/") && self.user_agent.ends_with(" run")
    }

    /// The `resourceVersion` the request asked from, if any.
    pub fn resource_version(&self) -> Option<&str> {
        let query = self.uri.split_once('?')?.1;
        query.split('&').find_map(|pair| pair.strip_prefix("resourceVersion="))
    }
}

impl Cluster {
    /// Every request of the agents the API server audited so far (across its restarts).
    pub fn audited(&mut self) -> Vec<Audited> {
        let text = std::fs::read_to_string(self.control_plane().audit_log()).unwrap_or_default();
        text.lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|event| matches!(event["stage"].as_str(), Some("ResponseComplete" | "ResponseStarted")))
            .map(|event| Audited {
                verb: event["verb"].as_str().unwrap_or_default().to_owned(),
                resource: event["objectRef"]["resource"].as_str().unwrap_or_default().to_owned(),
                uri: event["requestURI"].as_str().unwrap_or_default().to_owned(),
                code: event["responseStatus"]["code"].as_u64().unwrap_or_default() as u16,
                pod: event["user"]["extra"]["authentication.kubernetes.io/pod-name"][0]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                stage: event["stage"].as_str().unwrap_or_default().to_owned(),
                user_agent: event["userAgent"].as_str().unwrap_or_default().to_owned(),
            })
            .collect()
    }
}
