//! End to end on a real cluster: kind with three workers in three zones, the agent deployed from
//! `deploy/` with the image `cargo xtask image` builds, an echo Deployment spread over the zones behind a
//! `PreferClose` Service, and a client pod per worker that must only reach its own zone.
//!
//! Runs where `docker` (with a running engine), `kind` and `kubectl` exist; skips with the reason
//! otherwise. The cluster is deleted at the end, on failure too.

use std::{
    collections::BTreeMap,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use topology_tests::sandbox::{on_path, run};

const ECHO_IMAGE: &str = "registry.k8s.io/e2e-test-images/agnhost:2.52";
const CLIENT_IMAGE: &str = "docker.io/library/busybox:1.36";
const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

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

fn run_stdin(program: &str, args: &[&str], stdin: &str) {
    let mut child = Command::new(program).args(args).stdin(Stdio::piped()).spawn().expect("spawn");
    child.stdin.as_mut().expect("stdin").write_all(stdin.as_bytes()).expect("write stdin");
    drop(child.stdin.take());
    assert!(child.wait().expect("wait").success(), "{program} {} failed", args.join(" "));
}

/// The kind cluster, deleted on drop.
struct Kind {
    name: String,
    kubeconfig: PathBuf,
}

impl Kind {
    fn create(dir: &Path) -> Self {
        let name = format!("topology-e2e-{}", std::process::id());
        let kubeconfig = dir.join("kubeconfig");
        let mut config =
            String::from("kind: Cluster\napiVersion: kind.x-k8s.io/v1alpha4\nnodes:\n- role: control-plane\n");
        for zone in ZONES {
            config.push_str(&format!("- role: worker\n  labels:\n    topology.kubernetes.io/zone: {zone}\n"));
        }
        let config_file = dir.join("kind.yaml");
        std::fs::write(&config_file, config).expect("kind config");
        let cluster = Self { name, kubeconfig };
        run(
            "kind",
            &[
                "create",
                "cluster",
                "--name",
                &cluster.name,
                "--config",
                &config_file.to_string_lossy(),
                "--kubeconfig",
                &cluster.kubeconfig.to_string_lossy(),
                "--wait",
                "180s",
            ],
        );
        cluster
    }

    fn kubectl(&self, args: &[&str]) -> String {
        let mut all = vec!["--kubeconfig", self.kubeconfig.to_str().expect("path")];
        all.extend_from_slice(args);
        run("kubectl", &all)
    }

    fn apply(&self, manifest: &str) {
        run_stdin("kubectl", &["--kubeconfig", self.kubeconfig.to_str().expect("path"), "apply", "-f", "-"], manifest);
    }
}

impl Drop for Kind {
    fn drop(&mut self) {
        let _ = Command::new("kind").args(["delete", "cluster", "--name", &self.name]).status();
    }
}

#[test]
fn connections_stay_in_zone_on_a_kind_cluster() {
    if let Some(reason) = unavailable() {
        eprintln!("SKIPPED kind e2e: {reason}; it runs where docker, kind and kubectl exist");
        return;
    }
    let dir = std::env::temp_dir().join(format!("topology-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let cluster = Kind::create(&dir);

    // The agent image as `cargo xtask image` builds it, tagged as deploy/ names it.
    let archive = topology_tests::net::image_archive().expect("no image archive; run `cargo xtask image`");
    run("kind", &["load", "image-archive", &archive.to_string_lossy(), "--name", &cluster.name]);
    let deploy = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy");
    let manifests = cluster.kubectl(&["kustomize", &deploy.to_string_lossy()]);
    cluster.apply(&manifests);
    cluster.kubectl(&["-n", "topology-agent", "rollout", "status", "daemonset/topology-agent", "--timeout=180s"]);

    // Echo servers, one per zone, behind a PreferClose Service.
    cluster.apply(&format!(
        r#"
apiVersion: apps/v1
kind: Deployment
metadata: {{name: echo, namespace: default}}
spec:
  replicas: 3
  selector: {{matchLabels: {{app: echo}}}}
  template:
    metadata: {{labels: {{app: echo}}}}
    spec:
      topologySpreadConstraints:
      - {{maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {{matchLabels: {{app: echo}}}}}}
      containers:
      - {{name: echo, image: {ECHO_IMAGE}, args: [netexec, --http-port=8080]}}
---
apiVersion: v1
kind: Service
metadata: {{name: echo, namespace: default}}
spec:
  selector: {{app: echo}}
  trafficDistribution: PreferClose
  ports: [{{name: http, port: 80, targetPort: 8080}}]
"#
    ));
    cluster.kubectl(&["rollout", "status", "deployment/echo", "--timeout=180s"]);

    // Which zone each echo pod is in.
    let nodes = cluster.kubectl(&[
        "get",
        "nodes",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.metadata.labels.topology\\.kubernetes\\.io/zone}{\"\\n\"}{end}",
    ]);
    let zone_of_node: BTreeMap<String, String> =
        nodes.lines().filter_map(|l| l.split_once('=')).map(|(n, z)| (n.to_owned(), z.to_owned())).collect();
    let pods = cluster.kubectl(&[
        "get",
        "pods",
        "-l",
        "app=echo",
        "-o",
        "jsonpath={range .items[*]}{.metadata.name}={.spec.nodeName}{\"\\n\"}{end}",
    ]);
    let zone_of_pod: BTreeMap<String, String> = pods
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(pod, node)| (pod.to_owned(), zone_of_node.get(node).cloned().unwrap_or_default()))
        .collect();

    for (node, zone) in zone_of_node.iter().filter(|(_, z)| ZONES.contains(&z.as_str())) {
        let client = format!("client-{zone}");
        cluster.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {client}, namespace: default}}\nspec:\n  nodeName: {node}\n  containers:\n  - {{name: c, image: {CLIENT_IMAGE}, command: [sleep, \"3600\"]}}\n"
        ));
        cluster.kubectl(&["wait", "--for=condition=Ready", &format!("pod/{client}"), "--timeout=120s"]);
        // The agent picks up the endpoints within a few seconds of the Service being ready.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let mut zones = Vec::new();
            for _ in 0..20 {
                let pod = cluster.kubectl(&[
                    "exec",
                    &client,
                    "--",
                    "wget",
                    "-qO-",
                    "-T",
                    "2",
                    "http://echo.default/hostname",
                ]);
                zones.push(zone_of_pod.get(pod.trim()).cloned().unwrap_or_default());
            }
            if zones.iter().all(|z| z == zone) {
                break;
            }
            assert!(Instant::now() < deadline, "client in {zone} reached {zones:?}");
            std::thread::sleep(Duration::from_secs(2));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
