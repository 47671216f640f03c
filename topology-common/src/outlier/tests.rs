//! The ejection rules, event by event.

extern crate std;
use std::{vec, vec::Vec};

use super::*;

const S: u64 = 1_000_000_000;
const MS: u64 = 1_000_000;

#[test]
fn buckets_spread_neighbouring_backends() {
    let mut seen = std::collections::BTreeSet::new();
    for host in 0..=255u8 {
        for port in [80u16, 8080] {
            let bucket = bucket_of(&[10, 244, 1, host, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], port);
            assert!(bucket < BUCKETS);
            seen.insert(bucket);
        }
    }
    assert!(seen.len() > 200, "512 neighbouring backends in {} of 256 buckets", seen.len());
}

#[test]
fn a_backends_words_hash_to_the_bucket_of_its_bytes() {
    // The connect hooks hash a backend's words, the agent and the tracing programs its bytes.
    for addr in
        [[10, 244, 1, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3]]
    {
        let backend = crate::Backend { addr, port: 8080, ..Default::default() };
        assert_eq!(bucket_of_words(backend.addr_words(), backend.port), bucket_of(&addr, 8080), "{addr:?}");
    }
}

#[test]
fn ejections_double_up_to_the_maximum() {
    let seconds: [u64; 7] = core::array::from_fn(|n| OutlierEntry::ejection_ns(n as u32 + 1) / S);
    assert_eq!(seconds, [10, 20, 40, 80, 160, 300, 300]);
    assert_eq!(OutlierEntry::ejection_ns(u32::MAX), MAX_EJECTION_NS);
    let one: [u64; 11] = core::array::from_fn(|n| OutlierEntry::ejection_ns_from(S, n as u32 + 1) / S);
    assert_eq!(one, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
    assert_eq!(OutlierEntry::ejection_ns_from(255 * S, u32::MAX), MAX_EJECTION_NS);
}

#[test]
fn a_ports_flags_carry_its_tuning() {
    use crate::service_flags::{OUTLIER_BASE_SHIFT, OUTLIER_FAILURES_SHIFT, OUTLIER_OFF};
    assert_eq!(EjectionSettings::of(0), EjectionSettings::DEFAULT);
    assert_eq!(EjectionSettings::of(OUTLIER_OFF), EjectionSettings::DEFAULT);
    let tuned = EjectionSettings::of(3 << OUTLIER_FAILURES_SHIFT | 30 << OUTLIER_BASE_SHIFT | OUTLIER_OFF);
    assert_eq!(tuned, EjectionSettings { failures: 3, base_ns: 30 * S });
    // Three failures eject at the third, for 30 s.
    let mut entry = OutlierEntry::default();
    let now = 100 * S;
    assert_eq!(entry.fail(now, tuned, 1, admit), Failure::Counted);
    assert_eq!(entry.fail(now + MS, tuned, 2, admit), Failure::Counted);
    assert_eq!(entry.fail(now + 2 * MS, tuned, 1, admit), Failure::Ejected(now + 2 * MS + 30 * S));
}

/// The ledger of a set with room for every ejection.
fn admit(_until: u64) -> bool {
    true
}

/// What happens to one backend, in order: `a` a connection sent, `f` a failure, at times (ms);
/// the failures come from two clients in turn.
fn run(events: &[(char, u64)]) -> (OutlierEntry, Vec<Failure>) {
    let mut entry = OutlierEntry::default();
    let mut failures = Vec::new();
    for &(event, at) in events {
        let now = 100 * S + at * MS;
        match event {
            'a' => entry.attempt(now),
            'f' => failures.push(entry.fail(now, EjectionSettings::DEFAULT, 1 + failures.len() as u32 % 2, admit)),
            _ => unreachable!(),
        }
    }
    (entry, failures)
}

fn refused(count: u64, start: u64, every: u64) -> Vec<(char, u64)> {
    (0..count).flat_map(|i| [('a', start + i * every), ('f', start + i * every + 1)]).collect()
}

#[test]
fn failures_in_a_row_eject() {
    // A refusing backend: each connection fails a millisecond after it is sent.
    let (entry, failures) = run(&refused(5, 0, 10));
    assert_eq!(failures[..4], [Failure::Counted; 4]);
    assert_eq!(failures[4], Failure::Ejected(100 * S + 41 * MS + 10 * S));
    assert_eq!((entry.failures, entry.ejections), (0, 1));
    // Failures of connections sent before the ejection count nothing more.
    let (_, failures) = run(&[refused(5, 0, 10), vec![('f', 60)]].concat());
    assert_eq!(failures[5], Failure::WhileEjected);
}

#[test]
fn a_failure_counted_on_another_cpu_at_once_still_ejects() {
    // Four failures; the fifth's add reads back six (another CPU's failure landed between its
    // add and its read, and that CPU read six too): both eject, none is lost.
    let mut entry = OutlierEntry::default();
    for ms in 0..4 {
        assert_eq!(entry.fail(100 * S + ms * MS, EjectionSettings::DEFAULT, ms as u32 % 2, admit), Failure::Counted);
    }
    let at = 100 * S + 5 * MS;
    let raced = entry.fail_adding(
        at,
        EjectionSettings::DEFAULT,
        0,
        |failures| {
            *failures += 2;
            *failures
        },
        admit,
    );
    assert_eq!(raced, Failure::Ejected(at + 10 * S));
    assert_eq!((entry.failures, entry.ejections), (0, 1));
}

#[test]
fn unanswered_handshakes_eject_though_failures_lag_a_second() {
    // Ten connections sent 100 ms apart, each failing when its SYN is retransmitted 1 s later.
    let mut events: Vec<(char, u64)> = (0..10).map(|i| ('a', i * 100)).collect();
    events.extend((0..10).map(|i| ('f', 1000 + i * 100)));
    events.sort_by_key(|&(_, at)| at);
    let (_, failures) = run(&events);
    assert!(matches!(failures[4], Failure::Ejected(_)), "{failures:?}");
}

#[test]
fn a_success_between_failures_starts_a_new_run() {
    // Four failures; a connection that does not fail within the settle time; four more.
    let mut events = refused(4, 0, 10);
    events.push(('a', 100));
    events.extend(refused(4, 100 + SETTLE_NS / MS + 1, 10));
    let (entry, failures) = run(&events);
    assert_eq!(failures, [Failure::Counted; 8]);
    assert_eq!(entry.failures, 4);
}

#[test]
fn sparse_failures_of_a_busy_backend_never_eject() {
    // One connection in a hundred refused, 1,000 connections a second, for a minute.
    let mut events = Vec::new();
    for ms in 0..60_000 {
        events.push(('a', ms));
        if ms % 100 == 99 {
            events.push(('f', ms));
        }
    }
    let (entry, failures) = run(&events);
    assert!(failures.iter().all(|f| *f == Failure::Counted), "{:?}", failures.iter().find(|f| **f != Failure::Counted));
    assert_eq!(entry.ejections, 0);
}

#[test]
fn repeated_ejections_double_and_a_quiet_window_forgives_them() {
    let mut events = refused(5, 0, 10);
    // Tried again at the end of the 10 s ejection: five more failures, 20 s.
    events.extend(refused(5, 10_100, 10));
    let (entry, failures) = run(&events);
    assert_eq!(failures[9], Failure::Ejected(100 * S + 10_141 * MS + 20 * S));
    assert_eq!(entry.ejections, 2);
    // A minute after the second ejection ends without a failure, the next ejection is 10 s.
    events.extend(refused(5, 10_141 + 20_000 + 61_000, 10));
    let (entry, _) = run(&events);
    assert_eq!(entry.ejections, 1);
}

#[test]
fn one_clients_failures_never_eject_and_a_second_clients_do() {
    // A pod whose own policy drops its SYNs fails every handshake: never ejected for the node.
    let mut entry = OutlierEntry::default();
    let failures: Vec<Failure> =
        (0..20).map(|ms| entry.fail(100 * S + ms * MS, EjectionSettings::DEFAULT, 7, admit)).collect();
    assert_eq!(failures[..4], [Failure::Counted; 4]);
    assert!(failures[4..].iter().all(|f| *f == Failure::OneClient), "{failures:?}");
    // A second pod's failure in the same run: the evidence is enough.
    let at = 100 * S + 21 * MS;
    assert_eq!(entry.fail(at, EjectionSettings::DEFAULT, 8, admit), Failure::Ejected(at + 10 * S));
    // After the ejection, a new run starts with its first failure's client alone again.
    let later = at + 10 * S + MS;
    let again: Vec<Failure> =
        (0..5).map(|ms| entry.fail(later + ms * MS, EjectionSettings::DEFAULT, 8, admit)).collect();
    assert_eq!(again[4], Failure::OneClient, "{again:?}");
}

#[test]
fn a_capped_run_is_not_ejected_and_asks_again_at_its_next_failure() {
    let mut entry = OutlierEntry::default();
    let mut ledger = OutlierLedger::default();
    // The set's one place is taken by another backend until 200 s.
    assert!(ledger.admit(100 * S, 200 * S, 1));
    let mut fail = |ms: u64, entry: &mut OutlierEntry| {
        let now = 100 * S + ms * MS;
        entry.fail(now, EjectionSettings::DEFAULT, ms as u32 % 2, |until| ledger.admit(now, until, 1))
    };
    let failures: Vec<Failure> = (0..6).map(|ms| fail(ms, &mut entry)).collect();
    assert_eq!(failures[4..], [Failure::Capped; 2]);
    assert_eq!((entry.ejections, entry.ejected_until_ns), (0, 0));
    // The other backend's ejection ends: the next failure takes the place.
    let now = 100 * S + 100_001 * MS;
    let mut entry2 = entry;
    entry2.last_failure_ns = now - MS;
    assert_eq!(
        entry2.fail(now, EjectionSettings::DEFAULT, 1, |until| ledger.admit(now, until, 1)),
        Failure::Ejected(now + 10 * S)
    );
}

#[test]
fn an_entry_made_failing_at_its_first_failure_counts_it_as_an_empty_one_does() {
    // The programs make a backend's entry at its first failure with that instant as its last
    // failure (so that pruning never takes it for quiet before the failure is counted): it
    // counts the failure, and the run that follows, exactly as an empty entry would.
    let now = 500 * S;
    let (mut made, mut empty) =
        (OutlierEntry { last_failure_ns: now, ..OutlierEntry::default() }, OutlierEntry::default());
    for (at, client) in [(now, 1), (now + MS, 1), (now + 2 * MS, 2), (now + 3 * MS, 1), (now + 4 * MS, 2)] {
        let settings = EjectionSettings::DEFAULT;
        assert_eq!(made.fail(at, settings, client, admit), empty.fail(at, settings, client, admit), "at {at}");
        assert_eq!(
            (made.failures, made.run_client, made.many_clients),
            (empty.failures, empty.run_client, empty.many_clients)
        );
    }
    assert_eq!(made.ejected_until_ns, now + 4 * MS + BASE_EJECTION_NS, "the fifth failure, from two clients, ejects");
}
