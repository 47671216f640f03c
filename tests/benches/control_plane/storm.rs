//! A storm of EndpointSlice updates at a fixed rate, open loop (each tick writes the updates due
//! by then, whatever the agent is doing), each update a different Service with every endpoint
//! moved. Measured two ways:
//! - in process, with the real dataplane: from the write on the API to the dataplane returning
//!   with the update's port (the fake API server shares the machine's two cores with the agent);
//! - on the agent binary: its own `event_to_kernel_seconds` histogram over the storm (from
//!   receiving an event to its effect in the kernel), and its CPU.

use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;
use topology_agent::{
    controller::{Controller, ControllerConfig, Health},
    metrics::Metrics,
};
use topology_dataplane::{Dataplane, DataplaneConfig};
use topology_kube::{EventSender, events::LogOnly, fake_api::FakeApi, watch::KubeSource};
use topology_model::Protocol;
use topology_policy::desired::ServicePort;
use topology_tests::{
    agent::Agent,
    dnsperf::HistogramReading,
    sandbox::{CgroupGuard, PinGuard, unique_id},
    scale::{self, Shape},
};

use super::{Applied, Timed, limits::HEARTBEAT};

/// How often the writer wakes.
const TICK: Duration = Duration::from_millis(1);

/// The storm's writer.
pub struct Storm {
    shape: Shape,
    rate: usize,
    total: usize,
    written: usize,
    started: Instant,
}

impl Storm {
    /// `rate` updates per second for `duration`, starting now.
    pub fn new(shape: Shape, rate: usize, duration: Duration) -> Self {
        Self { shape, rate, total: rate * duration.as_secs() as usize, written: 0, started: Instant::now() }
    }

    /// Writes the updates due by now; the ports they change, with when each was written.
    pub fn write_due(&mut self, api: &FakeApi) -> Vec<(ServicePort, Instant)> {
        let due = ((self.started.elapsed().as_secs_f64() * self.rate as f64) as usize).min(self.total);
        let services = self.shape.services();
        let written = (self.written..due)
            .map(|update| {
                // 37 is prime to the number of Services: each is updated once per round.
                let service = (update * 37) % services;
                let first = scale::slices(&self.shape, service, update / services + 1).swap_remove(0);
                let at = Instant::now();
                api.apply(first);
                (ServicePort { vip: scale::vip(service), port: 80, protocol: Protocol::Tcp }, at)
            })
            .collect();
        self.written = due;
        written
    }

    /// Whether every update has been written.
    pub fn written_all(&self) -> bool {
        self.written == self.total
    }

    /// Updates in all.
    pub fn total(&self) -> usize {
        self.total
    }
}

/// The storm on the agent binary: its event → kernel p50 and p99 (from its histogram) and CPU.
pub struct OnAgent {
    /// `histogram_quantile(0.5, …)` over the storm.
    pub p50: Duration,
    /// `histogram_quantile(0.99, …)` over the storm.
    pub p99: Duration,
    /// CPU over the storm, percent of one core.
    pub cpu_pct: f64,
}

/// Runs the storm against the running `agent` (already ready, fed by `api`).
pub async fn on_agent(api: &FakeApi, agent: &Agent, shape: Shape, rate: usize, duration: Duration) -> OnAgent {
    let before = (histogram(agent), agent.usage());
    let mut storm = Storm::new(shape, rate, duration);
    let mut ticks = tokio::time::interval(TICK);
    let started = Instant::now();
    while !storm.written_all() {
        ticks.tick().await;
        storm.write_due(api);
    }
    // The last updates reach the kernel within milliseconds.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let after = (histogram(agent), agent.usage());
    let cpu_pct = (after.1.cpu - before.1.cpu).as_secs_f64() / started.elapsed().as_secs_f64() * 100.0;
    let quantile = |q| Duration::from_secs_f64(after.0.quantile_since(&before.0, q));
    OnAgent { p50: quantile(0.5), p99: quantile(0.99), cpu_pct }
}

fn histogram(agent: &Agent) -> HistogramReading {
    let (_, text) = agent.get("/metrics").expect("metrics");
    HistogramReading::parse(&text, "topology_agent_event_to_kernel_seconds")
}

/// The storm in process, heartbeats flowing; every update's latency from the write on the API to
/// the dataplane returning with its port.
pub async fn in_process(shape: Shape, rate: usize, duration: Duration) -> Vec<Duration> {
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
    let source = KubeSource::start(&api.client(), Some(&scale::node_name(0)), &events, &shutdown);
    drop(events);
    let controller = Controller::new(
        ControllerConfig::new(scale::node_name(0)),
        Timed { dataplane, applied: Arc::clone(&applied), cpu_at_full: Arc::default() },
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

    let mut storm = Storm::new(shape, rate, duration);
    let mut pending: HashMap<ServicePort, Instant> = HashMap::new();
    let mut latencies = Vec::with_capacity(storm.total());
    let mut seen = applied.lock().unwrap().len();
    let mut ticks = tokio::time::interval(TICK);
    while latencies.len() < storm.total() {
        ticks.tick().await;
        pending.extend(storm.write_due(&api));
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
        assert!(started.elapsed() < Duration::from_secs(600), "{} updates never reached the kernel", pending.len());
    }
    shutdown.cancel();
    source.join().await;
    thread.join().expect("controller thread").expect("controller");
    latencies
}
