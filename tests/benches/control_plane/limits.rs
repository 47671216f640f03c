//! The cluster at Kubernetes' own limits (`scale::Shape::KUBERNETES`: 5,000 realistic Nodes whose
//! status the fake API server updates every 10 s, 10,000 Services, 150,000 endpoints):
//! - the real agent binary: time to ready, then at steady state (heartbeats flowing) its RSS, CPU,
//!   the bytes it receives from the API per resource, and how many Services it decided again;
//! - then a storm of EndpointSlice updates on it ([`storm`](super::storm)).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use topology_kube::fake_api::{FakeApi, Resource};
use topology_tests::{
    agent::{Agent, AgentOptions, Usage},
    sandbox::{CgroupGuard, PinGuard, unique_id},
    scale::{self, Shape},
};

use super::storm::{OnAgent, on_agent};

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
    /// Bytes of Nodes the API sent before the agent was ready: its census of the Nodes (every
    /// Node's metadata) and the list of its own Node.
    pub census_bytes: u64,
    /// Node watch events per second over the window.
    pub node_events_per_s: f64,
    /// Watch requests the agent made (every kind) during the window (the first three, one per
    /// kind, came before it).
    pub watch_requests: usize,
    /// Services decided again during the window.
    pub recomputed: u64,
    /// The storm after the window, as the agent measures it.
    pub storm: OnAgent,
}

const RESOURCES: [Resource; 3] = [Resource::Nodes, Resource::Services, Resource::EndpointSlices];

/// Runs the agent binary on the cluster with heartbeats flowing and measures its steady state,
/// then a storm of `rate` EndpointSlice updates per second for `storm`.
pub async fn steady(shape: Shape, rate: usize, storm: Duration) -> Steady {
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
    let census_bytes = api.bytes_sent(Resource::Nodes);
    tokio::time::sleep(SETTLE).await;

    let sent = || RESOURCES.map(|r| api.bytes_sent(r));
    let (before, usage_before, recomputed_before) = (sent(), agent.usage(), recomputed(&agent));
    let beats_before = api.modifications(Resource::Nodes);
    let watches = || RESOURCES.iter().map(|r| api.watches(*r)).sum::<usize>();
    let watches_before = watches();
    let window = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let (after, usage, recomputed_after) = (sent(), agent.usage(), recomputed(&agent));
    let seconds = window.elapsed().as_secs_f64();
    let node_events_per_s = (api.modifications(Resource::Nodes) - beats_before) as f64 / seconds;
    let watch_requests = watches() - watches_before;
    let storm = on_agent(&api, &agent, shape, rate, storm).await;
    drop(agent);
    let _ = std::fs::remove_file(&kubeconfig);
    Steady {
        ready,
        usage,
        cpu_pct: (usage.cpu - usage_before.cpu).as_secs_f64() / seconds * 100.0,
        bytes_per_s: RESOURCES.iter().enumerate().map(|(i, r)| (*r, (after[i] - before[i]) as f64 / seconds)).collect(),
        census_bytes,
        node_events_per_s,
        watch_requests,
        recomputed: recomputed_after - recomputed_before,
        storm,
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
