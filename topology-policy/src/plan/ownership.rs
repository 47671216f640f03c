//! Which Service owns each service port of the plan: the desired state kept per Service, so that a
//! change to one Service rewrites only its entries, and two Services claiming the same ClusterIP,
//! port and protocol are caught instead of fighting (the first keeps it until it lets go).

use std::collections::{BTreeMap, BTreeSet, HashMap, btree_map};

use topology_model::ObjectKey;

use crate::desired::{DesiredService, DesiredState, ServicePort};

/// What one [`Ownership::set`] changed.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct OwnershipUpdate {
    /// Service ports whose desired entry changed (added, replaced or removed).
    pub changed: BTreeSet<ServicePort>,
    /// Service ports the Service wanted but another Service already holds: (port, holder).
    pub conflicts: Vec<(ServicePort, ObjectKey)>,
    /// Services that wanted a port this update released; they should be recomputed.
    pub retry: BTreeSet<ObjectKey>,
}

/// The desired state, indexed by owning Service.
#[derive(Debug, Default)]
pub struct Ownership {
    desired: DesiredState,
    /// Hashed: found for every Service decided, in no order (a tree's search compared names).
    by_service: HashMap<ObjectKey, Vec<ServicePort>, foldhash::fast::RandomState>,
    owner: BTreeMap<ServicePort, ObjectKey>,
    waiting: BTreeMap<ServicePort, BTreeSet<ObjectKey>>,
}

impl Ownership {
    /// Replaces `service`'s entries with `entries` (empty: the Service is gone or has no ports).
    pub fn set(&mut self, service: &ObjectKey, entries: BTreeMap<ServicePort, DesiredService>) -> OwnershipUpdate {
        let mut update = OwnershipUpdate::default();
        for port in self.by_service.remove(service).unwrap_or_default() {
            if !entries.contains_key(&port) {
                self.desired.services.remove(&port);
                self.owner.remove(&port);
                update.changed.insert(port);
                update.retry.extend(self.waiting.remove(&port).unwrap_or_default());
            }
        }
        if !self.waiting.is_empty() {
            for waiters in self.waiting.values_mut() {
                waiters.remove(service);
            }
            self.waiting.retain(|_, waiters| !waiters.is_empty());
        }
        let mut mine = Vec::with_capacity(entries.len());
        for (port, entry) in entries {
            // One search of each tree per port: a full sync sets every port once.
            match self.owner.entry(port) {
                btree_map::Entry::Occupied(holder) if holder.get() != service => {
                    update.conflicts.push((port, holder.get().clone()));
                    self.waiting.entry(port).or_default().insert(service.clone());
                    continue;
                }
                btree_map::Entry::Occupied(_) => {}
                btree_map::Entry::Vacant(free) => {
                    free.insert(service.clone());
                }
            }
            match self.desired.services.entry(port) {
                btree_map::Entry::Occupied(mut held) if *held.get() != entry => {
                    held.insert(entry);
                    update.changed.insert(port);
                }
                btree_map::Entry::Occupied(_) => {}
                btree_map::Entry::Vacant(free) => {
                    free.insert(entry);
                    update.changed.insert(port);
                }
            }
            mine.push(port);
        }
        if !mine.is_empty() {
            self.by_service.insert(service.clone(), mine);
        }
        update
    }

    /// Services with entries, in no order.
    pub fn services(&self) -> impl Iterator<Item = &ObjectKey> {
        self.by_service.keys()
    }

    /// The Service holding a port.
    pub fn owner(&self, port: &ServicePort) -> Option<&ObjectKey> {
        self.owner.get(port)
    }

    /// The whole desired state.
    pub fn desired(&self) -> &DesiredState {
        &self.desired
    }
}

#[cfg(test)]
mod tests {
    use topology_model::Protocol;

    use super::*;

    fn port(last: u8) -> ServicePort {
        ServicePort { vip: std::net::IpAddr::from([10, 96, 0, last]), port: 80, protocol: Protocol::Tcp }
    }

    fn entry(name: &str) -> DesiredService {
        DesiredService { name: name.into(), ..DesiredService::default() }
    }

    #[test]
    fn only_what_changed_is_reported() {
        let mut ownership = Ownership::default();
        let web = ObjectKey::new("ns", "web");
        let first = ownership.set(&web, BTreeMap::from([(port(1), entry("a")), (port(2), entry("b"))]));
        assert_eq!(first.changed, BTreeSet::from([port(1), port(2)]));
        let same = ownership.set(&web, BTreeMap::from([(port(1), entry("a")), (port(2), entry("b"))]));
        assert!(same.changed.is_empty());
        let shrink = ownership.set(&web, BTreeMap::from([(port(1), entry("a2"))]));
        assert_eq!(shrink.changed, BTreeSet::from([port(1), port(2)]));
        assert_eq!(ownership.desired().services.len(), 1);
        let gone = ownership.set(&web, BTreeMap::new());
        assert_eq!(gone.changed, BTreeSet::from([port(1)]));
        assert!(ownership.desired().services.is_empty());
        assert_eq!(ownership.services().count(), 0);
    }

    #[test]
    fn a_claimed_port_is_a_conflict_until_its_holder_releases_it() {
        let mut ownership = Ownership::default();
        let (web, copy) = (ObjectKey::new("ns", "web"), ObjectKey::new("ns", "copy"));
        ownership.set(&web, BTreeMap::from([(port(1), entry("web"))]));
        let clash = ownership.set(&copy, BTreeMap::from([(port(1), entry("copy"))]));
        assert_eq!(clash.conflicts, vec![(port(1), web.clone())]);
        assert!(clash.changed.is_empty());
        assert_eq!(ownership.desired().services[&port(1)].name, "web");
        let released = ownership.set(&web, BTreeMap::new());
        assert_eq!(released.retry, BTreeSet::from([copy.clone()]));
        let retried = ownership.set(&copy, BTreeMap::from([(port(1), entry("copy"))]));
        assert!(retried.conflicts.is_empty());
        assert_eq!(ownership.owner(&port(1)), Some(&copy));
    }
}
