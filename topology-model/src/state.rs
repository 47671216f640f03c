//! The cluster state: every usable Node, Service and EndpointSlice, indexed for the policy and
//! for incremental recomputation. Sources (file, Kubernetes watches) write it; the policy reads it.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet, btree_map::Entry},
    sync::Arc,
};

use super::{
    census::Census,
    demand::{Contribution, Demand},
    objects::{EndpointSlice, Node, ObjectKey, Service},
};

/// Nodes, Services and EndpointSlices, with slices indexed by their Service.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    /// Nodes by name, hashed: the policy looks an endpoint's Node up for every endpoint it weighs
    /// (500,000 in a sync of 50,000 Services), where a tree's search compared names byte by byte.
    nodes: HashMap<String, Node, foldhash::fast::RandomState>,
    services: BTreeMap<ObjectKey, Service>,
    slices: BTreeMap<ObjectKey, EndpointSlice>,
    /// Slice keys by Service, sorted; a Service has few slices, so a vector beats a tree.
    slices_by_service: BTreeMap<ObjectKey, Vec<ObjectKey>>,
    /// One shared copy of each node name and zone the endpoints mention, of each Node's label keys
    /// and values, and of each namespace. Hashed with foldhash (seeded per process), not SipHash:
    /// a full list interns two strings per endpoint.
    interned: HashSet<Arc<str>, foldhash::fast::RandomState>,
    /// Demand by zone, derived from the Nodes.
    demand: Demand,
    /// Bumped whenever `demand` changes.
    demand_version: u64,
    /// The other Nodes as a periodic list of their metadata saw them, when the agent watches its
    /// own Node alone.
    census: Option<Census>,
}

impl PartialEq for ClusterState {
    fn eq(&self, other: &Self) -> bool {
        // The interner is a cache and the demand derived from the Nodes: neither is state.
        (&self.nodes, &self.services, &self.slices, &self.census)
            == (&other.nodes, &other.services, &other.slices, &other.census)
    }
}

impl Eq for ClusterState {}

impl ClusterState {
    /// Adds or replaces a Node; true if anything changed.
    pub fn upsert_node(&mut self, mut node: Node) -> bool {
        if self.nodes.get(&node.name) == Some(&node) {
            return false;
        }
        node.labels.share(|text| intern(&mut self.interned, text));
        let before = self.nodes.get(&node.name).and_then(Contribution::of);
        self.account(before, Contribution::of(&node));
        self.nodes.insert(node.name.clone(), node);
        true
    }

    /// Removes a Node; the removed Node, if it existed.
    pub fn remove_node(&mut self, name: &str) -> Option<Node> {
        let removed = self.nodes.remove(name)?;
        self.account(Contribution::of(&removed), None);
        Some(removed)
    }

    /// Moves a Node's contribution to the demand from `before` to `after`.
    fn account(&mut self, before: Option<Contribution>, after: Option<Contribution>) {
        if before == after {
            return;
        }
        if let Some(before) = &before {
            self.demand.remove(before);
        }
        if let Some(after) = &after {
            self.demand.add(after);
        }
        self.demand_version += 1;
    }

    /// Demand by zone: allocatable CPU of the Ready worker nodes.
    pub fn demand(&self) -> &Demand {
        &self.demand
    }

    /// Changes whenever [`Self::demand`] changes.
    pub fn demand_version(&self) -> u64 {
        self.demand_version
    }

    /// Adds or replaces a Service; true if anything changed.
    pub fn upsert_service(&mut self, mut service: Service) -> bool {
        service.key.namespace = intern(&mut self.interned, Arc::clone(&service.key.namespace));
        // One search of the tree, not a lookup and then an insert: a list inserts every Service.
        match self.services.entry(service.key.clone()) {
            Entry::Occupied(held) if *held.get() == service => false,
            Entry::Occupied(mut held) => {
                held.insert(service);
                true
            }
            Entry::Vacant(vacant) => {
                vacant.insert(service);
                true
            }
        }
    }

    /// Removes a Service; true if it existed. Its slices stay: they may outlive it briefly.
    pub fn remove_service(&mut self, key: &ObjectKey) -> bool {
        self.services.remove(key).is_some()
    }

    /// Adds or replaces an EndpointSlice. Returns the Services whose endpoints changed (the old and
    /// the new owner, if the label moved), empty if nothing changed.
    pub fn upsert_slice(&mut self, mut slice: EndpointSlice) -> Vec<ObjectKey> {
        let interned = &mut self.interned;
        slice.key.namespace = intern(interned, Arc::clone(&slice.key.namespace));
        let entry = self.slices.entry(slice.key.clone());
        if matches!(&entry, Entry::Occupied(held) if *held.get() == slice) {
            return Vec::new();
        }
        if let Some(service) = &mut slice.service {
            service.namespace = Arc::clone(&slice.key.namespace);
        }
        for endpoint in &mut slice.endpoints {
            endpoint.node_name = endpoint.node_name.take().map(|name| intern(interned, name));
            endpoint.zone = endpoint.zone.take().map(|zone| intern(interned, zone));
        }
        let (key, owner) = (slice.key.clone(), slice.service.clone());
        let previous = match entry {
            Entry::Occupied(mut held) => held.insert(slice).service,
            Entry::Vacant(vacant) => {
                vacant.insert(slice);
                None
            }
        };
        if previous != owner {
            if let Some(previous) = &previous {
                self.unlink(previous, &key);
            }
            if let Some(owner) = &owner {
                let keys = self.slices_by_service.entry(owner.clone()).or_default();
                if let Err(at) = keys.binary_search(&key) {
                    keys.insert(at, key);
                }
            }
        }
        let mut affected: Vec<ObjectKey> = previous.into_iter().collect();
        affected.extend(owner.filter(|owner| !affected.contains(owner)));
        affected
    }

    /// The shared copy of a node name or zone the endpoints mention, or of a Node's label (every
    /// Node's zone has one).
    pub fn shared(&self, text: &str) -> Option<&Arc<str>> {
        self.interned.get(text)
    }

    /// Removes an EndpointSlice; returns the Service it belonged to, if any.
    pub fn remove_slice(&mut self, key: &ObjectKey) -> Vec<ObjectKey> {
        let Some(old) = self.slices.remove(key) else {
            return Vec::new();
        };
        let Some(service) = old.service else {
            return Vec::new();
        };
        self.unlink(&service, key);
        vec![service]
    }

    /// Takes the slice `key` from `service`'s.
    fn unlink(&mut self, service: &ObjectKey, key: &ObjectKey) {
        if let Some(keys) = self.slices_by_service.get_mut(service) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.slices_by_service.remove(service);
            }
        }
    }

    /// A Node by name.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// Where `name` stands among the Nodes' names in order, and how many there are: among the
    /// census's when there is one, else among the Nodes held.
    pub fn rank(&self, name: &str) -> (usize, usize) {
        match &self.census {
            Some(census) => census.rank(name),
            None => (self.nodes.keys().filter(|other| other.as_str() < name).count(), self.nodes.len()),
        }
    }

    /// Sets the census of the Nodes not held (`None`: every Node is held); true if the region of
    /// some zone changed with it, which can move any Service.
    pub fn set_census(&mut self, census: Option<Census>) -> bool {
        let regions = |census: &Option<Census>| census.as_ref().map(Census::regions).cloned().unwrap_or_default();
        let moved = regions(&self.census) != regions(&census);
        self.census = census;
        moved
    }

    /// Every zone a Node carries (`topology.kubernetes.io/zone`): of the Nodes held, and of the
    /// census's. A zone an EndpointSlice names that no Node has is a tenant's string, not a place.
    pub fn zones(&self) -> std::collections::BTreeSet<&str> {
        let held = self.nodes.values().filter_map(|node| node.labels.get(super::objects::LABEL_ZONE));
        let counted = self.census.iter().flat_map(|census| census.zones().iter());
        held.chain(counted.map(String::as_str)).collect()
    }

    /// The census, if the Nodes are known from one.
    pub fn census(&self) -> Option<&Census> {
        self.census.as_ref()
    }

    /// The region of an endpoint in `zone` on a Node not held, from the census.
    pub fn region_of_zone(&self, zone: &str) -> Option<&str> {
        self.census.as_ref().and_then(|census| census.region(zone))
    }

    /// Every Node, in the order of their names.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        let mut nodes: Vec<&Node> = self.nodes.values().collect();
        nodes.sort_unstable_by(|a, b| a.name.cmp(&b.name));
        nodes.into_iter()
    }

    /// A Service by key.
    pub fn service(&self, key: &ObjectKey) -> Option<&Service> {
        self.services.get(key)
    }

    /// Every Service, by key.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values()
    }

    /// The EndpointSlices of a Service, by slice name.
    pub fn slices_of<'a>(&'a self, service: &ObjectKey) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.slices_by_service.get(service).into_iter().flatten().filter_map(|key| self.slices.get(key))
    }

    /// Every EndpointSlice, by key.
    pub fn slices(&self) -> impl Iterator<Item = &EndpointSlice> {
        self.slices.values()
    }

    /// Services with at least one endpoint on `node`: those a change of that Node's labels can
    /// re-route.
    pub fn services_with_endpoints_on(&self, node: &str) -> BTreeSet<ObjectKey> {
        self.slices
            .values()
            .filter(|slice| slice.endpoints.iter().any(|e| e.node_name.as_deref() == Some(node)))
            .filter_map(|slice| slice.service.clone())
            .collect()
    }

    /// The Services a change of Node `name` can re-route, seen from any other node: those with
    /// endpoints on it (their topology comes from its labels) and, when the demand by zone moved
    /// (`demand_before`: [`Self::demand_version`] before the change), every Service whose decision
    /// depends on the demand. (A change of the deciding node itself moves everything.)
    pub fn affected_by_node(&self, name: &str, demand_before: u64) -> BTreeSet<ObjectKey> {
        let mut affected = self.services_with_endpoints_on(name);
        if self.demand_version() != demand_before {
            affected.extend(self.services.values().filter(|s| s.depends_on_demand()).map(|s| s.key.clone()));
        }
        affected
    }

    /// Number of Nodes, Services and EndpointSlices.
    pub fn counts(&self) -> (usize, usize, usize) {
        (self.nodes.len(), self.services.len(), self.slices.len())
    }
}

/// The shared copy of `text` in `interned`.
fn intern(interned: &mut HashSet<Arc<str>, foldhash::fast::RandomState>, text: Arc<str>) -> Arc<str> {
    match interned.get(&text) {
        Some(shared) => Arc::clone(shared),
        None => {
            interned.insert(Arc::clone(&text));
            text
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::{Endpoint, Family};

    fn slice(name: &str, service: &str, node: &str) -> EndpointSlice {
        EndpointSlice {
            key: ObjectKey::new("ns", name),
            service: Some(ObjectKey::new("ns", service)),
            family: Family::V4,
            ports: vec![],
            endpoints: vec![Endpoint {
                address: "10.0.0.1".parse().unwrap(),
                ready: true,
                serving: true,
                terminating: false,
                node_name: Some(node.into()),
                zone: None,
                extra: None,
            }],
            changed_at: None,
        }
    }

    #[test]
    fn slices_are_indexed_by_service_and_moves_report_both_owners() {
        let mut state = ClusterState::default();
        assert_eq!(state.upsert_slice(slice("s1", "web", "a")), vec![ObjectKey::new("ns", "web")]);
        assert!(state.upsert_slice(slice("s1", "web", "a")).is_empty(), "no change, nothing affected");
        assert_eq!(state.slices_of(&ObjectKey::new("ns", "web")).count(), 1);
        let moved = state.upsert_slice(slice("s1", "api", "a"));
        assert_eq!(moved, vec![ObjectKey::new("ns", "web"), ObjectKey::new("ns", "api")]);
        assert_eq!(state.slices_of(&ObjectKey::new("ns", "web")).count(), 0);
        assert_eq!(state.services_with_endpoints_on("a"), BTreeSet::from([ObjectKey::new("ns", "api")]));
        assert_eq!(state.remove_slice(&ObjectKey::new("ns", "s1")), vec![ObjectKey::new("ns", "api")]);
        assert_eq!(state.counts(), (0, 0, 0));
    }
}
