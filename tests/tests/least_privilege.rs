//! Least privilege, proven (root, real kernel): the agent runs under `capsh` with exactly the
//! DaemonSet's capabilities — loads, programs, serves — and without any one of them stops at once
//! with an error naming it. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{net::IpAddr, process::Command, time::Duration};

use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    net::agent_binary,
    require_root,
};

/// The DaemonSet's `capabilities.add` (deploy/daemonset.yaml), which
/// `topology-agent/tests/deploy_manifests.rs` pins.
const DAEMONSET: [&str; 4] = ["cap_bpf", "cap_net_admin", "cap_sys_admin", "cap_perfmon"];

#[test]
fn the_agent_runs_with_exactly_the_daemonsets_capabilities_and_names_any_missing_one() {
    require_root!();
    let fx = Fixture::new(1);
    let file = fx.scratch().join("cluster.yaml");
    let b0 = EndpointSpec::new(IpAddr::V4(fx.backends[0].host.v4), "node-a");
    objects::write(
        &file,
        &[
            objects::node("node-a", "zone-a", None, "4"),
            objects::service("default", "web", "10.96.0.80".parse().unwrap(), 80, "TCP", "http"),
            objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &[b0]),
        ],
    );
    let options = |wrapper: Vec<String>| AgentOptions {
        wrapper,
        ..AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path())
    };

    // Without one capability: a clear error naming it, before anything is loaded.
    for missing in DAEMONSET {
        let keep: Vec<&str> = DAEMONSET.iter().copied().filter(|cap| *cap != missing).collect();
        let wrapper = topology_tests::caps::capsh_keeping(&keep);
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
    let mut full = options(topology_tests::caps::capsh_keeping(&DAEMONSET));
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
    let mut lean = options(topology_tests::caps::capsh_keeping(&["cap_bpf", "cap_net_admin", "cap_perfmon"]));
    lean.extra = vec!["--terminate-sockets".into(), "off".into()];
    let mut agent = Agent::start(&lean);
    agent.wait_ready(Duration::from_secs(20));
    let landed = fx.place().tcp("10.96.0.80:80".parse().unwrap(), 20);
    assert_eq!(landed.landed_on("b0"), 20, "{landed:?}");
}
