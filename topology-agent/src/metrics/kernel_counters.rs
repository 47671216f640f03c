//! The kernel's counters, read at each scrape: per service port (rewrites by locality, refusals,
//! errors, the default policy's in-zone share beside them), for the node, and the load signal per
//! backend.
//!
//! Which ports have series is up to the node's clients (a port has them once it is used), so their
//! number is capped (`--metrics-max-ports`): the most used ports keep their own series, the rest
//! are summed into one set labelled `service="other"`, and `topology_agent_metrics_ports_folded`
//! says how many. A process that touches every ClusterIP cannot grow the scrape past the cap.
//! Backends of ports under feedback are capped alike (`--metrics-max-backends`, the most connected
//! first, the rest as `backend="other"`): a tenant's EndpointSlices name as many as they like.

use std::{
    collections::HashMap,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric as _},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
};
use topology_common::ServiceCounters;
use topology_dataplane::{CounterReading, KernelReading, MeasuredBackend};
use topology_policy::desired::{Locality, ServicePort};

/// Ports with series of their own by default: 1,000 ports × 7 series.
pub const DEFAULT_MAX_PORTS: usize = 1000;
/// Backends with series of their own by default: 1,000 backends × 8 series.
pub const DEFAULT_MAX_BACKENDS: usize = 1000;

/// Reads the kernel counters.
pub(super) type CounterSource = Box<dyn Fn() -> KernelReading + Send>;

/// The kernel's per-CPU counters, summed, read at each scrape.
pub(super) struct KernelCounters {
    pub(super) source: Mutex<Option<CounterSource>>,
    /// Per port, the share of connections the default policy would keep in this node's zone.
    pub(super) baselines: Mutex<HashMap<ServicePort, f64>>,
    /// Ports with series of their own; the rest are summed as `other`.
    pub(super) max_ports: AtomicUsize,
    /// Backends with series of their own; the rest are summed as `other`.
    pub(super) max_backends: AtomicUsize,
}

impl Default for KernelCounters {
    fn default() -> Self {
        Self {
            source: Mutex::default(),
            baselines: Mutex::default(),
            max_ports: AtomicUsize::new(DEFAULT_MAX_PORTS),
            max_backends: AtomicUsize::new(DEFAULT_MAX_BACKENDS),
        }
    }
}

impl std::fmt::Debug for KernelCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KernelCounters")
    }
}

impl Collector for KernelCounters {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let reading = match &*self.source.lock().unwrap_or_else(std::sync::PoisonError::into_inner) {
            Some(source) => source(),
            None => KernelReading::default(),
        };
        let (services, folded) = fold(reading.services, self.max_ports.load(Ordering::Relaxed));
        let services = &services;
        let labels = |s: &CounterReading| {
            vec![
                ("service".to_owned(), s.name.clone()),
                ("cluster_ip".to_owned(), s.port.vip.to_string()),
                ("port".to_owned(), s.port.port.to_string()),
                ("protocol".to_owned(), s.port.protocol.to_string()),
            ]
        };
        {
            let mut family = encoder.encode_descriptor(
                "kernel_rewrites",
                "Connections and datagrams rewritten by the kernel, by the chosen backend's locality",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for service in services.iter() {
                for locality in Locality::ALL {
                    let mut set = labels(service);
                    set.push(("locality".to_owned(), locality.as_str().to_owned()));
                    let value = service.counters.rewritten[usize::from(locality.class())];
                    ConstCounter::new(value).encode(family.encode_family(&set)?)?;
                }
            }
        }
        for (name, help, value) in [
            (
                "kernel_refused",
                "Connections and datagrams refused by the kernel (empty backend set)",
                (|c: &ServiceCounters| c.refused) as fn(&ServiceCounters) -> u64,
            ),
            ("kernel_errors", "Internal failures counted by the kernel programs", |c| c.errors),
        ] {
            let mut family =
                encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
            for service in services.iter() {
                ConstCounter::new(value(&service.counters)).encode(family.encode_family(&labels(service))?)?;
            }
        }
        {
            // Beside each port's rewrites, with the same labels: what the default policy would have
            // kept in zone, so rate(rewrites) × (1 − this) is the cross-zone traffic it would send.
            let mut family = encoder.encode_descriptor(
                "default_policy_in_zone_ratio",
                "Share of this port's connections the default policy (every usable endpoint equally, no topology) \
                 would keep in this node's zone",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            let baselines = self.baselines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            for service in services.iter() {
                if let Some(share) = baselines.get(&service.port) {
                    ConstGauge::new(*share).encode(family.encode_family(&labels(service))?)?;
                }
            }
        }
        for (name, help, value) in [
            (
                "kernel_fail_open",
                "Connections and datagrams to service ports passed through untouched because the agent's heartbeat lapsed",
                reading.node.fail_open,
            ),
            (
                "kernel_no_storage",
                "Rewrites whose socket storage could not be allocated (getpeername shows the backend)",
                reading.node.no_storage,
            ),
        ] {
            let family =
                encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Counter)?;
            ConstCounter::new(value).encode(family)?;
        }
        let (backends, backends_folded) = fold_backends(reading.backends, self.max_backends.load(Ordering::Relaxed));
        encode_backend_load(&mut encoder, &backends)?;
        let ejected = reading.outliers.iter().filter(|outlier| outlier.ejected()).count();
        for (name, help, value) in [
            (
                "metrics_ports_folded",
                "Used service ports past --metrics-max-ports, whose counters are summed under service=\"other\"",
                folded,
            ),
            (
                "metrics_backends_folded",
                "Measured backends past --metrics-max-backends, whose load is summed under backend=\"other\"",
                backends_folded,
            ),
            (
                "backends_ejected",
                "Backends this node's hooks avoid now for a Service port, their handshakes through it having failed in a row (outlier ejection; one per port and backend)",
                ejected,
            ),
            (
                "backends_failing",
                "Backends whose last handshakes from this node through a Service port failed, not ejected (one per port and backend)",
                reading.outliers.len() - ejected,
            ),
        ] {
            let family = encoder.encode_descriptor(name, help, None, prometheus_client::metrics::MetricType::Gauge)?;
            ConstGauge::new(value as i64).encode(family)?;
        }
        if let Some(heartbeat) = reading.heartbeat {
            let family = encoder.encode_descriptor(
                "kernel_failing_open",
                "1 while the programs pass every connection through untouched (heartbeat lapsed), else 0",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            ConstGauge::new(i64::from(heartbeat.failing_open())).encode(family)?;
        }
        Ok(())
    }
}

/// The load signal, per backend (`backend="ip:port"`, or `other`): what the programs
/// measured of the TCP connections this node's hooks sent there.
fn encode_backend_load(
    encoder: &mut DescriptorEncoder,
    backends: &[(String, MeasuredBackend)],
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType::{Counter, Gauge};
    type Field = fn(&MeasuredBackend) -> f64;
    let families: [(&str, &str, _, Field); 8] = [
        (
            "backend_connections_in_flight",
            "TCP connections from this node to the backend, connecting or open",
            Gauge,
            |m| m.in_flight as f64,
        ),
        ("backend_connects", "TCP connections this node's hooks sent to the backend", Counter, |m| {
            m.load.connects as f64
        }),
        (
            "backend_connects_refused",
            "Handshakes to the backend refused (RST) or abandoned before a SYN retransmission",
            Counter,
            |m| m.load.refused as f64,
        ),
        (
            "backend_connects_timed_out",
            "Handshakes to the backend abandoned after a SYN retransmission",
            Counter,
            |m| m.load.timed_out as f64,
        ),
        (
            "backend_connections_reset",
            "Established connections to the backend closed without the FIN exchange",
            Counter,
            |m| m.load.reset as f64,
        ),
        (
            "backend_connections_closed",
            "Connections to the backend that completed their handshake and ended",
            Counter,
            |m| m.load.closed as f64,
        ),
        ("backend_connection_seconds", "Summed lifetime of the ended connections to the backend", Counter, |m| {
            m.load.lifetime_us as f64 / 1e6
        }),
        (
            "backend_rtt_seconds",
            "Summed smoothed round-trip time of the ended connections to the backend",
            Counter,
            |m| m.load.rtt_us as f64 / 1e6,
        ),
    ];
    for (name, help, kind, field) in families {
        let mut family = encoder.encode_descriptor(name, help, None, kind)?;
        for (backend, measured) in backends {
            let labels = [("backend".to_owned(), backend.clone())];
            let encoder = family.encode_family(&labels)?;
            match kind {
                Counter => ConstCounter::new(field(measured)).encode(encoder)?,
                _ => ConstGauge::new(field(measured)).encode(encoder)?,
            }
        }
    }
    Ok(())
}

/// The `max` most used ports (by connections counted, any outcome) in their own right, and the
/// others summed into one reading named `other` (a port of no address): the readings to encode
/// and how many ports were folded.
fn fold(mut services: Vec<CounterReading>, max: usize) -> (Vec<CounterReading>, usize) {
    if services.len() <= max {
        return (services, 0);
    }
    let used = |s: &CounterReading| s.counters.rewritten.iter().sum::<u64>() + s.counters.refused + s.counters.errors;
    // Most used first; ties by port, so the same ports keep their series from scrape to scrape.
    services.sort_by(|a, b| used(b).cmp(&used(a)).then_with(|| a.port.cmp(&b.port)));
    let rest = services.split_off(max);
    let folded = rest.len();
    let mut other = CounterReading {
        name: "other".into(),
        port: ServicePort {
            vip: std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
            port: 0,
            protocol: rest[0].port.protocol,
        },
        counters: ServiceCounters::default(),
    };
    for service in &rest {
        for (sum, value) in other.counters.rewritten.iter_mut().zip(service.counters.rewritten) {
            *sum += value;
        }
        other.counters.refused += service.counters.refused;
        other.counters.errors += service.counters.errors;
    }
    services.push(other);
    (services, folded)
}

/// The `max` backends with the most connections started, each under its address, and the others
/// summed under `other`: the readings to encode and how many backends were folded.
fn fold_backends(mut backends: Vec<MeasuredBackend>, max: usize) -> (Vec<(String, MeasuredBackend)>, usize) {
    // Most connected first; ties by address, so the same backends keep their series.
    backends.sort_by(|a, b| b.load.connects.cmp(&a.load.connects).then_with(|| a.backend.cmp(&b.backend)));
    let rest = backends.split_off(max.min(backends.len()));
    let mut kept: Vec<(String, MeasuredBackend)> = backends.into_iter().map(|m| (m.backend.to_string(), m)).collect();
    if let Some(first) = rest.first() {
        let mut other = MeasuredBackend::new(first.backend, topology_common::BackendLoad::default());
        for measured in &rest {
            other.add(measured);
        }
        kept.push(("other".into(), other));
    }
    (kept, rest.len())
}

#[cfg(test)]
mod tests {
    use topology_model::Protocol;

    use super::*;
    use crate::metrics::Metrics;

    fn port(last: u8, rewrites: u64, refused: u64) -> CounterReading {
        let mut counters = ServiceCounters::default();
        counters.rewritten[1] = rewrites;
        counters.refused = refused;
        CounterReading {
            name: format!("t/svc-{last}:http"),
            port: ServicePort { vip: format!("10.96.0.{last}").parse().unwrap(), port: 80, protocol: Protocol::Tcp },
            counters,
        }
    }

    #[test]
    fn ports_past_the_cap_are_summed_as_other_and_the_most_used_keep_their_series() {
        let metrics = Metrics::default();
        metrics.set_caps(super::super::SeriesCaps { ports: 2, backends: DEFAULT_MAX_BACKENDS });
        metrics.set_kernel_source(|| KernelReading {
            services: vec![port(1, 5, 0), port(2, 50, 0), port(3, 1, 1), port(4, 20, 0), port(5, 0, 3)],
            ..KernelReading::default()
        });
        let text = metrics.encode();
        let line = |prefix: &str| text.lines().any(|l| l.starts_with(prefix));
        assert!(line("topology_agent_kernel_rewrites_total{service=\"t/svc-2:http\""), "{text}");
        assert!(line("topology_agent_kernel_rewrites_total{service=\"t/svc-4:http\""), "{text}");
        assert!(!text.contains("t/svc-1:http") && !text.contains("t/svc-3:http"), "{text}");
        assert!(
            line(
                "topology_agent_kernel_rewrites_total{service=\"other\",cluster_ip=\"0.0.0.0\",port=\"0\",protocol=\"TCP\",locality=\"zone\"} 6"
            ),
            "{text}"
        );
        assert!(
            line(
                "topology_agent_kernel_refused_total{service=\"other\",cluster_ip=\"0.0.0.0\",port=\"0\",protocol=\"TCP\"} 4"
            ),
            "{text}"
        );
        assert!(line("topology_agent_metrics_ports_folded 3"), "{text}");
        // Series: 2 ports and `other`, 7 each at most, whatever the number of ports used.
        assert_eq!(text.matches("topology_agent_kernel_rewrites_total{").count(), 3 * Locality::ALL.len(), "{text}");
    }

    #[test]
    fn backends_past_the_cap_are_summed_as_other() {
        let backend = |last: u8, connects: u64| {
            let load = topology_common::BackendLoad { connects, closed: connects / 2, ..Default::default() };
            MeasuredBackend::new(format!("10.1.0.{last}:8080").parse().unwrap(), load)
        };
        let metrics = Metrics::default();
        metrics.set_caps(super::super::SeriesCaps { ports: DEFAULT_MAX_PORTS, backends: 2 });
        metrics.set_kernel_source(move || KernelReading {
            backends: vec![backend(1, 10), backend(2, 40), backend(3, 4), backend(4, 20)],
            ..KernelReading::default()
        });
        let text = metrics.encode();
        let line = |prefix: &str| text.lines().any(|l| l == prefix);
        assert!(line("topology_agent_backend_connects_total{backend=\"10.1.0.2:8080\"} 40.0"), "{text}");
        assert!(line("topology_agent_backend_connects_total{backend=\"10.1.0.4:8080\"} 20.0"), "{text}");
        assert!(line("topology_agent_backend_connects_total{backend=\"other\"} 14.0"), "{text}");
        assert!(line("topology_agent_backend_connections_in_flight{backend=\"other\"} 7.0"), "{text}");
        assert!(line("topology_agent_metrics_backends_folded 2"), "{text}");
        assert_eq!(text.matches("topology_agent_backend_connects_total{").count(), 3, "{text}");
    }

    #[test]
    fn under_the_cap_nothing_is_folded() {
        let (kept, folded) = fold(vec![port(1, 1, 0), port(2, 2, 0)], 2);
        assert_eq!((kept.len(), folded), (2, 0));
    }
}
