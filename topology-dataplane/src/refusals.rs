//! The writer over in-memory maps when the kernel refuses: a failed write, a full map, a grace
//! period refused, a removal that fails. The golden scenarios (cluster files through the control
//! loop to map contents) are the agent's, under `topology-agent/testdata/scenarios/`.

use topology_common::map_names;
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, Locality, PortOptions, ServicePort, WeightedBackend};

use super::{
    Capacities, KernelState,
    memory::{MemoryMaps, held},
    writer::{Writer, verify_index},
};

fn web(backends: &[u8]) -> DesiredState {
    service_at("10.96.0.10", "default/web:http", backends)
}

/// One service port `vip:80/TCP` named `name`, drawing `10.244.0.<last>:8080` for each of `backends`.
fn service_at(vip: &str, name: &str, backends: &[u8]) -> DesiredState {
    let port = ServicePort { vip: vip.parse().unwrap(), port: 80, protocol: Protocol::Tcp };
    let backends = backends
        .iter()
        .map(|&last| WeightedBackend {
            addr: std::net::IpAddr::from([10, 244, 0, last]),
            port: 8080,
            weight: 1,
            locality: Locality::Zone,
        })
        .collect();
    let service = DesiredService { name: name.into(), backends, options: PortOptions::default() };
    DesiredState { services: [(port, service)].into() }
}

#[test]
fn a_failed_write_names_the_map_never_keeps_the_old_set_and_is_retried() {
    let port = ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 80, protocol: Protocol::Tcp };
    let mut changed = web(&[1, 2, 3]);
    for service in changed.services.values_mut() {
        service.name = "default/web:www".into();
        service.options.affinity_timeout_s = Some(10);
    }
    for map in [map_names::SLOTS, map_names::SERVICES_V4, map_names::SERVICE_META, map_names::SERVICE_OPTIONS] {
        let mut writer = Writer::adopt(MemoryMaps::new(Capacities::default()), KernelState::default()).unwrap();
        assert!(writer.apply(&web(&[1, 2])).failed.is_empty());
        writer.maps_mut().failing = Some(map);
        let report = writer.apply(&changed);
        assert_eq!(report.failed.len(), 1, "{map}");
        assert!(report.failed[0].1.to_string().contains(map), "{map}: {}", report.failed[0].1);
        match map {
            map_names::SLOTS | map_names::SERVICE_OPTIONS => {
                // The new set could not be written: the old one is withdrawn, so connections go
                // to the ClusterIP untouched (kube-proxy), never to backends the cluster moved.
                assert_eq!((report.withdrawn, report.stranded.len()), (1, 0), "{map}");
                assert!(writer.kernel().services.is_empty(), "{map}: the mirror follows the kernel");
                assert!(writer.maps().services4.is_empty(), "{map}: no entry left for the programs");
                assert!(report.departed.is_empty(), "{map}: backends still wanted have not departed");
            }
            map_names::SERVICES_V4 => {
                // Neither the new entry nor the deletion could be written: reported, not silent.
                assert_eq!((report.withdrawn, report.stranded.as_slice()), (0, [port].as_slice()), "{map}");
                assert_eq!(held(writer.kernel(), &port).len(), 2, "{map}: the mirror follows the kernel");
            }
            _ => {
                // Only the name failed: the new set and options are in.
                assert_eq!((report.withdrawn, report.stranded.len()), (0, 0), "{map}");
                assert_eq!(held(writer.kernel(), &port).len(), 3, "{map}");
            }
        }
        verify_index(writer.maps(), writer.kernel()).unwrap_or_else(|error| panic!("{map}: {error}"));
        writer.maps_mut().failing = None;
        let retried = writer.apply(&changed);
        assert!(retried.failed.is_empty(), "{map}: {:?}", retried.failed);
        let programmed = &writer.kernel().services[&port];
        assert_eq!((programmed.name.as_str(), programmed.options.affinity_timeout_s), ("default/web:www", Some(10)));
        assert_eq!(held(writer.kernel(), &port).len(), 3, "{map}");
        assert!(writer.apply(&changed).failed.is_empty());
        assert_eq!(writer.apply(&changed).unchanged, 1, "{map}: nothing left to do");
    }
}

#[test]
fn one_namespace_filling_the_slots_gives_room_back_to_another() {
    let victim = ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 80, protocol: Protocol::Tcp };
    let hog = ServicePort { vip: "10.96.9.9".parse().unwrap(), port: 80, protocol: Protocol::Tcp };
    let capacities = Capacities { slots: 16, ..Capacities::default() };
    let mut writer = Writer::adopt(MemoryMaps::new(capacities), KernelState::default()).unwrap();
    let mut desired = web(&[1, 2]);
    assert!(writer.apply(&desired).failed.is_empty());
    // Another tenant's Service takes every free slot.
    desired.services.extend(service_at("10.96.9.9", "tenant/hog:http", &(10..24).collect::<Vec<u8>>()).services);
    assert!(writer.apply(&desired).failed.is_empty());
    assert_eq!(writer.usage().slots, 16, "every slot is taken");
    // The victim's endpoints move: its namespace is within its share (8 of 16), the tenant's
    // over it, so the tenant's set is withdrawn (its port left to kube-proxy) and the victim's
    // new set written.
    let moved = web(&[3, 4]).services.remove(&victim).unwrap();
    desired.services.insert(victim, moved);
    let report = writer.apply(&desired);
    assert_eq!(report.failed.iter().map(|(port, _)| *port).collect::<Vec<_>>(), [hog]);
    let error = report.failed[0].1.to_string();
    assert!(error.contains("namespace tenant holds 14 of its entries, over an equal share of 8"), "{error}");
    assert_eq!(report.withdrawn, 1);
    assert_eq!(held(writer.kernel(), &victim).len(), 2, "the victim holds its new set");
    assert!(!writer.kernel().services.contains_key(&hog), "the hog holds nothing, never an old set");
    assert_eq!(
        report.departed.iter().map(|d| d.backend.to_string()).collect::<Vec<_>>(),
        ["10.244.0.1:8080", "10.244.0.2:8080"],
        "the victim's old backends left; the hog's are still wanted"
    );
    // The hog, over its share, takes nothing back from a namespace within its own.
    let again = writer.apply(&desired);
    assert_eq!(again.failed.iter().map(|(port, _)| *port).collect::<Vec<_>>(), [hog]);
    assert!(again.failed[0].1.to_string().contains(map_names::SLOTS), "{}", again.failed[0].1);
    assert_eq!(held(writer.kernel(), &victim).len(), 2);
    verify_index(writer.maps(), writer.kernel()).unwrap();
}

#[test]
fn without_a_grace_period_retired_slots_are_never_reused() {
    let capacities = Capacities { slots: 4, ..Capacities::default() };
    let mut writer = Writer::adopt(MemoryMaps::new(capacities), KernelState::default()).unwrap();
    assert!(writer.apply(&web(&[1, 2])).failed.is_empty());
    assert!(writer.apply(&web(&[3, 4])).failed.is_empty());
    writer.maps_mut().grace.fail = true;
    let report = writer.apply(&web(&[5, 6]));
    assert_eq!(report.failed.len(), 1);
    assert!(report.housekeeping.iter().any(|e| e.to_string().contains("grace period")), "{report:?}");
    // The run of the set replaced before, and the run of the set withdrawn for want of room.
    assert_eq!(writer.usage().slots_retired, 4, "retired runs stay retired");
    writer.maps_mut().grace.fail = false;
    let report = writer.apply(&web(&[5, 6]));
    assert!(report.failed.is_empty());
    assert_eq!(report.grace_periods, 1);
}

#[test]
fn a_removal_that_fails_leaves_the_port_where_the_programs_find_it() {
    // Found by the `apply` fuzz target: the index entry went before the hash map's delete failed,
    // and a later apply wanting the port back saw nothing to do.
    let mut writer = Writer::adopt(MemoryMaps::new(Capacities::default()), KernelState::default()).unwrap();
    assert!(writer.apply(&web(&[1, 2])).failed.is_empty());
    writer.maps_mut().failing = Some(map_names::SERVICES_V4);
    let report = writer.apply(&DesiredState::default());
    assert_eq!(report.failed.len(), 1);
    verify_index(writer.maps(), writer.kernel()).expect("the index still finds the port");
    writer.maps_mut().failing = None;
    assert_eq!(writer.apply(&web(&[1, 2])).unchanged, 1);
    verify_index(writer.maps(), writer.kernel()).expect("and keeps finding it");
}

/// `count` Services of two backends each, `10.96.x.y:80`.
fn many(count: u16) -> DesiredState {
    let services = (0..count)
        .map(|n| {
            let [hi, lo] = n.to_be_bytes();
            let port = ServicePort { vip: std::net::IpAddr::from([10, 96, hi, lo]), port: 80, protocol: Protocol::Tcp };
            let backends = (1..=2)
                .map(|last| WeightedBackend {
                    addr: std::net::IpAddr::from([10, 244, hi, lo.wrapping_add(last)]),
                    port: 8080,
                    weight: 1,
                    locality: Locality::Zone,
                })
                .collect();
            (port, DesiredService { name: format!("default/svc-{n}:http"), backends, options: PortOptions::default() })
        })
        .collect();
    DesiredState { services }
}

#[test]
fn many_new_ports_are_written_in_groups_and_a_full_map_fails_only_the_ports_beyond_it() {
    // 5,000 ports (three groups); room for the slots of 4,000.
    let capacities = Capacities { slots: 8000, ..Capacities::default() };
    let mut writer = Writer::adopt(MemoryMaps::new(capacities), KernelState::default()).unwrap();
    let report = writer.apply(&many(5000));
    assert_eq!((report.added, report.failed.len()), (4000, 1000));
    assert!(report.failed.iter().all(|(_, e)| e.to_string().contains(map_names::SLOTS)), "{:?}", report.failed[0]);
    assert_eq!(writer.kernel().services.len(), 4000, "the mirror holds what was written");
    assert_eq!(writer.usage().services_v4, 4000, "room counts only what was written");
    verify_index(writer.maps(), writer.kernel()).expect("every written port in the index");

    // A map refusing every write: each port of the group fails on its own and leaves nothing.
    let mut writer = Writer::adopt(MemoryMaps::new(Capacities::default()), KernelState::default()).unwrap();
    writer.maps_mut().failing = Some(map_names::SERVICE_META);
    let report = writer.apply(&many(3000));
    assert_eq!((report.added, report.failed.len()), (0, 3000));
    assert_eq!((writer.usage().slots, writer.usage().service_ids, writer.usage().services_v4), (0, 0, 0));
    writer.maps_mut().failing = None;
    let report = writer.apply(&many(3000));
    assert_eq!((report.added, report.failed.len(), report.slots_written), (3000, 0, 6000));
    verify_index(writer.maps(), writer.kernel()).expect("every port in the index");
    assert_eq!(writer.apply(&many(3000)).unchanged, 3000);
}
