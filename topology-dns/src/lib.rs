//! topology-dns: topology-aware DNS from a node-local responder: headless Services answered with the endpoints
//! this node's policy chooses (the same engine and modes as ClusterIP traffic), the cluster
//! domain's other names as CoreDNS answers them, everything else relayed to the upstream.
//!
//! Data flow: the controller updates a [`DnsView`] one Service at a time as it recomputes them
//! and publishes it after each batch; the sockets read the latest one per query, without a lock
//! and without ever blocking the control loop.

pub mod answer;
mod cache;
pub mod clients;
pub mod connections;
pub mod glance;
mod in_flight;
mod limit;
mod metrics;
pub mod names;
pub mod relay;
pub mod relay_cache;
pub mod server;
pub mod steer;
pub mod upstream;
pub mod view;

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::Ordering},
};

use hickory_proto::rr::Name;
pub use metrics::{DnsMetrics, LocalityLabels, QueryLabels};
use tokio::{
    net::{TcpListener, UdpSocket},
    sync::watch,
};
use tokio_util::sync::CancellationToken;
// The pipeline's vocabulary, under the names the modules here were written with.
pub use view::DnsView;

/// Fixtures of the fuzz targets and tests downstream.
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzzing {
    /// The cluster the DNS target answers from: headless Services in several modes (one under
    /// spillover: zone `za` has most of the demand and a third of the endpoints, so node `a`'s
    /// answers are drawn by weight), dual-stack, and a ClusterIP Service.
    pub const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: a, labels: {topology.kubernetes.io/zone: za}}, status: {allocatable: {cpu: "8"}, conditions: [{type: Ready, status: "True"}]}}
- {apiVersion: v1, kind: Node, metadata: {name: b, labels: {topology.kubernetes.io/zone: zb}}, status: {allocatable: {cpu: "2"}, conditions: [{type: Ready, status: "True"}]}}
- {apiVersion: v1, kind: Service, metadata: {name: db, namespace: default}, spec: {clusterIP: None, trafficDistribution: PreferClose, ports: [{name: pg, port: 5432}]}}
- {apiVersion: v1, kind: Service, metadata: {name: spill, namespace: default, annotations: {topology-agent.io/spillover: capacity}}, spec: {clusterIP: None, ports: [{name: http, port: 80}]}}
- {apiVersion: v1, kind: Service, metadata: {name: web, namespace: default}, spec: {clusterIPs: [10.96.0.10, "fd00::10"], ports: [{name: http, port: 80}, {name: dns, port: 53, protocol: UDP}]}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: db-1, namespace: default, labels: {kubernetes.io/service-name: db}}
  addressType: IPv4
  ports: [{name: pg, port: 5432}]
  endpoints:
  - {addresses: [10.1.0.1], hostname: db-0, nodeName: a, zone: za}
  - {addresses: [10.1.0.2], hostname: db-1, nodeName: b, zone: zb}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: db-6, namespace: default, labels: {kubernetes.io/service-name: db}}
  addressType: IPv6
  ports: [{name: pg, port: 5432}]
  endpoints:
  - {addresses: ["fd00::1:1"], nodeName: a, zone: za}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: spill-1, namespace: default, labels: {kubernetes.io/service-name: spill}}
  addressType: IPv4
  ports: [{name: http, port: 8080}]
  endpoints:
  - {addresses: [10.2.0.1], nodeName: a, zone: za}
  - {addresses: [10.2.0.2], nodeName: b, zone: zb}
  - {addresses: [10.2.0.3], nodeName: b, zone: zb}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: http, port: 8080}]
  endpoints:
  - {addresses: [10.3.0.1], nodeName: a}
"#;
}

/// CoreDNS's default TTL for cluster names.
pub const DEFAULT_TTL: u32 = 5;
/// Queries per second one source address may send.
pub const DEFAULT_SOURCE_QPS: u32 = 10_000;

/// The responder's flags (`run --dns-listen …` and friends), declared here once: the agent
/// flattens them into `run` and `explain`. The responder is on when `--dns-listen` is given; any
/// other of its flags without it is an error naming `--dns-listen`.
#[derive(Clone, Debug, clap::Args)]
#[group(requires = "listen")]
pub struct DnsConfig {
    /// Serve DNS over UDP and TCP on this address (off when absent): headless Services answered
    /// with the endpoints this node's policy chooses, other names relayed to the upstream.
    #[arg(long = "dns-listen", required = false, value_name = "ADDR", value_parser = topology_model::listen::parse_listen)]
    pub listen: SocketAddr,
    /// The cluster domain the responder answers for.
    #[arg(long = "cluster-domain", default_value = "cluster.local", value_parser = parse_domain)]
    pub domain: Name,
    /// TTL of the responder's answers, seconds.
    #[arg(long = "dns-ttl", default_value_t = DEFAULT_TTL)]
    pub ttl: u32,
    /// Where names outside the cluster's Services go, `IP` or `IP:PORT` (default: the ready
    /// endpoints of kube-system/kube-dns, dialled directly).
    #[arg(long = "dns-upstream", value_delimiter = ',', value_name = "ADDR[,ADDR]", value_parser = parse_upstream)]
    pub upstreams: Vec<SocketAddr>,
    /// Queries per second one client address may send to the responder (0: no limit).
    #[arg(long = "dns-source-qps", default_value_t = DEFAULT_SOURCE_QPS)]
    pub per_source_qps: u32,
    /// The cluster DNS Service whose port 53 this node steers to the responder while it answers
    /// (`NAMESPACE/NAME`), or `off`.
    #[arg(long = "dns-steer", default_value = "kube-system/kube-dns", value_name = "NAMESPACE/NAME|off", value_parser = parse_steer)]
    pub steer: ::std::option::Option<topology_model::ObjectKey>,
    /// Memory for relayed answers the responder keeps, MiB (0: none kept).
    #[arg(long = "dns-cache-mib", value_name = "MIB", default_value_t = relay_cache::DEFAULT_MIB)]
    pub cache_mib: usize,
    /// The longest a relayed answer is kept, seconds, whatever its TTL.
    #[arg(long = "dns-cache-max-ttl", value_name = "SECONDS", default_value_t = relay_cache::DEFAULT_MAX_TTL)]
    pub cache_max_ttl: u32,
    /// The longest a relayed negative answer (NXDOMAIN, NODATA) is kept, seconds.
    #[arg(
        long = "dns-cache-max-negative-ttl",
        value_name = "SECONDS",
        default_value_t = relay_cache::DEFAULT_MAX_NEGATIVE_TTL
    )]
    pub cache_max_negative_ttl: u32,
    /// Whose queries the responder answers: `node` (this node's pods and processes: its Node's pod
    /// CIDRs and addresses; everyone where the Node lists no pod CIDRs) or `any`. Others get
    /// REFUSED.
    #[arg(long = "dns-clients", default_value = "any", value_name = "node|any")]
    pub clients: clients::Clients,
}

impl DnsConfig {
    /// How relayed answers are kept, as the `--dns-cache-*` flags say. (Flags of their own
    /// rather than a nested group: clap cannot tell an optional group with a nested one apart
    /// from an absent one.)
    pub fn cache(&self) -> relay_cache::CacheSettings {
        relay_cache::CacheSettings {
            max_bytes: self.cache_mib.saturating_mul(1 << 20),
            max_ttl: self.cache_max_ttl,
            max_negative_ttl: self.cache_max_negative_ttl,
            ..relay_cache::CacheSettings::default()
        }
    }
}

/// `--dns-steer`: a Service (`NAMESPACE/NAME`), or `off`.
pub fn parse_steer(value: &str) -> Result<Option<topology_model::ObjectKey>, String> {
    match value {
        "off" => Ok(None),
        service => service.parse().map(Some).map_err(|error| format!("{error}")),
    }
}

/// A `--dns-upstream` entry that is no address.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is neither IP nor IP:PORT")]
pub struct NotAnUpstream(String);

/// A `--dns-upstream` entry: `IP:PORT`, or `IP` for port 53.
pub fn parse_upstream(text: &str) -> Result<SocketAddr, NotAnUpstream> {
    text.parse::<SocketAddr>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| NotAnUpstream(text.to_owned()))
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
    /// The responder's threads could not be started.
    #[error("starting the DNS responder's threads: {0}")]
    Threads(std::io::Error),
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

/// How long the control loop's word that the view is current holds: a loop that has not said it
/// again within this (frozen, or stuck in a sync longer than any full sync at Kubernetes'
/// limits) stops the steering, so pods are not sent to answers from a view that no longer moves.
pub const CURRENT_FOR: std::time::Duration = std::time::Duration::from_secs(5);

/// Whether the published view comes from a complete, current view of the cluster: the responder
/// is steered to only while it does (an empty view would answer NXDOMAIN for every name), and
/// only while the control loop keeps saying so ([`CURRENT_FOR`]).
#[derive(Clone, Debug)]
pub struct ViewCurrent {
    epoch: std::time::Instant,
    /// When the loop last said the view is current, milliseconds after `epoch` plus one; 0: it
    /// said it is not.
    said: Arc<std::sync::atomic::AtomicU64>,
}

impl Default for ViewCurrent {
    fn default() -> Self {
        Self { epoch: std::time::Instant::now(), said: Arc::default() }
    }
}

impl ViewCurrent {
    /// True while the published view is of a complete, current view of the cluster, said so
    /// within [`CURRENT_FOR`].
    pub fn get(&self) -> bool {
        self.get_at(std::time::Instant::now())
    }

    fn get_at(&self, now: std::time::Instant) -> bool {
        match self.said.load(Ordering::Acquire) {
            0 => false,
            said => {
                let age = now.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
                age.saturating_sub(said) <= CURRENT_FOR.as_millis() as u64
            }
        }
    }

    fn set(&self, current: bool) {
        let at = if current { self.epoch.elapsed().as_millis() as u64 + 1 } else { 0 };
        self.said.store(at, Ordering::Release);
    }
}

/// The controller's side: keeps the view current and publishes it.
#[derive(Debug)]
pub struct DnsPublisher {
    view: DnsView,
    changed: bool,
    sender: watch::Sender<Arc<DnsView>>,
    current: ViewCurrent,
}

impl DnsPublisher {
    /// A publisher of views with `upstreams` configured, and the receiver the sockets read.
    pub fn new(upstreams: Vec<SocketAddr>) -> (Self, watch::Receiver<Arc<DnsView>>) {
        let view = DnsView::new(upstreams);
        let (sender, receiver) = watch::channel(Arc::new(view.clone()));
        (Self { view, changed: false, sender, current: ViewCurrent::default() }, receiver)
    }

    /// Whether what was last published is of a complete, current view, as the prober reads it.
    pub fn current(&self) -> ViewCurrent {
        self.current.clone()
    }

    /// Says whether what was last published is of a complete, current view of the cluster.
    pub fn set_current(&self, current: bool) {
        self.current.set(current);
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

/// The running responder: its own threads and runtime, stopped on drop.
pub struct DnsServer {
    runtime: Option<tokio::runtime::Runtime>,
    /// Where it serves, UDP and TCP.
    pub addr: SocketAddr,
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Binds UDP and TCP on `config.listen` and serves until `shutdown`, on threads of its own, so
/// that queries never wait on the control loop nor it on them. They run at the priority of the
/// pods they answer, as CoreDNS and NodeLocal DNSCache do: below it (nice 5, as they once ran)
/// a pod's lookups waited behind its own CPU use — with dnsperf on the responder's CPU, a cold
/// start of relayed names had a p99 of 3.1–15.6 ms against 1.4–2.3 ms — while the control loop
/// beside a query storm gained a few tenths of a millisecond. UDP is served by one socket
/// per CPU (`SO_REUSEPORT`: the kernel spreads the clients over them), so answering scales with
/// the cores.
pub fn start(
    config: &DnsConfig,
    view: watch::Receiver<Arc<DnsView>>,
    metrics: Arc<DnsMetrics>,
    shutdown: CancellationToken,
) -> Result<DnsServer, DnsError> {
    let addr = config.listen;
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .thread_name("dns")
        .enable_all()
        .build()
        .map_err(DnsError::Threads)?;
    let entered = runtime.enter();
    let udp_error = |source| DnsError::Bind { addr, protocol: "UDP", source };
    let buffer = (RECEIVE_BUFFERS / threads).clamp(RECEIVE_BUFFER.1, RECEIVE_BUFFER.0);
    let first = reuse_port_udp(addr, buffer).map_err(udp_error)?;
    let bound = first.local_addr().map_err(udp_error)?;
    let mut sockets = vec![first];
    // The others on the port the first got (an ephemeral port is chosen once, for all).
    for _ in 1..threads {
        sockets.push(reuse_port_udp(bound, buffer).map_err(udp_error)?);
    }
    let tcp_error = |source| DnsError::Bind { addr, protocol: "TCP", source };
    let tcp = std::net::TcpListener::bind(bound).map_err(tcp_error)?;
    tcp.set_nonblocking(true).map_err(tcp_error)?;
    let tcp = TcpListener::from_std(tcp).map_err(tcp_error)?;
    let zone = answer::Zone { domain: config.domain.clone(), ttl: config.ttl };
    let admission = clients::Admission { clients: config.clients, own: bound.ip() };
    let responder =
        Arc::new(server::Responder::new(zone, view, metrics, config.per_source_qps, config.cache(), admission));
    for socket in sockets {
        runtime.spawn(server::serve_udp(Arc::new(socket), Arc::clone(&responder), shutdown.clone()));
    }
    runtime.spawn(server::serve_tcp(tcp, responder, shutdown));
    drop(entered);
    Ok(DnsServer { runtime: Some(runtime), addr: bound })
}

/// Receive buffers of the UDP sockets together: a burst of about 20,000 queries waits in the kernel
/// instead of being dropped while a thread is preempted. Shared by the sockets (one per CPU), since
/// socket memory is charged to the pod's memory limit: a 64-CPU node's flood must not take 256 MiB.
const RECEIVE_BUFFERS: usize = 8 << 20;
/// Receive buffer of one UDP socket at most, and at least.
const RECEIVE_BUFFER: (usize, usize) = (4 << 20, 256 << 10);

/// A non-blocking UDP socket bound to `addr` with `SO_REUSEPORT` and a receive buffer of `buffer`
/// bytes (`SO_RCVBUFFORCE`, which CAP_NET_ADMIN allows beyond `net.core.rmem_max`; else as much as
/// `SO_RCVBUF` gives).
fn reuse_port_udp(addr: SocketAddr, buffer: usize) -> std::io::Result<UdpSocket> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), socket2::Type::DGRAM, None)?;
    socket.set_reuse_port(true)?;
    if force_receive_buffer(&socket, buffer).is_err() {
        socket.set_recv_buffer_size(buffer)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

fn force_receive_buffer(socket: &socket2::Socket, buffer: usize) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let size = libc::c_int::try_from(buffer).unwrap_or(libc::c_int::MAX);
    // SAFETY: a valid socket descriptor and a c_int option value of the size passed.
    let result = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            (&raw const size).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if result == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }
}

#[cfg(test)]
mod conformance;
#[cfg(test)]
mod tests;
