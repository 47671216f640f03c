//! Cross-zone bytes as the loop sees them: every [`INTERVAL`] the kernel's counts per Service port
//! and backend are read, and what each gained since the last reading is added to
//! `topology_agent_bytes_total` under the port's name, this node's zone and the backend's zone
//! (`other` for a zone no Node has: the slices that name it are a tenant's to write).
//! Names and zones come from the plan, and are kept once seen: the bytes of a connection that
//! outlived its backend's place in the plan still count under its zone.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use topology_common::ByteCount;

use super::{Controller, Programmer};
use crate::{
    cost::ServiceBytes,
    dataplane::CountedBytes,
    desired::{Protocol, ServicePort},
    metrics::BytesLabels,
    plan::NodePlan,
};

/// How often the counts are read: as often as the open connections are swept.
pub(super) const INTERVAL: Duration = crate::sockets::sweep::INTERVAL;

/// The service label of ports beyond the series cap.
const OTHER: &str = "other";

/// A count's key: Service port (ClusterIP and port), protocol, backend.
type Key = (SocketAddr, u8, SocketAddr);

/// The last reading, and the names and zones seen.
#[derive(Default)]
pub(super) struct Accounting {
    read_at: Option<Instant>,
    /// Each count as last read.
    last: HashMap<Key, ByteCount>,
    /// The name of each Service port seen in a plan.
    names: HashMap<(SocketAddr, u8), Arc<str>>,
    /// The zone of each backend address seen in a plan.
    zones: HashMap<IpAddr, Option<Arc<str>>>,
    /// Service ports with series of their own, in the order they first moved bytes.
    named: BTreeSet<Arc<str>>,
    /// The share of each Service port's bytes the default policy keeps in this node's zone, as
    /// last planned.
    baselines: HashMap<(SocketAddr, u8), f64>,
}

/// What a reading gained.
#[derive(Debug, Default, PartialEq)]
pub(super) struct Gained {
    /// Per label set of `topology_agent_bytes_total`.
    pub labels: BTreeMap<BytesLabels, u64>,
    /// Per Service port (label), both directions: in zone, across, and what the default policy
    /// would have sent across.
    pub services: BTreeMap<String, ServiceBytes>,
}

impl Accounting {
    /// Starts from what the kernel counted before this agent: a restarted agent counts from
    /// here, so nothing an earlier one reported is reported again (what the kernel counted since
    /// that one's last reading goes unreported).
    pub(super) fn starting_from(counted: Vec<CountedBytes>) -> Self {
        let last = counted.into_iter().map(|c| ((c.service, c.protocol, c.backend), c.bytes)).collect();
        Self { last, ..Self::default() }
    }

    /// Whether a reading is due.
    pub(super) fn due(&self) -> bool {
        self.read_at.is_none_or(|at| at.elapsed() >= INTERVAL)
    }

    /// Takes a reading: the bytes each label set and Service port gained since the last one. A
    /// count lower than last time is a new entry (the map forgot the old one): all of it is new.
    /// Bytes cross zones when both zones are known and differ.
    pub(super) fn update(
        &mut self,
        counted: Vec<CountedBytes>,
        plan: &NodePlan,
        (from_zone, zones): (&str, &BTreeSet<&str>),
        cap: usize,
    ) -> Gained {
        self.read_at = Some(Instant::now());
        let missing = counted
            .iter()
            .any(|c| !self.names.contains_key(&(c.service, c.protocol)) || !self.zones.contains_key(&c.backend.ip()));
        if missing {
            self.learn(plan);
        }
        let mut gained = Gained::default();
        let mut last = HashMap::with_capacity(counted.len());
        for count in counted {
            let key = (count.service, count.protocol, count.backend);
            let new = match self.last.get(&key) {
                Some(before)
                    if count.bytes.to_backend >= before.to_backend
                        && count.bytes.from_backend >= before.from_backend =>
                {
                    count.bytes.since(before)
                }
                _ => count.bytes,
            };
            last.insert(key, count.bytes);
            if new == ByteCount::default() {
                continue;
            }
            let service = match self.names.get(&(count.service, count.protocol)) {
                Some(name) if self.named.contains(name) || self.named.len() < cap => {
                    self.named.insert(Arc::clone(name));
                    name.to_string()
                }
                Some(_) => OTHER.to_owned(),
                // Never in a plan this agent saw (programmed by an earlier one): by address.
                None => {
                    let protocol =
                        Protocol::from_number(count.protocol).map_or_else(|| "?".to_owned(), |p| p.to_string());
                    format!("{}/{protocol}", count.service)
                }
            };
            let to_zone = self.zones.get(&count.backend.ip()).and_then(Option::as_deref).unwrap_or_default();
            let moved = new.to_backend + new.from_backend;
            let crossed = !from_zone.is_empty() && !to_zone.is_empty() && from_zone != to_zone;
            // An endpoint's zone is its EndpointSlice's word, which a tenant writes: one no Node
            // has is no place, and each would be a series of its own.
            let to_zone = if to_zone.is_empty() || zones.contains(to_zone) { to_zone } else { OTHER }.to_owned();
            let port_key = (count.service, count.protocol);
            if let Some(protocol) = Protocol::from_number(count.protocol) {
                let port = ServicePort { vip: count.service.ip(), port: count.service.port(), protocol };
                if let Some(baseline) = plan.entry(&port).and(plan.baseline_in_zone(&port)) {
                    self.baselines.insert(port_key, baseline);
                }
            }
            let baseline_cross = match self.baselines.get(&port_key) {
                Some(in_zone) => moved as f64 * (1.0 - in_zone),
                // Never planned with a known zone: what crossed is all that can be said.
                None if crossed => moved as f64,
                None => 0.0,
            };
            let totals = gained.services.entry(service.clone()).or_default();
            *(if crossed { &mut totals.cross_zone } else { &mut totals.in_zone }) += moved;
            totals.baseline_cross_zone += baseline_cross;
            for (direction, bytes) in [("to_backend", new.to_backend), ("from_backend", new.from_backend)] {
                let labels = BytesLabels {
                    service: service.clone(),
                    from_zone: from_zone.to_owned(),
                    to_zone: to_zone.clone(),
                    direction,
                };
                *gained.labels.entry(labels).or_default() += bytes;
            }
        }
        self.last = last;
        gained.labels.retain(|_, bytes| *bytes > 0);
        gained
    }

    /// Learns the names of the plan's ports and the zones of its backends.
    fn learn(&mut self, plan: &NodePlan) {
        for (port, service) in &plan.desired().services {
            let key = (SocketAddr::new(port.vip, port.port), port.protocol.number());
            if self.names.get(&key).is_none_or(|name| **name != *service.name) {
                self.names.insert(key, service.name.as_str().into());
            }
        }
        for (_, selections) in plan.all_selections() {
            for selection in selections {
                for choice in &selection.selection.backends {
                    self.zones.insert(choice.address, choice.zone.as_deref().map(Arc::from));
                }
            }
        }
    }
}

impl<P: Programmer> Controller<P> {
    /// Reads the kernel's byte counts and adds what they gained to the metrics.
    pub(super) fn account(&mut self) {
        match self.programmer.bytes() {
            Ok(counted) => {
                let (zone, cap) = (self.ctx.node_zone().to_owned(), self.ctx.metrics.max_ports());
                let zones = self.intake.state.zones();
                let gained = self.accounting.update(counted, &self.plan, (&zone, &zones), cap);
                self.ctx.metrics.add_bytes(&gained.labels, &gained.services);
            }
            Err(error) => tracing::warn!(%error, "the bytes counted could not be read; retrying"),
        }
    }
}

#[cfg(test)]
mod tests;
