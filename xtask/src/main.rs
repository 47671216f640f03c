//! Project tasks. `cargo xtask setup` installs what the build and tests need; `cargo xtask test`
//! runs every test tier this machine can run.

mod bench;
mod bench_doc;
mod cluster;
mod cmd;
mod demo;
mod fuzz;
mod image;
mod kernels;
mod kubernetes;
mod setup;
mod test;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "topology-agent project tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing: the pinned nightly with rust-src, bpf-linker, cargo-fuzz, the
    /// Debian packages, bpffs, and the real Kubernetes components built from their Go modules.
    Setup,
    /// Set up, then run formatting and lint checks, unit tests, root integration tests and the
    /// kind end-to-end suite, each where this machine can run it.
    Test(test::TestArgs),
    /// Set up, then run benchmarks and print their tables.
    Bench(bench::BenchArgs),
    /// Set up, then run every fuzz target for a bounded time (nightly, cargo-fuzz).
    Fuzz(fuzz::FuzzArgs),
    /// Build the DaemonSet's image (static musl agent, OCI layout and archive) without a
    /// container engine or registry.
    Image(image::ImageArgs),
    /// Set up, then simulate a multi-zone cluster on this machine with real agents and real
    /// connections, and report where they landed (root).
    Demo(demo::DemoArgs),
    /// Set up, then start, stop or describe the e2e tier's real control plane on this machine
    /// (`up [--agents]`, `down`, `status`; root).
    Cluster(cluster::ClusterArgs),
    /// Set up, then run the routing simulator (`topology-sim`, release build) with these
    /// arguments, e.g. `cargo xtask simulate --sample-every 1 --svg chart.svg`.
    Simulate {
        /// Arguments of `topology-sim` (see `cargo xtask simulate --help`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// The kernel matrix alone (root): the datapath's root tests in a VM of each kernel (`--full`:
    /// every one, and the agent-driven ones; else a load and a connect, as `cargo xtask test` runs
    /// them).
    Kernels {
        /// Every datapath test and the agent-driven root tests, not only the load and the connect.
        #[arg(long)]
        full: bool,
        /// Only these kernels (`6.1`, `6.12`, `6.18`); the table in `docs/operating.md` is then
        /// left as it is.
        #[arg(long = "kernel")]
        only: Vec<String>,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Kernels { full, only } => kernels::matrix(full, &only),
        Task::Test(args) => {
            setup::run()?;
            test::run(&args)
        }
        Task::Bench(args) => {
            setup::run()?;
            bench::run(&args)
        }
        Task::Fuzz(args) => {
            setup::run()?;
            fuzz::run(&args)
        }
        Task::Image(args) => {
            setup::run()?;
            image::run(&args)
        }
        Task::Demo(args) => {
            setup::run()?;
            demo::run(&args)
        }
        Task::Cluster(args) => {
            setup::run()?;
            cluster::run(&args)
        }
        Task::Simulate { args } => {
            setup::run()?;
            cmd::run(cmd::cargo().args(["run", "--release", "--quiet", "-p", "topology-sim", "--"]).args(&args))
        }
    }
}
