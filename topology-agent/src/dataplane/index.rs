//! The service index (`topology_common::index`): where each service port sits in the
//! open-addressing table the programs probe, and the three-step rewrite of a position.
//!
//! [`Placement`] is the pure part: it decides positions and keeps the invariant the programs rely
//! on (a key is found before any [`EMPTY`] position of its window, or its window has none).
//! [`ServiceIndex`] publishes what it decides, one position at a time, in an order that keeps the
//! invariant true in the kernel after every single map update.
//!
//! The hash maps stay the authority, and every failure here degrades to "the programs ask the
//! hash map": a position whose rewrite failed half-way keeps an odd `seq`, which the programs
//! treat as "not sure". A failed rewrite is retried at the start of the next apply; until the
//! index is whole again the writer reclaims no retired slots, so a stale position still points at
//! an intact backend set.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt::Debug,
    hash::Hash,
};

use aya::{
    Pod,
    maps::{Array, MapData},
};
use topology_common::{
    IndexEntry4, IndexEntry6, ServiceKey4, ServiceKey6, ServiceValue,
    index::{EMPTY, MAX_PROBE, TOMBSTONE, USED},
    map_names,
};

use super::{error::DataplaneError, grace};

/// Rewrites of one position between grace periods. `seq` advances by two per rewrite and wraps at
/// 256, so a program would have to stay inside one lookup for 128 rewrites of its position to see
/// the same even `seq` twice; the agent waits for a grace period long before.
const REWRITES_PER_GRACE: u8 = 64;

/// The number of index positions for a services capacity: twice the capacity, rounded up to a
/// power of two, so a full services map fills at most half the index and probes stay short.
pub fn positions_for(services: u32) -> u32 {
    services.max(1).next_power_of_two() * 2
}

/// A service key the index can hold.
pub trait IndexKey: Copy + Eq + Hash + Debug {
    /// The map's value type.
    type Entry: Pod + Default + PartialEq;
    /// The map's name.
    const MAP: &'static str;
    /// The key's hash (`topology_common::index`); its home is `hash & mask`.
    fn index_hash(&self) -> u32;
    /// A position's map value.
    fn entry(seq: u8, content: &Content<Self>) -> Self::Entry;
    /// A map value read back: its `seq` and contents (`None`: not a valid entry).
    fn parse(entry: &Self::Entry) -> Option<(u8, Content<Self>)>;
}

/// What a position holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Content<K> {
    /// Nothing; a lookup that reaches it ends.
    Empty,
    /// A service port and its entry.
    Used(K, ServiceValue),
    /// Nothing, but lookups go on past it.
    Tombstone,
}

fn content_from<K>(state: u8, key: K, value: ServiceValue) -> Option<Content<K>> {
    match state {
        EMPTY => Some(Content::Empty),
        USED => Some(Content::Used(key, value)),
        TOMBSTONE => Some(Content::Tombstone),
        _ => None,
    }
}

fn state_key_value<K: Default + Copy>(content: &Content<K>) -> (u8, K, ServiceValue) {
    match *content {
        Content::Empty => (EMPTY, K::default(), ServiceValue::default()),
        Content::Used(key, value) => (USED, key, value),
        Content::Tombstone => (TOMBSTONE, K::default(), ServiceValue::default()),
    }
}

impl IndexKey for ServiceKey4 {
    type Entry = IndexEntry4;
    const MAP: &'static str = map_names::INDEX_V4;

    fn index_hash(&self) -> u32 {
        Self::index_hash(self)
    }

    fn entry(seq: u8, content: &Content<Self>) -> IndexEntry4 {
        let (state, key, value) = state_key_value(content);
        IndexEntry4 { seq, state, _pad: [0; 6], key, value }
    }

    fn parse(entry: &IndexEntry4) -> Option<(u8, Content<Self>)> {
        Some((entry.seq, content_from(entry.state, entry.key, entry.value)?))
    }
}

impl IndexKey for ServiceKey6 {
    type Entry = IndexEntry6;
    const MAP: &'static str = map_names::INDEX_V6;

    fn index_hash(&self) -> u32 {
        Self::index_hash(self)
    }

    fn entry(seq: u8, content: &Content<Self>) -> IndexEntry6 {
        let (state, key, value) = state_key_value(content);
        IndexEntry6 { seq, state, _pad: [0; 2], key, value }
    }

    fn parse(entry: &IndexEntry6) -> Option<(u8, Content<Self>)> {
        Some((entry.seq, content_from(entry.state, entry.key, entry.value)?))
    }
}

/// The map of one family's index.
pub type IndexMap<K> = Array<MapData, <K as IndexKey>::Entry>;

/// What a lookup in the index answers, as the programs see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The entry.
    Found(ServiceValue),
    /// No such service port.
    Absent,
    /// Ask the hash map.
    Unsure,
}

/// One position as the agent knows it.
#[derive(Clone, Copy, Debug)]
struct Position<K> {
    /// What the position holds, or will once its rewrite completes.
    content: Content<K>,
    /// `seq` in the kernel; odd while a rewrite is incomplete (a failed one, until repaired).
    seq: u8,
    /// Rewrites since the last grace period.
    rewrites: u8,
}

impl<K> Position<K> {
    fn never_written() -> Self {
        Self { content: Content::Empty, seq: 0, rewrites: 0 }
    }
}

/// Where every key sits; pure bookkeeping, no I/O.
#[derive(Debug)]
pub struct Placement<K> {
    mask: u32,
    /// Distinct positions in a probe window.
    window: u32,
    /// Every position that is not `Empty` with `seq` 0 (a B-tree: no table to double as it grows).
    positions: BTreeMap<u32, Position<K>>,
    /// What the kernel holds at positions changed since they were last published.
    published: BTreeMap<u32, Content<K>>,
    /// Keys whose window was full of other keys when they were written, and their entries: not
    /// in the index, and their window holds no `Empty` position, so lookups end "not sure".
    overflow: HashMap<K, ServiceValue>,
}

impl<K: IndexKey> Placement<K> {
    /// An empty index of `positions` (a power of two) positions.
    pub fn new(positions: u32) -> Self {
        debug_assert!(positions.is_power_of_two());
        Self {
            mask: positions - 1,
            window: MAX_PROBE.min(positions),
            positions: BTreeMap::new(),
            published: BTreeMap::new(),
            overflow: HashMap::new(),
        }
    }

    /// The position `step` steps into `key`'s window.
    fn at(&self, key: &K, step: u32) -> u32 {
        key.index_hash().wrapping_add(step) & self.mask
    }

    /// How far into `key`'s window `position` lies, if it does.
    fn step_of(&self, key: &K, position: u32) -> Option<u32> {
        let step = position.wrapping_sub(key.index_hash()) & self.mask;
        (step < self.window).then_some(step)
    }

    fn content(&self, position: u32) -> Content<K> {
        self.positions.get(&position).map_or(Content::Empty, |p| p.content)
    }

    fn seq(&self, position: u32) -> u8 {
        self.positions.get(&position).map_or(0, |p| p.seq)
    }

    /// Records what the kernel holds at `position` (adoption).
    fn record(&mut self, position: u32, seq: u8, content: Content<K>) {
        if seq != 0 || content != Content::Empty {
            self.positions.insert(position, Position { content, seq, rewrites: 0 });
        }
    }

    /// Where `key` is placed, if it is.
    fn find(&self, key: &K) -> Option<u32> {
        (0..self.window)
            .map(|step| self.at(key, step))
            .find(|&position| matches!(self.content(position), Content::Used(held, _) if held == *key))
    }

    /// Makes `key` map to `value`; returns the positions whose contents changed.
    pub fn upsert(&mut self, key: K, value: ServiceValue) -> Vec<u32> {
        if let Some(position) = self.find(&key) {
            if self.content(position) == Content::Used(key, value) {
                return Vec::new();
            }
            self.set(position, Content::Used(key, value));
            return vec![position];
        }
        // The first position of the window no key holds: every position before it is used.
        let free = (0..self.window).map(|step| self.at(&key, step)).find(|&p| !self.is_used(p));
        match free {
            Some(position) => {
                self.overflow.remove(&key);
                self.set(position, Content::Used(key, value));
                vec![position]
            }
            None => {
                self.overflow.insert(key, value);
                Vec::new()
            }
        }
    }

    /// Removes `key`; returns the positions whose contents changed, in the order to publish them.
    pub fn remove(&mut self, key: &K) -> Vec<u32> {
        let mut changed = Vec::new();
        let freed = if let Some(position) = self.find(key) {
            self.set(position, Content::Tombstone);
            changed.push(position);
            Some(position)
        } else {
            self.overflow.remove(key);
            None
        };
        // Tombstones only `key` kept alive become empty: those in its window up to its position.
        let home = self.at(key, 0);
        for step in 0..self.window {
            let position = home.wrapping_add(step) & self.mask;
            if self.content(position) == Content::Tombstone && !self.is_needed(position) {
                self.set(position, Content::Empty);
                if !changed.contains(&position) {
                    changed.push(position);
                }
            }
            if Some(position) == freed {
                break;
            }
        }
        // A key that overflowed may fit in the room just made.
        if freed.is_some() {
            let waiting: Vec<(K, ServiceValue)> = self.overflow.iter().map(|(k, v)| (*k, *v)).collect();
            for (key, value) in waiting {
                for position in self.upsert(key, value) {
                    if !changed.contains(&position) {
                        changed.push(position);
                    }
                }
            }
        }
        changed
    }

    fn is_used(&self, position: u32) -> bool {
        matches!(self.content(position), Content::Used(..))
    }

    /// Whether some key's lookup must pass `position`: a key placed further along a window that
    /// contains it, or an overflowed key whose window contains it.
    fn is_needed(&self, position: u32) -> bool {
        let placed_beyond = (1..self.window).any(|ahead| {
            let beyond = position.wrapping_add(ahead) & self.mask;
            match self.content(beyond) {
                Content::Used(key, _) => {
                    matches!((self.step_of(&key, position), self.step_of(&key, beyond)), (Some(a), Some(b)) if a < b)
                }
                _ => false,
            }
        });
        placed_beyond || self.overflow.keys().any(|key| self.step_of(key, position).is_some())
    }

    fn set(&mut self, position: u32, content: Content<K>) {
        let known = self.positions.entry(position).or_insert_with(Position::never_written);
        self.published.entry(position).or_insert(known.content);
        known.content = content;
    }

    /// Positions whose kernel contents are not (or may not be) what was decided: half-written
    /// (odd `seq`), or changed and not yet published.
    fn unpublished(&self) -> Vec<u32> {
        let odd = self.positions.iter().filter(|(_, p)| p.seq & 1 != 0).map(|(position, _)| *position);
        odd.chain(self.published.keys().copied()).collect::<BTreeSet<u32>>().into_iter().collect()
    }

    /// What a program's lookup of `key` answers, given what the kernel holds.
    pub fn lookup(&self, key: &K) -> Lookup {
        for step in 0..self.window {
            let position = self.at(key, step);
            if self.seq(position) & 1 != 0 {
                return Lookup::Unsure;
            }
            match self.content(position) {
                Content::Empty => return Lookup::Absent,
                Content::Used(held, value) if held == *key => return Lookup::Found(value),
                _ => {}
            }
        }
        Lookup::Unsure
    }
}

impl<K: IndexKey> Placement<K> {
    /// Rebuilds the bookkeeping from what the kernel holds (`(position, map value)`), then
    /// changes it to index exactly `services`. Returns the placement and the positions to
    /// publish: those changed, and those a previous agent left half-rewritten.
    pub fn adopt(
        positions: u32,
        held: impl IntoIterator<Item = (u32, K::Entry)>,
        services: &HashMap<K, ServiceValue>,
    ) -> (Self, Vec<u32>) {
        let mut placement = Self::new(positions);
        let mut changed = BTreeSet::new();
        let mut seen = HashSet::new();
        for (position, entry) in held {
            match K::parse(&entry) {
                Some((seq, content)) => {
                    let duplicate = matches!(content, Content::Used(key, _) if !seen.insert(key)
                        || placement.step_of(&key, position).is_none());
                    placement.record(position, seq, content);
                    if duplicate {
                        // A second copy, or a key outside its own window: a tombstone is always safe.
                        placement.set(position, Content::Tombstone);
                    }
                }
                None => {
                    // An unknown state matches no lookup; it is made odd, then a tombstone.
                    placement.record(position, 1, Content::Tombstone);
                    changed.insert(position);
                }
            }
            if placement.seq(position) & 1 != 0 {
                changed.insert(position);
            }
        }
        let stale: Vec<K> = placement
            .positions
            .values()
            .filter_map(|p| match p.content {
                Content::Used(key, value) if services.get(&key) != Some(&value) => Some(key),
                _ => None,
            })
            .collect();
        for key in stale {
            match services.get(&key) {
                Some(value) => changed.extend(placement.upsert(key, *value)),
                None => changed.extend(placement.remove(&key)),
            }
        }
        for (key, value) in services {
            if placement.find(key).is_none() {
                changed.extend(placement.upsert(*key, *value));
            }
        }
        changed.extend(placement.published.keys().copied());
        (placement, changed.into_iter().collect())
    }

    /// Checks the invariant the programs rely on against `services`, the authority: every
    /// lookup of a service answers its entry or "not sure", and every placed key is a service.
    pub fn check(&self, services: &HashMap<K, ServiceValue>) -> Result<(), String> {
        for (key, value) in services {
            match self.lookup(key) {
                Lookup::Found(found) if found != *value => {
                    return Err(format!("{key:?}: index has {found:?}, hash map {value:?}"));
                }
                Lookup::Absent => return Err(format!("{key:?}: index says absent")),
                _ => {}
            }
        }
        for position in self.positions.values() {
            if let Content::Used(key, _) = position.content
                && !services.contains_key(&key)
            {
                return Err(format!("{key:?}: placed but not a service"));
            }
        }
        Ok(())
    }

    /// Keys that overflowed their window.
    #[cfg(test)]
    fn overflowed(&self) -> usize {
        self.overflow.len()
    }

    /// Checks what the kernel holds in `map` against `services`: each service's lookup, as the
    /// programs make it, answers its entry or "not sure", and every placed key is a service.
    pub fn verify(map: &IndexMap<K>, services: &HashMap<K, ServiceValue>) -> Result<(), String> {
        let mut held = Self::new(map.len());
        let mut seen = HashSet::new();
        for position in 0..map.len() {
            let entry = map.get(&position, 0).map_err(|error| format!("{}: {error}", K::MAP))?;
            let (seq, content) = K::parse(&entry).ok_or_else(|| format!("{}[{position}]: invalid state", K::MAP))?;
            if let Content::Used(key, _) = content
                && !seen.insert(key)
            {
                return Err(format!("{}: {key:?} at two positions", K::MAP));
            }
            held.record(position, seq, content);
        }
        held.check(services).map_err(|error| format!("{}: {error}", K::MAP))
    }
}

/// The index of one family: its placement, and the writes that publish it to its map.
pub struct ServiceIndex<K: IndexKey> {
    placement: Placement<K>,
    /// Failures since last asked, for the apply report.
    errors: Vec<DataplaneError>,
}

impl<K: IndexKey> ServiceIndex<K> {
    /// Adopts the index in `map` and makes it index exactly `services`.
    pub fn adopt(map: &mut IndexMap<K>, services: &HashMap<K, ServiceValue>) -> Result<Self, DataplaneError> {
        let positions = map.len();
        if !positions.is_power_of_two() {
            return Err(DataplaneError::Config(format!(
                "map {} has {positions} positions; the index needs a power of two",
                K::MAP
            )));
        }
        let mut held = Vec::new();
        for position in 0..positions {
            let entry = map.get(&position, 0).map_err(DataplaneError::map(K::MAP))?;
            if entry != K::Entry::default() {
                held.push((position, entry));
            }
        }
        let (placement, changed) = Placement::adopt(positions, held, services);
        let mut index = Self { placement, errors: Vec::new() };
        index.publish(map, changed);
        Ok(index)
    }

    /// Makes `key` map to `value` in the index.
    pub fn upsert(&mut self, map: &mut IndexMap<K>, key: K, value: ServiceValue) {
        let changed = self.placement.upsert(key, value);
        self.publish(map, changed);
    }

    /// Removes `key` from the index.
    pub fn remove(&mut self, map: &mut IndexMap<K>, key: &K) {
        let changed = self.placement.remove(key);
        self.publish(map, changed);
    }

    /// Retries positions whose rewrite failed; true if none is left half-written.
    pub fn repair(&mut self, map: &mut IndexMap<K>) -> bool {
        let dirty = self.placement.unpublished();
        self.publish(map, dirty);
        self.is_whole()
    }

    /// True when every position holds what the agent decided.
    pub fn is_whole(&self) -> bool {
        self.placement.unpublished().is_empty()
    }

    /// Forgets rewrite counts: a grace period has passed.
    pub fn grace_passed(&mut self) {
        for position in self.placement.positions.values_mut() {
            position.rewrites = 0;
        }
    }

    /// Failures since the last call.
    pub fn take_errors(&mut self) -> Vec<DataplaneError> {
        std::mem::take(&mut self.errors)
    }

    /// Publishes the current contents of `positions`, in order.
    fn publish(&mut self, map: &mut IndexMap<K>, positions: Vec<u32>) {
        let mut done = BTreeSet::new();
        for position in positions {
            if done.insert(position)
                && let Err(error) = self.rewrite(map, position)
            {
                self.errors.push(error);
            }
        }
    }

    /// Rewrites one position in three steps (see `topology_common::index`): `seq` made odd over the
    /// old contents, the new contents, `seq` made even. A failure leaves `seq` odd (the programs
    /// ask the hash map) or the old contents whole; either way [`Self::repair`] finishes it.
    fn rewrite(&mut self, map: &mut IndexMap<K>, position: u32) -> Result<(), DataplaneError> {
        let known = *self.placement.positions.entry(position).or_insert_with(Position::never_written);
        if known.rewrites >= REWRITES_PER_GRACE {
            grace::wait();
            self.grace_passed();
        }
        let mut write = |seq: u8, content: &Content<K>| {
            map.set(position, K::entry(seq, content), 0).map_err(DataplaneError::map(K::MAP))
        };
        let mut seq = known.seq;
        if seq & 1 == 0 {
            // Only `seq` changes: the kernel holds the published contents.
            let published = self.placement.published.get(&position).copied().unwrap_or(known.content);
            seq = seq.wrapping_add(1);
            write(seq, &published)?;
            self.update(position, seq);
            self.placement.published.remove(&position);
        }
        write(seq, &known.content)?;
        write(seq.wrapping_add(1), &known.content)?;
        self.update(position, seq.wrapping_add(1));
        Ok(())
    }

    fn update(&mut self, position: u32, seq: u8) {
        if let Some(known) = self.placement.positions.get_mut(&position) {
            known.seq = seq;
            known.rewrites = known.rewrites.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn key(i: u32) -> ServiceKey4 {
        ServiceKey4 { addr: (0x0a60_0000 + i).to_be_bytes(), port: 80, proto: 6, _pad: 0 }
    }

    fn value(i: u32) -> ServiceValue {
        ServiceValue { service_id: i, set_id: i + 1, count: 1, base: i }
    }

    /// `n` keys whose home is `home` in a table of `positions`.
    fn keys_at(home: u32, n: usize, positions: u32) -> Vec<ServiceKey4> {
        (0..).map(key).filter(|k| k.index_hash() & (positions - 1) == home).take(n).collect()
    }

    fn apply(placement: &mut Placement<ServiceKey4>, changed: &[u32]) {
        // What a publish does to the bookkeeping: the kernel now holds the contents.
        for position in changed {
            placement.published.remove(position);
            let known = placement.positions.get_mut(position).expect("changed positions exist");
            known.seq = known.seq.wrapping_add(2);
        }
    }

    #[test]
    fn colliding_keys_fill_their_window_in_order() {
        let mut index = Placement::new(64);
        let keys = keys_at(10, 3, 64);
        for (i, k) in keys.iter().enumerate() {
            assert_eq!(index.upsert(*k, value(i as u32)), vec![10 + i as u32]);
        }
        assert_eq!(index.lookup(&keys[2]), Lookup::Found(value(2)));
        // Same value again: nothing to write. A new value: the same position.
        assert!(index.upsert(keys[1], value(1)).is_empty());
        assert_eq!(index.upsert(keys[1], value(7)), vec![11]);
        // A key removed from the middle of a run leaves a tombstone the third key's lookup
        // passes; removing the third then empties both.
        assert_eq!(index.remove(&keys[1]), vec![11]);
        assert_eq!(index.content(11), Content::Tombstone);
        assert_eq!(index.lookup(&keys[2]), Lookup::Found(value(2)));
        assert_eq!(index.lookup(&keys[1]), Lookup::Absent);
        assert_eq!(index.remove(&keys[2]), vec![12, 11]);
        assert_eq!((index.content(11), index.content(12)), (Content::Empty, Content::Empty));
        // A freed tombstone is reused by the next key of that window.
        let more = keys_at(10, 5, 64);
        assert_eq!(index.upsert(more[3], value(3)), vec![11]);
    }

    #[test]
    fn a_full_window_overflows_to_the_hash_map_and_moves_in_when_room_is_made() {
        let positions = 16;
        let keys = keys_at(3, MAX_PROBE as usize + 1, positions);
        let mut index = Placement::new(positions);
        for (i, k) in keys.iter().enumerate() {
            index.upsert(*k, value(i as u32));
        }
        let last = keys[MAX_PROBE as usize];
        assert_eq!(index.overflowed(), 1);
        assert_eq!(index.lookup(&last), Lookup::Unsure, "the programs ask the hash map");
        // Its value changes while it waits.
        assert!(index.upsert(last, value(99)).is_empty());
        // Room in its window: it moves into the freed position at once.
        assert_eq!(index.remove(&keys[2]), vec![5]);
        assert_eq!(index.overflowed(), 0);
        assert_eq!(index.lookup(&last), Lookup::Found(value(99)));
    }

    #[test]
    fn a_tombstone_stays_while_a_later_key_needs_it() {
        let positions = 16;
        let keys = keys_at(3, MAX_PROBE as usize + 1, positions);
        let mut index = Placement::new(positions);
        for (i, k) in keys.iter().enumerate().take(MAX_PROBE as usize) {
            index.upsert(*k, value(i as u32));
        }
        // A key of the next home goes past the run (3..=10) to 11; the key left over overflows.
        let late = keys_at(4, 1, positions)[0];
        assert_eq!(index.upsert(late, value(50)), vec![11]);
        let waiting = keys[MAX_PROBE as usize];
        assert!(index.upsert(waiting, value(60)).is_empty());
        // 11 lies outside the waiting key's window and nothing lies past it: it empties.
        assert_eq!(index.remove(&late), vec![11]);
        assert_eq!(index.content(11), Content::Empty);
        // 6 lies before keys placed at 7..=10 of the same window: a tombstone, which the waiting
        // key then takes.
        assert_eq!(index.remove(&keys[3]), vec![6]);
        assert_eq!(index.lookup(&waiting), Lookup::Found(value(60)));
        assert_eq!(index.remove(&waiting), vec![6]);
        assert_eq!(index.content(6), Content::Tombstone, "keys at 7..=10 pass it");
        assert_eq!(index.lookup(&keys[7]), Lookup::Found(value(7)));
    }

    #[test]
    fn a_half_written_position_sends_lookups_to_the_hash_map() {
        let mut index = Placement::new(16);
        let k = key(1);
        let changed = index.upsert(k, value(1));
        apply(&mut index, &changed);
        index.positions.get_mut(&changed[0]).unwrap().seq += 1;
        assert_eq!(index.lookup(&k), Lookup::Unsure);
    }

    #[test]
    fn adoption_keeps_what_is_right_and_fixes_the_rest() {
        let positions = 16;
        let mut services = HashMap::new();
        let (a, b, c) = (key(1), key(2), key(3));
        services.insert(a, value(1));
        services.insert(b, value(2));
        let home = |k: &ServiceKey4| k.index_hash() & (positions - 1);
        let held = [
            // `a` right, `b` stale, `c` no longer a service, and a half-written position.
            (home(&a), ServiceKey4::entry(2, &Content::Used(a, value(1)))),
            (home(&b), ServiceKey4::entry(4, &Content::Used(b, value(9)))),
            (home(&c), ServiceKey4::entry(0, &Content::Used(c, value(3)))),
            ((home(&c) + 1) % positions, ServiceKey4::entry(5, &Content::Tombstone)),
        ];
        let (mut index, changed) = Placement::adopt(positions, held, &services);
        assert!(!changed.contains(&home(&a)) || home(&a) == home(&b) || home(&a) == home(&c));
        assert!(changed.contains(&home(&b)) && changed.contains(&home(&c)));
        assert!(changed.contains(&((home(&c) + 1) % positions)), "the half-written position is finished");
        apply(&mut index, &changed);
        assert_eq!(index.check(&services), Ok(()));
        assert_eq!(index.lookup(&b), Lookup::Found(value(2)));
        assert_eq!(index.lookup(&c), Lookup::Absent);
    }

    #[test]
    fn positions_are_the_next_power_of_two() {
        assert_eq!(
            [positions_for(0), positions_for(1), positions_for(65_536), positions_for(65_537)],
            [2, 2, 131_072, 262_144]
        );
    }

    #[derive(Clone, Debug)]
    enum Op {
        Upsert(u32, u32),
        Remove(u32),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![(0..40u32, 0..1000u32).prop_map(|(k, v)| Op::Upsert(k, v)), (0..40u32).prop_map(Op::Remove)]
    }

    proptest! {
        /// After any sequence of writes, in a table small enough to collide and overflow, every
        /// lookup the programs could make agrees with the hash map, and the index never holds a
        /// removed key.
        #[test]
        fn lookups_always_agree_with_the_hash_map(ops in prop::collection::vec(op(), 1..200), size in 0..4u32) {
            let positions = 8 << size;
            let mut index = Placement::new(positions);
            let mut services = HashMap::new();
            for op in ops {
                let changed = match op {
                    Op::Upsert(k, v) => {
                        services.insert(key(k), value(v));
                        index.upsert(key(k), value(v))
                    }
                    Op::Remove(k) => {
                        services.remove(&key(k));
                        index.remove(&key(k))
                    }
                };
                apply(&mut index, &changed);
                prop_assert_eq!(index.check(&services), Ok(()));
                for k in 0..40 {
                    if !services.contains_key(&key(k)) {
                        prop_assert!(!matches!(index.lookup(&key(k)), Lookup::Found(_)));
                    }
                }
            }
            // Once everything is removed, only empty positions are left.
            for k in 0..40 {
                let changed = index.remove(&key(k));
                apply(&mut index, &changed);
            }
            prop_assert!(index.positions.values().all(|p| p.content == Content::Empty));
        }
    }
}
