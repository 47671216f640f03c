//! `spec.trafficDistribution`: `PreferSameNode` (this node, else this zone, else all),
//! `PreferSameZone` and `PreferClose` (this zone, else all). The EndpointSlice hints are used when
//! every usable endpoint carries them; when they are missing or partial (a rollout, an older
//! control plane, a file without hints), each endpoint's node and zone come from its own fields, so
//! missing hints never turn the preference off (the failure mode of cilium#47960). The
//! serving-and-terminating fallback is not filtered (kube-proxy's rule).

use topology_model::{Node, TrafficDistribution};

use super::{Candidate, PolicyKind, Selection, describe, terminating_fallback};

/// A `spec.trafficDistribution` this agent does not know: ignored, as kube-proxy ignores it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("spec.trafficDistribution {0:?} ignored: not PreferClose, PreferSameZone or PreferSameNode")]
pub struct UnknownDistribution(pub String);

/// The preferred endpoints for `distribution`, or why the value is ignored.
pub fn select(
    this: &Node,
    distribution: &TrafficDistribution,
    usable: &[Candidate<'_>],
    terminating: bool,
) -> Result<Selection, UnknownDistribution> {
    let (policy, levels): (PolicyKind, &[Level]) = match distribution {
        TrafficDistribution::PreferClose => (PolicyKind::PreferClose, &[Level::Zone]),
        TrafficDistribution::PreferSameZone => (PolicyKind::PreferSameZone, &[Level::Zone]),
        TrafficDistribution::PreferSameNode => (PolicyKind::PreferSameNode, &[Level::Node, Level::Zone]),
        TrafficDistribution::Unknown(value) => return Err(UnknownDistribution(value.clone())),
    };
    let name = format!("{policy:?}");
    if usable.is_empty() {
        let reason = format!("{name}: no ready or serving-and-terminating endpoint; connections are refused");
        return Ok(Selection::equal(policy, reason, this, &[]));
    }
    if terminating {
        return Ok(terminating_fallback(policy, &name, this, usable));
    }
    let mut misses = Vec::new();
    for level in levels {
        match preferred(this, *level, usable) {
            Preferred::Found { chosen, scope, source } => {
                let before = if misses.is_empty() { String::new() } else { format!("{}; ", misses.join("; ")) };
                let reason = format!(
                    "{name}: {before}{} of {} {scope} ({source})",
                    chosen.len(),
                    describe(usable.len(), terminating)
                );
                return Ok(Selection::equal(policy, reason, this, &chosen));
            }
            Preferred::None(why) => misses.push(why),
        }
    }
    let reason = format!("{name}: {}; all {}", misses.join("; "), describe(usable.len(), terminating));
    Ok(Selection::equal(policy, reason, this, usable))
}

#[derive(Clone, Copy)]
enum Level {
    Node,
    Zone,
}

enum Preferred<'a> {
    Found { chosen: Vec<Candidate<'a>>, scope: String, source: String },
    None(String),
}

/// The usable endpoints at `level` near `this`, by hints when all carry them, else by their fields.
fn preferred<'a>(this: &Node, level: Level, usable: &[Candidate<'a>]) -> Preferred<'a> {
    let (scope, target) = match level {
        Level::Node => (format!("on node {}", this.name), this.name.as_str()),
        Level::Zone => match this.zone() {
            Some(zone) => (format!("in zone {zone}"), zone),
            None => return Preferred::None(format!("node {} has no zone label", this.name)),
        },
    };
    let hints = |c: &Candidate<'_>| -> bool {
        match level {
            Level::Node => !c.hint_nodes.is_empty(),
            Level::Zone => !c.hint_zones.is_empty(),
        }
    };
    let unhinted = usable.iter().filter(|c| !hints(c)).count();
    let (chosen, source): (Vec<Candidate<'a>>, String) = if unhinted == 0 {
        let chosen = usable
            .iter()
            .filter(|c| match level {
                Level::Node => c.hint_nodes.iter().any(|n| n == target),
                Level::Zone => c.hint_zones.iter().any(|z| z == target),
            })
            .cloned()
            .collect();
        (chosen, "from EndpointSlice hints".into())
    } else {
        let chosen = usable
            .iter()
            .filter(|c| match level {
                Level::Node => c.node_name() == Some(target),
                Level::Zone => c.zone() == Some(target),
            })
            .cloned()
            .collect();
        let what = match level {
            Level::Node => "nodeName",
            Level::Zone => "zone",
        };
        (chosen, format!("from each endpoint's {what}: hints missing on {unhinted} of {}", usable.len()))
    };
    if chosen.is_empty() {
        Preferred::None(format!("no endpoint {scope} ({source})"))
    } else {
        Preferred::Found { chosen, scope, source }
    }
}
