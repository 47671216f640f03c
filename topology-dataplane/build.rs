//! Builds the kernel programs (`topology-ebpf`) for bpfel-unknown-none with the dated nightly that
//! `topology-ebpf/rust-toolchain` pins (the one bpf-linker is built against), once per object of
//! `topology_ebpf_build::VARIANTS`, and leaves the objects in `OUT_DIR`, where `dataplane::loader`
//! embeds them.
use std::{env, io::BufReader, path::PathBuf, process::Stdio};

use anyhow::{Context as _, anyhow, bail};
use cargo_metadata::{Artifact, Message};
use topology_ebpf_build::{VARIANTS, Variant};

fn main() -> anyhow::Result<()> {
    let metadata = cargo_metadata::MetadataCommand::new().no_deps().exec().context("cargo metadata")?;
    let ebpf = metadata
        .packages
        .into_iter()
        .find(|package| package.name.as_str() == "topology-ebpf")
        .ok_or_else(|| anyhow!("topology-ebpf package not found in the workspace"))?;
    let root_dir = ebpf.manifest_path.parent().ok_or_else(|| anyhow!("topology-ebpf manifest has no parent"))?;
    println!("cargo:rerun-if-changed={root_dir}");
    println!("cargo:rerun-if-changed={}", root_dir.join("../topology-common/src"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    if env::var_os("CARGO_FEATURE_EMPTY_PROGRAMS").is_some() {
        // The fuzz targets never load programs: empty objects spare a nightly build per target.
        for variant in &VARIANTS {
            std::fs::write(out_dir.join(variant.name), b"")?;
        }
        return Ok(());
    }
    // The programs' `bpf_target_arch` (pt_regs layouts and the like) is the agent's architecture.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    if env::var("CARGO_CFG_TARGET_ENDIAN").as_deref() != Ok("little") {
        bail!("only little-endian hosts are supported (bpfel-unknown-none)");
    }
    // One line, the toolchain's name: the same file rustup reads in that directory.
    let toolchain_file = root_dir.join("rust-toolchain");
    let toolchain = std::fs::read_to_string(&toolchain_file).with_context(|| format!("reading {toolchain_file}"))?;
    for variant in &VARIANTS {
        let object = build(variant, toolchain.trim(), &arch, &out_dir)
            .with_context(|| format!("building eBPF object {}", variant.name))?;
        std::fs::copy(&object, out_dir.join(variant.name))
            .with_context(|| format!("copying {} to {}", object.display(), out_dir.display()))?;
    }
    Ok(())
}

/// Builds the `topology` binary of topology-ebpf for one variant; returns the object's path.
fn build(variant: &Variant, toolchain: &str, arch: &str, out_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
    let mut command = topology_ebpf_build::command(toolchain, arch, variant, &out_dir.join("ebpf").join(variant.name));
    command.arg("--message-format=json").stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = command.spawn().with_context(|| format!("running `rustup run {toolchain} cargo build` (is rustup installed? `cargo xtask setup` installs the toolchain)"))?;
    let mut stderr = child.stderr.take().context("stderr")?;
    // Kept, and shown only if the build fails: a successful build's progress is noise.
    let collect = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let mut object = None;
    for message in Message::parse_stream(BufReader::new(child.stdout.take().context("stdout")?)) {
        if let Message::CompilerArtifact(Artifact { executable: Some(path), target, .. }) = message?
            && target.name == "topology"
        {
            object = Some(path.into_std_path_buf());
        }
    }
    let status = child.wait()?;
    let log = collect.join().unwrap_or_default();
    if !status.success() {
        for line in log.lines() {
            println!("cargo:warning={line}");
        }
        bail!("cargo build of topology-ebpf failed ({status}); see the warnings above");
    }
    object.context("cargo reported no `topology` binary")
}
