//! `topology-agent run`: wires a source, the controller, the dataplane and the HTTP surface, and
//! runs them until the shutdown token is cancelled (SIGTERM). The kernel state stays in place.

use std::{net::SocketAddr, path::PathBuf, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

mod chores;

use chores::{leave_the_api_service, read_kernel_log, release_memory_after_sync, start_sweeper};
use topology_dataplane::{
    Dataplane, DataplaneConfig, DataplaneError, DnsBeat, LoadOptions,
    mounts::{self, MountError},
};
use topology_dns::{DnsConfig, DnsError, DnsPublisher};
use topology_kube::{
    EventSender,
    events::{KubeEvents, LogOnly, ProblemSink},
    file::{FileSource, FileSourceError},
    watch::{KubeSource, KubeSourceError},
};
use topology_policy::plan::steering::Steering;

use crate::{
    caps::{self, Capability, CapabilityError},
    controller::{Controller, ControllerConfig, ControllerError, Health, PlanClient},
    http,
    metrics::Metrics,
    sockets::{TerminateConfig, TerminateSockets, Terminator},
};

/// Where the cluster comes from.
#[derive(Clone, Debug)]
pub enum SourceConfig {
    /// A YAML file of Nodes, Services and EndpointSlices, re-read on change.
    File(PathBuf),
    /// The Kubernetes API: `--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`, else in-cluster.
    Kubernetes {
        /// Explicit kubeconfig.
        kubeconfig: Option<PathBuf>,
    },
}

/// Everything `run` needs, validated once at start.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// The source.
    pub source: SourceConfig,
    /// This node's name.
    pub node: String,
    /// cgroup v2 directory to attach to; `None`: the cgroup v2 root from /proc/self/mountinfo.
    pub cgroup: Option<PathBuf>,
    /// Pin directory.
    pub pin_path: PathBuf,
    /// Address of /healthz, /readyz and /metrics.
    pub metrics_addr: SocketAddr,
    /// Address of /healthz and /readyz alone, for kubelet's probes (`None`: none).
    pub probe_addr: Option<SocketAddr>,
    /// The programs stop rewriting this long after the agent last had a current view
    /// (`None`: never).
    pub fail_open_after: Option<Duration>,
    /// What the programs are loaded with (`--capacity`, `--kernel-log`, `--index-ordering`,
    /// `--load-signal`, which also says which ports' connections are measured,
    /// `--outlier-ejection`, `--byte-accounting`).
    pub programs: LoadOptions,
    /// Service ports and backends with /metrics series of their own (`--metrics-max-*`).
    pub metrics_caps: crate::metrics::SeriesCaps,
    /// Which sockets are destroyed when their backend leaves a set.
    pub terminate: TerminateSockets,
    /// Directories of network namespace files searched for such sockets.
    pub netns_dirs: Vec<PathBuf>,
    /// The node-local DNS responder (`None`: off).
    pub dns: Option<DnsConfig>,
}

/// Why `run` stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// No node name was given.
    #[error("--node (or NODE_NAME) is empty")]
    EmptyNode,
    /// A capability the configuration needs is missing.
    #[error(transparent)]
    Capability(#[from] CapabilityError),
    /// The cgroup v2 mount could not be found.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// The kernel is older than the programs need.
    #[error(transparent)]
    Kernel(#[from] crate::kernel_version::KernelError),
    /// The dataplane could not be opened.
    #[error(transparent)]
    Dataplane(#[from] DataplaneError),
    /// The metrics address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// The cluster file is unusable at start.
    #[error(transparent)]
    File(#[from] FileSourceError),
    /// The Kubernetes client could not be built.
    #[error(transparent)]
    Kube(#[from] KubeSourceError),
    /// The DNS responder could not start.
    #[error(transparent)]
    Dns(#[from] DnsError),
    /// The controller stopped on an error.
    #[error(transparent)]
    Controller(#[from] ControllerError),
}

impl RunConfig {
    /// Checks what can be checked before touching the kernel.
    pub fn validate(&self) -> Result<(), RunError> {
        if self.node.trim().is_empty() {
            return Err(RunError::EmptyNode);
        }
        if let Some(dns) = &self.dns
            && dns.steer.is_some()
            && (dns.listen.ip().is_unspecified() || dns.listen.ip().is_loopback())
        {
            return Err(DnsError::SteerAddress(dns.listen).into());
        }
        Ok(self.programs.capacities.validate()?)
    }

    /// The capabilities this configuration needs, and what for.
    pub fn capabilities(&self) -> Vec<(Capability, &'static str)> {
        let mut needed = vec![
            (Capability::Bpf, "needed to load the programs and create and pin their maps"),
            (Capability::NetAdmin, "needed to attach the programs to the cgroup and to end sockets"),
            (
                Capability::Perfmon,
                "needed for the verifier to accept the programs (without it they are checked as an unprivileged \
                 user's, whose restrictions they do not meet) and to load the socket iterator",
            ),
        ];
        if self.terminate != TerminateSockets::Off {
            needed.push((
                Capability::SysAdmin,
                "needed to enter pods' network namespaces and end sockets whose backend left (or run with \
                 --terminate-sockets off)",
            ));
        }
        if self.dns.as_ref().is_some_and(|dns| (1..unprivileged_port_start()).contains(&dns.listen.port())) {
            needed.push((
                Capability::NetBindService,
                "needed to serve DNS on a port below net.ipv4.ip_unprivileged_port_start (--dns-listen)",
            ));
        }
        needed
    }
}

/// The lowest port any process may bind (`net.ipv4.ip_unprivileged_port_start`, 1024 when unreadable).
fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(1024)
}

/// Runs the agent until `shutdown` is cancelled or the controller fails.
pub async fn run(config: RunConfig, shutdown: CancellationToken) -> Result<(), RunError> {
    config.validate()?;
    caps::check(caps::effective()?, &config.capabilities())?;
    crate::kernel_version::check()?;
    let cgroup = match &config.cgroup {
        Some(cgroup) => mounts::cgroup2_at(cgroup)?,
        None => mounts::cgroup2_root()?,
    };
    let dataplane_config = DataplaneConfig {
        pin_path: config.pin_path.clone(),
        cgroup: cgroup.clone(),
        fail_open_after: config.fail_open_after,
        programs: config.programs,
    };
    let mut dataplane = tokio::task::block_in_place(|| Dataplane::open(&dataplane_config))?;
    tracing::info!(
        node = %config.node,
        cgroup = %cgroup.display(),
        pin_path = %config.pin_path.display(),
        adopted = dataplane.kernel().services.len(),
        object = dataplane.flavour().object,
        index = dataplane.flavour().index,
        "programs attached; the pinned state is kept until the first complete view"
    );
    leave_the_api_service(&mut dataplane);
    if let Some(logger) = dataplane.take_logger() {
        tokio::spawn(read_kernel_log(logger, shutdown.clone()));
    }

    let health = Arc::new(Health::with_stale_grace(crate::controller::WATCH_STALE_GRACE));
    let metrics = Arc::new(Metrics::default());
    metrics.set_caps(config.metrics_caps);
    metrics.control.record_kernel_features(dataplane.features());
    // The scrape reads the kernel counters on its own descriptors, never blocking the controller.
    let counters = dataplane.counter_reader()?;
    metrics.set_kernel_source(move || {
        counters.read().unwrap_or_else(|error| {
            tracing::warn!(%error, "reading the kernel counters");
            Default::default()
        })
    });
    let (plans, plan_queries) = PlanClient::channel();
    let http = serve_http(&config, &health, &metrics, plans, &shutdown).await?;

    let dns = match &config.dns {
        Some(dns_config) => Some(start_dns(dns_config, &dataplane, &metrics, &shutdown)?),
        None => None,
    };
    let (publisher, steering, dns_stopped) = match dns {
        Some(dns) => (Some(dns.publisher), dns.steering, Some(dns.stopped)),
        None => (None, None, None),
    };

    let (events, receiver) = EventSender::channel();
    let mut file_source = None;
    let mut kube_source = None;
    let sink: Box<dyn ProblemSink> = match &config.source {
        SourceConfig::File(path) => {
            file_source = Some(FileSource::start(path, events.clone(), shutdown.clone())?);
            Box::new(LogOnly)
        }
        SourceConfig::Kubernetes { kubeconfig } => {
            let client = topology_kube::watch::client(kubeconfig.as_deref(), topology_kube::watch::Role::Run).await?;
            kube_source = Some(KubeSource::start(&client, Some(&config.node), &events, &shutdown));
            let (sink, _task) = KubeEvents::start(client, &config.node);
            Box::new(sink)
        }
    };
    drop(events);

    let terminator = Terminator::start(
        TerminateConfig {
            mode: config.terminate,
            maps: dataplane.socket_maps(),
            netns_dirs: config.netns_dirs.clone(),
        },
        Arc::clone(&metrics),
    );
    let _sweeper = config
        .programs
        .byte_accounting
        .tcp()
        .then(|| start_sweeper(&dataplane, &config.netns_dirs, &metrics))
        .flatten();
    let controller = Controller::new(
        ControllerConfig {
            one_publisher_per_service: true,
            measured: config.programs.load_signal.into(),
            ..ControllerConfig::new(config.node.clone())
        },
        dataplane,
        Arc::clone(&health),
        Arc::clone(&metrics),
        sink,
    )
    .with_terminator(terminator)
    .with_dns(publisher)
    .with_steering(steering)
    .with_queries(Some(plan_queries));
    tokio::spawn(release_memory_after_sync(Arc::clone(&health), shutdown.clone()));
    let token = shutdown.clone();
    // The controller owns the dataplane and makes blocking syscalls: it gets its own thread.
    let result = tokio::task::spawn_blocking(move || controller.run(&receiver, &token).map(drop))
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()));
    shutdown.cancel();
    if let Some(source) = kube_source {
        source.join().await;
    }
    drop(file_source);
    let _ = http.await;
    if let Some(stopped) = dns_stopped {
        // The steering is off before the responder's sockets close.
        let _ = stopped.await;
    }
    tracing::info!("stopped; the kernel keeps the last programmed state");
    Ok(result?)
}

/// Binds and serves the HTTP listeners: `/metrics` and the probes on `--metrics-addr`; the probes
/// alone on `--probe-addr`; and on the loopback of the agent's network namespace, where `kubectl
/// port-forward` connects and nothing else can, the plan too. The task of the first ends with
/// `shutdown`.
async fn serve_http(
    config: &RunConfig,
    health: &Arc<Health>,
    metrics: &Arc<Metrics>,
    plans: PlanClient,
    shutdown: &CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, RunError> {
    let bind = |addr: SocketAddr| async move {
        let listener = http::bind(addr).await.map_err(|source| RunError::Bind { addr, source })?;
        let bound = listener.local_addr().map_err(|source| RunError::Bind { addr, source })?;
        Ok::<_, RunError>((listener, bound))
    };
    let (listener, bound) = bind(config.metrics_addr).await?;
    let on_loopback = bound.ip().is_loopback();
    let endpoints = http::Endpoints {
        health: Arc::clone(health),
        metrics: Some(Arc::clone(metrics)),
        plans: on_loopback.then(|| plans.clone()),
    };
    tracing::info!(addr = %bound, plan = on_loopback, "serving /healthz, /readyz and /metrics");
    let main = tokio::spawn(http::serve(listener, endpoints.clone(), http::SCRAPE_LIMITS, shutdown.clone()));
    if let Some(addr) = config.probe_addr {
        let (listener, bound) = bind(addr).await?;
        tracing::info!(addr = %bound, "serving /healthz and /readyz for kubelet's probes");
        let probes = http::Endpoints { health: Arc::clone(health), metrics: None, plans: None };
        tokio::spawn(http::serve(listener, probes, http::PROBE_LIMITS, shutdown.clone()));
    }
    if !on_loopback && !bound.ip().is_unspecified() {
        let addr = SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), bound.port());
        match http::bind(addr).await {
            Ok(listener) => {
                tracing::info!(%addr, "serving /debug/plan on the loopback only");
                let endpoints = http::Endpoints { plans: Some(plans), ..endpoints };
                tokio::spawn(http::serve(listener, endpoints, http::SCRAPE_LIMITS, shutdown.clone()));
            }
            Err(error) => {
                tracing::warn!(%addr, %error, "not serving on the loopback: kubectl port-forward will not reach it");
            }
        }
    }
    Ok(main)
}

/// The DNS responder, running.
struct RunningDns {
    /// Where the controller publishes the view the responder answers from.
    publisher: DnsPublisher,
    /// The per-node rule that steers the cluster DNS to it, if any.
    steering: Option<Steering>,
    /// Ends once the steering is off and the sockets are closed, after the shutdown.
    stopped: tokio::task::JoinHandle<()>,
}

/// The steering heartbeat in the kernel, as the DNS prober writes it.
struct KernelHeartbeat(DnsBeat);

impl topology_dns::steer::Heartbeat for KernelHeartbeat {
    type Error = DataplaneError;

    fn refresh(&mut self, responder: SocketAddr, grace: Duration) -> Result<(), DataplaneError> {
        self.0.refresh(responder, grace)
    }

    fn stop(&mut self) -> Result<(), DataplaneError> {
        self.0.stop()
    }
}

/// Starts the DNS responder and, when it steers the cluster DNS, the prober that keeps the
/// steering heartbeat fresh while the responder answers.
fn start_dns(
    config: &DnsConfig,
    dataplane: &Dataplane,
    metrics: &Metrics,
    shutdown: &CancellationToken,
) -> Result<RunningDns, RunError> {
    let (publisher, view) = DnsPublisher::new(config.upstreams.clone());
    let current = publisher.current();
    let sockets = CancellationToken::new();
    let server = topology_dns::start(config, view, Arc::clone(&metrics.dns), sockets.clone())?;
    let addr = server.addr;
    tracing::info!(%addr, domain = %config.domain, "serving DNS over UDP and TCP");
    let steering = config.steer.clone().map(|service| Steering { service, responder: addr });
    let beat = match &steering {
        Some(_) => Some(KernelHeartbeat(dataplane.dns_beat()?)),
        None => None,
    };
    let (domain, shutdown) = (config.domain.clone(), shutdown.clone());
    let stopped = tokio::spawn(async move {
        match beat {
            Some(beat) => topology_dns::steer::keep_steering(beat, addr, domain, current, shutdown).await,
            None => shutdown.cancelled().await,
        }
        sockets.cancel();
        drop(server);
    });
    Ok(RunningDns { publisher, steering, stopped })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(listen: &str, steer: bool) -> RunConfig {
        RunConfig {
            source: SourceConfig::File("cluster.yaml".into()),
            node: "node-a".into(),
            cgroup: None,
            pin_path: "/sys/fs/bpf/topology".into(),
            metrics_addr: "127.0.0.1:9464".parse().unwrap(),
            probe_addr: None,
            fail_open_after: None,
            programs: LoadOptions::default(),
            metrics_caps: crate::metrics::SeriesCaps::default(),
            terminate: TerminateSockets::Off,
            netns_dirs: Vec::new(),
            dns: Some(DnsConfig {
                listen: listen.parse().unwrap(),
                domain: topology_dns::parse_domain("cluster.local").unwrap(),
                ttl: topology_dns::DEFAULT_TTL,
                upstreams: Vec::new(),
                per_source_qps: 0,
                steer: steer.then(|| topology_model::ObjectKey::new("kube-system", "kube-dns")),
                cache_mib: topology_dns::relay_cache::DEFAULT_MIB,
                cache_max_ttl: topology_dns::relay_cache::DEFAULT_MAX_TTL,
                cache_max_negative_ttl: topology_dns::relay_cache::DEFAULT_MAX_NEGATIVE_TTL,
                clients: topology_dns::clients::Clients::Any,
            }),
        }
    }

    #[test]
    fn steering_needs_an_address_every_pod_reaches() {
        for listen in ["0.0.0.0:5353", "127.0.0.1:5353", "[::1]:5353"] {
            let error = config(listen, true).validate().unwrap_err().to_string();
            assert!(error.starts_with(&format!("--dns-listen {listen}: steering the cluster DNS needs")), "{error}");
        }
        assert!(config("127.0.0.1:5353", false).validate().is_ok(), "serving without steering may use loopback");
        assert!(config("10.0.0.5:5353", true).validate().is_ok());
    }

    #[test]
    fn only_a_privileged_dns_port_needs_net_bind_service() {
        let needs = |listen: &str| {
            config(listen, false).capabilities().iter().any(|(capability, _)| *capability == Capability::NetBindService)
        };
        // As this host's net.ipv4.ip_unprivileged_port_start says (1024 unless lowered).
        assert_eq!(needs("10.0.0.5:53"), unprivileged_port_start() > 53);
        assert_eq!(needs("10.0.0.5:5353"), unprivileged_port_start() > 5353);
        assert!(!needs("10.0.0.5:0"), "an ephemeral port is never privileged");
    }
}
