//! `cargo xtask test`: every test tier this machine can run, strictest checks first.

use std::process::Command;

use clap::{Args, ValueEnum};

use crate::cmd::{self, cargo, is_root};

/// Which tiers to run.
#[derive(Args)]
pub struct TestArgs {
    /// Run only these tiers (default: all).
    #[arg(long, value_enum)]
    only: Vec<Tier>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Tier {
    /// rustfmt and clippy.
    Lint,
    /// `cargo test` of everything that needs no privileges.
    Unit,
    /// Root integration tests against the real kernel.
    Root,
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    let wants = |tier| args.only.is_empty() || args.only.contains(&tier);
    let root = cmd::workspace_root();
    if wants(Tier::Lint) {
        cmd::run(
            Command::new("rustup")
                .args(["run", "nightly", "cargo", "fmt", "--all", "--", "--check"])
                .current_dir(&root),
        )?;
        cmd::run(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]).current_dir(&root))?;
    }
    // Every binary first: the root tests run the agent and the probe as separate processes. The
    // eBPF crate is not a default member: it only links for bpfel-unknown-none, via build.rs.
    cmd::run(cargo().args(["build", "--bins"]).current_dir(&root))?;
    if wants(Tier::Unit) {
        let unit = ["test", "--workspace", "--exclude", "topology-tests", "--exclude", "topology-ebpf"];
        cmd::run(cargo().args(unit).current_dir(&root))?;
    }
    if wants(Tier::Root) {
        if !is_root() {
            eprintln!("SKIPPED root integration tests: not running as root");
        }
        // Root tests share kernel state (cgroups, pins, namespaces): one at a time. Without root
        // they print why they skip.
        cmd::run(cargo().args(["test", "-p", "topology-tests", "--", "--test-threads=1"]).current_dir(&root))?;
    }
    Ok(())
}
