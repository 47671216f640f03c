//! `topology-agent status`: what the kernel holds now, service by service, read from the pins.

use std::fmt::Write as _;

use serde::Serialize;

use crate::{
    dataplane::Snapshot,
    desired::{Locality, Protocol},
};

/// The status of a pinned dataplane.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// Pin directory read.
    pub pin_path: String,
    /// Programs with an attached link.
    pub attached: Vec<String>,
    /// Service ports, sorted by name then ClusterIP.
    pub services: Vec<ServiceStatus>,
}

/// One programmed service port.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    /// `namespace/name:port`.
    pub service: String,
    /// ClusterIP.
    pub cluster_ip: String,
    /// Service port.
    pub port: u16,
    /// Protocol.
    pub protocol: Protocol,
    /// Connections are refused (empty backend set).
    pub reject: bool,
    /// Backends and the share of new connections each receives.
    pub backends: Vec<BackendStatus>,
    /// Kernel counters since the service was programmed.
    pub counters: Counters,
}

/// One backend of a programmed service port.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendStatus {
    /// Address.
    pub address: String,
    /// Port.
    pub port: u16,
    /// Locality class relative to this node.
    pub locality: Locality,
    /// Probability of being chosen, 0..1.
    pub share: f64,
}

/// Kernel counters of a service port.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Counters {
    /// Rewrites to same-node backends.
    pub node: u64,
    /// Rewrites to same-zone backends.
    pub zone: u64,
    /// Rewrites to same-region backends.
    pub region: u64,
    /// Rewrites to other backends.
    pub other: u64,
    /// Refused connections and datagrams.
    pub refused: u64,
    /// Internal failures.
    pub errors: u64,
}

impl StatusReport {
    /// Builds the report from a snapshot of the pins.
    pub fn new(pin_path: &std::path::Path, snapshot: &Snapshot) -> Self {
        let mut services: Vec<ServiceStatus> = snapshot
            .kernel
            .services
            .iter()
            .map(|(port, programmed)| {
                let counters = snapshot.counters.get(&programmed.service_id).copied().unwrap_or_default();
                let mut backends: Vec<BackendStatus> = programmed
                    .backends(port.vip.is_ipv4())
                    .into_iter()
                    .map(|b| BackendStatus {
                        address: b.addr.to_string(),
                        port: b.port,
                        locality: b.locality,
                        share: f64::from(b.weight) / 1e6,
                    })
                    .collect();
                backends.sort_by(|a, b| (a.locality, &a.address, a.port).cmp(&(b.locality, &b.address, b.port)));
                ServiceStatus {
                    service: programmed.name.clone(),
                    cluster_ip: port.vip.to_string(),
                    port: port.port,
                    protocol: port.protocol,
                    reject: programmed.count == 0,
                    backends,
                    counters: Counters {
                        node: counters.rewritten[0],
                        zone: counters.rewritten[1],
                        region: counters.rewritten[2],
                        other: counters.rewritten[3],
                        refused: counters.refused,
                        errors: counters.errors,
                    },
                }
            })
            .collect();
        services.sort_by(|a, b| (&a.service, &a.cluster_ip, a.port).cmp(&(&b.service, &b.cluster_ip, b.port)));
        Self {
            pin_path: pin_path.display().to_string(),
            attached: snapshot.attached.iter().map(|s| (*s).to_owned()).collect(),
            services,
        }
    }

    /// Human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "pin path {}: {} of 8 programs attached, {} service ports",
            self.pin_path,
            self.attached.len(),
            self.services.len()
        );
        for service in &self.services {
            let c = &service.counters;
            let _ = writeln!(
                out,
                "\n{}  {}:{}/{}  {}  rewritten node {} zone {} region {} other {}, refused {}, errors {}",
                if service.service.is_empty() { "(unnamed)" } else { &service.service },
                bracket(&service.cluster_ip),
                service.port,
                service.protocol,
                if service.reject { "REFUSE" } else { "" },
                c.node,
                c.zone,
                c.region,
                c.other,
                c.refused,
                c.errors
            );
            for backend in &service.backends {
                let _ = writeln!(
                    out,
                    "    {:<40} {:<7} {:>6.2}%",
                    format!("{}:{}", bracket(&backend.address), backend.port),
                    backend.locality.as_str(),
                    backend.share * 100.0
                );
            }
        }
        out
    }
}

fn bracket(address: &str) -> String {
    if address.contains(':') { format!("[{address}]") } else { address.to_owned() }
}
