//! The `topology-agent` binary: parses the command line and hands each subcommand to the library.

mod run_args;
mod uninstall;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};
use run_args::{RunArgs, run_config, steer_service};
use tokio_util::sync::CancellationToken;
use topology_agent::{agent, listen, status::StatusReport};
use topology_kube::watch as kube_source;
use topology_model::{ObjectKey, yaml};
use topology_policy::{explain, plan::steering::Steering};

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
        #[arg(long, default_value = topology_dataplane::DEFAULT_PIN_PATH)]
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
        /// What crossing zones costs per Service port, from the running agent's byte counts (its
        /// `/debug/cost`): GB kept in zone and sent across since it started, and dollars a day
        /// spent and saved (against the default policy) at the last hour's rates.
        #[arg(long, conflicts_with_all = ["plan", "verify"])]
        cost: bool,
        /// With `--cost`: the price of a GB crossing zones in each direction (about $0.01 on the
        /// large clouds; a GB that crosses is billed leaving one zone and entering the other).
        #[arg(long, requires = "cost", default_value_t = 0.01, value_name = "DOLLARS")]
        cost_per_gb: f64,
        /// With `--plan` or `--cost`: the agent's HTTP address on loopback, where it serves them
        /// (run it in the agent's pod, `kubectl exec`, or through `kubectl port-forward`).
        #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464", value_parser = listen::parse_listen)]
        agent: SocketAddr,
    },
    /// Detach every program and remove every pin the agent owns. Connections to ClusterIPs are no
    /// longer rewritten afterwards.
    Cleanup {
        /// Pin directory of the agent.
        #[arg(long, default_value = topology_dataplane::DEFAULT_PIN_PATH)]
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

/// How long `explain` waits for the API to list every kind.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

/// The cluster as the API lists it now; objects the agent would skip are named on stderr.
fn live_cluster(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<topology_model::ClusterState> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let (state, skipped) = runtime.block_on(async {
        let client = kube_source::client(kubeconfig, kube_source::Role::Explain).await?;
        anyhow::Ok(kube_source::snapshot(&client, LIST_TIMEOUT).await.context("listing the cluster")?)
    })?;
    for invalid in skipped {
        tracing::warn!(object = %invalid.id, error = %invalid.error, "object skipped, as the agent skips it");
    }
    Ok(state)
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
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
            let path = service.map_or_else(|| "/debug/plan".to_owned(), |key| format!("/debug/plan?service={key}"));
            let report: explain::ExplainReport = fetch(agent, &path, "its plan")?;
            match output {
                Output::Table => print!("{}", report.table()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::Status { cost: true, cost_per_gb, agent, output, .. } => {
            let report: topology_agent::cost::CostReport = fetch(agent, "/debug/cost", "its byte counts")?;
            match output {
                Output::Table => print!("{}", report.table(cost_per_gb)),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::Status { pin_path, verify: true, .. } => {
            let check = topology_dataplane::verify_pins(&pin_path)
                .with_context(|| format!("checking the pinned state under {}", pin_path.display()))?;
            println!("consistent: {} service ports, {} live slots", check.services, check.live_slots);
        }
        Command::Status { pin_path, output, .. } => {
            let snapshot = topology_dataplane::read_pins(&pin_path)
                .with_context(|| format!("reading the pinned state under {}", pin_path.display()))?;
            let report = StatusReport::new(&pin_path, &snapshot);
            match output {
                Output::Table => print!("{}", report.table()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::MountBpffs { path } => {
            let done = topology_dataplane::mounts::mount_bpffs(&path)
                .with_context(|| format!("mounting a BPF filesystem at {}", path.display()))?;
            match done {
                topology_dataplane::mounts::BpffsMount::Present => println!("{} is a BPF filesystem", path.display()),
                topology_dataplane::mounts::BpffsMount::Mounted => {
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

/// What the running agent at `addr` answers at `path` (its `/debug/…`), decoded; `what` names it
/// in errors.
fn fetch<T: serde::de::DeserializeOwned>(addr: SocketAddr, path: &str, what: &str) -> anyhow::Result<T> {
    use std::io::{Read as _, Write as _};
    let failed = || format!("asking the agent at {addr} for {what} (is it running? --agent names its address)");
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
    serde_json::from_str(body).with_context(|| format!("{what} the agent at {addr} sent"))
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

    use clap::CommandFactory as _;
    use topology_dataplane::{ByteAccounting, IndexOrdering, KernelLogLevel, LoadSignal};
    use topology_policy::plan::MeasuredPorts;

    use super::*;
    use crate::run_args::{parse_upstream, run_config};

    #[test]
    fn the_kernels_knobs_are_flags_of_run_declared_with_the_loaders_options() {
        Cli::command().debug_assert();
        let run = |args: &[&str]| {
            let cli =
                Cli::try_parse_from([&["topology-agent", "run", "--node", "a", "--cluster", "c.yaml"], args].concat())?;
            let Command::Run(args) = cli.command else { panic!("run") };
            Ok::<_, clap::Error>(run_config(*args).unwrap())
        };
        let defaults = run(&[]).unwrap().programs;
        assert_eq!(defaults.load_signal, LoadSignal::On);
        assert!(defaults.outlier_ejection, "the agent ejects by default, a library user does not");
        assert_eq!(defaults.byte_accounting, ByteAccounting::Tcp);
        let config = run(&[
            "--kernel-log=warn",
            "--index-ordering=off",
            "--load-signal=all",
            "--outlier-ejection=off",
            "--byte-accounting=all",
            "--capacity=topo_slots=1024",
        ])
        .unwrap();
        let programs = config.programs;
        assert_eq!(programs.kernel_log, KernelLogLevel::Warn);
        assert_eq!(programs.index, IndexOrdering::Off);
        assert_eq!(MeasuredPorts::from(programs.load_signal), MeasuredPorts::All);
        assert!(!programs.outlier_ejection);
        assert_eq!(programs.byte_accounting, ByteAccounting::All);
        assert_eq!(programs.capacities.slots, 1024);
        let Err(error) = run(&["--outlier-ejection=maybe"]) else { panic!("--outlier-ejection=maybe is refused") };
        let error = error.to_string();
        assert!(error.contains("--outlier-ejection") && error.contains("neither on nor off"), "{error}");
    }

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
        let domain = topology_dns::parse_domain("cluster..local").unwrap_err().to_string();
        assert!(domain.starts_with("--cluster-domain \"cluster..local\": "), "{domain}");
        assert_eq!(topology_dns::parse_domain("Cluster.Local.").unwrap().to_ascii(), "cluster.local.");
        assert!(topology_dns::parse_domain("").is_err());
    }
}
