//! `cargo xtask demo --scenario overload`: real-time feedback through the real kernel. Zone a's
//! backends have a real capacity (a fixed number of workers, a fixed service time); zone a's
//! clients send first a tenth of it (warm-up), then twice it (surge), then a tenth again (calm),
//! open loop, to two twin Services at once: one `PreferClose` (the static plan), one under
//! `topology-agent.io/spillover: feedback`, each with its own backends. The agent of the clients'
//! node measures and moves; the run records every connection and the agent's shift.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use serde::Serialize;
use topology_kube::objects::{self, EndpointSpec};

use super::overload_report::{self, OverloadReport};
use crate::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    openloop::{OpenLoopClient, OpenLoopReport, Phase},
    server::Capacity,
    traffic::monotonic_ns,
};

/// The static twin's ClusterIP.
pub const STATIC_VIP: &str = "10.96.0.70";
/// The feedback Service's ClusterIP.
pub const FEEDBACK_VIP: &str = "10.96.0.71";

/// The scenario's shape and timing.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OverloadConfig {
    /// Zone a's backends per Service.
    pub backends: usize,
    /// Workers of each of zone a's backends.
    pub workers: usize,
    /// Time a worker takes per connection, milliseconds.
    pub service_ms: u64,
    /// Workers of each of zone b's backends (zone b has room).
    pub far_workers: usize,
    /// Seconds of each phase: warm-up, surge, calm.
    pub warmup_s: f64,
    /// Seconds of the surge.
    pub surge_s: f64,
    /// Seconds of the calm after it.
    pub calm_s: f64,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        Self { backends: 2, workers: 4, service_ms: 50, far_workers: 32, warmup_s: 5.0, surge_s: 20.0, calm_s: 30.0 }
    }
}

impl OverloadConfig {
    /// Connections per second zone a's backends of one Service serve.
    pub fn capacity_per_s(&self) -> f64 {
        (self.backends * self.workers) as f64 * 1000.0 / self.service_ms as f64
    }

    /// The phases each client runs: a tenth of the capacity, twice it, a tenth.
    pub fn phases(&self) -> Vec<Phase> {
        let capacity = self.capacity_per_s();
        [("warm-up", 0.1, self.warmup_s), ("surge", 2.0, self.surge_s), ("calm", 0.1, self.calm_s)]
            .into_iter()
            .map(|(name, load, seconds)| Phase { name: name.into(), rate_per_s: capacity * load, seconds })
            .collect()
    }

    /// Checks the numbers before anything starts.
    pub fn validate(&self) -> anyhow::Result<()> {
        if !(1..=8).contains(&self.backends) || !(1..=64).contains(&self.workers) || self.service_ms == 0 {
            anyhow::bail!("overload: 1–8 backends of 1–64 workers and a service time above 0 ms");
        }
        if self.capacity_per_s() * 2.0 > 2000.0 {
            anyhow::bail!(
                "overload: a surge of {:.0} connections/s is more than this machine's clients can open; lower \
                 --workers or raise --service-ms",
                self.capacity_per_s() * 2.0
            );
        }
        if self.warmup_s < 3.0 || self.surge_s < 5.0 || self.calm_s < 12.0 {
            anyhow::bail!("overload: at least 3 s of warm-up, 5 s of surge and 12 s of calm");
        }
        Ok(())
    }
}

/// The agent's feedback input for the feedback Service, sampled while the clients run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ShiftSample {
    /// `CLOCK_MONOTONIC` ns.
    pub at_ns: u64,
    /// The share the agent moved out of zone a.
    pub shift: f64,
    /// Its reason line.
    pub reason: String,
    /// What it measured (`explain`'s `feedback.input.measured`).
    pub measured: serde_json::Value,
}

/// What one run recorded.
#[derive(Clone, Debug, Default)]
pub struct OverloadRun {
    /// The static twin's connections.
    pub static_plan: OpenLoopReport,
    /// The feedback Service's connections.
    pub feedback: OpenLoopReport,
    /// The agent's shift over time.
    pub shifts: Vec<ShiftSample>,
    /// Backend names in zone a.
    pub zone_a: Vec<String>,
}

/// Builds the cluster, runs the phases, tears everything down; returns the report.
pub fn run(config: &OverloadConfig, out: &Path, progress: &mut dyn FnMut(&str)) -> OverloadReport {
    let slow = Some(Capacity { workers: config.workers, service: Duration::from_millis(config.service_ms) });
    let fast = Some(Capacity { workers: config.far_workers, service: Duration::from_millis(config.service_ms) });
    // Per Service: zone a's backends, then as many in zone b.
    let n = config.backends;
    let per_service: Vec<Option<Capacity>> = [vec![slow; n], vec![fast; n]].concat();
    let fx = Fixture::with_capacities(&[per_service.clone(), per_service].concat());
    let zone_of = |i: usize| if i % (2 * n) < n { "a" } else { "b" };
    let nodes = vec![objects::node("node-a", "a", Some("r1"), "4"), objects::node("node-b", "b", Some("r1"), "4")];
    let mut objects = nodes;
    for (s, (name, vip)) in [("web-static", STATIC_VIP), ("web-feedback", FEEDBACK_VIP)].into_iter().enumerate() {
        let vip: IpAddr = vip.parse().expect("ClusterIP");
        let mut service = objects::service("demo", name, vip, 80, "TCP", "http");
        if s == 0 {
            service["spec"]["trafficDistribution"] = "PreferClose".into();
        } else {
            objects::annotate(&mut service, "topology-agent.io/spillover", "feedback");
        }
        let endpoints: Vec<EndpointSpec> = (s * 2 * n..(s + 1) * 2 * n)
            .map(|i| EndpointSpec::new(fx.backends[i].addr(false), &format!("node-{}", zone_of(i))))
            .collect();
        objects.push(service);
        objects.push(objects::slice("demo", &format!("{name}-1"), name, "http", BACKEND_PORT, "TCP", &endpoints));
    }
    std::fs::create_dir_all(out).expect("demo output directory");
    let file = out.join("overload-cluster.yaml");
    objects::write(&file, &objects);
    let mut agent = Agent::start(&AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()));
    agent.wait_ready(Duration::from_secs(15));
    let zone_a: Vec<String> = (0..4 * n).filter(|i| zone_of(*i) == "a").map(|i| fx.backends[i].name.clone()).collect();

    let phases = config.phases();
    let total: f64 = phases.iter().map(|p| p.seconds).sum();
    progress(&format!(
        "zone a serves {:.0} connections/s per Service; {}",
        config.capacity_per_s(),
        phases
            .iter()
            .map(|p| format!("{} {:.0}/s for {:.0} s", p.name, p.rate_per_s, p.seconds))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let target = |vip: &str| SocketAddr::new(vip.parse().expect("ClusterIP"), 80);
    let statics = OpenLoopClient::start(&fx.place(), target(STATIC_VIP), &phases, 11);
    let feedback = OpenLoopClient::start(&fx.place(), target(FEEDBACK_VIP), &phases, 12);
    let started = Instant::now();
    let mut shifts = Vec::new();
    let mut last_phase = String::new();
    // The clients end `total` s after they start, plus their 2 s timeout.
    while started.elapsed() < Duration::from_secs_f64(total + 2.5) {
        let sample = shift_sample(&agent);
        let now = started.elapsed().as_secs_f64();
        let mut elapsed = 0.0;
        for phase in &phases {
            elapsed += phase.seconds;
            if now < elapsed {
                if phase.name != last_phase {
                    progress(&format!("{:>5.1} s: {}", now, phase.name));
                    last_phase.clone_from(&phase.name);
                }
                break;
            }
        }
        shifts.extend(sample);
        std::thread::sleep(Duration::from_millis(200));
    }
    let run = OverloadRun { static_plan: statics.finish(), feedback: feedback.finish(), shifts, zone_a };
    overload_report::analyse(config, &run)
}

/// The feedback Service's input now, from the agent's live plan.
fn shift_sample(agent: &Agent) -> Option<ShiftSample> {
    let at_ns = monotonic_ns();
    let (status, body) = agent.get("/debug/plan").ok()?;
    if status != 200 {
        return None;
    }
    let plan: serde_json::Value = serde_json::from_str(&body).ok()?;
    let entry = plan["services"].as_array()?.iter().find(|s| s["service"] == "demo/web-feedback")?;
    let input = &entry["feedback"]["input"];
    Some(ShiftSample {
        at_ns,
        shift: input["shift"].as_f64().unwrap_or(0.0),
        reason: input["reason"].as_str().unwrap_or("no measurement yet").to_owned(),
        measured: input["measured"].clone(),
    })
}
