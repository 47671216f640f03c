//! topology-model: the cluster as the agent knows it — Services, EndpointSlices and Nodes reduced
//! to what decides routing, indexed in one [`ClusterState`] the policy reads.
//!
//! The data flows one way: watch → **cluster state** → policy → node plan → diff → kernel. This
//! crate is the model alone: no kernel, no network, no async runtime. Reading Kubernetes objects
//! into it (the API's JSON, or a file of YAML documents) is the `kubernetes` feature, so the pure
//! policy builds without the Kubernetes API types.

pub mod bounds;
pub mod census;
#[cfg(any(test, feature = "kubernetes"))]
pub mod convert;
pub mod demand;
pub mod labels;
pub mod listen;
pub mod objects;
pub mod prefix;
pub mod protocol;
pub mod state;
#[cfg(any(test, feature = "kubernetes"))]
pub mod yaml;

pub use objects::{
    Endpoint, EndpointExtra, EndpointSlice, Family, Kind, Node, ObjectError, ObjectKey, PortSpec, Service, SlicePort,
    TopologyKeysSource, TopologyKeysSpec, TrafficDistribution,
};
pub use prefix::Prefix;
pub use protocol::{Protocol, UnknownProtocol};
pub use state::ClusterState;
