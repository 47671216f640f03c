//! Least privilege, proven (root, real kernel): the agent runs under `capsh` with exactly the
//! DaemonSet's capabilities — loads, programs, serves — and without any one of them stops at once
//! with an error naming it. `--test-threads=1`.

use std::{net::IpAddr, process::Command, time::Duration};

use topology_tests::{
    agent::{Agent, AgentOptions},
    cluster::{self, EndpointSpec},
    fixture::{BACKEND_PORT, Fixture},
    net::agent_binary,
    require_root,
};

/// The DaemonSet's `capabilities.add` (deploy/daemonset.yaml), which
/// `topology-agent/tests/deploy_manifests.rs` pins.
const DAEMONSET: [&str; 4] = ["cap_bpf", "cap_net_admin", "cap_sys_admin", "cap_perfmon"];

/// Every capability the kernel knows (capability(7)), by `capsh`'s names.
const ALL: [&str; 41] = [
    "cap_chown",
    "cap_dac_override",
    "cap_dac_read_search",
    "cap_fowner",
    "cap_fsetid",
    "cap_kill",
    "cap_setgid",
    "cap_setuid",
    "cap_setpcap",
    "cap_linux_immutable",
    "cap_net_bind_service",
    "cap_net_broadcast",
    "cap_net_admin",
    "cap_net_raw",
    "cap_ipc_lock",
    "cap_ipc_owner",
    "cap_sys_module",
    "cap_sys_rawio",
    "cap_sys_chroot",
    "cap_sys_ptrace",
    "cap_sys_pacct",
    "cap_sys_admin",
    "cap_sys_boot",
    "cap_sys_nice",
    "cap_sys_resource",
    "cap_sys_time",
    "cap_sys_tty_config",
    "cap_mknod",
    "cap_lease",
    "cap_audit_write",
    "cap_audit_control",
    "cap_setfcap",
    "cap_mac_override",
    "cap_mac_admin",
    "cap_syslog",
    "cap_wake_alarm",
    "cap_block_suspend",
    "cap_audit_read",
    "cap_perfmon",
    "cap_bpf",
    "cap_checkpoint_restore",
];

/// `capsh` dropping every capability but `keep` from the bounding set, then running the agent
/// (as root, so it gets exactly the bounding set, as a container's root does).
fn under_capsh(keep: &[&str]) -> Vec<String> {
    let drop: Vec<&str> = ALL.iter().copied().filter(|cap| !keep.contains(cap)).collect();
    vec!["capsh".into(), format!("--drop={}", drop.join(",")), "--".into(), "-c".into(), "exec \"$0\" \"$@\"".into()]
}

#[test]
fn the_agent_runs_with_exactly_the_daemonsets_capabilities_and_names_any_missing_one() {
    require_root!();
    let fx = Fixture::new(1);
    let file = fx.scratch().join("cluster.yaml");
    let b0 = EndpointSpec::new(IpAddr::V4(fx.backends[0].host.v4), "node-a");
    cluster::write(
        &file,
        &[
            cluster::node("node-a", "zone-a", None, "4"),
            cluster::service("default", "web", "10.96.0.80".parse().unwrap(), 80, "TCP", "http"),
            cluster::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &[b0]),
        ],
    );
    let options = |wrapper: Vec<String>| AgentOptions {
        wrapper,
        ..AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path())
    };

    // Without one capability: a clear error naming it, before anything is loaded.
    for missing in DAEMONSET {
        let keep: Vec<&str> = DAEMONSET.iter().copied().filter(|cap| *cap != missing).collect();
        let wrapper = under_capsh(&keep);
        let output = Command::new(&wrapper[0])
            .args(&wrapper[1..])
            .arg(agent_binary())
            .args(["run", "--node", "node-a", "--metrics-addr", "127.0.0.1:0", "--cluster"])
            .arg(&file)
            .arg("--cgroup")
            .arg(fx.cgroup.path())
            .arg("--pin-path")
            .arg(fx.pins.path())
            .output()
            .expect("run the agent under capsh");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "the agent ran without {missing}: {stderr}");
        let name = missing.to_uppercase();
        assert!(stderr.contains(&format!("missing capability {name}")), "{missing}: {stderr}");
        assert!(!fx.pins.path().exists(), "without {missing} nothing was pinned");
    }

    // With exactly the DaemonSet's: it loads, programs and serves, DNS included (on an
    // unprivileged port, as the DaemonSet's, with the steering heartbeat written).
    let mut full = options(under_capsh(&DAEMONSET));
    let dns = format!("{}:0", fx.client.v4);
    full.netns = Some(fx.client.netns.name());
    full.extra = vec!["--dns-listen".into(), dns];
    let mut agent = Agent::start(&full);
    agent.wait_ready(Duration::from_secs(20));
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).expect("agent status");
    let effective = status.lines().find_map(|l| l.strip_prefix("CapEff:")).expect("CapEff").trim().to_owned();
    // BPF (39), PERFMON (38), SYS_ADMIN (21), NET_ADMIN (12), nothing else.
    assert_eq!(effective, "000000c000201000", "the agent holds exactly the DaemonSet's capabilities");
    let landed = fx.place().tcp("10.96.0.80:80".parse().unwrap(), 20);
    assert_eq!(landed.landed_on("b0"), 20, "{landed:?}");
    let (code, metrics) = agent.get("/metrics").expect("metrics");
    assert_eq!(code, 200);
    assert!(metrics.contains("topology_agent_services_programmed 1"), "{metrics}");
    agent.signal(libc::SIGTERM);
    agent.wait_exit(Duration::from_secs(10));

    // Without socket termination, SYS_ADMIN is not needed.
    let mut lean = options(under_capsh(&["cap_bpf", "cap_net_admin", "cap_perfmon"]));
    lean.extra = vec!["--terminate-sockets".into(), "off".into()];
    let mut agent = Agent::start(&lean);
    agent.wait_ready(Duration::from_secs(20));
    let landed = fx.place().tcp("10.96.0.80:80".parse().unwrap(), 20);
    assert_eq!(landed.landed_on("b0"), 20, "{landed:?}");
}
