//! The overload demo, shortened: zone a's clients at a tenth, twice and a tenth of its capacity,
//! open loop, to a PreferClose Service and its feedback twin, through the real kernel and a real
//! agent. Asserts what the physics makes certain (the static twin's queue overflows) and what
//! feedback must do about it; the demo itself checks the numeric targets. Root,
//! `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use topology_tests::{
    demo::{overload, overload::OverloadConfig, overload_report},
    require_root,
};

#[test]
fn feedback_sheds_a_surge_the_static_plan_queues_and_comes_home_in_the_calm() {
    require_root!();
    // The calm is long enough that the 2–3 s the traffic takes to come home is a small part of it.
    let config = OverloadConfig { warmup_s: 4.0, surge_s: 8.0, calm_s: 20.0, ..OverloadConfig::default() };
    config.validate().unwrap();
    let out = tempfile::tempdir().unwrap();
    let report = overload::run(&config, out.path(), &mut |line| eprintln!("{line}"));
    eprintln!("{}", overload_report::table(&report));
    overload_report::write(out.path(), &report).unwrap();

    // The file has the shape the issue asks for.
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("overload.json")).unwrap()).unwrap();
    for phase in ["surge", "calm"] {
        for service in ["static", "feedback"] {
            for field in ["inZone", "p50Ms", "p99Ms", "failed"] {
                assert!(json[phase][service][field].is_number(), "{phase}.{service}.{field}: {json}");
            }
        }
    }
    let svg = std::fs::read_to_string(out.path().join("overload.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 3, "two latency lines and feedback's landings");

    // Calm before the surge: everything home, nothing fails.
    for figures in [&report.warmup.static_plan, &report.warmup.feedback] {
        assert_eq!((figures.in_zone, figures.failed), (1.0, 0), "{report:?}");
    }
    // Twice the capacity: the static twin's queue grows until connections time out.
    let (fixed, feedback) = (&report.surge.static_plan, &report.surge.feedback);
    assert_eq!(fixed.in_zone, 1.0, "PreferClose keeps the surge home");
    assert!(fixed.failed > 0 && fixed.p99_ms >= 1500.0, "{fixed:?}");
    // Feedback moves part of it out, keeps part home, and fails (almost) nothing.
    assert!(report.shift_after_s.is_some(), "{:?}", report.decisions);
    assert!(feedback.in_zone >= 1.0 / 3.0 && feedback.in_zone < 0.9, "{feedback:?}");
    assert!(feedback.p99_ms < fixed.p99_ms, "{feedback:?} vs {fixed:?}");
    assert!(feedback.failed * 20 <= fixed.failed, "{feedback:?} vs {fixed:?}");
    // The calm: it comes home.
    assert!(report.return_after_s.is_some(), "{:?}", report.decisions);
    assert!(report.calm.feedback.in_zone >= 0.9, "{:?}", report.calm);
    assert_eq!(report.calm.feedback.failed, 0, "{:?}", report.calm);
}
