//! `topology-agent explain --kubeconfig`: the cluster listed from the API (the in-process fake API
//! server) gives the same report as the same objects in a file; a refused list is an error naming
//! the kind and the reason. No root needed.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::process::Command;

use serde_json::Value;
use topology_kube::{
    fake_api::FakeApi,
    objects::{self, EndpointSpec},
};
use topology_tests::net::agent_binary;

/// Three zones, a PreferClose Service, a spillover Service and one with an invalid port.
fn objects() -> Vec<Value> {
    let mut objects: Vec<Value> = [("node-a", "zone-a"), ("node-b", "zone-b"), ("node-c", "zone-c")]
        .iter()
        .map(|(name, zone)| objects::node(name, zone, Some("region-1"), "4"))
        .collect();
    let mut web = objects::service("default", "web", "10.96.0.10".parse().unwrap(), 80, "TCP", "http");
    web["spec"]["trafficDistribution"] = "PreferClose".into();
    let mut api = objects::service("shop", "api", "10.96.0.11".parse().unwrap(), 443, "TCP", "https");
    objects::annotate(&mut api, "topology-agent.io/spillover", "capacity");
    objects.extend([web, api]);
    let endpoints = |base: u8| -> Vec<EndpointSpec> {
        ["node-a", "node-b", "node-c", "node-c"]
            .iter()
            .enumerate()
            .map(|(i, node)| EndpointSpec::new(format!("10.244.{base}.{}", i + 1).parse().unwrap(), node))
            .collect()
    };
    objects.push(objects::slice("default", "web-1", "web", "http", 8080, "TCP", &endpoints(1)));
    objects.push(objects::slice("shop", "api-1", "api", "https", 8443, "TCP", &endpoints(2)));
    objects
}

fn explain(args: &[&str]) -> std::process::Output {
    Command::new(agent_binary()).arg("explain").args(args).output().expect("run topology-agent explain")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_and_a_file_of_the_same_objects_explain_the_same() {
    let api = FakeApi::start().await;
    let dir = tempfile::tempdir().expect("scratch");
    let (config, file) = (dir.path().join("kubeconfig"), dir.path().join("cluster.yaml"));
    api.write_kubeconfig(&config);
    let objects = objects();
    for object in &objects {
        api.apply(object.clone());
    }
    objects::write(&file, &objects);
    let (config, file) = (config.to_string_lossy().into_owned(), file.to_string_lossy().into_owned());
    let reports = tokio::task::spawn_blocking(move || {
        let mut reports = Vec::new();
        for node in ["node-a", "node-c"] {
            for output in ["json", "table"] {
                let live = explain(&["--kubeconfig", &config, "--node", node, "--output", output]);
                let from_file = explain(&["--cluster", &file, "--node", node, "--output", output]);
                reports.push((node, output, live, from_file));
            }
        }
        let one = explain(&["--kubeconfig", &config, "--node", "node-a", "--service", "shop/api", "--output", "json"]);
        (reports, one)
    })
    .await
    .expect("explain runs");
    for (node, output, live, from_file) in reports.0 {
        assert!(live.status.success(), "{node} {output}: {}", String::from_utf8_lossy(&live.stderr));
        assert!(from_file.status.success(), "{node} {output}: {}", String::from_utf8_lossy(&from_file.stderr));
        assert_eq!(
            String::from_utf8_lossy(&live.stdout),
            String::from_utf8_lossy(&from_file.stdout),
            "{node} {output}: the API and the file disagree"
        );
    }
    let one: Value = serde_json::from_slice(&reports.1.stdout).expect("explain JSON");
    let services = one["services"].as_array().expect("services");
    assert_eq!(services.len(), 1, "{one}");
    assert_eq!(services[0]["service"], "shop/api");
    assert_eq!(services[0]["policy"], "Spillover", "{one}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_list_is_an_error_naming_the_reason() {
    let api = FakeApi::start().await;
    let dir = tempfile::tempdir().expect("scratch");
    let config = dir.path().join("kubeconfig");
    api.write_kubeconfig(&config);
    api.fail_with(Some(403));
    let config = config.to_string_lossy().into_owned();
    let refused = tokio::task::spawn_blocking(move || explain(&["--kubeconfig", &config, "--node", "node-a"]))
        .await
        .expect("explain runs");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("forbidden (HTTP 403)") && stderr.contains("needs list and watch"), "{stderr}");
}
