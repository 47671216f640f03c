//! Any pod reaches the agent's pod address: its HTTP endpoints must stay kubelet's, and its DNS
//! over TCP every pod's (root, the agent's binary in a network namespace, a flooding client in
//! another). `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    io::{ErrorKind, Read as _, Write as _},
    net::{SocketAddr, TcpStream},
    time::{Duration, Instant},
};

use topology_kube::objects;
use topology_tests::{
    agent::{Agent, AgentOptions, get},
    dns::dig,
    fixture::Fixture,
    netns, require_root,
};

/// Connections one pod opens, each pipelining requests it never reads the answers of.
const FLOOD: usize = 128;

/// What a connection of the flood saw.
#[derive(Debug, PartialEq, Eq)]
enum Fate {
    /// Answered.
    Served,
    /// Closed by the agent unserved.
    Closed,
}

fn fate(stream: &mut TcpStream) -> Fate {
    stream.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let mut buffer = [0u8; 64];
    match stream.read(&mut buffer) {
        Ok(0) => Fate::Closed,
        Ok(_) => Fate::Served,
        Err(error) if error.kind() == ErrorKind::ConnectionReset => Fate::Closed,
        Err(error) => panic!("neither served nor closed: {error}"),
    }
}

/// Opens `count` connections to `addr` from the namespace `from`, each sending `path` `times`
/// times without reading.
fn flood(from: &str, addr: SocketAddr, path: &'static str, count: usize, times: usize) -> Vec<TcpStream> {
    netns::run_in(from, move || {
        let request = format!("GET {path} HTTP/1.1\r\nHost: agent\r\n\r\n").repeat(times);
        (0..count)
            .filter_map(|_| {
                let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
                stream.set_write_timeout(Some(Duration::from_millis(200))).unwrap();
                let _ = stream.write_all(request.as_bytes());
                Some(stream)
            })
            .collect()
    })
}

#[test]
fn a_flooding_pod_keeps_neither_probes_nor_memory() {
    require_root!();
    let mut fx = Fixture::new(0);
    let node = fx.network.host("node");
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &[objects::node("node-a", "zone-a", None, "4")]);
    let metrics = SocketAddr::from((node.v4, 9464));
    let probes = SocketAddr::from((node.v4, 9465));
    let mut agent = Agent::start(&AgentOptions {
        netns: Some(node.netns.name()),
        metrics_addr: Some(metrics),
        extra: vec!["--probe-addr".into(), format!("[{}]:9465", node.v4)],
        ..AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path())
    });
    agent.wait_ready(Duration::from_secs(20));
    let rss_before = agent.usage().rss_mib;

    // One pod opens 128 connections pipelining /healthz and reads nothing.
    let mut healthz = flood(fx.client.netns.name(), metrics, "/healthz", FLOOD, 200);
    // kubelet (from the node's own address) is still answered, on both listeners.
    for addr in [metrics, probes] {
        let (status, body) = netns::run_in(node.netns.name(), move || get(addr, "/healthz")).expect("a probe");
        assert_eq!((status, body.as_str()), (200, "ok\n"), "{addr}");
    }
    let fates: Vec<Fate> = healthz.iter_mut().map(fate).collect();
    let served = fates.iter().filter(|f| **f == Fate::Served).count();
    assert!(served <= 8, "one client address is served at most 8 connections, not {served}");
    drop(healthz);

    // The same pod asks for /metrics 500 times on each connection and reads nothing: the answers
    // pile up in no buffer for longer than the write timeout.
    let mut scrapes = flood(fx.client.netns.name(), metrics, "/metrics", FLOOD, 500);
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(12));
    let rss_during = agent.usage().rss_mib;
    let mut ended = 0;
    for stream in &mut scrapes {
        stream.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut sink = vec![0u8; 1 << 16];
        let outcome = loop {
            match stream.read(&mut sink) {
                Ok(0) => break Ok(()),
                Ok(_) => {}
                Err(error) => break Err(error),
            }
        };
        match outcome {
            Ok(()) => ended += 1,
            Err(error) if error.kind() == ErrorKind::ConnectionReset => ended += 1,
            Err(error) => panic!("a connection nobody read from is still open after {:?}: {error}", started.elapsed()),
        }
    }
    assert_eq!(ended, scrapes.len());
    assert!(rss_during - rss_before < 64.0, "the flood grew the agent {rss_before:.0} -> {rss_during:.0} MiB");
    eprintln!("served {served} of {FLOOD}; RSS {rss_before:.1} -> {rss_during:.1} MiB during the scrape flood");

    // The plan and the cost are not served on the pod address: they show every Service (and
    // every tenant's volumes) to whoever asks.
    for path in ["/debug/plan", "/debug/cost"] {
        let (status, body) = netns::run_in(fx.client.netns.name(), move || get(metrics, path)).expect(path);
        assert_eq!(status, 404, "{path}: {body}");
        assert!(body.contains("loopback only"), "{body}");
        let loopback = SocketAddr::from(([127, 0, 0, 1], 9464));
        let (status, _) = netns::run_in(node.netns.name(), move || get(loopback, path)).expect(path);
        assert_eq!(status, 200, "{path}: port-forward reaches it on the loopback");
    }
}

/// Whether the agent still keeps `stream` open, once what it already sent is read.
fn still_open(mut stream: &TcpStream) -> bool {
    stream.set_nonblocking(true).unwrap();
    let mut buffer = [0u8; 512];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(error) if error.kind() == ErrorKind::WouldBlock => return true,
            Err(_) => return false,
        }
    }
}

/// A DNS query for `name` (A), framed for TCP.
fn framed_query(name: &str, id: u16) -> Vec<u8> {
    let mut message = id.to_be_bytes().to_vec();
    message.extend([0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.').filter(|l| !l.is_empty()) {
        message.push(label.len() as u8);
        message.extend(label.as_bytes());
    }
    message.extend([0, 0, 1, 0, 1]);
    let mut framed = (message.len() as u16).to_be_bytes().to_vec();
    framed.extend(message);
    framed
}

#[test]
fn one_pod_holding_tcp_connections_leaves_dns_over_tcp_to_the_others() {
    require_root!();
    let mut fx = Fixture::new(0);
    let node = fx.network.host("node");
    let file = fx.scratch().join("cluster.yaml");
    objects::write(&file, &[objects::node("node-a", "zone-a", None, "4")]);
    let dns = SocketAddr::from((node.v4, 53));
    let mut agent = Agent::start(&AgentOptions {
        netns: Some(node.netns.name()),
        extra: vec!["--dns-listen".into(), dns.to_string(), "--dns-steer".into(), "off".into()],
        ..AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path())
    });
    agent.wait_ready(Duration::from_secs(20));

    // One pod opens 256 connections (the responder's total), asks once on each and keeps them.
    let held = netns::run_in(fx.client.netns.name(), move || {
        (0..256u16)
            .filter_map(|id| {
                let mut stream = TcpStream::connect_timeout(&dns, Duration::from_secs(2)).ok()?;
                stream.write_all(&framed_query("a.default.svc.cluster.local", id)).ok()?;
                Some(stream)
            })
            .collect::<Vec<_>>()
    });
    // Every answer and every close the agent sent has arrived by now.
    std::thread::sleep(Duration::from_millis(500));
    let open = held.iter().filter(|stream| still_open(stream)).count();
    assert!(open <= 16, "one client address holds at most 16 connections, not {open}");
    // Another pod (here: the node itself) is answered over TCP at once.
    let answer = dig(Some(node.netns.name()), dns, "a.default.svc.cluster.local", "A", &["+tcp", "+time=1"]);
    assert_eq!(answer.status, "NXDOMAIN", "{answer:?}");
}
