//! Real-time feedback (`topology-agent.io/spillover: feedback`): the static plan (capacity
//! spillover) moved between zones by the load this node measures in the kernel, with no API write
//! and no state shared between agents.
//!
//! The data flows one way, as everywhere else: the load signal's counters ([`crate::dataplane`]) →
//! windows per backend ([`signal`]) → one controller per Service port ([`control`]) → a
//! [`PortInput`] per port → the pure policy, which reweights the static plan with it
//! ([`crate::policy::feedback`]) → the plan → the kernel. `explain` prints the input beside the
//! weights it produced.
//!
//! The signal is the mean lifetime of the connections that ended in the last interval, against
//! the lowest such lifetime seen for the port (its unloaded latency): for request-per-connection
//! traffic a connection lives as long as its request waits and is served, so a backend that queues
//! shows it in every client's connections. Every node reads the same latency from the same
//! backends, and each moves a share of its own traffic, so the shares the nodes move add up to
//! the same share of the zone's traffic whatever their number.

pub mod control;
pub mod measured;
pub mod signal;
pub mod spill;

use std::{collections::BTreeMap, net::SocketAddr};

use serde::Serialize;
use topology_model::{Family, ObjectKey};

/// The constants of the controller. The defaults are what the simulator's surge scenarios settle
/// fastest with, without oscillating (see `docs/policy.md`, Real-time feedback).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tuning {
    /// How often the controller looks, milliseconds; also the least time between two changes of
    /// one port's set.
    pub interval_ms: u64,
    /// Below this latency ratio (to the unloaded latency) the zone has room: move traffic back.
    pub band_low: f64,
    /// Above this ratio the zone is overloaded: move traffic out ...
    pub band_high: f64,
    /// ... if its connections also live at least this much longer than unloaded, microseconds. A
    /// smaller rise is noise at sub-millisecond latencies (a new pod's first requests, a busy
    /// node), and less than a round trip to another zone adds: moving out would not help.
    pub min_excess_us: f64,
    /// The most of the traffic one interval moves out.
    pub step_out: f64,
    /// The share of the traffic one interval moves back.
    pub step_back: f64,
    /// The most of this node's traffic ever moved out of its zone.
    pub max_shift: f64,
    /// Smaller moves are not made (except back to none): a set changes only for a real move.
    pub min_move: f64,
    /// The share of the zone's measured capacity the shift aims to use.
    pub headroom: f64,
    /// While the zone is saturated, the shift also drains this node's backlog there (its
    /// connections in flight beyond what the capacity serves at once) within this long,
    /// milliseconds.
    pub drain_ms: u64,
    /// How long a capacity measured while the zone was saturated is remembered, milliseconds.
    pub capacity_memory_ms: u64,
    /// Ports with fewer usable endpoints are left to the static plan.
    pub min_endpoints: usize,
    /// Connections that must end in an interval for its latency to count.
    pub min_samples: u64,
    /// Per interval, the unloaded latency drifts up by this factor, so that a service whose own
    /// latency rises for good is not read as overloaded forever.
    pub baseline_drift: f64,
    /// A backend failing at least this many handshakes or connections in an interval ...
    pub eject_failures: u64,
    /// ... and at least this share of its attempts is ejected.
    pub eject_ratio: f64,
    /// First ejection, milliseconds; doubled for each ejection in a row, up to `eject_max_ms`.
    pub eject_base_ms: u64,
    /// Longest ejection, milliseconds.
    pub eject_max_ms: u64,
    /// When more than this share of a port's endpoints fail, every endpoint is used (panic).
    pub panic_ratio: f64,
    /// Overload answered per connection ([`spill`]): the least number of connections in flight
    /// from this node to one backend at which the connect hook compares it with a second one;
    /// 0: never.
    pub spill_min: u32,
    /// ... and the limit's multiple of the most in flight to one of this zone's backends while
    /// the zone was calm (its usual load: a pool of long-lived connections is not an overload).
    pub spill_factor: f64,
}

impl Default for Tuning {
    fn default() -> Self {
        Self {
            interval_ms: 1000,
            band_low: 1.3,
            band_high: 2.0,
            min_excess_us: 1000.0,
            step_out: 0.5,
            step_back: 0.1,
            max_shift: 0.9,
            min_move: 0.05,
            headroom: 0.9,
            capacity_memory_ms: 60_000,
            drain_ms: 3000,
            min_endpoints: 2,
            min_samples: 5,
            baseline_drift: 1.01,
            eject_failures: 3,
            eject_ratio: 0.5,
            eject_base_ms: 5000,
            eject_max_ms: 60_000,
            panic_ratio: 0.5,
            spill_min: 4,
            spill_factor: 2.0,
        }
    }
}

impl Tuning {
    /// Whether connections living `us` against an unloaded `baseline_us` are over the band.
    pub fn overloaded(&self, us: f64, baseline_us: f64) -> bool {
        us / baseline_us > self.band_high && us - baseline_us >= self.min_excess_us
    }
}

/// A Service port of one family under feedback.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    /// The Service.
    pub service: ObjectKey,
    /// The port's number.
    pub port: u16,
    /// The family.
    pub family: Family,
}

/// What the controller tells the policy about one port: how much of the static plan's in-zone
/// traffic to move out, which backends to leave out, and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortInput {
    /// Share of this node's traffic moved from its zone to the others, 0..=`max_shift`.
    pub shift: f64,
    /// Backends left out for failing (outlier ejection), until their back-off ends.
    pub ejected: Vec<SocketAddr>,
    /// Other zones found overloaded: the moved traffic goes elsewhere.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub avoid: Vec<String>,
    /// Most endpoints fail: every usable endpoint is used, equally.
    pub panic: bool,
    /// Connections in flight from this node to the backend drawn at which the connect hook
    /// compares it with a second one, and takes the second if it carries fewer than half as many
    /// ([`spill`]); 0: off (no measurement yet).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spill_at: u32,
    /// The measurement behind the decision.
    pub measured: Measured,
    /// One line: what was measured and what it made the controller do.
    pub reason: String,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// The load as the controller read it in its last interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Measured {
    /// Lowest mean connection lifetime seen (the unloaded latency), microseconds.
    pub baseline_us: Option<f64>,
    /// Mean lifetime of the connections to this zone's backends that ended, microseconds.
    pub near_us: Option<f64>,
    /// The same for the other zones' backends.
    pub far_us: Option<f64>,
    /// Connections in flight to this zone's backends, from this node.
    pub near_in_flight: u64,
    /// Connections in flight to the other zones' backends, from this node.
    pub far_in_flight: u64,
    /// Connections this node opened per second, to every zone.
    pub offered_per_s: f64,
    /// Connections to this zone's backends that ended per second.
    pub near_done_per_s: f64,
    /// This node's share of its zone's capacity, per second: what its connections to the zone
    /// completed while the zone was saturated (raised by any higher rate seen since).
    pub capacity_per_s: Option<f64>,
}

impl Measured {
    /// This zone's latency over the unloaded latency.
    pub fn near_ratio(&self) -> Option<f64> {
        Some(self.near_us? / self.baseline_us?)
    }

    /// The other zones' latency over the unloaded latency.
    pub fn far_ratio(&self) -> Option<f64> {
        Some(self.far_us? / self.baseline_us?)
    }
}

/// The controller's inputs to the policy, by port; a port without one gets the static plan.
pub type Inputs = BTreeMap<PortKey, PortInput>;
