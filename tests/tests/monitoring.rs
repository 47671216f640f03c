//! `deploy/monitoring/`: the alert rules pass promtool's checks and their own unit tests, every
//! dashboard query parses as PromQL, and every metric and label either names is one a running
//! agent exports (root: a real agent on a real kernel, scraped).
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    collections::{BTreeMap, BTreeSet},
    net::SocketAddr,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use serde_json::Value;
use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    require_root,
    sandbox::on_path,
};

/// Labels Prometheus adds when it scrapes, and the histogram bucket bound.
const SCRAPE_LABELS: [&str; 3] = ["instance", "job", "le"];

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// Every PromQL expression: the dashboard's targets and the alert rules, each with where it is.
fn expressions() -> Vec<(String, String)> {
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(monitoring().join("dashboard.json")).expect("dashboard.json"))
            .expect("dashboard JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().expect("target expr");
            out.push((
                format!("dashboard panel {:?}", panel["title"].as_str().unwrap_or_default()),
                // Grafana's variables, as it fills them in.
                expr.replace("$__rate_interval", "5m").replace("$price", "0.01"),
            ));
        }
    }
    let rules: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(monitoring().join("alerts.yaml")).expect("alerts.yaml"))
            .expect("alerts YAML");
    for group in rules["groups"].as_sequence().expect("groups") {
        for rule in group["rules"].as_sequence().expect("rules") {
            let expr = rule["expr"].as_str().expect("rule expr");
            out.push((format!("alert {}", rule["alert"].as_str().expect("alert name")), expr.to_owned()));
        }
    }
    assert!(out.len() > 10, "found only {} expressions", out.len());
    out
}

fn promtool(args: &[&str]) {
    let output = Command::new("promtool").args(args).current_dir(monitoring()).output().expect("promtool");
    assert!(
        output.status.success(),
        "promtool {} failed:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn alert_rules_pass_promtool_and_their_tests_and_dashboard_queries_parse() {
    if !on_path("promtool") {
        eprintln!("SKIPPED monitoring: promtool not installed (`cargo xtask setup` installs Debian's prometheus)");
        return;
    }
    promtool(&["check", "rules", "alerts.yaml"]);
    promtool(&["test", "rules", "alerts.test.yaml"]);
    // The dashboard's queries as recording rules: promtool parses each one.
    let dir = tempfile::tempdir().expect("scratch");
    let rules: Vec<serde_json::Value> = expressions()
        .into_iter()
        .enumerate()
        .map(|(i, (_, expr))| serde_json::json!({"record": format!("dashboard:query_{i}"), "expr": expr}))
        .collect();
    let file = dir.path().join("dashboard-queries.yaml");
    let doc = serde_json::json!({"groups": [{"name": "dashboard", "rules": rules}]});
    std::fs::write(&file, serde_yaml::to_string(&doc).expect("YAML")).expect("write");
    promtool(&["check", "rules", &file.to_string_lossy()]);
}

/// Metric names and, per name, the label names of its samples, from an exposition.
fn exported(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let name_end = line.find(['{', ' ']).expect("sample line");
        let labels = out.entry(line[..name_end].to_owned()).or_default();
        let Some(mut rest) = line[name_end..].strip_prefix('{') else { continue };
        while let Some(eq) = rest.find("=\"") {
            labels.insert(rest[..eq].trim_start_matches(',').to_owned());
            // Skip the quoted value, escapes included.
            let value = &rest[eq + 2..];
            let mut end = 0;
            let mut chars = value.char_indices();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => {
                        end = i;
                        break;
                    }
                    _ => {}
                }
            }
            rest = &value[end + 1..];
            if rest.starts_with('}') {
                break;
            }
        }
    }
    out
}

/// The metrics an expression names, each with the labels its selector matches on.
fn referenced(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("topology_agent_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        let (name, after) = tail.split_at(end);
        let labels = after
            .strip_prefix('{')
            .and_then(|s| s.split_once('}'))
            .map(|(selector, _)| {
                selector.split(',').filter_map(|m| m.split(['=', '!']).next()).map(|l| l.trim().to_owned()).collect()
            })
            .unwrap_or_default();
        out.push((name.to_owned(), labels));
        rest = &tail[end..];
    }
    out
}

/// Label names in `by (…)`, `without (…)`, `on (…)` and `group_left (…)` clauses.
fn grouping_labels(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for keyword in ["by", "without", "on", "group_left", "group_right", "ignoring"] {
        let mut rest = expr;
        while let Some(at) = rest.find(keyword) {
            let before_ok = at == 0 || !rest.as_bytes()[at - 1].is_ascii_alphanumeric();
            let after = rest[at + keyword.len()..].trim_start();
            if before_ok && let Some(list) = after.strip_prefix('(').and_then(|s| s.split_once(')')) {
                out.extend(list.0.split(',').map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()));
            }
            rest = &rest[at + keyword.len()..];
        }
    }
    out
}

#[test]
fn every_metric_and_label_the_dashboard_and_alerts_use_is_exported() {
    require_root!();
    let fx = Fixture::new(2);
    let file = fx.scratch().join("cluster.yaml");
    let vip = "10.96.0.10".parse().expect("VIP");
    let specs: Vec<EndpointSpec> = [("node-a", 0), ("node-b", 1)]
        .iter()
        .map(|(node, b)| EndpointSpec::new(fx.backends[*b].host.v4.into(), node))
        .collect();
    let mut web = objects::service("default", "web", vip, 80, "TCP", "http");
    web["spec"]["trafficDistribution"] = "PreferClose".into();
    objects::write(
        &file,
        &[
            objects::node("node-a", "zone-a", Some("region-1"), "4"),
            objects::node("node-b", "zone-b", Some("region-1"), "4"),
            web,
            objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &specs),
        ],
    );
    let mut agent = Agent::start(&AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()));
    agent.wait_ready(Duration::from_secs(20));
    // A port's series appear once this node's clients use it: connect a few times first.
    let (code, text) = agent.get("/metrics").expect("GET /metrics");
    assert_eq!(code, 200);
    assert!(!text.contains("topology_agent_kernel_rewrites_total{"), "no series for an unused port:\n{text}");
    assert_eq!(fx.place().tcp(SocketAddr::new(vip, 80), 4).failures(), 0);
    // The kernel counters and the baseline are read at each scrape; the gauges once programmed;
    // the bytes of those connections at the next reading of the byte counts (every 10 s).
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    let (code, text) = loop {
        let (code, text) = agent.get("/metrics").expect("GET /metrics");
        if text.contains("topology_agent_cross_zone_bytes_total{") || std::time::Instant::now() > deadline {
            break (code, text);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(code, 200);
    let exported = exported(&text);
    assert_eq!(
        exported.get("topology_agent_default_policy_in_zone_ratio").map(BTreeSet::len),
        Some(4),
        "the baseline of web (1 of 2 endpoints in zone-a) is exported:\n{text}"
    );
    assert!(text.contains("topology_agent_default_policy_in_zone_ratio{service=\"default/web:http\""), "{text}");
    assert!(text.contains("topology_agent_view_current 1"), "{text}");
    assert!(agent.kernel_feature("index"), "the agent says its programs probe the service index");
    assert!(text.contains("topology_agent_node_info{node=\"node-a\",zone=\"zone-a\",region=\"region-1\"} 1"), "{text}");

    let mut problems = Vec::new();
    for (place, expr) in expressions() {
        let metrics = referenced(&expr);
        assert!(!metrics.is_empty(), "{place} uses no topology_agent metric: {expr}");
        let mut available: BTreeSet<&str> = SCRAPE_LABELS.into();
        for (name, labels) in &metrics {
            let Some(has) = exported.get(name) else {
                problems.push(format!("{place}: {name} is not exported"));
                continue;
            };
            available.extend(has.iter().map(String::as_str));
            for label in labels.iter().filter(|l| !has.contains(*l) && !SCRAPE_LABELS.contains(&l.as_str())) {
                problems.push(format!("{place}: {name} has no label {label}"));
            }
        }
        for label in grouping_labels(&expr) {
            if !available.contains(label.as_str()) {
                problems.push(format!("{place}: groups by {label}, which none of its metrics has"));
            }
        }
    }
    assert!(problems.is_empty(), "{}\n\nexported:\n{text}", problems.join("\n"));
}

#[test]
fn the_reference_parser_finds_names_and_labels() {
    let refs =
        referenced(r#"sum by (service) (rate(topology_agent_kernel_rewrites_total{locality=~"node|zone"}[5m]))"#);
    assert_eq!(refs, vec![("topology_agent_kernel_rewrites_total".into(), vec!["locality".into()])]);
    let grouped = grouping_labels("sum by (zone) (x * on (instance) group_left (zone) y) / max by(map) (z)");
    assert_eq!(grouped, ["instance", "map", "zone"].map(String::from).into());
    let text = "a_total{service=\"x,\\\"y\",port=\"80\"} 1\nb 2\n";
    let names = exported(text);
    assert_eq!(names["a_total"], ["port", "service"].map(String::from).into());
    assert!(names["b"].is_empty());
}
