//! The dynamic comparison as a chart: each algorithm's p99 latency second by second (log scale),
//! and the share feedback moved out of the surging zone, with the surge shaded.

use std::fmt::Write as _;

use super::report::DynamicReport;

const WIDTH: f64 = 760.0;
const LEFT: f64 = 70.0;
const PLOT: f64 = 640.0;
const TOP: f64 = 50.0;
const LATENCY_HEIGHT: f64 = 220.0;
const SHIFT_TOP: f64 = TOP + LATENCY_HEIGHT + 50.0;
const SHIFT_HEIGHT: f64 = 110.0;
/// The latency axis, milliseconds (log scale).
const LATENCY_RANGE: (f64, f64) = (10.0, 3000.0);

/// The chart, as SVG.
pub fn svg(report: &DynamicReport) -> String {
    let seconds: f64 = report.phases.iter().map(|p| p.seconds).sum();
    let x = |t: f64| LEFT + PLOT * (t / seconds).clamp(0.0, 1.0);
    let (lo, hi) = (LATENCY_RANGE.0.ln(), LATENCY_RANGE.1.ln());
    let y_latency =
        |ms: f64| TOP + LATENCY_HEIGHT * (1.0 - ((ms.clamp(LATENCY_RANGE.0, LATENCY_RANGE.1).ln() - lo) / (hi - lo)));
    let y_shift = |share: f64| SHIFT_TOP + SHIFT_HEIGHT * (1.0 - share.clamp(0.0, 1.0));
    let height = SHIFT_TOP + SHIFT_HEIGHT + 60.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" \
         font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"24\" \
         font-size=\"15\" font-weight=\"bold\">{}: p99 latency per second, and the share feedback moved out</text>\n",
        report.scenario
    );
    // The phases other than the first and last (the surge), shaded.
    let mut start = 0.0;
    for (i, phase) in report.phases.iter().enumerate() {
        if i > 0 && i + 1 < report.phases.len() {
            let (x0, x1) = (x(start), x(start + phase.seconds));
            for (top, h) in [(TOP, LATENCY_HEIGHT), (SHIFT_TOP, SHIFT_HEIGHT)] {
                let _ = writeln!(
                    out,
                    "<rect x=\"{x0:.1}\" y=\"{top}\" width=\"{:.1}\" height=\"{h}\" fill=\"#fdecea\"/>",
                    x1 - x0
                );
            }
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{}\" fill=\"#b03a2e\">{}</text>",
                x0 + 4.0,
                TOP + 14.0,
                phase.name
            );
        }
        start += phase.seconds;
    }
    let gridlines = [10.0, 100.0, 1000.0].map(|ms| (y_latency(ms), format!("{ms} ms")));
    let shares = [0.0, 0.5, 1.0].map(|share| (y_shift(share), format!("{:.0}%", share * 100.0)));
    for (y, label) in gridlines.into_iter().chain(shares) {
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{:.1}\" \
             text-anchor=\"end\">{label}</text>",
            LEFT + PLOT,
            LEFT - 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{LEFT}\" y=\"{}\">moved out of their zone (feedback, mean over every node; only the surging zone's nodes move)</text>",
        SHIFT_TOP - 8.0
    );
    let colors = ["#c0392b", "#7f8c8d", "#2471a3"];
    for (row, color) in report.rows.iter().zip(colors) {
        let points: Vec<String> = row
            .timeline
            .iter()
            .zip(&row.p99_by_second)
            .filter_map(|((t, _), p99)| p99.map(|ms| format!("{:.1},{:.1}", x(*t), y_latency(ms))))
            .collect();
        let dash = if row.algorithm == "static spillover" { " stroke-dasharray=\"4 3\"" } else { "" };
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{}\"/>",
            points.join(" ")
        );
        if row.algorithm == "feedback" {
            let points: Vec<String> =
                row.timeline.iter().map(|(t, s)| format!("{:.1},{:.1}", x(*t), y_shift(*s))).collect();
            let _ = writeln!(
                out,
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
                points.join(" ")
            );
        }
    }
    let legend_y = SHIFT_TOP + SHIFT_HEIGHT + 40.0;
    for (i, (row, color)) in report.rows.iter().zip(colors).enumerate() {
        let lx = LEFT + i as f64 * 180.0;
        let _ = writeln!(
            out,
            "<line x1=\"{lx}\" y1=\"{legend_y}\" x2=\"{}\" y2=\"{legend_y}\" stroke=\"{color}\" stroke-width=\"3\"/><text \
             x=\"{}\" y=\"{}\">{}</text>",
            lx + 18.0,
            lx + 22.0,
            legend_y + 4.0,
            row.algorithm
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">seconds: {seconds:.0}</text>",
        LEFT + PLOT,
        legend_y + 4.0
    );
    out.push_str("</svg>\n");
    out
}
