//! Builds the kernel programs (`topology-ebpf`) for bpfel-unknown-none with the nightly toolchain
//! and leaves the object in `OUT_DIR/topology`, where `dataplane::loader` embeds it.
use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|package| package.name.as_str() == "topology-ebpf")
        .ok_or_else(|| anyhow!("topology-ebpf package not found in the workspace"))?;
    let root_dir = ebpf
        .manifest_path
        .parent()
        .ok_or_else(|| anyhow!("topology-ebpf manifest has no parent directory"))?
        .as_str()
        .to_owned();
    aya_build::build_ebpf(
        [Package { name: ebpf.name.as_str(), root_dir: &root_dir, ..Default::default() }],
        Toolchain::default(),
    )
}
