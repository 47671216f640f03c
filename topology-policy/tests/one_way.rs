//! The pipeline's arrows point one way, and the compiler keeps them so only where crates split it:
//! watch → model → policy → plan → diff → kernel. Each crate must never depend on what comes
//! after it: the model on the policy or anything later; the watch on the policy, the kernel or the
//! agent; the pure middle (this crate) on the Kubernetes API types, the kernel, the network, an
//! async runtime or the agent — else the simulator, the policy's benchmarks and its tests would
//! need them, and the nightly toolchain that builds the programs —, the dataplane on the
//! responder, the agent or a runtime, the responder on the kernel (it writes its heartbeat through
//! a trait the agent implements), the agent or the Kubernetes client.

use std::process::Command;

/// Each crate, and what it must not reach, even through another dependency.
const RULES: [(&str, &[&str]); 5] = [
    (
        "topology-model",
        &[
            "topology-policy",
            "topology-agent",
            "topology-dataplane",
            "topology-dns",
            "k8s-openapi",
            "kube-core",
            "serde_yaml",
            "aya",
            "tokio",
            "prometheus-client",
        ],
    ),
    (
        "topology-kube",
        &["topology-policy", "topology-agent", "topology-dataplane", "topology-dns", "topology-ebpf", "aya"],
    ),
    (
        "topology-policy",
        &[
            "topology-agent",
            "topology-dataplane",
            "topology-ebpf",
            "k8s-openapi",
            "kube-core",
            "serde_yaml",
            "prometheus-client",
            "aya",
            "aya-obj",
            "tokio",
            "hyper",
            "kube-client",
            "kube-runtime",
        ],
    ),
    ("topology-dataplane", &["topology-agent", "topology-dns", "tokio", "hyper", "kube-client", "kube-runtime"]),
    (
        "topology-dns",
        &["topology-agent", "topology-dataplane", "topology-ebpf", "aya", "hyper", "kube-client", "kube-runtime"],
    ),
];

/// The crates `package` depends on (normal and build edges), by name.
fn dependencies(package: &str) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--package", package, "--edges", "normal,build", "--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(output.status.success(), "cargo tree: {}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8_lossy(&output.stdout);
    tree.lines().filter_map(|line| line.split_whitespace().next()).map(str::to_owned).collect()
}

#[test]
fn no_crate_depends_on_a_later_stage() {
    for (package, downstream) in RULES {
        let names = dependencies(package);
        assert!(names.iter().any(|name| name == "topology-common"), "{package}: the tree was read: {names:?}");
        let reached: Vec<&str> = downstream.iter().copied().filter(|name| names.iter().any(|n| n == name)).collect();
        assert!(reached.is_empty(), "{package} depends on {reached:?}");
    }
}
