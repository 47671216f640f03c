//! The outlier ejection annotation: each value's port options, and the warning of what is ignored.

use topology_model::objects::ANNOTATION_OUTLIER_EJECTION;

use super::world::*;
use crate::{desired::PortOptions, policy};

#[test]
fn the_annotation_turns_ejection_off_or_tunes_it_and_names_what_it_ignores() {
    let cases: [(&str, PortOptions, Option<&str>); 8] = [
        ("on", PortOptions::default(), None),
        ("off", PortOptions { outlier_off: true, ..PortOptions::default() }, None),
        ("failures=3", PortOptions { outlier_failures: 3, ..PortOptions::default() }, None),
        (
            "failures=3, base=30s",
            PortOptions { outlier_failures: 3, outlier_base_s: 30, ..PortOptions::default() },
            None,
        ),
        ("base=255", PortOptions { outlier_base_s: 255, ..PortOptions::default() }, None),
        ("failures=0,base=1s", PortOptions { outlier_base_s: 1, ..PortOptions::default() }, Some("\"failures=0\"")),
        ("failures=16, base=300s", PortOptions::default(), Some("\"failures=16\", \"base=300s\"")),
        ("sometimes", PortOptions::default(), Some("\"sometimes\"")),
    ];
    for (value, expected, ignored) in cases {
        let mut svc = service("web");
        svc.agent_annotations.insert(ANNOTATION_OUTLIER_EJECTION.into(), value.into());
        let state = with(svc, endpoints(false));
        let selections = policy::compute(&state, "a1").unwrap();
        assert_eq!(selections.len(), 1);
        assert_eq!(selections[0].options, expected, "{value}");
        let warning = selections[0].selection.warnings.iter().find(|w| w.contains(ANNOTATION_OUTLIER_EJECTION));
        match ignored {
            None => assert!(warning.is_none(), "{value}: {warning:?}"),
            Some(parts) => {
                let warning = warning.unwrap_or_else(|| panic!("{value}: no warning"));
                assert!(warning.contains(&format!("{parts} ignored")), "{value}: {warning}");
            }
        }
        // What the kernel holds reads back as the same options.
        assert_eq!(PortOptions::from_kernel(&expected.to_kernel()), expected, "{value}");
    }
}
