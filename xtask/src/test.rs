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
    /// The whole kernel matrix: the datapath's and the agent-driven root tests in a VM of each kernel of
    /// `xtask/src/kernels/` (without it, the root tier runs a load and a connect in each).
    #[arg(long)]
    kernels: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Tier {
    /// rustfmt and clippy.
    Lint,
    /// `cargo test` of everything that needs no privileges.
    Unit,
    /// Root integration tests against the real kernel (`Tier: kernel`), and the kernel matrix.
    Root,
    /// Root integration tests against the real kernel and the real control plane
    /// (`Tier: cluster`).
    Cluster,
    /// Every fuzz target for a few seconds (nightly, cargo-fuzz); `cargo xtask fuzz` runs longer.
    Fuzz,
}

/// Seconds each fuzz target runs in `cargo xtask test`: enough to replay the kept inputs and
/// catch a shallow regression; `cargo xtask fuzz` is the real search.
const FUZZ_SECONDS: u64 = 10;

/// Builds the kernel programs as `topology-dataplane/build.rs` does, for an agent on `arch`.
fn build_ebpf_for(arch: &str, variant: &topology_ebpf_build::Variant) -> anyhow::Result<()> {
    let root = cmd::workspace_root();
    let target_dir = root.join("target/ebpf").join(format!("{arch}-{}", variant.name));
    let mut command = topology_ebpf_build::command(&crate::setup::nightly()?, arch, variant, &target_dir);
    cmd::run(command.current_dir(&root))
}

pub fn run(args: &TestArgs) -> anyhow::Result<()> {
    let wants = |tier| args.only.is_empty() || args.only.contains(&tier);
    let root = cmd::workspace_root();
    // A full disk shows up as a linker killed by SIGBUS half-way through; say up front how much
    // room the run has (a clean run writes about 9 GB: target/ and the fuzz targets).
    let _ = Command::new("df").arg("-h").arg(&root).status();
    if wants(Tier::Lint) {
        cmd::run(
            Command::new("rustup")
                .args(["run", &crate::setup::nightly()?, "cargo", "fmt", "--all", "--", "--check"])
                .current_dir(&root),
        )?;
        cmd::run(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]).current_dir(&root))?;
        // The agent embeds programs built for its own architecture; every supported one builds.
        for arch in topology_ebpf_build::ARCHES.into_iter().filter(|arch| *arch != std::env::consts::ARCH) {
            for variant in &topology_ebpf_build::VARIANTS {
                build_ebpf_for(arch, variant)?;
            }
        }
    }
    // Every binary first: the root tests run the agent and the probe as separate processes. The
    // eBPF crate is not a default member: it only links for bpfel-unknown-none, via build.rs.
    cmd::run(cargo().args(["build", "--bins"]).current_dir(&root))?;
    let tests = integration_tests(&root)?;
    if wants(Tier::Unit) {
        let unit = ["test", "--workspace", "--exclude", "topology-tests", "--exclude", "topology-ebpf"];
        cmd::run(cargo().args(unit).current_dir(&root))?;
        // The Kubernetes layer against the in-process fake API server, and the test kit's own
        // tests: no root, no kernel state, so in parallel and before the image is built.
        let mut kube = vec!["test".to_owned(), "-p".into(), "topology-tests".into(), "--lib".into()];
        kube.extend(targets(&tests, FileTier::FakeApi));
        cmd::run(cargo().args(&kube).current_dir(&root))?;
    }
    if (wants(Tier::Root) || wants(Tier::Cluster)) && !is_root() {
        eprintln!("SKIPPED root integration tests: not running as root");
    }
    if wants(Tier::Root) {
        // The image test checks what `cargo xtask image` writes, and the kind suite loads it.
        let image = crate::image::build(None, None)?;
        // Root tests share kernel state (cgroups, pins, namespaces): one at a time. Without root
        // they print why they skip.
        cmd::run(
            cargo().args(serial(&tests, FileTier::Kernel)).env("TOPOLOGY_IMAGE", &image.archive).current_dir(&root),
        )?;
    }
    if wants(Tier::Cluster) {
        // The real control plane, from the components setup built.
        let components = crate::kubernetes::ensure()?;
        cmd::run(
            cargo()
                .args(serial(&tests, FileTier::Cluster))
                .env(crate::kubernetes::BIN_ENV, components)
                .current_dir(&root),
        )?;
    }
    if wants(Tier::Root) && is_root() {
        crate::kernels::matrix(args.kernels, &[])?;
    }
    if wants(Tier::Fuzz) {
        crate::fuzz::run_for(FUZZ_SECONDS, &[])?;
    }
    Ok(())
}

/// Where a test file of `tests/tests/` runs, as its module docs declare it (`//! Tier: NAME`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FileTier {
    /// No root: the in-process fake API server; in parallel, in the unit tier.
    FakeApi,
    /// Root: the real kernel, one test at a time.
    Kernel,
    /// Root: the real kernel and the real control plane, one test at a time.
    Cluster,
}

impl FileTier {
    const NAMES: [(&str, Self); 3] =
        [("fake-api", Self::FakeApi), ("kernel", Self::Kernel), ("cluster", Self::Cluster)];
}

/// The integration tests of `tests/tests/`, by name, each with the tier it declares; a file
/// that declares none, or one unknown, is an error naming it.
fn integration_tests(root: &std::path::Path) -> anyhow::Result<Vec<(String, FileTier)>> {
    let mut tests = Vec::new();
    for entry in std::fs::read_dir(root.join("tests/tests"))? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".rs")) else {
            continue;
        };
        let text = std::fs::read_to_string(&path)?;
        let declared: Vec<&str> = text
            .lines()
            .take_while(|line| line.starts_with("//!"))
            .filter_map(|line| line.strip_prefix("//! Tier: "))
            .filter_map(|rest| rest.split([' ', '.']).next())
            .collect();
        let tier = match declared.as_slice() {
            [word] => FileTier::NAMES.iter().find(|(known, _)| known == word).map(|(_, tier)| *tier),
            _ => None,
        };
        let Some(tier) = tier else {
            anyhow::bail!(
                "{}: its module docs must declare one tier, `//! Tier: fake-api|kernel|cluster`, found {declared:?}",
                path.display()
            );
        };
        tests.push((name.to_owned(), tier));
    }
    tests.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(tests)
}

/// `--test NAME` for each test of `tier`.
fn targets(tests: &[(String, FileTier)], tier: FileTier) -> Vec<String> {
    tests.iter().filter(|(_, t)| *t == tier).flat_map(|(name, _)| ["--test".to_owned(), name.clone()]).collect()
}

/// `cargo test` of the tests of `tier` as root tests run: with the binaries, one at a time.
fn serial(tests: &[(String, FileTier)], tier: FileTier) -> Vec<String> {
    let mut args = vec!["test".to_owned(), "-p".into(), "topology-tests".into(), "--bins".into()];
    args.extend(targets(tests, tier));
    args.extend(["--".to_owned(), "--test-threads=1".into()]);
    args
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_integration_test_declares_its_tier() {
        let tests = integration_tests(&cmd::workspace_root()).unwrap();
        assert!(tests.len() > 40, "{tests:?}");
        for tier in [FileTier::FakeApi, FileTier::Kernel, FileTier::Cluster] {
            assert!(tests.iter().any(|(_, t)| *t == tier), "no test of {tier:?}");
        }
    }
}
