//! The cluster as the agent knows it: objects reduced to what decides routing, from a file or
//! from Kubernetes watches, indexed in one state the policy reads.

pub mod bounds;
pub mod census;
pub mod convert;
pub mod demand;
pub mod labels;
pub mod model;
pub mod prefix;
pub mod state;
pub mod yaml;

pub use model::{
    Endpoint, EndpointExtra, EndpointSlice, Family, Kind, Node, ObjectError, ObjectKey, PortSpec, Service, SlicePort,
    TopologyKeysSource, TopologyKeysSpec, TrafficDistribution,
};
pub use prefix::Prefix;
pub use state::ClusterState;
