//! `cargo xtask demo [options]`: builds the agent, the probe and the demo runner, then runs the
//! demo with its report in `target/demo/`.

use std::process::Command;

use anyhow::bail;
use clap::Args;

use crate::cmd::{self, cargo, is_root};

/// Options passed to the demo runner (`cargo xtask demo -- --help` lists them).
#[derive(Args)]
pub struct DemoArgs {
    /// Demo options: --scenario zones|overload|rollout, --control-plane embedded|real, --pods-per-zone, --zones,
    /// --nodes-per-zone, --backends-per-zone, --regions, --connections, --surge-seconds, --calm-seconds, --keep,
    /// --clean.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    options: Vec<String>,
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if !is_root() {
        bail!("the demo needs root: it loads BPF programs and creates cgroups and network namespaces");
    }
    let root = cmd::workspace_root();
    cmd::run(cargo().args(["build", "--bins"]).current_dir(&root))?;
    let out = root.join("target/demo");
    cmd::run(
        Command::new(root.join("target/debug/topology-demo"))
            .arg("--out")
            .arg(&out)
            .args(&args.options)
            .env("TOPOLOGY_AGENT", root.join("target/debug/topology-agent"))
            .env("TOPOLOGY_PROBE", root.join("target/debug/topology-probe"))
            // `--control-plane real` starts the real Kubernetes setup built.
            .env(crate::kubernetes::BIN_ENV, crate::kubernetes::ensure()?)
            .current_dir(&root),
    )
}
