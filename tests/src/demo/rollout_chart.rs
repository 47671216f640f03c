//! The rollout demo's chart: each mode's in-zone share over time, in windows of [`WINDOW_S`],
//! from the steady traffic through the rollout (`rollout.svg`), and the report that shows it
//! beside the table (`rollout.md`).

use std::fmt::Write as _;

use super::rollout::RolloutReport;
use crate::openloop::{OpenLoopReport, Outcome};

/// Width of one point of the series, seconds.
pub const WINDOW_S: f64 = 2.0;

/// The in-zone share of the connections served in each window, as `(seconds from the rollout's
/// start, share)` at each window's middle; a window where none was served is left out.
pub fn series(report: &OpenLoopReport, zone_a: &[String], rollout_from_ns: u64) -> Vec<(f64, f64)> {
    let mut windows: std::collections::BTreeMap<i64, (u64, u64)> = std::collections::BTreeMap::new();
    for attempt in &report.attempts {
        let Outcome::Served(name) = &attempt.outcome else { continue };
        let at_ns = report.started_ns + attempt.at_us * 1000;
        let seconds = (at_ns as f64 - rollout_from_ns as f64) / 1e9;
        let window = windows.entry((seconds / WINDOW_S).floor() as i64).or_default();
        window.0 += u64::from(zone_a.contains(name));
        window.1 += 1;
    }
    windows.into_iter().map(|(w, (kept, all))| ((w as f64 + 0.5) * WINDOW_S, kept as f64 / all as f64)).collect()
}

/// The chart: one line per mode, the rollout's start and end marked.
pub fn svg(report: &RolloutReport) -> String {
    let (left, top, width, height) = (60.0, 40.0, 620.0, 260.0);
    let points = report.modes.iter().flat_map(|m| m.series.iter());
    let (min_s, max_s) = points.fold((0.0_f64, report.rollout_s), |(lo, hi), (s, _)| (lo.min(*s), hi.max(*s)));
    let x = |s: f64| left + (s - min_s) / (max_s - min_s).max(1.0) * width;
    let y = |share: f64| top + (1.0 - share) * height;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"10\" y=\"22\" \
         font-size=\"15\" font-weight=\"bold\">Connections served in this node's zone, during a rolling update \
         ({WINDOW_S} s windows)</text>\n",
        left + width + 170.0,
        top + height + 50.0
    );
    for share in [0.0, 0.25, 0.5, 0.75, 1.0] {
        let (right, at, label_x, percent) = (left + width, y(share), left - 6.0, share * 100.0);
        let _ = writeln!(
            out,
            "<line x1=\"{left}\" x2=\"{right}\" y1=\"{at:.1}\" y2=\"{at:.1}\" stroke=\"#ddd\"/><text x=\"{label_x}\" \
             y=\"{:.1}\" text-anchor=\"end\">{percent:.0}%</text>",
            at + 4.0
        );
    }
    for (s, label) in [(0.0, "rollout starts"), (report.rollout_s, "ends")] {
        let _ = writeln!(
            out,
            "<line x1=\"{0:.1}\" x2=\"{0:.1}\" y1=\"{top}\" y2=\"{1}\" stroke=\"#888\" stroke-dasharray=\"4 3\"/>\
             <text x=\"{0:.1}\" y=\"{2}\" text-anchor=\"middle\">{label}</text>",
            x(s),
            top + height,
            top + height + 16.0
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">seconds from the rollout's start</text>",
        left + width / 2.0,
        top + height + 36.0
    );
    const COLOURS: [&str; 8] = ["#2e7d32", "#1565c0", "#c62828", "#6a1b9a", "#ef6c00", "#00838f", "#9e9e9e", "#5d4037"];
    for (i, mode) in report.modes.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let path: Vec<String> = mode.series.iter().map(|&(s, share)| format!("{:.1},{:.1}", x(s), y(share))).collect();
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>\
             <rect x=\"{:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{colour}\"/><text x=\"{:.1}\" \
             y=\"{:.1}\">{}</text>",
            path.join(" "),
            left + width + 16.0,
            top + 18.0 * i as f64,
            left + width + 34.0,
            top + 18.0 * i as f64 + 10.0,
            mode.mode
        );
    }
    out.push_str("</svg>\n");
    out
}

/// The report: the table and the chart.
pub fn markdown(report: &RolloutReport) -> String {
    format!(
        "# Rolling update\n\nOne Service per mode, the same pods; a client on a node of zone a. Each pod is replaced \
         one at a time (new pod not ready, ready; old pod terminating while serving, gone).\n\n{}\n\
         ![In-zone share over the rollout](rollout.svg)\n",
        report.table()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        demo::rollout::ModeResult,
        openloop::{Attempt, OpenLoopReport},
    };

    #[test]
    fn the_series_is_the_share_per_window_and_the_chart_draws_every_mode() {
        let zone_a = vec!["a-1".to_owned()];
        let attempt = |at_s: f64, name: &str| Attempt {
            at_us: (at_s * 1e6) as u64,
            latency_us: 100,
            outcome: Outcome::Served(name.into()),
        };
        let report = OpenLoopReport {
            started_ns: 10_000_000_000,
            attempts: vec![attempt(0.5, "a-1"), attempt(1.0, "b-1"), attempt(3.0, "a-1"), attempt(3.5, "a-1")],
            ..OpenLoopReport::default()
        };
        // The rollout starts 2 s after the client: windows [-2, 0) and [0, 2).
        let series = series(&report, &zone_a, 12_000_000_000);
        assert_eq!(series, [(-1.0, 0.5), (1.0, 1.0)]);
        let mode = |name: &str| ModeResult { mode: name.into(), series: series.clone(), ..ModeResult::default() };
        let rollout =
            RolloutReport { modes: vec![mode("prefer-close"), mode("hints")], rollout_s: 2.0, ..Default::default() };
        let chart = svg(&rollout);
        assert_eq!(chart.matches("<polyline").count(), 2);
        assert!(chart.contains(">prefer-close</text>") && chart.contains("rollout starts"));
        assert!(markdown(&rollout).contains("![In-zone share over the rollout](rollout.svg)"));
    }
}
