//! `dnsperf` (Debian's package) run inside a test namespace, its per-query latencies read from its
//! verbose output; and the agent's event-to-kernel histogram read from `/metrics`, for the DNS
//! benchmark.

use std::{path::Path, process::Command};

/// One `dnsperf` run.
#[derive(Debug, Default)]
pub struct Perf {
    /// Queries answered.
    pub completed: u64,
    /// Queries with no answer within dnsperf's timeout.
    pub lost: u64,
    /// Answered queries per second.
    pub qps: f64,
    /// Latency of each answered query, seconds, sorted.
    pub latencies: Vec<f64>,
    /// The same, in the order the answers came (dnsperf's verbose lines).
    pub in_order: Vec<f64>,
    /// The run's length, seconds.
    pub run_time: f64,
    /// Answers by RCODE.
    pub rcodes: std::collections::BTreeMap<String, u64>,
}

impl Perf {
    /// The `q` quantile of the latencies, milliseconds.
    pub fn quantile_ms(&self, q: f64) -> f64 {
        if self.latencies.is_empty() {
            return f64::NAN;
        }
        let at = ((self.latencies.len() - 1) as f64 * q).round() as usize;
        self.latencies[at] * 1e3
    }

    /// How the run began: the answers in stretches of `stretch` seconds (by their count over the
    /// run's length: dnsperf offers at a constant rate), the time until a stretch's p99 first came
    /// under `bound` seconds, and the answers slower than `bound` before it.
    pub fn settling(&self, bound: f64, stretch: f64) -> Settling {
        let per_stretch = ((self.in_order.len() as f64 * stretch / self.run_time.max(stretch)) as usize).max(1);
        let mut slow = 0;
        for (n, answers) in self.in_order.chunks(per_stretch).enumerate() {
            let mut sorted = answers.to_vec();
            sorted.sort_by(f64::total_cmp);
            let p99 = sorted[((sorted.len() - 1) as f64 * 0.99).round() as usize];
            if p99 < bound && answers.len() == per_stretch {
                return Settling { after: n as f64 * stretch, slow };
            }
            slow += answers.iter().filter(|latency| **latency >= bound).count() as u64;
        }
        Settling { after: self.run_time, slow }
    }

    /// The answers that came from `from` to `to` seconds into the run (by their count over the
    /// run's length, as `settling` takes them): their p99 and how many took `bound` or more.
    pub fn window(&self, from: f64, to: f64, bound: f64) -> Window {
        let at = |seconds: f64| {
            let share = (seconds / self.run_time.max(f64::MIN_POSITIVE)).clamp(0.0, 1.0);
            (self.in_order.len() as f64 * share).round() as usize
        };
        let mut answers = self.in_order[at(from)..at(to).max(at(from))].to_vec();
        answers.sort_by(f64::total_cmp);
        let p99_ms = match answers.len() {
            0 => f64::NAN,
            n => answers[((n - 1) as f64 * 0.99).round() as usize] * 1e3,
        };
        let slow = answers.iter().filter(|latency| **latency >= bound).count() as u64;
        Window { answers: answers.len() as u64, p99_ms, slow }
    }

    /// NOERROR answers per second: what the clients could use (a SERVFAIL is an answer too).
    pub fn noerror_qps(&self) -> f64 {
        match self.completed {
            0 => 0.0,
            completed => self.qps * self.rcodes.get("NOERROR").copied().unwrap_or(0) as f64 / completed as f64,
        }
    }
}

/// How a run began (`Perf::settling`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Settling {
    /// Seconds from the run's start to the first stretch whose p99 held.
    pub after: f64,
    /// Answers slower than the bound before it.
    pub slow: u64,
}

/// A stretch of a run's answers (`Perf::window`).
#[derive(Clone, Copy, Debug, Default)]
pub struct Window {
    /// Answers in it.
    pub answers: u64,
    /// Their p99, milliseconds (NaN when there are none).
    pub p99_ms: f64,
    /// Answers that took the bound or more.
    pub slow: u64,
}

/// Where and how hard `dnsperf` runs.
#[derive(Clone, Copy, Debug)]
pub struct Load<'a> {
    /// Network namespace.
    pub netns: &'a str,
    /// The one CPU it runs on (one thread), or every CPU (two threads).
    pub cpu: Option<usize>,
}

/// Runs `dnsperf` as `load` says against `server` with the queries of `queries` for `seconds`,
/// offering at most `max_qps` (0: as fast as it can, with 1000 queries outstanding).
pub fn dnsperf(load: Load<'_>, server: std::net::SocketAddr, queries: &Path, seconds: u32, max_qps: u32) -> Perf {
    let mut command = Command::new("ip");
    command.args(["netns", "exec", load.netns]);
    let threads = match load.cpu {
        Some(cpu) => {
            command.args(["taskset", "-c", &cpu.to_string()]);
            "1"
        }
        None => "2",
    };
    command.args(["dnsperf", "-s", &server.ip().to_string()]);
    command.args(["-p", &server.port().to_string(), "-l", &seconds.to_string(), "-t", "2", "-c", "8", "-T", threads]);
    command.arg("-d").arg(queries).args(["-q", "1000", "-v"]);
    if max_qps > 0 {
        command.args(["-Q", &max_qps.to_string()]);
    }
    let output = command.output().expect("dnsperf (cargo xtask setup installs it)");
    let text = String::from_utf8_lossy(&output.stdout);
    let mut perf = Perf::default();
    let mut run_time = f64::from(seconds);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("> ") {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            match fields.first() {
                Some(&"T") => perf.lost += 1,
                Some(code) => {
                    *perf.rcodes.entry((*code).to_owned()).or_default() += 1;
                    if let Some(latency) = fields.last().and_then(|l| l.parse::<f64>().ok()) {
                        perf.in_order.push(latency);
                    }
                }
                None => {}
            }
        } else if let Some(value) = line.trim().strip_prefix("Run time (s):") {
            run_time = value.trim().parse().unwrap_or(run_time);
        } else if let Some(value) = line.trim().strip_prefix("Queries lost:") {
            perf.lost = perf.lost.max(value.split_whitespace().next().and_then(|v| v.parse().ok()).unwrap_or(0));
        }
    }
    perf.completed = perf.in_order.len() as u64;
    perf.qps = perf.completed as f64 / run_time;
    perf.run_time = run_time;
    perf.latencies.clone_from(&perf.in_order);
    perf.latencies.sort_by(f64::total_cmp);
    perf
}

/// The cumulative buckets, sum and count of a Prometheus histogram in a `/metrics` text.
#[derive(Clone, Debug, Default)]
pub struct HistogramReading {
    /// `(le, cumulative count)`, ascending.
    pub buckets: Vec<(f64, u64)>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl HistogramReading {
    /// Reads histogram `name` from `metrics`.
    pub fn parse(metrics: &str, name: &str) -> Self {
        let mut reading = Self::default();
        for line in metrics.lines() {
            let Some((key, value)) = line.rsplit_once(' ') else { continue };
            if let Some(le) = key.strip_prefix(&format!("{name}_bucket{{le=\"")).and_then(|r| r.strip_suffix("\"}")) {
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) };
                reading.buckets.push((le, value.parse().unwrap_or(0)));
            } else if key == format!("{name}_sum") {
                reading.sum = value.parse().unwrap_or(0.0);
            } else if key == format!("{name}_count") {
                reading.count = value.parse().unwrap_or(0);
            }
        }
        reading
    }

    /// Prometheus' `histogram_quantile(q)` of what was observed between `before` and `self`:
    /// linear within the bucket the quantile falls in, in seconds (0 when nothing was observed).
    pub fn quantile_since(&self, before: &Self, q: f64) -> f64 {
        let delta: Vec<(f64, f64)> = self
            .buckets
            .iter()
            .zip(&before.buckets)
            .map(|((le, now), (_, then))| (*le, now.saturating_sub(*then) as f64))
            .collect();
        let Some(&(_, total)) = delta.last() else { return 0.0 };
        let rank = q * total;
        let mut lower = (0.0, 0.0);
        for (bound, count) in delta {
            if count >= rank && count > lower.1 {
                let bound = if bound.is_finite() { bound } else { lower.0 };
                return lower.0 + (bound - lower.0) * (rank - lower.1) / (count - lower.1);
            }
            lower = (bound, count);
        }
        0.0
    }

    /// What was observed between `before` and `self`: the number, the mean (ms) and the upper
    /// bound of the bucket holding the 99th percentile (ms).
    pub fn since(&self, before: &Self) -> (u64, f64, f64) {
        let count = self.count.saturating_sub(before.count);
        if count == 0 {
            return (0, f64::NAN, f64::NAN);
        }
        let mean = (self.sum - before.sum) / count as f64 * 1e3;
        let wanted = (count as f64 * 0.99).ceil() as u64;
        let p99 = self
            .buckets
            .iter()
            .zip(&before.buckets)
            .find(|((_, now), (_, then))| now.saturating_sub(*then) >= wanted)
            .map_or(f64::INFINITY, |((le, _), _)| le * 1e3);
        (count, mean, p99)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_as_prometheus_computes_them() {
        let text = |counts: [u64; 4]| {
            format!(
                "h_bucket{{le=\"0.001\"}} {}\nh_bucket{{le=\"0.002\"}} {}\nh_bucket{{le=\"0.004\"}} {}\n\
                 h_bucket{{le=\"+Inf\"}} {}\nh_count {}\n",
                counts[0], counts[1], counts[2], counts[3], counts[3]
            )
        };
        let before = HistogramReading::parse(&text([10, 10, 10, 10]), "h");
        let after = HistogramReading::parse(&text([60, 100, 110, 110]), "h");
        assert_eq!(after.quantile_since(&before, 0.5), 0.001);
        assert!((after.quantile_since(&before, 0.99) - 0.0038).abs() < 1e-9);
        assert_eq!(before.quantile_since(&before, 0.99), 0.0, "nothing observed");
    }

    #[test]
    fn a_cold_start_lasts_until_a_stretch_holds_its_p99() {
        // 10 s at 1,000 answers a second: 0.3 s slow, then fast but for one slow answer at 5 s.
        let in_order: Vec<f64> = (0..10_000).map(|n| if n < 300 || n == 5_000 { 0.010 } else { 0.000_1 }).collect();
        let perf = Perf { in_order, run_time: 10.0, ..Perf::default() };
        let settling = perf.settling(0.002, 0.1);
        assert!((settling.after - 0.3).abs() < 1e-9, "{settling:?}");
        assert_eq!(settling.slow, 300, "only the slow answers before it");
        let always = Perf { in_order: vec![0.010; 1_000], run_time: 1.0, ..Perf::default() };
        assert_eq!(always.settling(0.002, 0.1).after, 1.0, "never held: the whole run");
        assert_eq!(always.settling(0.002, 0.1).slow, 1_000);
    }

    #[test]
    fn a_window_holds_the_answers_of_its_seconds_only() {
        // 10 s at 1,000 answers a second: the first 40 ms slow (a generator's start), then one
        // slow answer in each later second but the last.
        let slow = |n: usize| n < 40 || ((1_000..9_000).contains(&n) && n % 1_000 == 500);
        let in_order: Vec<f64> = (0..10_000).map(|n| if slow(n) { 0.004 } else { 0.000_1 }).collect();
        let perf = Perf { in_order, run_time: 10.0, ..Perf::default() };
        let start = perf.window(0.0, 1.0, 0.002);
        assert_eq!((start.answers, start.slow), (1_000, 40), "{start:?}");
        assert!((start.p99_ms - 4.0).abs() < 1e-9, "40 of 1,000 slow: the p99 is slow");
        let steady = perf.window(1.0, 10.0, 0.002);
        assert_eq!((steady.answers, steady.slow), (9_000, 8), "{steady:?}");
        assert!((steady.p99_ms - 0.1).abs() < 1e-9, "8 of 9,000 slow: the p99 is not");
        assert_eq!(perf.window(10.0, 12.0, 0.002).answers, 0, "past the run");
        assert!(perf.window(10.0, 12.0, 0.002).p99_ms.is_nan());
        assert_eq!(perf.window(0.0, 10.0, 0.002).slow, 48, "the whole run");
    }
}
