//! The `topology-agent` binary: parses the command line and hands each subcommand to the library.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use topology_agent::{
    cluster::{ObjectKey, file},
    dataplane, explain,
    status::StatusReport,
};

#[derive(Parser)]
#[command(version, about = "Topology-aware service routing in cgroup socket hooks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show, per Service port, which backends this node would use and why: the same decision the
    /// agent programs into the kernel.
    Explain {
        /// Cluster objects (Nodes, Services, EndpointSlices) as multi-document YAML or a List.
        #[arg(long)]
        cluster: PathBuf,
        /// The node to decide for.
        #[arg(long, env = "NODE_NAME")]
        node: String,
        /// Only this Service (NAMESPACE/NAME).
        #[arg(long)]
        service: Option<ObjectKey>,
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
    },
    /// Detach every program and remove every pin the agent owns. Connections to ClusterIPs are no
    /// longer rewritten afterwards.
    Cleanup {
        /// Pin directory of the agent.
        #[arg(long, default_value = dataplane::DEFAULT_PIN_PATH)]
        pin_path: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Output {
    Table,
    Json,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_writer(std::io::stderr)
        .init();
    match cli.command {
        Command::Explain { cluster, node, service, output } => {
            let state = file::load(&cluster)?;
            let report = explain::explain(&state, &node, service.as_ref())?;
            match output {
                Output::Table => print!("{}", report.table()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::Status { pin_path, output } => {
            let snapshot = dataplane::snapshot(&pin_path)
                .with_context(|| format!("reading the pinned state under {}", pin_path.display()))?;
            let report = StatusReport::new(&pin_path, &snapshot);
            match output {
                Output::Table => print!("{}", report.table()),
                Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
            }
        }
        Command::Cleanup { pin_path } => {
            let report =
                dataplane::cleanup(&pin_path).with_context(|| format!("cleaning up {}", pin_path.display()))?;
            println!(
                "detached {} programs, removed {} map pins under {}",
                report.links.len(),
                report.maps.len(),
                pin_path.display()
            );
        }
    }
    Ok(())
}
