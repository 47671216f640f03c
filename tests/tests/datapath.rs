//! Root integration tests of the datapath: real programs attached to a test-made cgroup, clients
//! and backends in test-made network namespaces. Run single-threaded (`--test-threads=1`).
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use topology_dataplane::Dataplane;
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState};
use topology_tests::{
    fixture::{BACKEND_PORT, Fixture, service},
    require_root,
    traffic::UdpMode,
};

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

/// Opens a dataplane for `fx` and programs one service port over all its backends (equal weights).
fn program_all(fx: &Fixture, vip: &str, port: u16, protocol: Protocol, ipv6: bool) -> Dataplane {
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let backends = fx.backends.iter().map(|b| b.weighted(ipv6, 1)).collect();
    let report = dp.apply(&Fixture::one_service(service(vip, port, protocol), backends));
    assert!(report.failed.is_empty(), "{:?}; housekeeping: {:?}", report.failed, report.housekeeping);
    assert_eq!(report.added, 1);
    dp
}

#[test]
fn tcp_ipv4_lands_on_every_backend_and_getpeername_shows_the_cluster_ip() {
    require_root!();
    let fx = Fixture::new(3);
    let _dp = program_all(&fx, "10.96.0.10", 80, Protocol::Tcp, false);
    let result = fx.place().tcp(addr("10.96.0.10:80"), 300);
    assert_eq!(result.failures(), 0, "{result:?}");
    assert_eq!(result.peer_mismatch, 0, "getpeername must return the ClusterIP: {result:?}");
    for backend in &fx.backends {
        assert!(result.landed_on(&backend.name) > 30, "{result:?}");
    }
}

#[test]
fn tcp_ipv6_lands_on_backends() {
    require_root!();
    let fx = Fixture::new(2);
    let _dp = program_all(&fx, "fd00:96::10", 80, Protocol::Tcp, true);
    let result = fx.place().tcp(addr("[fd00:96::10]:80"), 200);
    assert_eq!(result.failures(), 0, "{result:?}");
    assert_eq!(result.peer_mismatch, 0, "{result:?}");
    assert_eq!(result.successes(), 200);
    assert!(fx.backends.iter().all(|b| result.landed_on(&b.name) > 20), "{result:?}");
}

#[test]
fn tcp_ipv4_mapped_from_an_ipv6_socket() {
    require_root!();
    let fx = Fixture::new(2);
    let _dp = program_all(&fx, "10.96.0.10", 80, Protocol::Tcp, false);
    // An AF_INET6 socket dialling ::ffff:10.96.0.10 reaches the IPv4 service; getpeername returns
    // the mapped ClusterIP.
    let result = fx.place().tcp(addr("[::ffff:10.96.0.10]:80"), 200);
    assert_eq!(result.failures(), 0, "{result:?}");
    assert_eq!(result.peer_mismatch, 0, "{result:?}");
    assert!(fx.backends.iter().all(|b| result.landed_on(&b.name) > 20), "{result:?}");
}

#[test]
fn unconnected_udp_replies_come_from_the_cluster_ip() {
    require_root!();
    let fx = Fixture::new(3);
    let _dp = program_all(&fx, "10.96.0.53", 53, Protocol::Udp, false);
    let result = fx.place().udp(addr("10.96.0.53:53"), 300, UdpMode::Unconnected);
    assert_eq!(result.failures(), 0, "{result:?}");
    assert_eq!(result.peer_mismatch, 0, "recvfrom must report the ClusterIP: {result:?}");
    assert!(fx.backends.iter().all(|b| result.landed_on(&b.name) > 30), "{result:?}");
}

#[test]
fn unconnected_udp_ipv6_and_ipv4_mapped() {
    require_root!();
    let fx = Fixture::new(2);
    let _dp6 = program_all(&fx, "fd00:96::53", 53, Protocol::Udp, true);
    let result = fx.place().udp(addr("[fd00:96::53]:53"), 100, UdpMode::Unconnected);
    assert_eq!((result.failures(), result.peer_mismatch), (0, 0), "{result:?}");

    let mut dp = _dp6;
    let backends = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    let mut desired = Fixture::one_service(service("10.96.0.53", 53, Protocol::Udp), backends);
    let v6 = fx.backends.iter().map(|b| b.weighted(true, 1)).collect();
    desired.services.insert(
        service("fd00:96::53", 53, Protocol::Udp),
        DesiredService { name: "v6".into(), backends: v6, ..Default::default() },
    );
    assert!(dp.apply(&desired).failed.is_empty());
    let mapped = fx.place().udp(addr("[::ffff:10.96.0.53]:53"), 100, UdpMode::Unconnected);
    assert_eq!((mapped.failures(), mapped.peer_mismatch), (0, 0), "{mapped:?}");
    assert_eq!(mapped.successes(), 100);
}

#[test]
fn a_udp_socket_keeps_its_backend() {
    require_root!();
    let fx = Fixture::new(3);
    let _dp = program_all(&fx, "10.96.0.53", 53, Protocol::Udp, false);
    for _ in 0..3 {
        let result = fx.place().udp(addr("10.96.0.53:53"), 50, UdpMode::SameSocket);
        assert_eq!(result.failures(), 0, "{result:?}");
        assert_eq!(result.landed.len(), 1, "one socket, one backend: {result:?}");
        assert_eq!(result.peer_mismatch, 0);
    }
}

#[test]
fn connected_udp_is_rewritten_and_getpeername_shows_the_cluster_ip() {
    require_root!();
    let fx = Fixture::new(2);
    let _dp = program_all(&fx, "10.96.0.53", 53, Protocol::Udp, false);
    let result = fx.place().udp(addr("10.96.0.53:53"), 200, UdpMode::Connected);
    assert_eq!(result.failures(), 0, "{result:?}");
    assert_eq!(result.peer_mismatch, 0, "{result:?}");
    assert!(fx.backends.iter().all(|b| result.landed_on(&b.name) > 20), "{result:?}");
}

#[test]
fn an_empty_set_refuses_tcp_and_udp() {
    require_root!();
    let fx = Fixture::new(1);
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let mut desired = DesiredState::default();
    for (vip, protocol) in
        [("10.96.0.20", Protocol::Tcp), ("10.96.0.20", Protocol::Udp), ("fd00:96::20", Protocol::Tcp)]
    {
        desired.services.insert(
            service(vip, 80, protocol),
            DesiredService { name: "refused".into(), backends: vec![], ..Default::default() },
        );
    }
    assert!(dp.apply(&desired).failed.is_empty());

    let tcp = fx.place().tcp(addr("10.96.0.20:80"), 20);
    assert_eq!(tcp.errno("ECONNREFUSED"), 20, "{tcp:?}");
    let tcp6 = fx.place().tcp(addr("[fd00:96::20]:80"), 20);
    assert_eq!(tcp6.errno("ECONNREFUSED"), 20, "{tcp6:?}");
    let udp = fx.place().udp(addr("10.96.0.20:80"), 20, UdpMode::Unconnected);
    assert_eq!(udp.errno("ECONNREFUSED"), 20, "sendto must fail, not time out: {udp:?}");
    let connected = fx.place().udp(addr("10.96.0.20:80"), 20, UdpMode::Connected);
    assert_eq!(connected.errno("ECONNREFUSED"), 20, "{connected:?}");

    let counters = dp.counters().expect("counters");
    let refused: u64 = counters.values().map(|c| c.refused).sum();
    assert_eq!(refused, 80, "the kernel counts every refusal: {counters:?}");
}

#[test]
fn destinations_that_are_not_service_ports_pass_untouched() {
    require_root!();
    let fx = Fixture::new(2);
    let _dp = program_all(&fx, "10.96.0.10", 80, Protocol::Tcp, false);
    // A backend dialled directly lands on that backend.
    let direct = fx.backends[1].socket(false);
    let result = fx.place().tcp(direct, 20);
    assert_eq!(result.landed_on("b1"), 20, "{result:?}");
    // The ClusterIP on another port, or with UDP, is not a service port: it is not rewritten and,
    // with no route to 10.96.0.0/16, fails with ENETUNREACH.
    let other_port = fx.place().tcp(addr("10.96.0.10:81"), 5);
    assert_eq!(other_port.errno("ENETUNREACH"), 5, "{other_port:?}");
    let other_protocol = fx.place().udp(addr("10.96.0.10:80"), 5, UdpMode::Unconnected);
    assert_eq!(other_protocol.errno("ENETUNREACH"), 5, "{other_protocol:?}");
}

#[test]
fn weighted_choice_follows_the_weights_over_20000_connects() {
    require_root!();
    let fx = Fixture::new(4);
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let weights = [1u32, 2, 3, 4];
    let backends = fx.backends.iter().zip(weights).map(|(b, w)| b.weighted(false, w)).collect();
    assert!(dp.apply(&Fixture::one_service(service("10.96.0.30", 80, Protocol::Tcp), backends)).failed.is_empty());

    let result = fx.place().tcp(addr("10.96.0.30:80"), 20_000);
    assert_eq!(result.failures(), 0, "{result:?}");
    let total: u32 = weights.iter().sum();
    for (backend, weight) in fx.backends.iter().zip(weights) {
        let share = result.landed_on(&backend.name) as f64 / 20_000.0;
        let expected = f64::from(weight) / f64::from(total);
        assert!((share - expected).abs() <= 0.02, "{}: share {share:.4}, weight {expected:.4}", backend.name);
    }
    let counters = dp.counters().expect("counters");
    let rewritten: u64 = counters.values().map(|c| c.rewritten.iter().sum::<u64>()).sum();
    assert_eq!(rewritten, 20_000, "every rewrite is counted (locality zone): {counters:?}");
}

#[test]
fn counters_span_chunks_survive_a_restart_and_start_at_zero_for_a_reused_id() {
    require_root!();
    let fx = Fixture::new(2);
    let backends: Vec<_> = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    // 1,100 service ports: ids 0..1100, so the counters need a second chunk (1,024 ids each).
    let mut desired = DesiredState::default();
    for index in 0..1_100u32 {
        let port = service(&format!("10.96.{}.{}", index / 250, index % 250 + 1), 80, Protocol::Tcp);
        desired.services.insert(
            port,
            DesiredService { name: format!("test/svc-{index}"), backends: backends.clone(), ..Default::default() },
        );
    }
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    assert!(dp.apply(&desired).failed.is_empty());
    assert_eq!(dp.batch_refusals(), 0, "both chunks were published in one batched update");
    let (port, id) = dp
        .kernel()
        .services
        .iter()
        .map(|(port, programmed)| (*port, programmed.service_id))
        .max_by_key(|(_, id)| *id)
        .expect("services");
    assert!(id >= 1_024, "the last id ({id}) lies in the second chunk");
    let target = SocketAddr::new(port.vip, port.port);
    let rewritten = |dp: &Dataplane, id: u32| -> u64 { dp.counters().expect("counters")[&id].rewritten.iter().sum() };

    assert_eq!(fx.place().tcp(target, 10).failures(), 0);
    assert_eq!(rewritten(&dp, id), 10, "counted in the second chunk");
    drop(dp);
    let mut dp = Dataplane::open(&fx.config()).expect("restart");
    assert_eq!(rewritten(&dp, id), 10, "a restarted agent reads the chunks the maps hold");
    assert_eq!(fx.place().tcp(target, 5).failures(), 0);
    assert_eq!(rewritten(&dp, id), 15, "the new programs count into the same chunks");

    // Replace that service port with another: it takes the freed id, counting from zero.
    desired.services.remove(&port);
    let newcomer = service("10.96.9.9", 80, Protocol::Tcp);
    desired.services.insert(newcomer, DesiredService { name: "test/newcomer".into(), backends, ..Default::default() });
    let report = dp.apply(&desired);
    assert!(report.failed.is_empty() && report.added == 1 && report.removed == 1, "{report:?}");
    assert_eq!(dp.kernel().services[&newcomer].service_id, id, "the lowest free id is reused");
    assert_eq!(rewritten(&dp, id), 0, "a reused id's counters start at zero");
    assert_eq!(fx.place().tcp(addr("10.96.9.9:80"), 3).failures(), 0);
    assert_eq!(rewritten(&dp, id), 3);
}

#[test]
fn a_thousand_swaps_under_load_fail_no_connection() {
    require_root!();
    let fx = Fixture::new(3);
    // Room for three sets of two: the writer must wait for a grace period and reuse retired runs
    // every other swap, while the client connects.
    let mut config = fx.config();
    config.programs.capacities.slots = 6;
    let mut dp = Dataplane::open(&config).expect("open dataplane");
    let port = service("10.96.0.40", 80, Protocol::Tcp);
    let sets: Vec<DesiredState> = (0..3)
        .map(|i| {
            // Rotate through {b0,b1}, {b1,b2}, {b2,b0} with changing weights.
            let pair = [&fx.backends[i], &fx.backends[(i + 1) % 3]];
            Fixture::one_service(port, pair.iter().enumerate().map(|(j, b)| b.weighted(false, 1 + j as u32)).collect())
        })
        .collect();
    assert!(dp.apply(&sets[0]).failed.is_empty());

    let client = fx.place().spawn_loop(addr("10.96.0.40:80"), &fx.scratch(), Duration::from_secs(60), false);
    let (mut swaps, mut grace_periods, mut waited) = (0, 0, Duration::ZERO);
    for round in 1..=1000 {
        let report = dp.apply(&sets[round % 3]);
        assert!(report.failed.is_empty(), "{:?}", report.failed);
        swaps += report.updated;
        grace_periods += report.grace_periods;
        waited += report.grace_wait;
        // Spread the swaps over ~0.3 s so thousands of connects interleave with them.
        std::thread::sleep(Duration::from_micros(300));
    }
    let result = client.finish();
    let mean = waited / grace_periods.max(1) as u32;
    eprintln!("swaps under load ({grace_periods} grace periods, {mean:?} each): {result:?}");
    assert_eq!(swaps, 1000);
    assert!(grace_periods >= 400, "retired runs were reused: {grace_periods} grace periods");
    // A map-in-map update that returns at once (a couple of µs) would mean the kernel did not
    // wait for synchronize_rcu(); a real grace period takes far longer.
    assert!(mean >= Duration::from_micros(20), "the kernel really waited: {mean:?} per grace period");
    assert_eq!(result.failures(), 0, "no connection may fail during swaps: {result:?}");
    assert!(result.attempts > 1000, "the client must have been connecting throughout: {result:?}");
    assert_eq!(dp.kernel().slot_entries(), 2, "one live set");
    assert_eq!(dp.usage().slots, 2);
}

#[test]
fn grace_periods_for_a_churned_service_pass_in_the_background() {
    require_root!();
    let fx = Fixture::new(3);
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let port = service("10.96.0.41", 80, Protocol::Tcp);
    let sets: Vec<DesiredState> = (0..3)
        .map(|i| {
            let pair = [&fx.backends[i], &fx.backends[(i + 1) % 3]];
            Fixture::one_service(port, pair.iter().map(|b| b.weighted(false, 1)).collect())
        })
        .collect();
    assert!(dp.apply(&sets[0]).failed.is_empty());
    let client = fx.place().spawn_loop(addr("10.96.0.41:80"), &fx.scratch(), Duration::from_secs(60), false);
    // Every swap rewrites the Service's index position; a program inside one lookup must never
    // see 64 of them, so a grace period must pass every few dozen — in the background, about as
    // often as a busy control loop writes one Service (a swap every 2 ms).
    let started = Instant::now();
    for round in 1..=1000 {
        assert!(dp.apply(&sets[round % 3]).failed.is_empty());
        std::thread::sleep(Duration::from_millis(2));
    }
    let elapsed = started.elapsed();
    let result = client.finish();
    let grace = dp.grace_periods();
    eprintln!("1000 swaps in {elapsed:?}: grace periods {grace:?}; {result:?}");
    assert_eq!(result.failures(), 0, "no connection may fail during swaps: {result:?}");
    assert!(grace.begun >= 1000 / 64, "periods were begun: {grace:?}");
    assert!(grace.passed + 1 >= grace.begun, "they passed: {grace:?}");
    assert!(grace.waited < grace.begun / 4, "the writer rarely waited itself: {grace:?}");
}

#[test]
fn bpftool_dumps_maps_with_field_names() {
    require_root!();
    let fx = Fixture::new(1);
    // A small slots array: `dump` prints every entry of an array, used or not.
    let mut config = fx.config();
    config.programs.capacities.slots = 8;
    let mut dp = Dataplane::open(&config).expect("open dataplane");
    let backends = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    assert!(dp.apply(&Fixture::one_service(service("10.96.0.10", 80, Protocol::Tcp), backends)).failed.is_empty());
    let maps = fx.pins.path().join("maps");
    let dump =
        topology_tests::sandbox::run("bpftool", &["map", "dump", "pinned", &maps.join("topo_svc4").to_string_lossy()]);
    for field in ["\"addr\"", "\"port\"", "\"proto\"", "\"service_id\"", "\"set_id\"", "\"count\"", "\"base\""] {
        assert!(dump.contains(field), "bpftool output lacks {field}: {dump}");
    }
    let slots =
        topology_tests::sandbox::run("bpftool", &["map", "dump", "pinned", &maps.join("topo_slots").to_string_lossy()]);
    assert!(
        slots.contains("\"set_id\"")
            && slots.contains("\"threshold\"")
            && slots.contains("\"primary\"")
            && slots.contains("\"locality\""),
        "{slots}"
    );
    assert!(slots.contains(&format!("\"port\": {BACKEND_PORT}")), "ports are stored in host order: {slots}");
}
