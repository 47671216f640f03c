//! The golden scenarios (`testdata/scenarios/*.txtar`, see [`scenario`](super::super::scenario))
//! over the in-memory maps, compared with the expectations their files keep. After a deliberate
//! change, `UPDATE_GOLDEN=1 cargo test -p topology-agent scenarios` rewrites the expectations in
//! place (never the script or its inputs); review the diff.

use std::{fs, path::Path};

use topology_dataplane::memory::MemoryMaps;

use super::super::{
    recording::MemoryKernel,
    scenario::{self, script::Archive},
};

#[test]
fn scenarios_match_their_expectations() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/scenarios");
    let mut cases: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "txtar"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 15, "the scenarios are missing from {}", root.display());
    let update = std::env::var_os("UPDATE_GOLDEN").is_some();
    let mut stale = Vec::new();
    for path in cases {
        let (origin, text) = (path.display().to_string(), fs::read_to_string(&path).unwrap());
        let found = scenario::run(&origin, &text, &mut MemoryKernel::new, MemoryMaps::dump)
            .unwrap_or_else(|error| panic!("{error}"));
        if update {
            fs::write(&path, found.to_string()).unwrap();
        } else {
            stale.extend(scenario::differences(&origin, &Archive::parse(&text), &found));
        }
    }
    assert!(stale.is_empty(), "scenarios differ (UPDATE_GOLDEN=1 to accept):\n{}", stale.join("\n"));
}

#[test]
fn a_file_no_step_uses_is_refused_not_kept() {
    let script = "node node-a\ncluster one.yaml\nsync\nmaps one.maps\n-- one.yaml --\n-- one.maps --\n-- old.maps --\n";
    let Err(error) = scenario::run("inline", script, &mut MemoryKernel::new, MemoryMaps::dump) else {
        panic!("a stray expectation is refused");
    };
    assert_eq!(error, "inline: no step reads or writes file old.maps");
}
