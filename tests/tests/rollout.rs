//! The rollout demo, shortened (two pods per zone): every mode's Service over the same pods while
//! they are replaced one at a time, through the real kernel and a real agent with
//! `--terminate-sockets all`. Root, `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use topology_tests::{
    demo::rollout::{self, RolloutConfig},
    require_root,
};

#[test]
fn a_rollout_keeps_each_mode_in_zone_fails_nothing_and_ends_no_serving_socket() {
    require_root!();
    let config = RolloutConfig { pods_per_zone: 2, ..RolloutConfig::default() };
    config.validate().unwrap();
    let out = tempfile::tempdir().unwrap();
    let report = rollout::run(&config, out.path(), &mut |line| eprintln!("{line}"));
    eprintln!("{}", serde_json::to_string_pretty(&report).unwrap());
    for mode in &report.modes {
        assert!(mode.connections > 0, "{mode:?}");
        assert_eq!(mode.failed, 0, "no connection fails while pods are replaced: {mode:?}");
        assert_eq!(mode.resets_to_serving, 0, "no socket of a serving backend is ended: {mode:?}");
        match mode.mode.as_str() {
            // No topology: a third of the pods are in this zone, before and during.
            "default" => assert!(mode.steady_in_zone < 0.6, "{mode:?}"),
            // What kube-proxy does with hints: ignored while a pod not ready yet has none.
            "hints" => assert!(mode.steady_in_zone > 0.99, "{mode:?}"),
            // Every mode this agent decides itself keeps its share through the rollout.
            _ => {
                assert!(mode.steady_in_zone > 0.99, "{mode:?}");
                assert!(mode.rollout_in_zone >= 0.95 * mode.steady_in_zone, "{mode:?}");
            }
        }
    }
    assert!(report.modes.iter().map(|m| m.ended_on_departure).sum::<usize>() > 0, "the departures ended sockets");
    assert!(report.scale_up_max_share > 0.0 && report.scale_up_max_share <= 1.1 + 1e-9, "{report:?}");
    // The chart: a line per mode over the steady traffic and the rollout.
    for mode in &report.modes {
        let (before, during) =
            (mode.series.iter().filter(|(s, _)| *s < 0.0), mode.series.iter().filter(|(s, _)| *s > 0.0));
        assert!(before.count() > 0 && during.count() > 0, "{mode:?}");
    }
    report.write(out.path()).unwrap();
    let chart = std::fs::read_to_string(out.path().join("rollout.svg")).unwrap();
    assert_eq!(chart.matches("<polyline").count(), report.modes.len());
    assert!(std::fs::read_to_string(out.path().join("rollout.md")).unwrap().contains("rollout.svg"));
}
