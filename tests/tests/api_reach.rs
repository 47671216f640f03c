//! The agent reaches the API server whatever its own maps say (root, real kernel): it dials the
//! `kubernetes` Service's ClusterIP through the programs it pinned itself, from maps a previous
//! agent wrote. The API moves while the agent is down; the restarted agent must not be sent to
//! the old address by those maps. `--test-threads=1`.

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use topology_tests::{
    agent::{Agent, AgentOptions},
    cluster::{self, EndpointSpec},
    fake_api::{FakeApi, write_kubeconfig},
    net::{KubeProxyStandIn, Network},
    netns, require_root,
    sandbox::{CgroupGuard, PinGuard, unique_id},
};

/// The `kubernetes` Service's ClusterIP and port, as `KUBERNETES_SERVICE_HOST`/`_PORT` give them.
const API_VIP: &str = "10.96.0.1:443";
/// The port the API server listens on (the slice's target port).
const API_PORT: u16 = 6443;

/// A listener of the fake API at `addr`, in the namespace `ns`.
fn listen(ns: &str, addr: SocketAddr) -> tokio::net::TcpListener {
    let listener = netns::run_in(ns, move || std::net::TcpListener::bind(addr).expect("bind the API address"));
    listener.set_nonblocking(true).expect("non-blocking");
    tokio::net::TcpListener::from_std(listener).expect("tokio listener")
}

/// The `kubernetes` Service's slice, with the API at `address`.
fn api_slice(address: IpAddr) -> serde_json::Value {
    let endpoint = EndpointSpec::new(address, "node-cp");
    cluster::slice("default", "kubernetes", "kubernetes", "https", API_PORT, "TCP", &[endpoint])
}

#[test]
fn a_restarted_agent_reaches_an_api_server_that_moved_while_it_was_down() {
    require_root!();
    let id = unique_id();
    let mut network = Network::new(&id);
    let client = network.host("c");
    let homes = [network.host("a"), network.host("a")];
    let cgroup = CgroupGuard::new(&id);
    // The agent runs below the cgroup its programs attach to, as in a pod on a node.
    let home = CgroupGuard::new(&format!("{id}/agent"));
    let pins = PinGuard::new(&id);
    let scratch = std::env::temp_dir().join(&id);
    std::fs::create_dir_all(&scratch).expect("scratch");
    let config = scratch.join("kubeconfig");
    write_kubeconfig(&config, &format!("http://{API_VIP}"));

    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio");
    let _entered = runtime.enter();
    let address = |i: usize| SocketAddr::new(IpAddr::V4(homes[i].v4), API_PORT);
    let mut api = FakeApi::start_on(listen(homes[0].netns.name(), address(0)));
    api.apply(cluster::node("node-a", "zone-a", None, "4"));
    api.apply(cluster::node("node-cp", "zone-a", None, "4"));
    let vip: SocketAddr = API_VIP.parse().expect("VIP");
    api.apply(cluster::service("default", "kubernetes", vip.ip(), vip.port(), "TCP", "https"));
    api.apply(api_slice(address(0).ip()));
    // kube-proxy knows the API server's real address (its own kubeconfig) and keeps the
    // ClusterIP's DNAT current: the fallback for anything the programs do not rewrite.
    let proxy = KubeProxyStandIn::new(client.netns.name());
    proxy.forward("tcp", vip, address(0));

    let start = || {
        Agent::start(&AgentOptions {
            kubeconfig: Some(&config),
            home: Some(home.path()),
            netns: Some(client.netns.name()),
            ..AgentOptions::new(Path::new(""), "node-a", cgroup.path(), pins.path())
        })
    };
    let mut agent = start();
    agent.wait_ready(Duration::from_secs(30));
    for cycle in 1..=10 {
        // Down: SIGTERM leaves the programs and the maps (API at the old address) in place.
        agent.signal(libc::SIGTERM);
        agent.wait_exit(Duration::from_secs(10));
        let to = cycle % 2;
        api.move_to(listen(homes[to].netns.name(), address(to)));
        api.apply(api_slice(address(to).ip()));
        proxy.forward("tcp", vip, address(to));

        let restarted = Instant::now();
        agent = start();
        agent.wait_ready(Duration::from_secs(30));
        let status = topology_tests::sandbox::run(
            &topology_tests::net::agent_binary().to_string_lossy(),
            &["status", "--pin-path", &pins.path().to_string_lossy(), "--output", "json"],
        );
        let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
        let backends = &status["services"][0]["backends"];
        assert_eq!(backends[0]["address"], address(to).ip().to_string(), "cycle {cycle}: {status}");
        eprintln!("cycle {cycle}: ready {:?} after the restart", restarted.elapsed());
    }
    let metrics = agent.get("/metrics").expect("metrics").1;
    let exempt = metrics
        .lines()
        .find_map(|l| l.strip_prefix("topology_agent_kernel_agent_exempt_total "))
        .and_then(|v| v.parse::<u64>().ok())
        .expect("exempt counter");
    assert!(exempt >= 10, "the agent's own connections went untouched: {exempt}");
    drop(agent);
    let _ = std::fs::remove_dir_all(&scratch);
}
