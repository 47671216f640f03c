//! Root integration tests of the dataplane's life cycle: restarts adopt the pinned state without
//! a gap, capacities are enforced, and cleanup leaves nothing behind. `--test-threads=1`.
//!
//! Tier: kernel (root; the real kernel, one test at a time).

use std::{net::SocketAddr, path::Path, time::Duration};

use aya::programs::links::{FdLink, PinnedLink};
use topology_common::{map_names, program_names};
use topology_dataplane::{Capacities, Dataplane, DataplaneError, KernelLogLevel, PinLayout};
use topology_model::Protocol;
use topology_policy::desired::{DesiredService, DesiredState, PortOptions};
use topology_tests::{
    fixture::{Fixture, service},
    require_root,
    sandbox::run,
};

fn addr(text: &str) -> SocketAddr {
    text.parse().expect("socket address")
}

/// Three TCP services over the fixture's backends: .1 -> all, .2 -> b0 only, .3 -> refused.
fn three_services(fx: &Fixture) -> DesiredState {
    let mut desired = DesiredState::default();
    let all = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    desired.services.insert(
        service("10.96.1.1", 80, Protocol::Tcp),
        // Under feedback: the load signal measures its connections.
        DesiredService {
            name: "ns/all:http".into(),
            backends: all,
            options: PortOptions { measured: true, ..PortOptions::default() },
        },
    );
    let one = vec![fx.backends[0].weighted(false, 1)];
    desired.services.insert(
        service("10.96.1.2", 80, Protocol::Tcp),
        DesiredService { name: "ns/one:http".into(), backends: one, ..Default::default() },
    );
    desired.services.insert(
        service("10.96.1.3", 80, Protocol::Tcp),
        DesiredService { name: "ns/none:http".into(), backends: vec![], ..Default::default() },
    );
    desired
}

#[test]
fn traffic_outlives_the_agent_and_a_restart_adopts_without_rewriting() {
    require_root!();
    let fx = Fixture::new(2);
    let desired = three_services(&fx);
    let programmed = {
        let mut dp = Dataplane::open(&fx.config()).expect("open");
        let report = dp.apply(&desired);
        assert_eq!((report.added, report.failed.len()), (3, 0), "{report:?}");
        assert_eq!(dp.batch_refusals(), 0, "the new ports went in batched map updates");
        dp.kernel().clone()
    };
    // No agent: the pinned links and maps keep serving.
    let result = fx.place().tcp(addr("10.96.1.2:80"), 20);
    assert_eq!(result.landed_on("b0"), 20, "{result:?}");

    let mut dp = Dataplane::open(&fx.config()).expect("reopen");
    assert_eq!(dp.kernel(), &programmed, "the restarted agent sees exactly what was programmed");
    let report = dp.apply(&desired);
    assert_eq!(
        (report.unchanged, report.added, report.updated, report.removed, report.slots_written),
        (3, 0, 0, 0, 0),
        "nothing is rewritten: {report:?}"
    );
    let refused = fx.place().tcp(addr("10.96.1.3:80"), 5);
    assert_eq!(refused.errno("ECONNREFUSED"), 5, "{refused:?}");
}

/// The program behind each pinned link, by program name.
fn attached_programs(fx: &Fixture) -> Vec<(&'static str, u32)> {
    program_names::ALL
        .into_iter()
        .filter_map(|name| {
            let pinned = PinnedLink::from_pin(PinLayout::new(fx.pins.path()).link(name)).ok()?;
            Some((name, FdLink::from(pinned).info().expect("link info").program_id()))
        })
        .collect()
}

#[test]
fn a_restart_keeps_the_attached_programs_unless_something_changed() {
    require_root!();
    let fx = Fixture::new(2);
    let desired = three_services(&fx);
    Dataplane::open(&fx.config()).expect("open").apply(&desired);
    let loaded = attached_programs(&fx);
    assert_eq!(loaded.len(), program_names::ALL.len(), "{loaded:?}");

    let dp = Dataplane::open(&fx.config()).expect("reopen");
    assert_eq!(attached_programs(&fx), loaded, "the same programs stay attached, none loaded");
    assert_eq!(dp.kernel().services.len(), 3, "the pinned state is adopted");
    let result = fx.place().tcp(addr("10.96.1.2:80"), 10);
    assert_eq!(result.landed_on("b0"), 10, "{result:?}");
    drop(dp);

    // Another option is other programs: they are loaded, and replace the attached ones.
    let mut config = fx.config();
    config.programs.kernel_log = KernelLogLevel::Error;
    let mut dp = Dataplane::open(&config).expect("reopen with the kernel log on");
    let relogged = attached_programs(&fx);
    assert!(relogged.iter().zip(&loaded).all(|(now, before)| now.1 != before.1), "{relogged:?} vs {loaded:?}");
    drop(dp.take_logger());
    drop(dp);

    // Back to the first options: the marker of the first load is gone, so they load once more.
    drop(Dataplane::open(&fx.config()).expect("reopen"));
    let reloaded = attached_programs(&fx);
    assert!(reloaded.iter().zip(&relogged).all(|(now, before)| now.1 != before.1), "{reloaded:?}");

    // A link removed behind the agent's back: the restart loads and attaches everything again.
    std::fs::remove_file(PinLayout::new(fx.pins.path()).link(program_names::CONNECT4)).expect("remove a link pin");
    let dp = Dataplane::open(&fx.config()).expect("reopen without a link");
    assert_eq!(attached_programs(&fx).len(), program_names::ALL.len());
    let result = fx.place().tcp(addr("10.96.1.1:80"), 10);
    assert_eq!(result.failures(), 0, "{result:?}");
    drop(dp);
    let attached = run("bpftool", &["cgroup", "show", &fx.cgroup.path().to_string_lossy()]);
    assert_eq!(attached.lines().filter(|l| l.contains("connect4")).count(), 1, "{attached}");
}

#[test]
fn restarting_under_load_drops_no_connection() {
    require_root!();
    let fx = Fixture::new(2);
    let desired = three_services(&fx);
    Dataplane::open(&fx.config()).expect("open").apply(&desired);
    let client = fx.place().spawn_loop(addr("10.96.1.1:80"), &fx.scratch(), Duration::from_secs(60), false);
    for restart in 0..10 {
        // Each open loads new programs (the kernel log switched on and off, so none is kept),
        // attaches them, then detaches the previous links.
        let mut config = fx.config();
        config.programs.kernel_log = if restart % 2 == 0 { KernelLogLevel::Error } else { KernelLogLevel::Off };
        let mut dp = Dataplane::open(&config).expect("reopen");
        assert_eq!(dp.apply(&desired).unchanged, 3);
    }
    let result = client.finish();
    assert_eq!(result.failures(), 0, "{result:?}");
    assert!(result.attempts > 100, "{result:?}");
    let attached = run("bpftool", &["cgroup", "show", &fx.cgroup.path().to_string_lossy()]);
    assert_eq!(
        attached.lines().filter(|l| l.contains("connect4")).count(),
        1,
        "exactly one connect4 program remains attached after the restarts:\n{attached}"
    );
}

#[test]
fn stale_services_are_removed_on_the_first_apply_after_a_restart() {
    require_root!();
    let fx = Fixture::new(1);
    let desired = three_services(&fx);
    Dataplane::open(&fx.config()).expect("open").apply(&desired);
    let mut smaller = desired.clone();
    smaller.services.remove(&service("10.96.1.2", 80, Protocol::Tcp));
    let mut dp = Dataplane::open(&fx.config()).expect("reopen");
    let report = dp.apply(&smaller);
    assert_eq!((report.removed, report.unchanged), (1, 2), "{report:?}");
    let gone = fx.place().tcp(addr("10.96.1.2:80"), 3);
    assert_eq!(gone.errno("ENETUNREACH"), 3, "a removed service is no longer rewritten: {gone:?}");
    let snapshot = topology_dataplane::read_pins(fx.pins.path()).expect("snapshot");
    assert_eq!(snapshot.kernel.services.len(), 2);
    assert_eq!(snapshot.counters.len(), 2, "only service entries have counters");
}

#[test]
fn a_slot_of_another_set_is_never_used_and_a_restart_rewrites_the_damaged_set() {
    require_root!();
    let fx = Fixture::new(1);
    let one = service("10.96.1.2", 80, Protocol::Tcp);
    let base = {
        let mut dp = Dataplane::open(&fx.config()).expect("open");
        dp.apply(&three_services(&fx));
        dp.kernel().services[&one].base
    };
    // Overwrite the only slot of 10.96.1.2 with a slot of set 999 pointing at 0.0.0.0:0, as a
    // hand edit or a bug could: the program must refuse to use it.
    let slots = fx.pins.path().join("maps/topo_slots").to_string_lossy().into_owned();
    let key: Vec<String> = base.to_le_bytes().iter().map(|b| format!("{b:02x}")).collect();
    let mut value = vec!["00".to_owned(); 48];
    value[..4].clone_from_slice(&["e7".to_owned(), "03".to_owned(), "00".to_owned(), "00".to_owned()]);
    let mut args = vec!["map", "update", "pinned", &slots, "key", "hex"];
    args.extend(key.iter().map(String::as_str));
    args.extend(["value", "hex"]);
    args.extend(value.iter().map(String::as_str));
    run("bpftool", &args);

    let broken = fx.place().tcp(addr("10.96.1.2:80"), 20);
    assert_eq!(broken.errno("ENETUNREACH"), 20, "a slot of another set is never used: {broken:?}");

    let mut dp = Dataplane::open(&fx.config()).expect("reopen");
    assert!(!dp.kernel().services[&one].intact(), "adoption sees the damage");
    let report = dp.apply(&three_services(&fx));
    assert_eq!((report.updated, report.unchanged), (1, 2), "{report:?}");
    let repaired = fx.place().tcp(addr("10.96.1.2:80"), 20);
    assert_eq!(repaired.landed_on("b0"), 20, "{repaired:?}");
}

#[test]
fn maps_pinned_by_another_version_are_refused_with_the_fix() {
    require_root!();
    let fx = Fixture::new(0);
    // The slots map as an older agent pinned it: a hash keyed by (set id, index).
    let maps = fx.pins.path().join("maps");
    std::fs::create_dir_all(&maps).expect("maps directory");
    let slots = maps.join("topo_slots").to_string_lossy().into_owned();
    let args = ["map", "create", &slots, "type", "hash", "key", "8", "value", "44", "entries", "262144"];
    run("bpftool", &[&args[..], &["name", "topo_slots", "flags", "1"]].concat());
    let error = Dataplane::open(&fx.config()).err().expect("the old layout is refused");
    assert!(matches!(error, DataplaneError::PinnedLayout { map: "topo_slots", .. }), "{error}");
    assert_eq!(
        error.to_string(),
        "pinned map topo_slots is a hash map, key 8 B, value 44 B but these programs declare an array map, key 4 B, \
         value 48 B (pinned by another version?); run `topology-agent cleanup` to recreate the maps"
    );
    let attached = run("bpftool", &["cgroup", "show", &fx.cgroup.path().to_string_lossy()]);
    assert!(!attached.contains("connect4"), "nothing was attached: {attached}");
}

#[test]
fn pins_are_versioned_upgraded_one_step_and_another_layout_is_refused_untouched() {
    require_root!();
    let fx = Fixture::new(0);
    let marker = fx.pins.path().join("layout");
    let retired = fx.pins.path().join("maps/topo_dns_beat");
    drop(Dataplane::open(&fx.config()).expect("open on no pins"));
    assert!(marker.join("v1").is_dir(), "the pins carry their layout version");

    // The pins of a 0.x agent: no marker, and a map that layout 1 retired.
    std::fs::remove_dir_all(&marker).expect("remove the marker");
    let args = ["map", "create", &retired.to_string_lossy(), "type", "array", "key", "4", "value", "8", "entries", "1"];
    run("bpftool", &[&args[..], &["name", "topo_dns_beat"]].concat());
    drop(Dataplane::open(&fx.config()).expect("upgrade"));
    assert!(!retired.exists(), "the upgrade removed the retired map");
    assert!(marker.join("v1").is_dir(), "and marked the pins");

    // A layout this agent does not know (a newer agent's): refused, nothing touched.
    std::fs::create_dir(marker.join("v2")).expect("plant a second marker");
    std::fs::remove_dir(marker.join("v1")).expect("remove the first");
    let error = Dataplane::open(&fx.config()).err().expect("another layout is refused");
    assert!(matches!(error, DataplaneError::PinLayout { .. }), "{error}");
    let message = error.to_string();
    assert!(message.contains("holds layout v2; this agent writes v1 and upgrades only from unversioned"), "{message}");
    assert!(marker.join("v2").is_dir() && !marker.join("v1").exists(), "the marker is left as it was");
    let status = topology_dataplane::read_pins(fx.pins.path()).expect_err("status refuses it too");
    assert!(status.to_string().contains("holds layout v2"), "{status}");
    topology_dataplane::cleanup(fx.pins.path()).expect("cleanup");
    assert!(!fx.pins.path().exists(), "cleanup removes the marker with the pins");
}

#[test]
fn a_full_map_is_an_error_naming_it_and_nothing_is_half_written() {
    require_root!();
    let fx = Fixture::new(3);
    let mut config = fx.config();
    config.programs.capacities = Capacities { slots: 4, services_v4: 2, ..Capacities::default() };
    let mut dp = Dataplane::open(&config).expect("open");
    let mut desired = DesiredState::default();
    let all: Vec<_> = fx.backends.iter().map(|b| b.weighted(false, 1)).collect();
    for last in 1..=3 {
        desired.services.insert(
            service(&format!("10.96.2.{last}"), 80, Protocol::Tcp),
            DesiredService { name: format!("ns/s{last}:http"), backends: all.clone(), ..Default::default() },
        );
    }
    let report = dp.apply(&desired);
    assert_eq!(report.added, 1, "{report:?}");
    assert_eq!(report.failed.len(), 2);
    assert_eq!(dp.batch_refusals(), 0, "room is checked before any batch");
    for (port, error) in &report.failed {
        assert!(matches!(error, DataplaneError::MapFull { map: "topo_slots", .. }), "{port}: {error}");
        assert_eq!(error.to_string(), "map topo_slots is full: 6 entries needed, capacity 4");
    }
    assert_eq!(dp.kernel().slot_entries(), 3, "the failed services wrote no slot");
    let snapshot = topology_dataplane::read_pins(fx.pins.path()).expect("snapshot");
    assert_eq!(snapshot.kernel.slot_entries(), 3);
    assert_eq!(snapshot.kernel.services.len(), 1);
    // The service that fit works; the others are not programmed at all.
    assert_eq!(fx.place().tcp(addr("10.96.2.1:80"), 10).successes(), 10);
    assert_eq!(fx.place().tcp(addr("10.96.2.2:80"), 2).errno("ENETUNREACH"), 2);

    // A third IPv4 service entry exceeds topo_svc4.
    let mut small = DesiredState::default();
    for last in 1..=3 {
        small.services.insert(
            service(&format!("10.96.3.{last}"), 80, Protocol::Tcp),
            DesiredService { name: format!("ns/e{last}:http"), ..Default::default() },
        );
    }
    let report = dp.apply(&small);
    assert_eq!(report.failed.len(), 1, "{report:?}");
    assert!(matches!(report.failed[0].1, DataplaneError::MapFull { map: "topo_svc4", needed: 3, capacity: 2 }));
}

#[test]
fn reopening_with_other_capacities_is_refused() {
    require_root!();
    let fx = Fixture::new(1);
    drop(Dataplane::open(&fx.config()).expect("open"));
    let mut config = fx.config();
    config.programs.capacities.slots = 1000;
    let Err(error) = Dataplane::open(&config) else { panic!("reopen with another capacity must fail") };
    assert!(matches!(error, DataplaneError::CapacityMismatch { map: "topo_slots", configured: 1000, .. }), "{error}");
}

#[test]
fn a_pin_path_outside_bpffs_is_a_clear_error() {
    require_root!();
    let fx = Fixture::new(1);
    let mut config = fx.config();
    config.pin_path = std::env::temp_dir().join(format!("{}-notbpffs", fx.id));
    let Err(error) = Dataplane::open(&config) else { panic!("must fail") };
    assert!(matches!(error, DataplaneError::NotBpffs { .. }), "{error}");
    assert!(!config.pin_path.exists(), "nothing is created outside bpffs");
}

#[test]
fn cleanup_leaves_no_attachment_pin_cgroup_or_namespace() {
    require_root!();
    let (cgroup, pins, namespaces) = {
        let fx = Fixture::new(1);
        let mut dp = Dataplane::open(&fx.config()).expect("open");
        dp.apply(&three_services(&fx));
        let cgroup = fx.cgroup.path().to_path_buf();
        let attached = run("bpftool", &["cgroup", "show", &cgroup.to_string_lossy()]);
        for program in program_names::ALL {
            assert!(attached.contains(program), "{program} attached:\n{attached}");
        }
        drop(dp);
        let report = topology_dataplane::cleanup(fx.pins.path()).expect("cleanup");
        // The socket-address programs, and the program at a TCP socket's end (the load signal).
        assert_eq!(report.links.len(), program_names::ALL.len() + program_names::CLOSED.len(), "{:?}", report.links);
        let chunks = report.maps.iter().filter(|p| p.to_string_lossy().contains(map_names::COUNTER_CHUNK)).count();
        assert_eq!((report.maps.len() - chunks, chunks), (map_names::PINNED.len(), 1), "{:?}", report.maps);
        let attached = run("bpftool", &["cgroup", "show", &cgroup.to_string_lossy()]);
        assert!(attached.trim().is_empty(), "nothing stays attached after cleanup:\n{attached}");
        assert!(!fx.pins.path().exists());
        assert!(topology_dataplane::cleanup(fx.pins.path()).expect("idempotent").links.is_empty());
        let namespaces = run("ip", &["netns", "list"])
            .lines()
            .filter(|l| l.starts_with(&fx.id))
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
            .collect::<Vec<_>>();
        assert!(namespaces.len() >= 3, "fabric, client and backend namespaces existed: {namespaces:?}");
        (cgroup, fx.pins.path().to_path_buf(), namespaces)
    };
    assert!(!cgroup.exists(), "the cgroup is removed");
    assert!(!pins.exists(), "the pins are removed");
    let left = run("ip", &["netns", "list"]);
    for name in namespaces {
        assert!(!left.contains(&name), "namespace {name} is removed: {left}");
    }
    assert!(!Path::new(&pins).exists());
}

#[test]
fn cleanup_check_finds_a_program_still_attached_without_a_pin() {
    require_root!();
    let fx = Fixture::new(1);
    let mut dp = Dataplane::open(&fx.config()).expect("open");
    dp.apply(&three_services(&fx));
    drop(dp);
    // A process holds connect4's link and its pin is gone (an agent killed between attaching and
    // pinning would leave this): cleanup finds no pin for it, and the program keeps running.
    let pin = PinLayout::new(fx.pins.path()).link("connect4");
    let held = FdLink::from(PinnedLink::from_pin(&pin).expect("open the pinned link"));
    std::fs::remove_file(&pin).expect("unpin");
    topology_dataplane::cleanup(fx.pins.path()).expect("cleanup");
    let check = |cgroup: &Path| {
        std::process::Command::new(topology_tests::net::agent_binary())
            .args(["cleanup", "--check", "--pin-path"])
            .arg(fx.pins.path())
            .arg("--cgroup")
            .arg(cgroup)
            .output()
            .expect("run cleanup --check")
    };
    let out = check(fx.cgroup.path());
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success() && said.contains("still attached to") && said.contains("connect4"), "{said}");
    // Its last holder gone, the link goes with it.
    drop(held);
    let out = check(fx.cgroup.path());
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn status_prints_what_the_kernel_holds() {
    require_root!();
    let fx = Fixture::new(2);
    let mut dp = Dataplane::open(&fx.config()).expect("open");
    dp.apply(&three_services(&fx));
    assert_eq!(fx.place().tcp(addr("10.96.1.1:80"), 10).successes(), 10);
    let pins = fx.pins.path().to_string_lossy().into_owned();
    let agent = topology_tests::net::agent_binary();
    let json = run(&agent.to_string_lossy(), &["status", "--pin-path", &pins, "--output", "json"]);
    let status: serde_json::Value = serde_json::from_str(&json).expect("status JSON");
    assert_eq!(status["attached"].as_array().map(Vec::len), Some(9), "{status}");
    let services = status["services"].as_array().expect("services");
    let all = services.iter().find(|s| s["service"] == "ns/all:http").expect("ns/all:http");
    assert_eq!(all["clusterIp"], "10.96.1.1");
    assert_eq!(all["backends"].as_array().map(Vec::len), Some(2));
    assert!((all["backends"][0]["share"].as_f64().unwrap() - 0.5).abs() < 1e-6);
    assert_eq!(all["counters"]["zone"], 10, "the kernel counted ten rewrites to zone backends");
    let none = services.iter().find(|s| s["service"] == "ns/none:http").expect("ns/none:http");
    assert_eq!(none["reject"], true);
    let table = run(&agent.to_string_lossy(), &["status", "--pin-path", &pins]);
    assert!(
        table.contains(
            "8 of 8 socket-address programs attached, 3 service ports; load signal measuring (a TCP port is measured)"
        ),
        "{table}"
    );
    // The ten connections, each closed: measured per backend by the load signal.
    let measured = status["backendLoad"].as_array().expect("backendLoad");
    let connects: u64 = measured.iter().map(|m| m["connects"].as_u64().unwrap_or(0)).sum();
    assert_eq!(connects, 10, "{status}");
    assert!(table.contains("in flight 0, "), "{table}");
    assert!(table.contains("ns/one:http  10.96.1.2:80/TCP"), "{table}");
}
