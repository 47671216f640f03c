//! The pipeline's arrows point one way, and the compiler keeps them so only where crates split it:
//! this crate is the pure middle (model, policy, plan) and must never depend on what comes after
//! it (the kernel, the network, an async runtime, the agent) — else the simulator, the policy's
//! benchmarks and its tests would need them, and the nightly toolchain that builds the programs.

use std::process::Command;

/// Crates the pure stages must not reach, even through another dependency.
const DOWNSTREAM: [&str; 8] =
    ["topology-agent", "topology-ebpf", "aya", "aya-obj", "tokio", "hyper", "kube-client", "kube-runtime"];

#[test]
fn the_policy_crate_depends_on_nothing_downstream() {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--package", "topology-policy", "--edges", "normal,build", "--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(output.status.success(), "cargo tree: {}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8_lossy(&output.stdout);
    let names: Vec<&str> = tree.lines().filter_map(|line| line.split_whitespace().next()).collect();
    assert!(names.contains(&"topology-common"), "the tree was read: {tree}");
    let reached: Vec<&str> = DOWNSTREAM.into_iter().filter(|name| names.contains(name)).collect();
    assert!(reached.is_empty(), "topology-policy depends on {reached:?}:\n{tree}");
}
