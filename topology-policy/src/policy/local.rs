//! `internalTrafficPolicy: Local`: only endpoints on this node, as kube-proxy does it: the ready
//! ones, else the serving-and-terminating ones; none means refuse. Topology is not applied.

use topology_model::Node;

use super::{Candidate, PolicyKind, Selection, describe};

/// The local endpoints of `candidates`.
pub fn select(this: &Node, candidates: &[Candidate<'_>]) -> Selection {
    let local: Vec<Candidate<'_>> =
        candidates.iter().filter(|c| c.node_name() == Some(this.name.as_str())).cloned().collect();
    let (usable, terminating) = super::usable(&local);
    let reason = if usable.is_empty() {
        format!(
            "internalTrafficPolicy Local: no ready or serving-and-terminating endpoint on {}; connections are refused",
            this.name
        )
    } else {
        format!("internalTrafficPolicy Local: {} on {}", describe(usable.len(), terminating), this.name)
    };
    Selection::equal(PolicyKind::Local, reason, this, &usable)
}
