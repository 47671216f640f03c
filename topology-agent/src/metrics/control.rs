//! The control loop's own metrics, declared once: how long syncs take, what the kernel holds,
//! the objects skipped, whether the view is current.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
};
use topology_dataplane::{Epochs, KernelFeatures};

use super::{KindLabels, MapLabels, NodeLabels, ReasonLabels};

/// A bucket bound of `topology_agent_event_to_kernel_seconds`: 10 ms.
pub const EVENT_TO_KERNEL_TARGET_S: f64 = 0.01;

topology_metrics::metrics! {
    /// The control loop's metrics.
    pub struct LoopMetrics;
    exported {
        // 100 us .. ~26 s: from one slice update to a full sync of a large cluster.
        pub sync_duration: Histogram = Histogram::new(exponential_buckets(1e-4, 2.0, 19)),
            "sync_duration_seconds",
            "Time to recompute the affected services and write the kernel, per batch of events";
        // The same, with a bound at 10 ms, the target an SLO on event-to-kernel latency names.
        pub event_to_kernel: Histogram = {
            let mut bounds: Vec<f64> = exponential_buckets(1e-4, 2.0, 19).collect();
            bounds.push(EVENT_TO_KERNEL_TARGET_S);
            bounds.sort_by(f64::total_cmp);
            Histogram::new(bounds)
        },
            "event_to_kernel_seconds",
            "Time from receiving the oldest event of a batch to its effect being in the kernel maps";
        // 1 ms .. ~262 s: a change's stamp is taken before the API server stored it.
        pub network_programming: Histogram = Histogram::new(exponential_buckets(1e-3, 2.0, 19)),
            "network_programming_duration_seconds",
            "Time from an EndpointSlice change (its endpoints.kubernetes.io/last-change-trigger-time) to the kernel \
             maps holding it, as kube-proxy's kubeproxy_network_programming_duration_seconds; changes seen before \
             the first sync are not counted";
        pub services_recomputed: Counter = Default::default(),
            "services_recomputed",
            "Services decided again (their policy run), by any cause: a change that touches no Service's routing \
             (a Node heartbeat, an unrelated label) adds nothing";
        pub services: Gauge = Default::default(),
            "services_programmed",
            "Service ports (ClusterIP, port, protocol) in the kernel";
        pub backends: Gauge = Default::default(),
            "backends_programmed",
            "Backends in the kernel, over all service ports";
        pub map_entries: Family<MapLabels, Gauge> = Default::default(),
            "map_entries",
            "Entries in use per BPF map";
        pub map_capacity: Family<MapLabels, Gauge> = Default::default(),
            "map_capacity",
            "Capacity (max_entries) per BPF map";
        pub skipped_total: Family<KindLabels, Counter> = Default::default(),
            "skipped_objects",
            "Objects skipped because they cannot be used";
        pub skipped: Family<KindLabels, Gauge> = Default::default(),
            "skipped_objects_current",
            "Objects skipped now (their last good version is used)";
        // At 0 from the start: a series that first appears at 1 shows no increase() to alert on.
        pub apply_failures: Family<ReasonLabels, Counter> = {
            let family = Family::default();
            for reason in ["MapFull", "InvalidService", "KernelWriteFailed"] {
                drop(family.get_or_create(&ReasonLabels { reason: reason.into() }));
            }
            family
        },
            "apply_failures",
            "Service ports that could not be programmed into the kernel";
        pub failed_service_ports: Gauge = Default::default(),
            "failed_service_ports",
            "Service ports not programmed now because writing them failed (they hold nothing: kube-proxy routes them)";
        // At 0 from the start, as apply_failures.
        pub grace_periods: Family<WaitedLabels, Counter> = {
            let family = Family::default();
            for waited_by in ["writer", "background"] {
                drop(family.get_or_create(&WaitedLabels { waited_by }));
            }
            family
        },
            "grace_periods",
            "RCU grace periods passed before reusing what a running program may still read (retired slot runs, \
             service index positions rewritten often), by who waited: the control loop itself (each stalls it \
             10-30 ms) or the helper thread";
        pub view_current: Gauge = Default::default(),
            "view_current",
            "1 while the kernel holds the policy of a complete, current view of the cluster (no watch stale, every \
             kind listed, this Node known), else 0";
        pub node_info: Family<NodeLabels, Gauge> = Default::default(),
            "node_info",
            "This agent's node and its zone and region (always 1)";
        pub kernel_features: Family<FeatureLabels, Gauge> = Default::default(),
            "kernel_feature",
            "The optional programs this node's kernel runs, by feature: 1 where they are attached, 0 where a flag \
             leaves them off or the kernel lacks what they need (outlier_ejection: Linux 5.15; udp_accounting: 6.3; \
             the log at start names the program the kernel refused)";
    }
    nested {}
    own {}
}

/// Labels of a grace period.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitedLabels {
    /// `writer` (the control loop) or `background` (the helper thread).
    pub waited_by: &'static str,
}

/// Labels of an optional kernel feature.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FeatureLabels {
    /// `index`, `outlier_ejection`, `connection_end`, `udp_accounting`.
    pub feature: &'static str,
}

impl LoopMetrics {
    /// Counts the grace periods `epochs` holds (the dataplane's totals since open).
    pub fn record_grace_periods(&self, epochs: Epochs) {
        let background = epochs.passed.saturating_sub(epochs.waited);
        for (waited_by, total) in [("writer", epochs.waited), ("background", background)] {
            let counter = self.grace_periods.get_or_create(&WaitedLabels { waited_by });
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// Says which optional programs the kernel runs.
    pub fn record_kernel_features(&self, features: KernelFeatures) {
        for (feature, on) in [
            ("index", features.index),
            ("outlier_ejection", features.outlier_ejection),
            ("connection_end", features.connection_end),
            ("udp_accounting", features.udp_accounting),
        ] {
            self.kernel_features.get_or_create(&FeatureLabels { feature }).set(i64::from(on));
        }
    }
}
