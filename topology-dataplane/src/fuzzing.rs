//! Entry points for the fuzz targets: adoption of whatever the pinned maps hold.

use std::collections::HashMap;

use topology_common::{IndexEntry4, ServiceKey4, ServiceValue, Slot};

use super::{
    ids::{DenseIds, IdPool},
    index::Placement,
    slot_space::{Run, SlotSpace},
};

/// Adopts an index of `positions` holding `held`, to index `services`; once its changes are
/// published, every lookup a program could make must agree with `services`.
pub fn adopt_index(positions: u32, held: Vec<(u32, IndexEntry4)>, services: &HashMap<ServiceKey4, ServiceValue>) {
    let (mut placement, changed) = Placement::adopt(positions, held, services);
    placement.published_all(&changed);
    if let Err(error) = placement.check(services) {
        panic!("adoption broke the index invariant: {error}");
    }
}

/// Adopts slot runs `(base, len)` in a slots array of `capacity`: overlapping or out-of-range
/// runs are rejected, never trusted.
pub fn adopt_slots(capacity: u32, runs: &[(u32, u32)]) {
    let (space, rejected) =
        SlotSpace::adopt(capacity, runs.iter().enumerate().map(|(i, &(base, len))| (Run { base, len }, i)));
    assert!(space.live() <= u64::from(capacity), "more live slots than the array has");
    assert!(rejected.len() <= runs.len());
}

/// Id pools from ids read back from maps, then a few allocations.
pub fn adopt_ids(ids: &[u32], capacity: u32) {
    let mut dense = DenseIds::new(ids.iter().copied(), capacity);
    let mut sets = IdPool::new(ids.iter().copied().take(1024));
    for _ in 0..4 {
        if (dense.len() as u64) < u64::from(capacity) {
            let id = dense.allocate();
            assert!(id < capacity, "a service id at or beyond the capacity: {id}");
        }
        assert_ne!(sets.allocate(), 0);
    }
}

/// Reads a service entry's set from an arbitrary slot array, as adoption does, and rebuilds the
/// backends and their shares from it.
pub fn read_set(value: &ServiceValue, slots: &[topology_common::Slot]) {
    let capacity = u32::try_from(slots.len()).unwrap_or(u32::MAX);
    let set = super::state::set_slots(value, capacity, |index| Ok::<_, ()>(slots[index as usize]))
        .expect("reading from memory cannot fail");
    assert!(set.len() <= slots.len());
    let service = super::state::ProgrammedService::new(value, set, String::new(), Default::default());
    let _ = service.backends(true);
    let _ = service.backends(false);
}

/// Applies a sequence of desired states, decoded from `data`, to in-memory maps of small
/// capacities, with writes to one map failing and grace periods refused at the input's choice.
/// Around every hash map write the index must agree with the hash maps (what an agent killed
/// there leaves). After every apply the maps must be what the mirror says, runs disjoint, the
/// index in step with the service entries, every port not reported failed must hold the backends
/// asked for, and a failed port must hold nothing unless it is reported stranded (or only its
/// name failed).
pub fn apply(data: &[u8]) {
    use topology_model::Protocol;
    use topology_policy::desired::{DesiredService, DesiredState, Locality, PortOptions, ServicePort, WeightedBackend};

    let mut bytes = data.iter().copied();
    let mut next = move || bytes.next();
    let capacities = super::Capacities {
        services_v4: u32::from(next().unwrap_or(4) % 6 + 1),
        services_v6: u32::from(next().unwrap_or(4) % 6 + 1),
        slots: u32::from(next().unwrap_or(16) % 40 + 1),
        service_ids: u32::from(next().unwrap_or(8) % 12 + 1),
        client_affinity: 16,
        tcp_connections: 16,
    };
    let mut maps = super::memory::MemoryMaps::new(capacities);
    maps.audit = Some(Vec::new());
    let mut writer = super::writer::Writer::adopt(maps, super::KernelState::default()).expect("empty maps adopt");
    const FAILING: [Option<&str>; 8] = [
        None,
        None,
        Some(topology_common::map_names::SERVICE_RANGES),
        Some(topology_common::map_names::SLOTS),
        Some(topology_common::map_names::SERVICES_V4),
        Some(topology_common::map_names::SERVICES_V6),
        Some(topology_common::map_names::SERVICE_META),
        Some(topology_common::map_names::SERVICE_OPTIONS),
    ];
    while let Some(header) = next() {
        writer.maps_mut().failing = FAILING[usize::from(header % 8)];
        writer.maps_mut().grace.fail = header & 0x80 != 0;
        let mut desired = DesiredState::default();
        for _ in 0..next().unwrap_or(0) % 6 {
            let (Some(a), Some(b)) = (next(), next()) else { break };
            let v6 = a & 1 != 0;
            let vip: std::net::IpAddr = if v6 {
                [0xfd00, 0, 0, 0, 0, 0, 0, u16::from(a >> 1 & 3)].into()
            } else {
                [10, 96, 0, a >> 1 & 3].into()
            };
            let port = ServicePort {
                vip,
                port: 80 + u16::from(a >> 3 & 1),
                protocol: if a & 0x10 != 0 { Protocol::Udp } else { Protocol::Tcp },
            };
            let backends = (0..b % 6)
                .map_while(|_| next())
                .map(|c| WeightedBackend {
                    // One in 16 of the other family: refused, naming the backend.
                    addr: if (c & 0x0f == 0) != v6 {
                        [0xfd00, 0x244, 0, 0, 0, 0, 0, u16::from(c >> 4)].into()
                    } else {
                        [10, 244, 0, c >> 4].into()
                    },
                    port: 8080,
                    weight: u32::from(c >> 2 & 3) + 1,
                    locality: Locality::Zone,
                })
                .collect();
            let options = PortOptions { affinity_timeout_s: (b & 0x80 != 0).then_some(60), ..PortOptions::default() };
            // Two namespaces, so that full slots are shared out between them.
            let name = format!("ns-{}/svc-{}:{}", b >> 5 & 1, b >> 6 & 1, port.port);
            desired.services.insert(port, DesiredService { name, backends, options });
        }
        let report = writer.apply(&desired);
        let disagreements = writer.maps_mut().audit.as_mut().map(std::mem::take).unwrap_or_default();
        assert!(disagreements.is_empty(), "an agent killed mid-apply would leave: {disagreements:?}");
        check_mirror(&writer);
        let failed: std::collections::BTreeSet<_> = report.failed.iter().map(|(port, _)| *port).collect();
        let members = |port: &ServicePort| {
            let held = writer.kernel().services.get(port)?;
            let mut got: Vec<_> = held.backends(port.vip.is_ipv4()).iter().map(|b| (b.addr, b.port)).collect();
            got.sort();
            Some((got, held.options))
        };
        for (port, service) in &desired.services {
            let mut want: Vec<_> = service.backends.iter().map(|b| (b.addr, b.port)).collect();
            want.sort();
            want.dedup();
            let held = members(port);
            if !failed.contains(port) {
                assert_eq!(held, Some((want, service.options)), "{port} holds other than asked, and did not fail");
            } else if !report.stranded.contains(port) {
                let errors: Vec<String> =
                    report.failed.iter().filter(|(p, _)| p == port).map(|(_, e)| e.to_string()).collect();
                let want = (want, service.options);
                assert!(
                    held.as_ref().is_none_or(|held| *held == want),
                    "{port} failed ({errors:?}) and still holds {held:?}, not {want:?}, without being reported stranded"
                );
            }
        }
        let ranges = writer.maps().ranges;
        for port in writer.kernel().services.keys() {
            assert!(
                desired.services.contains_key(port) || report.stranded.contains(port),
                "{port} left behind without being reported stranded"
            );
            assert!(
                super::ranges::covers(&ranges, port.vip),
                "{port} is held but outside the service ranges {ranges:?}: the programs would pass it"
            );
        }
    }
}

/// The in-memory maps hold exactly what the writer's mirror says.
fn check_mirror(writer: &super::writer::Writer<super::memory::MemoryMaps>) {
    use super::ops::ServiceKey;

    let (maps, kernel) = (writer.maps(), writer.kernel());
    if let Err(error) = writer.verify_index() {
        panic!("{error}");
    }
    assert_eq!(maps.services4.len() + maps.services6.len(), kernel.services.len(), "entries the mirror does not know");
    let mut runs = Vec::new();
    for (port, held) in &kernel.services {
        let value = match ServiceKey::of(port) {
            ServiceKey::V4(key) => maps.services4.get(&key),
            ServiceKey::V6(key) => maps.services6.get(&key),
        };
        assert_eq!(value, Some(&held.value()), "{port}: the map's entry is not the mirror's");
        for (offset, slot) in held.slots.iter().enumerate() {
            let stored = maps.slots[held.base as usize + offset];
            assert_eq!(stored.set_id, held.set_id, "{port}: slot {offset} not tagged with the set");
            assert_eq!(Slot { set_id: 0, ..stored }, *slot, "{port}: slot {offset} differs from the mirror");
        }
        if held.count > 0 {
            runs.push((held.base, held.count));
        }
        let name = maps.names.get(&held.service_id).map(super::state::name_from_meta);
        assert_eq!(name.as_deref(), Some(held.name.as_str()), "{port}: name");
    }
    runs.sort_unstable();
    for pair in runs.windows(2) {
        assert!(pair[0].0 + pair[0].1 <= pair[1].0, "runs {pair:?} overlap");
    }
    let live: std::collections::BTreeSet<u32> = kernel.services.values().map(|s| s.service_id).collect();
    for id in maps.names.keys() {
        assert!(live.contains(id) || kernel.orphan_ids.contains(id), "name of service id {id} left behind");
    }
}
