//! Joins a Service port to its endpoints: slices by the `kubernetes.io/service-name` label, ports
//! by name and protocol, one IP family at a time, each endpoint once, with its topology resolved
//! from its Node.

use std::{net::IpAddr, sync::Arc};

use topology_model::{
    ClusterState, Endpoint, EndpointSlice, Family, Node, PortSpec, Service,
    objects::{LABEL_REGION, LABEL_ZONE},
};

/// An endpoint of one Service port, as the policy weighs it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate<'a> {
    /// Address.
    pub address: IpAddr,
    /// Target port (from the slice that listed it).
    pub port: u16,
    /// Ready condition.
    pub ready: bool,
    /// Serving condition.
    pub serving: bool,
    /// Terminating condition.
    pub terminating: bool,
    /// `nodeName`, the cluster state's shared copy (a decision keeps it without a copy of its own).
    pub node_name: Option<&'a Arc<str>>,
    /// The endpoint's Node, when the cluster state has it.
    pub node: Option<&'a Node>,
    /// Zone: the Node's zone label, else the endpoint's `zone` field; shared like `node_name`.
    pub zone: Option<&'a Arc<str>>,
    /// Region: the Node's region label, else (the Node not held) the census's region of `zone`.
    pub region: Option<&'a str>,
    /// `hints.forZones`.
    pub hint_zones: &'a [String],
    /// `hints.forNodes`.
    pub hint_nodes: &'a [String],
}

impl Candidate<'_> {
    /// Usable while other endpoints are ready.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Usable only when no endpoint is ready (KEP-1669).
    pub fn is_serving_terminating(&self) -> bool {
        !self.ready && self.serving && self.terminating
    }

    /// The endpoint's value for a topology key: its Node's label, falling back to the endpoint's
    /// own `zone` for the zone key, to `nodeName` for `kubernetes.io/hostname` and to the
    /// census's region of its zone for the region key.
    pub fn topology_value(&self, key: &str) -> Option<&str> {
        if let Some(value) = self.node.and_then(|node| node.labels.get(key)) {
            return Some(value);
        }
        match key {
            LABEL_ZONE => self.zone(),
            topology_model::objects::LABEL_HOSTNAME => self.node_name(),
            LABEL_REGION => self.region,
            _ => None,
        }
    }

    /// `nodeName`.
    pub fn node_name(&self) -> Option<&str> {
        self.node_name.map(|name| &**name)
    }

    /// The zone.
    pub fn zone(&self) -> Option<&str> {
        self.zone.map(|zone| &**zone)
    }

    /// The endpoint's region.
    pub fn region(&self) -> Option<&str> {
        self.region
    }

    fn rank(&self) -> u8 {
        if self.is_ready() {
            2
        } else if self.is_serving_terminating() {
            1
        } else {
            0
        }
    }

    /// Between two listings of the same endpoint: the more usable one, and among equally usable
    /// ones a fixed order of their topology fields, so the result never depends on listing order.
    fn preferred_over(&self, other: &Self) -> bool {
        let (a, b) = (self, other);
        (std::cmp::Reverse(a.rank()), a.node_name(), a.zone(), a.hint_zones, a.hint_nodes)
            < (std::cmp::Reverse(b.rank()), b.node_name(), b.zone(), b.hint_zones, b.hint_nodes)
    }
}

/// What the join found for one Service port and family.
#[derive(Debug)]
pub struct Joined<'a> {
    /// Every distinct endpoint, sorted by address and port.
    pub candidates: Vec<Candidate<'a>>,
    /// Set when slices of this family exist but none has a port of this name and protocol.
    pub unmatched_port: Option<String>,
}

/// The endpoints of `port` in `family`. An endpoint listed by several slices appears once, with
/// the most usable conditions any of them reports.
pub fn candidates<'a>(state: &'a ClusterState, service: &Service, port: &PortSpec, family: Family) -> Joined<'a> {
    // Found once: each is a search of the whole state's slices.
    let slices: Vec<&EndpointSlice> = state.slices_of(&service.key).filter(|slice| slice.family == family).collect();
    let mut found = Vec::with_capacity(slices.iter().map(|slice| slice.endpoints.len()).sum());
    let mut family_slices = 0;
    let mut other_names = Vec::new();
    for slice in slices {
        family_slices += 1;
        let Some(slice_port) = slice.ports.iter().find(|p| p.name == port.name && p.protocol == port.protocol) else {
            other_names.extend(slice.ports.iter().map(|p| format!("{:?}", p.name)));
            continue;
        };
        found.extend(slice.endpoints.iter().map(|endpoint| candidate(state, endpoint, slice_port.port)));
    }
    distinct(&mut found);
    let unmatched_port = (found.is_empty() && family_slices > 0 && !other_names.is_empty()).then(|| {
        other_names.sort();
        other_names.dedup();
        format!(
            "no EndpointSlice port named {:?} with protocol {} (slices have {})",
            port.name,
            port.protocol,
            other_names.join(", ")
        )
    });
    Joined { candidates: found, unmatched_port }
}

/// Every distinct endpoint of a headless Service in `family`, whatever ports its slices list, with
/// port 0: the addresses a DNS answer for the Service's name may hold.
pub fn addresses<'a>(state: &'a ClusterState, service: &Service, family: Family) -> Vec<Candidate<'a>> {
    let mut found: Vec<Candidate<'a>> = state
        .slices_of(&service.key)
        .filter(|slice| slice.family == family)
        .flat_map(|slice| slice.endpoints.iter().map(|endpoint| candidate(state, endpoint, 0)))
        .collect();
    distinct(&mut found);
    found
}

/// `endpoint` as the policy weighs it, at target `port`, its topology resolved from its Node.
fn candidate<'a>(state: &'a ClusterState, endpoint: &'a Endpoint, port: u16) -> Candidate<'a> {
    let node = endpoint.node_name.as_deref().and_then(|name| state.node(name));
    // A Node's label values are the state's shared copies (as `Node::zone` reads them).
    let zone = match node.and_then(|node| node.labels.zone()).filter(|zone| !zone.is_empty()) {
        Some(zone) => Some(zone),
        None => endpoint.zone.as_ref(),
    };
    let region = match node {
        Some(node) => node.region(),
        None => zone.and_then(|zone| state.region_of_zone(zone)),
    };
    Candidate {
        address: endpoint.address,
        port,
        ready: endpoint.ready,
        serving: endpoint.serving,
        terminating: endpoint.terminating,
        node_name: endpoint.node_name.as_ref(),
        node,
        zone,
        region,
        hint_zones: endpoint.hint_zones(),
        hint_nodes: endpoint.hint_nodes(),
    }
}

/// Sorts `candidates` by address and port and keeps one of each: the most usable listing.
fn distinct(candidates: &mut Vec<Candidate<'_>>) {
    // Stable: of two equally usable listings, the first listed stays.
    candidates.sort_by_key(|candidate| (candidate.address, candidate.port));
    candidates.dedup_by(|later, kept| {
        let same = (later.address, later.port) == (kept.address, kept.port);
        if same && later.preferred_over(kept) {
            std::mem::swap(later, kept);
        }
        same
    });
}
