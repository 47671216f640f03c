//! What the node components the harness runs beside the agent (kube-proxy, CoreDNS) share: a
//! client certificate of their own in a kubeconfig, and a process in a namespace and cgroup of
//! the cluster logging to the cluster's log directory.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Stdio,
};

use super::{Cluster, kubeconfig, kubeconfig::Credentials};
use crate::{
    netns,
    sandbox::{ProcessGuard, join_cgroup_on_spawn},
};

impl Cluster {
    /// A kubeconfig (`<file>.kubeconfig` in the cluster's directory) authenticating as `user`
    /// with a certificate of its own; RBAC decides what it may do.
    pub(super) fn client_kubeconfig(&self, file: &str, user: &str) -> PathBuf {
        let files = self.pki.client(file, user, None);
        let path = self.dir.join(format!("{file}.kubeconfig"));
        kubeconfig::write(&path, &self.server(), &self.pki.ca.cert, user, &Credentials::Certificate(files));
        path
    }

    /// Starts the built component `binary` with `args` in `netns` and `cgroup` (with
    /// `search_path` as its `PATH` when given), its output in `logs/<log>.log`; returns the
    /// process and the log's path.
    pub(super) fn spawn_component(
        &self,
        binary: &str,
        args: &[String],
        netns_name: &str,
        cgroup: &Path,
        log: &str,
        search_path: Option<&str>,
    ) -> (ProcessGuard, PathBuf) {
        let logs = self.dir.join("logs");
        fs::create_dir_all(&logs).unwrap_or_else(|e| panic!("creating {}: {e}", logs.display()));
        let path = logs.join(format!("{log}.log"));
        let file = fs::File::create(&path).unwrap_or_else(|e| panic!("creating {}: {e}", path.display()));
        let mut command = self.binaries.command(binary);
        command.args(args).stdin(Stdio::null()).stdout(file.try_clone().expect("log")).stderr(file);
        if let Some(search_path) = search_path {
            command.env("PATH", search_path);
        }
        netns::enter_on_spawn(&mut command, netns_name);
        join_cgroup_on_spawn(&mut command, cgroup);
        let process = command.spawn().unwrap_or_else(|e| panic!("starting {binary} ({log}): {e}"));
        (ProcessGuard::new(process), path)
    }
}
