//! `cargo xtask cluster up|down|status`: the e2e tier's real control plane, kept running for
//! exploring — kube-apiserver, kube-controller-manager and etcd in a namespace of their own,
//! Ready nodes, and (with `--agents`) the agent deployed from `deploy/` on each.
//!
//! `serve` runs in the foreground and owns everything (the xtask starts it detached); SIGTERM or
//! SIGINT tears it all down. `down` signals it and sweeps what a crashed one left. `status` says
//! what is running and how to reach it.

use std::{
    path::{Path, PathBuf},
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};
use serde_json::json;
use topology_tests::{
    kubernetes::{Binaries, Cluster, nodes::NodeSpec},
    sandbox::{is_root, sweep_stale},
};

#[derive(Parser)]
#[command(about = "The real Kubernetes control plane of the e2e tier, on this machine")]
struct Args {
    /// Where the state file and the supervisor's log are.
    #[arg(long, default_value = "target/cluster")]
    state: PathBuf,
    #[command(subcommand)]
    command: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Start the cluster and keep it until SIGTERM or SIGINT.
    Serve {
        /// Zones, each with this many nodes (`zone-a`, `zone-b`, ...).
        #[arg(long, default_value_t = 3)]
        zones: usize,
        /// Nodes per zone.
        #[arg(long, default_value_t = 1)]
        nodes_per_zone: usize,
        /// Apply `deploy/` and start the agent's pod on every node.
        #[arg(long)]
        agents: bool,
    },
    /// Stop a running cluster (SIGTERM to its supervisor) and sweep leftovers of crashed ones.
    Down,
    /// What is running, and how to reach it.
    Status,
}

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !is_root() {
        bail!("the cluster needs root: network namespaces, cgroups and (with --agents) BPF programs");
    }
    match args.command {
        Action::Serve { zones, nodes_per_zone, agents } => serve(&args.state, zones, nodes_per_zone, agents),
        Action::Down => down(&args.state),
        Action::Status => status(&args.state),
    }
}

fn state_file(state: &Path) -> PathBuf {
    state.join("cluster.json")
}

fn serve(state: &Path, zones: usize, nodes_per_zone: usize, agents: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(state).with_context(|| format!("creating {}", state.display()))?;
    sweep_stale();
    let binaries = Binaries::locate().map_err(anyhow::Error::msg)?;
    let nodes: Vec<NodeSpec> = (0..zones)
        .flat_map(|zone| {
            let zone_name = format!("zone-{}", char::from(b'a' + zone as u8));
            (1..=nodes_per_zone).map(move |n| NodeSpec::new(&format!("node-{}{n}", &zone_name[5..]), &zone_name))
        })
        .collect();
    let version = binaries.kubernetes_version();
    let cluster = Cluster::start(binaries, &nodes);
    let agent_pods = match agents {
        true => {
            cluster.deploy();
            nodes.iter().map(|node| cluster.start_agent(&node.name, &[])).collect()
        }
        false => Vec::new(),
    };
    let description = json!({
        "pid": std::process::id(),
        "kubernetes": version,
        "server": cluster.server(),
        "kubeconfig": cluster.admin_kubeconfig(),
        "controlPlaneNetns": cluster.control_plane_netns(),
        "logs": cluster.dir().join("logs"),
        "nodes": cluster.nodes().iter().map(|node| json!({
            "name": node.spec.name, "zone": node.spec.zone, "netns": node.netns(),
            "address": node.address().to_string(), "cgroup": node.cgroup(), "pins": node.pins(),
        })).collect::<Vec<_>>(),
        "agents": agent_pods.iter().map(|agent: &topology_tests::kubernetes::agents::AgentPod| json!({
            "node": agent.node, "pod": agent.name, "netns": agent.netns(), "ip": agent.ip.to_string(),
            "log": agent.log,
        })).collect::<Vec<_>>(),
    });
    std::fs::write(state_file(state), serde_json::to_string_pretty(&description)?)?;
    // SAFETY: the handlers only store to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    println!("ready");
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(agent_pods);
    drop(cluster);
    let _ = std::fs::remove_file(state_file(state));
    Ok(())
}

fn read_state(state: &Path) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(state_file(state)).ok()?;
    serde_json::from_str(&text).ok()
}

fn alive(pid: u64) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

fn down(state: &Path) -> anyhow::Result<()> {
    if let Some(described) = read_state(state)
        && let Some(pid) = described["pid"].as_u64()
        && alive(pid)
    {
        // SAFETY: a signal to the supervisor this state file names.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while alive(pid) && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        if alive(pid) {
            bail!("the cluster's supervisor (pid {pid}) did not stop within 90 s");
        }
    }
    let _ = std::fs::remove_file(state_file(state));
    let swept = sweep_stale();
    println!("cluster down ({swept} leftover objects swept)");
    Ok(())
}

fn status(state: &Path) -> anyhow::Result<()> {
    let Some(described) = read_state(state) else {
        println!("no cluster is up (`cargo xtask cluster up` starts one)");
        return Ok(());
    };
    let running = described["pid"].as_u64().is_some_and(alive);
    println!("{}", serde_json::to_string_pretty(&described)?);
    if !running {
        println!("its supervisor is gone: `cargo xtask cluster down` sweeps what it left");
        return Ok(());
    }
    let netns = described["controlPlaneNetns"].as_str().unwrap_or_default();
    let kubeconfig = described["kubeconfig"].as_str().unwrap_or_default();
    println!(
        "\nkubectl, from the control plane's namespace:\n  ip netns exec {netns} kubectl --kubeconfig {kubeconfig} get nodes"
    );
    let output = std::process::Command::new("ip")
        .args(["netns", "exec", netns, "kubectl", "--kubeconfig", kubeconfig, "get", "nodes,pods", "-A", "-o", "wide"])
        .output()?;
    print!("{}", String::from_utf8_lossy(&output.stdout));
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    Ok(())
}
