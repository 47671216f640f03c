//! `cargo xtask bench control-plane`, with the in-process fake API server and real kernel maps:
//! - initial sync of 10,000 Services x 10 endpoints, from starting the watches to the maps written;
//! - one EndpointSlice update -> kernel map, p50/p99 over 300 updates, from the write on the API
//!   to the dataplane returning;
//! - RSS of the real agent binary at 30,000 Services x 4 endpoints;
//! - at Kubernetes' scale, 50,000 Services x 10 endpoints (`--capacity topo_slots=1048576`): the
//!   initial sync, and a restart's adoption of what it wrote (opening the pinned maps, reading them
//!   back and rebuilding the writer's state), with a `scale:` line.
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
    dataplane::{ApplyReport, Capacities, Dataplane, DataplaneConfig},
    desired::{DesiredState, Protocol, ServicePort},
    events::LogOnly,
    metrics::Metrics,
    source::{EventSender, kube::KubeSource},
};
use topology_tests::{
    agent::get,
    cluster::{self, EndpointSpec},
    fake_api::FakeApi,
    net::agent_binary,
    sandbox::{CgroupGuard, PinGuard, ProcessGuard, is_root, unique_id},
};

const NODES: usize = 30;
const UPDATES: usize = 300;

/// Every apply the dataplane finished, with the ports it covered and how long it took.
type Applied = Arc<Mutex<Vec<(Instant, BTreeSet<ServicePort>, Duration)>>>;

/// The real dataplane, timing when each apply returns.
struct Timed {
    dataplane: Dataplane,
    applied: Applied,
}

impl Programmer for Timed {
    fn apply(&mut self, desired: &DesiredState) -> ApplyReport {
        let started = Instant::now();
        let report = self.dataplane.apply(desired);
        let ports = desired.services.keys().copied().collect();
        self.applied.lock().unwrap().push((Instant::now(), ports, started.elapsed()));
        report
    }

    fn apply_changes(&mut self, desired: &DesiredState, changed: &BTreeSet<ServicePort>) -> ApplyReport {
        let started = Instant::now();
        let report = Programmer::apply_changes(&mut self.dataplane, desired, changed);
        self.applied.lock().unwrap().push((Instant::now(), changed.clone(), started.elapsed()));
        report
    }

    fn observe(&self) -> Observation {
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
    cluster::slice("bench", &format!("svc-{service}-x1"), &format!("svc-{service}"), "http", 8080, "TCP", &specs)
}

/// A fake API with the nodes, `services` Services and their slices of `endpoints` endpoints.
async fn populated(services: usize, endpoints: usize) -> FakeApi {
    let api = FakeApi::start().await;
    for n in 0..NODES {
        api.apply(cluster::node(&format!("node-{n}"), &format!("zone-{}", n % 3), Some("region-1"), "8"));
    }
    for s in 0..services {
        api.apply(cluster::service("bench", &format!("svc-{s}"), vip(s), 80, "TCP", "http"));
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
    let base = runtime.block_on(sync_and_updates(10_000, 10, UPDATES, Capacities::default()));
    let (rss, peak) = runtime.block_on(agent_rss());
    let large = Capacities { slots: 1 << 20, ..Capacities::default() };
    let scale = runtime.block_on(sync_and_updates(50_000, 10, 0, large));

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
        "| a restart's adoption of those maps (of which loading the programs, as on empty pins) | {:.0} ms ({:.0} ms) | |",
        ms(base.adopt),
        ms(base.load)
    );
    println!(
        "| one EndpointSlice update → kernel map, p50 / p99 ({UPDATES} updates, 10,000 Services) | {:.2} ms / {:.2} ms | p99 < 10 ms |",
        ms(percentile(&latencies, 0.5)),
        ms(percentile(&latencies, 0.99))
    );
    println!(
        "| agent RSS, 30,000 Services × 4 endpoints, after sync (peak) | {:.1} MiB ({:.1} MiB) | < 150 MiB |",
        rss, peak
    );
    println!("\nat scale: 50,000 Services × 10 endpoints (`--capacity topo_slots=1048576`)\n");
    println!("| measurement | result | target |");
    println!("| --- | ---: | ---: |");
    println!("| initial sync, watches started → maps written | {:.0} ms | < 500 ms |", ms(scale.sync));
    println!("| of which writing the maps | {:.0} ms | |", ms(scale.writing));
    println!(
        "| a restart's adoption of those maps (of which loading the programs) | {:.0} ms ({:.0} ms) | < 500 ms |",
        ms(scale.adopt),
        ms(scale.load)
    );
    println!(
        "\nscale: nodes={NODES} services=50000 endpoints=500000 sync_s={:.2} adopt_s={:.2} rss_mib=- cpu_pct=- \
         storm_p99_ms=-",
        scale.sync.as_secs_f64(),
        scale.adopt.as_secs_f64()
    );
}

/// What one scenario measured.
struct Measured {
    /// Watches started → maps written.
    sync: Duration,
    /// The part of it the dataplane's apply took.
    writing: Duration,
    /// A restart's `Dataplane::open` on the pinned maps the sync wrote.
    adopt: Duration,
    /// The first `Dataplane::open`, on empty pins: loading and verifying the programs alone.
    load: Duration,
    /// Every update's latency.
    updates: Vec<Duration>,
}

/// The initial sync of `services` × `endpoints` (and the part of it spent writing the maps),
/// `updates` single-slice updates, and the adoption of the result by a new dataplane.
async fn sync_and_updates(services: usize, endpoints: usize, updates: usize, capacities: Capacities) -> Measured {
    let id = unique_id();
    let cgroup = CgroupGuard::new(&id);
    let pins = PinGuard::new(&id);
    let api = populated(services, endpoints).await;
    let mut config = DataplaneConfig::new(pins.path(), cgroup.path());
    config.capacities = capacities;
    let opened = Instant::now();
    let dataplane = Dataplane::open(&config).expect("open dataplane");
    let load = opened.elapsed();
    let applied: Applied = Arc::default();
    let shutdown = CancellationToken::new();
    let (events, receiver) = EventSender::channel();
    let started = Instant::now();
    let source = KubeSource::start(&api.client(), &events, &shutdown);
    drop(events);
    let controller = Controller::new(
        ControllerConfig::new("node-0"),
        Timed { dataplane, applied: Arc::clone(&applied) },
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    );
    let token = shutdown.clone();
    let thread = std::thread::spawn(move || controller.run(&receiver, &token).map(drop));
    let (sync, writing) = loop {
        if let Some((done, _, writing)) = applied.lock().unwrap().first() {
            break (*done - started, *writing);
        }
        assert!(started.elapsed() < Duration::from_secs(120), "no initial sync");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };

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
                .find(|(_, ports, _)| ports.contains(&port))
                .map(|(at, _, _)| *at);
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
    // A restart: the programs and maps stay pinned; a new dataplane adopts them.
    let restarted = Instant::now();
    let adopted = Dataplane::open(&config).expect("adopt the pinned maps");
    let adopt = restarted.elapsed();
    assert_eq!(adopted.kernel().services.len(), services, "every port adopted");
    Measured { sync, writing, adopt, load, updates: latencies }
}

/// Runs the agent binary against a fake API with 30,000 Services x 4 endpoints and reads its RSS
/// (current and peak) in MiB once it is ready.
async fn agent_rss() -> (f64, f64) {
    let id = unique_id();
    let cgroup = CgroupGuard::new(&id);
    let pins = PinGuard::new(&id);
    let api = populated(30_000, 4).await;
    let kubeconfig = std::env::temp_dir().join(format!("{id}-kubeconfig"));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"{}\"}}}}]\n\
             contexts: [{{name: fake, context: {{cluster: fake, user: fake}}}}]\ncurrent-context: fake\nusers: [{{name: fake, user: {{}}}}]\n",
            api.url()
        ),
    )
    .expect("kubeconfig");
    let http = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("free port");
    let child = std::process::Command::new(agent_binary())
        .arg("run")
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["--node", "node-0", "--metrics-addr", &http.to_string()])
        .arg("--cgroup")
        .arg(cgroup.path())
        .arg("--pin-path")
        .arg(pins.path())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the agent");
    let mut agent = ProcessGuard::new(child);
    let started = Instant::now();
    loop {
        if matches!(get(http, "/readyz"), Ok((200, _))) {
            break;
        }
        assert!(agent.child().try_wait().unwrap().is_none(), "the agent exited");
        assert!(started.elapsed() < Duration::from_secs(180), "the agent never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the first counters refresh and any allocation settle.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.id())).expect("agent status");
    let field = |name: &str| -> f64 {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next()?.parse::<f64>().ok())
            .expect("a memory field")
            / 1024.0
    };
    let result = (field("VmRSS:"), field("VmHWM:"));
    drop(agent);
    let _ = std::fs::remove_file(&kubeconfig);
    drop(pins);
    drop(cgroup);
    result
}
