//! `topology-agent status`: what the kernel holds now, service by service, read from the pins.

use std::fmt::Write as _;

use serde::Serialize;
use topology_common::program_names;
use topology_dataplane::{HeartbeatReading, MeasuredBackend, PinnedState};
use topology_model::Protocol;
use topology_policy::desired::{Locality, PortOptions};

/// The status of a pinned dataplane.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    /// Pin directory read.
    pub pin_path: String,
    /// Programs with an attached link.
    pub attached: Vec<String>,
    /// The load signal: `off` (the program at a connection's end is not attached), `idle` (no TCP
    /// port is measured) or `measuring`.
    pub load_signal: &'static str,
    /// The agent's heartbeat: whether the programs rewrite or fail open.
    pub heartbeat: HeartbeatReading,
    /// Counters of the whole node.
    pub node: NodeStatus,
    /// Service ports, sorted by name then ClusterIP.
    pub services: Vec<ServiceStatus>,
    /// The load signal: what the programs measured of each backend this node sent TCP
    /// connections to, by address.
    pub backend_load: Vec<MeasuredBackend>,
    /// Outlier ejection: backends whose handshakes from this node failed in a row, ejected or
    /// not yet, by address.
    pub outliers: Vec<OutlierStatus>,
}

/// A backend failing or ejected on this node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OutlierStatus {
    /// The Service port whose set it is ejected from, `ClusterIP:port/protocol`.
    pub service: String,
    /// `address:port`.
    pub backend: std::net::SocketAddr,
    /// Handshakes failed in a row since its last success or ejection.
    pub failures: u32,
    /// Times ejected.
    pub ejections: u32,
    /// Seconds it is avoided still (0: not ejected).
    pub ejected_for_s: f64,
}

/// Counters of the whole node.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeStatus {
    /// Connections passed through untouched because the heartbeat lapsed.
    pub fail_open: u64,
    /// Rewrites whose socket storage could not be allocated.
    pub no_storage: u64,
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
    /// Session affinity and exemptions.
    pub options: PortOptions,
    /// Backends and the share of new connections each receives.
    pub backends: Vec<BackendStatus>,
    /// Kernel counters since the service was programmed.
    pub counters: PortCounters,
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
pub struct PortCounters {
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
    /// Builds the report from what the pins hold.
    pub fn new(pin_path: &std::path::Path, pinned: &PinnedState) -> Self {
        let measured =
            pinned.kernel.services.iter().any(|(port, programmed)| {
                port.protocol == topology_model::Protocol::Tcp && programmed.options.measured
            });
        let mut services: Vec<ServiceStatus> = pinned
            .kernel
            .services
            .iter()
            .map(|(port, programmed)| {
                let counters = pinned.counters.get(&programmed.service_id).copied().unwrap_or_default();
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
                    options: programmed.options,
                    backends,
                    counters: PortCounters {
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
            attached: pinned.attached.iter().map(|s| (*s).to_owned()).collect(),
            load_signal: match (pinned.attached.contains(&program_names::TCP_CLOSED), measured) {
                (false, _) => "off",
                (true, false) => "idle",
                (true, true) => "measuring",
            },
            heartbeat: pinned.heartbeat,
            node: NodeStatus { fail_open: pinned.node_counters.fail_open, no_storage: pinned.node_counters.no_storage },
            services,
            backend_load: pinned.backend_load.clone(),
            outliers: pinned
                .outliers
                .iter()
                .map(|o| OutlierStatus {
                    service: o.service.to_string(),
                    backend: o.backend,
                    failures: o.failures,
                    ejections: o.ejections,
                    ejected_for_s: o.ejected_for.as_secs_f64(),
                })
                .collect(),
        }
    }

    /// Human-readable table.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "pin path {}: {} of {} socket-address programs attached, {} service ports; load signal {}",
            self.pin_path,
            self.attached.iter().filter(|name| program_names::SOCK_ADDR.contains(&name.as_str())).count(),
            program_names::SOCK_ADDR.len(),
            self.services.len(),
            match self.load_signal {
                "measuring" => "measuring (a TCP port is measured)",
                "idle" => "idle (no TCP port is measured)",
                other => other,
            }
        );
        let _ = writeln!(out, "{}", heartbeat_line(&self.heartbeat));
        let n = &self.node;
        let _ = writeln!(
            out,
            "passed through untouched: {} while failing open; {} rewrites without socket storage",
            n.fail_open, n.no_storage
        );
        for o in &self.outliers {
            let _ = match o.ejected_for_s > 0.0 {
                true => writeln!(
                    out,
                    "ejected {} for {:.0} s more (ejection {}) from {}: its handshakes failed in a row",
                    o.backend, o.ejected_for_s, o.ejections, o.service
                ),
                false => writeln!(
                    out,
                    "failing {} through {}: {} handshakes failed in a row",
                    o.backend, o.service, o.failures
                ),
            };
        }
        let measured: std::collections::BTreeMap<_, _> = self.backend_load.iter().map(|m| (m.backend, m)).collect();
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
            if let Some(timeout) = service.options.affinity_timeout_s {
                let _ = writeln!(out, "    session affinity: ClientIP, {timeout} s");
            }
            for backend in &service.backends {
                let load = backend
                    .address
                    .parse()
                    .ok()
                    .and_then(|ip| measured.get(&std::net::SocketAddr::new(ip, backend.port)))
                    .map(|m| load_text(m))
                    .unwrap_or_default();
                let _ = writeln!(
                    out,
                    "    {:<40} {:<7} {:>6.2}%{load}",
                    format!("{}:{}", bracket(&backend.address), backend.port),
                    backend.locality.as_str(),
                    backend.share * 100.0
                );
            }
        }
        out
    }
}

/// "rewriting; fails open in 9m 58s without a heartbeat", "FAILING OPEN for 1h 2m: ...".
fn heartbeat_line(beat: &HeartbeatReading) -> String {
    let human = |ns: u64| humantime::format_duration(std::time::Duration::from_secs(ns / 1_000_000_000)).to_string();
    if beat.never_fails_open {
        "rewriting; never fails open (--fail-open-after 0)".into()
    } else if beat.failing_open() {
        format!(
            "FAILING OPEN for {}: the agent has had no current view; connections go to the ClusterIP untouched",
            human(beat.lapsed_ns)
        )
    } else {
        format!("rewriting; fails open in {} without a heartbeat from the agent", human(beat.remaining_ns))
    }
}

/// "  in flight 3, 1200 connects, 2 refused, 0 timed out, 1 reset": a backend's load from this
/// node (all services together: the backend's capacity is shared).
fn load_text(measured: &MeasuredBackend) -> String {
    let l = &measured.load;
    format!(
        "  in flight {}, {} connects, {} refused, {} timed out, {} reset",
        measured.in_flight, l.connects, l.refused, l.timed_out, l.reset
    )
}

fn bracket(address: &str) -> String {
    if address.contains(':') { format!("[{address}]") } else { address.to_owned() }
}
