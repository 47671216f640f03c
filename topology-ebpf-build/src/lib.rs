//! How the kernel programs (`topology-ebpf`) are built, declared once: the objects the agent
//! embeds ([`VARIANTS`]) and the nightly `cargo build` that makes each ([`command`]).
//! `topology-dataplane/build.rs` runs it for the agent's own architecture into `OUT_DIR`, where
//! `dataplane::loader` embeds the objects; `cargo xtask test` runs it for the other architecture
//! the agent supports, so both keep building.

use std::{path::Path, process::Command};

/// One object the agent embeds: its file name, the crate features, the BPF CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Its file name (in `OUT_DIR`).
    pub name: &'static str,
    /// `topology-ebpf` features.
    pub features: &'static str,
    /// `-Ctarget-cpu`, if not the default.
    pub cpu: Option<&'static str>,
}

/// The objects: `topology`, BPF ISA of the default CPU, index loads in program order (x86-64 on
/// any kernel); `topology-acquire`, ISA v4, index loads as load-acquire (kernels with BPF
/// load-acquire, which weakly ordered CPUs need for the service index; see
/// `topology_common::index`).
pub const VARIANTS: [Variant; 2] = [
    Variant { name: "topology", features: "", cpu: None },
    Variant { name: "topology-acquire", features: "acquire", cpu: Some("v4") },
];

/// The architectures the agent supports: the programs' `bpf_target_arch` (pt_regs layouts and
/// the like) is the agent's.
pub const ARCHES: [&str; 2] = ["x86_64", "aarch64"];

/// `rustup run <toolchain> cargo build` of `topology-ebpf`'s binaries (release, for
/// bpfel-unknown-none, `core` built with `-Z build-std`) as `variant` for an agent on `arch`, into
/// `target_dir`; the caller adds what it reads back (`--message-format=json`) and where it runs
/// (inside the workspace). The outer build's compiler settings are for the host toolchain, not
/// nightly's: they are removed.
pub fn command(toolchain: &str, arch: &str, variant: &Variant, target_dir: &Path) -> Command {
    let mut flags =
        vec![format!("--cfg=bpf_target_arch=\"{arch}\""), "-Cdebuginfo=2".into(), "-Clink-arg=--btf".into()];
    flags.extend(variant.cpu.map(|cpu| format!("-Ctarget-cpu={cpu}")));
    let mut command = Command::new("rustup");
    command
        .args(["run", toolchain, "cargo", "build", "--package", "topology-ebpf", "--bins", "--release"])
        .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core", "--features", variant.features])
        .arg("--target-dir")
        .arg(target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
        .env_remove("RUSTC")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTFLAGS");
    command
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_variant_is_one_cargo_build_with_its_features_cpu_and_the_agents_arch() {
        let command = command("nightly-x", "aarch64", &VARIANTS[1], Path::new("/t"));
        let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
        assert_eq!(args[..2], ["run", "nightly-x"]);
        assert!(args.windows(2).any(|w| w == ["--features", "acquire"]), "{args:?}");
        assert!(args.windows(2).any(|w| w == ["--target-dir", "/t"]), "{args:?}");
        let flags = command
            .get_envs()
            .find(|(key, _)| *key == "CARGO_ENCODED_RUSTFLAGS")
            .and_then(|(_, value)| value)
            .map(|value| value.to_string_lossy().into_owned())
            .unwrap();
        assert_eq!(
            flags.split('\x1f').collect::<Vec<_>>(),
            ["--cfg=bpf_target_arch=\"aarch64\"", "-Cdebuginfo=2", "-Clink-arg=--btf", "-Ctarget-cpu=v4"]
        );
    }
}
