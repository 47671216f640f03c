//! `cargo xtask demo`: a multi-zone cluster simulated on one machine, with a real agent per
//! simulated node and real connections, compared with twins that have no topology policy.

pub mod bytes;
pub mod cluster;
pub mod measure;
pub mod overload;
pub mod overload_report;
pub mod plan;
pub mod pod_failover;
pub mod report;
pub mod rollout;
pub mod rollout_chart;

pub use cluster::DemoCluster;
pub use measure::{Failover, Landing, ServiceResult, failover, measure};
pub use plan::{DemoConfig, Plan, Policy, Transport};
pub use pod_failover::{PodFailover, pod_failover, pod_failover_line};
