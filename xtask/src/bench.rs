//! `cargo xtask bench [policy|datapath|control-plane|soak|dns]`: the benchmarks whose tables go into the
//! issue notes.

use clap::{Args, ValueEnum};

use crate::cmd::{self, cargo};

/// Which benchmarks to run.
#[derive(Args)]
pub struct BenchArgs {
    /// Benchmarks to run (default: all).
    #[arg(value_enum)]
    suites: Vec<Suite>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Suite {
    /// Policy computation (criterion).
    Policy,
    /// connect() latency: no hook, our hook, a kube-proxy-shaped iptables ruleset (root).
    Datapath,
    /// Initial sync, update latency and RSS against the fake API server (root).
    ControlPlane,
    /// 200 SIGKILLs of the agent mid-write under client load (root).
    Soak,
    /// The DNS responder under dnsperf, and the control loop beside it (root).
    Dns,
}

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let wants = |suite| args.suites.is_empty() || args.suites.contains(&suite);
    let root = cmd::workspace_root();
    if wants(Suite::Policy) {
        cmd::run(cargo().args(["bench", "-p", "topology-agent", "--bench", "policy"]).current_dir(&root))?;
    }
    if wants(Suite::Datapath) {
        cmd::run(cargo().args(["bench", "-p", "topology-tests", "--bench", "datapath"]).current_dir(&root))?;
    }
    if wants(Suite::ControlPlane) {
        // The RSS measurement runs the optimized agent binary.
        cmd::run(cargo().args(["build", "--release", "-p", "topology-agent"]).current_dir(&root))?;
        let agent = root.join("target/release/topology-agent");
        cmd::run(
            cargo()
                .args(["bench", "-p", "topology-tests", "--bench", "control_plane"])
                .env("TOPOLOGY_AGENT", agent)
                .current_dir(&root),
        )?;
    }
    for (suite, bench) in [(Suite::Soak, "soak"), (Suite::Dns, "dns")] {
        if wants(suite) {
            // These run the agent and the probe next to it, optimized.
            cmd::run(cargo().args(["build", "--release", "--bins"]).current_dir(&root))?;
            cmd::run(cargo().args(["bench", "-p", "topology-tests", "--bench", bench]).current_dir(&root))?;
        }
    }
    Ok(())
}
