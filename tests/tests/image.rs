//! The image `cargo xtask image` builds: its archive unpacked and checked blob by blob, read by an
//! independent implementation (skopeo, the library `podman load` uses), and the agent run from the
//! unpacked root filesystem, alone in it (chroot), where it must answer `--version`, allocate with
//! jemalloc as `heap.rs` sets it, and print the same `explain` as the agent built for the tests.
//!
//! `cargo xtask test` builds the image first and names it in `$TOPOLOGY_IMAGE`; run alone, the test
//! looks in `target/image/` and skips with the reason when nothing is there.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    collections::BTreeMap,
    io::Read as _,
    path::{Path, PathBuf},
    process::Command,
};

use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest, MediaType};
use sha2::{Digest as _, Sha256};
use topology_tests::{
    net::{agent_binary, image_archive},
    sandbox::{is_root, on_path},
};

const BINARY: &str = "usr/local/bin/topology-agent";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Every file of a tar, by path.
fn entries(tar: &[u8]) -> BTreeMap<String, (tar::Header, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    let mut files = BTreeMap::new();
    for entry in archive.entries().expect("tar entries") {
        let mut entry = entry.expect("tar entry");
        let path = entry.path().expect("entry path").to_string_lossy().into_owned();
        let mut bytes = Vec::new();
        entry.read_to_end(&mut bytes).expect("entry contents");
        files.insert(path, (entry.header().clone(), bytes));
    }
    files
}

/// The blob a descriptor names, checked against its digest and size.
fn blob<'a>(files: &'a BTreeMap<String, (tar::Header, Vec<u8>)>, digest: &str, size: u64) -> &'a [u8] {
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    let (_, bytes) = files.get(&format!("blobs/sha256/{hex}")).unwrap_or_else(|| panic!("blob {digest} missing"));
    assert_eq!(sha256(bytes), digest, "blob {digest} does not hash to its name");
    assert_eq!(bytes.len() as u64, size, "blob {digest} has the wrong size");
    bytes
}

/// The DaemonSet's image reference and the capabilities it adds.
fn daemonset() -> (String, Vec<String>) {
    let text = std::fs::read_to_string(workspace().join("deploy/daemonset.yaml")).expect("deploy/daemonset.yaml");
    let yaml: serde_yaml::Value = serde_yaml::from_str(&text).expect("daemonset YAML");
    let container = &yaml["spec"]["template"]["spec"]["containers"][0];
    let image = container["image"].as_str().expect("containers[0].image").to_owned();
    let caps = container["securityContext"]["capabilities"]["add"].as_sequence().expect("capabilities.add");
    (image, caps.iter().map(|c| c.as_str().expect("capability").to_owned()).collect())
}

#[test]
fn the_image_is_what_the_daemonset_runs_and_the_agent_runs_alone_in_it() {
    let Some(archive) = image_archive() else {
        eprintln!("SKIPPED image: no target/image/topology-agent.tar; run `cargo xtask image`");
        return;
    };
    let files = entries(&std::fs::read(&archive).expect("read the archive"));
    let (daemonset_image, daemonset_caps) = daemonset();

    // The layout: version, index, one manifest tagged as the DaemonSet's image.
    let layout: serde_json::Value = serde_json::from_slice(&files["oci-layout"].1).expect("oci-layout");
    assert_eq!(layout["imageLayoutVersion"], "1.0.0");
    let index: ImageIndex = serde_json::from_slice(&files["index.json"].1).expect("index.json");
    assert_eq!(index.manifests().len(), 1, "one image in the archive");
    let entry = &index.manifests()[0];
    let annotations = entry.annotations().as_ref().expect("index annotations");
    assert_eq!(annotations["io.containerd.image.name"], daemonset_image, "tagged as deploy/daemonset.yaml's image");
    assert_eq!(Some(annotations["org.opencontainers.image.ref.name"].as_str()), daemonset_image.rsplit(':').next());
    let manifest_bytes = blob(&files, entry.digest().as_ref(), entry.size());
    let manifest: ImageManifest = serde_json::from_slice(manifest_bytes).expect("manifest");
    assert_eq!(manifest.media_type(), &Some(MediaType::ImageManifest));
    assert_eq!(manifest.layers().len(), 1, "one layer: the agent");

    // The config: entrypoint, user, labels, and the layer's uncompressed digest.
    let config_bytes = blob(&files, manifest.config().digest().as_ref(), manifest.config().size());
    let config: ImageConfiguration = serde_json::from_slice(config_bytes).expect("config");
    let run = config.config().as_ref().expect("config.config");
    assert_eq!(run.entrypoint().as_deref(), Some(&[format!("/{BINARY}")][..]));
    assert_eq!(run.user().as_deref(), Some("0:0"), "uid 0: the only user added capabilities reach");
    let labels = run.labels().as_ref().expect("labels");
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(labels["org.opencontainers.image.revision"].len(), 40, "the commit it was built from");
    assert_eq!(labels["io.topology-agent.capabilities"], daemonset_caps.join(","), "the DaemonSet grants these");
    let layer = &manifest.layers()[0];
    assert_eq!(layer.media_type(), &MediaType::ImageLayer);
    let layer_bytes = blob(&files, layer.digest().as_ref(), layer.size());
    assert_eq!(config.rootfs().diff_ids(), &vec![sha256(layer_bytes)], "diff_id of the uncompressed layer");

    // Docker's index names the same blobs.
    let docker: serde_json::Value = serde_json::from_slice(&files["manifest.json"].1).expect("manifest.json");
    let hex = |digest: &str| format!("blobs/sha256/{}", digest.strip_prefix("sha256:").expect("sha256"));
    assert_eq!(docker[0]["Config"], hex(manifest.config().digest().as_ref()));
    assert_eq!(docker[0]["Layers"][0], hex(layer.digest().as_ref()));
    assert_eq!(docker[0]["RepoTags"][0], daemonset_image);

    // The layer holds the binary and its directories, owned by root, and nothing else.
    let layer_files = entries(layer_bytes);
    let paths: Vec<&str> = layer_files.keys().map(String::as_str).collect();
    assert_eq!(paths, ["usr/", "usr/local/", "usr/local/bin/", BINARY]);
    let (header, _) = &layer_files[BINARY];
    assert_eq!((header.mode().expect("mode"), header.uid().expect("uid")), (0o755, 0));

    independent_reader(&archive);
    runs_alone(layer_bytes);
}

/// skopeo (containers/image, what `podman load` uses) reads both formats and verifies every blob.
fn independent_reader(archive: &Path) {
    if !on_path("skopeo") {
        eprintln!("SKIPPED image: skopeo not installed (`cargo xtask setup` installs it)");
        return;
    }
    let dir = tempfile::tempdir().expect("scratch dir");
    for (from, to) in [("oci-archive", "oci-copy:x"), ("docker-archive", "docker-copy:x")] {
        let to = format!("oci:{}", dir.path().join(to).display());
        let status = Command::new("skopeo")
            .args(["copy", "--quiet", &format!("{from}:{}", archive.display()), &to])
            .status()
            .expect("skopeo");
        assert!(status.success(), "skopeo could not copy the archive as {from}");
    }
}

/// The agent from the unpacked rootfs: `--version`, and `explain` of a fixture equal to the test build's.
fn runs_alone(layer: &[u8]) {
    let rootfs = tempfile::tempdir().expect("rootfs");
    tar::Archive::new(layer).unpack(rootfs.path()).expect("unpack the layer");
    // The cluster of the PreferClose scenario's first step (a file of its archive).
    let scenario = workspace().join("topology-agent/testdata/scenarios/prefer-close.txtar");
    let scenario = std::fs::read_to_string(&scenario).expect("the PreferClose scenario");
    let fixture = scenario
        .split("\n-- ")
        .find_map(|file| file.strip_prefix("1-in-zone.yaml --\n"))
        .expect("the scenario's 1-in-zone.yaml");
    std::fs::write(rootfs.path().join("cluster.yaml"), fixture).expect("fixture into the rootfs");
    // chroot proves the binary needs nothing from the host: the rootfs has no loader and no libc.
    let (mut command, cluster) = if is_root() {
        let mut chroot = Command::new("chroot");
        chroot.arg(rootfs.path()).arg(format!("/{BINARY}"));
        (chroot, PathBuf::from("/cluster.yaml"))
    } else {
        eprintln!("not root: running the unpacked binary without chroot");
        (Command::new(rootfs.path().join(BINARY)), rootfs.path().join("cluster.yaml"))
    };
    let version = stdout(Command::new(command.get_program()).args(command.get_args()).arg("--version"));
    assert_eq!(version.trim(), format!("topology-agent {}", env!("CARGO_PKG_VERSION")));
    // The image's allocator and its settings (`heap.rs`): jemalloc prints them on stderr on request.
    let mut stats = Command::new(command.get_program());
    stats.args(command.get_args()).arg("--version").env("_RJEM_MALLOC_CONF", "stats_print:true");
    let output = stats.output().expect("run the agent");
    let printed = String::from_utf8_lossy(&output.stderr);
    for setting in ["opt.narenas: 1", "opt.dirty_decay_ms: 5000", "opt.muzzy_decay_ms: 0"] {
        assert!(
            printed.contains(setting),
            "the image's agent allocates with jemalloc set as heap.rs says ({setting}): {printed}"
        );
    }
    let explain = |cluster: &Path| {
        ["explain", "--cluster", &cluster.to_string_lossy(), "--node", "node-a", "--output", "json"].map(String::from)
    };
    let in_image = stdout(command.args(explain(&cluster)));
    let reference = stdout(Command::new(agent_binary()).args(explain(&rootfs.path().join("cluster.yaml"))));
    assert!(in_image.contains("\"backends\""), "explain printed no plan: {in_image}");
    assert_eq!(in_image, reference, "the image's agent decides as the tested one does");
}

fn stdout(command: &mut Command) -> String {
    let output = command.output().expect("run the agent");
    assert!(output.status.success(), "{command:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("utf-8")
}
