//! The full path, root, real kernel: `topology-agent run --cluster FILE` with backends in network
//! namespaces. Edits to the file move new connections within a deadline; SIGKILL and restart
//! under load lose nothing; `status` and `/metrics` show what was programmed. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    collections::BTreeSet,
    net::{IpAddr, SocketAddr},
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::Value;
use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    net::ClientPlace,
    require_root,
    sandbox::run,
};

const VIP: &str = "10.96.0.10";
const READY: Duration = Duration::from_secs(20);

struct World {
    fx: Fixture,
    file: PathBuf,
}

impl World {
    /// Four backends b0..b3 and a cluster of nodes a (this node) and b in zone-a, c and d in zone-b.
    fn new() -> Self {
        let fx = Fixture::new(4);
        let file = fx.scratch().join("cluster.yaml");
        Self { fx, file }
    }

    fn addr(&self, backend: usize) -> IpAddr {
        IpAddr::V4(self.fx.backends[backend].host.v4)
    }

    /// Writes the cluster: node zones, and the `web` endpoints as (backend, node).
    fn write(&self, zones: [&str; 4], endpoints: &[(usize, &str)], distribution: Option<&str>) {
        let mut objects: Vec<Value> = ["node-a", "node-b", "node-c", "node-d"]
            .iter()
            .zip(zones)
            .map(|(name, zone)| objects::node(name, zone, Some("region-1"), "4"))
            .collect();
        let mut web = objects::service("default", "web", VIP.parse().unwrap(), 80, "TCP", "http");
        if let Some(distribution) = distribution {
            web["spec"]["trafficDistribution"] = distribution.into();
        }
        objects.push(web);
        let specs: Vec<EndpointSpec> =
            endpoints.iter().map(|(b, node)| EndpointSpec::new(self.addr(*b), node)).collect();
        objects.push(objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &specs));
        objects::write(&self.file, &objects);
    }

    fn start(&self) -> Agent {
        let mut agent =
            Agent::start(&AgentOptions::new(&self.file, "node-a", self.fx.cgroup.path(), self.fx.pins.path()));
        agent.wait_ready(READY);
        agent
    }
}

fn target() -> SocketAddr {
    SocketAddr::new(VIP.parse().unwrap(), 80)
}

/// Waits until new connections land exactly on `expected` (each of them, nothing else, no error).
fn wait_landing(place: &ClientPlace, expected: &[&str], within: Duration) {
    let expected: BTreeSet<String> = expected.iter().map(|s| (*s).to_owned()).collect();
    let deadline = Instant::now() + within;
    loop {
        let report = place.tcp(target(), 60);
        let landed: BTreeSet<String> = report.landed.keys().cloned().collect();
        if landed == expected && report.failures() == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "connections did not move to {expected:?} within {within:?}: {report:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn file_edits_move_new_connections() {
    require_root!();
    let world = World::new();
    let zones = ["zone-a", "zone-a", "zone-b", "zone-b"];
    world.write(zones, &[(0, "node-a"), (1, "node-c")], Some("PreferClose"));
    let _agent = world.start();
    let place = world.fx.place();
    let within = Duration::from_secs(10);
    wait_landing(&place, &["b0"], within);

    // Add an endpoint in this zone.
    world.write(zones, &[(0, "node-a"), (1, "node-c"), (2, "node-b")], Some("PreferClose"));
    wait_landing(&place, &["b0", "b2"], within);
    // Remove one.
    world.write(zones, &[(1, "node-c"), (2, "node-b")], Some("PreferClose"));
    wait_landing(&place, &["b2"], within);
    // Move an endpoint to another zone: none is left here, so every endpoint is used.
    world.write(zones, &[(1, "node-c"), (2, "node-d")], Some("PreferClose"));
    wait_landing(&place, &["b1", "b2"], within);
    // Relabel a node into this zone: its endpoint is close now.
    world.write(["zone-a", "zone-a", "zone-a", "zone-b"], &[(1, "node-c"), (2, "node-d")], Some("PreferClose"));
    wait_landing(&place, &["b1"], within);
    // The policy is the Service's: without trafficDistribution every endpoint is used.
    world.write(["zone-a", "zone-a", "zone-a", "zone-b"], &[(1, "node-c"), (2, "node-d")], None);
    wait_landing(&place, &["b1", "b2"], within);
}

#[test]
fn status_and_metrics_show_what_was_programmed() {
    require_root!();
    let world = World::new();
    world.write(["zone-a", "zone-a", "zone-b", "zone-b"], &[(0, "node-b"), (1, "node-c")], Some("PreferClose"));
    let agent = world.start();
    wait_landing(&world.fx.place(), &["b0"], Duration::from_secs(10));

    let pins = world.fx.pins.path().to_string_lossy().into_owned();
    let status = run(&topology_tests::net::agent_binary().to_string_lossy(), &["status", "--pin-path", &pins]);
    assert!(
        status.contains(
            "8 of 8 socket-address programs attached, 1 service ports; load signal idle (no TCP port is measured)"
        ),
        "{status}"
    );
    assert!(status.contains(&format!("default/web:http  {VIP}:80/TCP")), "{status}");
    assert!(status.contains(&format!("{}:{BACKEND_PORT}", world.addr(0))), "{status}");
    assert!(status.contains("zone"), "the backend is in this node's zone: {status}");
    assert!(!status.contains(&world.addr(1).to_string()), "the other zone is not programmed: {status}");

    let (code, metrics) = agent.get("/metrics").expect("GET /metrics");
    assert_eq!(code, 200);
    for expected in [
        "topology_agent_services_programmed 1",
        "topology_agent_backends_programmed 1",
        "topology_agent_map_entries{map=\"topo_svc4\"} 1",
        "topology_agent_map_capacity{map=\"topo_slots\"} 262144",
        "# TYPE topology_agent_event_to_kernel_seconds histogram",
        "# TYPE topology_agent_sync_duration_seconds histogram",
    ] {
        assert!(metrics.lines().any(|line| line == expected), "metrics lack {expected:?}:\n{metrics}");
    }
    assert_eq!(agent.get("/healthz").expect("GET /healthz").0, 200);

    // The running agent's plan is the report `explain` prints for the same file.
    let (code, plan) = agent.get("/debug/plan").expect("GET /debug/plan");
    assert_eq!(code, 200, "{plan}");
    let file = world.file.to_string_lossy().into_owned();
    let explained = run(
        &topology_tests::net::agent_binary().to_string_lossy(),
        &["explain", "--cluster", &file, "--node", "node-a", "--output", "json"],
    );
    let (plan, explained): (Value, Value) =
        (serde_json::from_str(&plan).expect("plan JSON"), serde_json::from_str(&explained).expect("explain JSON"));
    assert_eq!(plan, explained, "/debug/plan and explain disagree");
    let (code, one) = agent.get("/debug/plan?service=default%2Fweb").expect("GET /debug/plan?service=");
    assert_eq!(code, 200, "{one}");
    let one: Value = serde_json::from_str(&one).expect("plan JSON");
    assert_eq!(one["services"].as_array().map(Vec::len), Some(1), "{one}");
    let (code, missing) = agent.get("/debug/plan?service=default/none").expect("GET /debug/plan?service=");
    assert_eq!((code, missing.trim()), (404, "service default/none is not in the cluster"));
    // `status --plan` (what `kubectl exec … -- topology-agent status --plan` runs) prints it.
    let agent_addr = agent.http.to_string();
    let binary = topology_tests::net::agent_binary().to_string_lossy().into_owned();
    let status_plan = run(&binary, &["status", "--plan", "--agent", &agent_addr, "--output", "json"]);
    assert_eq!(serde_json::from_str::<Value>(&status_plan).expect("status --plan JSON"), plan);
    let table = run(&binary, &["status", "--plan", "--agent", &agent_addr, "--service", "default/web"]);
    assert!(table.contains("default/web:http  80/TCP") && table.contains("why: PreferClose"), "{table}");
    // Kernel counters appear within the counters interval (5 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let rewrites = format!(
        "topology_agent_kernel_rewrites_total{{service=\"default/web:http\",cluster_ip=\"{VIP}\",port=\"80\",protocol=\"TCP\",locality=\"zone\"}}"
    );
    loop {
        let (_, metrics) = agent.get("/metrics").expect("GET /metrics");
        let counted =
            metrics.lines().find(|l| l.starts_with(&rewrites)).and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok());
        if counted.is_some_and(|n| n >= 60) {
            break;
        }
        assert!(Instant::now() < deadline, "kernel rewrites not exported: {counted:?}\n{metrics}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn sigkill_and_restart_under_load_lose_no_connection() {
    require_root!();
    let world = World::new();
    world.write(["zone-a", "zone-a", "zone-b", "zone-b"], &[(0, "node-a"), (2, "node-b")], Some("PreferClose"));
    let mut agent = world.start();
    let place = world.fx.place();
    wait_landing(&place, &["b0", "b2"], Duration::from_secs(10));

    let client = place.spawn_loop(target(), &world.fx.scratch(), Duration::from_secs(60), false);
    for _ in 0..3 {
        agent.signal(libc::SIGKILL);
        agent.wait_exit(Duration::from_secs(5));
        // No agent: the pinned programs and maps keep serving.
        std::thread::sleep(Duration::from_millis(300));
        agent = world.start();
    }
    std::thread::sleep(Duration::from_millis(300));
    let result = client.finish();
    assert_eq!(result.failures(), 0, "{result:?}");
    assert!(result.attempts > 500, "{result:?}");
    assert!(result.landed_on("b0") > 0 && result.landed_on("b2") > 0, "{result:?}");
}

#[test]
fn sigterm_stops_the_agent_and_leaves_traffic_flowing() {
    require_root!();
    let world = World::new();
    world.write(["zone-a", "zone-a", "zone-b", "zone-b"], &[(3, "node-a")], None);
    let mut agent = world.start();
    let place = world.fx.place();
    wait_landing(&place, &["b3"], Duration::from_secs(10));
    agent.signal(libc::SIGTERM);
    let status = agent.wait_exit(Duration::from_secs(10));
    assert!(status.success(), "SIGTERM is a clean stop: {status}");
    let after = place.tcp(target(), 50);
    assert_eq!(after.landed_on("b3"), 50, "the kernel state stays in place: {after:?}");
}

#[test]
fn an_invalid_edit_keeps_the_last_good_state_and_marks_the_view_stale() {
    require_root!();
    let world = World::new();
    world.write(["zone-a", "zone-a", "zone-b", "zone-b"], &[(1, "node-b")], None);
    let mut agent = world.start();
    let place = world.fx.place();
    wait_landing(&place, &["b1"], Duration::from_secs(10));

    std::fs::write(&world.file, "apiVersion: v1\nkind: Service\nmetadata: {name: web}\nspec: {clusterIP: not-an-ip}\n")
        .expect("write a broken file");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, body) = agent.get("/readyz").expect("GET /readyz");
        if code == 503 {
            assert!(body.contains("view is stale: cluster file:") && body.contains("spec.clusterIP"), "{body}");
            break;
        }
        assert!(Instant::now() < deadline, "readiness did not report the broken file");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(place.tcp(target(), 30).landed_on("b1"), 30, "the last good state keeps serving");

    world.write(["zone-a", "zone-a", "zone-b", "zone-b"], &[(2, "node-b")], None);
    agent.wait_ready(Duration::from_secs(10));
    wait_landing(&place, &["b2"], Duration::from_secs(10));
}

#[test]
fn an_unknown_node_is_a_clear_error_at_start() {
    require_root!();
    let world = World::new();
    world.write(["zone-a", "zone-a", "zone-b", "zone-b"], &[(0, "node-a")], None);
    let output = std::process::Command::new(topology_tests::net::agent_binary())
        .arg("run")
        .arg("--cluster")
        .arg(&world.file)
        .args(["--node", "node-z", "--metrics-addr", "127.0.0.1:0"])
        .arg("--cgroup")
        .arg(world.fx.cgroup.path())
        .arg("--pin-path")
        .arg(world.fx.pins.path())
        .output()
        .expect("run the agent");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("node \"node-z\" is not in the cluster"), "{stderr}");
    assert_eq!(world.fx.place().tcp(target(), 3).errno("ENETUNREACH"), 3, "nothing was programmed");
}

#[test]
fn an_agent_whose_programs_were_detached_is_not_ready() {
    require_root!();
    let world = World::new();
    world.write(["zone-a", "zone-a", "zone-b", "zone-b"], &[(0, "node-a")], None);
    let agent = world.start();
    wait_landing(&world.fx.place(), &["b0"], Duration::from_secs(10));

    // Someone detaches a link (the pin stays): connections go unrewritten, and /readyz says so.
    let pin = world.fx.pins.path().join("links").join("connect4");
    run("bpftool", &["link", "detach", "pinned", &pin.to_string_lossy()]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let body = loop {
        let (code, body) = agent.get("/readyz").expect("readyz");
        if code == 503 {
            break body;
        }
        assert!(Instant::now() < deadline, "still ready with connect4 detached: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(body.contains("programs detached from the cgroup: connect4"), "{body}");
}
