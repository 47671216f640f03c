//! The `topology-agent` binary: parses the command line and hands each subcommand to the library.

mod run_args;
mod uninstall;

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand, ValueEnum};
use run_args::{ClusterArgs, RunArgs, run_config};
use tokio_util::sync::CancellationToken;
use topology_agent::{agent, status::StatusReport};
use topology_dns::DnsConfig;
use topology_kube::watch as kube_source;
use topology_model::{ObjectKey, listen, yaml};
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
    Explain(Box<ExplainArgs>),
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

/// `explain`'s flags.
#[derive(clap::Args)]
struct ExplainArgs {
    /// The cluster (from a file, else listed from the API as the agent lists it) and the node.
    #[command(flatten)]
    cluster: ClusterArgs,
    /// Only this Service (NAMESPACE/NAME).
    #[arg(long)]
    service: Option<ObjectKey>,
    /// `run`'s DNS responder flags: with `--dns-listen`, the cluster DNS is shown steered to
    /// the responder as `run` steers it (`--dns-steer`); the rest change nothing here.
    #[command(flatten)]
    dns: Option<DnsConfig>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Table)]
    output: Output,
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
        Command::Explain(args) => {
            let ExplainArgs { cluster: ClusterArgs { cluster, kubeconfig, node }, service, dns, output } = *args;
            let state = match cluster {
                Some(path) => yaml::load(&path)?,
                None => live_cluster(kubeconfig.as_deref())?,
            };
            let steering = dns.and_then(|dns| Some(Steering { service: dns.steer?, responder: dns.listen }));
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
    use crate::run_args::run_config;

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
        for (bad, why) in
            [("topo_nothing=5", "no map with a configurable size"), ("topo_slots", "expected MAP=ENTRIES")]
        {
            let Err(error) = run(&[&format!("--capacity={bad}")]) else { panic!("--capacity={bad} is refused") };
            let error = error.to_string();
            assert!(error.contains("--capacity") && error.contains(why), "{error}");
        }
        let Err(error) = run(&["--outlier-ejection=maybe"]) else { panic!("--outlier-ejection=maybe is refused") };
        let error = error.to_string();
        assert!(error.contains("--outlier-ejection") && error.contains("neither on nor off"), "{error}");
    }

    #[test]
    fn explain_reads_a_file_or_the_api_never_both() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["topology-agent", "explain", "--node", "a"], args].concat());
        assert!(
            matches!(parse(&["--cluster", "c.yaml"]).unwrap().command, Command::Explain(a) if a.cluster.cluster.is_some())
        );
        let live = parse(&["--kubeconfig", "k"]).unwrap().command;
        assert!(matches!(live, Command::Explain(a) if a.cluster.cluster.is_none() && a.cluster.kubeconfig.is_some()));
        assert!(
            matches!(parse(&[]).unwrap().command, Command::Explain(a) if a.cluster.cluster.is_none() && a.cluster.kubeconfig.is_none())
        );
        let both = parse(&["--cluster", "c.yaml", "--kubeconfig", "k"]).err().expect("refused").to_string();
        assert!(both.contains("cannot be used with"), "{both}");
    }

    #[test]
    fn dns_flags_are_the_responders_and_each_error_names_its_flag() {
        let run = |args: &[&str]| {
            let cli =
                Cli::try_parse_from([&["topology-agent", "run", "--node", "a", "--cluster", "c.yaml"], args].concat())?;
            let Command::Run(args) = cli.command else { panic!("run") };
            Ok::<_, clap::Error>(run_config(*args).unwrap().dns)
        };
        let error = |args: &[&str]| run(args).expect_err("refused").to_string();
        assert!(run(&[]).unwrap().is_none(), "the responder is off without --dns-listen");
        let dns = run(&["--dns-listen", "[10.0.0.5]:5353"]).unwrap().expect("on");
        assert_eq!(dns.listen, "10.0.0.5:5353".parse().unwrap());
        assert_eq!(dns.steer, Some(ObjectKey::new("kube-system", "kube-dns")));
        assert_eq!((dns.ttl, dns.per_source_qps), (topology_dns::DEFAULT_TTL, topology_dns::DEFAULT_SOURCE_QPS));
        assert_eq!(dns.cache().max_bytes, topology_dns::relay_cache::CacheSettings::default().max_bytes);
        assert_eq!(dns.domain.to_ascii(), "cluster.local.");
        assert!(dns.upstreams.is_empty());
        let dns = run(&[
            "--dns-listen=[fd00::5]:53",
            "--dns-steer=off",
            "--dns-upstream=10.0.0.10,[fd00::10]:5353",
            "--dns-cache-mib=4",
            "--cluster-domain=Corp.Local.",
        ])
        .unwrap()
        .expect("on");
        assert_eq!(dns.steer, None);
        assert_eq!(dns.upstreams, ["10.0.0.10:53".parse().unwrap(), "[fd00::10]:5353".parse().unwrap()]);
        assert_eq!((dns.cache().max_bytes, dns.domain.to_ascii().as_str()), (4 << 20, "corp.local."));
        // A responder's flag without the responder is a mistake, not a flag silently ignored.
        for flag in ["--dns-ttl=3", "--dns-cache-mib=4", "--dns-steer=off", "--cluster-domain=corp.local"] {
            let refused = error(&[flag]);
            assert!(refused.contains("--dns-listen"), "{flag}: {refused}");
        }
        let steer = error(&["--dns-listen=10.0.0.5:53", "--dns-steer=kube-dns"]);
        assert!(steer.contains("--dns-steer") && steer.contains("\"kube-dns\" is not NAMESPACE/NAME"), "{steer}");
        let upstream = error(&["--dns-listen=10.0.0.5:53", "--dns-upstream=dns.local"]);
        assert!(upstream.contains("--dns-upstream") && upstream.contains("neither IP nor IP:PORT"), "{upstream}");
        let domain = error(&["--dns-listen=10.0.0.5:53", "--cluster-domain=cluster..local"]);
        assert!(domain.contains("--cluster-domain"), "{domain}");
        let listen = error(&["--dns-listen=fd00::5:53"]);
        assert!(listen.contains("--dns-listen") && listen.contains("needs the brackets"), "{listen}");
        // explain takes the same flags, and shows the steering run would do.
        let explain = Cli::try_parse_from(["topology-agent", "explain", "--node", "a", "--dns-listen", "10.0.0.9:53"]);
        let Command::Explain(args) = explain.unwrap().command else { panic!("explain") };
        let dns = args.dns.expect("explain with DNS");
        assert_eq!(
            (dns.listen, dns.steer),
            ("10.0.0.9:53".parse().unwrap(), Some(ObjectKey::new("kube-system", "kube-dns")))
        );
    }
}
