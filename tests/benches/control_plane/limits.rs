//! The cluster at Kubernetes' own limits (`scale::Shape::KUBERNETES`: 5,000 realistic Nodes whose
//! status the fake API server updates every 10 s, 10,000 Services, 150,000 endpoints):
//! - the real agent binary: time to ready, then at steady state (heartbeats flowing) its RSS, CPU,
//!   the bytes it receives from the API per resource, and how many Services it decided again;
//! - in process, with the real dataplane: a storm of EndpointSlice updates at a fixed rate, each
//!   timed from the write on the API to the dataplane returning with its port.

use std::{
    collections::HashMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;
use topology_agent::{
    controller::{Controller, ControllerConfig, Health},
    dataplane::{Dataplane, DataplaneConfig},
    desired::{Protocol, ServicePort},
    events::LogOnly,
    metrics::Metrics,
    source::{EventSender, kube::KubeSource},
};
use topology_tests::{
    agent::{Agent, AgentOptions, Usage},
    fake_api::{FakeApi, Resource},
    sandbox::{CgroupGuard, PinGuard, unique_id},
    scale::{self, Shape},
};

use super::{Applied, Timed};

/// Every Node's status is updated this often (kubelet's `--node-status-update-frequency`, 10 s).
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// Steady state is measured over this long, after [`SETTLE`].
pub const WINDOW: Duration = Duration::from_secs(30);
/// Time given after ready for the first counters refresh and allocations to settle.
const SETTLE: Duration = Duration::from_secs(10);

/// The agent at steady state.
pub struct Steady {
    /// Agent start → ready (every kind listed and programmed).
    pub ready: Duration,
    /// Usage at the end of the window.
    pub usage: Usage,
    /// CPU over the window, percent of one core.
    pub cpu_pct: f64,
    /// Bytes per second the API sent, per resource, over the window.
    pub bytes_per_s: Vec<(Resource, f64)>,
    /// Node watch events per second over the window.
    pub node_events_per_s: f64,
    /// Services decided again during the window.
    pub recomputed: u64,
}

const RESOURCES: [Resource; 3] = [Resource::Nodes, Resource::Services, Resource::EndpointSlices];

/// Runs the agent binary on the cluster with heartbeats flowing and measures its steady state.
pub async fn steady(shape: Shape) -> Steady {
    let id = unique_id();
    let cgroup = CgroupGuard::new(&id);
    let pins = PinGuard::new(&id);
    let api = FakeApi::start().await;
    scale::populate(&api, &shape);
    let _heartbeats = api.heartbeats(HEARTBEAT);
    let kubeconfig = std::env::temp_dir().join(format!("{id}-kubeconfig"));
    api.write_kubeconfig(&kubeconfig);
    let node = scale::node_name(0);
    let options = AgentOptions {
        kubeconfig: Some(&kubeconfig),
        ..AgentOptions::new(Path::new(""), &node, cgroup.path(), pins.path())
    };
    let started = Instant::now();
    let agent = Agent::start(&options);
    loop {
        if matches!(agent.get("/readyz"), Ok((200, _))) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(300), "the agent never became ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ready = started.elapsed();
    tokio::time::sleep(SETTLE).await;

    let sent = || RESOURCES.map(|r| api.bytes_sent(r));
    let (before, usage_before, recomputed_before) = (sent(), agent.usage(), recomputed(&agent));
    let beats_before = api.modifications(Resource::Nodes);
    let window = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let (after, usage, recomputed_after) = (sent(), agent.usage(), recomputed(&agent));
    let seconds = window.elapsed().as_secs_f64();
    let node_events_per_s = (api.modifications(Resource::Nodes) - beats_before) as f64 / seconds;
    drop(agent);
    let _ = std::fs::remove_file(&kubeconfig);
    Steady {
        ready,
        usage,
        cpu_pct: (usage.cpu - usage_before.cpu).as_secs_f64() / seconds * 100.0,
        bytes_per_s: RESOURCES.iter().enumerate().map(|(i, r)| (*r, (after[i] - before[i]) as f64 / seconds)).collect(),
        node_events_per_s,
        recomputed: recomputed_after - recomputed_before,
    }
}

/// `topology_agent_services_recomputed_total` from the agent's /metrics.
fn recomputed(agent: &Agent) -> u64 {
    let (_, text) = agent.get("/metrics").expect("metrics");
    text.lines()
        .find_map(|line| line.strip_prefix("topology_agent_services_recomputed_total "))
        .and_then(|value| value.trim().parse().ok())
        .expect("topology_agent_services_recomputed_total")
}

/// A storm of `rate` EndpointSlice updates per second for `duration` (each a different Service,
/// every endpoint moved), heartbeats flowing; every update's latency to the kernel.
pub async fn storm(shape: Shape, rate: usize, duration: Duration) -> Vec<Duration> {
    let id = unique_id();
    let cgroup = CgroupGuard::new(&id);
    let pins = PinGuard::new(&id);
    let api = FakeApi::start().await;
    scale::populate(&api, &shape);
    let _heartbeats = api.heartbeats(HEARTBEAT);
    let config = DataplaneConfig::new(pins.path(), cgroup.path());
    let dataplane = Dataplane::open(&config).expect("open dataplane");
    let applied: Applied = Arc::default();
    let shutdown = CancellationToken::new();
    let (events, receiver) = EventSender::channel();
    let source = KubeSource::start(&api.client(), &events, &shutdown);
    drop(events);
    let controller = Controller::new(
        ControllerConfig::new(scale::node_name(0)),
        Timed { dataplane, applied: Arc::clone(&applied) },
        Arc::new(Health::default()),
        Arc::new(Metrics::default()),
        Box::new(LogOnly),
    );
    let token = shutdown.clone();
    let thread = std::thread::spawn(move || controller.run(&receiver, &token).map(drop));
    let started = Instant::now();
    while applied.lock().unwrap().is_empty() {
        assert!(started.elapsed() < Duration::from_secs(300), "no initial sync");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    // Open loop: every tick writes the updates due by then, whatever the agent is doing.
    const TICK: Duration = Duration::from_millis(10);
    let total = rate * duration.as_secs() as usize;
    let mut pending: HashMap<ServicePort, Instant> = HashMap::new();
    let mut latencies = Vec::with_capacity(total);
    let (mut written, mut seen) = (0, applied.lock().unwrap().len());
    let mut ticks = tokio::time::interval(TICK);
    let storm = Instant::now();
    while latencies.len() < total {
        ticks.tick().await;
        let due = ((storm.elapsed().as_secs_f64() * rate as f64) as usize).min(total);
        for update in written..due {
            // 37 is prime to the number of Services: each is updated once per round.
            let service = (update * 37) % shape.services();
            let generation = update / shape.services() + 1;
            let first = scale::slices(&shape, service, generation).swap_remove(0);
            let port = ServicePort { vip: scale::vip(service), port: 80, protocol: Protocol::Tcp };
            pending.insert(port, Instant::now());
            api.apply(first);
        }
        written = due;
        let applied = applied.lock().unwrap();
        for (done, ports, _, full) in &applied[seen..] {
            // A periodic full apply re-writes everything; the update's own apply is the partial one.
            if *full {
                continue;
            }
            for port in ports {
                if let Some(at) = pending.get(port).filter(|at| *at < done) {
                    latencies.push(*done - *at);
                    pending.remove(port);
                }
            }
        }
        seen = applied.len();
        assert!(
            storm.elapsed() < duration + Duration::from_secs(60),
            "{} updates never reached the kernel",
            pending.len()
        );
    }
    shutdown.cancel();
    source.join().await;
    thread.join().expect("controller thread").expect("controller");
    latencies
}
