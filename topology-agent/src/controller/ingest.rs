//! Ingest: objects from the sources into the cluster state, each change marking the Services it
//! can affect; objects that cannot be used are skipped (their last good version stays) and counted.

use std::{collections::HashSet, time::Instant};

use super::{Controller, Programmer, context::Topic};
use crate::{
    cluster::Kind,
    metrics::KindLabels,
    source::{Invalid, Object, ObjectId, SourceEvent},
};

/// Identities hashed with foldhash, not SipHash: a list inserts every one, and SipHash was a
/// tenth of taking a page in.
type Ids = HashSet<ObjectId, foldhash::fast::RandomState>;

/// What the pages of a list in progress listed so far.
#[derive(Debug, Default)]
pub(super) struct Listing {
    /// Objects listed.
    listed: Ids,
    /// Objects listed but invalid: they keep their last good version.
    keep: Ids,
}

impl<P: Programmer> Controller<P> {
    /// Takes one event into the cluster state and notes what it may change.
    pub fn receive(&mut self, seen: Instant, event: SourceEvent) {
        self.oldest_pending.get_or_insert(seen);
        match event {
            SourceEvent::Listing(kind) => {
                self.listing.insert(kind, Listing::default());
            }
            SourceEvent::ListPage { kind, objects, invalid } => self.take_page(kind, objects, invalid),
            SourceEvent::Replace { kind, objects, invalid } => self.replace(kind, objects, invalid),
            SourceEvent::Snapshot(state) => {
                self.listing.clear();
                self.state = *state;
                self.everything_dirty = true;
                for kind in Kind::ALL {
                    self.listed.insert(kind);
                }
                self.ctx.health.listed_all();
            }
            SourceEvent::Apply(object) => {
                self.unskip(&object.id());
                self.upsert(object);
            }
            SourceEvent::Delete(id) => {
                self.unskip(&id);
                self.remove(&id);
            }
            SourceEvent::Invalid(invalid) => self.skip(invalid),
            SourceEvent::Stale { source, reason, transient: false } => self.ctx.health.set_stale(&source, Some(reason)),
            SourceEvent::Stale { source, reason, transient: true } => {
                self.ctx.health.set_watch_failing(&source, reason)
            }
            SourceEvent::Fresh { source } => self.ctx.health.set_stale(&source, None),
        }
    }

    /// Takes in one page of a list in progress: its objects now, which ones are gone at its end.
    fn take_page(&mut self, kind: Kind, objects: Vec<Object>, invalid: Vec<Invalid>) {
        let listing = self.listing.entry(kind).or_default();
        listing.listed.extend(objects.iter().map(Object::id));
        listing.keep.extend(invalid.iter().map(|i| i.id.clone()));
        for object in objects {
            self.upsert(object);
        }
        for bad in invalid {
            self.skip(bad);
        }
    }

    /// Ends a list (the whole of it, or its last page): what neither it nor its pages listed is
    /// gone, and objects skipped before and not invalid in it are skipped no more.
    fn replace(&mut self, kind: Kind, objects: Vec<Object>, invalid: Vec<Invalid>) {
        self.take_page(kind, objects, invalid);
        let Listing { listed, keep } = self.listing.remove(&kind).unwrap_or_default();
        let present: Vec<ObjectId> = match kind {
            Kind::Node => self.state.nodes().map(|n| ObjectId::Node(n.name.clone())).collect(),
            Kind::Service => self.state.services().map(|s| ObjectId::Service(s.key.clone())).collect(),
            Kind::EndpointSlice => self.state.slices().map(|s| ObjectId::EndpointSlice(s.key.clone())).collect(),
        };
        for id in present {
            if !listed.contains(&id) && !keep.contains(&id) {
                self.remove(&id);
            }
        }
        let stale_skips: Vec<ObjectId> =
            self.skipped.keys().filter(|id| id.kind() == kind && !keep.contains(id)).cloned().collect();
        for id in stale_skips {
            self.unskip(&id);
        }
        self.listed.insert(kind);
        self.ctx.health.listed(kind);
    }

    fn upsert(&mut self, object: Object) {
        match object {
            Object::Node(node) => {
                let name = node.name.clone();
                let demand = self.state.demand_version();
                if self.state.upsert_node(node) {
                    self.node_changed(&name, demand);
                }
            }
            Object::Service(service) => {
                let key = service.key.clone();
                if self.state.upsert_service(service) {
                    self.dirty.insert(key);
                }
            }
            Object::EndpointSlice(slice) => {
                let affected = self.state.upsert_slice(slice);
                self.dirty.extend(affected);
            }
        }
    }

    fn remove(&mut self, id: &ObjectId) {
        match id {
            ObjectId::Node(name) => {
                let demand = self.state.demand_version();
                if self.state.remove_node(name).is_some() {
                    self.node_changed(name, demand);
                }
            }
            ObjectId::Service(key) => {
                if self.state.remove_service(key) {
                    self.dirty.insert(key.clone());
                }
            }
            ObjectId::EndpointSlice(key) => {
                let affected = self.state.remove_slice(key);
                self.dirty.extend(affected);
            }
        }
    }

    /// A Node changed: this node re-decides everything; another node, what the cluster state says
    /// it affects (`demand_before`: the demand version before the change).
    fn node_changed(&mut self, name: &str, demand_before: u64) {
        if name == self.config.node {
            self.everything_dirty = true;
        }
        if self.everything_dirty || !self.programmed {
            return;
        }
        let affected = self.state.affected_by_node(name, demand_before);
        self.dirty.extend(affected);
    }

    fn skip(&mut self, invalid: Invalid) {
        tracing::warn!(object = %invalid.id, error = %invalid.error, "object skipped; its last good version stays in use");
        let kind = KindLabels { kind: invalid.id.kind().to_string() };
        self.ctx.metrics.skipped_total.get_or_create(&kind).inc();
        if let Some(service) = &invalid.service {
            let message = format!("{}: {}; its last good version stays in use", invalid.id, invalid.error);
            self.ctx.problem(service, Topic::Object(invalid.id.clone()), "InvalidObject", message);
        }
        self.skipped.insert(invalid.id.clone(), invalid);
        self.count_skipped();
    }

    fn unskip(&mut self, id: &ObjectId) {
        if let Some(invalid) = self.skipped.remove(id) {
            if let Some(service) = invalid.service {
                self.ctx.resolved(&service, &Topic::Object(id.clone()));
            }
            self.count_skipped();
        }
    }

    fn count_skipped(&self) {
        for kind in Kind::ALL {
            let count = self.skipped.keys().filter(|id| id.kind() == kind).count();
            self.ctx.metrics.skipped.get_or_create(&KindLabels { kind: kind.to_string() }).set(count as i64);
        }
    }
}
