//! The `topology-agent` binary: parses the command line and hands each subcommand to the library.

mod uninstall;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use tokio_util::sync::CancellationToken;
use topology_agent::{
    agent::{self, RunConfig, SourceConfig},
    cluster::{ObjectKey, yaml},
    dataplane::{self, Capacities, IndexOrdering, KernelLogLevel},
    dns::{self, DnsConfig, steer::Steering},
    explain, listen,
    metrics::SeriesCaps,
    sockets::TerminateSockets,
    source::kube as kube_source,
    status::StatusReport,
};

#[derive(Parser)]
#[command(version, about = "Topology-aware service routing in cgroup socket hooks")]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the agent: watch the cluster (or a file) and keep this node's kernel maps in step.
    Run(Box<RunArgs>),
    /// Show, per Service port, which backends this node would use and why: the same decision the
    /// agent programs into the kernel.
    Explain {
        /// Cluster objects (Nodes, Services, EndpointSlices) as multi-document YAML or a List;
        /// without it, they are listed from the API (`--kubeconfig`, else `$KUBECONFIG`, else
        /// `~/.kube/config`, else in-cluster).
        #[arg(long, conflicts_with = "kubeconfig")]
        cluster: Option<PathBuf>,
        /// List the objects from the API server of this kubeconfig, as the agent does.
        #[arg(long)]
        kubeconfig: Option<PathBuf>,
        /// The node to decide for.
        #[arg(long, env = "NODE_NAME")]
        node: String,
        /// Only this Service (NAMESPACE/NAME).
        #[arg(long)]
        service: Option<ObjectKey>,
        /// Show the cluster DNS steered to a responder at this address, as `run --dns-listen` does.
        #[arg(long, value_name = "ADDR", value_parser = listen::parse_listen)]
        dns_listen: Option<SocketAddr>,
        /// The cluster DNS Service `--dns-listen` steers (`NAMESPACE/NAME`), or `off`.
        #[arg(long, default_value = "kube-system/kube-dns", value_name = "NAMESPACE/NAME|off")]
        dns_steer: String,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
    },
    /// Print what the kernel holds now, service by service, from the pinned maps.
    Status {
        /// Pin directory of the agent.
        #[arg(long, default_value = dataplane::DEFAULT_PIN_PATH)]
        pin_path: PathBuf,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Output::Table)]
        output: Output,
        /// Only check the pinned state is consistent (slot runs whole and disjoint, the index
        /// agreeing with the service maps); exit 1 with the first problem if not.
        #[arg(long, conflicts_with = "plan")]
        verify: bool,
        /// Print why this node routes each Service port where it does: the running agent's own
        /// plan (its `/debug/plan`), the report `explain` prints.
        #[arg(long)]
        plan: bool,
        /// With `--plan`: only this Service (NAMESPACE/NAME).
        #[arg(long, requires = "plan")]
        service: Option<ObjectKey>,
        /// With `--plan`: the agent's HTTP address on loopback, where it serves its plan (run it
        /// in the agent's pod, `kubectl exec`, or through `kubectl port-forward`).
        #[arg(long, requires = "plan", value_name = "ADDR", default_value = "127.0.0.1:9464", value_parser = listen::parse_listen)]
        agent: SocketAddr,
    },
    /// Detach every program and remove every pin the agent owns. Connections to ClusterIPs are no
    /// longer rewritten afterwards.
    Cleanup {
        /// Pin directory of the agent.
        #[arg(long, default_value = dataplane::DEFAULT_PIN_PATH)]
        pin_path: PathBuf,
        /// Afterwards, wait for SIGTERM (the uninstall DaemonSet's pods stay up once done).
        #[arg(long)]
        wait: bool,
        /// Remove nothing: exit 0 if nothing is pinned under the pin path and none of the agent's
        /// programs is attached to the cgroup, 1 otherwise.
        #[arg(long, conflicts_with = "wait")]
        check: bool,
        /// cgroup v2 directory `--check` looks at (default: the cgroup v2 root from
        /// /proc/self/mountinfo, where the agent attaches).
        #[arg(long, requires = "check")]
        cgroup: Option<PathBuf>,
    },
    /// Mount a BPF filesystem where the pins go, unless one is there (kind's nodes, some images
    /// mount none); the DaemonSet's init container runs it, with the mount propagated to the host.
    MountBpffs {
        /// Where the BPF filesystem must be.
        #[arg(long, default_value = "/sys/fs/bpf")]
        path: PathBuf,
    },
}

#[derive(Args)]
struct RunArgs {
    /// Read the cluster from this YAML file (re-read on change) instead of the Kubernetes API.
    #[arg(long, conflicts_with = "kubeconfig")]
    cluster: Option<PathBuf>,
    /// Kubeconfig to use (default: in-cluster configuration, else ~/.kube/config).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// This node's name (the Downward API sets NODE_NAME in the DaemonSet).
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// cgroup v2 directory to attach to (default: the cgroup v2 root from /proc/self/mountinfo).
    #[arg(long)]
    cgroup: Option<PathBuf>,
    /// Directory on bpffs for the pinned maps and links.
    #[arg(long, default_value = dataplane::DEFAULT_PIN_PATH)]
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
    /// Kernel-side diagnostics (aya-log); `off` costs nothing on the hot path.
    #[arg(long, value_enum, default_value_t = KernelLogLevel::Off)]
    kernel_log: KernelLogLevel,
    /// Override a map's capacity, e.g. `topo_slots=524288` (repeatable).
    #[arg(long = "capacity", value_name = "MAP=ENTRIES")]
    capacities: Vec<String>,
    /// When the agent has had no current view of the cluster for this long (it died, is wedged,
    /// or its watches keep failing), the programs stop rewriting and connections go to the
    /// ClusterIP untouched, where kube-proxy answers. Two minutes ride out an API server restart
    /// without leaving topology, and stop a partitioned agent's sets before a rolling update has
    /// replaced the backends they name. `0` keeps the last programmed state forever.
    #[arg(long, default_value = "2m", value_name = "DURATION", value_parser = humantime::parse_duration)]
    fail_open_after: Duration,
    /// How the programs read the service index: `auto` picks what this CPU and kernel need.
    #[arg(long, value_enum, default_value_t = IndexOrdering::Auto)]
    index_ordering: IndexOrdering,
    /// The load signal: a `sock_ops` program measuring, per backend, the TCP connections the hooks
    /// rewrite for ports under feedback (`on`; every other socket costs it a flag test), or for
    /// every port (`all`). `off`: nothing is measured, feedback keeps the static plan.
    #[arg(long, value_enum, default_value_t = LoadSignal::On)]
    load_signal: LoadSignal,
    /// Avoid a backend whose handshakes from this node failed 5 times in a row, for 10 s doubling
    /// with each ejection up to 5 min (its programs run only where a handshake fails).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    outlier_ejection: Switch,
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
    /// Serve DNS over UDP and TCP on this address (off when absent): headless Services answered
    /// with the endpoints this node's policy chooses, other names relayed to the upstream.
    #[arg(long, value_name = "ADDR", value_parser = listen::parse_listen)]
    dns_listen: Option<SocketAddr>,
    /// The cluster domain the responder answers for.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
    /// Where names outside the cluster's Services go, `IP` or `IP:PORT` (default: the ready
    /// endpoints of kube-system/kube-dns, dialled directly).
    #[arg(long, value_delimiter = ',', value_name = "ADDR[,ADDR]", value_parser = parse_upstream)]
    dns_upstream: Vec<SocketAddr>,
    /// TTL of the responder's answers, seconds.
    #[arg(long, default_value_t = dns::DEFAULT_TTL)]
    dns_ttl: u32,
    /// Queries per second one client address may send to the responder (0: no limit).
    #[arg(long, default_value_t = dns::DEFAULT_SOURCE_QPS)]
    dns_source_qps: u32,
    /// Memory for relayed answers the responder keeps, MiB (0: none kept).
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    dns_cache_mib: usize,
    /// The longest a relayed answer is kept, seconds, whatever its TTL.
    #[arg(long, default_value_t = 300, value_name = "SECONDS")]
    dns_cache_max_ttl: u32,
    /// The longest a relayed negative answer (NXDOMAIN, NODATA) is kept, seconds.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    dns_cache_max_negative_ttl: u32,
    /// The cluster DNS Service whose port 53 this node steers to the responder while it answers
    /// (`NAMESPACE/NAME`), or `off`.
    #[arg(long, default_value = "kube-system/kube-dns", value_name = "NAMESPACE/NAME|off")]
    dns_steer: String,
}

/// `--dns-steer`: a Service, or `off`.
fn steer_service(value: &str) -> anyhow::Result<Option<ObjectKey>> {
    match value {
        "off" => Ok(None),
        service => Ok(Some(service.parse::<ObjectKey>().map_err(|e| anyhow::anyhow!("--dns-steer: {e}"))?)),
    }
}

/// How long `explain` waits for the API to list every kind.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster as the API lists it now; objects the agent would skip are named on stderr.
fn live_cluster(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<topology_agent::cluster::ClusterState> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (state, skipped) = runtime.block_on(async {
        let client = kube_source::client(kubeconfig).await?;
        anyhow::Ok(kube_source::snapshot(&client, LIST_TIMEOUT).await.context("listing the cluster")?)
    })?;
    for invalid in skipped {
        tracing::warn!(object = %invalid.id, error = %invalid.error, "object skipped, as the agent skips it");
    }
    Ok(state)
}

/// A `--dns-upstream` entry that is no address.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is neither IP nor IP:PORT")]
struct NotAnUpstream(String);

/// `--dns-upstream` entry: `IP:PORT`, or `IP` for port 53.
fn parse_upstream(text: &str) -> Result<SocketAddr, NotAnUpstream> {
    text.parse::<SocketAddr>()
        .or_else(|_| text.parse::<std::net::IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| NotAnUpstream(text.to_owned()))
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Switch {
    On,
    Off,
}

/// Which ports the load signal measures, if any.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LoadSignal {
    /// Ports under feedback.
    On,
    /// Every port.
    All,
    Off,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    match cli.command {
        Command::Run(args) => {
            topology_agent::heap::limit_arenas();
            let config = run_config(*args)?;
            let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
            runtime.block_on(async {
                let shutdown = CancellationToken::new();
                tokio::spawn(cancel_on_signal(shutdown.clone()));
                agent::run(config, shutdown).await
            })?;
        }
        Command::Explain { cluster, kubeconfig, node, service, dns_listen, dns_steer, output } => {
            let state = match cluster {
                Some(path) => yaml::load(&path)?,
                None => live_cluster(kubeconfig.as_deref())?,
            };
            let steering = match (dns_listen, steer_service(&dns_steer)?) {
                (Some(responder), Some(service)) => Some(Steering { service, responder }),
                _ => None,
            };
            let report = explain::explain(&state, &node, service.as_ref(), steering.as_ref())?;
            match output {
                Output::Table => print!("{}", report.table()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::Status { plan: true, service, agent, output, .. } => {
            let report = fetch_plan(agent, service.as_ref())?;
            match output {
                Output::Table => print!("{}", report.table()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::Status { pin_path, verify: true, .. } => {
            let check = dataplane::verify_pins(&pin_path)
                .with_context(|| format!("checking the pinned state under {}", pin_path.display()))?;
            println!("consistent: {} service ports, {} live slots", check.services, check.live_slots);
        }
        Command::Status { pin_path, output, .. } => {
            let snapshot = dataplane::read_pins(&pin_path)
                .with_context(|| format!("reading the pinned state under {}", pin_path.display()))?;
            let report = StatusReport::new(&pin_path, &snapshot);
            match output {
                Output::Table => print!("{}", report.table()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::MountBpffs { path } => {
            let done = topology_agent::mounts::mount_bpffs(&path)
                .with_context(|| format!("mounting a BPF filesystem at {}", path.display()))?;
            match done {
                topology_agent::mounts::BpffsMount::Present => println!("{} is a BPF filesystem", path.display()),
                topology_agent::mounts::BpffsMount::Mounted => {
                    tracing::warn!(path = %path.display(), "no BPF filesystem on this node: mounted one");
                    println!("mounted a BPF filesystem at {}", path.display());
                }
            }
        }
        Command::Cleanup { pin_path, wait, check, cgroup } => {
            if check {
                uninstall::check(&pin_path, cgroup)?;
            } else {
                uninstall::clean(&pin_path)?;
                if wait {
                    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                    let shutdown = CancellationToken::new();
                    runtime.block_on(async {
                        tokio::spawn(cancel_on_signal(shutdown.clone()));
                        shutdown.cancelled().await;
                    });
                }
            }
        }
    }
    Ok(())
}

fn run_config(args: RunArgs) -> anyhow::Result<RunConfig> {
    let source = match args.cluster {
        Some(path) => SourceConfig::File(path),
        None => SourceConfig::Kubernetes { kubeconfig: args.kubeconfig },
    };
    Ok(RunConfig {
        source,
        node: args.node,
        cgroup: args.cgroup,
        pin_path: args.pin_path,
        metrics_addr: args.metrics_addr.map_or_else(default_metrics_addr, Ok)?,
        probe_addr: args.probe_addr,
        capacities: capacities(&args.capacities)?,
        kernel_log: args.kernel_log,
        index: args.index_ordering,
        fail_open_after: (!args.fail_open_after.is_zero()).then_some(args.fail_open_after),
        load_signal: args.load_signal != LoadSignal::Off,
        outlier_ejection: args.outlier_ejection == Switch::On,
        measure_all: args.load_signal == LoadSignal::All,
        metrics_caps: SeriesCaps { ports: args.metrics_max_ports, backends: args.metrics_max_backends },
        terminate: args.terminate_sockets,
        netns_dirs: args.netns_dirs.into_iter().chain([args.host_netns]).collect(),
        dns: match args.dns_listen {
            Some(listen) => Some(DnsConfig {
                listen,
                domain: dns::parse_domain(&args.cluster_domain)?,
                ttl: args.dns_ttl,
                upstreams: args.dns_upstream,
                per_source_qps: args.dns_source_qps,
                steer: steer_service(&args.dns_steer)?,
                cache: dns::relayed::CacheSettings {
                    max_bytes: args.dns_cache_mib << 20,
                    max_ttl: args.dns_cache_max_ttl,
                    max_negative_ttl: args.dns_cache_max_negative_ttl,
                    ..Default::default()
                },
            }),
            None => None,
        },
    })
}

/// The running agent's plan, from its `/debug/plan` at `addr`.
fn fetch_plan(addr: SocketAddr, service: Option<&ObjectKey>) -> anyhow::Result<explain::ExplainReport> {
    use std::io::{Read as _, Write as _};
    let path = service.map_or_else(|| "/debug/plan".to_owned(), |key| format!("/debug/plan?service={key}"));
    let failed = || format!("asking the agent at {addr} for its plan (is it running? --agent names its address)");
    let mut stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).with_context(failed)?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).with_context(failed)?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").with_context(failed)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).with_context(failed)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        bail!("the agent at {addr} answered {status}: {}", body.trim());
    }
    serde_json::from_str(body).with_context(|| format!("the plan the agent at {addr} sent"))
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

/// Applies `MAP=ENTRIES` overrides to the default capacities.
fn capacities(overrides: &[String]) -> anyhow::Result<Capacities> {
    let mut capacities = Capacities::default();
    for spec in overrides {
        let Some((map, entries)) = spec.split_once('=') else { bail!("--capacity {spec:?}: expected MAP=ENTRIES") };
        let entries: u32 = entries.parse().with_context(|| format!("--capacity {spec:?}: entries"))?;
        let Some(slot) = capacities.entry_mut(map) else { bail!("--capacity {spec:?}: unknown map {map:?}") };
        *slot = entries;
    }
    Ok(capacities)
}

fn init_logging(format: LogFormat) {
    // `init` also routes the `log` crate (aya-log's kernel records) into tracing.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

async fn cancel_on_signal(shutdown: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        tracing::warn!("cannot install signal handlers; stop with SIGKILL (the kernel state stays)");
        return;
    };
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM: stopping, the kernel state stays in place"),
        _ = int.recv() => tracing::info!("SIGINT: stopping, the kernel state stays in place"),
    }
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_reads_a_file_or_the_api_never_both() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["topology-agent", "explain", "--node", "a"], args].concat());
        assert!(matches!(parse(&["--cluster", "c.yaml"]).unwrap().command, Command::Explain { cluster: Some(_), .. }));
        let live = parse(&["--kubeconfig", "k"]).unwrap().command;
        assert!(matches!(live, Command::Explain { cluster: None, kubeconfig: Some(_), .. }));
        assert!(matches!(parse(&[]).unwrap().command, Command::Explain { cluster: None, kubeconfig: None, .. }));
        let both = parse(&["--cluster", "c.yaml", "--kubeconfig", "k"]).err().expect("refused").to_string();
        assert!(both.contains("cannot be used with"), "{both}");
    }

    #[test]
    fn dns_flags_parse_or_name_the_flag() {
        assert_eq!(parse_upstream("10.0.0.10"), Ok("10.0.0.10:53".parse().unwrap()));
        assert_eq!(parse_upstream("[fd00::10]:5353"), Ok("[fd00::10]:5353".parse().unwrap()));
        assert_eq!(parse_upstream("dns.local").unwrap_err().to_string(), "\"dns.local\" is neither IP nor IP:PORT");
        assert_eq!(steer_service("off").unwrap(), None);
        assert_eq!(steer_service("kube-system/kube-dns").unwrap(), Some(ObjectKey::new("kube-system", "kube-dns")));
        let error = steer_service("kube-dns").unwrap_err().to_string();
        assert_eq!(error, "--dns-steer: \"kube-dns\" is not NAMESPACE/NAME");
        let domain = dns::parse_domain("cluster..local").unwrap_err().to_string();
        assert!(domain.starts_with("--cluster-domain \"cluster..local\": "), "{domain}");
        assert_eq!(dns::parse_domain("Cluster.Local.").unwrap().to_ascii(), "cluster.local.");
        assert!(dns::parse_domain("").is_err());
    }
}
