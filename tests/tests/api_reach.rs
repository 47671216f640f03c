//! The API server's Service is left to kube-proxy (root, real kernel): the agent never programs
//! it, so neither it nor any pod reaches the API through maps that may name an old address, and
//! an agent upgraded from a version that did program it removes the entry before its first list.
//! The API moves while the agent is down, ten times; every restarted agent reaches it at once.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::{IpAddr, SocketAddr},
    path::Path,
    time::{Duration, Instant},
};

use topology_dataplane::{Dataplane, DataplaneConfig};
use topology_kube::{
    fake_api::{FakeApi, write_kubeconfig},
    objects::{self, EndpointSpec},
};
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, Locality, ServicePort, WeightedBackend};
use topology_tests::{
    agent::{Agent, AgentOptions},
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
    objects::slice("default", "kubernetes", "kubernetes", "https", API_PORT, "TCP", &[endpoint])
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
    api.apply(objects::node("node-a", "zone-a", None, "4"));
    api.apply(objects::node("node-cp", "zone-a", None, "4"));
    let vip: SocketAddr = API_VIP.parse().expect("VIP");
    api.apply(objects::service("default", "kubernetes", vip.ip(), vip.port(), "TCP", "https"));
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
    // What an earlier version left: the API server's Service programmed, at an address where no
    // API server is (it moved while that agent was down).
    let mut seeded = Dataplane::open(&DataplaneConfig::new(pins.path(), cgroup.path())).expect("an earlier agent");
    let stale = WeightedBackend { addr: address(1).ip(), port: API_PORT, weight: 1, locality: Locality::Other };
    let port = ServicePort { vip: vip.ip(), port: vip.port(), protocol: Protocol::Tcp };
    let mut earlier = DesiredState::default();
    let name = "default/kubernetes:https".to_owned();
    earlier.services.insert(port, DesiredService { name, backends: vec![stale], ..Default::default() });
    assert!(seeded.apply(&earlier).failed.is_empty());
    drop(seeded);

    let programmed = || {
        let status = topology_tests::sandbox::run(
            &topology_tests::net::agent_binary().to_string_lossy(),
            &["status", "--pin-path", &pins.path().to_string_lossy(), "--output", "json"],
        );
        let status: serde_json::Value = serde_json::from_str(&status).expect("status JSON");
        status["services"].as_array().expect("services").len()
    };
    // Ready within 30 s: through the adopted entry it would never list, until the programs
    // failed open two minutes later.
    let mut agent = start();
    agent.wait_ready(Duration::from_secs(30));
    assert_eq!(programmed(), 0, "the API server's Service is not programmed");
    for cycle in 1..=10 {
        // Down: SIGTERM leaves the programs and the maps in place.
        agent.signal(libc::SIGTERM);
        agent.wait_exit(Duration::from_secs(10));
        let to = cycle % 2;
        api.move_to(listen(homes[to].netns.name(), address(to)));
        api.apply(api_slice(address(to).ip()));
        proxy.forward("tcp", vip, address(to));

        let restarted = Instant::now();
        agent = start();
        agent.wait_ready(Duration::from_secs(30));
        assert_eq!(programmed(), 0, "cycle {cycle}");
        eprintln!("cycle {cycle}: ready {:?} after the restart", restarted.elapsed());
    }
    drop(agent);
    let _ = std::fs::remove_dir_all(&scratch);
}
