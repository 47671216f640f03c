//! The service index under every ordering the agent can load (root, real kernel): plain loads,
//! BPF load-acquire (the object for weakly ordered CPUs, forced here on x86-64), and the index
//! turned off. Each agrees with the hash maps through churn, restarts and upgrades, and only the
//! ones with the index on read it. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::net::SocketAddr;

use topology_common::{IndexEntry4, ServiceKey4, ServiceValue, index, map_names};
use topology_dataplane::{Dataplane, Flavour, IndexOrdering};
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState};
use topology_tests::{
    fixture::{Fixture, service},
    require_root,
};

/// Every ordering, each forced.
const ORDERINGS: [IndexOrdering; 3] = [IndexOrdering::Plain, IndexOrdering::Acquire, IndexOrdering::Off];

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

/// The object and index use an ordering must load on this kernel (6.18 has load-acquire).
fn expected(ordering: IndexOrdering) -> Flavour {
    match ordering {
        IndexOrdering::Acquire => Flavour { object: "topology-acquire", index: true },
        IndexOrdering::Off => Flavour { object: "topology", index: false },
        _ => Flavour { object: "topology", index: true },
    }
}

/// The position of `key` in the pinned IPv4 index of `fx`, if placed.
fn index_position(index: &aya::maps::Array<aya::maps::MapData, IndexEntry4>, key: &ServiceKey4) -> Option<u32> {
    let mask = index.len() - 1;
    (0..index::MAX_PROBE).map(|step| key.index_hash().wrapping_add(step) & mask).find(|&position| {
        let entry = index.get(&position, 0).expect("read index");
        entry.state == index::USED && entry.key == *key
    })
}

#[test]
fn the_service_index_agrees_with_the_hash_map_through_churn_restarts_and_upgrades() {
    require_root!();
    for ordering in ORDERINGS {
        churn_restart_upgrade(ordering);
    }
}

fn churn_restart_upgrade(ordering: IndexOrdering) {
    let fx = Fixture::new(2);
    // Up to 16 service ports per family in 32 positions, nine of the IPv4 ones with the same
    // home: one overflows its window, and removals leave tombstones.
    let mut config = fx.config();
    config.programs.index = ordering;
    config.programs.capacities.services_v4 = 16;
    config.programs.capacities.services_v6 = 16;
    let key = |i: u32| ServiceKey4 { addr: [10, 96, 1 + (i >> 8) as u8, i as u8], port: 80, proto: 6, _pad: 0 };
    let home = key(1).index_hash() & 31;
    let mut pool: Vec<ServiceKey4> = (1..).map(key).filter(|k| k.index_hash() & 31 == home).take(9).collect();
    let others: Vec<ServiceKey4> = (1..).map(key).filter(|k| k.index_hash() & 31 != home).take(7).collect();
    pool.extend(others);
    let backends: Vec<_> = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    let backends6: Vec<_> = fx.backends.iter().map(|b| b.weighted(true, 1)).collect();
    let desired = |vips: std::ops::Range<usize>| {
        let mut desired = DesiredState::default();
        for i in vips {
            let v4 = std::net::Ipv4Addr::from(pool[i].addr).to_string();
            for (vip, set) in [(v4, &backends), (format!("fd00:96::1:{i}"), &backends6)] {
                let port = service(&vip, 80, Protocol::Tcp);
                desired.services.insert(
                    port,
                    DesiredService { name: format!("test/svc-{i}"), backends: set.clone(), ..Default::default() },
                );
            }
        }
        desired
    };
    let reach_all = |dp: &Dataplane| {
        dp.verify_index().expect("index agrees with the service entries");
        for port in dp.kernel().services.keys() {
            let result = fx.place().tcp(SocketAddr::new(port.vip, port.port), 3);
            assert_eq!(result.failures(), 0, "{port:?}: {result:?}");
        }
    };
    let mut dp = Dataplane::open(&config).expect("open dataplane");
    assert_eq!(dp.flavour(), expected(ordering), "{ordering:?}");
    for vips in [0..9, 1..15, 5..16, 10..12, 0..16, 3..9] {
        let report = dp.apply(&desired(vips.clone()));
        assert!(report.failed.is_empty() && report.housekeeping.is_empty(), "{vips:?}: {report:?}");
        reach_all(&dp);
    }
    // A restarted agent adopts the index as it is.
    drop(dp);
    let dp = Dataplane::open(&config).expect("restart");
    reach_all(&dp);
    // An agent upgraded from a version without the index builds it before attaching.
    drop(dp);
    for name in [map_names::INDEX_V4, map_names::INDEX_V6] {
        std::fs::remove_file(fx.pins.path().join("maps").join(name)).expect("unpin the index");
    }
    let dp = Dataplane::open(&config).expect("upgrade");
    reach_all(&dp);
}

#[test]
fn the_programs_trust_an_index_position_only_when_its_seq_is_even_and_the_index_is_on() {
    require_root!();
    for ordering in ORDERINGS {
        seq_is_trusted_only_when_even(ordering);
    }
}

fn seq_is_trusted_only_when_even(ordering: IndexOrdering) {
    let fx = Fixture::new(2);
    let mut config = fx.config();
    config.programs.index = ordering;
    let mut dp = Dataplane::open(&config).expect("open dataplane");
    let backends = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    assert!(dp.apply(&Fixture::one_service(service("10.96.0.50", 80, Protocol::Tcp), backends)).failed.is_empty());
    let key = ServiceKey4 { addr: [10, 96, 0, 50], port: 80, proto: 6, _pad: 0 };
    let pin = fx.pins.path().join("maps").join(map_names::INDEX_V4);
    let map = aya::maps::MapData::from_pin(&pin).expect("open the pinned index");
    let mut index: aya::maps::Array<_, IndexEntry4> =
        aya::maps::Map::Array(map).try_into().expect("the index is an array");
    let position = index_position(&index, &key).expect("the service is in the index");
    let good = index.get(&position, 0).expect("read index");

    // An entry for an empty set, as a half-written position (odd seq): the programs ask the
    // hash map, which still has the backends.
    let empty = ServiceValue { count: 0, set_id: 0, ..good.value };
    let torn = IndexEntry4 { seq: good.seq.wrapping_add(1), value: empty, ..good };
    index.set(position, torn, 0).expect("write index");
    let result = fx.place().tcp(addr("10.96.0.50:80"), 20);
    assert_eq!(result.failures(), 0, "a half-written position is not trusted: {result:?}");

    // The same entry, finished (even seq): the programs take it without asking the hash map.
    let finished = IndexEntry4 { seq: good.seq.wrapping_add(2), ..torn };
    index.set(position, finished, 0).expect("write index");
    let result = fx.place().tcp(addr("10.96.0.50:80"), 5);
    if expected(ordering).index {
        assert_eq!(
            result.errno("ECONNREFUSED"),
            5,
            "{ordering:?}: the index entry is what the programs use: {result:?}"
        );
    } else {
        assert_eq!(result.failures(), 0, "{ordering:?}: with the index off, only the hash map counts: {result:?}");
    }
    index.set(position, IndexEntry4 { seq: good.seq.wrapping_add(4), ..good }, 0).expect("write index");
    assert_eq!(fx.place().tcp(addr("10.96.0.50:80"), 5).failures(), 0);
}
