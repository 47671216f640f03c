//! A latency-over-time chart: lines of p99 latency per second (log scale) over phases, the middle
//! ones shaded, and under them the share a feedback line moved out of its zone. The simulator's
//! `--dynamic --svg` and the real-kernel overload demo draw with it, so the two read alike.

use std::fmt::Write as _;

const WIDTH: f64 = 760.0;
const LEFT: f64 = 70.0;
const PLOT: f64 = 640.0;
const TOP: f64 = 50.0;
const LATENCY_HEIGHT: f64 = 220.0;
const SHIFT_TOP: f64 = TOP + LATENCY_HEIGHT + 50.0;
const SHIFT_HEIGHT: f64 = 110.0;
/// The latency axis, milliseconds (log scale).
const LATENCY_RANGE: (f64, f64) = (10.0, 3000.0);
/// The colour of the static plans (PreferClose).
pub const RED: &str = "#c0392b";
/// The colour of a second static plan (capacity spillover).
pub const GREY: &str = "#7f8c8d";
/// The colour of feedback.
pub const BLUE: &str = "#2471a3";

/// One line of the chart.
#[derive(Clone, Debug, Default)]
pub struct Line {
    /// Its legend.
    pub name: String,
    /// Its colour ([`RED`], [`GREY`], [`BLUE`] or any SVG colour).
    pub color: &'static str,
    /// Drawn dashed (a line that would hide another).
    pub dashed: bool,
    /// (seconds, p99 latency in milliseconds) per second; seconds without requests are left out.
    pub p99: Vec<(f64, f64)>,
    /// (seconds, share moved out of the zone), drawn in the lower panel when not empty.
    pub shift: Vec<(f64, f64)>,
}

/// What the chart shows.
#[derive(Clone, Debug, Default)]
pub struct Chart {
    /// The title.
    pub title: String,
    /// (name, seconds) of each phase, in order; all but the first and last are shaded.
    pub phases: Vec<(String, f64)>,
    /// The lines.
    pub lines: Vec<Line>,
    /// What the lower panel shows.
    pub shift_label: String,
}

impl Chart {
    /// The chart, as SVG.
    pub fn svg(&self) -> String {
        let seconds: f64 = self.phases.iter().map(|(_, s)| s).sum::<f64>().max(1.0);
        let x = |t: f64| LEFT + PLOT * (t / seconds).clamp(0.0, 1.0);
        let (lo, hi) = (LATENCY_RANGE.0.ln(), LATENCY_RANGE.1.ln());
        let y_latency = |ms: f64| {
            TOP + LATENCY_HEIGHT * (1.0 - ((ms.clamp(LATENCY_RANGE.0, LATENCY_RANGE.1).ln() - lo) / (hi - lo)))
        };
        let y_shift = |share: f64| SHIFT_TOP + SHIFT_HEIGHT * (1.0 - share.clamp(0.0, 1.0));
        let height = SHIFT_TOP + SHIFT_HEIGHT + 60.0;
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" font-family=\"sans-serif\" \
             font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n<text x=\"{LEFT}\" y=\"24\" \
             font-size=\"15\" font-weight=\"bold\">{}</text>\n",
            escape(&self.title)
        );
        let mut start = 0.0;
        for (i, (name, length)) in self.phases.iter().enumerate() {
            if i > 0 && i + 1 < self.phases.len() {
                let (x0, x1) = (x(start), x(start + length));
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
                    escape(name)
                );
            }
            start += length;
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
        let _ = writeln!(out, "<text x=\"{LEFT}\" y=\"{}\">{}</text>", SHIFT_TOP - 8.0, escape(&self.shift_label));
        for line in &self.lines {
            let color = line.color;
            let dash = if line.dashed { " stroke-dasharray=\"4 3\"" } else { "" };
            let latency = line.p99.iter().map(|(t, ms)| (x(*t), y_latency(*ms)));
            let shift = line.shift.iter().map(|(t, share)| (x(*t), y_shift(*share)));
            for points in [polyline(latency), polyline(shift)].into_iter().flatten() {
                let _ = writeln!(
                    out,
                    "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{dash} points=\"{points}\"/>"
                );
            }
        }
        let legend_y = SHIFT_TOP + SHIFT_HEIGHT + 40.0;
        for (i, line) in self.lines.iter().enumerate() {
            let color = line.color;
            let lx = LEFT + i as f64 * 180.0;
            let _ = writeln!(
                out,
                "<line x1=\"{lx}\" y1=\"{legend_y}\" x2=\"{}\" y2=\"{legend_y}\" stroke=\"{color}\" stroke-width=\"3\"/>\
                 <text x=\"{}\" y=\"{}\">{}</text>",
                lx + 18.0,
                lx + 22.0,
                legend_y + 4.0,
                escape(&line.name)
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
}

/// The `points` attribute of a polyline, `None` without points.
fn polyline(points: impl Iterator<Item = (f64, f64)>) -> Option<String> {
    let points: Vec<String> = points.map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    (!points.is_empty()).then(|| points.join(" "))
}

/// Text safe inside SVG.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_and_shift_is_drawn_and_text_is_escaped() {
        let chart = Chart {
            title: "a <b> & c".into(),
            phases: vec![("calm".into(), 2.0), ("surge".into(), 2.0), ("after".into(), 2.0)],
            lines: vec![
                Line { name: "static".into(), color: RED, p99: vec![(0.5, 20.0), (1.5, 2000.0)], ..Line::default() },
                Line {
                    name: "feedback".into(),
                    color: BLUE,
                    p99: vec![(0.5, 20.0), (1.5, 40.0)],
                    shift: vec![(1.0, 0.0), (2.0, 0.5)],
                    ..Line::default()
                },
            ],
            shift_label: "moved out".into(),
        };
        let svg = chart.svg();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<polyline").count(), 3, "{svg}");
        assert!(svg.contains("a &lt;b&gt; &amp; c"), "{svg}");
        assert_eq!(svg.matches("fill=\"#fdecea\"").count(), 2, "only the surge is shaded, in both panels");
    }
}
