//! The demo's bytes: every node moves known volumes — short requests and bulk downloads — to the
//! `bytes` Service (`PreferClose`) and to its twin with no topology policy; the agents' own
//! counts (`topology_agent_bytes_total`, `…_cross_zone_bytes_baseline_total`) then say how much
//! crossed zones, what the default policy would have sent across, and what that costs, in GB and
//! dollars, against what the clients say they moved.

use std::{
    fmt::Write as _,
    net::{IpAddr, SocketAddr},
    time::{Duration, Instant},
};

use serde::Serialize;

use super::{
    DemoCluster, DemoNodes as _,
    plan::{BYTES_PORT, BYTES_SERVICES},
    report::DOLLARS_PER_GB_EACH_WAY,
};
use crate::bulk::{self, Transfer};

/// What each node sends each of the two Services: short requests, then bulk downloads.
const REQUESTS: (u64, Transfer) = (20, Transfer { send: 16 << 10, receive: 256 << 10, hold: Duration::ZERO });
const DOWNLOADS: (u64, Transfer) = (20, Transfer { send: 16 << 10, receive: 2 << 20, hold: Duration::ZERO });

/// One Service's bytes, from every node.
#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BytesResult {
    /// Service name.
    pub service: String,
    /// What its clients wrote and read.
    pub moved: u64,
    /// What the agents counted, both directions, kept in the client's zone.
    pub in_zone: u64,
    /// What they counted across zones.
    pub cross_zone: u64,
    /// What the default policy would have sent across, by the agents' baseline.
    pub baseline_cross_zone: f64,
}

impl BytesResult {
    /// Counted, in and across zones.
    pub fn counted(&self) -> u64 {
        self.in_zone + self.cross_zone
    }

    /// The share counted across zones.
    pub fn cross_share(&self) -> f64 {
        self.cross_zone as f64 / self.counted().max(1) as f64
    }
}

/// Moves the volumes from every node (in parallel) and reads what the agents counted, once they
/// have counted at least what the clients moved (they read the kernel every 10 s).
pub fn measure(demo: &DemoCluster) -> Vec<BytesResult> {
    let mut results: Vec<BytesResult> = BYTES_SERVICES
        .iter()
        .map(|(name, vip, _)| {
            let target = SocketAddr::new(IpAddr::V4(*vip), BYTES_PORT);
            let moved: u64 = std::thread::scope(|scope| {
                let handles: Vec<_> = (0..demo.nodes())
                    .map(|node| {
                        scope.spawn(move || {
                            let place = demo.place(node);
                            [REQUESTS, DOWNLOADS]
                                .into_iter()
                                .map(|(count, transfer)| {
                                    let client = bulk::spawn(&place, target, transfer, count);
                                    let report = bulk::finish(client, Duration::from_secs(120));
                                    assert!(report.errors.is_empty(), "bytes from node {node}: {report:?}");
                                    report.sent + report.received
                                })
                                .sum::<u64>()
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().expect("bytes thread")).sum()
            });
            BytesResult { service: (*name).to_owned(), moved, ..BytesResult::default() }
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = demo.agent_metrics();
        for result in &mut results {
            count(result, &metrics);
        }
        if results.iter().all(|r| r.counted() >= r.moved) || Instant::now() > deadline {
            return results;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Sets `result`'s counts from every agent's /metrics.
fn count(result: &mut BytesResult, metrics: &[String]) {
    let service = format!("service=\"demo/{}:bulk\"", result.service);
    let label = |line: &str, name: &str| -> String {
        let start = line.find(&format!("{name}=\"")).map(|at| at + name.len() + 2);
        start.and_then(|at| line[at..].split('"').next()).unwrap_or_default().to_owned()
    };
    let value = |line: &str| line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (result.in_zone, result.cross_zone, result.baseline_cross_zone) = (0, 0, 0.0);
    for line in metrics.iter().flat_map(|m| m.lines()).filter(|line| line.contains(&service)) {
        if line.starts_with("topology_agent_bytes_total{") {
            let bytes = value(line) as u64;
            if label(line, "from_zone") == label(line, "to_zone") {
                result.in_zone += bytes;
            } else {
                result.cross_zone += bytes;
            }
        } else if line.starts_with("topology_agent_cross_zone_bytes_baseline_total{") {
            result.baseline_cross_zone += value(line);
        }
    }
}

/// The line the demo prints: what crossed, against the twin and the baseline, in GB and dollars.
pub fn line(results: &[BytesResult]) -> String {
    let [ours, twin] = results else { return "bytes: not measured".into() };
    let saved_per_gb = (twin.cross_share() - ours.cross_share()).max(0.0) * 2.0 * DOLLARS_PER_GB_EACH_WAY;
    format!(
        "bytes (the agents' kernel counts): {:.0} MB to `{}` (PreferClose) and {:.0} MB to its twin, every node's \
         short requests and bulk downloads; {:.1}% crossed zones where the twin's {:.1}% did (the default policy's \
         expectation for the same bytes: {:.1}%): ${saved_per_gb:.4} per GB saved at ${DOLLARS_PER_GB_EACH_WAY:.2}/GB \
         each way",
        ours.counted() as f64 / 1e6,
        ours.service,
        twin.counted() as f64 / 1e6,
        ours.cross_share() * 100.0,
        twin.cross_share() * 100.0,
        ours.baseline_cross_zone / ours.counted().max(1) as f64 * 100.0,
    )
}

/// The report's section: a table per Service in GB and dollars.
pub fn section(results: &[BytesResult]) -> String {
    let mut out = String::from("\n## Cross-zone bytes, as the agents counted them\n\n");
    let _ = writeln!(
        out,
        "Every node sends {} requests ({} KiB up, {} KiB down) and {} downloads ({} MiB) to each Service; the \
         figures are the agents' own `topology_agent_bytes_total` and `…_cross_zone_bytes_baseline_total`, \
         summed over the nodes, beside what the clients moved. Dollars at ${DOLLARS_PER_GB_EACH_WAY:.2}/GB each \
         way.\n",
        REQUESTS.0,
        REQUESTS.1.send >> 10,
        REQUESTS.1.receive >> 10,
        DOWNLOADS.0,
        DOWNLOADS.1.receive >> 20,
    );
    let _ = writeln!(
        out,
        "| Service | Moved (clients) | Counted | In zone | Across zones | Default would cross | $ across |"
    );
    let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for r in results {
        let gb = |bytes: f64| bytes / 1e9;
        let _ = writeln!(
            out,
            "| `{}` | {:.3} GB | {:.3} GB | {:.3} GB | {:.3} GB | {:.3} GB | ${:.4} |",
            r.service,
            gb(r.moved as f64),
            gb(r.counted() as f64),
            gb(r.in_zone as f64),
            gb(r.cross_zone as f64),
            gb(r.baseline_cross_zone),
            gb(r.cross_zone as f64) * 2.0 * DOLLARS_PER_GB_EACH_WAY,
        );
    }
    let _ = writeln!(out, "\n{}", line(results));
    out
}
