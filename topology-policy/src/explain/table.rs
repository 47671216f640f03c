//! The human-readable form of an explain report.

use std::fmt::Write as _;

use super::{Answer, ExplainReport, Family, HeadlessEntry};
use crate::policy::{feedback::FeedbackReport, spillover::SpilloverReport};

impl ExplainReport {
    /// Human-readable table.
    pub fn table(&self) -> String {
        let mut out = format!("node {}\n", self.node);
        for service in &self.services {
            let family = if service.cluster_ips.iter().any(|ip| ip.contains(':')) { Family::V6 } else { Family::V4 };
            let name = if service.port_name.is_empty() {
                service.service.clone()
            } else {
                format!("{}:{}", service.service, service.port_name)
            };
            let _ = writeln!(
                out,
                "\n{name}  {}/{} {}  {:?}{}",
                service.port,
                service.protocol,
                service.cluster_ips.join(","),
                service.policy,
                if family == Family::V6 { "  (IPv6)" } else { "" }
            );
            let _ = writeln!(out, "  why: {}", service.reason);
            for warning in &service.warnings {
                let _ = writeln!(out, "  warning: {warning}");
            }
            if service.reject {
                let _ = writeln!(out, "  REFUSED: connections fail with ECONNREFUSED");
            }
            for conflict in &service.conflicts {
                let ip = &conflict.cluster_ip;
                let ip = if ip.contains(':') { format!("[{ip}]") } else { ip.clone() };
                let _ = writeln!(
                    out,
                    "  conflict: {ip}:{}/{} is programmed for Service {}; skipped here",
                    service.port, service.protocol, conflict.held_by
                );
            }
            if let Some(timeout) = service.options.affinity_timeout_s {
                let _ = writeln!(
                    out,
                    "  session affinity: ClientIP, {timeout} s: each client (network namespace) keeps the backend it \
                     got among these while it stays in the set"
                );
            }
            if let Some(plan) = &service.spillover {
                spillover_table(&mut out, plan);
            }
            if let Some(feedback) = &service.feedback {
                feedback_lines(&mut out, feedback);
            }
            for backend in &service.backends {
                let _ = writeln!(
                    out,
                    "  {:<28} {:<7} node {:<16} zone {:<12} weight {:<8} share {:.2}%",
                    format!("{}:{}", backend.address, backend.port),
                    backend.locality.as_str(),
                    backend.node.as_deref().unwrap_or("-"),
                    backend.zone.as_deref().unwrap_or("-"),
                    weight(backend.weight),
                    backend.share * 100.0
                );
                if let Some(ejected) = &backend.ejected {
                    let _ = writeln!(
                        out,
                        "    ejected on this node for {:.0} s more (ejection {}): its handshakes from here failed in a \
                         row; the share goes to the others",
                        ejected.for_seconds, ejected.ejection
                    );
                }
            }
        }
        headless_table(&mut out, &self.headless);
        for left in &self.left_to_kube_proxy {
            let _ = writeln!(out, "\n{}  left to kube-proxy: {}", left.service, left.reason);
        }
        out
    }
}

/// What the DNS responder answers for each headless Service, and why.
fn headless_table(out: &mut String, entries: &[HeadlessEntry]) {
    for entry in entries {
        let policy = entry.policy.map_or_else(|| "-".to_owned(), |p| format!("{p:?}"));
        let _ = writeln!(out, "\n{}  headless: DNS {}.<cluster domain>  {policy}", entry.service, entry.name);
        for reason in &entry.reasons {
            let _ = writeln!(out, "  why: {reason}");
        }
        let answer = match entry.answer {
            Answer::Nxdomain => {
                "NXDOMAIN (no endpoint for this node, as CoreDNS answers a headless Service without one)"
            }
            Answer::OneByWeight => "one address per answer, drawn by weight (answers across queries follow the plan)",
            Answer::All => "every address below",
        };
        let _ = writeln!(out, "  answer: {answer}");
        for address in &entry.addresses {
            let _ = writeln!(
                out,
                "  {:<28} {:<7} name {:<24} weight {}",
                address.address,
                address.locality.as_str(),
                address.label,
                weight(address.weight)
            );
        }
    }
}

/// What feedback measured: the latencies against the unloaded one, what is in flight, the share
/// moved, the backends ejected.
fn feedback_lines(out: &mut String, report: &FeedbackReport) {
    let Some(input) = &report.input else {
        let _ = writeln!(out, "  feedback: no measurement yet (explain from a file, or the agent just started)");
        return;
    };
    let m = &input.measured;
    let ms = |us: Option<f64>| us.map_or("-".to_owned(), |us| format!("{:.1} ms", us / 1000.0));
    let ratio = |r: Option<f64>| r.map_or("-".to_owned(), |r| format!("{r:.1}×"));
    let _ = writeln!(
        out,
        "  feedback: {:.0}% moved out; this zone {} ({}), other zones {} ({}), unloaded {}; in flight {} here, {} \
         elsewhere",
        input.shift * 100.0,
        ms(m.near_us),
        ratio(m.near_ratio()),
        ms(m.far_us),
        ratio(m.far_ratio()),
        ms(m.baseline_us),
        m.near_in_flight,
        m.far_in_flight
    );
    if !input.ejected.is_empty() {
        let list: Vec<String> = input.ejected.iter().map(ToString::to_string).collect();
        let _ = writeln!(out, "  ejected for failing: {}", list.join(", "));
    }
}

/// The plan behind a spillover decision: every zone's demand, endpoints and resulting load.
fn spillover_table(out: &mut String, plan: &SpilloverReport) {
    let _ = writeln!(
        out,
        "  plan: {} of all traffic stays in zone (bound {}); no endpoint above {:.2}x its fair share",
        pct(plan.in_zone),
        pct(plan.bound),
        1.0 + plan.max_overload
    );
    let _ = writeln!(out, "    {:<16} {:<14} {:>7} {:>9} {:>6}", "zone", "region", "demand", "endpoints", "load");
    for zone in &plan.zones {
        let _ = writeln!(
            out,
            "    {:<16} {:<14} {:>7} {:>9} {:>6}",
            if zone.zone.is_empty() { "(no zone)" } else { &zone.zone },
            zone.region.as_deref().unwrap_or("-"),
            pct(zone.demand_share),
            zone.endpoints,
            zone.load_factor.map_or_else(|| "-".into(), |f| format!("{f:.2}x"))
        );
    }
}

/// `1` for equal weights, `0.2556` for fractions.
fn weight(value: f64) -> String {
    if value.fract() == 0.0 { format!("{value:.0}") } else { format!("{value:.4}") }
}

fn pct(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}
