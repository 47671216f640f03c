//! Deciding Services again: the policy's decisions into the plan, what they warn about and the
//! ports they could not claim into the context, and the DNS view kept in step. Borrows what it
//! needs of the controller and nothing of its programmer, so that the full sync can write on
//! another thread while this decides ([`super::full_sync`]).

use std::collections::BTreeSet;

use topology_dns::DnsPublisher;
use topology_model::{ClusterState, Node, ObjectKey};
use topology_policy::{
    desired::ServicePort,
    plan::{self, NodePlan},
};

use super::context::{Context, Topic};

/// The controller's deciding half.
pub(super) struct Decider<'a> {
    pub(super) state: &'a ClusterState,
    pub(super) plan: &'a mut NodePlan,
    pub(super) dns: &'a mut Option<DnsPublisher>,
    pub(super) ctx: &'a mut Context,
    /// Services waiting to be decided again (those waiting for a port another released).
    pub(super) dirty: &'a mut BTreeSet<ObjectKey>,
}

impl Decider<'_> {
    /// Decides one Service again and updates its entries in the plan; returns the changed ports.
    pub(super) fn recompute(&mut self, this: &Node, key: &ObjectKey) -> BTreeSet<ServicePort> {
        self.ctx.metrics.control.services_recomputed.inc();
        let update = self.plan.update(self.state, this, key);
        if let Some(dns) = self.dns.as_mut() {
            let changed = dns.view_mut().update(self.state, self.plan, key);
            dns.touch(changed);
        }
        let warnings: Vec<String> = self
            .plan
            .selections(key)
            .iter()
            .flat_map(|s| s.selection.warnings.iter().map(move |w| format!("port {}: {w}", s.port.port)))
            .collect();
        if warnings.is_empty() {
            self.ctx.resolved(key, &Topic::Policy);
        } else {
            self.ctx.problem(key, Topic::Policy, "IgnoredConfiguration", warnings.join("; "));
        }
        for (port, holder) in &update.conflicts {
            let message = format!("{port} is already programmed for Service {holder}; this Service's port is skipped");
            self.ctx.problem(key, Topic::Conflict(*port), "ClusterIPConflict", message);
        }
        if update.conflicts.is_empty() {
            self.ctx.conflicts_resolved(key);
        }
        self.dirty.extend(update.retry);
        update.changed
    }

    /// Recomputes Services waiting for ports that others released, until none is left.
    pub(super) fn drain_retries(&mut self, this: &Node) -> BTreeSet<ServicePort> {
        let mut changed = BTreeSet::new();
        // Each round only adds Services that were blocked; a port is released once per sync.
        for _ in 0..plan::RETRY_ROUNDS {
            if self.dirty.is_empty() {
                break;
            }
            for key in std::mem::take(self.dirty) {
                changed.extend(self.recompute(this, &key));
            }
        }
        changed
    }
}
