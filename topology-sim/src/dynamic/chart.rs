//! The dynamic comparison as a chart ([`crate::chart`]): each algorithm's p99 latency second by
//! second, and the share feedback moved out of the surging zone, with the surge shaded.

use super::report::DynamicReport;
use crate::chart::{BLUE, Chart, GREY, Line, RED};

/// The chart, as SVG.
pub fn svg(report: &DynamicReport) -> String {
    let lines = report
        .rows
        .iter()
        .map(|row| Line {
            name: row.algorithm.to_owned(),
            color: match row.algorithm {
                "feedback" => BLUE,
                "static spillover" => GREY,
                _ => RED,
            },
            dashed: row.algorithm == "static spillover",
            p99: row.timeline.iter().zip(&row.p99_by_second).filter_map(|((t, _), p99)| Some((*t, (*p99)?))).collect(),
            shift: if row.algorithm == "feedback" { row.timeline.clone() } else { Vec::new() },
        })
        .collect();
    Chart {
        title: format!("{}: p99 latency per second, and the share feedback moved out", report.scenario),
        phases: report.phases.iter().map(|p| (p.name.to_owned(), p.seconds)).collect(),
        lines,
        shift_label: "moved out of their zone (feedback, mean over every node; only the surging zone's nodes move)"
            .into(),
    }
    .svg()
}
