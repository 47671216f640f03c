//! The spillover plan: one global solution for every zone of a scope, the same on every node.
//!
//! Each zone keeps as much of its own demand as its endpoints can take without any of them going
//! over `(1 + ε)` times the fair share (`1 / endpoints`): `kept = min(demand, capacity)`, which is
//! the most traffic that can stay in zones at all. The surplus of saturated zones goes first to
//! zones of the same region with headroom, then to any zone with headroom, so traffic leaves a
//! region only when the whole region is full. Receivers are filled lowest-loaded first (water
//! filling), so they end up as evenly loaded as the surplus allows, and each saturated zone's
//! surplus is split in proportion to what each receiver takes.

use std::collections::BTreeSet;

/// Below this, an amount of traffic (a share of the total) is nothing.
const NEGLIGIBLE: f64 = 1e-12;
/// The most zones a plan balances. The plan is a zones × zones matrix; zones come from Nodes and
/// from the EndpointSlices a tenant may write, so an unbounded count is memory any tenant can take
/// on every node (128 zones: 128 KiB).
pub const MAX_ZONES: usize = 128;

/// One zone of the problem.
#[derive(Clone, Debug, PartialEq)]
pub struct ZoneInput {
    /// Zone name; "" for endpoints whose zone is unknown (they are nobody's own zone).
    pub name: String,
    /// The zone's region, if known.
    pub region: Option<String>,
    /// Demand, in any unit (allocatable CPU, nodes); only the ratios matter.
    pub demand: f64,
    /// Usable endpoints in the zone.
    pub endpoints: u32,
}

/// Why there is no plan.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SolveError {
    /// No endpoint in any zone.
    #[error("no endpoint to send traffic to")]
    NoEndpoints,
    /// No zone has demand.
    #[error("no zone has demand (no Ready node with allocatable CPU)")]
    NoDemand,
    /// ε is negative or not a number.
    #[error("max overload {0} is not a finite number >= 0")]
    InvalidOverload(f64),
    /// More zones than [`MAX_ZONES`].
    #[error("{0} zones in scope; spillover balances at most {MAX_ZONES}")]
    TooManyZones(usize),
}

/// The solution: where each zone's traffic goes, as shares of all traffic.
#[derive(Clone, Debug, PartialEq)]
pub struct Solution {
    /// The zones, as given.
    pub zones: Vec<ZoneInput>,
    /// ε: no endpoint gets more than `(1 + ε)` times its fair share.
    pub max_overload: f64,
    /// Each zone's share of the demand (sums to 1).
    pub demand: Vec<f64>,
    /// `flow[i][j]`: share of all traffic sent from zone `i` to zone `j`; `flow[i][i]` is kept.
    pub flow: Vec<Vec<f64>>,
    /// Share of all traffic each zone's endpoints receive.
    pub load: Vec<f64>,
    total_endpoints: u32,
    /// The most any endpoint may receive: (1 + ε) / endpoints.
    per_endpoint: f64,
}

/// Solves for `zones` with at most `max_overload` (ε) above the fair share on any endpoint.
pub fn solve(zones: Vec<ZoneInput>, max_overload: f64) -> Result<Solution, SolveError> {
    if !max_overload.is_finite() || max_overload < 0.0 {
        return Err(SolveError::InvalidOverload(max_overload));
    }
    if zones.len() > MAX_ZONES {
        return Err(SolveError::TooManyZones(zones.len()));
    }
    let total_endpoints: u32 = zones.iter().map(|z| z.endpoints).sum();
    if total_endpoints == 0 {
        return Err(SolveError::NoEndpoints);
    }
    let total_demand: f64 = zones.iter().map(|z| positive(z.demand)).sum();
    if total_demand <= 0.0 {
        return Err(SolveError::NoDemand);
    }
    let n = zones.len();
    let demand: Vec<f64> = zones.iter().map(|z| positive(z.demand) / total_demand).collect();
    let endpoints: Vec<u32> = zones.iter().map(|z| z.endpoints).collect();
    let per_endpoint = (1.0 + max_overload) / f64::from(total_endpoints);
    let mut state = Filling { endpoints: &endpoints, per_endpoint, flow: vec![vec![0.0; n]; n], load: vec![0.0; n] };
    let mut surplus = vec![0.0; n];
    for i in 0..n {
        let kept = demand[i].min(state.capacity(i));
        state.flow[i][i] = kept;
        state.load[i] = kept;
        surplus[i] = demand[i] - kept;
    }
    let regions: BTreeSet<&str> = zones.iter().filter_map(|z| z.region.as_deref()).collect();
    for region in regions {
        let members: Vec<usize> = (0..n).filter(|&i| zones[i].region.as_deref() == Some(region)).collect();
        state.spill(&members, &mut surplus);
    }
    let everyone: Vec<usize> = (0..n).collect();
    state.spill(&everyone, &mut surplus);
    let Filling { flow, load, .. } = state;
    Ok(Solution { zones, max_overload, demand, flow, load, total_endpoints, per_endpoint })
}

fn positive(value: f64) -> f64 {
    if value.is_finite() && value > 0.0 { value } else { 0.0 }
}

/// The flows and loads while surplus is being placed.
struct Filling<'a> {
    endpoints: &'a [u32],
    per_endpoint: f64,
    flow: Vec<Vec<f64>>,
    load: Vec<f64>,
}

impl Filling<'_> {
    fn capacity(&self, zone: usize) -> f64 {
        f64::from(self.endpoints[zone]) * self.per_endpoint
    }

    /// Moves the surplus of `members` to the headroom of `members`.
    fn spill(&mut self, members: &[usize], surplus: &mut [f64]) {
        let total: f64 = members.iter().map(|&i| surplus[i]).sum();
        if total <= NEGLIGIBLE {
            return;
        }
        let received = self.water_fill(members, total);
        let placed: f64 = received.iter().map(|(_, amount)| amount).sum();
        if placed <= NEGLIGIBLE {
            return;
        }
        for &i in members {
            let giving = surplus[i];
            if giving <= 0.0 {
                continue;
            }
            for &(j, amount) in &received {
                self.flow[i][j] += giving * amount / total;
            }
            surplus[i] -= giving * placed / total;
        }
        for (j, amount) in received {
            self.load[j] += amount;
        }
    }

    /// How much of `amount` each zone of `sinks` with headroom takes, raising the least-loaded
    /// (per endpoint) first, never above capacity. Takes less than `amount` only when full.
    fn water_fill(&self, sinks: &[usize], amount: f64) -> Vec<(usize, f64)> {
        let mut open: Vec<(f64, usize)> = sinks
            .iter()
            .filter(|&&j| self.endpoints[j] > 0 && self.capacity(j) - self.load[j] > NEGLIGIBLE)
            .map(|&j| (self.load[j] / f64::from(self.endpoints[j]), j))
            .collect();
        open.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut level = self.per_endpoint;
        let (mut endpoints, mut mass) = (0.0, 0.0);
        for (k, &(_, j)) in open.iter().enumerate() {
            endpoints += f64::from(self.endpoints[j]);
            mass += self.load[j];
            let next = open.get(k + 1).map_or(self.per_endpoint, |(l, _)| *l);
            let candidate = (amount + mass) / endpoints;
            if candidate <= next {
                level = candidate.min(self.per_endpoint);
                break;
            }
        }
        open.iter()
            .filter(|(current, _)| *current < level)
            .map(|&(current, j)| (j, f64::from(self.endpoints[j]) * (level - current)))
            .collect()
    }
}

impl Solution {
    /// Index of the zone named `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.zones.iter().position(|z| z.name == name)
    }

    /// Every usable endpoint of the scope.
    pub fn total_endpoints(&self) -> u32 {
        self.total_endpoints
    }

    /// A zone's share of the endpoints.
    pub fn supply(&self, zone: usize) -> f64 {
        f64::from(self.zones[zone].endpoints) / f64::from(self.total_endpoints)
    }

    /// Where zone `i`'s traffic goes: the share of it sent to each zone (sums to 1).
    ///
    /// A zone without demand (its nodes are not Ready, or it has none) is outside the plan; its
    /// traffic, if any, goes to its own endpoints, else to the headroom left in its region, else
    /// to the headroom left anywhere, else in proportion to the endpoints.
    pub fn route(&self, i: usize) -> Vec<f64> {
        if self.demand[i] > 0.0 {
            return self.flow[i].iter().map(|f| f / self.demand[i]).collect();
        }
        let n = self.zones.len();
        let mut share = vec![0.0; n];
        if self.zones[i].endpoints > 0 {
            share[i] = 1.0;
            return share;
        }
        let headroom = |j: usize| (f64::from(self.zones[j].endpoints) * self.per_endpoint - self.load[j]).max(0.0);
        let region = self.zones[i].region.as_deref();
        let in_region: Vec<usize> =
            (0..n).filter(|&j| region.is_some() && self.zones[j].region.as_deref() == region).collect();
        let everyone: Vec<usize> = (0..n).collect();
        for group in [&in_region, &everyone] {
            let room: f64 = group.iter().map(|&j| headroom(j)).sum();
            if room > NEGLIGIBLE {
                for &j in group {
                    share[j] = headroom(j) / room;
                }
                return share;
            }
        }
        (0..n).map(|j| self.supply(j)).collect()
    }

    /// Share of all traffic that stays in its zone.
    pub fn in_zone(&self) -> f64 {
        (0..self.zones.len()).map(|i| self.flow[i][i]).sum()
    }

    /// The most traffic that can stay in zones with no endpoint over `(1 + ε)` of its fair share:
    /// Σ over zones of min(demand share, endpoint share × (1 + ε)).
    pub fn bound(&self) -> f64 {
        (0..self.zones.len()).map(|i| self.demand[i].min(self.supply(i) * (1.0 + self.max_overload))).sum()
    }

    /// How far zone `j`'s endpoints are above (positive) or below their fair share, as a fraction
    /// of it; `None` for a zone without endpoints.
    pub fn deviation(&self, j: usize) -> Option<f64> {
        (self.zones[j].endpoints > 0).then(|| self.load[j] / self.supply(j) - 1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(name: &str, region: &str, demand: f64, endpoints: u32) -> ZoneInput {
        ZoneInput { name: name.into(), region: (!region.is_empty()).then(|| region.into()), demand, endpoints }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn balanced_zones_keep_everything() {
        let plan = solve(vec![zone("a", "", 1.0, 2), zone("b", "", 1.0, 2)], 0.1).unwrap();
        assert!(close(plan.in_zone(), 1.0));
        assert_eq!(plan.route(0), vec![1.0, 0.0]);
    }

    #[test]
    fn a_saturated_zone_keeps_its_capacity_and_spills_the_rest_evenly() {
        // Demand 60/20/20, endpoints 2/4/4: zone a can take 2 × 1.1 / 10 = 22 % of all traffic.
        let plan = solve(vec![zone("a", "", 3.0, 2), zone("b", "", 1.0, 4), zone("c", "", 1.0, 4)], 0.1).unwrap();
        assert!(close(plan.flow[0][0], 0.22));
        assert!(close(plan.flow[0][1], 0.19) && close(plan.flow[0][2], 0.19), "{:?}", plan.flow);
        assert!(close(plan.in_zone(), 0.62) && close(plan.bound(), 0.62));
        assert!(close(plan.deviation(0).unwrap(), 0.1));
        assert!(close(plan.deviation(1).unwrap(), (0.39 / 0.4) - 1.0));
        let route = plan.route(0);
        assert!(close(route[0], 0.22 / 0.6) && close(route.iter().sum::<f64>(), 1.0));
        assert_eq!(plan.route(1), vec![0.0, 1.0, 0.0], "receivers keep their own traffic");
    }

    #[test]
    fn epsilon_zero_is_perfect_balance() {
        let plan = solve(vec![zone("a", "", 5.0, 1), zone("b", "", 3.0, 3), zone("c", "", 2.0, 6)], 0.0).unwrap();
        for j in 0..3 {
            assert!(close(plan.deviation(j).unwrap(), 0.0), "zone {j}: {:?}", plan.load);
        }
    }

    #[test]
    fn the_region_takes_the_surplus_before_other_regions() {
        // a (r1) overflows; b (r1) has room for part of it; c (r2) takes the rest.
        let zones = vec![zone("a", "r1", 6.0, 2), zone("b", "r1", 1.0, 2), zone("c", "r2", 3.0, 6)];
        let plan = solve(zones, 0.0).unwrap();
        // Capacities 0.2 / 0.2 / 0.6; demand 0.6 / 0.1 / 0.3: b takes 0.1 of a's 0.4, c the 0.3 left.
        assert!(close(plan.flow[0][1], 0.1) && close(plan.flow[0][2], 0.3), "{:?}", plan.flow);
    }

    #[test]
    fn water_filling_raises_the_least_loaded_receiver_first() {
        // Cap per endpoint 0.15. a spills 0.5 - 0.3 = 0.2; b sits at 0.042 per endpoint, c at 0.125:
        // b alone rises to (0.2 + 0.125) / 3 = 0.108, still below c, so c takes nothing.
        let zones = vec![zone("a", "", 4.0, 2), zone("b", "", 1.0, 3), zone("c", "", 3.0, 3)];
        let plan = solve(zones, 0.2).unwrap();
        assert!(close(plan.flow[0][2], 0.0), "c is already fuller than b will get: {:?}", plan.flow);
        assert!(close(plan.flow[0][1], 0.2));
    }

    #[test]
    fn zones_without_endpoints_or_demand() {
        // Per endpoint at most 1.5 / 10: b (8 endpoints) takes a's demand and its own, 1.0 of 1.2.
        let zones = vec![zone("a", "r", 1.0, 0), zone("b", "r", 1.0, 8), zone("", "", 0.0, 2), zone("d", "r", 0.0, 0)];
        let plan = solve(zones, 0.5).unwrap();
        assert!(close(plan.flow[0][1], 0.5), "a's region comes first: {:?}", plan.flow);
        assert!(close(plan.flow[0][0], 0.0) && close(plan.route(0).iter().sum::<f64>(), 1.0));
        let loads: f64 = plan.load.iter().sum();
        assert!(close(loads, 1.0), "every bit of demand lands somewhere: {:?}", plan.load);
        // d has neither: its traffic goes to the headroom in its region (b's), not to the "" zone.
        let route = plan.route(3);
        assert!(close(route[1], 1.0), "{route:?}");
        assert_eq!(solve(vec![zone("a", "", 1.0, 0)], 0.1), Err(SolveError::NoEndpoints));
        assert_eq!(solve(vec![zone("a", "", 0.0, 1)], 0.1), Err(SolveError::NoDemand));
        assert!(matches!(solve(vec![zone("a", "", 1.0, 1)], f64::NAN), Err(SolveError::InvalidOverload(_))));
    }
}
