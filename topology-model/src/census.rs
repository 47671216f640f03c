//! What an agent that watches only its own Node knows of the others, from a periodic list of
//! their metadata: their names — each agent's share of the cluster-wide Events is decided by its
//! rank among them — and the region of each zone, for the endpoints' locality and the region
//! topology key (an EndpointSlice names an endpoint's zone, not its region).

use std::collections::{BTreeMap, BTreeSet, btree_map::Entry};

/// The Nodes' names and the region of each zone, as of one list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Census {
    /// Every Node's name, sorted, each once.
    names: Vec<String>,
    /// The region of each zone whose Nodes agree on one.
    regions: BTreeMap<String, String>,
    /// Every zone a Node is labelled with.
    zones: BTreeSet<String>,
}

/// One Node as the census reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counted {
    /// `metadata.name`.
    pub name: String,
    /// `topology.kubernetes.io/zone`, when set and not empty.
    pub zone: Option<String>,
    /// `topology.kubernetes.io/region`, when set and not empty.
    pub region: Option<String>,
}

impl Census {
    /// The census of `nodes`. A zone whose Nodes name different regions has none: a wrong
    /// region would count cross-region endpoints as near.
    pub fn new(nodes: impl IntoIterator<Item = Counted>) -> Self {
        let mut names = Vec::new();
        let mut regions: BTreeMap<String, Option<String>> = BTreeMap::new();
        let mut zones = BTreeSet::new();
        for Counted { name, zone, region } in nodes {
            names.push(name);
            if let Some(zone) = &zone {
                zones.insert(zone.clone());
            }
            let (Some(zone), Some(region)) = (zone, region) else { continue };
            match regions.entry(zone) {
                Entry::Vacant(entry) => {
                    entry.insert(Some(region));
                }
                Entry::Occupied(mut entry) => {
                    if entry.get().as_ref() != Some(&region) {
                        entry.insert(None);
                    }
                }
            }
        }
        names.sort_unstable();
        names.dedup();
        let regions = regions.into_iter().filter_map(|(zone, region)| Some((zone, region?))).collect();
        Self { names, regions, zones }
    }

    /// Every zone a Node is labelled with.
    pub fn zones(&self) -> &BTreeSet<String> {
        &self.zones
    }

    /// Where `name` stands among the Nodes' names in order, and how many there are, counting
    /// `name` itself if the list predates it.
    pub fn rank(&self, name: &str) -> (usize, usize) {
        match self.names.binary_search_by(|other| other.as_str().cmp(name)) {
            Ok(at) => (at, self.names.len()),
            Err(at) => (at, self.names.len() + 1),
        }
    }

    /// The region of `zone`'s Nodes.
    pub fn region(&self, zone: &str) -> Option<&str> {
        self.regions.get(zone).map(String::as_str)
    }

    /// The region of each zone.
    pub fn regions(&self) -> &BTreeMap<String, String> {
        &self.regions
    }

    /// How many Nodes were listed.
    pub fn nodes(&self) -> usize {
        self.names.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(name: &str, zone: &str, region: &str) -> Counted {
        let given = |text: &str| (!text.is_empty()).then(|| text.to_owned());
        Counted { name: name.into(), zone: given(zone), region: given(region) }
    }

    #[test]
    fn ranks_count_the_asking_node_even_before_the_list_has_it() {
        let census =
            Census::new([counted("c", "", ""), counted("a", "", ""), counted("e", "", ""), counted("a", "", "")]);
        assert_eq!(census.nodes(), 3, "a name listed twice counts once");
        assert_eq!(census.rank("a"), (0, 3));
        assert_eq!(census.rank("e"), (2, 3));
        assert_eq!(census.rank("d"), (2, 4), "a node newer than the list ranks among the others");
    }

    #[test]
    fn a_zone_has_the_region_its_nodes_agree_on() {
        let census = Census::new([
            counted("a", "eu-1a", "eu-1"),
            counted("b", "eu-1a", "eu-1"),
            counted("c", "us-2b", "us-2"),
            counted("d", "odd", "us-2"),
            counted("e", "odd", "eu-1"),
            counted("f", "no-region", ""),
        ]);
        assert_eq!(census.region("eu-1a"), Some("eu-1"));
        assert_eq!(census.region("us-2b"), Some("us-2"));
        assert_eq!(census.region("odd"), None, "two regions for one zone: neither is trusted");
        let zones: Vec<&str> = census.zones().iter().map(String::as_str).collect();
        assert_eq!(zones, ["eu-1a", "no-region", "odd", "us-2b"], "every zone a Node has, region or not");
        assert_eq!(census.region("no-region"), None);
        assert_eq!(census.regions().len(), 2);
    }
}
