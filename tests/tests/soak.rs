//! The crash-mid-write soak at CI size (root, real kernel): 20 SIGKILLs of the agent at random
//! moments after a change, under eight client loops; `cargo xtask bench soak` runs 200.
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use topology_tests::{fixture::Fixture, require_root, soak};

#[test]
fn twenty_kills_mid_write_fail_no_connection_and_leave_a_consistent_kernel() {
    require_root!();
    let fx = Fixture::new(6);
    let report = soak::run(&fx, 20, 0x5eed);
    eprintln!(
        "soak: {} kills, {} edits ({} swaps) in {:?}; {} attempts, {} landings checked; restarts {:?}",
        report.kills,
        report.edits,
        report.swaps,
        report.elapsed,
        report.attempts,
        report.landings,
        report.restarts.iter().max()
    );
    assert!(report.inconsistent.is_empty(), "{:?}", report.inconsistent);
    assert!(report.failures.is_empty(), "no connection may fail: {:?}", report.failures);
    assert!(
        report.violations.is_empty(),
        "{} bad landings, first: {:?}",
        report.violations.len(),
        report.violations.first()
    );
    let seconds = report.elapsed.as_secs_f64();
    assert!(report.attempts as f64 / seconds >= 200.0, "{} attempts in {seconds:.0} s", report.attempts);
    assert!(report.swaps as f64 / seconds >= 50.0, "{} swaps in {seconds:.0} s", report.swaps);
}
