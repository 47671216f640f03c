//! Socket termination's metrics and the sweep of the open connections' bytes, declared once.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
};

/// Labels of a transport protocol.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    /// `TCP`, `UDP`, `SCTP`.
    pub protocol: String,
}

topology_metrics::metrics! {
    /// Socket termination's and the sweep's metrics.
    pub struct SocketMetrics;
    exported {
        pub terminated: Family<ProtocolLabels, Counter> = Default::default(),
            "sockets_terminated",
            "Sockets destroyed because the backend they were connected to through a service left its set";
        pub termination_errors: Counter = Default::default(),
            "socket_termination_errors",
            "Failures to enter a network namespace, dump its sockets or destroy one";
        // 1 ms .. ~16 s.
        pub sweep_seconds: Histogram = Histogram::new(exponential_buckets(1e-3, 2.0, 15)),
            "bytes_sweep_seconds",
            "Time to count the open connections' bytes in every network namespace";
        pub sweep_failures: Counter = Default::default(),
            "bytes_sweep_failures",
            "Network namespaces a sweep of the open connections could not count (gone, or not enterable)";
        pub sweep_interval: Gauge<f64, AtomicU64> = Default::default(),
            "bytes_sweep_interval_seconds",
            "Time between two sweeps of the open connections' bytes: 10 s, or longer where one sweep would take \
             more than 0.5 % of a core (their counts lag by as much)";
    }
    nested {}
    own {}
}
