//! topology-policy: the pure stages of the pipeline — which backends each Service port of a node
//! may use and why (the policy), every decision of one node and the kernel entries they make (the
//! node plan, with the alias slots the kernel draws from), what `explain` prints of it, and the
//! feedback control that reweights them from what the kernel measured.
//!
//! The data flows one way: watch -> cluster state -> **policy -> node plan** -> diff -> dataplane.
//! Nothing here touches the Kubernetes API types, the kernel, the network or an async runtime: the
//! agent, the simulator and the benchmarks all decide with this crate, and it builds and tests with
//! stable Rust alone.

pub mod desired;
pub mod explain;
pub mod feedback;
pub mod plan;
pub mod policy;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
