//! Where the real components are: the directory `cargo xtask setup` builds them into (from
//! `tests/cluster`, keyed by version), named by `$TOPOLOGY_KUBE_BIN`.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

/// The variable `cargo xtask` sets for the tests it runs.
pub const BIN_ENV: &str = "TOPOLOGY_KUBE_BIN";

/// The directory of kube-apiserver, kube-controller-manager, kube-proxy, etcd and coredns.
#[derive(Clone, Debug)]
pub struct Binaries {
    dir: PathBuf,
}

impl Binaries {
    /// The built components, or why there are none (the e2e tier then skips, saying so).
    pub fn locate() -> Result<Self, String> {
        let Some(dir) = std::env::var_os(BIN_ENV) else {
            return Err(format!(
                "${BIN_ENV} is not set: `cargo xtask test` builds the real control plane from tests/cluster and sets it"
            ));
        };
        let binaries = Self { dir: PathBuf::from(dir) };
        for name in ["etcd", "kube-apiserver", "kube-controller-manager", "kube-proxy", "coredns"] {
            let path = binaries.path(name);
            assert!(path.is_file(), "${BIN_ENV} names {} but {} is missing", binaries.dir.display(), path.display());
        }
        Ok(binaries)
    }

    /// The built components, or `None` after saying why the test skips.
    pub fn or_skip(test: &str) -> Option<Self> {
        match Self::locate() {
            Ok(binaries) => Some(binaries),
            Err(why) => {
                eprintln!("SKIPPED {test}: {why}");
                None
            }
        }
    }

    /// The path of one component.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A command running one component.
    pub fn command(&self, name: &str) -> Command {
        Command::new(self.path(name))
    }

    /// What `kube-apiserver --version` prints, e.g. `Kubernetes v1.35.4`.
    pub fn kubernetes_version(&self) -> String {
        version_line(&self.path("kube-apiserver"))
    }
}

fn version_line(binary: &Path) -> String {
    let output = Command::new(binary).arg("--version").output().unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}
