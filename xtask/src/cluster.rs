//! `cargo xtask cluster up|down|status`: the e2e tier's real control plane (`tests/src/kubernetes`),
//! kept running for exploring with kubectl, `topology-agent status`, `explain` and bpftool. `up`
//! starts its supervisor (`topology-cluster serve`) detached and waits until it is ready; `down`
//! stops it and sweeps what a crashed one left; `status` says what runs and how to reach it.

use std::{
    io::{BufRead as _, BufReader},
    process::{Command, Stdio},
};

use anyhow::{Context as _, bail};
use clap::{Args, Subcommand};

use crate::cmd::{self, cargo, is_root};

/// What to do with the cluster.
#[derive(Args)]
pub struct ClusterArgs {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Start etcd, kube-apiserver, kube-controller-manager and Ready nodes; return once ready.
    /// Options of `topology-cluster serve`: --zones N, --nodes-per-zone N, --agents.
    Up {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        options: Vec<String>,
    },
    /// Stop it, and remove what a crashed one left.
    Down,
    /// What is running, and how to reach it.
    Status,
}

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    if !is_root() {
        bail!("the cluster needs root: network namespaces, cgroups and BPF programs");
    }
    let root = cmd::workspace_root();
    cmd::run(cargo().args(["build", "--bins"]).current_dir(&root))?;
    let components = crate::kubernetes::ensure()?;
    let state = root.join("target/cluster");
    std::fs::create_dir_all(&state)?;
    let supervisor = || {
        let mut command = Command::new(root.join("target/debug/topology-cluster"));
        command
            .arg("--state")
            .arg(&state)
            .env("TOPOLOGY_AGENT", root.join("target/debug/topology-agent"))
            .env("TOPOLOGY_PROBE", root.join("target/debug/topology-probe"))
            .env(crate::kubernetes::BIN_ENV, &components)
            .current_dir(&root);
        command
    };
    match &args.action {
        Action::Up { options } => {
            // A cluster already up is stopped first: one at a time, its leftovers swept.
            cmd::run(supervisor().arg("down"))?;
            let log = state.join("supervisor.log");
            let mut command = Command::new("setsid");
            let program = supervisor();
            command.arg(program.get_program()).args(program.get_args());
            command.envs(program.get_envs().filter_map(|(key, value)| Some((key, value?))));
            command.current_dir(&root).arg("serve").args(options);
            let mut child = command
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(std::fs::File::create(&log)?)
                .spawn()
                .context("starting topology-cluster")?;
            let mut line = String::new();
            BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
            if line.trim() != "ready" {
                bail!("the cluster did not start; see {}", log.display());
            }
            cmd::run(supervisor().arg("status"))
        }
        Action::Down => cmd::run(supervisor().arg("down")),
        Action::Status => cmd::run(supervisor().arg("status")),
    }
}
