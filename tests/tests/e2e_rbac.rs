//! The deploy's RBAC, proven by the real API server (root, real kernel): with `deploy/`'s
//! ClusterRole the agent runs, programs and publishes its Events (created, and patched when one
//! repeats); with any one of its verbs taken away, something the agent does breaks and says so,
//! naming the verb and the resource — there is no rule without a use. The cases are read from
//! `deploy/clusterrole.yaml`, so a rule added there without a use here fails this test.
//! `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{path::PathBuf, time::Duration};

use serde_json::{Value, json};
use topology_tests::{
    kubernetes::{Binaries, Cluster, agents::AgentPod, eventually, nodes::NodeSpec, pods::PodSpec},
    require_root,
};

const NS: &str = "rbac";

/// deploy/'s ClusterRole, as JSON.
fn role() -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/clusterrole.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/clusterrole.yaml");
    serde_yaml::from_str(&text).expect("the ClusterRole")
}

/// Every (resource, verb) the role grants.
fn grants(role: &Value) -> Vec<(String, String)> {
    let mut grants = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        for resource in rule["resources"].as_array().expect("resources") {
            for verb in rule["verbs"].as_array().expect("verbs") {
                grants.push((
                    resource.as_str().expect("a resource").to_owned(),
                    verb.as_str().expect("a verb").to_owned(),
                ));
            }
        }
    }
    grants
}

/// The role without `verb` on `resource`.
fn without(role: &Value, resource: &str, verb: &str) -> Value {
    let mut role = role.clone();
    let mut rules = Vec::new();
    for rule in role["rules"].as_array().expect("rules") {
        for other in rule["resources"].as_array().expect("resources") {
            let mut split = rule.clone();
            split["resources"] = json!([other]);
            if other == resource {
                split["verbs"] =
                    json!(rule["verbs"].as_array().expect("verbs").iter().filter(|v| *v != verb).collect::<Vec<_>>());
            }
            if !split["verbs"].as_array().expect("verbs").is_empty() {
                rules.push(split);
            }
        }
    }
    role["rules"] = json!(rules);
    role
}

/// The Service the agent's problems are about: `spillover: bogus` is ignored, and said so.
fn service(annotation: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": NS, "annotations": {"topology-agent.io/spillover": annotation}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]},
    })
}

/// Makes the agent publish its problem about `web` twice: once, then resolved, then again (the
/// same Event, which the recorder patches as a series).
fn problem_twice(cluster: &Cluster) {
    for annotation in ["bogus", "off", "bogus"] {
        cluster.apply(&service(annotation));
        std::thread::sleep(Duration::from_secs(2));
    }
}

fn log_of(agent: &AgentPod) -> String {
    std::fs::read_to_string(&agent.log).unwrap_or_default()
}

#[test]
fn every_rule_of_the_deploy_has_a_use_that_breaks_without_it() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let cluster = Cluster::start(binaries, &[NodeSpec::new("node-a1", "zone-a")]);
    cluster.deploy();
    cluster.namespace(NS);
    cluster.apply(&service("off"));
    let _pod = cluster.run_pod("node-a1", PodSpec::new(NS, "web-a1", "web", &[8080]));
    let full = role();

    // The whole role: ready, and the Event created, then patched when it repeats.
    let agent = cluster.start_agent("node-a1", &[]);
    problem_twice(&cluster);
    eventually("the repeated Event as a series", Duration::from_secs(30), || {
        let text = cluster.kubectl(&["-n", NS, "get", "events.events.k8s.io", "-o", "json"])?;
        let events: Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let series = events["items"].as_array().into_iter().flatten().find(|event| {
            event["reason"] == "IgnoredConfiguration" && event["series"]["count"].as_u64().is_some_and(|n| n >= 2)
        });
        series.map(drop).ok_or(text)
    });
    assert!(!log_of(&agent).contains("could not publish"), "{}", log_of(&agent));
    cluster.remove_agent(agent);

    let mut table = Vec::new();
    for (resource, verb) in grants(&full) {
        cluster.apply(&without(&full, &resource, &verb));
        let refused = format!("cannot {verb} resource \\\"{resource}\\\"");
        let started = std::time::Instant::now();
        let mut agent = cluster.launch_agent("node-a1", &[]);
        let said = if resource == "events" {
            // Reading works: the agent is ready; publishing its Events is what breaks.
            eventually(&format!("ready without {verb} {resource}"), Duration::from_secs(60), || {
                match agent.probe("/readyz") {
                    Ok((200, _)) => Ok(()),
                    other => Err(format!("{other:?}")),
                }
            });
            cluster.apply(&service("off"));
            std::thread::sleep(Duration::from_secs(2));
            problem_twice(&cluster);
            eventually(&format!("the agent naming {verb} {resource}"), Duration::from_secs(30), || {
                let log = log_of(&agent);
                log.lines()
                    .find(|line| line.contains("could not publish") && line.contains(&refused))
                    .map(str::to_owned)
                    .ok_or(log)
            })
        } else {
            // A kind it cannot read: never ready, and /readyz says which and why.
            eventually(&format!("/readyz naming {verb} {resource}"), Duration::from_secs(60), || {
                match agent.probe("/readyz") {
                    Ok((status, body)) if status != 200 && body.contains(&refused.replace('\\', "")) => Ok(body),
                    other => Err(format!("{other:?}")),
                }
            })
        };
        assert!(agent.running(), "the agent exited without {verb} {resource}");
        let seen = started.elapsed();
        cluster.remove_agent(agent);
        table.push(format!(
            "without {verb:<6} {resource:<15} {:>5.1} s, removed {:>5.1} s: {}",
            seen.as_secs_f64(),
            started.elapsed().as_secs_f64(),
            said.lines().next().unwrap_or_default()
        ));
    }
    cluster.apply(&full);
    eprintln!("{}", table.join("\n"));
}
