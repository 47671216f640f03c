//! The algorithms compared, each turning an input into an [`Outcome`].

pub mod hints;
pub mod local;

use std::fmt;

use topology_policy::policy::spillover::solve::{self, ZoneInput};

use super::{outcome::Outcome, space::Input};

/// An algorithm of the comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algorithm {
    /// Every endpoint equally, from every zone (kube-proxy's default).
    Random,
    /// The KubeCon talk's "local" algorithm as the simulator implemented it.
    Local,
    /// The EndpointSlice controller's `topology-mode: Auto` hints, as kube-proxy uses them.
    AutoHints,
    /// `trafficDistribution: PreferClose`: the own zone when it has endpoints, else all.
    PreferClose,
    /// This agent's capacity spillover with the given ε.
    Spillover(f64),
}

impl fmt::Display for Algorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Random => f.write_str("random (kube-proxy default)"),
            Self::Local => f.write_str("local (KubeCon simulator)"),
            Self::AutoHints => f.write_str("Auto hints (EndpointSlice controller)"),
            Self::PreferClose => f.write_str("PreferClose"),
            Self::Spillover(eps) => write!(f, "spillover, max overload {}%", eps * 100.0),
        }
    }
}

impl Algorithm {
    /// Short name for charts and JSON.
    pub fn key(&self) -> String {
        match self {
            Self::Random => "random".into(),
            Self::Local => "local".into(),
            Self::AutoHints => "auto-hints".into(),
            Self::PreferClose => "prefer-close".into(),
            Self::Spillover(eps) => format!("spillover-{}", eps * 100.0),
        }
    }

    /// Where `input`'s traffic goes.
    pub fn route(&self, input: &Input) -> Outcome {
        let demand = demand(input);
        match self {
            Self::Random => random(input, &demand, false),
            Self::Local => match local::groups(input) {
                Some(groups) => by_groups(&groups, &demand),
                None => random(input, &demand, true),
            },
            Self::AutoHints => match hints::auto(input) {
                Some(groups) => by_groups(&groups, &demand),
                None => random(input, &demand, true),
            },
            Self::PreferClose => prefer_close(input, &demand),
            Self::Spillover(eps) => spillover(input, &demand, *eps),
        }
    }
}

/// Each zone's share of the traffic: its share of the nodes.
pub fn demand(input: &Input) -> Vec<f64> {
    let total: u32 = input.nodes.iter().sum();
    input.nodes.iter().map(|&n| f64::from(n) / f64::from(total)).collect()
}

fn random(input: &Input, demand: &[f64], fell_back: bool) -> Outcome {
    let mut outcome = Outcome { fell_back, ..Outcome::default() };
    let groups: Vec<usize> = outcome.zone_groups(&input.endpoints).into_iter().flatten().collect();
    for (zone, &share) in demand.iter().enumerate() {
        outcome.spread(zone, &groups, share);
    }
    outcome
}

/// Routing by endpoint groups: `groups[z][j]` endpoints of zone `j` serve zone `z`'s traffic
/// (evenly); a zone whose group is empty falls back to every endpoint, as kube-proxy does when
/// no endpoint is hinted for its zone.
fn by_groups(groups: &[Vec<u32>], demand: &[f64]) -> Outcome {
    let mut outcome = Outcome::default();
    let mut ids = Vec::with_capacity(groups.len());
    for group in groups {
        ids.push(outcome.zone_groups(group));
    }
    let all: Vec<usize> = ids.iter().flatten().flatten().copied().collect();
    for (zone, &share) in demand.iter().enumerate() {
        let mine: Vec<usize> = ids[zone].iter().flatten().copied().collect();
        if mine.is_empty() {
            outcome.spread(zone, &all, share);
        } else {
            outcome.spread(zone, &mine, share);
        }
    }
    outcome
}

fn prefer_close(input: &Input, demand: &[f64]) -> Outcome {
    let mut outcome = Outcome::default();
    let groups = outcome.zone_groups(&input.endpoints);
    let all: Vec<usize> = groups.iter().flatten().copied().collect();
    for (zone, &share) in demand.iter().enumerate() {
        match groups[zone] {
            Some(own) => outcome.send(zone, own, share),
            None => outcome.spread(zone, &all, share),
        }
    }
    outcome
}

/// The agent's plan, through the same solver and the same per-zone routes the policy programs.
fn spillover(input: &Input, demand: &[f64], max_overload: f64) -> Outcome {
    let zones = (0..input.nodes.len())
        .map(|z| ZoneInput {
            name: format!("zone{}", z + 1),
            region: None,
            demand: f64::from(input.nodes[z]),
            endpoints: input.endpoints[z],
        })
        .collect();
    let plan = solve::solve(zones, max_overload).expect("every input has endpoints and nodes");
    let mut outcome = Outcome::default();
    let groups = outcome.zone_groups(&input.endpoints);
    for (zone, &share) in demand.iter().enumerate() {
        for (to, fraction) in plan.route(zone).into_iter().enumerate() {
            if let Some(group) = groups[to] {
                outcome.send(zone, group, share * fraction);
            }
        }
    }
    outcome
}

/// Σ over zones of min(demand share, endpoint share × (1 + ε)): the most traffic that can stay
/// in zones with no endpoint above (1 + ε) of its fair share.
pub fn bound(input: &Input, max_overload: f64) -> f64 {
    let total = f64::from(input.total_endpoints());
    demand(input).iter().zip(input.endpoints).map(|(d, e)| d.min(f64::from(e) / total * (1.0 + max_overload))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(nodes: [u32; 3], endpoints: [u32; 3]) -> Input {
        Input { nodes, endpoints }
    }

    #[test]
    fn random_keeps_the_endpoint_share_in_zone_and_is_perfectly_balanced() {
        let i = input([1, 1, 2], [1, 1, 2]);
        let m = Algorithm::Random.route(&i).metrics(4);
        assert!((m.in_zone - (0.25 * 0.25 + 0.25 * 0.25 + 0.5 * 0.5)).abs() < 1e-12);
        assert!(m.max_overload.abs() < 1e-12 && m.mean_deviation.abs() < 1e-12 && m.lost.abs() < 1e-12);
    }

    #[test]
    fn prefer_close_keeps_all_and_overloads_without_bound() {
        // Zone 3 has half the demand and one endpoint of ten.
        let i = input([1, 1, 2], [0, 9, 1]);
        let m = Algorithm::PreferClose.route(&i).metrics(10);
        // Zone 1 (no endpoint) spreads; zones 2 and 3 keep theirs.
        assert!((m.in_zone - 0.75).abs() < 1e-12, "{m:?}");
        let zone3 = 0.5 + 0.25 * 0.1;
        assert!((m.max_overload - (zone3 * 10.0 - 1.0)).abs() < 1e-9, "{m:?}");
    }

    #[test]
    fn spillover_reaches_the_bound_without_passing_epsilon() {
        for eps in [0.0, 0.05, 0.1] {
            let i = input([1, 1, 2], [0, 9, 1]);
            let m = Algorithm::Spillover(eps).route(&i).metrics(10);
            assert!((m.in_zone - bound(&i, eps)).abs() < 1e-9, "{eps}: {m:?}");
            assert!(m.max_overload <= eps + 1e-9, "{eps}: {m:?}");
            assert!(m.lost < 1e-9);
        }
    }
}
