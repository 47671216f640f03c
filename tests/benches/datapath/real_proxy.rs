//! The real kube-proxy's own rules at each service count: a control plane built by `cargo xtask
//! setup` (`tests/src/kubernetes`) with one node; `count` selectorless Services over the bench's
//! two backends written to its API server; kube-proxy 1.35 started on the node in nftables mode,
//! then iptables mode, as users run it; once it has synced with nothing pending, the ruleset it
//! programmed is read back (`nft list table`, `iptables-save`) to be loaded, unchanged, into a
//! namespace of the bench beside the others. Without the built components the rows are left out
//! and the run says why.

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use topology_tests::{
    kubernetes::{
        Binaries, Cluster,
        nodes::NodeSpec,
        proxy::{ProxyMode, SyncPacing},
    },
    sandbox::run,
};

const NODE: &str = "kube-proxy-bench";
const NAMESPACE: &str = "bench";
/// kube-proxy's first full sync of 50,000 Services on two busy cores, with room.
const SYNC_TIMEOUT: Duration = Duration::from_secs(900);

/// One captured ruleset.
pub struct Captured {
    /// Its mode.
    pub mode: ProxyMode,
    /// Services it holds.
    pub count: usize,
    /// The text its loader reads.
    pub ruleset: String,
    /// The ClusterIP the bench dials: the Service in the middle, as for the shaped rulesets.
    pub target: SocketAddr,
}

/// Loads a captured ruleset into `netns` as kube-proxy wrote it, with the nfacct objects its
/// iptables rules name (kube-proxy creates them in its own namespace).
pub fn load(netns: &str, captured: &Captured) {
    let loader: &[&str] = match captured.mode {
        ProxyMode::Nftables => &["nft", "-f", "-"],
        ProxyMode::Iptables => &["iptables-restore"],
        ProxyMode::IptablesLegacy => &["iptables-legacy-restore"],
    };
    let accounts: BTreeSet<&str> =
        captured.ruleset.split("--nfacct-name").skip(1).filter_map(|rest| rest.split_whitespace().next()).collect();
    for account in accounts {
        run("ip", &["netns", "exec", netns, "nfacct", "add", account]);
    }
    super::rules::restore(netns, loader, &captured.ruleset);
}

/// kube-proxy's rulesets at `counts` (iptables only up to `iptables_max`), or none when the
/// components are not built.
pub fn capture(counts: &[usize], iptables_max: usize, backends: &[SocketAddr]) -> Vec<Captured> {
    let Some(binaries) = Binaries::or_skip("datapath bench: the real kube-proxy's rows") else { return Vec::new() };
    let started = Instant::now();
    let cluster = Cluster::start(binaries, &[NodeSpec::new(NODE, "zone-a")]);
    cluster.namespace(NAMESPACE);
    let mut cluster_ips: Vec<IpAddr> = Vec::new();
    let mut captured = Vec::new();
    let mut counts = counts.to_vec();
    counts.sort_unstable();
    for count in counts {
        let created = Instant::now();
        let from = cluster_ips.len();
        cluster_ips.extend(cluster.create_services(NAMESPACE, from, count, backends));
        eprintln!("kube-proxy bench: {} Services written in {:.1} s", count - from, created.elapsed().as_secs_f64());
        let target = SocketAddr::new(cluster_ips[count / 2], 80);
        for mode in [ProxyMode::Nftables, ProxyMode::Iptables] {
            if mode == ProxyMode::Iptables && count > iptables_max {
                continue;
            }
            let synced = Instant::now();
            let mut proxy = cluster.start_kube_proxy(NODE, mode, SyncPacing::Default);
            proxy.wait_synced(SYNC_TIMEOUT);
            proxy.owns_the_rules().unwrap_or_else(|why| panic!("{why}"));
            let ruleset = proxy.ruleset();
            eprintln!(
                "kube-proxy bench: {} mode synced {count} Services in {:.1} s ({} KiB of rules)",
                mode.flag(),
                synced.elapsed().as_secs_f64(),
                ruleset.len() / 1024
            );
            captured.push(Captured { mode, count, ruleset, target });
        }
    }
    eprintln!("kube-proxy bench: rules captured in {:.0} s", started.elapsed().as_secs_f64());
    captured
}
