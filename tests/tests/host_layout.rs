//! Hosts the agent meets on real clusters (root, the agent's binary): a node without bpffs gets one
//! mounted (`mount-bpffs`, the DaemonSet's init container) and the agent pins there; a `--cgroup`
//! that is not cgroup v2 stops the agent at start with one line naming what it is.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    ffi::CString,
    net::{IpAddr, SocketAddr},
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    net::agent_binary,
    require_root,
};

/// A BPF filesystem this test mounted, unmounted (lazily, with everything pinned in it) on drop.
struct BpffsGuard(PathBuf);

impl Drop for BpffsGuard {
    fn drop(&mut self) {
        let path = CString::new(self.0.as_os_str().as_bytes()).expect("a path");
        // SAFETY: a NUL-terminated path; MNT_DETACH only unmounts.
        unsafe { libc::umount2(path.as_ptr(), libc::MNT_DETACH) };
    }
}

fn agent_command(args: &[&str]) -> std::process::Output {
    Command::new(agent_binary()).args(args).output().expect("run the agent")
}

#[test]
fn a_node_without_bpffs_gets_one_and_the_agent_pins_there() {
    require_root!();
    let fx = Fixture::new(1);
    let bpf = fx.scratch().join("bpf");
    let pins = bpf.join("topology");
    let file = fx.scratch().join("cluster.yaml");
    let vip: SocketAddr = "10.96.0.10:80".parse().unwrap();
    let backend = EndpointSpec::new(IpAddr::V4(fx.backends[0].host.v4), "node-a");
    objects::write(
        &file,
        &[
            objects::node("node-a", "zone-a", None, "4"),
            objects::service("default", "web", vip.ip(), vip.port(), "TCP", "http"),
            objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &[backend]),
        ],
    );
    let options = AgentOptions::new(&file, "node-a", fx.cgroup.path(), &pins);

    // Without it the agent stops at once, saying how to get one.
    std::fs::create_dir_all(&bpf).unwrap();
    let mut refused = Agent::start(&options);
    assert_eq!(refused.wait_exit(Duration::from_secs(20)).code(), Some(1));

    let binary = |path: &Path| path.to_string_lossy().into_owned();
    let mounted = agent_command(&["mount-bpffs", "--path", &binary(&bpf)]);
    let _guard = BpffsGuard(bpf.clone());
    assert!(mounted.status.success(), "{}", String::from_utf8_lossy(&mounted.stderr));
    assert_eq!(String::from_utf8_lossy(&mounted.stdout), format!("mounted a BPF filesystem at {}\n", bpf.display()));
    let again = agent_command(&["mount-bpffs", "--path", &binary(&bpf)]);
    assert_eq!(String::from_utf8_lossy(&again.stdout), format!("{} is a BPF filesystem\n", bpf.display()));

    let mut agent = Agent::start(&options);
    agent.wait_ready(Duration::from_secs(20));
    assert_eq!(fx.place().tcp(vip, 10).landed_on("b0"), 10, "the programs run from the mounted bpffs");
    agent.signal(libc::SIGTERM);
    agent.wait_exit(Duration::from_secs(10));
    let cleaned = agent_command(&["cleanup", "--pin-path", &binary(&pins)]);
    assert!(cleaned.status.success(), "{}", String::from_utf8_lossy(&cleaned.stderr));
}

#[test]
fn a_cgroup_that_is_not_cgroup_v2_is_refused_naming_it() {
    require_root!();
    let fx = Fixture::new(0);
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &[objects::node("node-a", "zone-a", None, "4")]);
    let not_cgroup = fx.scratch().join("not-a-cgroup");
    std::fs::create_dir_all(&not_cgroup).unwrap();
    let output = Command::new(agent_binary())
        .args(["run", "--cluster"])
        .arg(&file)
        .args(["--node", "node-a", "--metrics-addr", "127.0.0.1:0", "--cgroup"])
        .arg(&not_cgroup)
        .arg("--pin-path")
        .arg(fx.pins.path())
        .output()
        .expect("run the agent");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let expected = format!("--cgroup {}: not a cgroup filesystem, not cgroup v2", not_cgroup.display());
    assert!(stderr.contains(&expected), "{stderr}");
    assert!(!fx.pins.path().join("links").exists(), "nothing was loaded or attached");
}
