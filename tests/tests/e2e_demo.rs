//! The demo's main job on the real Kubernetes (root, real kernel): the default plan — six nodes in
//! three zones, a Service per policy beside its twin — with the real EndpointSlice controller
//! writing every slice and hint and the agents deployed from `deploy/`; the same landing shares
//! and failovers the embedded demo must show. `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use topology_tests::{
    demo::{self, DemoConfig, DemoNodes as _, real::RealDemo},
    kubernetes::Binaries,
    require_root,
};

#[test]
fn the_demo_on_the_real_control_plane_lands_every_policy_where_it_should() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let config = DemoConfig { connections: 200, ..DemoConfig::default() };
    let dir = std::env::temp_dir().join(format!("topology-demo-real-{}", std::process::id()));
    let mut real = RealDemo::start(&config, &dir, binaries);
    let results = demo::measure(&real, config.connections, &mut |_, _| {});
    eprintln!("{}\n{}", real.version, demo::report::table(&results));
    demo::expect::landings(&results, real.nodes() as u64, config.connections);
    let failover = demo::failover(&mut real);
    eprintln!("{}", demo::report::failover_sentence(&failover));
    demo::expect::failover(&failover);
    let pod = demo::pod_failover(&mut real);
    eprintln!("{}", demo::pod_failover_line(&pod));
    demo::expect::pod_failover(&pod);
    drop(real);
    let _ = std::fs::remove_dir_all(&dir);
}
