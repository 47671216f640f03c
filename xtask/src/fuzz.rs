//! `cargo xtask fuzz`: every cargo-fuzz target of topology-agent for a bounded time each. A crash
//! fails the run; its input is left under `topology-agent/fuzz/artifacts/<target>/`, to be kept
//! under `topology-agent/fuzz/regressions/<target>/` (replayed by `cargo test`) once fixed.

use std::{path::PathBuf, process::Command};

use clap::Args;

use crate::cmd::{self, workspace_root};

/// Every target (`topology-agent/fuzz/fuzz_targets/*.rs`).
pub const TARGETS: [&str; 9] =
    ["cluster_file", "quantity", "annotations", "mountinfo", "adopt", "sock_diag", "dns_packet", "apply", "relay"];

/// How long to fuzz.
#[derive(Args)]
pub struct FuzzArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// Only these targets (default: all).
    #[arg(long)]
    target: Vec<String>,
}

pub fn run(args: &FuzzArgs) -> anyhow::Result<()> {
    run_for(args.seconds, &args.target)
}

/// Fuzzes `targets` (all if empty) for `seconds` each, seeded with the kept inputs.
pub fn run_for(seconds: u64, targets: &[String]) -> anyhow::Result<()> {
    let dir = workspace_root().join("topology-agent");
    let selected: Vec<&str> =
        TARGETS.iter().copied().filter(|t| targets.is_empty() || targets.iter().any(|w| w == t)).collect();
    for target in selected {
        let seeds: PathBuf = dir.join("fuzz/regressions").join(target);
        let corpus = dir.join("fuzz/corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        cmd::run(
            Command::new("rustup")
                .args(["run", &crate::setup::nightly()?, "cargo", "fuzz", "run", target])
                .arg(&corpus)
                .arg(&seeds)
                .arg("--")
                .arg(format!("-max_total_time={seconds}"))
                .arg("-rss_limit_mb=2048")
                .current_dir(&dir),
        )?;
    }
    Ok(())
}
