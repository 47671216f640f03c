//! One pod cannot take the node's DNS relay from the others (root, real kernel): a pod asking
//! unique names outside the cluster as fast as its rate allows, of an upstream slow enough that
//! they stay in flight, cannot take the slots kept for the others; another pod's lookup, asked
//! meanwhile, is relayed and answered instead of getting SERVFAIL at once. `--test-threads=1`.

use std::{
    net::SocketAddr,
    process::{Command, Stdio},
    time::Duration,
};

use topology_tests::{
    cluster,
    dns::{Lookups, dig, start_dns_agent, start_upstream_after},
    fixture::Fixture,
    net::probe_binary,
    require_root,
    sandbox::ProcessGuard,
};

/// What the stand-in upstream answers every name with.
const ANSWER: &str = "192.0.2.7";

#[test]
fn one_pods_flood_of_unique_names_leaves_the_relay_to_the_others() {
    require_root!();
    let mut fx = Fixture::new(0);
    // An upstream that answers 1.5 s after each query: whatever is asked stays in flight.
    let (upstream, _upstream) = start_upstream_after(&mut fx.network, false, None, None, Duration::from_millis(1500));
    let upstream = SocketAddr::from((upstream.v4, 53));
    let (dns_pod, tenant, victim) = (fx.network.host("pod"), fx.network.host("pod"), fx.network.host("pod"));
    let file = fx.scratch().join("cluster.yaml");
    cluster::write(&file, &[cluster::node("node-a", "zone-a", None, "4")]);
    let _agent = start_dns_agent(&fx, &dns_pod, &file, upstream);
    let server = SocketAddr::from((dns_pod.v4, 53));

    // The tenant: 2,000 unique names in a second, each waiting for its answer.
    let mut command = Command::new(probe_binary());
    command.args(["--netns", tenant.netns.name(), "client", "--target", &server.to_string(), "--timeout-ms", "4000"]);
    command.args(["lookups", "--rate", "2000", "--seconds", "1", "--threads", "1500", "--name", "t{n}.example.com"]);
    let flood = ProcessGuard::new(command.stdout(Stdio::piped()).spawn().expect("spawn the flood"));
    std::thread::sleep(Duration::from_millis(600));

    // Meanwhile another pod asks one name: relayed, and answered when the upstream answers.
    let asked = dig(Some(victim.netns.name()), server, "v1.example.com", "A", &[]);
    assert_eq!(
        (asked.status.as_str(), asked.data.as_slice()),
        ("NOERROR", [ANSWER.to_owned()].as_slice()),
        "{asked:?}"
    );

    let flooded: Lookups = serde_json::from_slice(&flood.wait_output(Duration::from_secs(30))).expect("report");
    eprintln!("the flood: {flooded:?}; the other pod's lookup: {asked:?}");
    // The tenant got its share relayed and answered; the rest of its burst SERVFAIL at once.
    let answered = flooded.answers.get(ANSWER).copied().unwrap_or(0);
    assert!(answered >= 64, "at least its share relayed: {flooded:?}");
    assert!(flooded.failed > 0, "beyond its share, refused: {flooded:?}");
}
