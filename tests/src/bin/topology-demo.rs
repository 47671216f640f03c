//! `cargo xtask demo`: a multi-zone cluster simulated on this machine, a real agent per simulated
//! node, real connections, and a report of where they landed next to a twin without topology policy.

use std::{
    path::PathBuf,
    sync::atomic::{AtomicBool, Ordering},
    time::Instant,
};

use anyhow::bail;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use topology_tests::{
    demo::{
        self, DemoCluster, DemoConfig, DemoNodes, Failover, PodFailover, ServiceResult, overload::OverloadConfig,
        overload_report, real::RealDemo, report, rollout::RolloutConfig,
    },
    kubernetes::Binaries,
    sandbox::{is_root, sweep_stale},
};

/// What the demo shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Scenario {
    /// Every policy on a multi-zone cluster: where connections land, and a zone failing over.
    Zones,
    /// Real-time feedback: a zone's clients at twice its capacity, then a tenth, to a
    /// PreferClose Service and its feedback twin (`target/demo/overload.json`).
    Overload,
    /// A rolling update of the pods every mode's Service selects, one at a time; then a zone
    /// scaling from none under spillover (`target/demo/rollout.json`).
    Rollout,
}

#[derive(Parser)]
#[command(about = "Simulate a multi-zone cluster in network namespaces and measure where connections land")]
struct Args {
    /// What to show.
    #[arg(long, value_enum, default_value = "zones")]
    scenario: Scenario,
    /// overload: seconds of the surge.
    #[arg(long, default_value_t = 20.0)]
    surge_seconds: f64,
    /// overload: seconds of the calm after it.
    #[arg(long, default_value_t = 30.0)]
    calm_seconds: f64,
    /// rollout: pods per zone (three zones).
    #[arg(long, default_value_t = 10)]
    pods_per_zone: usize,
    /// Zones.
    #[arg(long, default_value_t = 3)]
    zones: usize,
    /// Nodes per zone.
    #[arg(long, default_value_t = 2)]
    nodes_per_zone: usize,
    /// Backends per zone.
    #[arg(long, default_value_t = 2)]
    backends_per_zone: usize,
    /// Regions the zones are split over (1 or 2).
    #[arg(long, default_value_t = 1)]
    regions: usize,
    /// Connections per node per Service.
    #[arg(long, default_value_t = 1000)]
    connections: u64,
    /// Where cluster.yaml, the logs and the report go.
    #[arg(long, default_value = "target/demo")]
    out: PathBuf,
    /// Leave the cluster running for exploring; the next run (or --clean) removes it.
    #[arg(long)]
    keep: bool,
    /// Only remove what an earlier (kept or crashed) demo left behind.
    #[arg(long)]
    clean: bool,
    /// What feeds the agents: the embedded one (a cluster file they re-read), or the real
    /// Kubernetes of the e2e tier (`cargo xtask setup` builds it) with its EndpointSlice
    /// controller writing the slices and hints (scenario `zones`).
    #[arg(long, value_enum, default_value = "embedded")]
    control_plane: ControlPlane,
}

/// Which control plane feeds the agents.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ControlPlane {
    /// A cluster file, written by the demo.
    Embedded,
    /// kube-apiserver, kube-controller-manager and etcd, built from their modules.
    Real,
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Stops at the next step after Ctrl-C; unwinding drops every guard, which removes it all.
fn check_interrupt() {
    if INTERRUPTED.load(Ordering::SeqCst) {
        panic!("interrupted: tearing everything down");
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !is_root() {
        bail!("the demo needs root: it loads BPF programs and creates cgroups and network namespaces");
    }
    let removed = sweep_stale();
    if removed > 0 {
        eprintln!("removed {removed} objects left by an earlier demo or test run");
    }
    if args.clean {
        return Ok(());
    }
    if args.scenario == Scenario::Overload {
        return overload(&args);
    }
    if args.scenario == Scenario::Rollout {
        return rollout(&args);
    }
    let config = DemoConfig {
        zones: args.zones,
        nodes_per_zone: args.nodes_per_zone,
        backends_per_zone: args.backends_per_zone,
        regions: args.regions,
        connections: args.connections,
    };
    config.validate()?;
    // SAFETY: the handler only stores into an atomic.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t) };

    let started = Instant::now();
    eprintln!(
        "starting {} nodes in {} zones with {} backends, one agent per node...",
        config.zones * config.nodes_per_zone,
        config.zones,
        config.zones * config.backends_per_zone
    );
    if args.control_plane == ControlPlane::Real {
        if args.keep {
            bail!("--keep is for the embedded control plane; `cargo xtask cluster up --agents` keeps a real one");
        }
        let binaries = Binaries::locate().map_err(anyhow::Error::msg)?;
        let mut demo = RealDemo::start(&config, &args.out, binaries);
        check_interrupt();
        let control_plane = format!(
            "{}: kube-apiserver, kube-controller-manager and etcd built from their modules, the agents deployed \
             from `deploy/`, every EndpointSlice and hint written by the EndpointSlice controller.",
            demo.version
        );
        eprintln!("cluster ready in {:.1} s on {}", started.elapsed().as_secs_f64(), demo.version);
        let (results, failover, pod) = zones(&mut demo, &config);
        return finish(&args, &config, started, &results, &failover, &pod, None, &control_plane);
    }
    let mut cluster = DemoCluster::start(&config, &args.out);
    check_interrupt();
    eprintln!("cluster ready in {:.1} s: {}", started.elapsed().as_secs_f64(), cluster.cluster_file.display());
    let (results, failover, pod) = zones(&mut cluster, &config);
    eprintln!("bytes: short requests and bulk downloads from every node to `bytes` and its twin...");
    let bytes = demo::bytes::measure(&cluster);
    check_interrupt();
    let control_plane = "the embedded one: every agent re-reads `cluster.yaml`, which the demo writes.";
    finish(&args, &config, started, &results, &failover, &pod, Some(&bytes), control_plane)?;
    if args.keep {
        println!("\nthe cluster is still running; explore it with:");
        for command in cluster.explore_commands() {
            println!("  {command}");
        }
        cluster.keep();
    }
    Ok(())
}

/// Where connections land, Service by Service, then a zone and a pod failing over.
fn zones(cluster: &mut impl DemoNodes, config: &DemoConfig) -> (Vec<ServiceResult>, Failover, PodFailover) {
    let services = cluster.plan().services.len();
    let progress = ProgressBar::new(services as u64).with_style(
        ProgressStyle::with_template("{spinner} {msg:<28} [{bar:30}] {pos}/{len} Services")
            .expect("progress template")
            .progress_chars("=> "),
    );
    progress.set_message(format!("{} connections per node", config.connections));
    let results = demo::measure(cluster, config.connections, &mut |done, _| {
        check_interrupt();
        progress.set_position(done as u64);
    });
    progress.finish_and_clear();
    eprintln!("failover: killing zone {}'s servers, then removing their endpoints...", cluster.plan().nodes[0].zone);
    let failover = demo::failover(cluster);
    check_interrupt();
    eprintln!("failover: killing one pod; its endpoint leaves {} s later...", demo::pod_failover::DETECTION.as_secs());
    let pod = demo::pod_failover(cluster);
    check_interrupt();
    (results, failover, pod)
}

/// Prints the table and the lines, and writes the report.
#[allow(clippy::too_many_arguments)]
fn finish(
    args: &Args,
    config: &DemoConfig,
    started: Instant,
    results: &[ServiceResult],
    failover: &Failover,
    pod: &PodFailover,
    bytes: Option<&[demo::bytes::BytesResult]>,
    control_plane: &str,
) -> anyhow::Result<()> {
    println!("\n{}", report::table(results));
    println!(
        "failover: {} servers killed; new connections left {} {:.0} ms after the endpoint update and came back in {:.0} ms; \
         {} connections, {} failed before the update, {} while the agent reacted, {} after",
        failover.killed,
        failover.zone,
        failover.moved_after.as_secs_f64() * 1e3,
        failover.back_after.as_secs_f64() * 1e3,
        failover.attempts,
        failover.failed_before_update,
        failover.failed_while_reacting,
        failover.failed_after
    );
    println!("{}", demo::pod_failover_line(pod));
    if let Some(close) = report::comparisons(results).into_iter().find(|c| c.ours.name == "prefer-close") {
        let avoided = close.gb_avoided_per_gb().unwrap_or(0.0);
        println!(
            "PreferClose keeps {:.1}% in zone where its twin without topology policy keeps {:.1}%: {:.0} MB of every GB stays in zone, \
             ${:.4} per GB saved at ${:.2}/GB each way",
            close.ours.total.in_zone().unwrap_or(0.0) * 100.0,
            close.baseline.total.in_zone().unwrap_or(0.0) * 100.0,
            avoided * 1000.0,
            avoided * 2.0 * report::DOLLARS_PER_GB_EACH_WAY,
            report::DOLLARS_PER_GB_EACH_WAY
        );
    }
    if let Some(bytes) = bytes {
        println!("{}", demo::bytes::line(bytes));
    }
    println!("control plane: {control_plane}");
    let measured = report::Measured { results, failover, pod, bytes, control_plane };
    report::write(&args.out, config, &measured)?;
    println!("\nreport: {} (chart: {})", args.out.join("report.md").display(), args.out.join("in-zone.svg").display());
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// `--scenario overload`: prints the table, writes `overload.{json,md,svg}`.
fn overload(args: &Args) -> anyhow::Result<()> {
    let config = OverloadConfig { surge_s: args.surge_seconds, calm_s: args.calm_seconds, ..OverloadConfig::default() };
    config.validate()?;
    // SAFETY: the handler only stores into an atomic.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t) };
    let started = Instant::now();
    eprintln!("starting one node's agent, zone a's and zone b's backends for two twin Services...");
    let report = demo::overload::run(&config, &args.out, &mut |line| {
        check_interrupt();
        eprintln!("{line}");
    });
    println!("\n{}", overload_report::table(&report));
    overload_report::write(&args.out, &report)?;
    println!(
        "report: {} (chart: {}, figures: {})",
        args.out.join("overload.md").display(),
        args.out.join("overload.svg").display(),
        args.out.join("overload.json").display()
    );
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    if !report.all_met() {
        bail!("not every target was met (see above)");
    }
    Ok(())
}

/// `--scenario rollout`: prints the table, writes `rollout.json`.
fn rollout(args: &Args) -> anyhow::Result<()> {
    let config = RolloutConfig { pods_per_zone: args.pods_per_zone, ..RolloutConfig::default() };
    config.validate()?;
    // SAFETY: the handler only stores into an atomic.
    unsafe { libc::signal(libc::SIGINT, on_interrupt as *const () as libc::sighandler_t) };
    let started = Instant::now();
    eprintln!(
        "starting one node's agent and {} pods (old and new) for every mode's Service...",
        6 * config.pods_per_zone
    );
    let report = demo::rollout::run(&config, &args.out, &mut |line| {
        check_interrupt();
        eprintln!("{line}");
    });
    println!("\n{}", report.table());
    report.write(&args.out)?;
    println!("figures: {}", args.out.join("rollout.json").display());
    println!("done in {:.1} s", started.elapsed().as_secs_f64());
    if !report.all_met() {
        bail!("not every target was met (see above)");
    }
    Ok(())
}
