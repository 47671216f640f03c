//! The overload demo's figures: per phase and Service, the share served in zone, latency p50/p99
//! (from each connection's scheduled arrival; a failure counts at the moment it failed) and the
//! failures; when the agent's shift moved and came back; the targets, each met or not;
//! written as `overload.json`, `overload.md` and a latency-over-time chart, `overload.svg`.

use std::{fmt::Write as _, path::Path};

use serde::Serialize;
use topology_sim::chart::{BLUE, Chart, Line, RED};

use super::overload::{OverloadConfig, OverloadRun};
use crate::openloop::{Attempt, OpenLoopReport};

/// One Service in one phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Figures {
    /// Share of the answered connections served by zone a.
    pub in_zone: f64,
    /// Latency percentiles, milliseconds.
    pub p50_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Connections that failed (timed out, refused, reset).
    pub failed: u64,
    /// Connections that arrived in the phase.
    pub connections: u64,
}

/// Both Services in one phase.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PhaseFigures {
    /// The `PreferClose` twin.
    #[serde(rename = "static")]
    pub static_plan: Figures,
    /// The feedback Service.
    pub feedback: Figures,
}

/// The feedback Service's surge p99 target, milliseconds: the connect hook answers overload per
/// connection, before the controller's first look.
pub const SURGE_P99_MS: f64 = 300.0;

/// One of the targets.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Target {
    /// What it asks.
    pub what: String,
    /// What the run measured.
    pub measured: String,
    /// Whether that meets it.
    pub met: bool,
}

/// One decision of the agent, as its live plan showed it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Decision {
    /// Seconds after the start.
    pub at_s: f64,
    /// The share moved out of zone a.
    pub shift: f64,
    /// Why.
    pub reason: String,
    /// What the agent measured.
    pub measured: serde_json::Value,
}

/// Everything the demo writes.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OverloadReport {
    /// Zone a's clients at a tenth of its capacity, before the surge.
    pub warmup: PhaseFigures,
    /// At twice its capacity.
    pub surge: PhaseFigures,
    /// At a tenth again.
    pub calm: PhaseFigures,
    /// Seconds from the surge's start to the agent's first move out.
    pub shift_after_s: Option<f64>,
    /// Seconds from the surge's end until the agent moved nothing out any more.
    pub return_after_s: Option<f64>,
    /// The most the agent moved out.
    pub peak_shift: f64,
    /// The agent's decisions for the feedback Service, each time its reason changed.
    pub decisions: Vec<Decision>,
    /// The shape and timing.
    pub config: OverloadConfig,
    /// Zone a's capacity per Service, connections per second.
    pub capacity_per_s: f64,
    /// The targets.
    pub targets: Vec<Target>,
    /// The chart.
    #[serde(skip)]
    pub chart: Chart,
}

impl OverloadReport {
    /// Whether every target is met.
    pub fn all_met(&self) -> bool {
        self.targets.iter().all(|t| t.met)
    }
}

/// The figures of one run.
pub fn analyse(config: &OverloadConfig, run: &OverloadRun) -> OverloadReport {
    let phases = config.phases();
    let bounds: Vec<(f64, f64)> = phases
        .iter()
        .scan(0.0, |start, p| {
            let bound = (*start, *start + p.seconds);
            *start += p.seconds;
            Some(bound)
        })
        .collect();
    let in_zone_a = |a: &Attempt| a.outcome.served().is_some_and(|name| run.zone_a.iter().any(|n| n == name));
    let figures = |report: &OpenLoopReport, (from, to): (f64, f64)| {
        let attempts: Vec<&Attempt> =
            report.attempts.iter().filter(|a| (from..to).contains(&(a.at_us as f64 / 1e6))).collect();
        phase_figures(&attempts, &in_zone_a)
    };
    let both = |i: usize| PhaseFigures {
        static_plan: figures(&run.static_plan, bounds[i]),
        feedback: figures(&run.feedback, bounds[i]),
    };
    let (surge_start, surge_end) = bounds[1];
    let t = |ns: u64| ns.saturating_sub(run.feedback.started_ns) as f64 / 1e9;
    let shift_after_s =
        run.shifts.iter().find(|s| t(s.at_ns) >= surge_start && s.shift > 0.0).map(|s| t(s.at_ns) - surge_start);
    let return_after_s =
        run.shifts.iter().find(|s| t(s.at_ns) >= surge_end && s.shift == 0.0).map(|s| t(s.at_ns) - surge_end);
    let peak_shift = run.shifts.iter().map(|s| s.shift).fold(0.0, f64::max);
    let mut decisions: Vec<Decision> = Vec::new();
    for sample in &run.shifts {
        if decisions.last().is_none_or(|last| last.reason != sample.reason) {
            decisions.push(Decision {
                at_s: (t(sample.at_ns) * 10.0).round() / 10.0,
                shift: sample.shift,
                reason: sample.reason.clone(),
                measured: sample.measured.clone(),
            });
        }
    }
    let mut report = OverloadReport {
        warmup: both(0),
        surge: both(1),
        calm: both(2),
        shift_after_s,
        return_after_s,
        peak_shift,
        decisions,
        config: config.clone(),
        capacity_per_s: config.capacity_per_s(),
        targets: Vec::new(),
        chart: chart(config, run, &in_zone_a),
    };
    report.targets = targets(&report);
    report
}

fn phase_figures(attempts: &[&Attempt], in_zone_a: &dyn Fn(&Attempt) -> bool) -> Figures {
    let mut latencies: Vec<f64> = attempts.iter().map(|a| a.latency_us as f64 / 1e3).collect();
    latencies.sort_by(f64::total_cmp);
    let answered = attempts.iter().filter(|a| a.outcome.served().is_some()).count();
    let home = attempts.iter().filter(|a| in_zone_a(a)).count();
    Figures {
        in_zone: if answered == 0 { 0.0 } else { home as f64 / answered as f64 },
        p50_ms: percentile(&latencies, 0.50),
        p99_ms: percentile(&latencies, 0.99),
        failed: attempts.iter().filter(|a| a.outcome.served().is_none()).count() as u64,
        connections: attempts.len() as u64,
    }
}

/// The `q` quantile of sorted values (nearest rank), 0 without values.
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    (sorted[rank - 1] * 10.0).round() / 10.0
}

fn targets(r: &OverloadReport) -> Vec<Target> {
    let (surge, calm) = (&r.surge, &r.calm);
    let seconds = |s: Option<f64>| s.map_or("never".to_owned(), |s| format!("{s:.1} s"));
    vec![
        Target {
            what: "surge: feedback p99 ≤ 300 ms, answered per connection (the static plan queues)".into(),
            measured: format!("{:.0} ms vs {:.0} ms", surge.feedback.p99_ms, surge.static_plan.p99_ms),
            met: surge.feedback.p99_ms <= SURGE_P99_MS && surge.feedback.p99_ms <= surge.static_plan.p99_ms / 2.0,
        },
        Target {
            what: "surge: feedback fails no connection".into(),
            measured: format!("{} failed", surge.feedback.failed),
            met: surge.feedback.failed == 0,
        },
        Target {
            what: "surge: at least a third of feedback's traffic still in zone".into(),
            measured: format!("{:.1}%", surge.feedback.in_zone * 100.0),
            met: surge.feedback.in_zone >= 1.0 / 3.0,
        },
        Target {
            what: "calm: feedback keeps ≥ 95% in zone".into(),
            measured: format!("{:.1}%", calm.feedback.in_zone * 100.0),
            met: calm.feedback.in_zone >= 0.95,
        },
        Target {
            what: "the shift happens within 2 s of the surge".into(),
            measured: seconds(r.shift_after_s),
            met: r.shift_after_s.is_some_and(|s| s <= 2.0),
        },
        Target {
            what: "and returns within 10 s after it".into(),
            measured: seconds(r.return_after_s),
            met: r.return_after_s.is_some_and(|s| s <= 10.0),
        },
    ]
}

/// Each Service's p99 per second of arrival, and where feedback's connections landed.
fn chart(config: &OverloadConfig, run: &OverloadRun, in_zone_a: &dyn Fn(&Attempt) -> bool) -> Chart {
    let phases = config.phases();
    let seconds = phases.iter().map(|p| p.seconds).sum::<f64>().ceil() as usize;
    let p99 = |report: &OpenLoopReport| -> Vec<(f64, f64)> {
        by_second(report, seconds)
            .iter()
            .enumerate()
            .filter(|(_, bucket)| !bucket.is_empty())
            .map(|(s, bucket)| (s as f64 + 0.5, phase_figures(bucket, in_zone_a).p99_ms))
            .collect()
    };
    let moved: Vec<(f64, f64)> = by_second(&run.feedback, seconds)
        .iter()
        .enumerate()
        .filter_map(|(s, bucket)| {
            let answered = bucket.iter().filter(|a| a.outcome.served().is_some()).count();
            let home = bucket.iter().filter(|a| in_zone_a(a)).count();
            (answered > 0).then(|| (s as f64 + 0.5, 1.0 - home as f64 / answered as f64))
        })
        .collect();
    Chart {
        title: format!(
            "overload, real kernel: p99 per second; zone a serves {:.0}/s, its clients send 0.1×, 2×, 0.1×",
            config.capacity_per_s()
        ),
        phases: phases.iter().map(|p| (p.name.clone(), p.seconds)).collect(),
        lines: vec![
            Line { name: "PreferClose (static)".into(), color: RED, p99: p99(&run.static_plan), ..Line::default() },
            Line { name: "feedback".into(), color: BLUE, p99: p99(&run.feedback), shift: moved, ..Line::default() },
        ],
        shift_label: "feedback's connections served outside zone a, per second".into(),
    }
}

/// The attempts of each of the first `seconds` seconds, by arrival.
fn by_second(report: &OpenLoopReport, seconds: usize) -> Vec<Vec<&Attempt>> {
    let mut buckets: Vec<Vec<&Attempt>> = vec![Vec::new(); seconds];
    for attempt in &report.attempts {
        if let Some(bucket) = buckets.get_mut((attempt.at_us / 1_000_000) as usize) {
            bucket.push(attempt);
        }
    }
    buckets
}

/// The table printed and written to `overload.md`.
pub fn table(r: &OverloadReport) -> String {
    let mut out = String::from(
        "| phase | Service | connections | in zone | p50 ms | p99 ms | failed |\n| --- | --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (phase, figures) in [("warm-up", &r.warmup), ("surge", &r.surge), ("calm", &r.calm)] {
        for (name, f) in [("PreferClose (static)", &figures.static_plan), ("feedback", &figures.feedback)] {
            let _ = writeln!(
                out,
                "| {phase} | {name} | {} | {:.1}% | {:.1} | {:.1} | {} |",
                f.connections,
                f.in_zone * 100.0,
                f.p50_ms,
                f.p99_ms,
                f.failed
            );
        }
    }
    out.push('\n');
    for target in &r.targets {
        let mark = if target.met { "met" } else { "NOT met" };
        let _ = writeln!(out, "- {}: {} ({mark})", target.what, target.measured);
    }
    out
}

/// Writes `overload.json`, `overload.md` and `overload.svg` into `dir`.
pub fn write(dir: &Path, r: &OverloadReport) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("overload.json"), serde_json::to_string_pretty(r).map_err(std::io::Error::other)?)?;
    std::fs::write(dir.join("overload.svg"), r.chart.svg())?;
    let c = &r.config;
    let markdown = format!(
        "# Overload: real-time feedback through the real kernel\n\nZone a's backends: {} per Service, {} workers × \
         {} ms each ({:.0} connections/s); zone b's have {} workers each. Zone a's clients open TCP connections open \
         loop (Poisson arrivals) to a `PreferClose` Service and to its twin under `spillover: feedback`, each with \
         its own backends: {:.0}/s for {:.0} s, {:.0}/s for {:.0} s, {:.0}/s for {:.0} s. A connection waits at most \
         2 s from its scheduled arrival.\n\n{}\n![p99 latency per second of both Services, and where feedback's \
         connections landed](overload.svg)\n\nThe agent moved at most {:.0}% out.\n",
        c.backends,
        c.workers,
        c.service_ms,
        r.capacity_per_s,
        c.far_workers,
        r.capacity_per_s * 0.1,
        c.warmup_s,
        r.capacity_per_s * 2.0,
        c.surge_s,
        r.capacity_per_s * 0.1,
        c.calm_s,
        table(r),
        r.peak_shift * 100.0
    );
    std::fs::write(dir.join("overload.md"), markdown)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_take_the_nearest_rank_and_targets_read_the_figures() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!((percentile(&values, 0.5), percentile(&values, 0.99), percentile(&[], 0.5)), (50.0, 99.0, 0.0));
        let mut report = OverloadReport::default();
        report.surge.static_plan.p99_ms = 2000.0;
        report.surge.feedback = Figures { in_zone: 0.5, p50_ms: 60.0, p99_ms: 250.0, failed: 0, connections: 10 };
        report.calm.feedback.in_zone = 0.96;
        report.shift_after_s = Some(1.2);
        report.return_after_s = Some(4.0);
        assert!(targets(&report).iter().all(|t| t.met), "{:?}", targets(&report));
        report.surge.feedback.failed = 1;
        report.surge.feedback.p99_ms = 900.0;
        report.return_after_s = None;
        let unmet: Vec<String> = targets(&report).into_iter().filter(|t| !t.met).map(|t| t.measured).collect();
        assert_eq!(unmet, ["900 ms vs 2000 ms", "1 failed", "never"], "900 ms is under half the static p99, not 300");
    }
}
