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
    /// The whole kernel matrix: the datapath's root tests in a VM of each kernel of
    /// `xtask/src/kernels.rs` (without it, the root tier runs a load and a connect in each).
    #[arg(long)]
    kernels: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Tier {
    /// rustfmt and clippy.
    Lint,
    /// `cargo test` of everything that needs no privileges.
    Unit,
    /// Root integration tests against the real kernel.
    Root,
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
    if wants(Tier::Unit) {
        let unit = ["test", "--workspace", "--exclude", "topology-tests", "--exclude", "topology-ebpf"];
        cmd::run(cargo().args(unit).current_dir(&root))?;
        // The Kubernetes layer against the in-process fake API server, and the test kit's own
        // tests: no root, no kernel state, so in parallel and before the image is built.
        let (fake_api, _) = integration_tests(&root)?;
        let mut kube = vec!["test".to_owned(), "-p".into(), "topology-tests".into(), "--lib".into()];
        kube.extend(fake_api.into_iter().flat_map(|name| ["--test".to_owned(), name]));
        cmd::run(cargo().args(&kube).current_dir(&root))?;
    }
    if wants(Tier::Root) {
        if !is_root() {
            eprintln!("SKIPPED root integration tests: not running as root");
        }
        // The image test checks what `cargo xtask image` writes, and the kind suite loads it.
        let image = crate::image::build(None, None)?;
        // Root tests share kernel state (cgroups, pins, namespaces): one at a time. Without root
        // they print why they skip.
        let (_, kernel) = integration_tests(&root)?;
        let mut tests = vec!["test".to_owned(), "-p".into(), "topology-tests".into(), "--bins".into()];
        tests.extend(kernel.into_iter().flat_map(|name| ["--test".to_owned(), name]));
        tests.extend(["--".to_owned(), "--test-threads=1".into()]);
        // The e2e tier starts the real control plane from the components setup built.
        let components = crate::kubernetes::ensure()?;
        cmd::run(
            cargo()
                .args(&tests)
                .env("TOPOLOGY_IMAGE", &image.archive)
                .env(crate::kubernetes::BIN_ENV, components)
                .current_dir(&root),
        )?;
    }
    if wants(Tier::Root) && is_root() {
        crate::kernels::matrix(args.kernels)?;
    }
    if wants(Tier::Fuzz) {
        crate::fuzz::run_for(FUZZ_SECONDS, &[])?;
    }
    Ok(())
}

/// The integration tests of `tests/tests/`, by name: those against the fake API server
/// (`kube_*`, no root) and the others (the real kernel, root, one at a time).
fn integration_tests(root: &std::path::Path) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let mut names: Vec<String> = std::fs::read_dir(root.join("tests/tests"))?
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok()?.strip_suffix(".rs").map(str::to_owned))
        .collect();
    names.sort();
    Ok(names.into_iter().partition(|name| name.starts_with("kube_")))
}
