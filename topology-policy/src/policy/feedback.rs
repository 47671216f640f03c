//! Feedback (`topology-agent.io/spillover: feedback`): the static plan (capacity spillover)
//! reweighted with what the controller measured ([`crate::feedback`]). Pure: the measurement
//! comes in as a [`PortInput`]; without one (no measurement yet, or `explain` from a file) the
//! static plan stands.

use std::{collections::BTreeMap, net::SocketAddr};

use serde::Serialize;
use topology_model::Node;

use super::{Candidate, Choice, PolicyKind, Selection, locality};
use crate::{desired::Locality, feedback::PortInput};

/// What feedback worked from, for `explain` and the controller.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FeedbackReport {
    /// The controller's input, `None` before its first measurement.
    pub input: Option<PortInput>,
    /// Usable endpoints in scope on this node or in its zone: the traffic measured as "near".
    pub near: Vec<SocketAddr>,
    /// Usable endpoints in scope in other zones, by zone: where traffic moves to.
    pub far: BTreeMap<String, Vec<SocketAddr>>,
}

/// Reweights `static_plan` (chosen among `in_scope`) by `input`.
pub fn reweight(
    this: &Node,
    static_plan: Selection,
    in_scope: &[Candidate<'_>],
    input: Option<&PortInput>,
) -> Selection {
    let near_far = |c: &&Candidate<'_>| matches!(locality(this, c), Locality::Node | Locality::Zone);
    let mut far: BTreeMap<String, Vec<SocketAddr>> = BTreeMap::new();
    for c in in_scope.iter().filter(|c| !near_far(c)) {
        far.entry(c.zone().unwrap_or_default().to_owned()).or_default().push(addr(c));
    }
    let report =
        FeedbackReport { input: input.cloned(), near: in_scope.iter().filter(near_far).map(addr).collect(), far };
    let heading = |why: &str| format!("feedback: {why}; static plan: {}", static_plan.reason);
    let Some(input) = input else {
        let reason = heading("no measurement yet");
        return Selection { policy: PolicyKind::Feedback, reason, feedback: Some(Box::new(report)), ..static_plan };
    };
    if static_plan.reject || in_scope.is_empty() {
        return Selection { policy: PolicyKind::Feedback, feedback: Some(Box::new(report)), ..static_plan };
    }
    if input.panic {
        let mut panic = Selection::equal(PolicyKind::Feedback, heading(&input.reason), this, in_scope);
        panic.spillover = static_plan.spillover;
        panic.feedback = Some(Box::new(report));
        return panic;
    }
    let ejected = |address: std::net::IpAddr, port: u16| input.ejected.contains(&SocketAddr::new(address, port));
    let mut backends: Vec<Choice> =
        static_plan.backends.iter().filter(|b| !ejected(b.address, b.port)).cloned().collect();
    let left: Vec<Candidate<'_>> = in_scope.iter().filter(|c| !ejected(c.address, c.port)).cloned().collect();
    if backends.is_empty() {
        // Every backend of the static plan is out: the endpoints left, equally.
        let why = format!("{}; every backend of the static plan ejected", input.reason);
        let mut all = Selection::equal(PolicyKind::Feedback, heading(&why), this, &left);
        all.spillover = static_plan.spillover;
        all.feedback = Some(Box::new(report));
        return all;
    }
    let receiving: Vec<Candidate<'_>> =
        left.iter().filter(|c| !input.avoid.iter().any(|z| Some(z.as_str()) == c.zone())).cloned().collect();
    let receiving = if receiving.is_empty() { &left } else { &receiving };
    shift(this, &mut backends, receiving, input.shift);
    let mut reason = heading(&input.reason);
    if input.spill_at > 0 {
        let held = reserve(this, &mut backends, receiving);
        if held > 0 {
            reason.push_str(&format!(
                "; {held} other-zone endpoints held in reserve for connections moved off a backend with {}+ in flight",
                input.spill_at
            ));
        }
    }
    Selection {
        policy: PolicyKind::Feedback,
        reason,
        reject: backends.is_empty(),
        backends,
        feedback: Some(Box::new(report)),
        ..static_plan
    }
}

/// Moves `share` of the total weight from this zone's backends to the other zones': onto the
/// static plan's own far backends in proportion, or, when it has none, equally onto the far
/// endpoints of `left` (this region's first).
fn shift(this: &Node, backends: &mut Vec<Choice>, left: &[Candidate<'_>], share: f64) {
    let is_near = |locality: Locality| matches!(locality, Locality::Node | Locality::Zone);
    let near: f64 = backends.iter().filter(|b| is_near(b.locality)).map(|b| b.weight).sum();
    let far: f64 = backends.iter().filter(|b| !is_near(b.locality)).map(|b| b.weight).sum();
    let moved = (share.clamp(0.0, 1.0) * (near + far)).min(near);
    if moved <= 0.0 {
        return;
    }
    for backend in backends.iter_mut().filter(|b| is_near(b.locality)) {
        backend.weight *= (near - moved) / near;
    }
    // The static plan's own other-zone backends, if any receives: they take the moved share in
    // proportion.
    let receives = |b: &Choice| !is_near(b.locality) && left.iter().any(|c| c.address == b.address && c.port == b.port);
    let far_receiving: f64 = backends.iter().filter(|b| receives(b)).map(|b| b.weight).sum();
    if far_receiving > 0.0 {
        for backend in backends.iter_mut().filter(|b| receives(b)) {
            backend.weight *= (far_receiving + moved) / far_receiving;
        }
    } else {
        let targets = far_targets(this, left);
        let each = moved / targets.len().max(1) as f64;
        for c in targets {
            backends.push(Choice::of(this, c, each));
        }
        backends.sort_by_key(|b| (b.address, b.port));
    }
    backends.retain(|b| b.weight > 0.0);
}

/// A reserve endpoint's weight, as a share of the set's total: below the kernel's resolution, so
/// its weighted draw picks one in about a million connections; the connect hook's second draw,
/// uniform over the set, finds it ([`crate::feedback::spill`]).
pub const RESERVE_SHARE: f64 = 1e-9;

/// Adds the endpoints of `receiving` in other zones (this region's, if it has any, as a shift
/// moves traffic) that `backends` lacks, at the reserve weight; returns how many.
fn reserve(this: &Node, backends: &mut Vec<Choice>, receiving: &[Candidate<'_>]) -> usize {
    let total: f64 = backends.iter().map(|b| b.weight).sum();
    let missing: Vec<Choice> = far_targets(this, receiving)
        .into_iter()
        .filter(|c| !backends.iter().any(|b| b.address == c.address && b.port == c.port))
        .map(|c| Choice::of(this, c, total * RESERVE_SHARE))
        .collect();
    let held = missing.len();
    if held > 0 && total > 0.0 {
        backends.extend(missing);
        backends.sort_by_key(|b| (b.address, b.port));
    }
    held
}

/// The endpoints of `candidates` in other zones, this region's if it has any: where traffic
/// leaving the zone goes.
fn far_targets<'a, 'b>(this: &Node, candidates: &'a [Candidate<'b>]) -> Vec<&'a Candidate<'b>> {
    let others: Vec<&Candidate<'_>> =
        candidates.iter().filter(|c| !matches!(locality(this, c), Locality::Node | Locality::Zone)).collect();
    let region: Vec<&Candidate<'_>> =
        others.iter().copied().filter(|c| locality(this, c) == Locality::Region).collect();
    if region.is_empty() { others } else { region }
}

fn addr(candidate: &Candidate<'_>) -> SocketAddr {
    SocketAddr::new(candidate.address, candidate.port)
}
