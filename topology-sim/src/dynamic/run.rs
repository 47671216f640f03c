//! The time-stepped run: Poisson arrivals per node, a FIFO queue per endpoint with a fixed number
//! of workers and a fixed service time, each node's own agent (the agent's controller and policy)
//! looking once a second at its own kernel counters, with the nodes' clocks staggered.

use std::{cmp::Reverse, collections::BinaryHeap};

use topology_policy::feedback::{
    Inputs, Tuning,
    control::Regulator,
    measured::{LoadCounters, MeasuredBackend},
};

use super::{
    cluster::{Algorithm, Cluster, Decision, Phase, Shape},
    report::{PhaseFigures, Row},
};

/// What a run simulates.
#[derive(Clone, Debug)]
pub struct Config {
    /// The cluster.
    pub shape: Shape,
    /// The demand over time.
    pub phases: Vec<Phase>,
    /// Time step, milliseconds.
    pub step_ms: f64,
    /// A request waiting longer than this for a worker fails (the client gives up), milliseconds.
    pub timeout_ms: f64,
    /// Seed of the arrivals and choices (the same for every algorithm).
    pub seed: u64,
    /// The feedback controller's constants.
    pub tuning: Tuning,
}

/// One client node and its agent.
struct SimNode {
    zone: usize,
    set: Decision,
    regulator: Regulator,
    counters: Vec<LoadCounters>,
    next_look_ms: f64,
    changes: Vec<f64>,
}

/// A request's end: when, which node, which endpoint, how long it lived.
type Completion = Reverse<(u64, usize, usize, u64)>;

/// Runs `algorithm` through every phase; one row per phase.
pub fn run(config: &Config, algorithm: Algorithm) -> anyhow::Result<Row> {
    let shape = &config.shape;
    let cluster = Cluster::new(shape, algorithm)?;
    let mut rng = Rng(config.seed | 1);
    let node_count = cluster.nodes.len();
    let mut nodes: Vec<SimNode> = (0..node_count)
        .map(|n| {
            SimNode {
                zone: n / shape.nodes_per_zone,
                set: cluster.decide(n, &Inputs::new()),
                regulator: Regulator::new(config.tuning),
                counters: vec![LoadCounters::default(); cluster.endpoints.len()],
                // Independent agents: each looks on its own second.
                next_look_ms: config.tuning.interval_ms as f64 * (n as f64 + 1.0) / node_count as f64,
                changes: Vec::new(),
            }
        })
        .collect();
    let mut workers: Vec<Vec<f64>> = vec![vec![0.0; shape.workers]; cluster.endpoints.len()];
    let mut arrivals_this_second = vec![0u64; cluster.endpoints.len()];
    let per_endpoint_second = shape.workers as f64 * 1000.0 / shape.service_ms;
    let mut completions: BinaryHeap<Completion> = BinaryHeap::new();
    let mut figures: Vec<PhaseFigures> = config.phases.iter().map(|p| PhaseFigures::new(p.name)).collect();
    let mut t = 0.0_f64;
    let mut next_second = 1000.0;
    let mut timeline: Vec<(f64, f64)> = Vec::new();
    let (mut this_second_us, mut p99_by_second): (Vec<u64>, Vec<Option<f64>>) = (Vec::new(), Vec::new());
    for (index, phase) in config.phases.iter().enumerate() {
        let end = t + phase.seconds * 1000.0;
        let first_second = timeline.len();
        while t < end {
            for (node_index, node) in nodes.iter_mut().enumerate() {
                let rate = phase.demand[node.zone] * shape.zone_capacity() / shape.nodes_per_zone as f64;
                for _ in 0..rng.poisson(rate * config.step_ms / 1000.0) {
                    let arrival = t + rng.unit() * config.step_ms;
                    let endpoint = connect(node, &mut rng);
                    arrivals_this_second[endpoint] += 1;
                    let worker = earliest(&workers[endpoint]);
                    let start = workers[endpoint][worker].max(arrival);
                    let counters = &mut node.counters[endpoint];
                    counters.connects += 1;
                    let figures = &mut figures[index];
                    if start - arrival > config.timeout_ms {
                        counters.timed_out += 1;
                        figures.failed += 1;
                        continue;
                    }
                    let finish = start + shape.service_ms;
                    workers[endpoint][worker] = finish;
                    let lifetime_us = ((finish - arrival) * 1000.0) as u64;
                    figures.record(lifetime_us, shape.endpoint_zone(endpoint) == node.zone);
                    this_second_us.push(lifetime_us);
                    completions.push(Reverse(((finish * 1000.0) as u64, node_index, endpoint, lifetime_us)));
                }
            }
            t += config.step_ms;
            while let Some(Reverse((at_us, node, endpoint, lifetime_us))) = completions.peek().copied() {
                if at_us as f64 > t * 1000.0 {
                    break;
                }
                completions.pop();
                let counters = &mut nodes[node].counters[endpoint];
                counters.closed += 1;
                counters.lifetime_us += lifetime_us;
            }
            if t >= next_second {
                next_second += 1000.0;
                let worst = arrivals_this_second.iter().map(|&n| n as f64 / per_endpoint_second).fold(0.0, f64::max);
                figures[index].worst_overload = figures[index].worst_overload.max(worst);
                arrivals_this_second.iter_mut().for_each(|n| *n = 0);
                let key = cluster.port_key();
                let shifts: f64 = nodes.iter().map(|n| n.regulator.inputs().get(&key).map_or(0.0, |i| i.shift)).sum();
                timeline.push((t / 1000.0, shifts / node_count as f64));
                this_second_us.sort_unstable();
                let n = this_second_us.len();
                p99_by_second.push((n > 0).then(|| this_second_us[(n * 99 / 100).min(n - 1)] as f64 / 1000.0));
                this_second_us.clear();
            }
            if algorithm == Algorithm::Feedback {
                look(&cluster, &mut nodes, t, config.tuning.interval_ms as f64);
            }
        }
        figures[index].settle_s = settle(&timeline[first_second..], phase.seconds);
    }
    let minutes = t / 60_000.0;
    let swaps = nodes.iter().map(|n| n.changes.len()).sum::<usize>() as f64 / node_count as f64 / minutes;
    Ok(Row {
        algorithm: algorithm.name(),
        swaps_per_minute: swaps,
        phases: figures.into_iter().map(|f| f.finish()).collect(),
        timeline,
        p99_by_second,
    })
}

/// Every node whose second has come reads its own counters and decides again.
fn look(cluster: &Cluster, nodes: &mut [SimNode], t: f64, interval_ms: f64) {
    for (index, node) in nodes.iter_mut().enumerate().filter(|(_, n)| n.next_look_ms <= t) {
        node.next_look_ms += interval_ms;
        let reading: Vec<MeasuredBackend> = node
            .counters
            .iter()
            .zip(&cluster.endpoints)
            .map(|(load, backend)| MeasuredBackend { backend: *backend, in_flight: in_flight(load), load: *load })
            .collect();
        let changed = node.regulator.step(t as u64, &reading, &node.set.ports);
        if changed.is_empty() {
            continue;
        }
        let set = cluster.decide(index, &node.regulator.inputs());
        if set.weights.iter().zip(&node.set.weights).any(|(a, b)| (a - b).abs() > 1e-9) {
            node.changes.push(t);
        }
        node.set = set;
    }
}

/// The endpoint a connection of `node` goes to, as its connect hook chooses: a draw by weight,
/// then, past the port's per-connection limit, the lighter of it and one drawn uniformly from the
/// set ([`topology_common::spill`]), by this node's own counters.
fn connect(node: &SimNode, rng: &mut Rng) -> usize {
    let drawn = rng.pick(&node.set.weights);
    if node.set.spill_at == 0 {
        return drawn;
    }
    let members: Vec<usize> = (0..node.set.weights.len()).filter(|&e| node.set.weights[e] > 0.0).collect();
    let other = members[((rng.unit() * members.len() as f64) as usize).min(members.len() - 1)];
    if topology_common::spill(in_flight(&node.counters[drawn]), in_flight(&node.counters[other]), node.set.spill_at) {
        other
    } else {
        drawn
    }
}

/// Connections started and not ended, as the kernel derives it.
fn in_flight(load: &LoadCounters) -> u64 {
    load.connects.saturating_sub(load.closed + load.refused + load.timed_out)
}

/// Seconds from the phase's start until the nodes' mean shift stays within [`SETTLED`] of where
/// it ends the phase (`timeline`: the phase's seconds); `None` if it never does before the last
/// quarter of the phase.
fn settle(timeline: &[(f64, f64)], seconds: f64) -> Option<f64> {
    let (start, last) = (timeline.first()?.0 - 1.0, timeline.last()?.1);
    let settled = timeline.iter().rposition(|(_, shift)| (shift - last).abs() > SETTLED).map_or(0, |i| i + 1);
    let at = timeline.get(settled).map_or(seconds, |(t, _)| t - 1.0 - start);
    (at <= seconds * 0.75).then_some(at)
}

/// How close to its final value the mean shift must stay to count as settled.
const SETTLED: f64 = 0.05;

/// The worker that frees up first.
fn earliest(workers: &[f64]) -> usize {
    workers.iter().enumerate().min_by(|a, b| a.1.total_cmp(b.1)).map_or(0, |(i, _)| i)
}

/// xorshift64*: fast, seeded, the same stream for every algorithm.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// A Poisson draw of mean `mean` (Knuth's method; the means here are small).
    fn poisson(&mut self, mean: f64) -> u32 {
        let limit = (-mean).exp();
        let (mut k, mut p) = (0, 1.0);
        loop {
            p *= self.unit();
            if p <= limit {
                return k;
            }
            k += 1;
        }
    }

    /// An index drawn by `weights` (summing to 1).
    fn pick(&mut self, weights: &[f64]) -> usize {
        let mut draw = self.unit();
        for (i, w) in weights.iter().enumerate() {
            if draw < *w {
                return i;
            }
            draw -= w;
        }
        weights.iter().rposition(|w| *w > 0.0).unwrap_or(0)
    }
}
