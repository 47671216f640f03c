//! `cargo xtask demo --scenario rollout`: a rolling update through the real kernel, for every
//! mode at once. One Service per mode selects the same pods (three zones, `pods_per_zone` each;
//! this node is in zone a); the rollout replaces them one at a time as a Deployment does with
//! `maxSurge: 1, maxUnavailable: 0` and the endpoint controller reports it: the new pod listed not
//! ready for `not_ready_s`, then ready; the old one then terminating (serving) for
//! `terminating_s`, then gone from the slices, its process exiting half a second later. For the
//! hints mode the slices carry no hints while any endpoint lacks one (a pod not ready yet), as
//! the controller writes them. Meanwhile a client on this node opens TCP connections to each
//! Service at a steady rate and holds one connected UDP socket to it.
//!
//! Per mode: the in-zone share before and during the rollout, the connections that failed, and
//! the UDP sockets ended while their backend still served (never, since a backend ends its
//! sockets only once it leaves the Service). Then zone a scales from 0 to its full size under
//! spillover, and the largest load factor of the agent's plan at any step is recorded.

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use serde::Serialize;
use serde_json::Value;
use topology_kube::objects::{self, EndpointSpec};

use crate::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    openloop::{OpenLoopClient, OpenLoopReport, Outcome, Phase},
    traffic::monotonic_ns,
};

/// The scenario's shape and timing.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutConfig {
    /// Pods per zone (three zones).
    pub pods_per_zone: usize,
    /// Seconds a new pod is listed before it is ready.
    pub not_ready_s: f64,
    /// Seconds an old pod is listed terminating (and serving) before it is gone.
    pub terminating_s: f64,
    /// Seconds of traffic before the rollout.
    pub steady_s: f64,
    /// New TCP connections per second to each Service.
    pub rate_per_s: f64,
}

impl Default for RolloutConfig {
    fn default() -> Self {
        Self { pods_per_zone: 10, not_ready_s: 2.0, terminating_s: 1.0, steady_s: 5.0, rate_per_s: 30.0 }
    }
}

impl RolloutConfig {
    /// Checks the numbers before anything starts.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(1..=10).contains(&self.pods_per_zone) {
            anyhow::bail!("rollout: 1 to 10 pods per zone");
        }
        if self.not_ready_s < 0.5 || self.terminating_s < 0.5 || self.steady_s < 2.0 {
            anyhow::bail!("rollout: at least 0.5 s not ready and terminating, and 2 s of steady traffic");
        }
        if !(1.0..=100.0).contains(&self.rate_per_s) {
            anyhow::bail!("rollout: 1 to 100 connections per second to each Service");
        }
        Ok(())
    }

    /// Seconds one pod's replacement takes.
    fn step_s(&self) -> f64 {
        self.not_ready_s + self.terminating_s + EXIT_AFTER.as_secs_f64()
    }
}

/// How long an old pod's process runs after its endpoint is gone.
const EXIT_AFTER: Duration = Duration::from_millis(500);
/// Zones, this node's first.
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// The modes, each a Service over the same pods: name, ClusterIP, and how it is written.
const MODES: [(&str, &str); 8] = [
    ("default", "10.96.0.80"),
    ("prefer-close", "10.96.0.81"),
    ("prefer-same-zone", "10.96.0.82"),
    ("prefer-same-node", "10.96.0.83"),
    ("topology-keys", "10.96.0.84"),
    ("spillover", "10.96.0.85"),
    ("feedback", "10.96.0.86"),
    ("hints", "10.96.0.87"),
];

/// A pod's state as its endpoint shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodState {
    Absent,
    NotReady,
    Ready,
    Terminating,
}

/// One mode's figures.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ModeResult {
    /// The Service's name (the mode).
    pub mode: String,
    /// Share of the connections served in this node's zone before the rollout.
    pub steady_in_zone: f64,
    /// The same during the rollout.
    pub rollout_in_zone: f64,
    /// Connections that failed during the rollout.
    pub failed: usize,
    /// Connections made during the rollout.
    pub connections: usize,
    /// UDP sockets ended while their backend still served.
    pub resets_to_serving: usize,
    /// UDP sockets ended because their backend left the Service.
    pub ended_on_departure: usize,
    /// The in-zone share over time: `(seconds from the rollout's start, share)` per window of
    /// `rollout_chart::WINDOW_S` (the chart's line).
    pub series: Vec<(f64, f64)>,
}

/// What the run found.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutReport {
    /// The scenario.
    pub config: Option<RolloutConfig>,
    /// Per mode.
    pub modes: Vec<ModeResult>,
    /// Zone a scaling from 0 to its full size under spillover: the largest load factor (an
    /// endpoint's load over its fair share) of the plan at any step.
    pub scale_up_max_share: f64,
    /// Seconds the rollout took.
    pub rollout_s: f64,
}

/// The pods: `pods_per_zone` old and as many new ones per zone; pod `i` is fixture backend `i`.
struct Pods {
    states: Vec<PodState>,
    per_zone: usize,
}

impl Pods {
    fn zone(&self, i: usize) -> usize {
        (i % (3 * self.per_zone)) / self.per_zone
    }

    fn node(&self, i: usize) -> String {
        format!("node-{}", &ZONES[self.zone(i)][5..])
    }

    /// The cluster file's objects for the pods as they are.
    fn objects(&self, fx: &Fixture) -> Vec<Value> {
        let mut objects: Vec<Value> = ZONES
            .iter()
            .map(|zone| objects::node(&format!("node-{}", &zone[5..]), zone, Some("region-1"), "4"))
            .collect();
        let listed: Vec<usize> = (0..self.states.len()).filter(|i| self.states[*i] != PodState::Absent).collect();
        let hinted = listed.iter().all(|i| self.states[*i] != PodState::NotReady);
        for (mode, vip) in MODES {
            let vip: IpAddr = vip.parse().expect("ClusterIP");
            let mut service = objects::service("demo", mode, vip, 80, "TCP", "http");
            service["spec"]["ports"] = serde_json::json!([
                {"name": "http", "port": 80, "protocol": "TCP"}, {"name": "udp", "port": 80, "protocol": "UDP"}]);
            match mode {
                "prefer-close" => service["spec"]["trafficDistribution"] = "PreferClose".into(),
                "prefer-same-zone" => service["spec"]["trafficDistribution"] = "PreferSameZone".into(),
                "prefer-same-node" => service["spec"]["trafficDistribution"] = "PreferSameNode".into(),
                "topology-keys" => {
                    objects::annotate(
                        &mut service,
                        "topology-agent.io/topology-keys",
                        "topology.kubernetes.io/zone, *",
                    );
                }
                "spillover" => objects::annotate(&mut service, "topology-agent.io/spillover", "capacity"),
                "feedback" => objects::annotate(&mut service, "topology-agent.io/spillover", "feedback"),
                "hints" => objects::annotate(&mut service, "service.kubernetes.io/topology-mode", "Auto"),
                _ => {}
            }
            let endpoints: Vec<EndpointSpec> = listed
                .iter()
                .map(|&i| {
                    let mut spec = EndpointSpec::new(fx.backends[i].addr(false), &self.node(i));
                    spec.zone = Some(ZONES[self.zone(i)].into());
                    if mode == "hints" && hinted {
                        spec.hint_zones = vec![ZONES[self.zone(i)].into()];
                    }
                    spec
                })
                .collect();
            let mut slice = objects::slice("demo", &format!("{mode}-1"), mode, "http", BACKEND_PORT, "TCP", &endpoints);
            slice["ports"] = serde_json::json!([
                {"name": "http", "port": BACKEND_PORT, "protocol": "TCP"},
                {"name": "udp", "port": BACKEND_PORT, "protocol": "UDP"}]);
            for (n, &i) in listed.iter().enumerate() {
                let (ready, serving, terminating) = match self.states[i] {
                    PodState::NotReady => (false, false, false),
                    PodState::Terminating => (false, true, true),
                    PodState::Ready | PodState::Absent => (true, true, false),
                };
                slice["endpoints"][n]["conditions"] =
                    serde_json::json!({"ready": ready, "serving": serving, "terminating": terminating});
            }
            objects.push(service);
            objects.push(slice);
        }
        objects
    }
}

/// Builds the cluster, rolls every pod over with the clients running, scales zone a up under
/// spillover, tears everything down; returns the report.
pub fn run(config: &RolloutConfig, out: &Path, progress: &mut dyn FnMut(&str)) -> RolloutReport {
    let per_zone = config.pods_per_zone;
    let old = 3 * per_zone;
    let mut fx = Fixture::new(2 * old);
    let mut pods = Pods { states: [vec![PodState::Ready; old], vec![PodState::Absent; old]].concat(), per_zone };
    std::fs::create_dir_all(out).expect("demo output directory");
    let file = out.join("rollout-cluster.yaml");
    let write = |pods: &Pods, fx: &Fixture| objects::write(&file, &pods.objects(fx));
    write(&pods, &fx);
    let mut options = AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path());
    options.extra = vec!["--terminate-sockets".into(), "all".into()];
    let mut agent = Agent::start(&options);
    agent.wait_ready(Duration::from_secs(20));

    let rollout_s = config.step_s() * old as f64;
    let total = config.steady_s + rollout_s + 2.0;
    progress(&format!(
        "{} modes over {old} pods; {:.0} s steady, then the rollout ({:.0} s), {:.0} connections/s per Service",
        MODES.len(),
        config.steady_s,
        rollout_s,
        config.rate_per_s
    ));
    let phases = [Phase { name: "run".into(), rate_per_s: config.rate_per_s, seconds: total }];
    let scratch = fx.scratch();
    let target = |vip: &str| SocketAddr::new(vip.parse().expect("ClusterIP"), 80);
    let clients: Vec<OpenLoopClient> = MODES
        .iter()
        .enumerate()
        .map(|(n, (_, vip))| OpenLoopClient::start(&fx.place(), target(vip), &phases, 40 + n as u64))
        .collect();
    // Each stream's clock starts before its first exchange, which it waits for: the instant after
    // is an upper bound of its start, so an error it reports is placed no earlier than it was.
    let streams: Vec<_> = MODES
        .iter()
        .map(|(_, vip)| {
            let stream =
                fx.place().udp_stream(target(vip), &scratch, Duration::from_secs_f64(total), Duration::from_millis(20));
            (stream, monotonic_ns())
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(config.steady_s));

    // The rollout: pod i's replacement is pod old + i, on the same node.
    let rollout_from = monotonic_ns();
    let started = Instant::now();
    // When each old pod's endpoint went, by its name.
    let mut gone_at_ns: HashMap<String, u64> = HashMap::new();
    for i in 0..old {
        pods.states[old + i] = PodState::NotReady;
        write(&pods, &fx);
        std::thread::sleep(Duration::from_secs_f64(config.not_ready_s));
        pods.states[old + i] = PodState::Ready;
        pods.states[i] = PodState::Terminating;
        write(&pods, &fx);
        std::thread::sleep(Duration::from_secs_f64(config.terminating_s));
        pods.states[i] = PodState::Absent;
        write(&pods, &fx);
        gone_at_ns.insert(fx.backends[i].name.clone(), monotonic_ns());
        std::thread::sleep(EXIT_AFTER);
        fx.backends[i].stop();
        if (i + 1) % per_zone == 0 {
            progress(&format!("{:>5.1} s: {} of {old} pods replaced", started.elapsed().as_secs_f64(), i + 1));
        }
    }
    let rollout_to = monotonic_ns();
    std::thread::sleep(Duration::from_secs(2));

    let zone_a: Vec<String> =
        (0..2 * old).filter(|i| pods.zone(*i) == 0).map(|i| fx.backends[i].name.clone()).collect();
    let mut modes = Vec::new();
    for ((client, (stream, zero)), (mode, _)) in clients.into_iter().zip(streams).zip(MODES) {
        let tcp = client.finish();
        let udp = stream.finish();
        let mut result = figures(&tcp, &zone_a, (rollout_from, rollout_to));
        result.mode = mode.into();
        for (at, _) in &udp.errors_at {
            let on = udp.switches.iter().rev().find(|(since, _)| since <= at).map(|(_, name)| name);
            match on.and_then(|name| gone_at_ns.get(name)) {
                Some(gone) if *gone <= zero + at * 1_000_000 => result.ended_on_departure += 1,
                _ => result.resets_to_serving += 1,
            }
        }
        modes.push(result);
    }
    let scale_up_max_share = scale_up(&mut pods, &fx, &write, &agent, per_zone, progress);
    drop(agent);
    RolloutReport {
        config: Some(config.clone()),
        modes,
        scale_up_max_share,
        rollout_s: started.elapsed().as_secs_f64(),
    }
}

/// Steady and rollout in-zone shares, and the rollout's failures, of one Service's connections.
fn figures(report: &OpenLoopReport, zone_a: &[String], (from, to): (u64, u64)) -> ModeResult {
    let at = |attempt_us: u64| report.started_ns + attempt_us * 1000;
    let share = |keep: &dyn Fn(u64) -> bool| {
        let served: Vec<&String> = report
            .attempts
            .iter()
            .filter(|a| keep(at(a.at_us)))
            .filter_map(|a| match &a.outcome {
                Outcome::Served(name) => Some(name),
                Outcome::Failed(_) => None,
            })
            .collect();
        served.iter().filter(|name| zone_a.contains(name)).count() as f64 / served.len().max(1) as f64
    };
    let during: Vec<_> = report.attempts.iter().filter(|a| (from..to).contains(&at(a.at_us))).collect();
    ModeResult {
        steady_in_zone: share(&|ns| ns < from),
        rollout_in_zone: share(&|ns| (from..to).contains(&ns)),
        failed: during.iter().filter(|a| matches!(a.outcome, Outcome::Failed(_))).count(),
        connections: during.len(),
        series: super::rollout_chart::series(report, zone_a, from),
        ..ModeResult::default()
    }
}

/// Zone a's pods listed from none to all, one at a time, under spillover: the largest load factor
/// the agent's plan for the spillover Service shows at any step.
fn scale_up(
    pods: &mut Pods,
    fx: &Fixture,
    write: &dyn Fn(&Pods, &Fixture),
    agent: &Agent,
    per_zone: usize,
    progress: &mut dyn FnMut(&str),
) -> f64 {
    let old = 3 * per_zone;
    let zone_a: Vec<usize> = (old..2 * old).filter(|i| pods.zone(*i) == 0).collect();
    for &i in &zone_a {
        pods.states[i] = PodState::Absent;
    }
    let mut largest: f64 = 0.0;
    for listed in 0..=zone_a.len() {
        if listed > 0 {
            pods.states[zone_a[listed - 1]] = PodState::Ready;
        }
        write(pods, fx);
        // The agent takes a file change in well under a second.
        std::thread::sleep(Duration::from_millis(700));
        let Ok((200, body)) = agent.get("/debug/plan") else { continue };
        let Ok(plan) = serde_json::from_str::<Value>(&body) else { continue };
        let factors = plan["services"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|s| s["service"] == "demo/spillover" && s["protocol"] == "TCP")
            .flat_map(|s| s["spillover"]["zones"].as_array().cloned().unwrap_or_default())
            .filter_map(|zone| zone["loadFactor"].as_f64());
        largest = factors.fold(largest, f64::max);
    }
    progress(&format!(
        "zone a scaled from 0 to {} pods under spillover: largest load factor {largest:.3}",
        zone_a.len()
    ));
    largest
}

impl RolloutReport {
    /// The targets: every mode this agent decides keeps ≥ 95 % of its steady in-zone share, no
    /// connection fails, no serving backend's socket is ended, and scaling up never loads a pod
    /// past its bound (1.1 of the fair share, the default ε).
    pub fn all_met(&self) -> bool {
        self.modes.iter().all(|m| {
            let decided_here = !matches!(m.mode.as_str(), "default" | "hints");
            m.failed == 0 && m.resets_to_serving == 0 && (!decided_here || m.rollout_in_zone >= 0.95 * m.steady_in_zone)
        }) && self.scale_up_max_share <= 1.1 + 1e-9
    }

    /// A Markdown table of the modes.
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| mode | in zone, steady | in zone, rollout | kept | failed / connections | sockets ended: serving / departed |\n\
             | --- | ---: | ---: | ---: | ---: | ---: |\n",
        );
        for m in &self.modes {
            out.push_str(&format!(
                "| {} | {:.1} % | {:.1} % | {:.1} % | {} / {} | {} / {} |\n",
                m.mode,
                m.steady_in_zone * 100.0,
                m.rollout_in_zone * 100.0,
                m.rollout_in_zone / m.steady_in_zone.max(f64::MIN_POSITIVE) * 100.0,
                m.failed,
                m.connections,
                m.resets_to_serving,
                m.ended_on_departure
            ));
        }
        out.push_str(&format!(
            "\nzone a scaling from 0 pods under spillover: largest load factor {:.3} (bound 1.1)\n",
            self.scale_up_max_share
        ));
        out
    }

    /// Writes `rollout.json`, the chart `rollout.svg` and the report `rollout.md`.
    pub fn write(&self, out: &Path) -> anyhow::Result<()> {
        std::fs::write(out.join("rollout.json"), serde_json::to_string_pretty(self)?)?;
        std::fs::write(out.join("rollout.svg"), super::rollout_chart::svg(self))?;
        std::fs::write(out.join("rollout.md"), super::rollout_chart::markdown(self))?;
        Ok(())
    }
}
