//! Grace periods and the rewrites of a position: a program inside one lookup never sees
//! [`REWRITES_PER_GRACE`] rewrites of its position, whether the periods pass in the background or
//! the writer waits for them, and the writer waits itself only when the background falls behind.

use std::collections::HashMap;

use proptest::prelude::*;
use topology_common::{IndexEntry4, ServiceKey4, ServiceValue};

use super::{
    ServiceIndex,
    publish::{REWRITES_BEFORE_BACKGROUND, REWRITES_PER_GRACE},
};
use crate::{
    grace::Grace,
    memory::{CountedGrace, MemoryIndex},
};

const KEY: ServiceKey4 = ServiceKey4 { addr: [10, 96, 0, 1], port: 80, proto: 6, _pad: 0 };

fn value(set_id: u32) -> ServiceValue {
    ServiceValue { service_id: 1, set_id, count: 1, base: set_id }
}

/// One step of the run: the writer rewrites the position, a period begun in the background
/// passes, or a program starts a lookup (it ends once a period begun after it has passed).
#[derive(Clone, Copy, Debug)]
enum Step {
    Rewrite,
    Pass,
    Lookup,
}

/// Runs `steps`: the most rewrites a lookup saw, and the periods the writer waited for itself.
fn run(steps: &[Step], background: bool) -> (u32, u64) {
    let mut map = MemoryIndex::<IndexEntry4>::from_positions(vec![IndexEntry4::default(); 16]);
    let mut grace = CountedGrace::default();
    grace.background = background;
    let mut index = ServiceIndex::adopt(&mut map, &HashMap::new(), &mut grace).expect("adopt");
    // The lookups under way: the latest period begun when each started, and what it saw.
    let mut lookups: Vec<(u64, u32)> = Vec::new();
    let (mut most, mut set) = (0, 0);
    for step in steps {
        match step {
            Step::Rewrite => {
                set += 1;
                index.upsert(&mut map, KEY, value(set), &mut grace);
                // A period the writer waited for passed before its store: the lookups it ended
                // do not see the store.
                let passed = grace.epochs().passed;
                lookups.retain(|(started, _)| passed <= *started);
                lookups.iter_mut().for_each(|(_, seen)| *seen += 1);
            }
            Step::Pass => grace.pass(),
            Step::Lookup => lookups.push((grace.epochs().begun, 0)),
        }
        most = lookups.iter().map(|(_, seen)| *seen).fold(most, u32::max);
        let passed = grace.epochs().passed;
        lookups.retain(|(started, _)| passed <= *started);
    }
    (most, grace.periods)
}

#[test]
fn periods_passing_in_the_background_keep_the_writer_from_waiting() {
    // A Service under churn, its period passing between two rewrites as a real one (10-30 ms)
    // does between two control-loop runs.
    let steps: Vec<Step> = (0..1_000).flat_map(|_| [Step::Lookup, Step::Rewrite, Step::Pass]).collect();
    let (most, waited) = run(&steps, true);
    assert_eq!(waited, 0, "the writer never waited");
    assert!(most <= u32::from(REWRITES_BEFORE_BACKGROUND) + 1, "a lookup saw {most} rewrites");
}

#[test]
fn the_writer_waits_itself_when_the_background_falls_behind_or_is_missing() {
    let steps: Vec<Step> = (0..1_000).flat_map(|_| [Step::Lookup, Step::Rewrite]).collect();
    for background in [true, false] {
        let (most, waited) = run(&steps, background);
        assert!(most <= u32::from(REWRITES_PER_GRACE), "a lookup saw {most} rewrites");
        assert_eq!(waited, 1_000 / u64::from(REWRITES_PER_GRACE), "background {background}");
    }
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![6 => Just(Step::Rewrite), 1 => Just(Step::Pass), 2 => Just(Step::Lookup)]
}

proptest! {
    #[test]
    fn no_lookup_sees_more_rewrites_than_allowed(steps in proptest::collection::vec(step(), 0..2_000)) {
        for background in [true, false] {
            let (most, _) = run(&steps, background);
            prop_assert!(most <= u32::from(REWRITES_PER_GRACE), "a lookup saw {} rewrites", most);
        }
    }
}
