//! The HTTP surface cannot hurt the control loop (root, real kernel): 1,000 idle connections held
//! open by one client (and reopened as the agent closes them) and 50 scrapes a second from
//! another while the cluster file changes five times a second; event-to-kernel stays fast and the
//! agent's descriptors bounded.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, SocketAddr, TcpStream},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use topology_kube::objects::{self, EndpointSpec};
use topology_tests::{
    agent::{Agent, AgentOptions},
    fixture::{BACKEND_PORT, Fixture},
    require_root,
};

/// Idle connections the attacker keeps open.
const IDLE: usize = 1000;
/// The attacker's address: another pod than Prometheus, as on a cluster (both on loopback here).
const ATTACKER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// A connection to `to` from `local`.
fn connect_from(local: std::net::IpAddr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)?;
    socket.bind(&SocketAddr::new(local, 0).into())?;
    socket.connect_timeout(&to.into(), Duration::from_millis(200))?;
    Ok(socket.into())
}

fn write(fx: &Fixture, file: &std::path::Path, round: usize) {
    let endpoints: Vec<EndpointSpec> =
        (0..=round % 2).map(|i| EndpointSpec::new(IpAddr::V4(fx.backends[i].host.v4), "node-a")).collect();
    objects::write(
        file,
        &[
            objects::node("node-a", "zone-a", None, "4"),
            objects::service("default", "web", "10.96.0.90".parse().unwrap(), 80, "TCP", "http"),
            objects::slice("default", "web-1", "web", "http", BACKEND_PORT, "TCP", &endpoints),
        ],
    );
}

/// `(observations at or below `le` seconds, all observations)` of a histogram in the exposition.
fn histogram(metrics: &str, name: &str, le: &str) -> (u64, u64) {
    let value = |prefix: &str| {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{prefix} not in {metrics}"))
    };
    (value(&format!("{name}_bucket{{le=\"{le}\"}} ")), value(&format!("{name}_count ")))
}

#[test]
fn idle_connections_and_scrapes_do_not_slow_the_control_loop() {
    require_root!();
    let fx = Fixture::new(2);
    let file = fx.scratch().join("cluster.yaml");
    write(&fx, &file, 0);
    let mut agent = Agent::start(&AgentOptions::new(&file, "node-a", fx.cgroup.path(), fx.pins.path()));
    agent.wait_ready(Duration::from_secs(20));
    let http: SocketAddr = agent.http;
    let stop = Arc::new(AtomicBool::new(false));

    // The attacker: 1,000 connections that never send a request, reopened when closed.
    let attacker = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut held: Vec<Option<TcpStream>> = (0..IDLE).map(|_| None).collect();
            while !stop.load(Ordering::Relaxed) {
                for slot in &mut held {
                    let closed = slot.as_mut().is_none_or(|stream| {
                        let _ = stream.set_nonblocking(true);
                        matches!(stream.read(&mut [0u8; 1]), Ok(0))
                    });
                    if closed {
                        *slot = connect_from(ATTACKER, http).ok();
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Prometheus times fifty.
    let scrapes = Arc::new(AtomicU64::new(0));
    let scraper = {
        let (stop, scrapes) = (Arc::clone(&stop), Arc::clone(&scrapes));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let scraped = TcpStream::connect_timeout(&http, Duration::from_millis(200)).and_then(|mut stream| {
                    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
                    write!(stream, "GET /metrics HTTP/1.0\r\n\r\n")?;
                    let mut body = String::new();
                    stream.read_to_string(&mut body)?;
                    Ok(body.starts_with("HTTP/1.0 200"))
                });
                if scraped.unwrap_or(false) {
                    scrapes.fetch_add(1, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };

    let before =
        histogram(&agent.get("/metrics").expect("metrics").1, "topology_agent_event_to_kernel_seconds", "0.01");
    let started = Instant::now();
    let mut round = 0;
    while started.elapsed() < Duration::from_secs(10) {
        round += 1;
        write(&fx, &file, round);
        std::thread::sleep(Duration::from_millis(200));
    }
    // Evicted connections close as their tasks are dropped, a moment after the eviction: the median
    // of a few samples is the agent's steady count (without the limit it would be over 1,000).
    let mut samples: Vec<usize> = (0..5)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            std::fs::read_dir(format!("/proc/{}/fd", agent.pid())).expect("agent fds").count()
        })
        .collect();
    samples.sort_unstable();
    let fds = samples[samples.len() / 2];
    stop.store(true, Ordering::Relaxed);
    let _ = attacker.join();
    let _ = scraper.join();

    // Wait for the server to shed the attacker's connections, then read the histogram.
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        match agent.get("/metrics") {
            Ok((200, body)) => break body,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("no scrape after the attack: {other:?}"),
        }
    };
    let (fast, all) = histogram(&metrics, "topology_agent_event_to_kernel_seconds", "0.01");
    let (fast, all) = (fast - before.0, all - before.1);
    let events = all;
    eprintln!(
        "{events} syncs during the attack; {fast} of {all} within 10 ms; {} scrapes answered; {fds} agent descriptors",
        scrapes.load(Ordering::Relaxed)
    );
    assert!(events >= 25, "the file changes reached the kernel: {events}");
    // p99 below 10 ms: with about 50 events, every one within the 10 ms bucket. The run stays
    // under 64 changes on purpose: every 64th rewrite of one service-index position waits for an
    // RCU grace period in the control loop (docs/datapath.md), a cost of
    // the index, not of the HTTP surface this test is about.
    assert!(fast * 100 >= all * 99, "event-to-kernel p99 above 10 ms: {fast} of {all} within it");
    assert!(fds < 128 + 64, "the connection limit bounds the agent's descriptors: {fds}");
    // Idle connections are evicted for new ones: most scrapes (up to 500 in 10 s) get through.
    assert!(scrapes.load(Ordering::Relaxed) >= 250, "scrapes answered: {}", scrapes.load(Ordering::Relaxed));
}
