//! Fair shares of the slots array between namespaces. When a set finds no room, the namespaces
//! holding more than an equal share of the slots give up their largest sets, as long as the
//! namespace asking stays within its own share: one tenant filling the array leaves the others
//! their topology, and only its own ports over the share fall back to kube-proxy. Nothing is
//! taken while there is room, so a cluster with one large namespace uses the whole array.

use std::collections::HashMap;

use topology_common::{Slot, map_names};
use topology_policy::desired::ServicePort;

use super::{ApplyReport, Writer};
use crate::{error::DataplaneError, ops::MapOps};

/// What one namespace holds of the slots array: its slots, and its sets (slots, port) smallest
/// first.
#[derive(Default)]
struct Holding {
    slots: u64,
    sets: Vec<(u32, ServicePort)>,
}

/// The namespace of a programmed name (`namespace/service:port`).
pub(super) fn namespace_of(name: &str) -> &str {
    name.split_once('/').map_or(name, |(namespace, _)| namespace)
}

impl<M: MapOps> Writer<M> {
    /// Makes room for `len` slots of a set of `namespace` for `asking` by withdrawing the largest
    /// sets of the namespaces above an equal share, while `namespace` stays within its own; true
    /// if any was withdrawn (their runs wait for a grace period before reuse). The port asking is
    /// never withdrawn, whatever Service held it before.
    pub(super) fn take_back_shares(
        &mut self,
        asking: &ServicePort,
        namespace: &str,
        len: u32,
        report: &mut ApplyReport,
    ) -> bool {
        let capacity = u64::from(self.maps.capacities().slots);
        let mut held: HashMap<&str, Holding> = HashMap::new();
        for (port, service) in self.kernel.services.iter().filter(|(port, _)| *port != asking) {
            let holding = held.entry(namespace_of(&service.name)).or_default();
            holding.slots += u64::from(service.count);
            holding.sets.push((service.count, *port));
        }
        let namespaces = held.len() as u64 + u64::from(!held.contains_key(namespace));
        let share = capacity / namespaces.max(1);
        let asking_for = held.get(namespace).map_or(0, |holding| holding.slots) + u64::from(len);
        if asking_for > share {
            return false;
        }
        let mut victims: Vec<(String, Holding)> = held
            .into_iter()
            .filter(|(other, holding)| *other != namespace && holding.slots > share)
            .map(|(other, mut holding)| {
                holding.sets.sort_unstable();
                (other.to_owned(), holding)
            })
            .collect();
        let mut freed = 0u64;
        while freed < u64::from(len) {
            // The namespace furthest above its share gives up its largest set.
            let Some((victim, holding)) =
                victims.iter_mut().filter(|(_, h)| h.slots > share).max_by_key(|(_, h)| h.slots)
            else {
                break;
            };
            let Some((count, port)) = holding.sets.pop() else { break };
            let holds = holding.slots;
            let kept: Vec<Slot> = self.kernel.services.get(&port).map(|s| s.slots.clone()).unwrap_or_default();
            if self.remove(&port, &kept, report).is_err() {
                continue;
            }
            tracing::warn!(%port, namespace = %victim, holds, share, "a set withdrawn: its namespace is over its share");
            report.withdrawn += 1;
            let error = DataplaneError::OverShare { map: map_names::SLOTS, namespace: victim.clone(), holds, share };
            report.failed.push((port, error));
            holding.slots -= u64::from(count);
            freed += u64::from(count);
        }
        freed > 0
    }
}

#[cfg(test)]
mod tests {
    use super::namespace_of;

    #[test]
    fn the_namespace_is_the_names_first_part() {
        assert_eq!(namespace_of("tenant/hog:http"), "tenant");
        assert_eq!(namespace_of("nameless"), "nameless");
    }
}
