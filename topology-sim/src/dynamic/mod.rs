//! `topology-sim --dynamic`: real-time feedback against the static plans over time. A
//! time-stepped model of queueing backends (a fixed number of workers and a fixed service time
//! each), per-zone demand that surges and calms, and one independent agent per client node —
//! the agent's own policy and feedback controller, each reading only its own node's counters, on
//! its own clock. Rows: PreferClose, static (capacity) spillover, feedback.

pub mod chart;
pub mod cluster;
pub mod report;
pub mod run;

use cluster::{Algorithm, Phase, Shape};
use report::DynamicReport;
use run::Config;
use topology_policy::feedback::Tuning;

/// The demand patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// One zone's clients surge to twice its capacity, then calm down.
    Surge,
    /// Two zones surge at once (1.1× their capacity each) while the third idles: every node
    /// sheds on its own view at the same time.
    Zones,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Surge => "surge",
            Self::Zones => "zones",
        }
    }

    fn phases(self) -> Vec<Phase> {
        let calm = vec![0.2, 0.2, 0.2];
        let surge = match self {
            Self::Surge => vec![2.0, 0.2, 0.2],
            Self::Zones => vec![1.1, 1.1, 0.2],
        };
        vec![
            Phase { name: "calm", seconds: 20.0, demand: calm.clone() },
            Phase { name: "surge", seconds: 30.0, demand: surge },
            Phase { name: "after", seconds: 30.0, demand: calm },
        ]
    }
}

/// The cluster every scenario runs on: 3 zones of 4 client nodes and 3 endpoints, each endpoint
/// 4 workers × 20 ms (200 requests/s; 600 per zone).
pub const SHAPE: Shape = Shape { zones: 3, nodes_per_zone: 4, endpoints_per_zone: 3, workers: 4, service_ms: 20.0 };

/// Runs every algorithm through `scenario`.
pub fn simulate(scenario: Scenario, seed: u64, tuning: Tuning) -> anyhow::Result<DynamicReport> {
    let config = Config { shape: SHAPE, phases: scenario.phases(), step_ms: 5.0, timeout_ms: 2000.0, seed, tuning };
    let rows = Algorithm::ALL.iter().map(|&a| run::run(&config, a)).collect::<anyhow::Result<Vec<_>>>()?;
    Ok(DynamicReport { scenario: scenario.name().into(), shape: SHAPE, phases: config.phases, rows })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feedback_answers_the_surge_within_300_ms_keeps_a_third_in_zone_and_comes_home() {
        let report = simulate(Scenario::Surge, 7, Tuning::default()).unwrap();
        eprintln!("{}", report.table());
        let close = report.get("PreferClose", "surge").unwrap();
        let feedback = report.get("feedback", "surge").unwrap();
        assert!(feedback.p99_ms.unwrap() <= close.p99_ms.unwrap() / 2.0, "{}", report.table());
        // The connect hook answers the surge per connection before the controller's first look;
        // without it, the first second's queue is the p99.
        assert!(feedback.p99_ms.unwrap() <= 300.0, "{}", report.table());
        let per_second = simulate(Scenario::Surge, 7, Tuning { spill_min: 0, ..Tuning::default() }).unwrap();
        let controller_only = per_second.get("feedback", "surge").unwrap();
        assert!(controller_only.p99_ms.unwrap() > 300.0, "{}", per_second.table());
        assert_eq!(feedback.failed, 0, "{}", report.table());
        assert!(feedback.in_zone >= 1.0 / 3.0, "{}", report.table());
        assert!(feedback.settle_s.is_some(), "the sets settle during the surge: {}", report.table());
        let after = report.get("feedback", "after").unwrap();
        assert!(after.in_zone >= 0.95, "{}", report.table());
        let svg = chart::svg(&report);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 4, "three latency lines and feedback's shift");
        let row = report.rows.iter().find(|r| r.algorithm == "feedback").unwrap();
        assert_eq!(row.timeline.len(), row.p99_by_second.len());
        let calm = report.get("feedback", "calm").unwrap();
        assert_eq!(calm.in_zone, 1.0, "no move without load: {}", report.table());
        assert!(close.failed > 0 && close.in_zone == 1.0, "PreferClose keeps the surge home: {}", report.table());
    }

    #[test]
    fn independent_nodes_converge_when_two_zones_surge_at_once() {
        let report = simulate(Scenario::Zones, 11, Tuning::default()).unwrap();
        eprintln!("{}", report.table());
        let feedback = report.get("feedback", "surge").unwrap();
        assert!(feedback.settle_s.is_some(), "no oscillation: {}", report.table());
        assert_eq!(feedback.failed, 0, "{}", report.table());
        let close = report.get("PreferClose", "surge").unwrap();
        assert!(feedback.p99_ms.unwrap() < close.p99_ms.unwrap(), "{}", report.table());
        assert!(feedback.p99_ms.unwrap() <= 300.0, "{}", report.table());
        let swaps = report.rows.iter().find(|r| r.algorithm == "feedback").unwrap().swaps_per_minute;
        assert!(swaps <= 30.0, "at most one change a second, and far fewer: {swaps}");
    }
}
