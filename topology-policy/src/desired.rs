//! What the kernel gets, in the words every stage shares: service ports (ClusterIP, port,
//! protocol), localities, weighted backends and port options, and the desired state —
//! per service port, the weighted backends this node may use. The node plan ([`crate::plan`])
//! produces it, the dataplane programs it, `status` reads it back.

use std::{collections::BTreeMap, fmt, net::IpAddr};

use serde::{Deserialize, Serialize};
use topology_common::{ServiceOptions, locality, service_flags};
use topology_model::Protocol;

/// Where a backend sits relative to the node the state is computed for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Locality {
    /// On this node.
    Node,
    /// Another node in this node's zone.
    Zone,
    /// Another zone of this node's region.
    Region,
    /// Anywhere else, or unknown.
    Other,
}

impl Locality {
    /// Every class, in the order of the kernel counters.
    pub const ALL: [Self; locality::CLASSES] = [Self::Node, Self::Zone, Self::Region, Self::Other];

    /// The class number stored in the maps.
    pub fn class(self) -> u8 {
        match self {
            Self::Node => locality::NODE,
            Self::Zone => locality::ZONE,
            Self::Region => locality::REGION,
            Self::Other => locality::OTHER,
        }
    }

    /// The class for a number read from the maps; unknown numbers are `Other`.
    pub fn from_class(class: u8) -> Self {
        match class {
            locality::NODE => Self::Node,
            locality::ZONE => Self::Zone,
            locality::REGION => Self::Region,
            _ => Self::Other,
        }
    }

    /// Lower-case name, as used in metrics labels and tables.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Node => "node",
            Self::Zone => "zone",
            Self::Region => "region",
            Self::Other => "other",
        }
    }
}

/// A service port as the kernel matches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServicePort {
    /// ClusterIP.
    pub vip: IpAddr,
    /// Service port.
    pub port: u16,
    /// Transport protocol.
    pub protocol: Protocol,
}

impl fmt::Display for ServicePort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.vip {
            IpAddr::V4(vip) => write!(f, "{vip}:{}/{}", self.port, self.protocol),
            IpAddr::V6(vip) => write!(f, "[{vip}]:{}/{}", self.port, self.protocol),
        }
    }
}

/// One backend as the kernel gets it: the plan's form of a [`crate::policy::Choice`], with an
/// integer weight; written to the maps as `topology_common::Backend`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WeightedBackend {
    /// Endpoint address; must be of the same family as the ClusterIP.
    pub addr: IpAddr,
    /// Endpoint (target) port.
    pub port: u16,
    /// Relative weight; a backend of weight 0 receives nothing.
    pub weight: u32,
    /// Locality class relative to this node, counted by the kernel on each rewrite.
    pub locality: Locality,
}

/// What the programs do for a service port besides choosing from its backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PortOptions {
    /// `sessionAffinity: ClientIP`: seconds a client keeps its backend after its last connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity_timeout_s: Option<u32>,
    /// Steered to this node's DNS responder: rewritten only while the responder's own heartbeat
    /// is fresh, else passed to the ClusterIP (the cluster DNS) untouched.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub local_dns: bool,
    /// The load signal measures the port's TCP connections: it is under feedback (or the agent
    /// measures every port, `--load-signal all`). Other ports' connections cost it nothing.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub measured: bool,
    /// Overload answered per connection (a port under feedback): connections in flight from this
    /// node to the backend drawn at which the connect hook compares it with a second one; 0: off.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub spill_at: u32,
    /// Outlier ejection is off for the port: its backends are drawn whatever their failures.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub outlier_off: bool,
    /// Failed handshakes in a row that eject one of its backends (1–15); 0: the default, 5.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outlier_failures: u8,
    /// The first ejection's length, seconds (1–255), doubling with each further one up to 5 min;
    /// 0: the default, 10 s.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub outlier_base_s: u8,
}

fn is_zero(value: &u8) -> bool {
    *value == 0
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

impl PortOptions {
    /// The options as the programs read them.
    pub fn to_kernel(self) -> ServiceOptions {
        let flag = |on: bool, flag: u32| if on { flag } else { 0 };
        ServiceOptions {
            affinity_timeout_s: self.affinity_timeout_s.unwrap_or(0),
            flags: flag(self.local_dns, service_flags::LOCAL_DNS)
                | flag(self.measured, service_flags::MEASURED)
                | flag(self.outlier_off, service_flags::OUTLIER_OFF)
                | (self.spill_at.min(service_flags::SPILL_MASK) << service_flags::SPILL_SHIFT)
                | (u32::from(self.outlier_failures) & service_flags::OUTLIER_FAILURES_MASK)
                    << service_flags::OUTLIER_FAILURES_SHIFT
                | u32::from(self.outlier_base_s) << service_flags::OUTLIER_BASE_SHIFT,
        }
    }

    /// The options the programs hold.
    pub fn from_kernel(options: &ServiceOptions) -> Self {
        Self {
            affinity_timeout_s: (options.affinity_timeout_s != 0).then_some(options.affinity_timeout_s),
            local_dns: options.flags & service_flags::LOCAL_DNS != 0,
            measured: options.flags & service_flags::MEASURED != 0,
            outlier_off: options.flags & service_flags::OUTLIER_OFF != 0,
            spill_at: options.flags >> service_flags::SPILL_SHIFT & service_flags::SPILL_MASK,
            outlier_failures: (options.flags >> service_flags::OUTLIER_FAILURES_SHIFT
                & service_flags::OUTLIER_FAILURES_MASK) as u8,
            outlier_base_s: (options.flags >> service_flags::OUTLIER_BASE_SHIFT & service_flags::OUTLIER_BASE_MASK)
                as u8,
        }
    }
}

/// What one service port should do on this node.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DesiredService {
    /// `namespace/name:port`, shown by `status` and used as a metrics label.
    pub name: String,
    /// Backends to choose from. Empty, or all of weight 0, means connections are refused.
    pub backends: Vec<WeightedBackend>,
    /// Session affinity and DNS steering.
    #[serde(default)]
    pub options: PortOptions,
}

/// Everything this node's kernel should hold.
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct DesiredState {
    /// Service ports and their backends.
    pub services: BTreeMap<ServicePort, DesiredService>,
}

impl DesiredState {
    /// Total number of backends across all service ports.
    pub fn backend_count(&self) -> usize {
        self.services.values().map(|service| service.backends.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_round_trips_through_numbers_and_names() {
        for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(Protocol::from_number(protocol.number()), Some(protocol));
            assert_eq!(protocol.to_string().parse::<Protocol>(), Ok(protocol));
        }
        assert_eq!("udp".parse::<Protocol>(), Ok(Protocol::Udp));
        assert!("ICMP".parse::<Protocol>().is_err());
        assert_eq!(Protocol::from_number(1), None);
    }

    #[test]
    fn locality_classes_match_the_kernel_counters() {
        for (index, class) in Locality::ALL.iter().enumerate() {
            assert_eq!(usize::from(class.class()), index);
            assert_eq!(Locality::from_class(class.class()), *class);
        }
        assert_eq!(Locality::from_class(200), Locality::Other);
    }

    #[test]
    fn port_options_round_trip_through_the_kernel_form() {
        for options in [
            PortOptions::default(),
            PortOptions { measured: true, local_dns: true, ..PortOptions::default() },
            PortOptions { affinity_timeout_s: Some(10_800), ..PortOptions::default() },
            PortOptions {
                local_dns: true,
                affinity_timeout_s: Some(1),
                measured: false,
                outlier_off: true,
                spill_at: 4095,
                outlier_failures: 3,
                outlier_base_s: 255,
            },
            PortOptions { measured: true, spill_at: 4, ..PortOptions::default() },
        ] {
            assert_eq!(PortOptions::from_kernel(&options.to_kernel()), options);
        }
    }

    #[test]
    fn service_port_display_brackets_ipv6() {
        let v4 = ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 53, protocol: Protocol::Udp };
        let v6 = ServicePort { vip: "fd00::10".parse().unwrap(), port: 80, protocol: Protocol::Tcp };
        assert_eq!(v4.to_string(), "10.96.0.10:53/UDP");
        assert_eq!(v6.to_string(), "[fd00::10]:80/TCP");
    }
}
