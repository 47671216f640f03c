//! The comparison as a table, the checks against the talk's numbers and the targets, and an SVG
//! chart of in-zone share and worst overload by cluster size.

use std::fmt::Write as _;

use super::run::{Report, Row};

/// The talk's results over the whole space (k8s-topology-simulator `data/results.csv`).
pub const TALK_RANDOM_IN_ZONE: f64 = 0.3884;
/// The talk's "local" in-zone share.
pub const TALK_LOCAL_IN_ZONE: f64 = 0.8433;
/// The talk's "local" worst deviation.
pub const TALK_LOCAL_MAX_DEVIATION: f64 = 0.4933;

/// One check of the run against a reference or a target.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Check {
    /// What is checked.
    pub what: String,
    /// Whether it holds.
    pub ok: bool,
}

impl Report {
    fn row(&self, key: &str) -> Option<&Row> {
        self.rows.iter().find(|r| r.key == key)
    }

    /// Faithfulness (random and local within 1 point of the talk) and the targets of spillover
    /// (within 0.5 point of the bound, never above ε).
    pub fn checks(&self) -> Vec<Check> {
        let mut checks = Vec::new();
        for (key, reference) in [("random", TALK_RANDOM_IN_ZONE), ("local", TALK_LOCAL_IN_ZONE)] {
            if let Some(row) = self.row(key) {
                checks.push(Check {
                    what: format!("{key}: {} in zone, talk {} (within 1 pt)", pct(row.in_zone), pct(reference)),
                    ok: (row.in_zone - reference).abs() <= 0.01,
                });
            }
        }
        for row in self.rows.iter().filter(|r| r.bound.is_some()) {
            let eps = row.key.trim_start_matches("spillover-").parse::<f64>().unwrap_or(0.0) / 100.0;
            let bound = row.bound.unwrap_or_default();
            checks.push(Check {
                what: format!("{}: {} in zone, bound {} (within 0.5 pt)", row.key, pct(row.in_zone), pct(bound)),
                ok: bound - row.in_zone <= 0.005,
            });
            checks.push(Check {
                what: format!("{}: worst overload {} (at most {})", row.key, pct(row.worst_max_overload), pct(eps)),
                ok: row.worst_max_overload <= eps + 1e-9,
            });
            checks.push(Check { what: format!("{}: no traffic lost", row.key), ok: row.lost < 1e-9 });
        }
        checks
    }

    /// The table, the per-size breakdown and the checks.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} of {} inputs (one in {}), {:.1} s",
            self.inputs,
            self.space,
            self.sample_every,
            self.elapsed.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "\n{:<40} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>9}",
            "algorithm", "in-zone", "bound", "max over", "mean max", "max |dev|", "MAD", "fallback"
        );
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{:<40} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>9}",
                row.name,
                pct(row.in_zone),
                row.bound.map_or_else(|| "-".into(), pct),
                pct(row.worst_max_overload),
                pct(row.mean_max_overload),
                pct(row.worst_max_deviation),
                pct(row.mean_deviation),
                pct(row.fallback)
            );
        }
        let _ = writeln!(out, "\nin-zone share by total endpoints");
        let _ = write!(out, "{:<22}", "endpoints");
        for row in &self.rows {
            let _ = write!(out, " {:>13}", row.key);
        }
        let _ = writeln!(out);
        for (b, label) in self.buckets.iter().enumerate() {
            let _ = write!(out, "{label:<22}");
            for row in &self.rows {
                let _ = write!(out, " {:>13}", row.bucket_in_zone[b].map_or_else(|| "-".into(), pct));
            }
            let _ = writeln!(out);
        }
        let _ = writeln!(out, "\nchecks");
        for check in self.checks() {
            let _ = writeln!(out, "  [{}] {}", if check.ok { "ok" } else { "FAIL" }, check.what);
        }
        out
    }
}

fn pct(fraction: f64) -> String {
    format!("{:.2}%", fraction * 100.0)
}

/// Chart geometry.
const PANEL_WIDTH: f64 = 460.0;
const PANEL_HEIGHT: f64 = 300.0;
const MARGIN_LEFT: f64 = 60.0;
const MARGIN_TOP: f64 = 60.0;
const GAP: f64 = 90.0;

fn color(key: &str) -> &'static str {
    match key {
        "random" => "#8c8c8c",
        "local" => "#e08a00",
        "auto-hints" => "#8e44ad",
        "prefer-close" => "#c0392b",
        "spillover-0" => "#85c1e9",
        "spillover-5" => "#2e86c1",
        _ => "#1b4f72",
    }
}

impl Report {
    /// Two panels over the total-endpoint buckets: mean in-zone share (with the bound of the
    /// largest ε dashed) and worst overload (clipped at 100 %, the clipped value written).
    pub fn svg(&self) -> String {
        let width = MARGIN_LEFT * 2.0 + PANEL_WIDTH * 2.0 + GAP;
        let height = MARGIN_TOP + PANEL_HEIGHT + 150.0;
        let mut out = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
             font-family=\"sans-serif\" font-size=\"12\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        let _ = writeln!(
            out,
            "<text x=\"{MARGIN_LEFT}\" y=\"24\" font-size=\"16\" font-weight=\"bold\">Routing algorithms over \
             the KubeCon input space ({} inputs, one in {})</text>",
            self.inputs, self.sample_every
        );
        let series: Vec<(&Row, Vec<Option<f64>>)> = self.rows.iter().map(|r| (r, r.bucket_in_zone.clone())).collect();
        let bound = self.rows.iter().rev().find(|r| r.bound.is_some());
        self.panel(&mut out, MARGIN_LEFT, "mean in-zone share", &series, bound.map(|r| &r.bucket_bound[..]));
        let series: Vec<(&Row, Vec<Option<f64>>)> =
            self.rows.iter().map(|r| (r, r.bucket_worst_overload.clone())).collect();
        self.panel(&mut out, MARGIN_LEFT + PANEL_WIDTH + GAP, "worst overload (clipped at 100%)", &series, None);
        // Legend.
        let mut x = MARGIN_LEFT;
        let y = MARGIN_TOP + PANEL_HEIGHT + 95.0;
        for row in &self.rows {
            let _ = writeln!(
                out,
                "<line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{}\" stroke-width=\"3\"/>\
                 <text x=\"{}\" y=\"{}\">{}</text>",
                x + 18.0,
                color(&row.key),
                x + 22.0,
                y + 4.0,
                row.key
            );
            x += 40.0 + row.key.len() as f64 * 7.0;
        }
        if let Some(row) = bound {
            let _ = writeln!(
                out,
                "<line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"black\" stroke-dasharray=\"4 3\"/>\
                 <text x=\"{}\" y=\"{}\">bound ({})</text>",
                x + 18.0,
                x + 22.0,
                y + 4.0,
                row.key
            );
        }
        out.push_str("</svg>\n");
        out
    }

    fn panel(
        &self,
        out: &mut String,
        left: f64,
        title: &str,
        series: &[(&Row, Vec<Option<f64>>)],
        dashed: Option<&[Option<f64>]>,
    ) {
        let top = MARGIN_TOP;
        let n = self.buckets.len();
        let x = |i: usize| left + (i as f64 + 0.5) * PANEL_WIDTH / n as f64;
        let y = |v: f64| top + PANEL_HEIGHT * (1.0 - v.clamp(0.0, 1.0));
        let _ = writeln!(out, "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{title}</text>", top - 12.0);
        for tick in 0..=4 {
            let v = f64::from(tick) * 0.25;
            let _ = writeln!(
                out,
                "<line x1=\"{left}\" y1=\"{0}\" x2=\"{1}\" y2=\"{0}\" stroke=\"#ddd\"/>\
                 <text x=\"{2}\" y=\"{3}\" text-anchor=\"end\">{4}%</text>",
                y(v),
                left + PANEL_WIDTH,
                left - 6.0,
                y(v) + 4.0,
                tick * 25
            );
        }
        for (i, label) in self.buckets.iter().enumerate() {
            let short = label.split(' ').next().unwrap_or(label);
            let _ = writeln!(
                out,
                "<text x=\"{0}\" y=\"{1}\" text-anchor=\"end\" transform=\"rotate(-40 {0} {1})\">{short}</text>",
                x(i),
                top + PANEL_HEIGHT + 16.0
            );
        }
        let _ = writeln!(
            out,
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">endpoints in the cluster</text>",
            left + PANEL_WIDTH / 2.0,
            top + PANEL_HEIGHT + 62.0
        );
        let polyline = |values: &[Option<f64>]| -> String {
            values
                .iter()
                .enumerate()
                .filter_map(|(i, v)| v.map(|v| format!("{:.1},{:.1}", x(i), y(v))))
                .collect::<Vec<_>>()
                .join(" ")
        };
        if let Some(values) = dashed {
            let _ = writeln!(
                out,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"black\" stroke-dasharray=\"4 3\"/>",
                polyline(values)
            );
        }
        for (row, values) in series {
            let _ = writeln!(
                out,
                "<polyline points=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>",
                polyline(values),
                color(&row.key)
            );
            for (i, value) in values.iter().enumerate() {
                if let Some(v) = value.filter(|v| *v > 1.0) {
                    let _ = writeln!(
                        out,
                        "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"9\" fill=\"{}\">{:.0}%</text>",
                        x(i),
                        top + 12.0 + (i % 2) as f64 * 10.0,
                        color(&row.key),
                        v * 100.0
                    );
                }
            }
        }
    }
}
