//! `cargo xtask demo`: a multi-zone cluster simulated on one machine, with a real agent per
//! simulated node and real connections, compared with twins that have no topology policy.

pub mod bytes;
pub mod cluster;
pub mod expect;
pub mod measure;
pub mod overload;
pub mod overload_report;
pub mod plan;
pub mod pod_failover;
pub mod real;
pub mod report;
pub mod rollout;
pub mod rollout_chart;

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
};

pub use cluster::DemoCluster;
pub use measure::{Failover, Landing, ServiceResult, failover, measure};
pub use plan::{DemoConfig, Plan, Policy, Transport};
pub use pod_failover::{PodFailover, pod_failover, pod_failover_line};

use crate::{net::ClientPlace, traffic::Report};

/// A running demo cluster, whichever control plane feeds its agents (the embedded one reading
/// `cluster.yaml`, or the real Kubernetes of [`real`]): what the measurements drive and read.
pub trait DemoNodes: Sync {
    /// The plan it runs.
    fn plan(&self) -> &Plan;
    /// Where its logs and scratch files go.
    fn dir(&self) -> &Path;
    /// Where clients of node `index` run.
    fn place(&self, index: usize) -> ClientPlace;
    /// Where another pod's clients of node `index` run (outlier ejection wants two pods' evidence).
    fn second_place(&self, index: usize) -> ClientPlace;
    /// `topology-agent explain --output json` for node `index`, with the DNS its agent serves.
    fn explain(&self, index: usize) -> serde_json::Value;
    /// Kills the servers of `zone`'s backends (SIGKILL, as when a zone's pods die), telling the
    /// cluster nothing; returns how many.
    fn kill_zone(&mut self, zone: &str) -> usize;
    /// Starts the killed servers of `zone` again; returns once they listen.
    fn restart_zone(&mut self, zone: &str);
    /// Kills backend `index`'s server, telling the cluster nothing.
    fn kill_backend(&mut self, index: usize);
    /// Starts backend `index`'s server again, if killed.
    fn restart_backend(&mut self, index: usize);
    /// Tells the cluster which backends are out: their endpoints leave every slice.
    fn set_removed(&self, removed: plan::Removed<'_>);
    /// How the cluster learns a backend is out, for the report.
    fn removal(&self) -> &'static str;

    /// A node running the real kube-proxy (nftables, no agent) and its plan: where its clients
    /// run, its name, zone and region. `None` where the control plane has no kube-proxy.
    fn kube_proxy(&self) -> Option<(ClientPlace, &plan::NodePlan)> {
        None
    }

    /// Number of nodes.
    fn nodes(&self) -> usize {
        self.plan().nodes.len()
    }

    /// `count` connections (or exchanges) from node `node` to Service `service`.
    fn traffic(&self, node: usize, service: usize, count: u64) -> Report {
        let service = &self.plan().services[service];
        let target = SocketAddr::new(IpAddr::V4(service.vip), plan::SERVICE_PORT);
        match service.transport {
            Transport::Tcp => self.place(node).tcp(target, count),
            Transport::Udp => self.place(node).udp(target, count, crate::traffic::UdpMode::Unconnected),
            Transport::Dns => {
                let dns = SocketAddr::new(IpAddr::V4(plan::KUBE_DNS), 53);
                self.place(node).resolve_tcp(dns, &Plan::dns_name(service), plan::BACKEND_PORT, count)
            }
        }
    }
}
