//! Cross-zone bytes as the loop sees them: every [`INTERVAL`] the kernel's counts per Service port
//! and backend are read, and what each gained since the last reading is added to
//! `topology_agent_bytes_total` under the port's name, this node's zone and the backend's zone
//! (`other` for a zone no Node has: the slices that name it are a tenant's to write).
//! Names and zones come from the plan, and are kept once seen: the bytes of a connection that
//! outlived its backend's place in the plan still count under its zone.
//!
//! At most `--metrics-max-ports` Service ports have series of their own; the others are summed
//! under `other`. Which ones is chosen again every [`ROTATE_EVERY`] by the bytes each moved in that
//! time, not kept by arrival: a port that stopped moving bytes gives its place (its series are
//! removed) to the busiest of the others.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

use topology_common::ByteCount;
use topology_dataplane::CountedBytes;
use topology_model::Protocol;
use topology_policy::{desired::ServicePort, plan::NodePlan};

use super::{Controller, Programmer};
use crate::cost::{BytesLabels, ServiceBytes};

/// The service label of ports beyond the series cap.
const OTHER: &str = "other";

/// How often the ports with series of their own are chosen again, by the bytes each moved since.
pub(super) const ROTATE_EVERY: Duration = Duration::from_secs(600);

/// A count's key: Service port (ClusterIP and port), protocol, backend.
type Key = (SocketAddr, u8, SocketAddr);

/// The last reading, and the names and zones seen.
#[derive(Default)]
pub(super) struct Accounting {
    /// Each count as last read.
    last: HashMap<Key, ByteCount>,
    /// The name of each Service port seen in a plan.
    names: HashMap<(SocketAddr, u8), Arc<str>>,
    /// The zone of each backend address seen in a plan.
    zones: HashMap<IpAddr, Option<Arc<str>>>,
    /// Service ports with series of their own, and the (to zone, direction) of each series.
    named: HashMap<Arc<str>, BTreeSet<(String, &'static str)>>,
    /// Bytes each Service port moved since the ports with series were last chosen, and when.
    window: HashMap<Arc<str>, u64>,
    rotated_at: Option<Instant>,
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
    /// Series of ports that lost their place to busier ones: to remove.
    pub retired: Vec<BytesLabels>,
}

impl Accounting {
    /// Starts from what the kernel counted before this agent: a restarted agent counts from
    /// here, so nothing an earlier one reported is reported again (what the kernel counted since
    /// that one's last reading goes unreported).
    pub(super) fn starting_from(counted: Vec<CountedBytes>) -> Self {
        let last = counted.into_iter().map(|c| ((c.service, c.protocol, c.backend), c.bytes)).collect();
        Self { last, ..Self::default() }
    }

    /// Takes a reading: the bytes each label set and Service port gained since the last one. A
    /// count lower than last time is a new entry (the map forgot the old one): all of it is new.
    /// Bytes cross zones when both zones are known and differ.
    pub(super) fn update(
        &mut self,
        counted: Vec<CountedBytes>,
        plan: &NodePlan,
        zones: (&str, &BTreeSet<&str>),
        cap: usize,
    ) -> Gained {
        self.update_at(counted, plan, zones, cap, Instant::now())
    }

    /// [`update`](Self::update) at `now`; the ports with series chosen again if it is time.
    pub(super) fn update_at(
        &mut self,
        counted: Vec<CountedBytes>,
        plan: &NodePlan,
        (from_zone, zones): (&str, &BTreeSet<&str>),
        cap: usize,
        now: Instant,
    ) -> Gained {
        let rotated_at = *self.rotated_at.get_or_insert(now);
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
            let moved = new.to_backend + new.from_backend;
            let name = self.names.get(&(count.service, count.protocol)).cloned();
            if let Some(name) = &name {
                *self.window.entry(Arc::clone(name)).or_default() += moved;
            }
            let service = match name {
                Some(name) if self.named.contains_key(&name) || self.named.len() < cap => {
                    self.named.entry(Arc::clone(&name)).or_default();
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
            let series = self.named.get_mut(service.as_str());
            let directions = [("to_backend", new.to_backend), ("from_backend", new.from_backend)];
            if let Some(series) = series {
                series.extend(directions.iter().filter(|(_, b)| *b > 0).map(|(d, _)| (to_zone.clone(), *d)));
            }
            for (direction, bytes) in directions {
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
        if now.duration_since(rotated_at) >= ROTATE_EVERY {
            gained.retired = self.rotate(from_zone, cap);
            self.rotated_at = Some(now);
        }
        gained
    }

    /// Chooses the ports with series of their own again: the `cap` that moved the most bytes in
    /// the window (a named one first among equals); returns the series of those that lost their
    /// place, and starts a new window.
    fn rotate(&mut self, from_zone: &str, cap: usize) -> Vec<BytesLabels> {
        let window = std::mem::take(&mut self.window);
        let mut ranked: Vec<(&Arc<str>, u64, bool)> =
            window.iter().map(|(name, bytes)| (name, *bytes, self.named.contains_key(name))).collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(b.2.cmp(&a.2)).then(a.0.cmp(b.0)));
        let keep: BTreeSet<Arc<str>> = ranked
            .into_iter()
            .filter(|(_, bytes, _)| *bytes > 0)
            .take(cap)
            .map(|(name, ..)| Arc::clone(name))
            .collect();
        let mut retired = Vec::new();
        self.named.retain(|name, series| {
            if keep.contains(name) {
                return true;
            }
            retired.extend(series.iter().map(|(to_zone, direction)| BytesLabels {
                service: name.to_string(),
                from_zone: from_zone.to_owned(),
                to_zone: to_zone.clone(),
                direction,
            }));
            false
        });
        for name in keep {
            self.named.entry(name).or_default();
        }
        retired
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
    /// Reads the kernel's byte counts and adds what they gained to the metrics; whether they
    /// were read.
    pub(super) fn account(&mut self) -> bool {
        match self.programmer.bytes() {
            Ok(counted) => {
                let (zone, cap) = (self.ctx.node_zone().to_owned(), self.ctx.metrics.max_ports());
                let zones = self.intake.state.zones();
                let gained = self.accounting.update(counted, &self.plan, (&zone, &zones), cap);
                self.ctx.metrics.bytes.retire(&gained.retired);
                self.ctx.metrics.bytes.add(&gained.labels, &gained.services);
                true
            }
            Err(error) => {
                tracing::warn!(%error, "the bytes counted could not be read; retrying");
                false
            }
        }
    }
}

#[cfg(test)]
mod tests;
