//! `cargo xtask image`: the DaemonSet's image, built here with no container engine and no registry.
//!
//! One layer holds the agent, a static (musl) binary, and nothing else: no base image, no shell,
//! no libc. The image is written as an OCI image layout (`target/image/oci/`) and as one archive of
//! that layout (`target/image/topology-agent.tar`) that also carries Docker's `manifest.json`, as
//! `docker save` writes since Docker 25, so `kind load image-archive`, `podman load`,
//! `docker load`, `ctr images import` and `skopeo copy oci-archive:` all accept it.
//!
//! The build is reproducible: every timestamp is the commit's (or `SOURCE_DATE_EPOCH`), owners are
//! 0:0 and entries are in a fixed order, so the same commit gives the same digests.
//!
//! The image runs as uid 0 with every capability dropped but the four `deploy/daemonset.yaml`
//! adds: a pod's added capabilities reach only uid 0 (Kubernetes has no ambient capabilities), and
//! file capabilities on the binary would need `allowPrivilegeEscalation: true`, which is worse.

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use clap::Args;
use oci_spec::image::{
    Arch, ConfigBuilder, Descriptor, DescriptorBuilder, HistoryBuilder, ImageConfigurationBuilder, ImageIndexBuilder,
    ImageManifestBuilder, MediaType, OciLayoutBuilder, Os, PlatformBuilder, RootFsBuilder, Sha256Digest,
};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

use crate::cmd::{self, cargo};

/// Where the agent lives inside the image.
pub const BINARY_PATH: &str = "usr/local/bin/topology-agent";
/// What the programs need, as `deploy/daemonset.yaml` grants it (a label, and checked by a test).
const CAPABILITIES: &str = "BPF,NET_ADMIN,SYS_ADMIN,PERFMON";
const REPOSITORY: &str = "ghcr.io/topology-agent/topology-agent";

#[derive(Args)]
pub struct ImageArgs {
    /// Image reference to tag the archive with (default: the one `deploy/daemonset.yaml` uses).
    #[arg(long)]
    tag: Option<String>,
    /// Output directory (default: `target/image`).
    #[arg(long)]
    output: Option<PathBuf>,
}

/// What was written.
pub struct Built {
    pub archive: PathBuf,
    pub layout: PathBuf,
    pub reference: String,
    pub manifest_digest: String,
}

pub fn run(args: &ImageArgs) -> anyhow::Result<()> {
    let built = build(args.tag.clone(), args.output.clone())?;
    println!("image {} ({})", built.reference, built.manifest_digest);
    println!("  OCI layout: {}", built.layout.display());
    println!("  archive:    {}", built.archive.display());
    println!("load it with one of:");
    println!("  kind load image-archive {} --name CLUSTER", built.archive.display());
    println!("  podman load -i {}", built.archive.display());
    println!("  ctr -n k8s.io images import {}", built.archive.display());
    Ok(())
}

/// Builds the static agent and writes the image; returns where.
pub fn build(tag: Option<String>, output: Option<PathBuf>) -> anyhow::Result<Built> {
    let root = cmd::workspace_root();
    let reference = tag.unwrap_or_else(|| format!("{REPOSITORY}:{}", env!("CARGO_PKG_VERSION")));
    let output = output.unwrap_or_else(|| root.join("target/image"));
    let (triple, arch) = musl_target()?;
    let binary = build_static_agent(&root, triple)?;
    let epoch = source_date_epoch(&root)?;
    let revision = cmd::output(Command::new("git").args(["rev-parse", "HEAD"]).current_dir(&root))
        .unwrap_or_else(|_| "unknown".into());

    let layout = output.join("oci");
    if layout.exists() {
        fs::remove_dir_all(&layout).with_context(|| format!("clearing {}", layout.display()))?;
    }
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).with_context(|| format!("creating {}", blobs.display()))?;

    let layer = layer_tar(&binary, epoch)?;
    let layer = write_blob(&blobs, MediaType::ImageLayer, &layer)?;
    let created = rfc3339(epoch);
    let labels = [
        ("org.opencontainers.image.title", "topology-agent"),
        ("org.opencontainers.image.description", "Topology-aware service routing in cgroup socket hooks"),
        ("org.opencontainers.image.version", env!("CARGO_PKG_VERSION")),
        ("org.opencontainers.image.revision", revision.as_str()),
        ("org.opencontainers.image.source", env!("CARGO_PKG_REPOSITORY")),
        ("org.opencontainers.image.licenses", env!("CARGO_PKG_LICENSE")),
        ("org.opencontainers.image.created", created.as_str()),
        ("io.topology-agent.capabilities", CAPABILITIES),
    ]
    .map(|(k, v)| (k.to_owned(), v.to_owned()));
    let config = ImageConfigurationBuilder::default()
        .created(created.clone())
        .architecture(arch.clone())
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .entrypoint(vec![format!("/{BINARY_PATH}")])
                .user("0:0".to_owned())
                .env(vec!["PATH=/usr/local/bin".to_owned()])
                .labels(labels.iter().cloned().collect::<std::collections::HashMap<_, _>>())
                .build()?,
        )
        .rootfs(RootFsBuilder::default().typ("layers").diff_ids(vec![layer.digest().to_string()]).build()?)
        .history(vec![
            HistoryBuilder::default()
                .created(created.clone())
                .created_by(format!("cargo xtask image ({triple}, static)"))
                .build()?,
        ])
        .build()?;
    let config = write_blob(&blobs, MediaType::ImageConfig, &canonical_json(&config)?)?;
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config.clone())
        .layers(vec![layer.clone()])
        .annotations(
            labels
                .iter()
                .filter(|(k, _)| k.starts_with("org.opencontainers"))
                .cloned()
                .collect::<std::collections::HashMap<_, _>>(),
        )
        .build()?;
    let mut manifest_descriptor = write_blob(&blobs, MediaType::ImageManifest, &canonical_json(&manifest)?)?;
    let tag_only = reference.rsplit_once(':').map_or("latest", |(_, tag)| tag).to_owned();
    manifest_descriptor.set_platform(Some(PlatformBuilder::default().architecture(arch).os(Os::Linux).build()?));
    manifest_descriptor.set_annotations(Some(
        [("org.opencontainers.image.ref.name", tag_only), ("io.containerd.image.name", reference.clone())]
            .map(|(k, v)| (k.to_owned(), v))
            .into(),
    ));
    let manifest_digest = manifest_descriptor.digest().to_string();
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![manifest_descriptor])
        .build()?;
    fs::write(layout.join("index.json"), canonical_json(&index)?)?;
    let oci_layout = OciLayoutBuilder::default().image_layout_version("1.0.0").build()?;
    fs::write(layout.join("oci-layout"), canonical_json(&oci_layout)?)?;
    // Docker's archive index, so `docker load` and `docker-archive:` readers take the same file.
    let docker = [DockerManifest {
        config: blob_path(&config),
        repo_tags: vec![reference.clone()],
        layers: vec![blob_path(&layer)],
    }];
    fs::write(layout.join("manifest.json"), serde_json::to_vec(&docker)?)?;

    let archive = output.join("topology-agent.tar");
    write_archive(&layout, &archive, epoch)?;
    Ok(Built { archive, layout, reference, manifest_digest })
}

/// The musl target for this machine's architecture, and the OCI name of that architecture.
pub(crate) fn musl_target() -> anyhow::Result<(&'static str, Arch)> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(("x86_64-unknown-linux-musl", Arch::Amd64)),
        "aarch64" => Ok(("aarch64-unknown-linux-musl", Arch::ARM64)),
        other => bail!("no image for {other}: the agent supports x86_64 and aarch64"),
    }
}

/// `cargo build --release` for the musl target: one static binary, no loader, no libc to ship.
pub(crate) fn build_static_agent(root: &Path, triple: &str) -> anyhow::Result<PathBuf> {
    let flags_var = format!("CARGO_TARGET_{}_RUSTFLAGS", triple.to_uppercase().replace('-', "_"));
    cmd::run(
        cargo()
            .args(["build", "--release", "--locked", "-p", "topology-agent", "--target", triple])
            // Debug info out, symbol names kept: a panic's backtrace still names functions.
            .env(flags_var, "-Cstrip=debuginfo -Ctarget-feature=+crt-static")
            .current_dir(root),
    )?;
    Ok(root.join("target").join(triple).join("release/topology-agent"))
}

/// Seconds since the epoch for every timestamp: `SOURCE_DATE_EPOCH`, else the commit's time.
fn source_date_epoch(root: &Path) -> anyhow::Result<u64> {
    if let Ok(value) = std::env::var("SOURCE_DATE_EPOCH") {
        return value.parse().with_context(|| format!("SOURCE_DATE_EPOCH={value:?} is not a number of seconds"));
    }
    Ok(cmd::output(Command::new("git").args(["log", "-1", "--format=%ct"]).current_dir(root))
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0))
}

/// The one layer: the directories down to the binary, then the binary, owned by 0:0.
fn layer_tar(binary: &Path, epoch: u64) -> anyhow::Result<Vec<u8>> {
    let contents = fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let mut tar = tar::Builder::new(Vec::new());
    for dir in ["usr/", "usr/local/", "usr/local/bin/"] {
        let mut header = header(tar::EntryType::Directory, 0o755, 0, epoch);
        tar.append_data(&mut header, dir, std::io::empty())?;
    }
    let mut header = header(tar::EntryType::Regular, 0o755, contents.len() as u64, epoch);
    tar.append_data(&mut header, BINARY_PATH, contents.as_slice())?;
    Ok(tar.into_inner()?)
}

fn header(kind: tar::EntryType, mode: u32, size: u64, epoch: u64) -> tar::Header {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_size(size);
    header.set_mtime(epoch);
    header.set_uid(0);
    header.set_gid(0);
    header
}

/// Writes `bytes` as a content-addressed blob and returns its descriptor.
fn write_blob(blobs: &Path, media_type: MediaType, bytes: &[u8]) -> anyhow::Result<Descriptor> {
    let hex = sha256_hex(bytes);
    fs::write(blobs.join(&hex), bytes).with_context(|| format!("writing blob {hex}"))?;
    let digest: Sha256Digest = hex.parse()?;
    Ok(DescriptorBuilder::default().media_type(media_type).digest(digest).size(bytes.len() as u64).build()?)
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// JSON with every object's keys sorted: the spec types hold labels in hash maps, whose order
/// would change the digests from one build to the next.
fn canonical_json(value: &impl Serialize) -> anyhow::Result<Vec<u8>> {
    fn sort(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.sort_keys();
                map.values_mut().for_each(sort);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(sort),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(value)?;
    sort(&mut value);
    Ok(serde_json::to_vec(&value)?)
}

fn blob_path(descriptor: &Descriptor) -> String {
    format!("blobs/sha256/{}", descriptor.digest().digest())
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct DockerManifest {
    config: String,
    repo_tags: Vec<String>,
    layers: Vec<String>,
}

/// Tars the layout directory, files in sorted order with fixed owners and times.
fn write_archive(layout: &Path, archive: &Path, epoch: u64) -> anyhow::Result<()> {
    let mut files = Vec::new();
    collect(layout, layout, &mut files)?;
    files.sort();
    let mut tar = tar::Builder::new(fs::File::create(archive).with_context(|| format!("{}", archive.display()))?);
    for relative in files {
        let bytes = fs::read(layout.join(&relative))?;
        let mut header = header(tar::EntryType::Regular, 0o644, bytes.len() as u64, epoch);
        tar.append_data(&mut header, &relative, bytes.as_slice())?;
    }
    tar.into_inner()?.flush()?;
    Ok(())
}

fn collect(base: &Path, dir: &Path, files: &mut Vec<PathBuf>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(base, &path, files)?;
        } else {
            files.push(path.strip_prefix(base)?.to_path_buf());
        }
    }
    Ok(())
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the epoch.
fn rfc3339(epoch: u64) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(epoch)).to_string()
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }
}
