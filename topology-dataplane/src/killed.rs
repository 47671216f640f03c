//! What an agent killed in the middle of an apply leaves: the in-memory maps check the index
//! against the hash maps just before and just after every hash map write
//! ([`MemoryMaps::audit`]) — the moments a SIGKILL between two system calls leaves them in —
//! through adds, swaps, removals and refused writes, in both families. The soak
//! (`tests/tests/soak.rs`) kills a real agent at random moments; this visits every one.

use std::net::IpAddr;

use topology_common::map_names;
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, Locality, PortOptions, ServicePort, WeightedBackend};

use super::{Capacities, KernelState, memory::MemoryMaps, writer::Writer};

/// A writer over empty maps that audit every hash map write.
fn audited(capacities: Capacities) -> Writer<MemoryMaps> {
    let mut maps = MemoryMaps::new(capacities);
    maps.audit = Some(Vec::new());
    Writer::adopt(maps, KernelState::default()).expect("empty maps adopt")
}

/// The first disagreements found since last asked, and how many there were.
fn disagreements(writer: &mut Writer<MemoryMaps>) -> (usize, Vec<String>) {
    let mut found = writer.maps_mut().audit.as_mut().map(std::mem::take).unwrap_or_default();
    let count = found.len();
    found.truncate(3);
    (count, found)
}

/// Service ports `which` of both families, each drawing backends `first..first + count`.
fn ports(which: impl IntoIterator<Item = u8>, first: u8, count: u8) -> DesiredState {
    let services = which
        .into_iter()
        .flat_map(|n| {
            let v4: IpAddr = [10, 96, 1, n].into();
            let v6: IpAddr = [0xfd00, 0x96, 0, 0, 0, 0, 1, u16::from(n)].into();
            [v4, v6].map(|vip| {
                let backends = (first..first.saturating_add(count))
                    .map(|last| WeightedBackend {
                        addr: if vip.is_ipv4() {
                            [10, 244, n, last].into()
                        } else {
                            [0xfd00, 0x244, 0, 0, 0, 0, u16::from(n), u16::from(last)].into()
                        },
                        port: 8080,
                        weight: 1,
                        locality: Locality::Zone,
                    })
                    .collect();
                let port = ServicePort { vip, port: 80, protocol: Protocol::Tcp };
                let name = format!("default/svc-{n}:http");
                (port, DesiredService { name, backends, options: PortOptions::default() })
            })
        })
        .collect();
    DesiredState { services }
}

#[test]
fn every_hash_map_write_of_adds_swaps_and_removals_leaves_the_index_agreeing() {
    // Small maps, so keys collide in the index, tombstones are left and reused.
    let capacities = Capacities { services_v4: 16, services_v6: 16, slots: 256, ..Capacities::default() };
    let mut writer = audited(capacities);
    let steps = [
        ("a full sync", ports(0..12, 1, 3)),
        ("every set swapped", ports(0..12, 4, 2)),
        ("half removed", ports(0..6, 4, 2)),
        ("some added back, the rest swapped", ports(0..9, 1, 4)),
        ("sets emptied", ports(0..9, 1, 0)),
        ("and filled again", ports(3..12, 2, 3)),
        ("everything removed", DesiredState::default()),
    ];
    for (step, desired) in steps {
        let report = writer.apply(&desired);
        assert!(report.failed.is_empty(), "{step}: {:?}", report.failed);
        assert_eq!(disagreements(&mut writer), (0, Vec::new()), "{step}");
        writer.verify_index().unwrap_or_else(|error| panic!("{step}, at rest: {error}"));
    }
    assert!(writer.maps().services4.is_empty() && writer.maps().services6.is_empty());
}

#[test]
fn every_hash_map_write_of_a_refused_apply_leaves_the_index_agreeing() {
    for failing in [
        map_names::SERVICES_V4,
        map_names::SERVICES_V6,
        map_names::SLOTS,
        map_names::SERVICE_META,
        map_names::SERVICE_OPTIONS,
    ] {
        let mut writer = audited(Capacities::default());
        assert!(writer.apply(&ports(0..4, 1, 2)).failed.is_empty());
        writer.maps_mut().failing = Some(failing);
        // Swaps, a removal and new ports (a refused batch, redone port by port), all refused.
        let report = writer.apply(&ports(1..8, 3, 2));
        assert!(!report.failed.is_empty(), "{failing}: nothing failed");
        assert_eq!(disagreements(&mut writer), (0, Vec::new()), "{failing}");
        writer.verify_index().unwrap_or_else(|error| panic!("{failing}, at rest: {error}"));
        writer.maps_mut().failing = None;
        let report = writer.apply(&ports(1..8, 3, 2));
        assert!(report.failed.is_empty(), "{failing}, retried: {:?}", report.failed);
        assert_eq!(disagreements(&mut writer), (0, Vec::new()), "{failing}, retried");
    }
}
