//! Topology Aware Routing (`service.kubernetes.io/topology-mode: Auto`, formerly
//! `service.kubernetes.io/topology-aware-hints: auto`) with kube-proxy's safeguards: the zone
//! hints are used only if every usable endpoint has one and at least one names this node's zone;
//! a node without a zone label does not filter. Otherwise every usable endpoint is used. Hints
//! are read from ready endpoints only: the serving-and-terminating fallback is not filtered.

use topology_model::Node;

use super::{Candidate, PolicyKind, Selection, describe, terminating_fallback};

/// Whether an annotation value turns hints on: kube-proxy accepts any value but the disabled ones.
pub fn enabled(mode: &str) -> bool {
    !matches!(mode, "" | "disabled" | "Disabled")
}

/// The usable endpoints hinted for this node's zone, or all of them when the safeguards say no.
pub fn select(this: &Node, mode: &str, usable: &[Candidate<'_>], terminating: bool) -> Selection {
    let all = |why: String| {
        let reason = if usable.is_empty() {
            format!(
                "topology-aware hints ({mode}): no ready or serving-and-terminating endpoint; connections are refused"
            )
        } else {
            format!("topology-aware hints ({mode}) not applied: {why}; all {}", describe(usable.len(), terminating))
        };
        Selection::equal(PolicyKind::TopologyAwareHints, reason, this, usable)
    };
    if usable.is_empty() {
        return all(String::new());
    }
    if terminating {
        return terminating_fallback(
            PolicyKind::TopologyAwareHints,
            &format!("topology-aware hints ({mode})"),
            this,
            usable,
        );
    }
    let Some(zone) = this.zone() else {
        return all(format!("node {} has no zone label", this.name));
    };
    if let Some(unhinted) = usable.iter().find(|c| c.hint_zones.is_empty()) {
        return all(format!("endpoint {} has no zone hint", unhinted.address));
    }
    let hinted: Vec<Candidate<'_>> =
        usable.iter().filter(|c| c.hint_zones.iter().any(|z| z == zone)).cloned().collect();
    if hinted.is_empty() {
        return all(format!("no endpoint is hinted for zone {zone}"));
    }
    let reason = format!(
        "topology-aware hints ({mode}): {} of {} hinted for zone {zone}",
        hinted.len(),
        describe(usable.len(), terminating)
    );
    Selection::equal(PolicyKind::TopologyAwareHints, reason, this, &hinted)
}
