//! Prometheus metrics of the agent, and the kernel's per-CPU counters exported at scrape time
//! (`kernel`).

pub mod control;
pub mod feedback;
mod kernel_counters;

use std::{collections::HashMap, sync::Arc};

pub use kernel_counters::{DEFAULT_MAX_BACKENDS, DEFAULT_MAX_PORTS};

/// How many series groups the tenants' traffic may make: the rest are summed as `other`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeriesCaps {
    /// Used service ports with series of their own.
    pub ports: usize,
    /// Measured backends with series of their own.
    pub backends: usize,
}

impl Default for SeriesCaps {
    fn default() -> Self {
        Self { ports: DEFAULT_MAX_PORTS, backends: DEFAULT_MAX_BACKENDS }
    }
}
use prometheus_client::{encoding::EncodeLabelSet, registry::Registry};
use topology_dataplane::KernelReading;
use topology_dns::DnsMetrics;
use topology_policy::desired::ServicePort;

use self::feedback::FeedbackMetrics;

/// Labels of a map.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MapLabels {
    /// Map name.
    pub map: String,
}

/// Labels of a skipped object.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// Object kind.
    pub kind: String,
}

/// Labels of this node's place in the topology.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct NodeLabels {
    /// The Node's name.
    pub node: String,
    /// `topology.kubernetes.io/zone`, empty without it.
    pub zone: String,
    /// `topology.kubernetes.io/region`, empty without it.
    pub region: String,
}

/// Labels of a failure.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// Why.
    pub reason: String,
}

topology_metrics::metrics! {
    /// Every metric the agent exports.
    pub struct Metrics;
    exported {}
    own(registry = "topology_agent") {
        /// The control loop's own metrics: syncs, what the kernel holds, skipped objects, the view.
        pub control: control::LoopMetrics = {
            let control = control::LoopMetrics::default();
            control.register(&mut registry);
            control
        };
        /// Socket termination's and the sweep of open connections' metrics.
        pub sockets: crate::sockets::metrics::SocketMetrics = {
            let sockets = crate::sockets::metrics::SocketMetrics::default();
            sockets.register(&mut registry);
            sockets
        };
        /// The bytes counted and what they cost (`bytes`, `cross_zone_bytes*`, `/debug/cost`).
        pub bytes: crate::cost::ByteMetrics = {
            let bytes = crate::cost::ByteMetrics::default();
            bytes.register(&mut registry);
            bytes
        };
        /// The node-local DNS responder's metrics (`dns_*`).
        pub dns: Arc<DnsMetrics> = {
            let dns = Arc::new(DnsMetrics::default());
            dns.register(&mut registry);
            dns
        };
        /// The kernel's counters, read at each scrape.
        kernel: Arc<kernel_counters::KernelCounters> = {
            let kernel = Arc::new(kernel_counters::KernelCounters::default());
            registry.register_collector(Box::new(Arc::clone(&kernel)));
            kernel
        };
        /// The feedback controller's decisions (`feedback_*`).
        pub feedback: Arc<FeedbackMetrics> = {
            let feedback = Arc::new(FeedbackMetrics::default());
            registry.register_collector(Box::new(Arc::clone(&feedback)));
            feedback
        };
        registry: Registry = registry;
    }
}

impl Metrics {
    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Sets (or, with `None`, forgets) what the default policy would keep in zone for a port.
    pub fn set_baseline(&self, port: ServicePort, in_zone: Option<f64>) {
        let mut baselines = self.kernel.baselines.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match in_zone {
            Some(share) => baselines.insert(port, share),
            None => baselines.remove(&port),
        };
    }

    /// Replaces every port's baseline (after a whole apply); of a port given twice, the first.
    pub fn replace_baselines(&self, all: impl IntoIterator<Item = (ServicePort, f64)>) {
        let mut baselines = HashMap::new();
        for (port, share) in all {
            baselines.entry(port).or_insert(share);
        }
        *self.kernel.baselines.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = baselines;
    }

    /// Sets how many used service ports and measured backends get series of their own
    /// (`--metrics-max-ports`, `--metrics-max-backends`).
    pub fn set_caps(&self, caps: SeriesCaps) {
        self.kernel.max_ports.store(caps.ports, std::sync::atomic::Ordering::Relaxed);
        self.kernel.max_backends.store(caps.backends, std::sync::atomic::Ordering::Relaxed);
    }

    /// Service ports with series of their own (`--metrics-max-ports`).
    pub fn max_ports(&self) -> usize {
        self.kernel.max_ports.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets where the kernel counters are read from at each scrape.
    pub fn set_kernel_source(&self, source: impl Fn() -> KernelReading + Send + 'static) {
        *self.kernel.source.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Box::new(source));
    }
}

#[cfg(test)]
mod tests {
    use topology_common::{NodeCounters, ServiceCounters};
    use topology_dataplane::{CounterReading, MeasuredBackend};
    use topology_model::Protocol;
    use topology_policy::desired::ServicePort;

    use super::*;

    #[test]
    fn kernel_counters_are_exported_as_counters_with_service_labels() {
        let metrics = Metrics::default();
        let mut counters = ServiceCounters::default();
        counters.rewritten[1] = 7;
        counters.refused = 2;
        metrics.set_kernel_source(move || KernelReading {
            services: vec![CounterReading {
                name: "default/web:http".into(),
                port: ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 80, protocol: Protocol::Tcp },
                counters,
            }],
            node: NodeCounters { fail_open: 3, retired: 0, no_storage: 0 },
            heartbeat: None,
            backends: vec![MeasuredBackend {
                backend: "10.0.1.5:8080".parse().unwrap(),
                in_flight: 4,
                load: topology_dataplane::LoadCounters {
                    connects: 9,
                    closed: 5,
                    lifetime_us: 2_500_000,
                    ..Default::default()
                },
            }],
            outliers: vec![
                topology_dataplane::Outlier {
                    service: ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 80, protocol: Protocol::Tcp },
                    backend: "10.0.1.6:8080".parse().unwrap(),
                    failures: 0,
                    ejections: 1,
                    ejected_for: std::time::Duration::from_secs(7),
                },
                topology_dataplane::Outlier {
                    service: ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 80, protocol: Protocol::Tcp },
                    backend: "10.0.1.7:8080".parse().unwrap(),
                    failures: 2,
                    ejections: 0,
                    ejected_for: std::time::Duration::ZERO,
                },
            ],
        });
        metrics.control.services.set(1);
        let web = ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 80, protocol: Protocol::Tcp };
        metrics.set_baseline(web, Some(0.25));
        // A baseline of a port the kernel does not hold is not exported.
        metrics.set_baseline(ServicePort { port: 81, ..web }, Some(1.0));
        let text = metrics.encode();
        let line = |prefix: &str| text.lines().any(|l| l.starts_with(prefix));
        assert!(
            line(
                "topology_agent_kernel_rewrites_total{service=\"default/web:http\",cluster_ip=\"10.96.0.10\",port=\"80\",protocol=\"TCP\",locality=\"zone\"} 7"
            ),
            "{text}"
        );
        assert!(line("topology_agent_kernel_refused_total{service=\"default/web:http\""), "{text}");
        assert!(line("topology_agent_services_programmed 1"), "{text}");
        assert!(
            line(
                "topology_agent_default_policy_in_zone_ratio{service=\"default/web:http\",cluster_ip=\"10.96.0.10\",port=\"80\",protocol=\"TCP\"} 0.25"
            ),
            "{text}"
        );
        assert_eq!(text.matches("default_policy_in_zone_ratio{").count(), 1, "{text}");
        assert!(line("topology_agent_kernel_fail_open_total 3"), "{text}");
        assert!(line("topology_agent_backend_connections_in_flight{backend=\"10.0.1.5:8080\"} 4"), "{text}");
        assert!(line("topology_agent_backend_connects_total{backend=\"10.0.1.5:8080\"} 9"), "{text}");
        assert!(line("topology_agent_backend_connection_seconds_total{backend=\"10.0.1.5:8080\"} 2.5"), "{text}");
        assert!(line("topology_agent_failed_service_ports 0"), "{text}");
        assert!(line("topology_agent_backends_ejected 1") && line("topology_agent_backends_failing 1"), "{text}");
        assert!(line("# TYPE topology_agent_event_to_kernel_seconds histogram"), "{text}");
        assert!(line("topology_agent_grace_periods_total{waited_by=\"writer\"} 0"), "at 0 from the start: {text}");
        // The dataplane's totals since open: 7 begun, 6 passed, 2 of them waited by the writer.
        let totals = |begun, passed, waited| topology_dataplane::Epochs { begun, passed, waited };
        metrics.control.record_grace_periods(totals(7, 6, 2));
        metrics.control.record_grace_periods(totals(9, 9, 3));
        let text = metrics.encode();
        let line = |prefix: &str| text.lines().any(|l| l.starts_with(prefix));
        assert!(line("topology_agent_grace_periods_total{waited_by=\"writer\"} 3"), "{text}");
        assert!(line("topology_agent_grace_periods_total{waited_by=\"background\"} 6"), "{text}");
    }
}
