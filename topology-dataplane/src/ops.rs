//! The map operations the writer needs, as a small trait: the aya implementation over the
//! kernel's maps ([`MapSet`]), and an in-memory one ([`super::memory::MemoryMaps`]) that lets the
//! whole apply step run, and its resulting map contents be compared, in plain `cargo test`.

use std::{io, net::IpAddr, sync::atomic::Ordering};

use aya::maps::{IterableMap as _, MapError};
use topology_common::{
    IndexEntry4, IndexEntry6, ServiceKey4, ServiceKey6, ServiceMeta, ServiceOptions, ServiceRanges, ServiceValue, Slot,
    map_names,
};
use topology_model::Family;
use topology_policy::desired::ServicePort;

use super::{
    batch,
    error::DataplaneError,
    grace::Grace,
    maps::{Capacities, MapSet},
    mmap::MappedArray,
};

/// A service port keyed as the maps of its family key it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceKey {
    /// A key of `topo_svc4` and its index.
    V4(ServiceKey4),
    /// A key of `topo_svc6` and its index.
    V6(ServiceKey6),
}

impl ServiceKey {
    /// The key of `port`.
    pub fn of(port: &ServicePort) -> Self {
        let proto = port.protocol.number();
        match port.vip {
            IpAddr::V4(vip) => Self::V4(ServiceKey4 { addr: vip.octets(), port: port.port, proto, _pad: 0 }),
            IpAddr::V6(vip) => Self::V6(ServiceKey6 { addr: vip.octets(), port: port.port, proto, _pad: 0 }),
        }
    }

    /// The service port of the key; `None` for a protocol number the agent never writes.
    pub fn port(&self) -> Option<ServicePort> {
        let (vip, port, proto) = match self {
            Self::V4(k) => (IpAddr::from(k.addr), k.port, k.proto),
            Self::V6(k) => (IpAddr::from(k.addr), k.port, k.proto),
        };
        Some(ServicePort { vip, port, protocol: topology_model::Protocol::from_number(proto)? })
    }

    /// The family of the key, and so of the maps that hold it.
    pub fn family(&self) -> Family {
        match self {
            Self::V4(_) => Family::V4,
            Self::V6(_) => Family::V6,
        }
    }

    /// The service map of the family.
    pub fn map(&self) -> &'static str {
        services_map(self.family())
    }
}

/// The service map of a family.
pub fn services_map(family: Family) -> &'static str {
    match family {
        Family::V4 => map_names::SERVICES_V4,
        Family::V6 => map_names::SERVICES_V6,
    }
}

/// One value per IP family.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PerFamily<T> {
    /// IPv4.
    pub v4: T,
    /// IPv6.
    pub v6: T,
}

impl<T> PerFamily<T> {
    /// The value of `family`.
    pub fn get(&self, family: Family) -> &T {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    /// The value of `family`, to change.
    pub fn get_mut(&mut self, family: Family) -> &mut T {
        match family {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }
}

/// The positions of one family's service index, shared with the programs.
pub trait IndexStore<T> {
    /// Number of positions.
    fn len(&self) -> u32;
    /// The value at `position`.
    fn read(&self, position: u32) -> T;
    /// Stores a position's `seq` (byte 0) with `ordering`.
    fn store_seq(&mut self, position: u32, seq: u8, ordering: Ordering);
    /// Stores every byte of a position but `seq`, none of them before a `seq` stored earlier.
    fn store_body(&mut self, position: u32, value: &T);
}

impl<T: aya::Pod> IndexStore<T> for MappedArray<T> {
    fn len(&self) -> u32 {
        MappedArray::len(self)
    }

    fn read(&self, position: u32) -> T {
        MappedArray::read(self, position)
    }

    fn store_seq(&mut self, position: u32, seq: u8, ordering: Ordering) {
        MappedArray::store_seq(self, position, seq, ordering);
    }

    fn store_body(&mut self, position: u32, value: &T) {
        MappedArray::store_body(self, position, value);
    }
}

/// Everything the writer does to the maps. Each call is one kernel operation (or none); errors
/// name the map.
pub trait MapOps {
    /// `max_entries` of the maps with a configurable size.
    fn capacities(&self) -> Capacities;
    /// Writes slot `index` of `topo_slots`.
    fn put_slot(&mut self, index: u32, slot: Slot) -> Result<(), DataplaneError>;
    /// Inserts or replaces a service entry (one RCU-published update).
    fn put_service(&mut self, key: ServiceKey, value: ServiceValue) -> Result<(), DataplaneError>;
    /// Deletes a service entry; deleting one that is not there succeeds.
    fn delete_service(&mut self, key: ServiceKey) -> Result<(), DataplaneError>;
    /// Zeroes the counters of a service id.
    fn reset_counters(&mut self, service_id: u32) -> Result<(), DataplaneError>;
    /// Prepares the counters of many new service ids at once, so that resetting them is cheap;
    /// best effort ([`Self::reset_counters`] still does whatever this did not).
    fn reserve_counters(&mut self, _service_ids: &[u32]) -> Result<(), DataplaneError> {
        Ok(())
    }
    /// Names a service id.
    fn put_name(&mut self, service_id: u32, name: ServiceMeta) -> Result<(), DataplaneError>;
    /// Removes a service id's name; removing one that is not there succeeds.
    fn delete_name(&mut self, service_id: u32) -> Result<(), DataplaneError>;
    /// Sets a service id's options.
    fn put_options(&mut self, service_id: u32, options: ServiceOptions) -> Result<(), DataplaneError>;
    /// Writes where the service ports are.
    fn put_ranges(&mut self, ranges: ServiceRanges) -> Result<(), DataplaneError>;
    /// The IPv4 index and the means to wait for a grace period, borrowed together.
    fn index4(&mut self) -> (&mut dyn IndexStore<IndexEntry4>, &mut dyn Grace);
    /// The IPv6 index and the means to wait for a grace period, borrowed together.
    fn index6(&mut self) -> (&mut dyn IndexStore<IndexEntry6>, &mut dyn Grace);
    /// The means to wait for a grace period.
    fn grace(&mut self) -> &mut dyn Grace;
    /// Both indexes, to read.
    fn indexes(&self) -> (&dyn IndexStore<IndexEntry4>, &dyn IndexStore<IndexEntry6>);

    /// Writes many slots. Batched where the kernel can; the default writes them one by one.
    fn put_slots(&mut self, slots: &[(u32, Slot)]) -> Result<(), DataplaneError> {
        slots.iter().try_for_each(|(index, slot)| self.put_slot(*index, *slot))
    }
    /// Names many service ids.
    fn put_names(&mut self, names: &[(u32, ServiceMeta)]) -> Result<(), DataplaneError> {
        names.iter().try_for_each(|(id, name)| self.put_name(*id, *name))
    }
    /// Sets many service ids' options.
    fn put_options_many(&mut self, options: &[(u32, ServiceOptions)]) -> Result<(), DataplaneError> {
        options.iter().try_for_each(|(id, options)| self.put_options(*id, *options))
    }
    /// Inserts or replaces many service entries, in order.
    fn put_services(&mut self, entries: &[(ServiceKey, ServiceValue)]) -> Result<(), DataplaneError> {
        entries.iter().try_for_each(|(key, value)| self.put_service(*key, *value))
    }
}

impl MapOps for MapSet {
    fn capacities(&self) -> Capacities {
        self.capacities
    }

    fn put_slot(&mut self, index: u32, slot: Slot) -> Result<(), DataplaneError> {
        self.slots.set(index, slot, 0).map_err(DataplaneError::map(map_names::SLOTS))
    }

    fn put_service(&mut self, key: ServiceKey, value: ServiceValue) -> Result<(), DataplaneError> {
        match key {
            ServiceKey::V4(key) => self.services4.insert(key, value, 0),
            ServiceKey::V6(key) => self.services6.insert(key, value, 0),
        }
        .map_err(DataplaneError::map(key.map()))
    }

    fn delete_service(&mut self, key: ServiceKey) -> Result<(), DataplaneError> {
        ignore_missing(match key {
            ServiceKey::V4(key) => self.services4.remove(&key),
            ServiceKey::V6(key) => self.services6.remove(&key),
        })
        .map_err(DataplaneError::map(key.map()))
    }

    fn reset_counters(&mut self, service_id: u32) -> Result<(), DataplaneError> {
        self.counters.reset(service_id)
    }

    fn reserve_counters(&mut self, service_ids: &[u32]) -> Result<(), DataplaneError> {
        if !self.counters.reserve(service_ids.iter().copied())? {
            self.batch_refusals += 1;
        }
        Ok(())
    }

    fn put_name(&mut self, service_id: u32, name: ServiceMeta) -> Result<(), DataplaneError> {
        self.meta.insert(service_id, name, 0).map_err(DataplaneError::map(map_names::SERVICE_META))
    }

    fn delete_name(&mut self, service_id: u32) -> Result<(), DataplaneError> {
        ignore_missing(self.meta.remove(&service_id)).map_err(DataplaneError::map(map_names::SERVICE_META))
    }

    fn put_options(&mut self, service_id: u32, options: ServiceOptions) -> Result<(), DataplaneError> {
        self.options.set(service_id, options, 0).map_err(DataplaneError::map(map_names::SERVICE_OPTIONS))
    }

    fn put_ranges(&mut self, ranges: ServiceRanges) -> Result<(), DataplaneError> {
        self.ranges.set(0, ranges, 0).map_err(DataplaneError::map(map_names::SERVICE_RANGES))
    }

    fn index4(&mut self) -> (&mut dyn IndexStore<IndexEntry4>, &mut dyn Grace) {
        (&mut self.index4, &mut self.counters)
    }

    fn index6(&mut self) -> (&mut dyn IndexStore<IndexEntry6>, &mut dyn Grace) {
        (&mut self.index6, &mut self.counters)
    }

    fn grace(&mut self) -> &mut dyn Grace {
        &mut self.counters
    }

    fn indexes(&self) -> (&dyn IndexStore<IndexEntry4>, &dyn IndexStore<IndexEntry6>) {
        (&self.index4, &self.index6)
    }

    fn put_slots(&mut self, slots: &[(u32, Slot)]) -> Result<(), DataplaneError> {
        let (keys, values): (Vec<u32>, Vec<Slot>) = slots.iter().copied().unzip();
        batch::update(self.slots.map(), &keys, &values).or_else(|_| {
            self.batch_refusals += 1;
            slots.iter().try_for_each(|(index, slot)| self.put_slot(*index, *slot))
        })
    }

    fn put_names(&mut self, names: &[(u32, ServiceMeta)]) -> Result<(), DataplaneError> {
        let (keys, values): (Vec<u32>, Vec<ServiceMeta>) = names.iter().copied().unzip();
        batch::update(self.meta.map(), &keys, &values).or_else(|_| {
            self.batch_refusals += 1;
            names.iter().try_for_each(|(id, name)| self.put_name(*id, *name))
        })
    }

    fn put_options_many(&mut self, options: &[(u32, ServiceOptions)]) -> Result<(), DataplaneError> {
        let (keys, values): (Vec<u32>, Vec<ServiceOptions>) = options.iter().copied().unzip();
        batch::update(self.options.map(), &keys, &values).or_else(|_| {
            self.batch_refusals += 1;
            options.iter().try_for_each(|(id, options)| self.put_options(*id, *options))
        })
    }

    fn put_services(&mut self, entries: &[(ServiceKey, ServiceValue)]) -> Result<(), DataplaneError> {
        let (mut keys4, mut values4, mut keys6, mut values6) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (key, value) in entries {
            match key {
                ServiceKey::V4(key) => (keys4.push(*key), values4.push(*value)),
                ServiceKey::V6(key) => (keys6.push(*key), values6.push(*value)),
            };
        }
        let batched = batch::update(self.services4.map(), &keys4, &values4)
            .and_then(|()| batch::update(self.services6.map(), &keys6, &values6));
        batched.or_else(|_| {
            self.batch_refusals += 1;
            entries.iter().try_for_each(|(key, value)| self.put_service(*key, *value))
        })
    }
}

/// An error naming `map` unless `more` entries fit beside the `used` ones.
pub fn check_room(map: &'static str, used: u64, more: u64, capacity: u32) -> Result<(), DataplaneError> {
    if used + more > u64::from(capacity) {
        return Err(DataplaneError::MapFull { map, needed: used + more, capacity });
    }
    Ok(())
}

/// A delete of an entry that is already gone succeeded.
fn ignore_missing(result: Result<(), MapError>) -> Result<(), MapError> {
    match result {
        Err(MapError::SyscallError(aya::sys::SyscallError { io_error, .. }))
            if io_error.kind() == io::ErrorKind::NotFound =>
        {
            Ok(())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use topology_model::Protocol;

    use super::*;

    #[test]
    fn room_is_checked_before_writing() {
        assert!(check_room("topo_slots", 10, 5, 15).is_ok());
        let error = check_room("topo_slots", 10, 6, 15).unwrap_err();
        assert_eq!(error.to_string(), "map topo_slots is full: 16 entries needed, capacity 15");
    }

    #[test]
    fn keys_follow_the_cluster_ip_family() {
        let v4 = ServicePort { vip: "10.96.0.10".parse().unwrap(), port: 53, protocol: Protocol::Udp };
        let v6 = ServicePort { vip: "fd00::10".parse().unwrap(), port: 80, protocol: Protocol::Tcp };
        assert!(
            matches!(ServiceKey::of(&v4), ServiceKey::V4(k) if k.addr == [10, 96, 0, 10] && k.port == 53 && k.proto == 17)
        );
        assert_eq!(ServiceKey::of(&v4).map(), map_names::SERVICES_V4);
        assert_eq!(ServiceKey::of(&v6).family(), Family::V6);
        assert_eq!(ServiceKey::of(&v6).map(), map_names::SERVICES_V6);
        let mut counts = PerFamily::<u64>::default();
        *counts.get_mut(Family::V6) += 2;
        assert_eq!((*counts.get(Family::V4), *counts.get(Family::V6)), (0, 2));
    }
}
