//! Where each service port sits in the index: pure bookkeeping that keeps the invariant the
//! programs rely on (a key is found before any [`EMPTY`] position of its window, or its window
//! has none). No I/O: [`super::ServiceIndex`] publishes what it decides.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap, HashSet},
    fmt::Debug,
    hash::Hash,
};

use aya::Pod;
use topology_common::{
    IndexEntry4, IndexEntry6, ServiceKey4, ServiceKey6, ServiceValue,
    index::{EMPTY, MAX_PROBE, TOMBSTONE, USED},
    map_names,
};

use crate::grace::Epochs;

/// The number of index positions for a services capacity: twice the capacity, rounded up to a
/// power of two, so a full services map fills at most half the index and probes stay short.
/// Saturates at 2^31 (a capacity beyond 2^30 services is refused before it matters).
pub fn positions_for(services: u32) -> u32 {
    services.clamp(1, 1 << 30).next_power_of_two() * 2
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

/// What a lookup in the index answers, as the programs see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexAnswer {
    /// The entry.
    Found(ServiceValue),
    /// No such service port.
    Absent,
    /// Ask the hash map.
    Unsure,
}

/// One position as the agent knows it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Position<K> {
    /// What the position holds, or will once its rewrite completes.
    pub(super) content: Content<K>,
    /// `seq` in the kernel; odd while a rewrite is incomplete (one a killed agent left).
    pub(super) seq: u8,
    /// What a program running now may have seen rewritten here.
    pub(super) rewrites: Rewrites,
}

impl<K> Position<K> {
    pub(super) fn never_written() -> Self {
        Self { content: Content::Empty, seq: 0, rewrites: Rewrites::default() }
    }
}

/// The rewrites of a position no grace period has passed over yet, counted by the grace period
/// that was the latest begun when they were made ([`Epochs`]): those made while it was `tag`, and
/// those made before it began. A rewrite is covered once a period begun after it has passed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Rewrites {
    tag: u64,
    since: u8,
    before: u8,
}

impl Rewrites {
    /// How many a program running now may have seen (at most; whether one passed between two
    /// rewrites of the same tag is not known, so both count).
    pub(super) fn uncovered(&self, epochs: Epochs) -> u8 {
        let since = if epochs.passed > self.tag { 0 } else { self.since };
        let before = if epochs.passed >= self.tag { 0 } else { self.before };
        since.saturating_add(before)
    }

    /// One more, made now.
    pub(super) fn count(&mut self, epochs: Epochs) {
        if self.tag != epochs.begun {
            // Everything counted so far was made before the latest period began.
            *self = Self { tag: epochs.begun, since: 0, before: self.uncovered(epochs) };
        }
        self.since = self.since.saturating_add(1);
    }
}

/// A lookup the programs could make that the index answers wrongly.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IndexViolation {
    /// The index has another entry than the hash map.
    #[error("{key}: index has {index:?}, hash map {hash:?}")]
    Differs {
        /// The service key.
        key: String,
        /// What the index answers.
        index: ServiceValue,
        /// What the hash map holds.
        hash: ServiceValue,
    },
    /// The index says a service is absent.
    #[error("{0}: index says absent")]
    Absent(String),
    /// The index finds a key that is not a service.
    #[error("{0}: found by a lookup but not a service")]
    NotAService(String),
}

/// Where every key sits; pure bookkeeping, no I/O.
#[derive(Debug)]
pub struct Placement<K> {
    mask: u32,
    /// Distinct positions in a probe window.
    window: u32,
    /// Every position that is not `Empty` with `seq` 0 (a B-tree: no table to double as it grows).
    pub(super) positions: BTreeMap<u32, Position<K>>,
    /// What the kernel holds at positions changed since they were last published.
    pub(super) published: BTreeMap<u32, Content<K>>,
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

    pub(super) fn content(&self, position: u32) -> Content<K> {
        self.positions.get(&position).map_or(Content::Empty, |p| p.content)
    }

    pub(super) fn seq(&self, position: u32) -> u8 {
        self.positions.get(&position).map_or(0, |p| p.seq)
    }

    /// Records what the kernel holds at `position` (adoption).
    pub(super) fn record(&mut self, position: u32, seq: u8, content: Content<K>) {
        if seq != 0 || content != Content::Empty {
            self.positions.insert(position, Position { content, seq, rewrites: Rewrites::default() });
        }
    }

    /// The contents of `key`'s window by step, read with one search of the tree and not one per
    /// position (a full sync places every port: eight searches each were a sixth of writing).
    fn window_of(&self, key: &K) -> [Content<K>; MAX_PROBE as usize] {
        let mut window = [Content::Empty; MAX_PROBE as usize];
        let home = self.at(key, 0);
        let end = u64::from(home) + u64::from(self.window);
        let size = u64::from(self.mask) + 1;
        // The window may wrap past the last position to the first ones.
        let ahead = self.positions.range(home..=u32::try_from(end.min(size) - 1).unwrap_or(u32::MAX));
        let wrapped = (end > size).then(|| self.positions.range(..u32::try_from(end - size).unwrap_or(u32::MAX)));
        for (&position, held) in ahead.chain(wrapped.into_iter().flatten()) {
            if let Some(step) = self.step_of(key, position) {
                window[step as usize] = held.content;
            }
        }
        window
    }

    /// Where `key` is placed, if it is.
    fn find(&self, key: &K) -> Option<u32> {
        let window = self.window_of(key);
        (0..self.window)
            .find(|&step| matches!(window[step as usize], Content::Used(held, _) if held == *key))
            .map(|step| self.at(key, step))
    }

    /// Makes `key` map to `value`; returns the positions whose contents changed.
    pub fn upsert(&mut self, key: K, value: ServiceValue) -> Vec<u32> {
        let window = self.window_of(&key);
        let placed =
            (0..self.window).find(|&step| matches!(window[step as usize], Content::Used(held, _) if held == key));
        if let Some(step) = placed {
            if window[step as usize] == Content::Used(key, value) {
                return Vec::new();
            }
            self.set(self.at(&key, step), Content::Used(key, value));
            return vec![self.at(&key, step)];
        }
        // The first position of the window no key holds: every position before it is used.
        let free = (0..self.window)
            .find(|&step| !matches!(window[step as usize], Content::Used(..)))
            .map(|step| self.at(&key, step));
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

    /// Whether a lookup of `key` reaches its position before any empty one, whatever the `seq`s
    /// (half-written positions get finished with what is decided).
    fn reachable(&self, key: &K) -> bool {
        for step in 0..self.window {
            match self.content(self.at(key, step)) {
                Content::Empty => return false,
                Content::Used(held, _) if held == *key => return true,
                _ => {}
            }
        }
        false
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

    /// What a program's lookup of `key` answers, given what the kernel holds.
    pub fn lookup(&self, key: &K) -> IndexAnswer {
        for step in 0..self.window {
            let position = self.at(key, step);
            if self.seq(position) & 1 != 0 {
                return IndexAnswer::Unsure;
            }
            match self.content(position) {
                Content::Empty => return IndexAnswer::Absent,
                Content::Used(held, value) if held == *key => return IndexAnswer::Found(value),
                _ => {}
            }
        }
        IndexAnswer::Unsure
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
        // A key held behind an empty position of its window (a map edited by hand, a bug) would
        // look absent to the programs: its copy becomes a tombstone and it is placed anew.
        for key in services.keys() {
            if !placement.reachable(key)
                && let Some(position) = placement.find(key)
            {
                placement.set(position, Content::Tombstone);
                changed.insert(position);
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
    /// lookup of a service answers its entry or "not sure", and no lookup finds a key that is not
    /// a service (one left under an odd `seq` answers "not sure": the hash map says absent).
    pub fn check(&self, services: &HashMap<K, ServiceValue>) -> Result<(), IndexViolation> {
        for (key, value) in services {
            match self.lookup(key) {
                IndexAnswer::Found(found) if found != *value => {
                    return Err(IndexViolation::Differs { key: format!("{key:?}"), index: found, hash: *value });
                }
                IndexAnswer::Absent => return Err(IndexViolation::Absent(format!("{key:?}"))),
                _ => {}
            }
        }
        for position in self.positions.values() {
            if let Content::Used(key, _) = position.content
                && !services.contains_key(&key)
                && matches!(self.lookup(&key), IndexAnswer::Found(_))
            {
                return Err(IndexViolation::NotAService(format!("{key:?}")));
            }
        }
        Ok(())
    }

    /// Records that `positions` were published as a rewrite does: `seq` even again, contents
    /// as decided (what a fuzz target checks adoption against, without a kernel).
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn published_all(&mut self, positions: &[u32]) {
        for position in positions {
            self.published.remove(position);
            if let Some(known) = self.positions.get_mut(position) {
                known.seq = if known.seq & 1 == 0 { known.seq.wrapping_add(2) } else { known.seq.wrapping_add(1) };
            }
        }
    }

    /// Keys that overflowed their window.
    #[cfg(test)]
    pub(super) fn overflowed(&self) -> usize {
        self.overflow.len()
    }
}
