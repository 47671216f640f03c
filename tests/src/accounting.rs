//! What a running agent counted of cross-zone bytes, and what the client's interface carried: the
//! accounting root tests' readings.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use crate::agent::Agent;

/// A count's labels: (service, to_zone, direction).
pub type Key = (String, String, String);

/// The key of `namespace/name:port` to `zone` in `direction`.
pub fn key(service: &str, zone: &str, direction: &str) -> Key {
    (service.to_owned(), zone.to_owned(), direction.to_owned())
}

/// `topology_agent_bytes_total` by (service, to_zone, direction), all from `from_zone`; services
/// whose label starts with `skip` are left out.
pub fn counted(agent: &Agent, from_zone: &str, skip: Option<&str>) -> BTreeMap<Key, u64> {
    let metrics = agent.get("/metrics").expect("metrics").1;
    let label = |line: &str, name: &str| -> String {
        let start = line.find(&format!("{name}=\"")).map(|at| at + name.len() + 2);
        start.and_then(|at| line[at..].split('"').next()).unwrap_or_default().to_owned()
    };
    metrics
        .lines()
        .filter(|line| line.starts_with("topology_agent_bytes_total{"))
        .filter(|line| skip.is_none_or(|skip| !label(line, "service").starts_with(skip)))
        .map(|line| {
            assert_eq!(label(line, "from_zone"), from_zone, "{line}");
            let value = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()).expect("a value") as u64;
            ((label(line, "service"), label(line, "to_zone"), label(line, "direction")), value)
        })
        .collect()
}

/// Waits (at most 30 s: the agent reads every 10 s) until every count of `expected` is reached
/// by [`counted`]; returns the last counts.
pub fn counted_within(
    agent: &Agent,
    from_zone: &str,
    skip: Option<&str>,
    expected: &BTreeMap<Key, u64>,
) -> BTreeMap<Key, u64> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = counted(agent, from_zone, skip);
        if expected.iter().all(|(key, want)| now.get(key) == Some(want)) || Instant::now() > deadline {
            return now;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Bytes and packets the interface `eth0` of namespace `netns` sent, from its counters.
pub fn interface_tx(netns: &str) -> (u64, u64) {
    let output = std::process::Command::new("ip")
        .args(["-n", netns, "-j", "-s", "link", "show", "eth0"])
        .output()
        .expect("ip link");
    let links: serde_json::Value = serde_json::from_slice(&output.stdout).expect("ip -j output");
    let tx = &links[0]["stats64"]["tx"];
    (tx["bytes"].as_u64().expect("tx bytes"), tx["packets"].as_u64().expect("tx packets"))
}
