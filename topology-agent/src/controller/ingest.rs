//! Ingest: objects from the sources into the cluster state, each change marking the Services it
//! can affect; objects that cannot be used are skipped (their last good version stays) and counted.

use std::{
    collections::{BTreeMap, BTreeSet, HashSet},
    time::{Instant, SystemTime},
};

use topology_kube::{Invalid, Object, ObjectId, SourceEvent};
use topology_model::{ClusterState, Kind, ObjectKey};

use super::context::{Context, Topic};
use crate::metrics::KindLabels;

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

/// The cluster state the sources feed, and what their changes left to decide.
#[derive(Debug, Default)]
pub(super) struct Intake {
    /// The cluster as the sources last told it.
    pub(super) state: ClusterState,
    /// Services a change may have affected, to decide again.
    pub(super) dirty: BTreeSet<ObjectKey>,
    /// Every Service is to be decided again (a snapshot, or this node changed).
    pub(super) everything_dirty: bool,
    /// Kinds whose initial list has ended.
    pub(super) listed: BTreeSet<Kind>,
    /// Lists whose pages are coming in, by kind.
    listing: BTreeMap<Kind, Listing>,
    /// Objects skipped as invalid; their last good version stays in use.
    pub(super) skipped: BTreeMap<ObjectId, Invalid>,
    /// When the oldest event not yet programmed was seen.
    pub(super) oldest_pending: Option<Instant>,
    /// The stamps of the EndpointSlice changes not yet programmed (at most [`CHANGES_KEPT`]).
    pub(super) changes_pending: Vec<SystemTime>,
}

/// Changes whose programming latency is kept while the kernel is not written (a failing apply):
/// beyond these, changes go unmeasured rather than grow memory.
const CHANGES_KEPT: usize = 10_000;

/// What an event reports to, beside the intake.
pub(super) struct Reporting<'a> {
    pub(super) ctx: &'a mut Context,
    /// This node's name.
    pub(super) node: &'a str,
    /// Whether the kernel was programmed yet (before it, changes need no marking: the first
    /// sync decides everything).
    pub(super) programmed: bool,
}

impl Intake {
    /// Whether every kind's initial list has ended.
    pub(super) fn all_listed(&self) -> bool {
        self.listed.len() == Kind::ALL.len()
    }

    /// Takes one event into the cluster state and notes what it may change.
    pub(super) fn receive(&mut self, seen: Instant, event: SourceEvent, to: &mut Reporting<'_>) {
        self.oldest_pending.get_or_insert(seen);
        match event {
            SourceEvent::Listing(kind) => {
                self.listing.insert(kind, Listing::default());
            }
            SourceEvent::ListPage { kind, objects, invalid } => self.take_page(kind, objects, invalid, to),
            SourceEvent::Replace { kind, objects, invalid } => self.replace(kind, objects, invalid, to),
            SourceEvent::Snapshot(state) => {
                self.listing.clear();
                self.state = *state;
                self.everything_dirty = true;
                for kind in Kind::ALL {
                    self.listed.insert(kind);
                }
                to.ctx.health.listed_all();
            }
            SourceEvent::Apply(object) => {
                self.unskip(&object.id(), to.ctx);
                self.upsert(object, to);
            }
            SourceEvent::Delete(id) => {
                self.unskip(&id, to.ctx);
                self.remove(&id, to);
            }
            SourceEvent::Invalid(invalid) => self.skip(invalid, to.ctx),
            SourceEvent::Stale { source, reason, transient: false } => to.ctx.health.set_stale(&source, Some(reason)),
            SourceEvent::Stale { source, reason, transient: true } => to.ctx.health.set_watch_failing(&source, reason),
            SourceEvent::Fresh { source } => to.ctx.health.set_stale(&source, None),
            SourceEvent::Census(census) => {
                // A zone's region moves the locality of its endpoints for every Service.
                if self.state.set_census(census) {
                    self.everything_dirty = true;
                }
            }
        }
    }

    /// Takes in one page of a list in progress: its objects now, which ones are gone at its end.
    fn take_page(&mut self, kind: Kind, objects: Vec<Object>, invalid: Vec<Invalid>, to: &mut Reporting<'_>) {
        let listing = self.listing.entry(kind).or_default();
        listing.listed.extend(objects.iter().map(Object::id));
        listing.keep.extend(invalid.iter().map(|i| i.id.clone()));
        for object in objects {
            self.upsert(object, to);
        }
        for bad in invalid {
            self.skip(bad, to.ctx);
        }
    }

    /// Ends a list (the whole of it, or its last page): what neither it nor its pages listed is
    /// gone, and objects skipped before and not invalid in it are skipped no more.
    fn replace(&mut self, kind: Kind, objects: Vec<Object>, invalid: Vec<Invalid>, to: &mut Reporting<'_>) {
        self.take_page(kind, objects, invalid, to);
        let Listing { listed, keep } = self.listing.remove(&kind).unwrap_or_default();
        let present: Vec<ObjectId> = match kind {
            Kind::Node => self.state.nodes().map(|n| ObjectId::Node(n.name.clone())).collect(),
            Kind::Service => self.state.services().map(|s| ObjectId::Service(s.key.clone())).collect(),
            Kind::EndpointSlice => self.state.slices().map(|s| ObjectId::EndpointSlice(s.key.clone())).collect(),
        };
        for id in present {
            if !listed.contains(&id) && !keep.contains(&id) {
                self.remove(&id, to);
            }
        }
        let stale_skips: Vec<ObjectId> =
            self.skipped.keys().filter(|id| id.kind() == kind && !keep.contains(id)).cloned().collect();
        for id in stale_skips {
            self.unskip(&id, to.ctx);
        }
        self.listed.insert(kind);
        to.ctx.health.listed(kind);
    }

    fn upsert(&mut self, object: Object, to: &Reporting<'_>) {
        match object {
            Object::Node(node) => {
                let name = node.name.clone();
                let demand = self.state.demand_version();
                if self.state.upsert_node(node) {
                    self.node_changed(&name, demand, to);
                }
            }
            Object::Service(service) => {
                let key = service.key.clone();
                if self.state.upsert_service(service) {
                    self.dirty.insert(key);
                }
            }
            Object::EndpointSlice(slice) => {
                let changed_at = slice.changed_at;
                let affected = self.state.upsert_slice(slice);
                // Measured from the first sync on, as kube-proxy does.
                if let Some(at) = changed_at
                    && to.programmed
                    && !affected.is_empty()
                    && self.changes_pending.len() < CHANGES_KEPT
                {
                    self.changes_pending.push(at);
                }
                self.dirty.extend(affected);
            }
        }
    }

    fn remove(&mut self, id: &ObjectId, to: &Reporting<'_>) {
        match id {
            ObjectId::Node(name) => {
                let demand = self.state.demand_version();
                if self.state.remove_node(name).is_some() {
                    self.node_changed(name, demand, to);
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
    fn node_changed(&mut self, name: &str, demand_before: u64, to: &Reporting<'_>) {
        if name == to.node {
            self.everything_dirty = true;
        }
        if self.everything_dirty || !to.programmed {
            return;
        }
        let affected = self.state.affected_by_node(name, demand_before);
        self.dirty.extend(affected);
    }

    fn skip(&mut self, invalid: Invalid, ctx: &mut Context) {
        tracing::warn!(object = %invalid.id, error = %invalid.error, "object skipped; its last good version stays in use");
        let kind = KindLabels { kind: invalid.id.kind().to_string() };
        ctx.metrics.control.skipped_total.get_or_create(&kind).inc();
        if let Some(service) = &invalid.service {
            let message = format!("{}: {}; its last good version stays in use", invalid.id, invalid.error);
            ctx.problem(service, Topic::Object(invalid.id.clone()), "InvalidObject", message);
        }
        self.skipped.insert(invalid.id.clone(), invalid);
        self.count_skipped(ctx);
    }

    fn unskip(&mut self, id: &ObjectId, ctx: &mut Context) {
        if let Some(invalid) = self.skipped.remove(id) {
            if let Some(service) = invalid.service {
                ctx.resolved(&service, &Topic::Object(id.clone()));
            }
            self.count_skipped(ctx);
        }
    }

    fn count_skipped(&self, ctx: &Context) {
        for kind in Kind::ALL {
            let count = self.skipped.keys().filter(|id| id.kind() == kind).count();
            ctx.metrics.control.skipped.get_or_create(&KindLabels { kind: kind.to_string() }).set(count as i64);
        }
    }
}
