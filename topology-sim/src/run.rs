//! Runs every algorithm over a sample of the space on all cores and tallies the metrics.

use std::{
    sync::atomic::{AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use serde::Serialize;

use super::{
    algorithms::{self, Algorithm},
    outcome::Metrics,
    space::{self, Input},
};

/// How to run.
#[derive(Clone, Debug)]
pub struct Config {
    /// Keep one input in this many (1: the whole space).
    pub sample_every: u64,
    /// Worker threads.
    pub threads: usize,
    /// The ε values of spillover to compare.
    pub max_overloads: Vec<f64>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            sample_every: 16,
            threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
            max_overloads: vec![0.0, 0.05, 0.1],
        }
    }
}

/// Total-endpoint ranges the chart is drawn over; the last is the large section.
pub const BUCKETS: [&str; 9] =
    ["1-2", "3-8", "9-14", "15-29", "30-59", "60-99", "100-199", "200-300", "300+ (30 nodes/zone)"];

fn bucket(input: &Input) -> usize {
    if input.nodes[0] > 10 {
        return 8;
    }
    match input.total_endpoints() {
        0..=2 => 0,
        3..=8 => 1,
        9..=14 => 2,
        15..=29 => 3,
        30..=59 => 4,
        60..=99 => 5,
        100..=199 => 6,
        _ => 7,
    }
}

/// Sums over inputs for one algorithm.
#[derive(Clone, Debug, Default)]
struct Tally {
    inputs: u64,
    in_zone: f64,
    bound: f64,
    worst_gap: f64,
    overload: f64,
    worst_overload: f64,
    worst_input: Option<Input>,
    worst_deviation: f64,
    deviation: f64,
    fallbacks: u64,
    lost: f64,
    buckets: [BucketTally; BUCKETS.len()],
}

#[derive(Clone, Copy, Debug, Default)]
struct BucketTally {
    inputs: u64,
    in_zone: f64,
    bound: f64,
    worst_overload: f64,
}

impl Tally {
    fn add(&mut self, input: &Input, metrics: &Metrics, fell_back: bool, bound: Option<f64>) {
        self.inputs += 1;
        self.in_zone += metrics.in_zone;
        self.overload += metrics.max_overload;
        self.deviation += metrics.mean_deviation;
        self.worst_deviation = self.worst_deviation.max(metrics.max_deviation);
        self.lost = self.lost.max(metrics.lost);
        if metrics.max_overload > self.worst_overload || self.worst_input.is_none() {
            self.worst_overload = self.worst_overload.max(metrics.max_overload);
            self.worst_input = Some(*input);
        }
        self.fallbacks += u64::from(fell_back);
        let b = &mut self.buckets[bucket(input)];
        b.inputs += 1;
        b.in_zone += metrics.in_zone;
        b.worst_overload = b.worst_overload.max(metrics.max_overload);
        if let Some(bound) = bound {
            self.bound += bound;
            self.worst_gap = self.worst_gap.max(bound - metrics.in_zone);
            b.bound += bound;
        }
    }

    fn merge(&mut self, other: &Self) {
        self.inputs += other.inputs;
        self.in_zone += other.in_zone;
        self.bound += other.bound;
        self.worst_gap = self.worst_gap.max(other.worst_gap);
        self.overload += other.overload;
        if other.worst_overload > self.worst_overload || self.worst_input.is_none() {
            self.worst_overload = other.worst_overload;
            self.worst_input = other.worst_input;
        }
        self.worst_deviation = self.worst_deviation.max(other.worst_deviation);
        self.deviation += other.deviation;
        self.fallbacks += other.fallbacks;
        self.lost = self.lost.max(other.lost);
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            mine.inputs += theirs.inputs;
            mine.in_zone += theirs.in_zone;
            mine.bound += theirs.bound;
            mine.worst_overload = mine.worst_overload.max(theirs.worst_overload);
        }
    }
}

/// One algorithm's results.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// Short name.
    pub key: String,
    /// Display name.
    pub name: String,
    /// Mean share of traffic kept in its zone.
    pub in_zone: f64,
    /// Mean bound for this ε (spillover only).
    pub bound: Option<f64>,
    /// Largest shortfall from the bound on any input (spillover only).
    pub worst_gap: Option<f64>,
    /// Mean over inputs of the largest overload.
    pub mean_max_overload: f64,
    /// Largest overload on any input.
    pub worst_max_overload: f64,
    /// The input with the largest overload: nodes and endpoints per zone.
    pub worst_input: Option<[[u32; 3]; 2]>,
    /// Largest absolute deviation on any input (the simulator's "max deviation").
    pub worst_max_deviation: f64,
    /// Mean over inputs of the mean absolute deviation.
    pub mean_deviation: f64,
    /// Share of inputs where the algorithm fell back to all endpoints.
    pub fallback: f64,
    /// Largest share of traffic that reached no endpoint (must be 0).
    pub lost: f64,
    /// Per bucket of total endpoints: mean in-zone share.
    pub bucket_in_zone: Vec<Option<f64>>,
    /// Per bucket: mean bound (spillover only).
    pub bucket_bound: Vec<Option<f64>>,
    /// Per bucket: largest overload.
    pub bucket_worst_overload: Vec<Option<f64>>,
}

/// The whole run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// Inputs evaluated.
    pub inputs: u64,
    /// Inputs in the whole space.
    pub space: u64,
    /// One in how many.
    pub sample_every: u64,
    /// Wall time.
    #[serde(serialize_with = "seconds")]
    pub elapsed: Duration,
    /// The buckets' labels.
    pub buckets: Vec<String>,
    /// Inputs per bucket.
    pub bucket_inputs: Vec<u64>,
    /// One row per algorithm.
    pub rows: Vec<Row>,
}

fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// The algorithms compared, in table order.
pub fn algorithms(max_overloads: &[f64]) -> Vec<Algorithm> {
    let mut list = vec![Algorithm::Random, Algorithm::Local, Algorithm::AutoHints, Algorithm::PreferClose];
    list.extend(max_overloads.iter().map(|&eps| Algorithm::Spillover(eps)));
    list
}

/// Runs the comparison.
pub fn run(config: &Config) -> Report {
    let started = Instant::now();
    let chunks = space::chunks();
    let space: u64 = chunks.iter().map(space::Chunk::len).sum();
    let algorithms = algorithms(&config.max_overloads);
    let next = AtomicUsize::new(0);
    let tallies: Vec<Vec<Tally>> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..config.threads.max(1))
            .map(|_| {
                scope.spawn(|| {
                    let mut tallies = vec![Tally::default(); algorithms.len()];
                    while let Some(chunk) = chunks.get(next.fetch_add(1, Ordering::Relaxed)) {
                        for (index, input) in chunk.inputs() {
                            if space::sampled(index, config.sample_every) {
                                evaluate(&algorithms, &input, &mut tallies);
                            }
                        }
                    }
                    tallies
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("simulation worker")).collect()
    });
    let mut total = vec![Tally::default(); algorithms.len()];
    for worker in &tallies {
        for (sum, part) in total.iter_mut().zip(worker) {
            sum.merge(part);
        }
    }
    let rows = algorithms.iter().zip(&total).map(|(algorithm, tally)| row(algorithm, tally)).collect();
    Report {
        inputs: total[0].inputs,
        space,
        sample_every: config.sample_every,
        elapsed: started.elapsed(),
        buckets: BUCKETS.iter().map(|b| (*b).to_owned()).collect(),
        bucket_inputs: total[0].buckets.iter().map(|b| b.inputs).collect(),
        rows,
    }
}

fn evaluate(algorithms: &[Algorithm], input: &Input, tallies: &mut [Tally]) {
    let total = input.total_endpoints();
    for (algorithm, tally) in algorithms.iter().zip(tallies) {
        let outcome = algorithm.route(input);
        let bound = match algorithm {
            Algorithm::Spillover(eps) => Some(algorithms::bound(input, *eps)),
            _ => None,
        };
        tally.add(input, &outcome.metrics(total), outcome.fell_back, bound);
    }
}

fn row(algorithm: &Algorithm, tally: &Tally) -> Row {
    let n = tally.inputs.max(1) as f64;
    let spill = matches!(algorithm, Algorithm::Spillover(_));
    let per_bucket = |value: &dyn Fn(&BucketTally) -> f64| -> Vec<Option<f64>> {
        tally.buckets.iter().map(|b| (b.inputs > 0).then(|| value(b))).collect()
    };
    Row {
        key: algorithm.key(),
        name: algorithm.to_string(),
        in_zone: tally.in_zone / n,
        bound: spill.then(|| tally.bound / n),
        worst_gap: spill.then_some(tally.worst_gap),
        mean_max_overload: tally.overload / n,
        worst_max_overload: tally.worst_overload,
        worst_input: tally.worst_input.map(|i| [i.nodes, i.endpoints]),
        worst_max_deviation: tally.worst_deviation,
        mean_deviation: tally.deviation / n,
        fallback: tally.fallbacks as f64 / n,
        lost: tally.lost,
        bucket_in_zone: per_bucket(&|b| b.in_zone / b.inputs as f64),
        bucket_bound: if spill { per_bucket(&|b| b.bound / b.inputs as f64) } else { vec![None; BUCKETS.len()] },
        bucket_worst_overload: per_bucket(&|b| b.worst_overload),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A coarse sample already reproduces the talk's anchors and meets the targets; the full run
    /// is `topology-agent simulate --sample-every 1`.
    #[test]
    fn a_coarse_sample_reproduces_the_talk_and_meets_the_targets() {
        let report = run(&Config { sample_every: 400, ..Config::default() });
        assert!(report.inputs > 90_000, "{}", report.inputs);
        let failed: Vec<_> = report.checks().into_iter().filter(|c| !c.ok).collect();
        assert!(failed.is_empty(), "{failed:?}\n{}", report.table());
        let local = report.rows.iter().find(|r| r.key == "local").unwrap();
        assert!((0.49..0.5 + 1e-9).contains(&local.worst_max_overload), "{local:?}");
        assert_eq!(local.bucket_in_zone[0], report.rows[0].bucket_in_zone[0], "below 9 endpoints local is random");
        let spill = report.rows.iter().find(|r| r.key == "spillover-10").unwrap();
        assert!(spill.bucket_in_zone[0].unwrap() > local.bucket_in_zone[0].unwrap() + 0.15, "no cliff: {spill:?}");
        let svg = report.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>") && svg.contains("spillover-10"));
    }
}
