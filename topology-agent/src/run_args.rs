//! `topology-agent run`'s command line, and its translation into the library's `RunConfig`.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Args;
use topology_agent::{
    agent::{RunConfig, SourceConfig},
    metrics::SeriesCaps,
    sockets::TerminateSockets,
};
use topology_dataplane::{Capacities, CapacityOverride, LoadOptions};
use topology_dns::DnsConfig;
use topology_model::listen;

/// Where the cluster is read from, and for which node: the flags `run` and `explain` share.
#[derive(Args)]
pub struct ClusterArgs {
    /// Cluster objects (Nodes, Services, EndpointSlices) from this file, multi-document YAML or a
    /// List (`run` reads it again when it changes), instead of the Kubernetes API.
    #[arg(long, conflicts_with = "kubeconfig")]
    pub cluster: Option<PathBuf>,
    /// Kubeconfig of the API server (default: `$KUBECONFIG`, else `~/.kube/config`, else the
    /// in-cluster configuration).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// This node's name: the node decided for (the Downward API sets NODE_NAME in the DaemonSet).
    #[arg(long, env = "NODE_NAME")]
    pub node: String,
}

#[derive(Args)]
pub struct RunArgs {
    /// The cluster and this node.
    #[command(flatten)]
    cluster: ClusterArgs,
    /// cgroup v2 directory to attach to (default: the cgroup v2 root from /proc/self/mountinfo).
    #[arg(long)]
    cgroup: Option<PathBuf>,
    /// Directory on bpffs for the pinned maps and links.
    #[arg(long, default_value = topology_dataplane::DEFAULT_PIN_PATH)]
    pin_path: PathBuf,
    /// Address of /healthz, /readyz and /metrics: `IP:PORT`, or `[IP]:PORT` for either family
    /// (`127.0.0.1:0` picks a free port). Default: the pod's IP (`$POD_IP`, from the Downward API)
    /// port 9464, else 127.0.0.1:9464; never every interface unless asked. The plan
    /// (`/debug/plan`) is served on the loopback at the same port only.
    #[arg(long, value_parser = listen::parse_listen)]
    metrics_addr: Option<SocketAddr>,
    /// Service ports with /metrics series of their own (7 each), the most used first; the rest
    /// are summed under `service="other"`. Which ports have series is up to the node's clients
    /// (a port has them once used), so this bounds the scrape whatever a tenant does.
    #[arg(long, default_value_t = topology_agent::metrics::DEFAULT_MAX_PORTS)]
    metrics_max_ports: usize,
    /// Backends of ports under feedback with /metrics series of their own (8 each), the most
    /// connected first; the rest are summed under `backend="other"`.
    #[arg(long, default_value_t = topology_agent::metrics::DEFAULT_MAX_BACKENDS)]
    metrics_max_backends: usize,
    /// Also serve /healthz and /readyz alone on this address, with connections of their own, for
    /// kubelet's probes: a flood of scrapes or idle connections cannot keep them out.
    #[arg(long, value_parser = listen::parse_listen, value_name = "ADDR")]
    probe_addr: Option<SocketAddr>,
    /// Override a map's capacity, e.g. `topo_slots=524288` (repeatable).
    #[arg(long = "capacity", value_name = "MAP=ENTRIES")]
    capacities: Vec<CapacityOverride>,
    /// The kernel's knobs.
    #[command(flatten)]
    programs: LoadOptions,
    /// When the agent has had no current view of the cluster for this long (it died, is wedged,
    /// or its watches keep failing), the programs stop rewriting and connections go to the
    /// ClusterIP untouched, where kube-proxy answers. Two minutes ride out an API server restart
    /// without leaving topology, and stop a partitioned agent's sets before a rolling update has
    /// replaced the backends they name. `0` keeps the last programmed state forever.
    #[arg(long, default_value = "2m", value_name = "DURATION", value_parser = humantime::parse_duration)]
    fail_open_after: Duration,
    /// Which sockets are destroyed when the backend they reached through a service leaves its
    /// set: `udp` (connected UDP sockets), `all` (TCP too) or `off` (no CAP_SYS_ADMIN needed).
    #[arg(long, value_enum, default_value_t = TerminateSockets::Udp)]
    terminate_sockets: TerminateSockets,
    /// Where network namespaces are pinned as files (CNI runtimes and `ip netns` use /run/netns).
    #[arg(long = "netns-dir", default_value = "/run/netns")]
    netns_dirs: Vec<PathBuf>,
    /// The host's network namespace, as a file: `/proc/1/ns/net` with the host's PID namespace,
    /// else the host's `/proc/1/ns/net` mounted into the pod (host-network pods' sockets).
    #[arg(long, value_name = "PATH", default_value = "/proc/1/ns/net")]
    host_netns: PathBuf,
    /// The DNS responder's flags (`--dns-listen` turns it on).
    #[command(flatten)]
    dns: Option<DnsConfig>,
}

pub fn run_config(args: RunArgs) -> anyhow::Result<RunConfig> {
    let ClusterArgs { cluster, kubeconfig, node } = args.cluster;
    let source = match cluster {
        Some(path) => SourceConfig::File(path),
        None => SourceConfig::Kubernetes { kubeconfig },
    };
    Ok(RunConfig {
        source,
        node,
        cgroup: args.cgroup,
        pin_path: args.pin_path,
        metrics_addr: args.metrics_addr.map_or_else(default_metrics_addr, Ok)?,
        probe_addr: args.probe_addr,
        fail_open_after: (!args.fail_open_after.is_zero()).then_some(args.fail_open_after),
        programs: LoadOptions { capacities: Capacities::default().with_overrides(&args.capacities), ..args.programs },
        metrics_caps: SeriesCaps { ports: args.metrics_max_ports, backends: args.metrics_max_backends },
        terminate: args.terminate_sockets,
        netns_dirs: args.netns_dirs.into_iter().chain([args.host_netns]).collect(),
        dns: args.dns,
    })
}

/// `$POD_IP:9464`, else `127.0.0.1:9464`.
fn default_metrics_addr() -> anyhow::Result<SocketAddr> {
    const PORT: u16 = 9464;
    match std::env::var("POD_IP") {
        Ok(ip) if !ip.is_empty() => {
            let ip: std::net::IpAddr = ip.parse().with_context(|| format!("POD_IP {ip:?} is not an IP address"))?;
            Ok(SocketAddr::new(ip, PORT))
        }
        _ => Ok(SocketAddr::from(([127, 0, 0, 1], PORT))),
    }
}
