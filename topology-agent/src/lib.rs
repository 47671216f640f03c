//! topology-agent: computes, for the node it runs on, which backends each Service port may use,
//! and programs those sets into cgroup socket hooks that rewrite ClusterIP connections in the
//! kernel.
//!
//! The data flows one way: source -> cluster state -> policy -> node plan -> diff -> dataplane.

pub mod agent;
pub mod caps;
pub mod controller;
pub mod cost;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing;
pub mod heap;
pub mod http;
pub mod kernel_version;
pub mod metrics;
pub mod sockets;
pub mod status;
