//! Topology-aware DNS from a node-local responder: headless Services answered with the endpoints
//! this node's policy chooses (the same engine and modes as ClusterIP traffic), the cluster
//! domain's other names as CoreDNS answers them, everything else relayed to the upstream.
//!
//! Data flow: the controller updates a [`DnsView`] one Service at a time as it recomputes them
//! and publishes it after each batch; the sockets read the latest one per query, without a lock
//! and without ever blocking the control loop.

pub mod answer;
pub mod explain;
mod limit;
pub mod names;
pub mod server;
pub mod steer;
pub mod view;

use std::{net::SocketAddr, sync::Arc};

use hickory_proto::rr::Name;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};
use tokio::{
    net::{TcpListener, UdpSocket},
    sync::watch,
};
use tokio_util::sync::CancellationToken;
pub use view::DnsView;

use crate::desired::Locality;

/// CoreDNS's default TTL for cluster names.
pub const DEFAULT_TTL: u32 = 5;
/// Queries per second one source address may send.
pub const DEFAULT_SOURCE_QPS: u32 = 10_000;

/// `run --dns-listen …` and friends.
#[derive(Clone, Debug)]
pub struct DnsConfig {
    /// Where to serve, UDP and TCP.
    pub listen: SocketAddr,
    /// The cluster domain (`cluster.local`).
    pub domain: Name,
    /// TTL of the answers.
    pub ttl: u32,
    /// Upstreams; empty: the ready endpoints of `kube-system/kube-dns`.
    pub upstreams: Vec<SocketAddr>,
    /// Queries per second per source address; 0: unlimited.
    pub per_source_qps: u32,
    /// The cluster DNS Service whose port 53 this node steers to the responder (`None`: none).
    pub steer: Option<crate::cluster::ObjectKey>,
}

/// The responder could not start.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The cluster domain is not a domain name.
    #[error("--cluster-domain {domain:?}: {reason}")]
    Domain {
        /// As given.
        domain: String,
        /// Why.
        reason: String,
    },
    /// Steering needs an address pods can reach.
    #[error(
        "--dns-listen {0}: steering the cluster DNS needs an address every pod of the node reaches (the pod IP of \
         the DaemonSet), not a loopback or unspecified one; or run with --dns-steer off"
    )]
    SteerAddress(SocketAddr),
    /// The steering heartbeat could not be opened.
    #[error("steering the cluster DNS: {0}")]
    Beat(#[from] crate::dataplane::DataplaneError),
    /// A socket could not be bound.
    #[error("--dns-listen {addr}: binding {protocol}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// `UDP` or `TCP`.
        protocol: &'static str,
        /// The error.
        source: std::io::Error,
    },
}

/// Parses `--cluster-domain`, naming the flag when it is not a domain.
pub fn parse_domain(domain: &str) -> Result<Name, DnsError> {
    let error = |reason: String| DnsError::Domain { domain: domain.to_owned(), reason };
    let trimmed = domain.trim_end_matches('.');
    if trimmed.is_empty() {
        return Err(error("empty".into()));
    }
    let mut name = Name::from_ascii(trimmed).map_err(|e| error(e.to_string()))?;
    name.set_fqdn(true);
    Ok(name.to_lowercase())
}

/// Labels of a query.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    /// Query type (`A`, `AAAA`, `SRV`, …).
    pub r#type: String,
    /// `answer`, `nodata`, `nxdomain`, `forwarded`, `upstream_failed`, `overloaded`,
    /// `rate_limited`, `malformed`, `error`.
    pub outcome: String,
}

/// Labels of an answered endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LocalityLabels {
    /// `node`, `zone`, `region`, `other`.
    pub locality: String,
}

/// The responder's metrics.
#[derive(Debug)]
pub struct DnsMetrics {
    queries: Family<QueryLabels, Counter>,
    answers: Family<LocalityLabels, Counter>,
    /// Seconds for the upstream to answer a relayed query.
    pub upstream_seconds: Histogram,
}

impl Default for DnsMetrics {
    fn default() -> Self {
        Self {
            queries: Family::default(),
            answers: Family::default(),
            // 100 us .. ~3 s.
            upstream_seconds: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(1e-4, 2.0, 15)),
        }
    }
}

impl DnsMetrics {
    /// Registers every metric under `registry`.
    pub fn register(&self, registry: &mut Registry) {
        registry.register("dns_queries", "DNS queries, by type and outcome", self.queries.clone());
        registry.register(
            "dns_answered_endpoints",
            "Headless-Service endpoints in DNS answers, by locality relative to this node",
            self.answers.clone(),
        );
        registry.register(
            "dns_upstream_seconds",
            "Time for the upstream to answer a relayed query",
            self.upstream_seconds.clone(),
        );
    }

    fn query(&self, r#type: &str, outcome: &str) {
        self.queries.get_or_create(&QueryLabels { r#type: r#type.into(), outcome: outcome.into() }).inc();
    }

    fn answered(&self, locality: Locality) {
        self.answers.get_or_create(&LocalityLabels { locality: locality.as_str().into() }).inc();
    }
}

/// The controller's side: keeps the view current and publishes it.
#[derive(Debug)]
pub struct DnsPublisher {
    view: DnsView,
    changed: bool,
    sender: watch::Sender<Arc<DnsView>>,
}

impl DnsPublisher {
    /// A publisher of views with `upstreams` configured, and the receiver the sockets read.
    pub fn new(upstreams: Vec<SocketAddr>) -> (Self, watch::Receiver<Arc<DnsView>>) {
        let view = DnsView::new(upstreams);
        let (sender, receiver) = watch::channel(Arc::new(view.clone()));
        (Self { view, changed: false, sender }, receiver)
    }

    /// The working view, to update one Service at a time.
    pub fn view_mut(&mut self) -> &mut DnsView {
        &mut self.view
    }

    /// Marks the working view as changed.
    pub fn touch(&mut self, changed: bool) {
        self.changed |= changed;
    }

    /// Publishes the working view if it changed since the last publish.
    pub fn publish(&mut self) {
        if std::mem::take(&mut self.changed) {
            self.sender.send_replace(Arc::new(self.view.clone()));
        }
    }
}

/// Binds UDP and TCP on `config.listen` and serves until `shutdown`.
pub async fn start(
    config: &DnsConfig,
    view: watch::Receiver<Arc<DnsView>>,
    metrics: Arc<DnsMetrics>,
    shutdown: CancellationToken,
) -> Result<SocketAddr, DnsError> {
    let addr = config.listen;
    let udp = UdpSocket::bind(addr).await.map_err(|source| DnsError::Bind { addr, protocol: "UDP", source })?;
    let bound = udp.local_addr().map_err(|source| DnsError::Bind { addr, protocol: "UDP", source })?;
    // TCP on the port UDP got (an ephemeral port is chosen once, for both).
    let tcp = TcpListener::bind(bound).await.map_err(|source| DnsError::Bind { addr, protocol: "TCP", source })?;
    let zone = answer::Zone { domain: config.domain.clone(), ttl: config.ttl };
    let responder = Arc::new(server::Responder::new(zone, view, metrics, config.per_source_qps));
    tokio::spawn(server::serve_udp(Arc::new(udp), Arc::clone(&responder), shutdown.clone()));
    tokio::spawn(server::serve_tcp(tcp, responder, shutdown));
    Ok(bound)
}

#[cfg(test)]
mod tests;
