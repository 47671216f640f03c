//! End to end on a real cluster: kind with three workers in three zones (IPv4, and IPv6), the
//! agent deployed from `deploy/` with the image `cargo xtask image` builds, and the workloads of
//! [`topology_tests::kind`], each checked for what only the agent does — kube-proxy alone would
//! pass every one of these checks' opposites:
//! - topology keys by hostname: every client reaches the echo pod on its own node, and the
//!   kernel of each node (`topology-agent status` in its agent pod) holds that one backend;
//! - a hard zone key: a client outside the zone is refused, one inside reaches it;
//! - spillover: `topology-agent explain` in the agent pod shows the plan;
//! - an ExternalName Service resolves through the node's DNS to a CNAME;
//! - a namespace whose egress policy allows DNS to the kube-dns pods alone cannot resolve while
//!   the node's DNS is steered to the agent, and can once the policy allows the agents too (the
//!   rule `docs/operating.md` gives, which the rendering check holds to the docs' text).
//!
//! Runs where `docker` (with a running engine), `kind` and `kubectl` exist; skips with the reason
//! otherwise. kubectl calls that can fail transiently are retried. The cluster's logs are
//! exported (`kind export logs`) next to its scratch directory, then it is deleted, on failure
//! too. Run with `--test-threads=1` to create one cluster at a time. What the suite creates is
//! rendered and checked here by `the_kind_suites_cluster_and_workloads_are_valid`, which always
//! runs.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use topology_tests::{
    kind::{self, EXTERNAL_NAME, Family, ZONES},
    sandbox::{on_path, run},
};

/// Why the suite cannot run here, if it cannot.
fn unavailable() -> Option<String> {
    let missing: Vec<&str> = ["docker", "kind", "kubectl"].into_iter().filter(|tool| !on_path(tool)).collect();
    if !missing.is_empty() {
        return Some(format!("{} not found on PATH", missing.join(", ")));
    }
    let engine = Command::new("docker").arg("info").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if !engine.is_ok_and(|s| s.success()) {
        return Some("no Docker engine answers `docker info`".into());
    }
    None
}

/// The kind cluster: its logs exported, then deleted, on drop.
struct Kind {
    name: String,
    kubeconfig: PathBuf,
    dir: PathBuf,
}

impl Kind {
    fn create(dir: &Path, family: Family) -> Self {
        let name = format!("topology-e2e-{}-{}", family.kind_name(), std::process::id());
        let config_file = dir.join("kind.yaml");
        std::fs::write(&config_file, kind::cluster_config(family)).expect("kind config");
        let cluster = Self { name, kubeconfig: dir.join("kubeconfig"), dir: dir.to_path_buf() };
        let (config, kubeconfig) = (config_file.to_string_lossy(), cluster.kubeconfig.to_string_lossy());
        run(
            "kind",
            &[
                "create",
                "cluster",
                "--name",
                &cluster.name,
                "--config",
                &config,
                "--kubeconfig",
                &kubeconfig,
                "--wait",
                "180s",
            ],
        );
        cluster
    }

    /// `kubectl …`, its output; `None` (logged) when it fails.
    fn try_kubectl(&self, args: &[&str]) -> Option<String> {
        let output =
            Command::new("kubectl").arg("--kubeconfig").arg(&self.kubeconfig).args(args).output().expect("run kubectl");
        if output.status.success() {
            return Some(String::from_utf8_lossy(&output.stdout).into_owned());
        }
        eprintln!("kubectl {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
        None
    }

    /// `kubectl …`, retried a few times (an API server or a kubelet busy for a moment).
    fn kubectl(&self, args: &[&str]) -> String {
        for _ in 0..5 {
            if let Some(output) = self.try_kubectl(args) {
                return output;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        panic!("kubectl {} kept failing", args.join(" "));
    }

    fn apply(&self, manifest: &str) {
        for _ in 0..5 {
            let mut child = Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(["apply", "-f", "-"])
                .stdin(Stdio::piped())
                .spawn()
                .expect("spawn kubectl");
            child.stdin.as_mut().expect("stdin").write_all(manifest.as_bytes()).expect("write stdin");
            drop(child.stdin.take());
            if child.wait().expect("wait").success() {
                return;
            }
            std::thread::sleep(Duration::from_secs(2));
        }
        panic!("kubectl apply kept failing");
    }

    /// `jsonpath` lines `a=b` as a map.
    fn pairs(&self, args: &[&str]) -> BTreeMap<String, String> {
        let text = self.kubectl(args);
        text.lines().filter_map(|l| l.split_once('=')).map(|(a, b)| (a.to_owned(), b.to_owned())).collect()
    }
}

impl Drop for Kind {
    fn drop(&mut self) {
        let logs = self.dir.with_extension("logs");
        let _ = Command::new("kind").args(["export", "logs", &logs.to_string_lossy(), "--name", &self.name]).status();
        eprintln!("kind logs: {}", logs.display());
        let _ = Command::new("kind").args(["delete", "cluster", "--name", &self.name]).status();
    }
}

/// Waits until `check` holds, for up to a minute: the agents act within seconds of a change.
fn eventually(what: &str, check: impl Fn() -> anyhow::Result<()>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match check() {
            Ok(()) => return,
            Err(why) if Instant::now() >= deadline => panic!("{what}: {why}"),
            Err(_) => std::thread::sleep(Duration::from_secs(2)),
        }
    }
}

/// `topology-agent ARGS` in the agent pod `agent`, its JSON output.
fn agent_json(cluster: &Kind, agent: &str, args: &[&str]) -> Value {
    let mut all = vec!["-n", "topology-agent", "exec", agent, "--", "topology-agent"];
    all.extend_from_slice(args);
    let output = cluster.kubectl(&all);
    serde_json::from_str(&output).unwrap_or_else(|error| panic!("topology-agent {}: {error}: {output}", args.join(" ")))
}

fn suite(family: Family) {
    if let Some(reason) = unavailable() {
        eprintln!("SKIPPED kind e2e ({}): {reason}; it runs where docker, kind and kubectl exist", family.kind_name());
        return;
    }
    let dir = std::env::temp_dir().join(format!("topology-e2e-{}-{}", family.kind_name(), std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let cluster = Kind::create(&dir, family);

    // The agent image as `cargo xtask image` builds it, tagged as deploy/ names it.
    let archive = topology_tests::net::image_archive().expect("no image archive; run `cargo xtask image`");
    run("kind", &["load", "image-archive", &archive.to_string_lossy(), "--name", &cluster.name]);
    let deploy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    cluster.apply(&cluster.kubectl(&["kustomize", &deploy.to_string_lossy()]));
    cluster.kubectl(&["-n", "topology-agent", "rollout", "status", "daemonset/topology-agent", "--timeout=180s"]);

    cluster.apply(&kind::workloads());
    cluster.kubectl(&["rollout", "status", "daemonset/echo", "--timeout=180s"]);
    cluster.kubectl(&["rollout", "status", "deployment/echo-a", "--timeout=180s"]);

    let range = |fields: &str| format!("jsonpath={{range .items[*]}}{fields}{{\"\\n\"}}{{end}}");
    let zone_of_node = cluster.pairs(&[
        "get",
        "nodes",
        "-o",
        &range("{.metadata.name}={.metadata.labels.topology\\.kubernetes\\.io/zone}"),
    ]);
    let node_of_echo =
        cluster.pairs(&["get", "pods", "-l", "app=echo", "-o", &range("{.spec.nodeName}={.metadata.name}")]);
    let ip_of_echo =
        cluster.pairs(&["get", "pods", "-l", "app=echo", "-o", &range("{.spec.nodeName}={.status.podIP}")]);
    let agent_of_node =
        cluster.pairs(&["-n", "topology-agent", "get", "pods", "-o", &range("{.spec.nodeName}={.metadata.name}")]);
    let workers: Vec<(&String, &String)> = zone_of_node.iter().filter(|(_, z)| ZONES.contains(&z.as_str())).collect();
    assert_eq!(workers.len(), ZONES.len(), "{zone_of_node:?}");

    for (node, zone) in &workers {
        cluster.apply(&kind::client_pod(zone, node));
        cluster.kubectl(&["wait", "--for=condition=Ready", &format!("pod/client-{zone}"), "--timeout=120s"]);
    }
    let fetch = |zone: &str, service: &str| {
        let url = format!("http://{service}.default/hostname");
        cluster.try_kubectl(&["exec", &format!("client-{zone}"), "--", "wget", "-qO-", "-T", "2", &url])
    };

    for (node, zone) in &workers {
        // Topology keys by hostname: the pod on this node, every time; its kernel holds it alone.
        let own = node_of_echo.get(*node).cloned().expect("an echo pod on every worker");
        eventually(&format!("echo-host from {zone}"), || {
            let reached: Vec<Option<String>> = (0..10).map(|_| fetch(zone, "echo-host")).collect();
            match reached.iter().all(|r| r.as_deref().map(str::trim) == Some(own.as_str())) {
                true => Ok(()),
                false => Err(anyhow::anyhow!("reached {reached:?}, expected only {own}")),
            }
        });
        let agent = agent_of_node.get(*node).expect("an agent on every worker");
        let status = agent_json(&cluster, agent, &["status", "--output", "json"]);
        let backends: Vec<&str> = status["services"]
            .as_array()
            .expect("services")
            .iter()
            .filter(|s| s["service"].as_str().is_some_and(|name| name.starts_with("default/echo-host:")))
            .flat_map(|s| s["backends"].as_array().into_iter().flatten())
            .filter_map(|b| b["address"].as_str())
            .collect();
        assert_eq!(backends, [ip_of_echo[*node].as_str()], "{node}'s kernel: {status}");

        // The hard zone key: only zone-a reaches only-a; elsewhere the connection is refused.
        if *zone == "zone-a" {
            eventually("only-a from zone-a", || {
                fetch(zone, "only-a").map(|_| ()).ok_or_else(|| anyhow::anyhow!("no answer"))
            });
        } else {
            eventually(&format!("only-a refused in {zone}"), || match fetch(zone, "only-a") {
                None => Ok(()),
                Some(pod) => Err(anyhow::anyhow!("reached {pod} across zones")),
            });
        }

        // Spillover decides `spill`: the agent's own explain shows its plan.
        let explained =
            agent_json(&cluster, agent, &["explain", "--node", node, "--service", "default/spill", "--output", "json"]);
        assert!(explained["services"][0].get("spillover").is_some(), "{explained}");
    }

    // ExternalName through the node's DNS: a CNAME to its target.
    let zone = workers[0].1;
    let looked_up =
        cluster.kubectl(&["exec", &format!("client-{zone}"), "--", "nslookup", "outside.default.svc.cluster.local"]);
    assert!(looked_up.contains("canonical name") && looked_up.contains(EXTERNAL_NAME), "{looked_up}");

    // A default-deny namespace that allows DNS to the kube-dns pods alone: steered to the agent's
    // pod, its lookups are dropped; with the agents allowed too, they resolve.
    let node = workers[0].0;
    cluster.apply(&kind::locked_namespace(false));
    cluster.apply(&kind::locked_client(node));
    cluster.kubectl(&["-n", kind::LOCKED, "wait", "--for=condition=Ready", "pod/client", "--timeout=120s"]);
    let lookup = || {
        let name = "echo-host.default.svc.cluster.local";
        cluster.try_kubectl(&["-n", kind::LOCKED, "exec", "client", "--", "nslookup", "-timeout=2", name])
    };
    eventually("the trap: kube-dns alone allowed, lookups dropped", || match lookup() {
        None => Ok(()),
        Some(answer) => Err(anyhow::anyhow!("resolved despite the policy (is it enforced?): {answer}")),
    });
    cluster.apply(&kind::locked_namespace(true));
    eventually("the agents allowed: lookups resolve", || {
        lookup().map(drop).ok_or_else(|| anyhow::anyhow!("no answer"))
    });
    drop(cluster);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_agent_routes_by_topology_on_an_ipv4_kind_cluster() {
    suite(Family::V4);
}

#[test]
fn the_agent_routes_by_topology_on_an_ipv6_kind_cluster() {
    suite(Family::V6);
}

#[test]
fn the_kind_suites_cluster_and_workloads_are_valid() {
    for family in [Family::V4, Family::V6] {
        let config: Value = serde_yaml::from_str(&kind::cluster_config(family)).expect("kind config YAML");
        assert_eq!(config["networking"]["ipFamily"], family.kind_name());
        let zones: Vec<&str> = config["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .filter(|n| n["role"] == "worker")
            .filter_map(|n| n["labels"]["topology.kubernetes.io/zone"].as_str())
            .collect();
        assert_eq!(zones, ZONES);
    }
    let mut documents: Vec<String> = kind::workloads().split("---\n").map(str::to_owned).collect();
    documents.push(kind::client_pod("zone-a", "kind-worker"));
    let mut services = 0;
    for text in &documents {
        let document: Value = serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
        match document["kind"].as_str() {
            Some("DaemonSet") => round_trip::<k8s_openapi::api::apps::v1::DaemonSet>(&document),
            Some("Deployment") => round_trip::<k8s_openapi::api::apps::v1::Deployment>(&document),
            Some("Pod") => round_trip::<k8s_openapi::api::core::v1::Pod>(&document),
            Some("Service") => {
                round_trip::<k8s_openapi::api::core::v1::Service>(&document);
                // The agent reads every Service the suite relies on as the suite means it.
                let service = topology_model::convert::service_from_value(&document).expect("the agent reads it");
                let keys = service.topology_keys.as_ref().map(|spec| spec.keys.clone()).unwrap_or_default();
                match document["metadata"]["name"].as_str().expect("name") {
                    "echo-host" => assert_eq!(keys, ["kubernetes.io/hostname"]),
                    "only-a" => assert_eq!(keys, ["topology.kubernetes.io/zone"]),
                    "spill" => assert_eq!(service.agent_annotations["topology-agent.io/spillover"], "capacity"),
                    "outside" => assert_eq!(service.external_name.as_deref(), Some(EXTERNAL_NAME)),
                    other => panic!("unexpected Service {other}"),
                }
                services += 1;
            }
            other => panic!("unexpected kind {other:?}"),
        }
    }
    assert_eq!(services, 4);
    // The NetworkPolicy the suite applies, and the docs' rule is the one it tests.
    for allow_agent in [false, true] {
        for text in kind::locked_namespace(allow_agent).split("---\n") {
            let document: Value = serde_yaml::from_str(text).unwrap_or_else(|e| panic!("{e}:\n{text}"));
            match document["kind"].as_str() {
                Some("Namespace") => round_trip::<k8s_openapi::api::core::v1::Namespace>(&document),
                Some("NetworkPolicy") => round_trip::<k8s_openapi::api::networking::v1::NetworkPolicy>(&document),
                other => panic!("unexpected kind {other:?}"),
            }
        }
    }
    let docs = std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/operating.md"))
        .expect("docs/operating.md");
    assert!(docs.contains(&kind::dns_egress(true)), "docs/operating.md gives another rule than the suite tests");
}

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(document: &Value) {
    let typed: T = serde_path_to_error::deserialize(document)
        .unwrap_or_else(|e| panic!("{}: {}: {document}", e.path(), e.inner()));
    let back = serde_json::to_value(&typed).expect("serialize");
    assert_eq!(&back, document, "a field was dropped (misspelt or misplaced) on the way through the type");
}
