//! `cargo xtask bench [policy|datapath|control-plane|soak|dns|cost]`: runs the benchmarks, prints their
//! tables and writes them to `docs/benchmarks.md` (see `bench_doc`).

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Args, ValueEnum};

use crate::{
    bench_doc::{self, Section},
    cmd::{self, cargo},
};

/// Which benchmarks to run.
#[derive(Args)]
pub struct BenchArgs {
    /// Benchmarks to run (default: all).
    #[arg(value_enum)]
    suites: Vec<Suite>,
    /// Print the tables only; leave docs/benchmarks.md as it is.
    #[arg(long)]
    no_write: bool,
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
    /// Cross-zone accounting: its accuracy, its cost to a connect and its sweep's CPU (root).
    Cost,
}

/// Each suite's section key, title and bench source, in the order of the document.
const SUITES: [(Suite, &str, &str, &str); 6] = [
    (Suite::Policy, "policy", "Policy computation", "topology-policy/benches/policy.rs"),
    (Suite::Datapath, "datapath", "Datapath: connect() overhead", "tests/benches/datapath.rs"),
    (
        Suite::ControlPlane,
        "control-plane",
        "Control plane: sync, update latency, memory",
        "tests/benches/control_plane.rs",
    ),
    (Suite::Soak, "soak", "Crash soak", "tests/benches/soak.rs"),
    (Suite::Dns, "dns", "Node-local DNS responder", "tests/benches/dns.rs"),
    (Suite::Cost, "cost", "Cross-zone accounting: accuracy and cost", "tests/benches/cost.rs"),
];

pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let wants = |suite| args.suites.is_empty() || args.suites.contains(&suite);
    let root = cmd::workspace_root();
    let mut sections = Vec::new();
    for (suite, key, title, source) in SUITES {
        if !wants(suite) {
            continue;
        }
        let body = match suite {
            Suite::Policy => {
                let started = std::time::SystemTime::now();
                cmd::run(cargo().args(["bench", "-p", "topology-policy", "--bench", "policy"]).current_dir(&root))?;
                bench_doc::criterion_table(&root.join("target/criterion"), started)?
            }
            // The datapath's kube-proxy rows come from the real kube-proxy setup built.
            Suite::Datapath => captured(
                cargo()
                    .args(["bench", "-p", "topology-tests", "--bench", key])
                    .env(crate::kubernetes::BIN_ENV, crate::kubernetes::ensure()?),
            )?,
            Suite::Cost => captured(cargo().args(["bench", "-p", "topology-tests", "--bench", key]))?,
            Suite::ControlPlane => {
                // The scenarios that run the agent as a process (memory, Kubernetes' limits) run
                // the binary the image ships: static, musl, with its allocator.
                let (triple, _) = crate::image::musl_target()?;
                let agent = crate::image::build_static_agent(&root, triple)?;
                captured(
                    cargo()
                        .args(["bench", "-p", "topology-tests", "--bench", "control_plane"])
                        .env("TOPOLOGY_AGENT", agent)
                        .env(crate::kubernetes::BIN_ENV, crate::kubernetes::ensure()?),
                )?
            }
            Suite::Soak | Suite::Dns => {
                // These run the agent and the probe next to it, optimized; the DNS bench on the
                // real control plane, with the real CoreDNS as the upstream.
                cmd::run(cargo().args(["build", "--release", "--bins"]).current_dir(&root))?;
                let mut bench = cargo();
                bench.args(["bench", "-p", "topology-tests", "--bench", key]);
                if suite == Suite::Dns {
                    bench.env(crate::kubernetes::BIN_ENV, crate::kubernetes::ensure()?);
                }
                captured(&mut bench)?
            }
        };
        // A suite that skipped (no root) printed nothing: its old section stays.
        if !body.trim().is_empty() {
            sections.push(Section { key, title, source, body });
        }
    }
    if !args.no_write {
        bench_doc::write(&sections, &SUITES.map(|(_, key, ..)| key))?;
    }
    Ok(())
}

/// Runs a bench, echoing its stdout line by line as it comes, and returns what it printed.
fn captured(command: &mut Command) -> anyhow::Result<String> {
    let command = command.current_dir(cmd::workspace_root()).stdout(Stdio::piped());
    eprintln!("+ {command:?}");
    let mut child = command.spawn().context("starting the bench")?;
    let mut out = String::new();
    for line in BufReader::new(child.stdout.take().expect("piped stdout")).lines() {
        let line = line?;
        println!("{line}");
        out.push_str(&line);
        out.push('\n');
    }
    let status = child.wait()?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(out)
}
