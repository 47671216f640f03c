//! `cargo xtask bench control-plane`, with the in-process fake API server and real kernel maps:
//! - initial sync of 10,000 Services x 10 endpoints, from starting the watches to the maps written;
//! - one EndpointSlice update -> kernel map, p50/p99 over 300 updates, from the write on the API
//!   to the dataplane returning;
//! - RSS of the real agent binary at 30,000 Services x 4 endpoints;
//! - at Kubernetes' scale, 50,000 Services x 10 endpoints (`--capacity topo_slots=1048576`): the
//!   initial sync, and a restart's adoption of what it wrote (in a new container, keeping the
//!   attached programs; or loading them again, as other options must; opening the pinned maps,
//!   reading them back and rebuilding the writer's state), with a `scale:` line
//!   (`cargo bench --bench control_plane -- sync` runs this one alone, with the agent's log);
//! - at Kubernetes' limits (5,000 Nodes as kubelets report them, their status every 10 s, 10,000
//!   Services, 150,000 endpoints): the agent binary's RSS, CPU and API bytes at steady state, and a
//!   storm of 1,000 EndpointSlice updates/s (`limits`, `storm`), with a `scale:` line.
//!   `cargo bench --bench control_plane -- limits` runs this one alone;
//! - side by side with the real kube-proxy on the real API server (`control_plane/real.rs`), its
//!   nftables and then its iptables mode: full sync and network programming latency under an
//!   EndpointSlice storm, with a `real:` line (`cargo bench --bench control_plane -- real`).
//!
//! "The agent binary" is `$TOPOLOGY_AGENT`: `cargo xtask bench control-plane` sets it to the binary
//! the image ships (static, musl, jemalloc); the in-process scenarios run on the bench's own heap.
//!
//! Root only; the cgroup, pins and processes are removed at the end.

use std::{
    collections::BTreeSet,
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use topology_agent::{
    controller::{Controller, ControllerConfig, Health, Observation, Programmer},
    metrics::Metrics,
};
use topology_dataplane::{ApplyReport, Capacities, Dataplane, DataplaneConfig, LoadSignal};
use topology_kube::{
    EventSender,
    events::LogOnly,
    fake_api::{FakeApi, Resource},
    objects::{self, EndpointSpec},
    watch::KubeSource,
};
use topology_model::Protocol;
use topology_policy::desired::{DesiredState, ServicePort};
use topology_tests::{
    agent::{Agent, AgentOptions, Usage},
    sandbox::{CgroupGuard, PinGuard, is_root, unique_id},
    scale::Shape,
};

const NODES: usize = 30;
const UPDATES: usize = 300;
/// EndpointSlice updates per second in the storm, and how long it lasts.
const STORM_RATE: usize = 1000;
const STORM: Duration = Duration::from_secs(10);

#[path = "control_plane/limits.rs"]
mod limits;
#[path = "control_plane/real.rs"]
mod real;
#[path = "control_plane/storm.rs"]
mod storm;

/// Every apply the dataplane finished: when, the ports it covered, how long it took, and whether
/// it ended a full sync (a whole apply, or completing one written in chunks).
type Applied = Arc<Mutex<Vec<(Instant, BTreeSet<ServicePort>, Duration, bool)>>>;

/// The real dataplane, timing when each apply returns, and reading this process's CPU time when
/// one ends a full sync.
struct Timed {
    dataplane: Dataplane,
    applied: Applied,
    cpu_at_full: Arc<Mutex<Vec<Duration>>>,
}

impl Timed {
    fn full(&self, ports: BTreeSet<ServicePort>, took: Duration) {
        self.applied.lock().unwrap().push((Instant::now(), ports, took, true));
        self.cpu_at_full.lock().unwrap().push(process_cpu());
    }
}

/// CPU time (user and system) of every thread of this process so far: the agent's and the fake
/// API server's.
fn process_cpu() -> Duration {
    Usage::of(std::process::id()).cpu
}

impl Programmer for Timed {
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        let started = Instant::now();
        let report = self.dataplane.apply(desired);
        self.full(desired.services.keys().copied().collect(), started.elapsed());
        report
    }

    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport {
        let started = Instant::now();
        let report = Programmer::apply_changes(&mut self.dataplane, desired, changed);
        self.applied.lock().unwrap().push((Instant::now(), changed.clone(), started.elapsed(), false));
        report
    }

    fn complete(&mut self, desired: &DesiredState, retry: &BTreeSet<ServicePort>) -> ApplyReport {
        let started = Instant::now();
        let report = self.dataplane.complete(desired, retry);
        self.full(desired.services.keys().copied().collect(), started.elapsed());
        report
    }

    fn reserve(&mut self, ports: usize) {
        Programmer::reserve(&mut self.dataplane, ports);
    }

    fn observe(&mut self) -> Observation {
        self.dataplane.observe()
    }
}

fn vip(index: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(10, 96 + (index >> 16) as u8, (index >> 8) as u8, index as u8))
}

fn endpoint(service: usize, index: usize, generation: usize) -> EndpointSpec {
    let address = IpAddr::V4(Ipv4Addr::new(
        10,
        128 + (service >> 16) as u8 + generation as u8 * 16,
        (service >> 8) as u8,
        (service as u8).wrapping_add(index as u8 * 17),
    ));
    let mut spec = EndpointSpec::new(address, &format!("node-{}", (service + index) % NODES));
    spec.zone = Some(format!("zone-{}", (service + index) % NODES % 3));
    spec
}

fn slice(service: usize, endpoints: usize, generation: usize) -> Value {
    let specs: Vec<EndpointSpec> = (0..endpoints).map(|e| endpoint(service, e, generation)).collect();
    objects::slice("bench", &format!("svc-{service}-x1"), &format!("svc-{service}"), "http", 8080, "TCP", &specs)
}

/// A fake API with the nodes, `services` Services and their slices of `endpoints` endpoints.
async fn populated(services: usize, endpoints: usize) -> FakeApi {
    let api = FakeApi::start().await;
    for n in 0..NODES {
        api.apply(objects::node(&format!("node-{n}"), &format!("zone-{}", n % 3), Some("region-1"), "8"));
    }
    for s in 0..services {
        api.apply(objects::service("bench", &format!("svc-{s}"), vip(s), 80, "TCP", "http"));
        api.apply(slice(s, endpoints, 0));
    }
    api
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * q).round() as usize]
}

fn main() {
    if !is_root() {
        eprintln!("SKIPPED control-plane benchmark: needs root");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    let shape = Shape::KUBERNETES;
    if std::env::args().any(|arg| arg == "limits") {
        // `cargo bench --bench control_plane -- limits`: the cluster at Kubernetes' limits alone.
        let steady = runtime.block_on(limits::steady(shape, STORM_RATE, STORM));
        let mut storm = runtime.block_on(storm::in_process(shape, STORM_RATE, STORM));
        storm.sort_unstable();
        print_limits(&shape, &steady, &storm);
        return;
    }
    if std::env::args().any(|arg| arg == "real") {
        // `cargo bench --bench control_plane -- real`: beside the real kube-proxy alone.
        real::print(&real::run().expect("the real components (cargo xtask setup)"));
        return;
    }
    let large = Capacities { slots: 1 << 20, ..Capacities::default() };
    if std::env::args().any(|arg| arg == "sync") {
        // `cargo bench --bench control_plane -- sync`: the 50,000-Service sync and adoption alone,
        // with the agent's log (lists, full sync: plan and write) timed on stderr.
        tracing_subscriber::fmt()
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .with_writer(std::io::stderr)
            .init();
        let scale = runtime.block_on(sync_and_updates(50_000, 10, 0, large));
        print_scale(&scale);
        return;
    }
    let base = runtime.block_on(sync_and_updates(10_000, 10, UPDATES, Capacities::default()));
    let (rss, peak) = runtime.block_on(agent_rss());
    let scale = runtime.block_on(sync_and_updates(50_000, 10, 0, large));
    let steady = runtime.block_on(limits::steady(shape, STORM_RATE, STORM));
    let mut storm = runtime.block_on(storm::in_process(shape, STORM_RATE, STORM));
    storm.sort_unstable();

    let mut worst: Vec<(usize, Duration)> = base.updates.iter().copied().enumerate().collect();
    worst.sort_by_key(|(_, d)| std::cmp::Reverse(*d));
    eprintln!("slowest updates (index, latency): {:?}", &worst[..8]);
    let mut latencies = base.updates.clone();
    latencies.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("\ncontrol plane, fake API server in process, real kernel maps\n");
    println!("| measurement | result | target |");
    println!("| --- | ---: | ---: |");
    println!(
        "| initial sync, 10,000 Services × 10 endpoints, watches started → maps written | {:.0} ms | < 2,000 ms |",
        ms(base.sync)
    );
    println!(
        "| of which writing the maps (the dataplane's apply: diff, batched map updates, index) | {:.0} ms | |",
        ms(base.writing)
    );
    println!(
        "| a restart's adoption of those maps (a new container), programs kept / loaded again (other options) | {:.0} ms / {:.0} ms | |",
        ms(base.adopt),
        ms(base.reload)
    );
    println!("| loading and verifying the programs (the first start, empty pins) | {:.0} ms | |", ms(base.load));
    println!(
        "| one EndpointSlice update → kernel map, p50 / p99 ({UPDATES} updates, 10,000 Services) | {:.2} ms / {:.2} ms | p99 < 10 ms |",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99))
    );
    println!(
        "| agent RSS, 30,000 Services × 4 endpoints, after sync (peak) | {:.1} MiB ({:.1} MiB) | < 150 MiB |",
        rss, peak
    );
    print_scale(&scale);
    print_limits(&shape, &steady, &storm);
    if let Some(real) = real::run() {
        real::print(&real);
    }
}

/// The table and `scale:` line of the 50,000-Service sync.
fn print_scale(scale: &Measured) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!("\nat scale: 50,000 Services × 10 endpoints (`--capacity topo_slots=1048576`)\n");
    println!("| measurement | result | target |");
    println!("| --- | ---: | ---: |");
    println!("| initial sync, watches started → maps written | {:.0} ms | < 500 ms |", ms(scale.sync));
    println!(
        "| of which writing the maps (on the writer thread while the controller decides, then the whole apply) | {:.0} ms | |",
        ms(scale.writing)
    );
    // CPU time spent within the sync, shared among the cores, bounds its wall time from below:
    // the two side by side say how near the sync is to keeping every core busy.
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    println!(
        "| CPU time over the sync, this whole process (the agent's threads and the fake API's) | {:.2} core-s | |",
        scale.sync_cpu.as_secs_f64()
    );
    println!(
        "| the shortest sync that CPU time allows on {cores} cores | {:.0} ms | |",
        ms(scale.sync_cpu) / cores as f64
    );
    println!("| JSON the lists sent (Services, EndpointSlices) | {:.0} MiB | |", scale.listed_mib);
    println!(
        "| a restart's adoption of those maps (a new container), programs kept / loaded again (other options) | {:.0} ms / {:.0} ms | < 500 ms |",
        ms(scale.adopt),
        ms(scale.reload)
    );
    println!(
        "\nscale: nodes={NODES} services=50000 endpoints=500000 sync_s={:.2} adopt_s={:.2} rss_mib=- cpu_pct=- \
         storm_p99_ms=-",
        scale.sync.as_secs_f64(),
        scale.adopt.as_secs_f64()
    );
}

/// The mean time between two censuses of the Nodes (drawn in 10–20 minutes).
const CENSUS_MEAN: Duration = Duration::from_secs(900);

/// The table and `scale:` line of the cluster at Kubernetes' limits.
fn print_limits(shape: &Shape, steady: &limits::Steady, storm: &[Duration]) {
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "\nat Kubernetes' limits: {} Nodes (as kubelets report them, status every {} s), {} Services, {} endpoints \
         in slices of ≤ 100; the agent binary, then the storm in process\n",
        shape.nodes,
        limits::HEARTBEAT.as_secs(),
        shape.services(),
        shape.endpoints()
    );
    println!("| measurement | result | target |");
    println!("| --- | ---: | ---: |");
    println!("| agent start → ready (listed, programmed) | {:.0} ms | |", ms(steady.ready));
    println!(
        "| agent RSS at steady state (peak) | {:.1} MiB ({:.1} MiB) | < 100 MiB |",
        steady.usage.rss_mib, steady.usage.peak_mib
    );
    println!(
        "| agent CPU at steady state ({} s, {:.0} Node updates/s) | {:.1} % of a core | < 5 % |",
        limits::WINDOW.as_secs(),
        steady.node_events_per_s,
        steady.cpu_pct
    );
    println!("| Services decided again during it | {} | 0 |", steady.recomputed);
    println!(
        "| watch requests of the agent during it (rounds of 300–600 s: 3 kinds ÷ 450 s = 0.0067/s in the long run; \
         20 s rounds were 0.15/s) | {} | ≤ 0.015/s |",
        steady.watch_requests
    );
    for (resource, rate) in &steady.bytes_per_s {
        println!("| bytes/s received from the API: {resource:?} | {:.1} KiB/s | |", rate / 1024.0);
        if *resource == topology_kube::fake_api::Resource::Nodes && steady.node_events_per_s > 0.0 {
            println!(
                "| bytes received per Node status report in the cluster (the agent watches its own Node; each \
                 report's metadata is ~1.8 KB, the whole Node ~15.9 KB) | {:.1} B | |",
                rate / steady.node_events_per_s
            );
        }
    }
    // The census is one list every 10 to 20 minutes: 15 on average.
    let census_per_s = steady.census_bytes as f64 / CENSUS_MEAN.as_secs_f64();
    println!(
        "| the census of the Nodes (every Node's metadata from the watch cache, every 10–20 min), per census / \
         averaged | {:.1} MB / {:.1} KiB/s | |",
        steady.census_bytes as f64 / 1e6,
        census_per_s / 1024.0
    );
    let total: f64 = steady.bytes_per_s.iter().map(|(_, rate)| rate).sum::<f64>() + census_per_s;
    let quantile = |q: f64| storm.get(((storm.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default();
    println!(
        "| EndpointSlice storm, {STORM_RATE}/s for {} s, the agent's own event → kernel p50 / p99 (its histogram) | {:.2} / {:.2} ms | p99 < 5 ms |",
        STORM.as_secs(),
        ms(steady.storm.p50),
        ms(steady.storm.p99)
    );
    println!("| agent CPU during the storm | {:.1} % of a core | |", steady.storm.cpu_pct);
    println!(
        "| the storm in process, API write → kernel p50 / p99 / max (the fake API on the same 2 cores) | {:.2} / {:.2} / {:.2} ms | |",
        ms(quantile(0.5)),
        ms(quantile(0.99)),
        ms(quantile(1.0))
    );
    println!(
        "\nscale: nodes={} services={} endpoints={} sync_s={:.2} rss_mib={:.1} cpu_pct={:.1} storm_p99_ms={:.2} \
         api_kib_s={:.0}",
        shape.nodes,
        shape.services(),
        shape.endpoints(),
        steady.ready.as_secs_f64(),
        steady.usage.rss_mib,
        steady.cpu_pct,
        ms(steady.storm.p99),
        total / 1024.0
    );
}

/// What one scenario measured.
struct Measured {
    /// Watches started → maps written.
    sync: Duration,
    /// CPU time of the whole process (the agent's threads and the fake API's) over `sync`.
    sync_cpu: Duration,
    /// The part of it the dataplane's apply took.
    writing: Duration,
    /// A restart's `Dataplane::open` on the pinned maps the sync wrote.
    adopt: Duration,
    /// A restart's `Dataplane::open` that must load the programs again (other options).
    reload: Duration,
    /// The first `Dataplane::open`, on empty pins: loading and verifying the programs alone.
    load: Duration,
    /// Every update's latency.
    updates: Vec<Duration>,
    /// JSON the lists sent (Services and EndpointSlices), MiB.
    listed_mib: f64,
}

/// The initial sync of `services` × `endpoints` (and the part of it spent writing the maps),
/// `updates` single-slice updates, and the adoption of the result by a new dataplane.
async fn sync_and_updates(services: usize, endpoints: usize, updates: usize, capacities: Capacities) -> Measured {
    let id = unique_id();
    let cgroup = CgroupGuard::new(&id);
    let pins = PinGuard::new(&id);
    let api = populated(services, endpoints).await;
    let mut config = DataplaneConfig::new(pins.path(), cgroup.path());
    config.programs.capacities = capacities;
    let opened = Instant::now();
    let dataplane = Dataplane::open(&config).expect("open dataplane");
    let load = opened.elapsed();
    let applied: Applied = Arc::default();
    let cpu_at_full: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let (events, receiver) = EventSender::channel();
    let (started, cpu_before) = (Instant::now(), process_cpu());
    let source = KubeSource::start(&api.client(), Some("node-0"), &events, &shutdown);
    drop(events);
    let controller = Controller::new(
        ControllerConfig::new("node-0"),
        Timed { dataplane, applied: Arc::clone(&applied), cpu_at_full: Arc::clone(&cpu_at_full) },
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    );
    let token = shutdown.clone();
    let thread = std::thread::spawn(move || controller.run(&receiver, &token).map(drop));
    let (sync, writing) = loop {
        // The initial sync ends with its one whole apply, or (a large one) with completing what it
        // wrote in chunks while the controller decided; each chunk's time is writing too.
        let synced = {
            let applied = applied.lock().unwrap();
            let end = applied.iter().position(|(_, _, _, full)| *full);
            end.map(|end| (applied[end].0 - started, applied[..=end].iter().map(|(_, _, took, _)| *took).sum()))
        };
        if let Some(synced) = synced {
            break synced;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no initial sync");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let sync_cpu = cpu_at_full.lock().unwrap()[0].saturating_sub(cpu_before);

    let mut latencies = Vec::with_capacity(updates);
    for update in 0..updates {
        let service = (update * 37) % services;
        let port = ServicePort { vip: vip(service), port: 80, protocol: Protocol::Tcp };
        let seen = applied.lock().unwrap().len();
        let written = Instant::now();
        api.apply(slice(service, endpoints, update % 2 + 1));
        loop {
            let done = applied
                .lock()
                .unwrap()
                .iter()
                .skip(seen)
                .find(|(_, ports, _, _)| ports.contains(&port))
                .map(|(at, _, _, _)| *at);
            if let Some(done) = done {
                latencies.push(done - written);
                break;
            }
            assert!(written.elapsed() < Duration::from_secs(10), "update {update} never reached the kernel");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    shutdown.cancel();
    source.join().await;
    thread.join().expect("controller thread").expect("controller");
    // A restart: the programs and maps stay pinned; a new dataplane with the same options keeps
    // the programs and adopts the maps.
    let restarted = Instant::now();
    let adopted = Dataplane::open(&config).expect("adopt the pinned maps");
    let adopt = restarted.elapsed();
    assert_eq!(adopted.kernel().services.len(), services, "every port adopted");
    drop(adopted);
    // A restart with other programs (here: without the load signal) loads them again.
    config.programs.load_signal = match config.programs.load_signal {
        LoadSignal::Off => LoadSignal::On,
        _ => LoadSignal::Off,
    };
    let restarted = Instant::now();
    let reloaded = Dataplane::open(&config).expect("reload and adopt");
    let reload = restarted.elapsed();
    assert_eq!(reloaded.kernel().services.len(), services, "every port adopted");
    let listed = api.bytes_sent(Resource::Services) + api.bytes_sent(Resource::EndpointSlices);
    let listed_mib = listed as f64 / (1 << 20) as f64;
    Measured { sync, sync_cpu, writing, adopt, reload, load, updates: latencies, listed_mib }
}

/// Runs the agent binary against a fake API with 30,000 Services x 4 endpoints and reads its RSS
/// (current and peak) in MiB once it is ready.
async fn agent_rss() -> (f64, f64) {
    let id = unique_id();
    let cgroup = CgroupGuard::new(&id);
    let pins = PinGuard::new(&id);
    let api = populated(30_000, 4).await;
    let kubeconfig = std::env::temp_dir().join(format!("{id}-kubeconfig"));
    api.write_kubeconfig(&kubeconfig);
    let options = AgentOptions {
        kubeconfig: Some(&kubeconfig),
        ..AgentOptions::new(std::path::Path::new(""), "node-0", cgroup.path(), pins.path())
    };
    let agent = Agent::start(&options);
    let started = Instant::now();
    while !matches!(agent.get("/readyz"), Ok((200, _))) {
        assert!(started.elapsed() < Duration::from_secs(180), "the agent never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the first counters refresh and any allocation settle.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let usage = agent.usage();
    drop(agent);
    let _ = std::fs::remove_file(&kubeconfig);
    (usage.rss_mib, usage.peak_mib)
}
