//! Per-socket state under pressure (root, real kernel): what a UDP socket needs to undo its
//! rewrite lives with the socket, so no number of other sockets can take it away; a TCP
//! connection's `getpeername()` translation lives in a direct-mapped table by socket cookie, which
//! holds it until about a table of newer sockets came. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::net::SocketAddr;

use topology_dataplane::Dataplane;
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, WeightedBackend};
use topology_tests::{
    fixture::{Fixture, service as service_port},
    net::ClientPlace,
    require_root,
    traffic::UdpMode,
};

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

/// One Service at `vip` port 80 with a TCP and a UDP port over `backends` (the holder holds both).
fn tcp_and_udp(vip: &str, name: &str, backends: Vec<WeightedBackend>) -> DesiredState {
    let mut state = DesiredState::default();
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        let service = DesiredService {
            name: format!("test/{name}:{protocol}"),
            backends: backends.clone(),
            ..Default::default()
        };
        state.services.insert(service_port(vip, 80, protocol), service);
    }
    state
}

#[test]
fn long_lived_sockets_keep_their_translation_through_300000_other_sockets() {
    require_root!();
    let fx = Fixture::new(3);
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let all = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    assert!(dp.apply(&tcp_and_udp("10.96.0.60", "held", all)).failed.is_empty());

    let vip = addr("10.96.0.60:80");
    let held = fx.place().hold(vip);
    // 300,000 other rewritten sockets: more than the 262,144 slots a direct-mapped table had.
    let connects = fx.place().timed_udp_connect(&[vip], 300_000);
    assert_eq!(connects.successes(), 300_000, "{:?}", connects.errors);
    // 100,000 other unconnected sockets sending to the service: more than a 65,536-entry LRU holds.
    let datagrams = fx.place().udp(vip, 100_000, UdpMode::Unconnected);
    assert_eq!((datagrams.failures(), datagrams.peer_mismatch), (0, 0), "{:?}", datagrams.errors);

    let report = held.check();
    assert_eq!(report.failures(), 0, "the held UDP sockets still get their replies: {report:?}");
    assert_eq!(report.successes(), 2, "{report:?}");
    assert_eq!(report.peer_mismatch, 0, "getpeername and recvfrom still show the ClusterIP: {report:?}");
    let node = dp.node_counters().expect("node counters");
    assert_eq!(node.no_storage, 0, "every rewrite got its socket storage");
}

#[test]
fn a_tcp_connection_shows_its_cluster_ip_until_about_a_table_of_newer_sockets_came() {
    require_root!();
    let fx = Fixture::new(3);
    let mut config = fx.config();
    // Two batches of socket cookies (the kernel hands each CPU 4,096 at a time).
    config.programs.capacities.tcp_connections = 8192;
    let mut dp = Dataplane::open(&config).expect("open dataplane");
    let all = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    assert!(dp.apply(&tcp_and_udp("10.96.0.61", "table", all)).failed.is_empty());
    let vip = addr("10.96.0.61:80");
    // One CPU: its cookies come in order, so the held connection's position comes round again
    // only after about a table of newer ones.
    let place = ClientPlace { cpu: Some(0), ..fx.place() };

    // Fewer than a batch of newer connections: the held one keeps its translation.
    let held = place.hold(vip);
    let others = place.tcp(vip, 3_000);
    assert_eq!((others.failures(), others.peer_mismatch), (0, 0), "{:?}", others.errors);
    let report = held.check();
    assert_eq!((report.failures(), report.peer_mismatch), (0, 0), "{report:?}");

    // Five tables of newer ones: its position was taken; it keeps working, only its getpeername()
    // shows the backend; every new connection still translates.
    let held = place.hold(vip);
    let others = place.tcp(vip, 40_000);
    assert_eq!((others.failures(), others.peer_mismatch), (0, 0), "{:?}", others.errors);
    let report = held.check();
    assert_eq!(report.failures(), 0, "{report:?}");
    assert_eq!(report.peer_mismatch, 1, "the TCP translation was overwritten, the UDP one kept: {report:?}");
    let node = dp.node_counters().expect("node counters");
    assert_eq!(node.no_storage, 0, "an array store never fails");
}

#[test]
fn a_late_reply_from_a_departed_backend_shows_its_own_address() {
    require_root!();
    let fx = Fixture::new(2);
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let vip = addr("10.96.0.62:80");
    let on = |backends: &[usize]| {
        tcp_and_udp("10.96.0.62", "late", backends.iter().map(|&b| fx.backends[b].weighted(false, 1)).collect())
    };
    assert!(dp.apply(&on(&[0])).failed.is_empty());
    // The holder's unconnected socket sent to the service (b0) and reads b0's reply only at the
    // check: by then b0 has left the set. kube-proxy flushes the conntrack entries of a departed
    // endpoint, so its late replies arrive untranslated; here too (the address may be reused).
    let held = fx.place().hold(vip);
    assert!(dp.apply(&on(&[1])).failed.is_empty());
    let report = held.check();
    assert_eq!(report.failures(), 0, "{report:?}");
    assert_eq!(report.peer_mismatch, 1, "only the unconnected socket's late reply shows b0: {report:?}");

    // While the backend stays in the set (a new set, b0 joining b1), replies keep the ClusterIP.
    let held = fx.place().hold(vip);
    assert!(dp.apply(&on(&[1, 0])).failed.is_empty());
    let report = held.check();
    assert_eq!((report.failures(), report.peer_mismatch), (0, 0), "{report:?}");
}

#[test]
fn a_udp_socket_connected_again_outside_the_services_shows_its_new_peer() {
    require_root!();
    let fx = Fixture::new(1);
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let backend = fx.backends[0].weighted(false, 1);
    assert!(dp.apply(&tcp_and_udp("10.96.0.63", "again", vec![backend])).failed.is_empty());
    // Connected to the ClusterIP (rewritten to b0), then to b0 itself: an address outside the
    // service ranges, which the connect hook passes at its first check. The socket's translation
    // must go with it, or getpeername() and b0's reply would still name the ClusterIP.
    let report = fx.place().udp_reconnect(addr("10.96.0.63:80"), fx.backends[0].socket(false));
    assert_eq!(report.successes(), 2, "{report:?}");
    assert_eq!(report.peer_mismatch, 0, "each connect's peer and reply source name what it dialled: {report:?}");
}
