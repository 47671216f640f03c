//! Root test of the service ranges: the connect hook looks a destination up only inside the
//! prefixes that cover the service ports, and the agent keeps them ahead of the ports it writes,
//! through the real kernel. Run single-threaded (`--test-threads=1`).
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::net::SocketAddr;

use aya::maps::{Array, HashMap, Map, MapData};
use topology_common::{ServiceKey4, ServiceRanges, ServiceValue, map_names};
use topology_dataplane::{Dataplane, IndexOrdering, PinLayout};
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState};
use topology_tests::{
    fixture::{Fixture, service},
    require_root,
};

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

fn open(layout: &PinLayout, name: &str) -> MapData {
    MapData::from_pin(layout.map(name)).unwrap_or_else(|e| panic!("open {name}: {e}"))
}

fn ranges(layout: &PinLayout) -> Array<MapData, ServiceRanges> {
    Array::try_from(Map::Array(open(layout, map_names::SERVICE_RANGES))).expect("ranges map")
}

#[test]
fn the_hook_looks_up_only_inside_the_ranges_and_the_agent_widens_them_first() {
    require_root!();
    let fx = Fixture::new(1);
    let set = DesiredService {
        name: "test/a".into(),
        backends: vec![fx.backends[0].weighted(false, 1)],
        ..Default::default()
    };
    let mut desired = DesiredState::default();
    desired.services.insert(service("10.96.0.10", 80, Protocol::Tcp), set.clone());
    // The index off: every lookup asks the hash map, where an entry can be written by hand.
    let mut config = fx.config();
    config.programs.index = IndexOrdering::Off;
    let mut dp = Dataplane::open(&config).expect("open dataplane");
    let report = dp.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let layout = PinLayout::new(fx.pins.path());
    let one = ranges(&layout).get(&0, 0).expect("read the ranges");
    assert_eq!(one.v4_mask, u32::MAX, "one ClusterIP: a full prefix: {one:?}");
    assert_eq!(fx.place().tcp(addr("10.96.0.10:80"), 20).successes(), 20);

    // An entry the hook would rewrite, written behind the agent's back outside the ranges: the
    // hook does not look it up, and the connection goes to the address as it is (no route here).
    let mut services: HashMap<MapData, ServiceKey4, ServiceValue> =
        HashMap::try_from(Map::HashMap(open(&layout, map_names::SERVICES_V4))).expect("services map");
    let key = |ip: [u8; 4]| ServiceKey4 { addr: ip, port: 80, proto: topology_common::IPPROTO_TCP, _pad: 0 };
    let value = services.get(&key([10, 96, 0, 10]), 0).expect("the agent's entry");
    services.insert(key([192, 168, 77, 1]), value, 0).expect("write an entry by hand");
    let outside = fx.place().tcp(addr("192.168.77.1:80"), 5);
    assert_eq!((outside.successes(), outside.errno("ENETUNREACH")), (0, 5), "{outside:?}");
    // The map no agent wrote (all zero) matches everything: the same entry is found.
    ranges(&layout).set(0, ServiceRanges::default(), 0).expect("clear the ranges");
    assert_eq!(fx.place().tcp(addr("192.168.77.1:80"), 5).successes(), 5);
    services.remove(&key([192, 168, 77, 1])).expect("remove the hand-written entry");

    // Ports far apart: the agent widens before it writes them, so each is found at once.
    desired.services.insert(service("172.20.0.5", 80, Protocol::Tcp), set.clone());
    desired.services.insert(service("10.100.1.1", 443, Protocol::Tcp), set.clone());
    let report = dp.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let wide = ranges(&layout).get(&0, 0).expect("read the ranges");
    assert_eq!(wide.v4_mask, 0, "10/8 and 172.20/16 share no prefix: every address is looked up: {wide:?}");
    for target in ["10.96.0.10:80", "172.20.0.5:80", "10.100.1.1:443"] {
        assert_eq!(fx.place().tcp(addr(target), 10).successes(), 10, "{target}");
    }

    // The far one leaves: narrowed back to what is left.
    desired.services.remove(&service("172.20.0.5", 80, Protocol::Tcp));
    let report = dp.apply(&desired);
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    let narrow = ranges(&layout).get(&0, 0).expect("read the ranges");
    assert_eq!(u32::from_be_bytes(narrow.v4_mask.to_ne_bytes()), 0xfff8_0000, "10.96.0.10 … 10.100.1.1: /13");
    for target in ["10.96.0.10:80", "10.100.1.1:443"] {
        assert_eq!(fx.place().tcp(addr(target), 10).successes(), 10, "{target}");
    }
}
