//! Root test of overload answered per connection: on a port under feedback with a per-connection
//! limit, the connect hook moves a connection off a backend with that many in flight from this
//! node to a reserve backend of the set (one the weighted draw never picks), through the real
//! kernel. Run single-threaded (`--test-threads=1`).
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use topology_dataplane::Dataplane;
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, PortOptions};
use topology_tests::{
    fixture::{Fixture, service},
    require_root,
};

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

/// Connections in flight from this node to `backend`, as the kernel counts them.
fn in_flight(dp: &Dataplane, backend: SocketAddr) -> u64 {
    dp.backend_load().expect("read the load map").iter().find(|m| m.backend == backend).map_or(0, |m| m.in_flight)
}

/// Waits up to 5 s for `backend` to have `count` connections in flight.
fn wait_in_flight(dp: &Dataplane, backend: SocketAddr, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while in_flight(dp, backend) != count {
        assert!(Instant::now() < deadline, "{backend}: {} in flight, not {count}", in_flight(dp, backend));
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_connection_past_the_limit_goes_to_a_lighter_reserve_backend() {
    require_root!();
    let fx = Fixture::new(2);
    let (near, reserve) = (&fx.backends[0], &fx.backends[1]);
    // The plan's set: the near backend, and a reserve one at the least weight (1 in 10^6 + 1).
    let backends = vec![near.weighted(false, 1_000_000), reserve.weighted(false, 1)];
    let spilling = PortOptions { measured: true, spill_at: 4, ..PortOptions::default() };
    let off = PortOptions { measured: true, ..PortOptions::default() };
    let mut desired = DesiredState::default();
    for (vip, options) in [("10.96.0.20", spilling), ("10.96.0.21", off)] {
        let set = DesiredService { name: format!("test/{vip}"), backends: backends.clone(), options };
        desired.services.insert(service(vip, 80, Protocol::Tcp), set.clone());
        // The holders also keep a UDP socket (the connect hooks measure no UDP).
        desired.services.insert(service(vip, 80, Protocol::Udp), set);
    }
    let mut dp = Dataplane::open(&fx.config()).expect("open dataplane");
    let report = dp.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed);

    // Under the limit the weighted draw stands: nothing reaches the reserve.
    let calm = fx.place().tcp(addr("10.96.0.20:80"), 200);
    assert_eq!((calm.successes(), calm.landed_on(&reserve.name)), (200, 0), "{calm:?}");

    // Eight connections held to the near backend (through the port without a limit, which shares
    // the backend's counters): past the limit of 4, a connection whose second draw is the reserve
    // (about one in two, with nothing in flight there) goes to it.
    let held: Vec<_> = (0..8).map(|_| fx.place().hold(addr("10.96.0.21:80"))).collect();
    wait_in_flight(&dp, near.socket(false), 8);
    let surge = fx.place().tcp(addr("10.96.0.20:80"), 200);
    assert_eq!(surge.successes(), 200, "{surge:?}");
    let moved = surge.landed_on(&reserve.name);
    assert!((50..=150).contains(&moved), "about half of 200 moved to the reserve: {moved}; {surge:?}");
    // The same load through the port without a limit: the weighted draw stands.
    let unlimited = fx.place().tcp(addr("10.96.0.21:80"), 200);
    assert_eq!((unlimited.successes(), unlimited.landed_on(&reserve.name)), (200, 0), "{unlimited:?}");

    // Released: back under the limit, back to the plan.
    for holder in held {
        assert_eq!(holder.check().failures(), 0);
    }
    wait_in_flight(&dp, near.socket(false), 0);
    let after = fx.place().tcp(addr("10.96.0.20:80"), 200);
    assert_eq!((after.successes(), after.landed_on(&reserve.name)), (200, 0), "{after:?}");
}
