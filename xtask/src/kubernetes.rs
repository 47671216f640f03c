//! The real Kubernetes components of the e2e tier — kube-apiserver, kube-controller-manager,
//! kube-proxy, etcd and CoreDNS — built from their own Go modules (`tests/cluster`, pinned there)
//! into a cache outside the clone keyed by their versions and the module files, so a second run,
//! and CI on the same machine, costs nothing. Nothing prebuilt is downloaded: the Go module proxy
//! serves sources, `go build` compiles them.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail};
use sha2::{Digest as _, Sha256};

use crate::cmd::{self, on_path};

/// The environment variable naming the directory of the built binaries, for the tests and tools
/// that start them.
pub const BIN_ENV: &str = "TOPOLOGY_KUBE_BIN";

/// The Go module of the control plane and etcd, and CoreDNS's own, relative to the workspace.
const CONTROL_PLANE_MODULE: &str = "tests/cluster";
const COREDNS_MODULE: &str = "tests/cluster/coredns";

/// The binaries, by file name, and the package each is built from (relative to its module).
const CONTROL_PLANE: [(&str, &str); 4] = [
    ("kube-apiserver", "k8s.io/kubernetes/cmd/kube-apiserver"),
    ("kube-controller-manager", "k8s.io/kubernetes/cmd/kube-controller-manager"),
    ("kube-proxy", "k8s.io/kubernetes/cmd/kube-proxy"),
    ("etcd", "./etcd"),
];
const COREDNS: (&str, &str) = ("coredns", "github.com/coredns/coredns");

/// Every binary the cache directory holds once complete.
pub const BINARIES: [&str; 5] = ["kube-apiserver", "kube-controller-manager", "kube-proxy", "etcd", "coredns"];

/// The pinned versions, read from the modules' `go.mod`.
#[derive(Debug, PartialEq, Eq)]
pub struct Versions {
    pub kubernetes: String,
    pub etcd: String,
    pub coredns: String,
}

/// Makes sure the binaries of the pinned versions are built; returns their directory.
pub fn ensure() -> anyhow::Result<PathBuf> {
    let root = cmd::workspace_root();
    if !on_path("go") {
        bail!(
            "Go is not on PATH: the e2e tier builds kube-apiserver, kube-controller-manager, kube-proxy, etcd and \
             CoreDNS from their Go modules (tests/cluster); install Go ≥ 1.25"
        );
    }
    let go_version = cmd::output(Command::new("go").args(["env", "GOVERSION"]))?;
    let versions = versions(&root)?;
    let ldflags = kubernetes_ldflags(&root, &versions.kubernetes)?;
    let key = cache_key(&root, &versions, &go_version, &ldflags)?;
    let dir = cache_root().join("kubernetes").join(&key);
    let bin = dir.join("bin");
    if dir.join("complete").is_file() && BINARIES.iter().all(|name| bin.join(name).is_file()) {
        return Ok(bin);
    }
    eprintln!(
        "setup: building Kubernetes {} (kube-apiserver, kube-controller-manager, kube-proxy), etcd {} and CoreDNS {} \
         with {go_version} into {} — 15–30 minutes cold on 2 cores, nothing once cached",
        versions.kubernetes,
        versions.etcd,
        versions.coredns,
        dir.display()
    );
    let staging = dir.with_file_name(format!("{key}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    let staging_bin = staging.join("bin");
    fs::create_dir_all(&staging_bin).with_context(|| format!("creating {}", staging_bin.display()))?;
    let packages: Vec<&str> = CONTROL_PLANE.iter().map(|(_, package)| *package).collect();
    go_build(&root.join(CONTROL_PLANE_MODULE), &staging_bin, &ldflags, &packages)?;
    go_build(&root.join(COREDNS_MODULE), &staging_bin, "-s -w", &[COREDNS.1])?;
    for name in BINARIES {
        if !staging_bin.join(name).is_file() {
            bail!("`go build` left no {name} in {}", staging_bin.display());
        }
    }
    let built = format!(
        "kubernetes {}\netcd {}\ncoredns {}\n{go_version}\n",
        versions.kubernetes, versions.etcd, versions.coredns
    );
    fs::write(staging.join("complete"), built)?;
    let _ = fs::remove_dir_all(&dir);
    fs::rename(&staging, &dir).with_context(|| format!("moving {} to {}", staging.display(), dir.display()))?;
    Ok(bin)
}

/// `go build -trimpath` of `packages` into `out`, statically (no cgo: the binaries run in any
/// namespace without the host's libraries mattering).
fn go_build(module: &Path, out: &Path, ldflags: &str, packages: &[&str]) -> anyhow::Result<()> {
    let mut out_arg = out.as_os_str().to_owned();
    out_arg.push("/");
    cmd::run(
        Command::new("go")
            .args(["build", "-trimpath", "-ldflags", ldflags, "-o"])
            .arg(out_arg)
            .args(packages)
            .env("CGO_ENABLED", "0")
            // The pins in go.sum are the build: never let a build resolve anything anew.
            .env("GOFLAGS", "-mod=readonly -buildvcs=false")
            .current_dir(module),
    )
}

/// The version variables Kubernetes' own build (`hack/lib/version.sh`) sets, so `/version` and
/// `--version` tell the truth. The module carries no git metadata: the tree state is `archive`,
/// as Kubernetes' build says of a source archive, and the date is the release's, from the proxy.
fn kubernetes_ldflags(root: &Path, version: &str) -> anyhow::Result<String> {
    let (major, minor) = major_minor(version).with_context(|| format!("k8s.io/kubernetes version {version}"))?;
    let info = cmd::output(
        Command::new("go")
            .args(["mod", "download", "-json", &format!("k8s.io/kubernetes@{version}")])
            .current_dir(root.join(CONTROL_PLANE_MODULE)),
    )?;
    let info: serde_json::Value = serde_json::from_str(&info).context("`go mod download -json` output")?;
    let info_file = info["Info"].as_str().context("`go mod download -json` names no Info file")?;
    let released: serde_json::Value = serde_json::from_slice(&fs::read(info_file)?)?;
    let date = released["Time"].as_str().context("the module's Info has no Time")?;
    let mut flags = vec!["-s".to_owned(), "-w".to_owned()];
    for package in ["k8s.io/component-base/version", "k8s.io/client-go/pkg/version"] {
        for (name, value) in [
            ("gitVersion", version),
            ("gitMajor", major),
            ("gitMinor", minor),
            ("gitTreeState", "archive"),
            ("buildDate", date),
        ] {
            flags.push(format!("-X {package}.{name}={value}"));
        }
    }
    Ok(flags.join(" "))
}

/// `v1.35.4` → (`1`, `35`).
fn major_minor(version: &str) -> Option<(&str, &str)> {
    let mut parts = version.strip_prefix('v')?.split('.');
    Some((parts.next()?, parts.next()?))
}

/// The versions `go.mod` pins.
pub fn versions(root: &Path) -> anyhow::Result<Versions> {
    let control_plane = read(&root.join(CONTROL_PLANE_MODULE).join("go.mod"))?;
    let coredns = read(&root.join(COREDNS_MODULE).join("go.mod"))?;
    let find = |text: &str, module: &str| {
        required_version(text, module).with_context(|| format!("{module} is not required in its go.mod"))
    };
    Ok(Versions {
        kubernetes: find(&control_plane, "k8s.io/kubernetes")?,
        etcd: find(&control_plane, "go.etcd.io/etcd/server/v3")?,
        coredns: find(&coredns, "github.com/coredns/coredns")?,
    })
}

/// The version `go.mod` requires of `module` (in a `require` block or line).
fn required_version(go_mod: &str, module: &str) -> Option<String> {
    go_mod.lines().find_map(|line| {
        let line = line.trim().strip_prefix("require ").unwrap_or(line.trim());
        let mut words = line.split_whitespace();
        (words.next()? == module).then(|| words.next().map(str::to_owned))?
    })
}

/// `kubernetes-v1.35.4_etcd-v3.6.5_coredns-v1.14.7_go1.26.8_<hash>`: the versions say what is in
/// the directory; the hash of every file the build reads makes a changed pin a new directory.
fn cache_key(root: &Path, versions: &Versions, go_version: &str, ldflags: &str) -> anyhow::Result<String> {
    let mut hash = Sha256::new();
    for file in ["go.mod", "go.sum", "etcd/main.go", "coredns/go.mod", "coredns/go.sum"] {
        hash.update(file.as_bytes());
        hash.update(read(&root.join(CONTROL_PLANE_MODULE).join(file))?.as_bytes());
    }
    // How the binaries are built is part of what they are.
    hash.update(ldflags.as_bytes());
    for (name, package) in CONTROL_PLANE.iter().chain([&COREDNS]) {
        hash.update(format!("{name}={package}\n").as_bytes());
    }
    let digest = hash.finalize();
    let short: String = digest.iter().take(6).map(|byte| format!("{byte:02x}")).collect();
    Ok(format!(
        "kubernetes-{}_etcd-{}_coredns-{}_{go_version}_{short}",
        versions.kubernetes, versions.etcd, versions.coredns
    ))
}

/// `$TOPOLOGY_CACHE`, else `$XDG_CACHE_HOME/topology-agent`, else `~/.cache/topology-agent`.
pub fn cache_root() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOPOLOGY_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache"));
    base.join("topology-agent")
}

fn read(path: &Path) -> anyhow::Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_versions_come_from_the_modules() {
        let versions = versions(&cmd::workspace_root()).expect("the modules' go.mod");
        assert!(versions.kubernetes.starts_with("v1.35."), "{versions:?}");
        assert!(versions.etcd.starts_with("v3.6."), "1.35's consistent reads need etcd ≥ 3.5.13: {versions:?}");
        assert!(versions.coredns.starts_with("v1.14."), "{versions:?}");
    }

    #[test]
    fn every_staging_module_is_replaced_by_its_published_release() {
        let root = cmd::workspace_root();
        let go_mod = read(&root.join(CONTROL_PLANE_MODULE).join("go.mod")).expect("go.mod");
        let kubernetes = versions(&root).expect("versions").kubernetes;
        let staging = format!("v0.{}", kubernetes.strip_prefix("v1.").expect("a 1.x release"));
        let replaced: Vec<&str> = go_mod
            .lines()
            .filter_map(|line| {
                let (from, to) = line.trim().split_once(" => ")?;
                let (module, version) = to.split_once(' ')?;
                assert_eq!((from, version), (module, staging.as_str()), "{line}");
                Some(module)
            })
            .collect();
        // k8s.io/kubernetes' own go.mod replaces exactly these 31 with ./staging paths.
        assert_eq!(replaced.len(), 31, "{replaced:?}");
        assert!(replaced.iter().all(|module| module.starts_with("k8s.io/")), "{replaced:?}");
    }

    #[test]
    fn required_versions_are_read_from_blocks_and_lines() {
        let text = "module x\n\nrequire go.etcd.io/etcd/server/v3 v3.6.5\n\nrequire (\n\tk8s.io/kubernetes v1.35.4 // indirect\n)\n";
        assert_eq!(required_version(text, "go.etcd.io/etcd/server/v3").as_deref(), Some("v3.6.5"));
        assert_eq!(required_version(text, "k8s.io/kubernetes").as_deref(), Some("v1.35.4"));
        assert_eq!(required_version(text, "k8s.io/api"), None);
        assert_eq!(major_minor("v1.35.4"), Some(("1", "35")));
    }
}
