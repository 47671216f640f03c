//! `cargo xtask setup`: makes a fresh machine able to build and test, idempotently. Each step
//! checks first and changes nothing when the tool already works.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};

use crate::cmd::{self, is_root, on_path, succeeds};

/// The bpf-linker release known to build against the pinned nightly's LLVM.
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian packages the tests and benchmarks call, with a command each provides.
const PACKAGES: [(&str, &str); 16] = [
    ("bpftool", "bpftool"),
    ("iproute2", "ip"),
    ("iptables", "iptables-restore"),
    // `cargo xtask bench datapath`: kube-proxy's nftables mode, side by side with its iptables one.
    ("nftables", "nft"),
    // The real kube-proxy's iptables rules count dropped invalid packets in an nfacct object,
    // which the datapath bench creates where it loads them.
    ("nfacct", "nfacct"),
    ("libcap2-bin", "capsh"),
    ("dnsutils", "dig"),
    ("dnsperf", "dnsperf"),
    // `cargo xtask bench dns`: a caching resolver as the anchor for relayed names.
    ("unbound", "unbound"),
    // `cargo xtask image`: a C compiler for musl (ring builds C), and an independent OCI reader.
    ("musl-tools", "musl-gcc"),
    ("skopeo", "skopeo"),
    // promtool: checks and unit-tests deploy/monitoring's alert rules (the server is not started).
    ("prometheus", "promtool"),
    // `kubectl kustomize`: deploy/ rendered as `kubectl apply -k` sends it (no cluster needed).
    ("kubernetes-client", "kubectl"),
    // The kernel matrix (`cargo xtask test --kernels`): Debian's kernels booted by qemu on an
    // initramfs of busybox and their own modules (depmod).
    ("qemu-system-x86", "qemu-system-x86_64"),
    ("busybox-static", "busybox"),
    ("kmod", "depmod"),
];

pub fn run() -> anyhow::Result<()> {
    ensure_nightly()?;
    ensure_rust_src()?;
    ensure_bpf_linker()?;
    ensure_cargo_fuzz()?;
    ensure_musl_target()?;
    ensure_packages()?;
    ensure_bpffs()?;
    let components = crate::kubernetes::ensure()?;
    if is_root() {
        let kernels = crate::kernels::ensure()?;
        let releases: Vec<&str> = kernels.iter().map(|k| k.release.as_str()).collect();
        eprintln!("setup: kernels for the VMs: {releases:?}");
    }
    eprintln!("setup: everything is in place (the real Kubernetes components in {})", components.display());
    Ok(())
}

/// The dated nightly of the kernel programs, rustfmt's options and cargo-fuzz: the one whose LLVM
/// bpf-linker builds against, pinned once in `topology-ebpf/rust-toolchain` (which rustup reads too).
pub fn nightly() -> anyhow::Result<String> {
    let file = cmd::workspace_root().join("topology-ebpf/rust-toolchain");
    let text = fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    Ok(text.trim().to_owned())
}

fn nightly_sysroot() -> anyhow::Result<PathBuf> {
    let toolchain = nightly()?;
    let sysroot = cmd::output(Command::new("rustup").args(["run", &toolchain, "rustc", "--print", "sysroot"]))
        .with_context(|| {
            format!("the {toolchain} toolchain builds the eBPF programs; `cargo xtask setup` installs it")
        })?;
    Ok(PathBuf::from(sysroot))
}

/// Installs the pinned nightly with what the build needs of it, where it is missing.
fn ensure_nightly() -> anyhow::Result<()> {
    let toolchain = nightly()?;
    if succeeds(Command::new("rustup").args(["run", &toolchain, "rustc", "--version"])) {
        return Ok(());
    }
    eprintln!("setup: installing the {toolchain} toolchain (the eBPF programs, rustfmt, cargo-fuzz)");
    cmd::run(Command::new("rustup").args(["toolchain", "install", &toolchain, "--profile", "minimal"]).args([
        "--component",
        "rust-src",
        "--component",
        "rustfmt",
    ]))
}

fn ensure_rust_src() -> anyhow::Result<()> {
    let core = nightly_sysroot()?.join("lib/rustlib/src/rust/library/core/Cargo.toml");
    if core.exists() {
        return Ok(());
    }
    cmd::run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", &nightly()?]))
}

/// The standard library for the static agent of `cargo xtask image`.
fn ensure_musl_target() -> anyhow::Result<()> {
    let triple = format!("{}-unknown-linux-musl", std::env::consts::ARCH);
    let installed = cmd::output(Command::new("rustup").args(["target", "list", "--installed"]))?;
    if installed.lines().any(|line| line.trim() == triple) {
        return Ok(());
    }
    cmd::run(Command::new("rustup").args(["target", "add", &triple]))
}

fn ensure_bpf_linker() -> anyhow::Result<()> {
    let llvm = llvm_library()?;
    let prefix = cargo_home().join("bpf-linker-llvm");
    link_llvm(&prefix, &llvm)?;
    if succeeds(Command::new("bpf-linker").arg("--version")) {
        return Ok(());
    }
    let major = llvm_major(&llvm).with_context(|| format!("LLVM version of {}", llvm.display()))?;
    eprintln!("setup: building bpf-linker {BPF_LINKER_VERSION} against {}'s LLVM {major} (about a minute)", nightly()?);
    cmd::run(
        cmd::cargo()
            .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--no-default-features"])
            .args(["--features", &format!("llvm-{major}")])
            .env("LLVM_PREFIX", &prefix),
    )?;
    if !succeeds(Command::new("bpf-linker").arg("--version")) {
        bail!("bpf-linker was installed but does not run; is {} on PATH?", cargo_home().join("bin").display());
    }
    Ok(())
}

/// The cargo-fuzz release the fuzz targets are built with.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

fn ensure_cargo_fuzz() -> anyhow::Result<()> {
    if succeeds(Command::new("cargo-fuzz").arg("--version")) {
        return Ok(());
    }
    eprintln!("setup: installing cargo-fuzz {CARGO_FUZZ_VERSION} (about a minute)");
    cmd::run(cmd::cargo().args(["install", "cargo-fuzz", "--locked", "--version", CARGO_FUZZ_VERSION]))
}

/// The shared LLVM library of the pinned nightly (`libLLVM.so.<major>.<minor>-rust-...`).
fn llvm_library() -> anyhow::Result<PathBuf> {
    let lib = nightly_sysroot()?.join("lib");
    let mut candidates: Vec<PathBuf> = fs::read_dir(&lib)
        .with_context(|| format!("reading {}", lib.display()))?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("libLLVM.so.")))
        .collect();
    candidates.sort();
    candidates.pop().with_context(|| format!("no libLLVM.so.* in {}", lib.display()))
}

fn llvm_major(library: &Path) -> Option<u32> {
    let name = library.file_name()?.to_string_lossy().into_owned();
    let version = name.strip_prefix("libLLVM.so.")?;
    version.split(['.', '-']).next()?.parse().ok()
}

/// `<prefix>/lib` with `libLLVM.so` (what bpf-linker's build links against) and the library's own
/// file name (what the installed binary's RUNPATH resolves at run time), both pointing at `llvm`.
fn link_llvm(prefix: &Path, llvm: &Path) -> anyhow::Result<()> {
    let lib = prefix.join("lib");
    fs::create_dir_all(&lib).with_context(|| format!("creating {}", lib.display()))?;
    let file_name = llvm.file_name().context("LLVM library file name")?;
    for name in [Path::new("libLLVM.so"), Path::new(file_name)] {
        let link = lib.join(name);
        if fs::read_link(&link).is_ok_and(|target| target == llvm) {
            continue;
        }
        let _ = fs::remove_file(&link);
        symlink(llvm, &link).with_context(|| format!("linking {} -> {}", link.display(), llvm.display()))?;
    }
    Ok(())
}

fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cargo"))
}

fn ensure_packages() -> anyhow::Result<()> {
    let missing: Vec<&str> = PACKAGES
        .iter()
        .filter(|(_, command)| !on_path(command) && !Path::new("/usr/sbin").join(command).exists())
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() || !on_path("apt-get") {
        eprintln!("setup: missing packages {missing:?}; install them (root tests will skip without them)");
        return Ok(());
    }
    cmd::run(Command::new("apt-get").args(["update", "-qq"]))?;
    cmd::run(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

/// The agent pins under /sys/fs/bpf by default; mount bpffs there if nothing is.
fn ensure_bpffs() -> anyhow::Result<()> {
    let dir = Path::new("/sys/fs/bpf");
    if !is_root() || !dir.exists() {
        return Ok(());
    }
    let mounts = fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    let mounted = mounts.lines().any(|line| {
        line.split_once(" - ")
            .is_some_and(|(mount, fs)| fs.starts_with("bpf ") && mount.split_whitespace().nth(4) == Some("/sys/fs/bpf"))
    });
    if mounted {
        return Ok(());
    }
    // A build container may not allow mounts; only the root tests and the demo need it.
    if let Err(error) = cmd::run(Command::new("mount").args(["-t", "bpf", "bpf", "/sys/fs/bpf"])) {
        eprintln!("setup: could not mount bpffs at /sys/fs/bpf ({error}); root tests will try again");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llvm_major_comes_from_the_library_name() {
        assert_eq!(llvm_major(Path::new("/x/libLLVM.so.22.1-rust-1.97.0-nightly")), Some(22));
        assert_eq!(llvm_major(Path::new("/x/libLLVM.so.19")), Some(19));
        assert_eq!(llvm_major(Path::new("/x/libLLVM-22.so")), None);
    }
}
