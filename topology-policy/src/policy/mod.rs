//! The decision: from THIS node, which backends may each Service port use, and with which weights.
//! Pure: no I/O, no clock. `explain` prints exactly what this returns, and the agent programs it.
//!
//! Modes, in precedence order:
//! 1. `internalTrafficPolicy: Local` ([`local`]);
//! 2. capacity-aware spillover, `topology-agent.io/spillover: capacity` ([`spillover`]), within
//!    the scope topology keys allow;
//! 3. topology keys, KEP-536 ([`keys`]);
//! 4. Topology Aware Routing hints ([`hints`]);
//! 5. `spec.trafficDistribution` ([`distribution`]);
//! 6. default: every usable endpoint.
//!
//! "Usable" endpoints are the ready ones or, when none is ready, the serving-and-terminating ones.
//! The serving-and-terminating fallback takes no preference (hints, trafficDistribution,
//! spillover): like kube-proxy, it is a best effort not to drop connections, and a preference
//! would pile a draining zone's connections onto its last terminating pods. Only a hard scope
//! the Service wrote (topology keys without `*`) still bounds it.

pub mod distribution;
pub mod feedback;
pub mod hints;
pub mod join;
pub mod keys;
pub mod local;
pub mod spillover;

use std::{net::IpAddr, sync::Arc};

pub use join::Candidate;
use serde::Serialize;
use topology_model::{
    ClusterState, Family, Node, ObjectKey, PortSpec, Service, TrafficDistribution,
    demand::Demand,
    objects::{ANNOTATION_DNS, DNS_UPSTREAM},
};

use crate::{
    desired::{Locality, PortOptions},
    feedback::{Inputs, PortInput, PortKey},
};

/// The Service the API server is reached through in-cluster (`KUBERNETES_SERVICE_HOST` is its
/// ClusterIP). Never programmed: its endpoints are the control plane's, with no topology to gain,
/// and after a managed control plane's upgrade the agent's own connections (and every pod's)
/// must not depend on maps that may still name the old addresses.
pub const API_SERVICE: (&str, &str) = ("default", "kubernetes");

/// Why the agent leaves `service` to kube-proxy, if it does.
pub fn left_to_kube_proxy(service: &Service) -> Option<String> {
    if let Some(label) = &service.other_proxy {
        return Some(format!("kube-proxy leaves it to another proxy ({label}); so does the agent"));
    }
    if *service.key.namespace == *API_SERVICE.0 && *service.key.name == *API_SERVICE.1 {
        return Some(
            "the API server's Service: left to kube-proxy (the control plane has no topology to gain, and \
             connections to the API must never depend on the agent's maps)"
                .into(),
        );
    }
    None
}

/// Which mode decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
pub enum PolicyKind {
    /// Every usable endpoint.
    Default,
    /// `internalTrafficPolicy: Local`.
    Local,
    /// Topology keys (KEP-536).
    TopologyKeys,
    /// Topology Aware Routing hints (`service.kubernetes.io/topology-mode`).
    TopologyAwareHints,
    /// `trafficDistribution: PreferClose`.
    PreferClose,
    /// `trafficDistribution: PreferSameZone`.
    PreferSameZone,
    /// `trafficDistribution: PreferSameNode`.
    PreferSameNode,
    /// Capacity-aware spillover (`topology-agent.io/spillover: capacity`).
    Spillover,
    /// Capacity-aware spillover moved between zones by the measured load
    /// (`topology-agent.io/spillover: feedback`).
    Feedback,
    /// The cluster DNS Service's port 53, steered to this node's DNS responder (`run --dns-listen`).
    LocalDns,
}

/// One backend the policy chose: where it is, and its relative weight. The plan gives the kernel
/// each as a [`crate::desired::WeightedBackend`] (integer weight), which the dataplane writes in
/// the map form `topology_common::Backend`; `explain` and `status` print rows of their own.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Choice {
    /// Endpoint address.
    pub address: IpAddr,
    /// Target port.
    pub port: u16,
    /// Node of the endpoint (the cluster state's shared copy).
    pub node: Option<Arc<str>>,
    /// Zone of the endpoint (shared too).
    pub zone: Option<Arc<str>>,
    /// Where it is relative to this node.
    pub locality: Locality,
    /// Relative weight.
    pub weight: f64,
}

impl Choice {
    /// `candidate` at `weight`, placed from `this` node.
    pub fn of(this: &Node, candidate: &Candidate<'_>, weight: f64) -> Self {
        Self {
            address: candidate.address,
            port: candidate.port,
            node: candidate.node_name.cloned(),
            zone: candidate.zone.cloned(),
            locality: locality(this, candidate),
            weight,
        }
    }
}

/// The decision for one Service port and family.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Selection {
    /// The mode that decided.
    pub policy: PolicyKind,
    /// One line: which mode, which key or level matched, which fallback and why.
    pub reason: String,
    /// Connections are refused: no backend may be used.
    pub reject: bool,
    /// The backends, sorted by address and port.
    pub backends: Vec<Choice>,
    /// Inputs that were ignored (an invalid annotation, an unknown value), with why.
    pub warnings: Vec<String>,
    /// The spillover plan behind the weights, when spillover decided.
    pub spillover: Option<Box<spillover::SpilloverReport>>,
    /// What feedback measured and moved, when feedback decided.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feedback: Option<Box<feedback::FeedbackReport>>,
    /// The share of connections the default policy (every usable endpoint equally, no topology,
    /// as kube-proxy does) would keep in this node's zone: the baseline the cross-zone savings
    /// are counted against. `None` without a usable endpoint.
    #[serde(skip)]
    pub baseline_in_zone: Option<f64>,
}

impl Selection {
    /// A selection of `chosen` with equal weights; empty means refuse.
    pub fn equal(policy: PolicyKind, reason: String, this: &Node, chosen: &[Candidate<'_>]) -> Self {
        let backends: Vec<Choice> = chosen.iter().map(|c| Choice::of(this, c, 1.0)).collect();
        Self {
            policy,
            reason,
            reject: backends.is_empty(),
            backends,
            warnings: Vec::new(),
            spillover: None,
            feedback: None,
            baseline_in_zone: None,
        }
    }

    fn warn(mut self, warnings: Vec<String>) -> Self {
        self.warnings.extend(warnings);
        self
    }
}

/// A Service port of one family and what this node should do with it.
#[derive(Clone, Debug, PartialEq)]
pub struct PortSelection {
    /// The Service.
    pub service: ObjectKey,
    /// The port.
    pub port: PortSpec,
    /// The family.
    pub family: Family,
    /// The Service's ClusterIPs of this family.
    pub cluster_ips: Vec<IpAddr>,
    /// The decision.
    pub selection: Selection,
    /// Session affinity and DNS steering, as the programs apply them to the chosen backends.
    pub options: PortOptions,
}

/// The policy cannot run for this node.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The node is not in the cluster state.
    #[error(
        "node {0:?} is not in the cluster (no Node object of that name); refusing to route without knowing where this node is"
    )]
    UnknownNode(String),
}

/// Every Service port of every Service, for `node`, sorted by Service, port and family.
pub fn compute(state: &ClusterState, node: &str) -> Result<Vec<PortSelection>, PolicyError> {
    let this = state.node(node).ok_or_else(|| PolicyError::UnknownNode(node.to_owned()))?;
    Ok(state.services().flat_map(|service| compute_service(state, this, service)).collect())
}

/// Every port and family of one Service, for `this` node, without measurements.
pub fn compute_service(state: &ClusterState, this: &Node, service: &Service) -> Vec<PortSelection> {
    compute_service_with(state, this, service, &Inputs::new())
}

/// Every port and family of one Service, for `this` node, with the feedback controller's inputs.
pub fn compute_service_with(
    state: &ClusterState,
    this: &Node,
    service: &Service,
    inputs: &Inputs,
) -> Vec<PortSelection> {
    if left_to_kube_proxy(service).is_some() {
        // Its DNS names still resolve.
        return Vec::new();
    }
    let mut families: Vec<Family> = service.cluster_ips.iter().map(Family::of).collect();
    families.sort();
    families.dedup();
    let (outlier, outlier_warning) = outlier_ejection(service);
    let options = PortOptions { affinity_timeout_s: service.session_affinity_timeout_s, ..outlier };
    // Exactly sized: a selection is large, and a Vec grown from empty holds four.
    let mut out = Vec::with_capacity(service.ports.len() * families.len());
    for port in &service.ports {
        for &family in &families {
            let joined = join::candidates(state, service, port, family);
            let key = PortKey { service: service.key.clone(), port: port.port, family };
            let mut selection = select_with(this, state.demand(), service, &joined.candidates, inputs.get(&key));
            if let Some(note) = joined.unmatched_port {
                selection.warnings.push(note);
            }
            selection.warnings.extend(outlier_warning.clone());
            out.push(PortSelection {
                service: service.key.clone(),
                port: port.clone(),
                family,
                cluster_ips: service.cluster_ips.iter().filter(|ip| Family::of(ip) == family).copied().collect(),
                // The load signal measures a port under feedback, and only such ports; the
                // connect hook answers overload per connection on them.
                options: PortOptions {
                    measured: selection.feedback.is_some(),
                    spill_at: inputs.get(&key).filter(|_| selection.feedback.is_some()).map_or(0, |i| i.spill_at),
                    ..options
                },
                selection,
            });
        }
    }
    out
}

/// The Service's outlier ejection settings (`topology-agent.io/outlier-ejection`): `on` (the
/// default), `off`, or `failures=N` (1–15 failed handshakes in a row) and `base=Ns` (1–255 s, the
/// first ejection), comma-separated; with the warning of each part that is none of these (that
/// part keeps its default).
fn outlier_ejection(service: &Service) -> (PortOptions, Option<String>) {
    let mut options = PortOptions::default();
    let Some(value) = service.agent_annotations.get(topology_model::objects::ANNOTATION_OUTLIER_EJECTION) else {
        return (options, None);
    };
    let mut ignored = Vec::new();
    for part in value.split(',').map(str::trim).filter(|part| !part.is_empty()) {
        let understood = match part.split_once('=').map(|(key, value)| (key.trim(), value.trim())) {
            None if part == "on" => true,
            None if part == "off" => {
                options.outlier_off = true;
                true
            }
            Some(("failures", n)) => match n.parse::<u8>() {
                Ok(n @ 1..=15) => {
                    options.outlier_failures = n;
                    true
                }
                _ => false,
            },
            Some(("base", s)) => match s.strip_suffix('s').unwrap_or(s).parse::<u8>() {
                Ok(s @ 1..) => {
                    options.outlier_base_s = s;
                    true
                }
                _ => false,
            },
            _ => false,
        };
        if !understood {
            ignored.push(format!("{part:?}"));
        }
    }
    let warning = (!ignored.is_empty()).then(|| {
        format!(
            "annotation {}: {} ignored (expected on, off, failures=1..15, base=1s..255s); the rest applies",
            topology_model::objects::ANNOTATION_OUTLIER_EJECTION,
            ignored.join(", ")
        )
    });
    (options, warning)
}

/// The decision for one Service port from `this` node, given all its endpoints and the demand
/// by zone.
pub fn select(this: &Node, demand: &Demand, service: &Service, candidates: &[Candidate<'_>]) -> Selection {
    select_with(this, demand, service, candidates, None)
}

/// [`select`] with the feedback controller's input for the port.
pub fn select_with(
    this: &Node,
    demand: &Demand,
    service: &Service,
    candidates: &[Candidate<'_>],
    input: Option<&PortInput>,
) -> Selection {
    Selection {
        baseline_in_zone: baseline_in_zone(this, candidates),
        ..decide(this, demand, service, candidates, input)
    }
}

/// The share of connections every usable endpoint chosen equally would keep in `this` node's
/// zone (this node included); `None` without a usable endpoint.
pub fn baseline_in_zone(this: &Node, candidates: &[Candidate<'_>]) -> Option<f64> {
    // `usable`'s rule, counted without a copy of the endpoints.
    let ready = candidates.iter().any(Candidate::is_ready);
    let usable = |c: &Candidate<'_>| if ready { c.is_ready() } else { c.is_serving_terminating() };
    let (mut count, mut near) = (0_usize, 0_usize);
    for candidate in candidates.iter().filter(|c| usable(c)) {
        count += 1;
        near += usize::from(matches!(locality(this, candidate), Locality::Node | Locality::Zone));
    }
    (count > 0).then(|| near as f64 / count as f64)
}

/// [`select`] without the baseline.
fn decide(
    this: &Node,
    demand: &Demand,
    service: &Service,
    candidates: &[Candidate<'_>],
    input: Option<&PortInput>,
) -> Selection {
    let (spill, mut warnings) = spillover::settings(service);
    if let Some(value) = service.agent_annotations.get(ANNOTATION_DNS).filter(|_| !service.dns_on_upstream()) {
        warnings.push(format!("annotation {ANNOTATION_DNS} {value:?} ignored: the one value is {DNS_UPSTREAM:?}"));
    }
    if service.internal_traffic_local {
        if spill.is_some() {
            warnings.push(format!(
                "{} ignored: internalTrafficPolicy Local keeps traffic on this node",
                spillover::ANNOTATION_SPILLOVER
            ));
        }
        return local::select(this, candidates).warn(warnings);
    }
    let (usable, terminating) = usable(candidates);
    let keys = service.topology_keys.as_ref().and_then(|spec| match keys::parse_spec(spec) {
        Ok(keys) => Some(keys),
        Err(reason) => {
            warnings.push(format!("{} ignored: {reason}", spec.source));
            None
        }
    });
    if let Some(settings) = spill {
        match spillover::scope(this, keys.as_deref()) {
            Ok((scope, notes)) => {
                warnings.extend(notes);
                let replaced = replaced_mode(service, keys.is_some(), &mut warnings);
                let plan = spillover::select(this, demand, settings, &scope, replaced, &usable, terminating);
                if !settings.feedback {
                    return plan.warn(warnings);
                }
                let in_scope = spillover::in_scope(demand, &scope, &usable);
                return feedback::reweight(this, plan, &in_scope, input).warn(warnings);
            }
            Err(none) => warnings.push(none.to_string()),
        }
    }
    if let Some(keys) = keys {
        return keys::select(this, &keys, &usable, terminating).warn(warnings);
    }
    if let Some(mode) = service.topology_mode.as_deref().filter(|mode| hints::enabled(mode)) {
        return hints::select(this, mode, &usable, terminating).warn(warnings);
    }
    if let Some(distribution) = &service.traffic_distribution {
        match distribution::select(this, distribution, &usable, terminating) {
            Ok(selection) => return selection.warn(warnings),
            Err(unknown) => warnings.push(unknown.to_string()),
        }
    }
    Selection::equal(PolicyKind::Default, default_reason(usable.len(), terminating), this, &usable).warn(warnings)
}

/// The mode spillover takes the place of, for the reason line; a warning for a preference it
/// cannot keep.
fn replaced_mode(service: &Service, keyed: bool, warnings: &mut Vec<String>) -> Option<&'static str> {
    if keyed {
        return None;
    }
    if service.topology_mode.as_deref().is_some_and(hints::enabled) {
        return Some("topology-aware hints");
    }
    match service.traffic_distribution.as_ref()? {
        TrafficDistribution::PreferSameNode => {
            warnings.push(
                "spec.trafficDistribution PreferSameNode: the node preference is not kept under spillover, which \
                 balances zones (node-local endpoints would be overloaded)"
                    .into(),
            );
            Some("PreferSameNode")
        }
        TrafficDistribution::PreferClose => Some("PreferClose"),
        TrafficDistribution::PreferSameZone => Some("PreferSameZone"),
        TrafficDistribution::Unknown(_) => None,
    }
}

/// The usable endpoints (ready, else serving-and-terminating), and whether they are the
/// terminating fallback.
pub fn usable<'a>(candidates: &[Candidate<'a>]) -> (Vec<Candidate<'a>>, bool) {
    let mut ready = Vec::with_capacity(candidates.len());
    ready.extend(candidates.iter().filter(|c| c.is_ready()).cloned());
    if !ready.is_empty() {
        return (ready, false);
    }
    let mut terminating = ready;
    terminating.extend(candidates.iter().filter(|c| c.is_serving_terminating()).cloned());
    let fallback = !terminating.is_empty();
    (terminating, fallback)
}

/// The serving-and-terminating fallback under a mode that reads topology: every one of them,
/// equally, as kube-proxy does (it reads hints from ready endpoints only). `mode` names the
/// preference that is not applied.
pub fn terminating_fallback(policy: PolicyKind, mode: &str, this: &Node, usable: &[Candidate<'_>]) -> Selection {
    let reason = format!(
        "{mode}: not applied to the serving-and-terminating fallback (kube-proxy's rule); all {}",
        describe(usable.len(), true)
    );
    Selection::equal(policy, reason, this, usable)
}

/// "3 ready endpoints", "2 serving-and-terminating endpoints (none is ready)".
pub fn describe(count: usize, terminating: bool) -> String {
    let noun = if count == 1 { "endpoint" } else { "endpoints" };
    if terminating {
        format!("{count} serving-and-terminating {noun} (none is ready)")
    } else {
        format!("{count} ready {noun}")
    }
}

fn default_reason(count: usize, terminating: bool) -> String {
    if count == 0 {
        "default: no ready or serving-and-terminating endpoint; connections are refused".into()
    } else {
        format!("default: all {}", describe(count, terminating))
    }
}

/// Where `candidate` is relative to `this` node.
pub fn locality(this: &Node, candidate: &Candidate<'_>) -> Locality {
    if candidate.node_name() == Some(this.name.as_str()) {
        return Locality::Node;
    }
    let zone = this.zone();
    if zone.is_some() && candidate.zone() == zone {
        return Locality::Zone;
    }
    let region = this.region();
    if region.is_some() && candidate.region() == region { Locality::Region } else { Locality::Other }
}

#[cfg(test)]
pub(crate) mod tests;
