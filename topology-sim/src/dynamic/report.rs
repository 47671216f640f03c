//! What a dynamic run measured: per algorithm and phase, the share served in zone, latency, the
//! worst endpoint overload, failures, and how often and how long the sets moved.

use std::fmt::Write as _;

use serde::Serialize;

use super::cluster::Phase;

/// Figures collected during one phase.
pub struct PhaseFigures {
    name: &'static str,
    latencies_us: Vec<u64>,
    in_zone: u64,
    /// Requests that waited longer than the client's timeout.
    pub failed: u64,
    /// The most any endpoint received in one second, over what it can serve.
    pub worst_overload: f64,
    /// Seconds until the nodes' mean shift settled (`None`: not within the phase's first three
    /// quarters).
    pub settle_s: Option<f64>,
}

impl PhaseFigures {
    /// Empty figures of phase `name`.
    pub fn new(name: &'static str) -> Self {
        Self { name, latencies_us: Vec::new(), in_zone: 0, failed: 0, worst_overload: 0.0, settle_s: Some(0.0) }
    }

    /// One served request.
    pub fn record(&mut self, latency_us: u64, in_zone: bool) {
        self.latencies_us.push(latency_us);
        self.in_zone += u64::from(in_zone);
    }

    /// The phase's figures.
    pub fn finish(mut self) -> PhaseRow {
        self.latencies_us.sort_unstable();
        let quantile = |q: f64| {
            let n = self.latencies_us.len();
            (n > 0).then(|| self.latencies_us[((n as f64 * q) as usize).min(n - 1)] as f64 / 1000.0)
        };
        let served = self.latencies_us.len() as u64;
        PhaseRow {
            phase: self.name,
            in_zone: if served == 0 { 0.0 } else { self.in_zone as f64 / served as f64 },
            p50_ms: quantile(0.5),
            p99_ms: quantile(0.99),
            worst_overload: self.worst_overload,
            served,
            failed: self.failed,
            settle_s: self.settle_s,
        }
    }
}

/// One algorithm in one phase.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PhaseRow {
    /// The phase.
    pub phase: &'static str,
    /// Share of the served requests served in the client's zone.
    pub in_zone: f64,
    /// Median latency (waiting and service), milliseconds.
    pub p50_ms: Option<f64>,
    /// 99th percentile latency, milliseconds.
    pub p99_ms: Option<f64>,
    /// The most any endpoint received in a second, over what it can serve (1.0: exactly full).
    pub worst_overload: f64,
    /// Requests served.
    pub served: u64,
    /// Requests that waited longer than the client's timeout.
    pub failed: u64,
    /// Seconds from the phase's start until the nodes' mean shift stays within 5 points of where
    /// it ends the phase; `None` when it did not within the phase's first three quarters.
    pub settle_s: Option<f64>,
}

/// One algorithm over the whole run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The algorithm.
    pub algorithm: &'static str,
    /// Set changes per node per minute.
    pub swaps_per_minute: f64,
    /// Per phase.
    pub phases: Vec<PhaseRow>,
    /// (seconds, the nodes' mean shift) at the end of every second.
    pub timeline: Vec<(f64, f64)>,
    /// The 99th percentile latency of the requests that arrived in each second, milliseconds.
    pub p99_by_second: Vec<Option<f64>>,
}

/// A dynamic comparison.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DynamicReport {
    /// The scenario's name.
    pub scenario: String,
    /// The cluster.
    pub shape: super::cluster::Shape,
    /// The demand over time.
    pub phases: Vec<Phase>,
    /// Per algorithm.
    pub rows: Vec<Row>,
}

impl DynamicReport {
    /// The table.
    pub fn table(&self) -> String {
        let s = &self.shape;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "scenario {}: {} zones × {} nodes (one agent each) and {} endpoints of {} workers × {} ms",
            self.scenario, s.zones, s.nodes_per_zone, s.endpoints_per_zone, s.workers, s.service_ms
        );
        for phase in &self.phases {
            let demand: Vec<String> = phase.demand.iter().map(|d| format!("{:.0}%", d * 100.0)).collect();
            let _ = writeln!(
                out,
                "  {:<6} {:>4.0} s, demand per zone (of its capacity) {}",
                phase.name,
                phase.seconds,
                demand.join(" ")
            );
        }
        let _ = writeln!(
            out,
            "\n{:<17} {:<6} {:>8} {:>8} {:>9} {:>9} {:>7} {:>9} {:>8}",
            "algorithm", "phase", "in-zone", "p50 ms", "p99 ms", "overload", "failed", "swaps/min", "settle"
        );
        let ms = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1}"));
        for row in &self.rows {
            for (i, p) in row.phases.iter().enumerate() {
                let swaps = if i == 0 { format!("{:.1}", row.swaps_per_minute) } else { String::new() };
                let settle = p.settle_s.map_or("no".to_owned(), |s| format!("{s:.0} s"));
                let _ = writeln!(
                    out,
                    "{:<17} {:<6} {:>7.1}% {:>8} {:>9} {:>8.2}x {:>7} {:>9} {:>8}",
                    if i == 0 { row.algorithm } else { "" },
                    p.phase,
                    p.in_zone * 100.0,
                    ms(p.p50_ms),
                    ms(p.p99_ms),
                    p.worst_overload,
                    p.failed,
                    swaps,
                    settle
                );
            }
        }
        out
    }

    /// The row of `algorithm`, phase `phase`.
    pub fn get(&self, algorithm: &str, phase: &str) -> Option<&PhaseRow> {
        self.rows.iter().find(|r| r.algorithm == algorithm)?.phases.iter().find(|p| p.phase == phase)
    }
}
