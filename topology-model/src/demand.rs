//! Demand by zone: the allocatable CPU of each zone's Ready nodes, the signal the EndpointSlice
//! controller weighs zones by. Kept incrementally as Nodes come and go, so reading it is free.

use std::collections::BTreeMap;

use super::objects::Node;

/// Nodes with one of these labels are not counted (as the EndpointSlice controller does): they
/// run the control plane, not the clients of Services.
const EXCLUDED_LABELS: [&str; 2] = ["node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master"];

/// What one Node adds to its zone's demand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Contribution {
    /// The node's zone.
    pub zone: String,
    /// The node's region, if labelled.
    pub region: Option<String>,
    /// Allocatable CPU in millicores.
    pub cpu_millis: u64,
}

impl Contribution {
    /// What `node` adds: nothing unless it is Ready, has a zone and allocatable CPU, and is not a
    /// control-plane node.
    pub fn of(node: &Node) -> Option<Self> {
        let counted = node.ready
            && node.allocatable_cpu_millis > 0
            && !EXCLUDED_LABELS.iter().any(|label| node.labels.contains_key(label));
        counted.then_some(())?;
        Some(Self {
            zone: node.zone()?.to_owned(),
            region: node.region().map(str::to_owned),
            cpu_millis: node.allocatable_cpu_millis,
        })
    }
}

/// One zone's demand.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ZoneDemand {
    /// Allocatable CPU of the zone's counted nodes, in millicores.
    pub cpu_millis: u64,
    /// Number of counted nodes.
    pub nodes: u32,
    /// Counted nodes by region label.
    regions: BTreeMap<String, u32>,
}

impl ZoneDemand {
    /// The zone's region: the region label most of its nodes carry (ties: the first by name).
    pub fn region(&self) -> Option<&str> {
        let most = self.regions.values().copied().max()?;
        self.regions.iter().find(|(_, count)| **count == most).map(|(region, _)| region.as_str())
    }
}

/// Demand of every zone with at least one counted node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Demand {
    zones: BTreeMap<String, ZoneDemand>,
}

impl Demand {
    /// Adds a node's contribution.
    pub fn add(&mut self, contribution: &Contribution) {
        let zone = self.zones.entry(contribution.zone.clone()).or_default();
        zone.cpu_millis = zone.cpu_millis.saturating_add(contribution.cpu_millis);
        zone.nodes += 1;
        if let Some(region) = &contribution.region {
            *zone.regions.entry(region.clone()).or_default() += 1;
        }
    }

    /// Removes a contribution added before.
    pub fn remove(&mut self, contribution: &Contribution) {
        let Some(zone) = self.zones.get_mut(&contribution.zone) else { return };
        zone.cpu_millis = zone.cpu_millis.saturating_sub(contribution.cpu_millis);
        zone.nodes = zone.nodes.saturating_sub(1);
        if let Some(region) = &contribution.region
            && let Some(count) = zone.regions.get_mut(region)
        {
            *count -= 1;
            if *count == 0 {
                zone.regions.remove(region);
            }
        }
        if zone.nodes == 0 {
            self.zones.remove(&contribution.zone);
        }
    }

    /// One zone's demand.
    pub fn zone(&self, zone: &str) -> Option<&ZoneDemand> {
        self.zones.get(zone)
    }

    /// Every zone with demand, by name.
    pub fn zones(&self) -> impl Iterator<Item = (&str, &ZoneDemand)> {
        self.zones.iter().map(|(name, demand)| (name.as_str(), demand))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::objects::{LABEL_REGION, LABEL_ZONE};

    fn node(name: &str, zone: &str, region: &str, cpu: u64, ready: bool) -> Node {
        let mut labels = BTreeMap::from([(LABEL_ZONE.to_owned(), zone.to_owned())]);
        if !region.is_empty() {
            labels.insert(LABEL_REGION.to_owned(), region.to_owned());
        }
        Node {
            name: name.into(),
            labels: labels.into(),
            allocatable_cpu_millis: cpu,
            ready,
            pod_cidrs: Vec::new(),
            addresses: Vec::new(),
        }
    }

    #[test]
    fn only_ready_zoned_worker_nodes_with_cpu_count() {
        assert!(Contribution::of(&node("a", "z1", "r", 4000, true)).is_some());
        assert!(Contribution::of(&node("a", "z1", "r", 4000, false)).is_none(), "not Ready");
        assert!(Contribution::of(&node("a", "z1", "r", 0, true)).is_none(), "no allocatable CPU");
        assert!(Contribution::of(&node("a", "", "r", 4000, true)).is_none(), "empty zone label");
        let mut control = node("a", "z1", "r", 4000, true);
        control.labels.insert("node-role.kubernetes.io/control-plane", "");
        assert!(Contribution::of(&control).is_none(), "control plane");
    }

    #[test]
    fn adds_and_removes_back_to_nothing() {
        let nodes =
            [node("a", "z1", "r1", 4000, true), node("b", "z1", "r2", 2000, true), node("c", "z1", "r2", 500, true)];
        let mut demand = Demand::default();
        for n in &nodes {
            demand.add(&Contribution::of(n).unwrap());
        }
        let z1 = demand.zone("z1").unwrap();
        assert_eq!((z1.cpu_millis, z1.nodes, z1.region()), (6500, 3, Some("r2")));
        demand.remove(&Contribution::of(&nodes[2]).unwrap());
        assert_eq!(demand.zone("z1").unwrap().region(), Some("r1"), "a tie goes to the first by name");
        demand.remove(&Contribution::of(&nodes[0]).unwrap());
        demand.remove(&Contribution::of(&nodes[1]).unwrap());
        assert_eq!(demand, Demand::default());
    }
}
