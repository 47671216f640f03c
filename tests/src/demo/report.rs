//! The demo's report: a terminal table, `report.md` and an SVG chart of the in-zone share per
//! Service, ours next to its no-topology twin, and the cross-zone traffic that saves.

use std::{fmt::Write as _, path::Path};

use super::{
    measure::{Failover, Landing, ServiceResult},
    plan::{DemoConfig, Policy, Transport},
};

/// Price of cross-zone traffic per GB in each direction (AWS, GCP and Azure charge about this).
pub const DOLLARS_PER_GB_EACH_WAY: f64 = 0.01;

/// A policy Service next to its twin: the same Service with no topology policy (every endpoint
/// equally likely, kube-proxy's default), programmed by the same agents.
pub struct Comparison<'a> {
    /// The policy Service.
    pub ours: &'a ServiceResult,
    /// Its default-policy twin.
    pub baseline: &'a ServiceResult,
}

impl Comparison<'_> {
    /// Cross-zone GB avoided per GB of traffic to this Service (never negative).
    pub fn gb_avoided_per_gb(&self) -> Option<f64> {
        let ours = self.ours.total.in_zone()?;
        let baseline = self.baseline.total.in_zone()?;
        Some((ours - baseline).max(0.0))
    }
}

/// Pairs every policy Service with its baseline.
pub fn comparisons(results: &[ServiceResult]) -> Vec<Comparison<'_>> {
    results
        .iter()
        .filter(|r| r.baseline_of.is_none())
        .filter_map(|ours| {
            let baseline = results.iter().find(|b| b.baseline_of.as_deref() == Some(&ours.name))?;
            Some(Comparison { ours, baseline })
        })
        .collect()
}

/// The in-zone share of the Service from the real kube-proxy's node ("drops all" when nothing was
/// delivered: itp Local on a node without a backend), or `–`.
fn kube_proxy_cell(result: &ServiceResult) -> String {
    match &result.kube_proxy {
        Some(landing) if landing.delivered() == 0 => "drops all".into(),
        Some(landing) => percent(landing.in_zone()),
        None => "–".into(),
    }
}

/// Whether the real kube-proxy was measured (the real control plane's demo).
fn with_kube_proxy(results: &[ServiceResult]) -> bool {
    results.iter().any(|result| result.kube_proxy.is_some())
}

fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "–".into(), |s| format!("{:.1}%", s * 100.0))
}

fn policy_name(result: &ServiceResult) -> &'static str {
    if result.transport == Transport::Dns {
        return match result.policy {
            Policy::PreferClose => "PreferClose, by DNS",
            _ => "default, by DNS",
        };
    }
    match result.policy {
        Policy::Default => "default",
        Policy::PreferClose => "PreferClose",
        Policy::PreferSameNode => "PreferSameNode",
        Policy::TopologyKeys => "keys host,zone,*",
        Policy::HardKeys => "hard key, no match",
        Policy::Local => "itp: Local",
        Policy::AutoHints => "topology-mode Auto",
    }
}

fn landing_cells(landing: &Landing) -> [String; 5] {
    let share = |n: u64| format!("{:.1}%", n as f64 * 100.0 / landing.attempts().max(1) as f64);
    [
        share(landing.same_node),
        share(landing.same_zone),
        share(landing.other_zone),
        share(landing.other_region),
        share(landing.refused + landing.failed),
    ]
}

/// The table printed at the end of the run.
pub fn table(results: &[ServiceResult]) -> String {
    let mut out = String::new();
    let proxy = with_kube_proxy(results);
    let _ = writeln!(
        out,
        "{:<18} {:<19} {:>8} {:>10} {}{:>8} {:>8} {:>10} {:>12} {:>8} {:>13}",
        "service",
        "policy",
        "in zone",
        "twin",
        if proxy { format!("{:>10} ", "kube-proxy") } else { String::new() },
        "node",
        "zone",
        "other zone",
        "other region",
        "refused",
        "explain said"
    );
    for comparison in comparisons(results) {
        let ours = comparison.ours;
        let [node, zone, other_zone, other_region, refused] = landing_cells(&ours.total);
        let said = if ours.expected_refusing_nodes == ours.per_node.len() {
            "refuse".to_owned()
        } else {
            percent(ours.expected_in_zone)
        };
        let _ = writeln!(
            out,
            "{:<18} {:<19} {:>8} {:>10} {}{:>8} {:>8} {:>10} {:>12} {:>8} {:>13}",
            ours.name,
            policy_name(ours),
            percent(ours.total.in_zone()),
            percent(comparison.baseline.total.in_zone()),
            if proxy { format!("{:>10} ", kube_proxy_cell(ours)) } else { String::new() },
            node,
            zone,
            other_zone,
            other_region,
            refused,
            said
        );
    }
    out
}

/// What the demo measured, for [`write`].
pub struct Measured<'a> {
    /// Where connections landed, Service by Service.
    pub results: &'a [ServiceResult],
    /// A zone failing over.
    pub failover: &'a Failover,
    /// One pod failing over.
    pub pod: &'a super::PodFailover,
    /// The bytes section (the embedded control plane's bulk servers), if measured.
    pub bytes: Option<&'a [super::bytes::BytesResult]>,
    /// Which control plane fed the agents, in one sentence.
    pub control_plane: &'a str,
}

/// Writes `report.md` and `in-zone.svg` into `dir`.
pub fn write(dir: &Path, config: &DemoConfig, measured: &Measured<'_>) -> std::io::Result<()> {
    std::fs::write(dir.join("in-zone.svg"), svg(measured.results))?;
    let mut markdown = markdown(config, measured.results, measured.failover, measured.pod, measured.control_plane);
    if let Some(bytes) = measured.bytes {
        markdown.push_str(&super::bytes::section(bytes));
    }
    std::fs::write(dir.join("report.md"), markdown)
}

fn markdown(
    config: &DemoConfig,
    results: &[ServiceResult],
    failover: &Failover,
    pod: &super::PodFailover,
    control_plane: &str,
) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# topology-agent demo\n");
    let _ = writeln!(out, "Control plane: {control_plane}\n");
    let _ = writeln!(
        out,
        "{} zones in {} region(s), {} nodes per zone, {} backends per zone; {} connections per node per Service, \
         each Service measured next to its twin: the same Service with no topology policy (every endpoint equally \
         likely, kube-proxy's default), programmed by the same agents, so the comparison isolates the policy. \
         Real connections through the agents' kernel programs, one agent per simulated node.\n",
        config.zones, config.regions, config.nodes_per_zone, config.backends_per_zone, config.connections
    );
    let _ = writeln!(out, "![In-zone share per Service](in-zone.svg)\n");
    let proxy = with_kube_proxy(results);
    if proxy {
        let _ = writeln!(
            out,
            "The kube-proxy column: the same Service from a node of the first zone that runs the real kube-proxy \
             (nftables mode, its defaults) and no agent, in zone terms of that node.\n"
        );
    }
    let _ = writeln!(
        out,
        "| Service | Policy | In zone | Twin, no topology policy | {}Same node | Same zone | Other zone | Other region | Refused | `explain` said (in zone) |",
        if proxy { "kube-proxy, same Service | " } else { "" }
    );
    let _ = writeln!(
        out,
        "| --- | --- | ---: | ---: | {}---: | ---: | ---: | ---: | ---: | ---: |",
        if proxy { "---: | " } else { "" }
    );
    for comparison in comparisons(results) {
        let ours = comparison.ours;
        let [node, zone, other_zone, other_region, refused] = landing_cells(&ours.total);
        let said = if ours.expected_refusing_nodes == ours.per_node.len() {
            "refuse".into()
        } else {
            percent(ours.expected_in_zone)
        };
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {}{node} | {zone} | {other_zone} | {other_region} | {refused} | {said} |",
            ours.name,
            policy_name(ours),
            percent(ours.total.in_zone()),
            percent(comparison.baseline.total.in_zone()),
            if proxy { format!("{} | ", kube_proxy_cell(ours)) } else { String::new() }
        );
    }
    let _ = writeln!(out, "\n## Cross-zone traffic avoided\n");
    let _ = writeln!(
        out,
        "Per 1 GB of traffic to each Service, at ${DOLLARS_PER_GB_EACH_WAY:.2}/GB each way (a byte crossing zones is billed leaving one and entering the other):\n"
    );
    let _ = writeln!(
        out,
        "| Service | Cross-zone without topology policy | Cross-zone with topology-agent | Avoided per GB | Saved per GB |"
    );
    let _ = writeln!(out, "| --- | ---: | ---: | ---: | ---: |");
    for comparison in comparisons(results) {
        let (Some(ours), Some(base), Some(avoided)) =
            (comparison.ours.total.in_zone(), comparison.baseline.total.in_zone(), comparison.gb_avoided_per_gb())
        else {
            continue;
        };
        let _ = writeln!(
            out,
            "| `{}` | {:.0} MB | {:.0} MB | {:.0} MB | ${:.4} |",
            comparison.ours.name,
            (1.0 - base) * 1000.0,
            (1.0 - ours) * 1000.0,
            avoided * 1000.0,
            avoided * 2.0 * DOLLARS_PER_GB_EACH_WAY
        );
    }
    let _ = writeln!(out, "\n## Failover\n");
    let _ = writeln!(out, "{}\n", failover_sentence(failover));
    let _ = writeln!(out, "{}\n", super::pod_failover_line(pod));
    let _ = writeln!(out, "## Why (`topology-agent explain`, first node)\n");
    for result in results.iter().filter(|r| r.baseline_of.is_none()) {
        let _ = writeln!(out, "- `{}`: {}", result.name, result.reason);
    }
    out
}

/// The failover in one paragraph: what was killed, how long each part took, what failed when.
pub fn failover_sentence(f: &Failover) -> String {
    format!(
        "The {} servers of `{}` were killed (SIGKILL) while a client on `{}` connected to `{}` about every millisecond; \
         their endpoints {} {:.1} ms later (detection here is immediate; on a cluster it is the \
         readiness probe's period × failure threshold, or the pods' deletion). New connections left the zone {:.0} ms \
         after that, and came back {:.0} ms after the servers were restarted and the endpoints restored. Of {} \
         connections, {} failed before the endpoints were updated, {} while the agent reacted, {} after.",
        f.killed,
        f.zone,
        f.node,
        f.service,
        f.removal,
        f.detected_after.as_secs_f64() * 1e3,
        f.moved_after.as_secs_f64() * 1e3,
        f.back_after.as_secs_f64() * 1e3,
        f.attempts,
        f.failed_before_update,
        f.failed_while_reacting,
        f.failed_after
    )
}

fn svg(results: &[ServiceResult]) -> String {
    let rows: Vec<(String, f64, f64)> = comparisons(results)
        .iter()
        .filter_map(|c| Some((c.ours.name.clone(), c.ours.total.in_zone()?, c.baseline.total.in_zone()?)))
        .collect();
    let (left, bar_width, row) = (150.0, 480.0, 44.0);
    let height = 50.0 + row * rows.len() as f64 + 30.0;
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"720\" height=\"{height}\" font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"22\" font-size=\"15\" font-weight=\"bold\">Connections staying in the client's zone</text>\n\
         <rect x=\"{left}\" y=\"32\" width=\"12\" height=\"12\" fill=\"#2e7d32\"/><text x=\"{}\" y=\"43\">topology-agent</text>\n\
         <rect x=\"{}\" y=\"32\" width=\"12\" height=\"12\" fill=\"#9e9e9e\"/><text x=\"{}\" y=\"43\">twin, no topology policy</text>\n",
        left + 16.0,
        left + 140.0,
        left + 156.0
    );
    for (i, (name, ours, base)) in rows.iter().enumerate() {
        let y = 56.0 + row * i as f64;
        let _ = write!(
            out,
            "<text x=\"10\" y=\"{}\">{name}</text>\n\
             <rect x=\"{left}\" y=\"{y}\" width=\"{:.1}\" height=\"16\" fill=\"#2e7d32\"/><text x=\"{:.1}\" y=\"{}\">{:.1}%</text>\n\
             <rect x=\"{left}\" y=\"{}\" width=\"{:.1}\" height=\"16\" fill=\"#9e9e9e\"/><text x=\"{:.1}\" y=\"{}\">{:.1}%</text>\n",
            y + 21.0,
            ours * bar_width,
            left + ours * bar_width + 6.0,
            y + 13.0,
            ours * 100.0,
            y + 18.0,
            base * bar_width,
            left + base * bar_width + 6.0,
            y + 31.0,
            base * 100.0
        );
    }
    out.push_str("</svg>\n");
    out
}
