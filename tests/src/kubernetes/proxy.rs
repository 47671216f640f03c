//! The real kube-proxy on a node of the cluster, as a user runs it: `system:kube-proxy`'s
//! certificate (the bootstrap `system:node-proxier` binding gives it its rights), its own Node
//! object for the zone and the node's address, its rules in the node's namespace — where every
//! pod's packets pass — and its metrics and health on the node's loopback. In a namespace the
//! conntrack table is the kernel's own, so the conntrack sizing and TCP timeouts are left as they
//! are (`0`), as kind runs it. Pods of a kube-proxy node route the ClusterIP range to their node,
//! as they route everything on a real node; nothing beyond the node has a route for it.

use std::{
    fs,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    time::Duration,
};

use super::{Cluster, control_plane::SERVICE_CIDR, eventually, network};
use crate::{agent, netns, sandbox::ProcessGuard};

/// Where kube-proxy serves its metrics, on the node's loopback.
const METRICS: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 10249);
/// Where it serves `/healthz` and `/livez`.
const HEALTHZ: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 10256);

/// kube-proxy's proxy mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ProxyMode {
    /// `--proxy-mode=nftables`: one verdict map per Service.
    Nftables,
    /// `--proxy-mode=iptables` (kube-proxy's default): a chain per Service and per endpoint,
    /// through the `iptables` the node has — Debian's, RHEL's and Ubuntu's default, iptables-nft.
    Iptables,
    /// The same mode through the legacy `x_tables` backend (`xtables-legacy-multi`), as on nodes
    /// whose iptables is the legacy one — and as kube-proxy's image picks when the host's rules
    /// are there.
    IptablesLegacy,
}

impl ProxyMode {
    /// The flag's value.
    pub fn flag(self) -> &'static str {
        match self {
            ProxyMode::Nftables => "nftables",
            ProxyMode::Iptables | ProxyMode::IptablesLegacy => "iptables",
        }
    }

    /// Its name in a table: the flag, and the backend where it is not the node's default.
    pub fn label(self) -> &'static str {
        match self {
            ProxyMode::IptablesLegacy => "iptables (legacy)",
            other => other.flag(),
        }
    }

    /// The command that saves the rules of its iptables backend (`None`: nftables mode).
    fn iptables_save(self) -> Option<&'static str> {
        match self {
            ProxyMode::Nftables => None,
            ProxyMode::Iptables => Some("iptables-save"),
            ProxyMode::IptablesLegacy => Some("iptables-legacy-save"),
        }
    }
}

/// The commands kube-proxy runs by these names, from the legacy backend.
const LEGACY: [&str; 6] =
    ["iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"];

/// A directory whose `iptables*` are the legacy backend's (`xtables-legacy-multi` picks its tool
/// by the name it is run as), for the front of kube-proxy's `PATH`.
fn legacy_path(dir: &std::path::Path) -> PathBuf {
    let bin = dir.join("iptables-legacy-bin");
    fs::create_dir_all(&bin).unwrap_or_else(|e| panic!("creating {}: {e}", bin.display()));
    for name in LEGACY {
        let link = bin.join(name);
        if !link.exists() {
            std::os::unix::fs::symlink("/usr/sbin/xtables-legacy-multi", &link)
                .unwrap_or_else(|e| panic!("linking {}: {e}", link.display()));
        }
    }
    bin
}

/// How its syncs are paced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncPacing {
    /// Its defaults, as users run it (iptables: at most one sync a second).
    Default,
    /// Every change synced at once (`--iptables-min-sync-period=0s`; nftables' default is 0).
    Eager,
}

/// A kube-proxy process on a node.
pub struct KubeProxy {
    /// Its node.
    pub node: String,
    /// Its mode.
    pub mode: ProxyMode,
    /// Its log.
    pub log: PathBuf,
    netns: String,
    process: ProcessGuard,
}

impl KubeProxy {
    /// Its Prometheus text.
    pub fn metrics(&self) -> std::io::Result<String> {
        netns::run_in(&self.netns, || agent::get(METRICS, "/metrics")).map(|(_, body)| body)
    }

    /// A sample of its metrics (the first series of `name`, labels ignored), if present.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let text = self.metrics().ok()?;
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .find(|line| line.split([' ', '{']).next() == Some(name))
            .and_then(|line| line.rsplit(' ').next()?.parse().ok())
    }

    /// Whether the node's ruleset is this kube-proxy's: its mode's rules are there, the other
    /// mode's are not (each mode removes the other's when it starts).
    pub fn owns_the_rules(&self) -> Result<(), String> {
        let nft = crate::sandbox::run("ip", &["netns", "exec", &self.netns, "nft", "list", "tables"]);
        let save = self.mode.iptables_save().unwrap_or("iptables-save");
        let iptables = crate::sandbox::run("ip", &["netns", "exec", &self.netns, save, "-t", "nat"]);
        let (in_nft, in_iptables) = (nft.contains("table ip kube-proxy"), iptables.contains("-A KUBE-SERVICES"));
        match (self.mode, in_nft, in_iptables) {
            (ProxyMode::Nftables, true, false) | (ProxyMode::Iptables | ProxyMode::IptablesLegacy, false, true) => {
                Ok(())
            }
            _ => {
                Err(format!("{} mode on {}: nft tables {nft:?}; iptables nat {iptables}", self.mode.flag(), self.node))
            }
        }
    }

    /// The rules it programmed, in a form its mode's loader reads back (`nft -f`,
    /// `iptables-restore`): its IPv4 table, or every IPv4 table iptables holds.
    pub fn ruleset(&self) -> String {
        match self.mode.iptables_save() {
            None => {
                crate::sandbox::run("ip", &["netns", "exec", &self.netns, "nft", "list", "table", "ip", "kube-proxy"])
            }
            Some(save) => crate::sandbox::run("ip", &["netns", "exec", &self.netns, save]),
        }
    }

    /// Whether its process is still running.
    pub fn running(&mut self) -> bool {
        self.process.child().try_wait().ok().flatten().is_none()
    }

    /// Waits until it has synced its rules at least once and has no change pending: every object
    /// the API server held when it started is in the node's ruleset.
    pub fn wait_synced(&mut self, timeout: Duration) {
        if let Err(last) = self.synced_within(timeout) {
            panic!("kube-proxy on {} not synced within {timeout:?} (log {}): {last}", self.node, self.log.display());
        }
    }

    /// [`KubeProxy::wait_synced`], a timeout returned (with what it last reported) rather than
    /// a panic: at scale, a mode may not finish its first sync in the time a run can give it.
    pub fn synced_within(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if !self.running() {
                panic!("kube-proxy on {} exited: {}", self.node, fs::read_to_string(&self.log).unwrap_or_default());
            }
            let synced = self.metric("kubeproxy_sync_proxy_rules_last_timestamp_seconds").unwrap_or(0.0);
            let pending = self.metric("kubeproxy_sync_proxy_rules_endpoint_changes_pending").unwrap_or(1.0)
                + self.metric("kubeproxy_sync_proxy_rules_service_changes_pending").unwrap_or(1.0);
            match (synced > 0.0, pending == 0.0) {
                (true, true) => return Ok(()),
                other if std::time::Instant::now() >= deadline => {
                    return Err(format!("synced, nothing pending: {other:?}"));
                }
                _ => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    }
}

impl Cluster {
    /// Starts kube-proxy on `node` in `mode`; from now on the node's new pods route the ClusterIP
    /// range to the node. Returns once it serves its metrics (see [`KubeProxy::wait_synced`]).
    pub fn start_kube_proxy(&self, node: &str, mode: ProxyMode, pacing: SyncPacing) -> KubeProxy {
        let node = self.node(node);
        node.proxied.store(true, std::sync::atomic::Ordering::Relaxed);
        let name = &node.spec.name;
        let kubeconfig = self.client_kubeconfig(&format!("kube-proxy-{name}"), "system:kube-proxy");
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--proxy-mode={}", mode.flag()),
            format!("--hostname-override={name}"),
            format!("--cluster-cidr={}", network::CLUSTER_CIDR),
            "--conntrack-max-per-core=0".to_owned(),
            "--conntrack-tcp-timeout-established=0".to_owned(),
            "--conntrack-tcp-timeout-close-wait=0".to_owned(),
            format!("--metrics-bind-address={METRICS}"),
            format!("--healthz-bind-address={HEALTHZ}"),
            "--oom-score-adj=0".to_owned(),
            "--v=1".to_owned(),
        ];
        if pacing == SyncPacing::Eager {
            args.push("--iptables-min-sync-period=0s".to_owned());
        }
        let log = format!("kube-proxy-{name}-{}", mode.flag());
        let path = (mode == ProxyMode::IptablesLegacy).then(|| {
            let legacy = legacy_path(&self.dir);
            format!("{}:{}", legacy.display(), std::env::var("PATH").unwrap_or_default())
        });
        let (process, log) =
            self.spawn_component("kube-proxy", &args, node.netns(), node.cgroup(), &log, path.as_deref());
        let mut proxy = KubeProxy { node: name.clone(), mode, log, netns: node.netns().to_owned(), process };
        let log = proxy.log.clone();
        eventually(&format!("kube-proxy on {name} serving (log {})", log.display()), Duration::from_secs(60), || {
            if !proxy.running() {
                panic!("kube-proxy on {name} exited: {}", fs::read_to_string(&log).unwrap_or_default());
            }
            proxy.metrics().map(drop).map_err(|e| e.to_string())
        });
        proxy
    }
}

/// Routes the ClusterIP range from a pod of a kube-proxy node to its node.
pub(super) fn route_services(pod_netns: &str) {
    crate::sandbox::run("ip", &["-n", pod_netns, "route", "add", SERVICE_CIDR, "via", network::GATEWAY, "dev", "eth0"]);
}
