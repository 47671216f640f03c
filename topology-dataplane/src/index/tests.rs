//! Placement tests: collisions, tombstones, overflow, adoption, and a property test that every
//! lookup a program could make agrees with the hash map.

use std::collections::HashMap;

use proptest::prelude::*;
use topology_common::{ServiceKey4, ServiceValue, index::MAX_PROBE};

use super::placement::{Content, IndexAnswer, IndexKey as _, Placement, positions_for};

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
    assert_eq!(index.lookup(&keys[2]), IndexAnswer::Found(value(2)));
    // Same value again: nothing to write. A new value: the same position.
    assert!(index.upsert(keys[1], value(1)).is_empty());
    assert_eq!(index.upsert(keys[1], value(7)), vec![11]);
    // A key removed from the middle of a run leaves a tombstone the third key's lookup
    // passes; removing the third then empties both.
    assert_eq!(index.remove(&keys[1]), vec![11]);
    assert_eq!(index.content(11), Content::Tombstone);
    assert_eq!(index.lookup(&keys[2]), IndexAnswer::Found(value(2)));
    assert_eq!(index.lookup(&keys[1]), IndexAnswer::Absent);
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
    assert_eq!(index.lookup(&last), IndexAnswer::Unsure, "the programs ask the hash map");
    // Its value changes while it waits.
    assert!(index.upsert(last, value(99)).is_empty());
    // Room in its window: it moves into the freed position at once.
    assert_eq!(index.remove(&keys[2]), vec![5]);
    assert_eq!(index.overflowed(), 0);
    assert_eq!(index.lookup(&last), IndexAnswer::Found(value(99)));
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
    assert_eq!(index.lookup(&waiting), IndexAnswer::Found(value(60)));
    assert_eq!(index.remove(&waiting), vec![6]);
    assert_eq!(index.content(6), Content::Tombstone, "keys at 7..=10 pass it");
    assert_eq!(index.lookup(&keys[7]), IndexAnswer::Found(value(7)));
}

#[test]
fn a_half_written_position_sends_lookups_to_the_hash_map() {
    let mut index = Placement::new(16);
    let k = key(1);
    let changed = index.upsert(k, value(1));
    apply(&mut index, &changed);
    index.positions.get_mut(&changed[0]).unwrap().seq += 1;
    assert_eq!(index.lookup(&k), IndexAnswer::Unsure);
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
    assert_eq!(index.lookup(&b), IndexAnswer::Found(value(2)));
    assert_eq!(index.lookup(&c), IndexAnswer::Absent);
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
                    prop_assert!(!matches!(index.lookup(&key(k)), IndexAnswer::Found(_)));
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
