//! Capacity-aware spillover (`topology-agent.io/spillover: capacity`): keep as much traffic in
//! its zone as the zone's endpoints can take without any going over `(1 + ε)` of its fair share
//! (`topology-agent.io/max-overload`, default 0.1), and spill only the surplus, proportionally,
//! to the nearest zones with headroom (same region first).
//!
//! Demand per zone is the allocatable CPU of its Ready nodes; supply is its usable endpoints.
//! Every node solves the same global problem ([`solve`]) from the same Nodes and EndpointSlices
//! and takes its own zone's row, so the loads the nodes create add up to the plan.
//!
//! With topology keys, spillover stays within the widest scope the keys allow from this node
//! (`*`: the cluster; the region key: this region; the zone key: this zone); other keys do not
//! apply. It takes the place of topology-aware hints and `trafficDistribution`, which aim at the
//! same thing all-or-nothing; `internalTrafficPolicy: Local` still wins.

pub mod solve;

use std::{borrow::Cow, collections::BTreeMap};

use serde::Serialize;
use solve::{Solution, SolveError, ZoneInput};
pub use topology_model::objects::{ANNOTATION_MAX_OVERLOAD, ANNOTATION_SPILLOVER};
use topology_model::{
    Node, Service,
    demand::Demand,
    objects::{LABEL_REGION, LABEL_ZONE},
};

use super::{Candidate, Choice, PolicyKind, Selection, describe, keys::TopologyKey, locality};
/// ε when the annotation is absent or invalid.
pub const DEFAULT_MAX_OVERLOAD: f64 = 0.1;
/// The largest ε accepted (1000 %).
const MAX_MAX_OVERLOAD: f64 = 10.0;

/// A Service's spillover settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Settings {
    /// ε.
    pub max_overload: f64,
    /// `feedback`: the capacity plan is the static plan the measured load moves between zones.
    pub feedback: bool,
}

/// The Service's spillover settings, `None` when it is off, and what was wrong with its
/// annotations.
pub fn settings(service: &Service) -> (Option<Settings>, Vec<String>) {
    let mut warnings = Vec::new();
    let mode = service.agent_annotations.get(ANNOTATION_SPILLOVER).map(|v| v.trim());
    let raw_overload = service.agent_annotations.get(ANNOTATION_MAX_OVERLOAD);
    let (enabled, feedback) = match mode {
        Some("capacity") => (true, false),
        Some("feedback") => (true, true),
        None | Some("" | "none" | "off" | "disabled") => (false, false),
        Some(other) => {
            warnings.push(format!(
                "annotation {ANNOTATION_SPILLOVER} {other:?} ignored: the modes are \"capacity\" and \"feedback\""
            ));
            (false, false)
        }
    };
    if !enabled {
        if raw_overload.is_some() && mode.is_none() {
            warnings.push(format!(
                "annotation {ANNOTATION_MAX_OVERLOAD} has no effect without {ANNOTATION_SPILLOVER}: capacity"
            ));
        }
        return (None, warnings);
    }
    let max_overload = match raw_overload.map(|raw| (raw, parse_max_overload(raw))) {
        None => DEFAULT_MAX_OVERLOAD,
        Some((_, Ok(value))) => value,
        Some((raw, Err(why))) => {
            warnings.push(format!(
                "annotation {ANNOTATION_MAX_OVERLOAD} {raw:?} ignored: {why}; using {DEFAULT_MAX_OVERLOAD}"
            ));
            DEFAULT_MAX_OVERLOAD
        }
    };
    (Some(Settings { max_overload, feedback }), warnings)
}

/// Why a max-overload annotation is ignored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MaxOverloadError {
    /// Not a number.
    #[error("not a number (write 0.1 or 10%)")]
    NotANumber,
    /// Outside 0..=10.
    #[error("must be between 0 and {MAX_MAX_OVERLOAD} (0% to {}%)", MAX_MAX_OVERLOAD * 100.0)]
    OutOfRange,
}

/// Parses ε: `0.1` or `10%`, between 0 and 10.
pub fn parse_max_overload(raw: &str) -> Result<f64, MaxOverloadError> {
    let raw = raw.trim();
    let (number, scale) = match raw.strip_suffix('%') {
        Some(number) => (number.trim_end(), 0.01),
        None => (raw, 1.0),
    };
    let value = number.parse::<f64>().map_err(|_| MaxOverloadError::NotANumber)? * scale;
    if !value.is_finite() || !(0.0..=MAX_MAX_OVERLOAD).contains(&value) {
        return Err(MaxOverloadError::OutOfRange);
    }
    Ok(value)
}

/// The endpoints spillover may use from this node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum SpillScope {
    /// Only this zone: nothing to spill to.
    Zone(String),
    /// This region.
    Region(String),
    /// Every endpoint.
    Cluster,
}

impl SpillScope {
    fn describe(&self) -> String {
        match self {
            Self::Zone(zone) => format!("zone {zone} only"),
            Self::Region(region) => format!("region {region}"),
            Self::Cluster => "cluster-wide".into(),
        }
    }

    fn admits(&self, zone: Option<&str>, region: Option<&str>) -> bool {
        match self {
            Self::Zone(z) => zone == Some(z.as_str()),
            Self::Region(r) => region == Some(r.as_str()),
            Self::Cluster => true,
        }
    }
}

/// The scope topology keys allow from `this` node (the widest of `*`, the region key and the
/// zone key that this node has a value for), with notes on keys that do not apply; an error
/// when none of them does, and the keys decide alone.
pub fn scope(this: &Node, keys: Option<&[TopologyKey]>) -> Result<(SpillScope, Vec<String>), NoScope> {
    let Some(keys) = keys else { return Ok((SpillScope::Cluster, Vec::new())) };
    let mut widest: Option<SpillScope> = None;
    let mut notes = Vec::new();
    for key in keys {
        let scope = match key {
            TopologyKey::Any => Some(SpillScope::Cluster),
            TopologyKey::Label(label) if label == LABEL_REGION => this.region().map(|r| SpillScope::Region(r.into())),
            TopologyKey::Label(label) if label == LABEL_ZONE => this.zone().map(|z| SpillScope::Zone(z.into())),
            TopologyKey::Label(label) => {
                notes.push(format!("topology key {label} is not used by spillover, which balances zones and regions"));
                None
            }
        };
        widest = widest.max(scope);
    }
    let listed = keys.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
    widest.map(|scope| (scope, notes)).ok_or(NoScope { listed })
}

/// Topology keys that give this node no scope spillover can balance: it is ignored.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{ANNOTATION_SPILLOVER} ignored: topology keys [{listed}] give this node no zone, region or \"*\" scope")]
pub struct NoScope {
    /// The keys, comma-separated.
    pub listed: String,
}

/// What spillover decided for this node, as `explain` shows it.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpilloverReport {
    /// ε.
    pub max_overload: f64,
    /// `cluster-wide`, `region R`, `zone Z only`.
    pub scope: String,
    /// This node's zone.
    pub zone: String,
    /// This zone's share of the demand.
    pub demand_share: f64,
    /// This zone's share of the usable endpoints.
    pub endpoint_share: f64,
    /// Share of this zone's traffic that stays in it.
    pub kept: f64,
    /// Where the rest goes, largest first.
    pub spilled: Vec<Spill>,
    /// Share of all traffic of the scope that stays in its zone.
    pub in_zone: f64,
    /// The most that can: Σ min(demand share, endpoint share × (1 + ε)).
    pub bound: f64,
    /// Every zone of the plan.
    pub zones: Vec<ZoneReport>,
}

/// Part of this zone's traffic sent to another zone.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct Spill {
    /// Receiving zone ("" for endpoints without a zone).
    pub zone: String,
    /// Share of this zone's traffic.
    pub share: f64,
}

/// One zone of the plan.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ZoneReport {
    /// Zone ("" for endpoints without a zone).
    pub zone: String,
    /// Its region.
    pub region: Option<String>,
    /// Share of the demand.
    pub demand_share: f64,
    /// Usable endpoints.
    pub endpoints: u32,
    /// Load of each of its endpoints relative to the fair share (1.1: 10 % above); `None`
    /// without endpoints.
    pub load_factor: Option<f64>,
}

/// Spillover's choice among `usable` from `this` node. `instead_of` names the mode it replaces.
pub fn select(
    this: &Node,
    demand: &Demand,
    settings: Settings,
    scope: &SpillScope,
    instead_of: Option<&str>,
    usable: &[Candidate<'_>],
    terminating: bool,
) -> Selection {
    let heading = format!(
        "spillover (max overload {}, {}{})",
        percent(settings.max_overload),
        scope.describe(),
        instead_of.map(|mode| format!(", instead of {mode}")).unwrap_or_default()
    );
    let in_scope = in_scope(demand, scope, usable);
    if in_scope.is_empty() {
        let reason = if usable.is_empty() {
            format!("{heading}: no ready or serving-and-terminating endpoint; connections are refused")
        } else {
            format!("{heading}: none of {} in scope; connections are refused", describe(usable.len(), terminating))
        };
        return Selection::equal(PolicyKind::Spillover, reason, this, &[]);
    }
    let everyone = |why: String| {
        let reason = format!("{heading}: {why}; all {} in scope equally", describe(in_scope.len(), terminating));
        Selection::equal(PolicyKind::Spillover, reason, this, &in_scope)
    };
    if terminating {
        return everyone("not applied to the serving-and-terminating fallback (kube-proxy's rule)".into());
    }
    let Some(own) = this.zone() else {
        return everyone(format!("node {} has no zone label, so its traffic is outside the plan", this.name));
    };

    // The problem: every zone with demand or endpoints in scope, by name ("" last is fine: it is
    // nobody's own zone).
    let mut zones: BTreeMap<&str, ZoneInput> = BTreeMap::new();
    for (name, zone) in demand.zones() {
        if scope.admits(Some(name), zone.region()) {
            zones.insert(
                name,
                ZoneInput {
                    name: name.into(),
                    region: zone.region().map(str::to_owned),
                    demand: zone.cpu_millis as f64,
                    endpoints: 0,
                },
            );
        }
    }
    for candidate in in_scope.iter() {
        let name = candidate.zone().unwrap_or_default();
        zones
            .entry(name)
            .or_insert_with(|| ZoneInput {
                name: name.into(),
                region: if name.is_empty() { None } else { region_of(demand, candidate).map(str::to_owned) },
                demand: 0.0,
                endpoints: 0,
            })
            .endpoints += 1;
    }
    zones.entry(own).or_insert_with(|| ZoneInput {
        name: own.into(),
        region: this.region().map(str::to_owned),
        demand: 0.0,
        endpoints: 0,
    });
    let plan = match solve::solve(zones.into_values().collect(), settings.max_overload) {
        Ok(plan) => plan,
        Err(SolveError::NoDemand) => {
            return everyone("no Ready node with allocatable CPU in scope, so there is no demand to balance".into());
        }
        Err(error) => return everyone(error.to_string()),
    };
    let me = plan.index(own).expect("this node's zone is in the plan");
    let route = plan.route(me);
    let backends: Vec<Choice> = in_scope
        .iter()
        .filter_map(|c| {
            let j = plan.index(c.zone().unwrap_or_default()).expect("every endpoint's zone is in the plan");
            let weight = route[j] / f64::from(plan.zones[j].endpoints);
            (weight > 0.0).then(|| Choice {
                address: c.address,
                port: c.port,
                node: c.node_name.cloned(),
                zone: c.zone.cloned(),
                locality: locality(this, c),
                weight,
            })
        })
        .collect();
    let report = report(&plan, me, &route, scope, settings);
    let reason = format!(
        "{heading}: zone {own} has {} of demand and {} of {}; {}",
        percent(report.demand_share),
        percent(report.endpoint_share),
        describe(in_scope.len(), terminating),
        keeps(&report)
    );
    Selection {
        policy: PolicyKind::Spillover,
        reason,
        reject: backends.is_empty(),
        backends,
        warnings: Vec::new(),
        spillover: Some(Box::new(report)),
        feedback: None,
        baseline_in_zone: None,
    }
}

/// The endpoints of `usable` that `scope` admits.
pub fn in_scope<'a, 'b>(demand: &Demand, scope: &SpillScope, usable: &'b [Candidate<'a>]) -> Cow<'b, [Candidate<'a>]> {
    match scope {
        SpillScope::Cluster => Cow::Borrowed(usable),
        _ => usable.iter().filter(|c| scope.admits(c.zone(), region_of(demand, c))).cloned().collect(),
    }
}

/// An endpoint's region: its zone's (from the Nodes of the zone), else its own Node's.
fn region_of<'a>(demand: &'a Demand, candidate: &Candidate<'a>) -> Option<&'a str> {
    let node_region = || candidate.node.and_then(Node::region);
    candidate.zone.and_then(|z| demand.zone(z)).and_then(|d| d.region()).or_else(node_region)
}

fn report(plan: &Solution, me: usize, route: &[f64], scope: &SpillScope, settings: Settings) -> SpilloverReport {
    let mut spilled: Vec<Spill> = route
        .iter()
        .enumerate()
        .filter(|&(j, share)| j != me && *share > 0.0)
        .map(|(j, share)| Spill { zone: plan.zones[j].name.clone(), share: *share })
        .collect();
    spilled.sort_by(|a, b| b.share.total_cmp(&a.share).then_with(|| a.zone.cmp(&b.zone)));
    SpilloverReport {
        max_overload: settings.max_overload,
        scope: scope.describe(),
        zone: plan.zones[me].name.clone(),
        demand_share: plan.demand[me],
        endpoint_share: plan.supply(me),
        kept: route[me],
        spilled,
        in_zone: plan.in_zone(),
        bound: plan.bound(),
        zones: (0..plan.zones.len())
            .map(|j| ZoneReport {
                zone: plan.zones[j].name.clone(),
                region: plan.zones[j].region.clone(),
                demand_share: plan.demand[j],
                endpoints: plan.zones[j].endpoints,
                load_factor: plan.deviation(j).map(|d| 1.0 + d),
            })
            .collect(),
    }
}

/// "keeps 36.7 %, spills 63.3 % (b 31.7 %, c 31.6 %)".
fn keeps(report: &SpilloverReport) -> String {
    if report.spilled.is_empty() {
        return format!("keeps {} of its traffic in zone", percent(report.kept));
    }
    let to: Vec<String> = report
        .spilled
        .iter()
        .map(|s| format!("{} {}", if s.zone.is_empty() { "(no zone)" } else { &s.zone }, percent(s.share)))
        .collect();
    format!("keeps {}, spills {} ({})", percent(report.kept), percent(1.0 - report.kept), to.join(", "))
}

fn percent(fraction: f64) -> String {
    let value = fraction * 100.0;
    if (value - value.round()).abs() < 1e-9 { format!("{value:.0}%") } else { format!("{value:.1}%") }
}
