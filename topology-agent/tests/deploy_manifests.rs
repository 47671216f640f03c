//! Every manifest under deploy/ parses into its k8s-openapi type and serializes back to exactly
//! what was written (a misspelt field would be dropped on the way), and the DaemonSet's arguments
//! are ones the agent accepts.

use std::{collections::BTreeSet, path::PathBuf, process::Command};

use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Namespace, ResourceQuota, ServiceAccount},
    rbac::v1::{ClusterRole, ClusterRoleBinding},
};
use serde::{Deserialize as _, Serialize, de::DeserializeOwned};
use serde_json::{Value, json};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// Every YAML document of every manifest, with its file name.
fn manifests() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(deploy_dir())
        .expect("deploy/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml") && !path.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let yaml: serde_yaml::Value =
                serde::Deserialize::deserialize(document).unwrap_or_else(|e| panic!("{name}: {e}"));
            out.push((name.clone(), serde_json::to_value(yaml).expect("YAML as JSON")));
        }
    }
    out
}

fn round_trip<T: DeserializeOwned + Serialize>(file: &str, document: &Value) {
    let typed: T =
        serde_path_to_error::deserialize(document).unwrap_or_else(|e| panic!("{file}: {}: {}", e.path(), e.inner()));
    let back = serde_json::to_value(&typed).expect("serialize");
    assert_eq!(&back, document, "{file}: a field was dropped (misspelt or misplaced) on the way through the type");
}

#[test]
fn every_manifest_is_a_valid_kubernetes_object() {
    let documents = manifests();
    assert!(documents.len() >= 5);
    for (file, document) in &documents {
        match document["kind"].as_str() {
            Some("Namespace") => round_trip::<Namespace>(file, document),
            Some("ServiceAccount") => round_trip::<ServiceAccount>(file, document),
            Some("ClusterRole") => round_trip::<ClusterRole>(file, document),
            Some("ClusterRoleBinding") => round_trip::<ClusterRoleBinding>(file, document),
            Some("DaemonSet") => round_trip::<DaemonSet>(file, document),
            Some("ResourceQuota") => round_trip::<ResourceQuota>(file, document),
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let text = std::fs::read_to_string(deploy_dir().join("kustomization.yaml")).expect("kustomization.yaml");
    let kustomization: Value = serde_json::to_value(serde_yaml::from_str::<serde_yaml::Value>(&text).unwrap()).unwrap();
    let listed: BTreeSet<String> =
        kustomization["resources"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_owned()).collect();
    let files: BTreeSet<String> = manifests().into_iter().map(|(file, _)| file).collect();
    assert_eq!(listed, files);
}

fn daemonset() -> DaemonSet {
    let (_, document) = manifests().into_iter().find(|(_, d)| d["kind"] == "DaemonSet").expect("a DaemonSet");
    serde_json::from_value(document).unwrap()
}

#[test]
fn the_daemonset_has_what_the_agent_needs_and_no_more() {
    let daemonset = daemonset();
    let pod = daemonset.spec.unwrap().template.spec.unwrap();
    let container = &pod.containers[0];
    let env = container.env.as_ref().unwrap().iter().find(|e| e.name == "NODE_NAME").expect("NODE_NAME");
    let field = env.value_from.as_ref().unwrap().field_ref.as_ref().unwrap();
    assert_eq!(field.field_path, "spec.nodeName", "NODE_NAME comes from the Downward API");
    let security = container.security_context.as_ref().unwrap();
    assert_eq!(security.privileged, Some(false));
    let added: BTreeSet<&str> =
        security.capabilities.as_ref().unwrap().add.as_ref().unwrap().iter().map(String::as_str).collect();
    assert_eq!(added, BTreeSet::from(["BPF", "NET_ADMIN", "SYS_ADMIN", "PERFMON"]));
    let probe =
        |p: &Option<k8s_openapi::api::core::v1::Probe>| p.as_ref().unwrap().http_get.as_ref().unwrap().path.clone();
    assert_eq!(probe(&container.liveness_probe).as_deref(), Some("/healthz"));
    assert_eq!(probe(&container.readiness_probe).as_deref(), Some("/readyz"));
    // kubelet probes the listener of its own (`--probe-addr`), which no scrape flood fills.
    let probe_port =
        |p: &Option<k8s_openapi::api::core::v1::Probe>| p.as_ref().unwrap().http_get.as_ref().unwrap().port.clone();
    let probes = k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("probes".into());
    assert_eq!(probe_port(&container.liveness_probe), probes);
    assert_eq!(probe_port(&container.readiness_probe), probes);
    assert!(container.resources.as_ref().unwrap().requests.is_some(), "resource requests are set");
    let host_paths: BTreeSet<String> =
        pod.volumes.unwrap().iter().filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone())).collect();
    assert_eq!(
        host_paths,
        BTreeSet::from(["/sys/fs/bpf", "/sys/fs/cgroup", "/run/netns", "/proc/1/ns/net"].map(str::to_owned))
    );
    // Without hostPID the host's network namespace is the mounted file `--host-netns` names.
    let mounted = container.volume_mounts.as_ref().unwrap().iter().find(|m| m.name == "host-netns").expect("mount");
    let args = container.args.as_ref().unwrap();
    assert!(args.contains(&format!("--host-netns={}", mounted.mount_path)), "{args:?}");
    assert!(pod.host_pid.is_none_or(|pid| !pid) && pod.host_network.is_none_or(|net| !net));
    // The one privileged container mounts bpffs on the host where there is none, and only that.
    let init = &pod.init_containers.as_ref().expect("the bpffs init container")[0];
    assert_eq!(init.args.as_deref(), Some(&["mount-bpffs".to_owned(), "--path=/sys/fs/bpf".to_owned()][..]));
    assert_eq!(init.security_context.as_ref().and_then(|s| s.privileged), Some(true));
    let propagation = init.volume_mounts.as_ref().unwrap()[0].mount_propagation.as_deref();
    assert_eq!(propagation, Some("Bidirectional"), "the mount must reach the host");
    let seccomp = pod.security_context.as_ref().and_then(|s| s.seccomp_profile.as_ref()).expect("seccomp profile");
    assert_eq!(seccomp.type_, "RuntimeDefault");
    let pod_ip = container.env.as_ref().unwrap().iter().find(|e| e.name == "POD_IP").expect("POD_IP");
    assert_eq!(pod_ip.value_from.as_ref().unwrap().field_ref.as_ref().unwrap().field_path, "status.podIP");
    let args = container.args.as_ref().unwrap();
    assert!(args.contains(&"--metrics-addr=[$(POD_IP)]:9464".to_owned()), "metrics on the pod IP only: {args:?}");
    assert!(args.contains(&"--probe-addr=[$(POD_IP)]:9465".to_owned()), "probes on the pod IP only: {args:?}");
    // DNS on the pod IP (steering needs an address every pod reaches), on an unprivileged port:
    // the capabilities above have no NET_BIND_SERVICE.
    let listen = args.iter().find_map(|a| a.strip_prefix("--dns-listen=")).expect("--dns-listen");
    let (ip, port) = listen.rsplit_once(':').expect("IP:PORT");
    assert_eq!(ip, "[$(POD_IP)]", "one form for either family");
    assert!(port.parse::<u16>().is_ok_and(|port| port >= 1024), "{listen}: a privileged port needs NET_BIND_SERVICE");
    let ports: BTreeSet<(i32, &str)> = container
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .map(|p| (p.container_port, p.protocol.as_deref().unwrap_or("TCP")))
        .collect();
    assert!(
        ports.contains(&(port.parse().unwrap(), "UDP")) && ports.contains(&(port.parse().unwrap(), "TCP")),
        "{ports:?}"
    );
}

/// Every document under deploy/uninstall/, with its file name.
fn uninstall_manifests() -> Vec<(String, Value)> {
    let dir = deploy_dir().join("uninstall");
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/uninstall/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "yaml") && !path.ends_with("kustomization.yaml"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read manifest");
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        for document in serde_yaml::Deserializer::from_str(&text) {
            let yaml: serde_yaml::Value = serde::Deserialize::deserialize(document).unwrap();
            out.push((name.clone(), serde_json::to_value(yaml).expect("YAML as JSON")));
        }
    }
    out
}

#[test]
fn the_uninstall_daemonset_runs_a_cleanup_the_agent_accepts() {
    let documents = uninstall_manifests();
    for (file, document) in &documents {
        match document["kind"].as_str() {
            Some("Namespace") => round_trip::<Namespace>(file, document),
            Some("DaemonSet") => round_trip::<DaemonSet>(file, document),
            other => panic!("{file}: unexpected kind {other:?}"),
        }
    }
    let (_, document) = documents.into_iter().find(|(_, d)| d["kind"] == "DaemonSet").expect("a DaemonSet");
    let daemonset: DaemonSet = serde_json::from_value(document).unwrap();
    let pod = daemonset.spec.unwrap().template.spec.unwrap();
    let container = &pod.containers[0];
    let args = container.args.clone().unwrap();
    assert_eq!(args[0], "cleanup");
    assert!(args.contains(&"--pin-path=/sys/fs/bpf/topology".to_owned()), "the agent's pin path: {args:?}");
    // The same command against an empty directory on no bpffs: accepted, and it removes nothing.
    let empty = std::env::temp_dir().join("topology-agent-uninstall-test");
    let args: Vec<String> = args
        .into_iter()
        .filter(|arg| arg != "--wait")
        .map(|arg| if arg.starts_with("--pin-path=") { format!("--pin-path={}", empty.display()) } else { arg })
        .collect();
    let output = Command::new(env!("CARGO_BIN_EXE_topology-agent")).args(&args).output().expect("run the agent");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(stdout.starts_with("detached 0 programs, removed 0 map pins"), "{stdout}");
    let added: BTreeSet<&str> = container
        .security_context
        .as_ref()
        .unwrap()
        .capabilities
        .as_ref()
        .unwrap()
        .add
        .as_ref()
        .unwrap()
        .iter()
        .map(String::as_str)
        .collect();
    assert_eq!(added, BTreeSet::from(["BPF", "NET_ADMIN"]), "detaching links and removing pins needs no more");
}

#[test]
fn the_daemonset_arguments_are_accepted_by_the_agent() {
    let container = daemonset().spec.unwrap().template.spec.unwrap().containers.remove(0);
    // Kubernetes expands $(POD_IP) from the environment it declares: an IPv4 pod, and an IPv6 or
    // IPv6-primary dual-stack one (never loopback: DNS steering refuses one).
    for pod_ip in ["192.0.2.10", "fd00::5"] {
        accepts(container.args.clone().unwrap(), pod_ip);
    }
}

/// Runs the agent with `args` as Kubernetes would expand them for a pod at `pod_ip`, a pin path
/// that is not on bpffs so nothing is loaded or created; it must stop there, not at the arguments.
fn accepts(args: Vec<String>, pod_ip: &str) {
    let not_bpffs = std::env::temp_dir().join("topology-agent-manifest-test");
    let args: Vec<String> = args
        .into_iter()
        .map(|arg| if arg.starts_with("--pin-path=") { format!("--pin-path={}", not_bpffs.display()) } else { arg })
        .map(|arg| arg.replace("$(POD_IP)", pod_ip))
        .chain(["--node=manifest-test".to_owned(), "--cluster=/nonexistent.yaml".to_owned()])
        .collect();
    let output = Command::new(env!("CARGO_BIN_EXE_topology-agent"))
        .args(&args)
        .env("POD_IP", pod_ip)
        .output()
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(2), "POD_IP={pod_ip}: the agent rejected the arguments: {stderr}");
    assert!(!output.status.success(), "must stop at the pin path: {stderr}");
    assert!(
        stderr.contains("is not on a BPF filesystem") || stderr.contains("cgroup"),
        "POD_IP={pod_ip}: stopped for another reason than the pin path or cgroup: {stderr}"
    );
    assert!(!not_bpffs.exists(), "nothing was created");
}

/// `kubectl kustomize DIR`: what `kubectl apply -k` sends, one JSON value per object.
fn rendered(dir: &str) -> Vec<Value> {
    let output = Command::new("kubectl")
        .args(["kustomize", &deploy_dir().join(dir).to_string_lossy()])
        .output()
        .expect("kubectl (cargo xtask setup installs kubernetes-client)");
    assert!(output.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&output.stderr));
    let text = String::from_utf8(output.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_json::to_value(serde_yaml::Value::deserialize(document).unwrap()).unwrap())
        .collect()
}

fn of_kind<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects.iter().find(|o| o["kind"] == kind).unwrap_or_else(|| panic!("no {kind} rendered"))
}

/// Pinning needs writes under /sys/fs/bpf, which runtime-default AppArmor profiles deny: both the
/// field (1.30+) and the annotation (older) say unconfined, for the pod's one container.
fn unconfined(daemonset: &Value) {
    let template = &daemonset["spec"]["template"];
    let container = &template["spec"]["containers"][0];
    let name = container["name"].as_str().unwrap();
    let annotation = format!("container.apparmor.security.beta.kubernetes.io/{name}");
    assert_eq!(template["metadata"]["annotations"][&annotation], "unconfined", "{}", daemonset["metadata"]["name"]);
    assert_eq!(container["securityContext"]["appArmorProfile"]["type"], "Unconfined");
}

#[test]
fn the_install_and_uninstall_render_with_kubectl_as_clusters_need_them() {
    let install = rendered(".");
    let namespace = of_kind(&install, "Namespace");
    assert_eq!(namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged");
    let daemonset = of_kind(&install, "DaemonSet");
    unconfined(daemonset);
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    // GKE admits system-node-critical outside kube-system only with a quota scoped to it.
    let quota = of_kind(&install, "ResourceQuota");
    assert_eq!(quota["metadata"]["namespace"], daemonset["metadata"]["namespace"]);
    let scope = &quota["spec"]["scopeSelector"]["matchExpressions"][0];
    assert_eq!((&scope["scopeName"], &scope["operator"]), (&json!("PriorityClass"), &json!("In")));
    assert_eq!(scope["values"], json!(["system-node-critical"]));
    let memory = pod["containers"][0]["resources"]["requests"]["memory"].as_str().unwrap();
    let mebibytes: u64 = memory.strip_suffix("Mi").and_then(|m| m.parse().ok()).expect("a request in Mi");
    assert!(mebibytes >= 96, "the request {memory} is below the measured steady resident size (86-88 MiB)");
    // The rendered arguments are the ones the agent accepts.
    let args: Vec<String> = serde_json::from_value(pod["containers"][0]["args"].clone()).unwrap();
    for pod_ip in ["192.0.2.10", "fd00::5"] {
        accepts(args.clone(), pod_ip);
    }

    let uninstall = rendered("uninstall");
    let namespace = of_kind(&uninstall, "Namespace");
    assert_eq!(
        namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged",
        "where Pod Security defaults to baseline, the cleanup pods would be refused and the uninstall hang"
    );
    unconfined(of_kind(&uninstall, "DaemonSet"));
}
