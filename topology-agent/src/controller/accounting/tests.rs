use topology_model::yaml;

use super::*;

/// Node a in zone-a; `web` (port 80) with one backend in each of zone-a and zone-b, `db` (port
/// 5432) with one in zone-b.
const CLUSTER: &str = r#"
apiVersion: v1
kind: List
items:
- {apiVersion: v1, kind: Node, metadata: {name: node-a, labels: {topology.kubernetes.io/zone: zone-a}}}
- {apiVersion: v1, kind: Node, metadata: {name: node-b, labels: {topology.kubernetes.io/zone: zone-b}}}
- apiVersion: v1
  kind: Service
  metadata: {name: web, namespace: default}
  spec: {clusterIP: 10.96.0.10, ports: [{name: http, port: 80}]}
- apiVersion: v1
  kind: Service
  metadata: {name: db, namespace: default}
  spec: {clusterIP: 10.96.0.20, ports: [{name: pg, port: 5432}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: web-1, namespace: default, labels: {kubernetes.io/service-name: web}}
  addressType: IPv4
  ports: [{name: http, port: 8080}]
  endpoints:
  - {addresses: [10.0.0.1], nodeName: node-a, conditions: {ready: true}}
  - {addresses: [10.0.0.2], nodeName: node-b, conditions: {ready: true}}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: db-1, namespace: default, labels: {kubernetes.io/service-name: db}}
  addressType: IPv4
  ports: [{name: pg, port: 5432}]
  endpoints:
  - {addresses: [10.0.0.3], nodeName: node-b, conditions: {ready: true}}
"#;

fn plan() -> NodePlan {
    NodePlan::build(&yaml::parse(CLUSTER, "test").unwrap(), "node-a", None).unwrap()
}

/// The zones the cluster's Nodes carry.
fn zones() -> BTreeSet<&'static str> {
    BTreeSet::from(["zone-a", "zone-b"])
}

fn count(service: &str, backend: &str, to_backend: u64, from_backend: u64) -> CountedBytes {
    CountedBytes {
        service: service.parse().unwrap(),
        protocol: 6,
        backend: backend.parse().unwrap(),
        bytes: ByteCount { to_backend, from_backend },
    }
}

fn labels(service: &str, to_zone: &str, direction: &'static str) -> BytesLabels {
    BytesLabels { service: service.into(), from_zone: "zone-a".into(), to_zone: to_zone.into(), direction }
}

#[test]
fn each_reading_adds_what_each_count_gained_under_its_port_and_zones() {
    let (plan, mut accounting) = (plan(), Accounting::default());
    let first = accounting.update(
        vec![
            count("10.96.0.10:80", "10.0.0.1:8080", 100, 1000),
            count("10.96.0.10:80", "10.0.0.2:8080", 50, 500),
            count("10.96.0.20:5432", "10.0.0.3:5432", 7, 0),
        ],
        &plan,
        ("zone-a", &zones()),
        10,
    );
    assert_eq!(
        first.labels,
        BTreeMap::from([
            (labels("default/db:pg", "zone-b", "to_backend"), 7),
            (labels("default/web:http", "zone-a", "from_backend"), 1000),
            (labels("default/web:http", "zone-a", "to_backend"), 100),
            (labels("default/web:http", "zone-b", "from_backend"), 500),
            (labels("default/web:http", "zone-b", "to_backend"), 50),
        ])
    );
    // The next reading: the web backend in zone-b moved 10 more bytes each way; the others nothing.
    let second = accounting.update(
        vec![
            count("10.96.0.10:80", "10.0.0.1:8080", 100, 1000),
            count("10.96.0.10:80", "10.0.0.2:8080", 60, 510),
            count("10.96.0.20:5432", "10.0.0.3:5432", 7, 0),
        ],
        &plan,
        ("zone-a", &zones()),
        10,
    );
    assert_eq!(
        second.labels,
        BTreeMap::from([
            (labels("default/web:http", "zone-b", "from_backend"), 10),
            (labels("default/web:http", "zone-b", "to_backend"), 10),
        ])
    );
}

#[test]
fn a_count_the_map_forgot_and_made_again_counts_whole() {
    let (plan, mut accounting) = (plan(), Accounting::default());
    accounting.update(vec![count("10.96.0.20:5432", "10.0.0.3:5432", 500, 0)], &plan, ("zone-a", &zones()), 10);
    // Gone from one reading (forgotten), then back, lower: every byte of it is new.
    assert!(accounting.update(vec![], &plan, ("zone-a", &zones()), 10).labels.is_empty());
    let again =
        accounting.update(vec![count("10.96.0.20:5432", "10.0.0.3:5432", 30, 0)], &plan, ("zone-a", &zones()), 10);
    assert_eq!(again.labels, BTreeMap::from([(labels("default/db:pg", "zone-b", "to_backend"), 30)]));
}

#[test]
fn ports_beyond_the_cap_are_summed_as_other_and_named_ports_keep_their_series() {
    let (plan, mut accounting) = (plan(), Accounting::default());
    let first =
        accounting.update(vec![count("10.96.0.20:5432", "10.0.0.3:5432", 5, 0)], &plan, ("zone-a", &zones()), 1);
    assert_eq!(first.labels, BTreeMap::from([(labels("default/db:pg", "zone-b", "to_backend"), 5)]));
    let second = accounting.update(
        vec![count("10.96.0.20:5432", "10.0.0.3:5432", 8, 0), count("10.96.0.10:80", "10.0.0.1:8080", 4, 0)],
        &plan,
        ("zone-a", &zones()),
        1,
    );
    assert_eq!(
        second.labels,
        BTreeMap::from([
            (labels("default/db:pg", "zone-b", "to_backend"), 3),
            (labels("other", "zone-a", "to_backend"), 4),
        ])
    );
}

#[test]
fn names_and_zones_outlive_the_plan_and_unknown_ports_go_by_address() {
    let mut accounting = Accounting::default();
    accounting.update(vec![count("10.96.0.20:5432", "10.0.0.3:5432", 1, 0)], &plan(), ("zone-a", &zones()), 10);
    // The Service is gone from the plan; its last connection's bytes still count under its name.
    let empty = NodePlan::build(
        &yaml::parse(&CLUSTER[..CLUSTER.find("- apiVersion: v1\n  kind: Service").unwrap()], "t").unwrap(),
        "node-a",
        None,
    )
    .unwrap();
    let later = accounting.update(
        vec![count("10.96.0.20:5432", "10.0.0.3:5432", 9, 0), count("10.96.0.99:53", "10.0.0.9:53", 2, 0)],
        &empty,
        ("zone-a", &zones()),
        10,
    );
    assert_eq!(
        later.labels,
        BTreeMap::from([
            (labels("10.96.0.99:53/TCP", "", "to_backend"), 2),
            (labels("default/db:pg", "zone-b", "to_backend"), 8),
        ])
    );
}

#[test]
fn each_port_counts_its_bytes_in_zone_across_and_what_the_default_would_have_sent_across() {
    let (plan, mut accounting) = (plan(), Accounting::default());
    // web: one endpoint in each zone, so the default keeps half in zone-a; db: none in zone-a.
    let gained = accounting.update(
        vec![
            count("10.96.0.10:80", "10.0.0.1:8080", 900, 100),
            count("10.96.0.10:80", "10.0.0.2:8080", 0, 0),
            count("10.96.0.20:5432", "10.0.0.3:5432", 40, 10),
        ],
        &plan,
        ("zone-a", &zones()),
        10,
    );
    let web = ServiceBytes { in_zone: 1000, cross_zone: 0, baseline_cross_zone: 500.0 };
    let db = ServiceBytes { in_zone: 0, cross_zone: 50, baseline_cross_zone: 50.0 };
    assert_eq!(gained.services, BTreeMap::from([("default/db:pg".into(), db), ("default/web:http".into(), web)]));
    // A node without a zone crosses nothing it can tell.
    let (plan, mut accounting) = (super::tests::plan(), Accounting::default());
    let unzoned = accounting.update(vec![count("10.96.0.20:5432", "10.0.0.3:5432", 40, 10)], &plan, ("", &zones()), 10);
    assert_eq!(unzoned.services["default/db:pg"].cross_zone, 0);
}

#[test]
fn a_restarted_agent_counts_from_what_the_kernel_held_when_it_started() {
    let plan = plan();
    let mut accounting = Accounting::starting_from(vec![count("10.96.0.20:5432", "10.0.0.3:5432", 500, 20)]);
    let gained =
        accounting.update(vec![count("10.96.0.20:5432", "10.0.0.3:5432", 530, 20)], &plan, ("zone-a", &zones()), 10);
    assert_eq!(gained.labels, BTreeMap::from([(labels("default/db:pg", "zone-b", "to_backend"), 30)]));
}

#[test]
fn a_zone_no_node_has_is_other() {
    // A tenant's slice names zones of its own making: each would be a series.
    let tenant = r#"
- apiVersion: v1
  kind: Service
  metadata: {name: odd, namespace: tenant}
  spec: {clusterIP: 10.96.0.30, ports: [{name: http, port: 80}]}
- apiVersion: discovery.k8s.io/v1
  kind: EndpointSlice
  metadata: {name: odd-1, namespace: tenant, labels: {kubernetes.io/service-name: odd}}
  addressType: IPv4
  ports: [{name: http, port: 8080}]
  endpoints:
  - {addresses: [10.0.0.7], zone: made-up-7, conditions: {ready: true}}
"#;
    let cluster = yaml::parse(&format!("{CLUSTER}{tenant}"), "test").unwrap();
    let plan = NodePlan::build(&cluster, "node-a", None).unwrap();
    let mut accounting = Accounting::default();
    let gained = accounting.update(
        vec![count("10.96.0.30:80", "10.0.0.7:8080", 70, 0), count("10.96.0.10:80", "10.0.0.2:8080", 5, 0)],
        &plan,
        ("zone-a", &cluster.zones()),
        10,
    );
    assert_eq!(
        gained.labels,
        BTreeMap::from([
            (labels("default/web:http", "zone-b", "to_backend"), 5),
            (labels("tenant/odd:http", "other", "to_backend"), 70),
        ])
    );
}

#[test]
fn the_ports_with_series_are_chosen_again_by_volume_and_the_quiet_ones_lose_their_series() {
    let (plan, mut accounting) = (plan(), Accounting::default());
    let start = Instant::now();
    let zones = zones();
    let mut read = |counts: Vec<CountedBytes>, s: u64| {
        accounting.update_at(counts, &plan, ("zone-a", &zones), 1, start + Duration::from_secs(s))
    };
    // db moves bytes first and takes the one place; web, ten times busier, is `other`.
    let first = read(vec![count("10.96.0.20:5432", "10.0.0.3:5432", 10, 0)], 0);
    assert_eq!(first.labels, BTreeMap::from([(labels("default/db:pg", "zone-b", "to_backend"), 10)]));
    let busy = read(
        vec![count("10.96.0.20:5432", "10.0.0.3:5432", 20, 0), count("10.96.0.10:80", "10.0.0.2:8080", 100, 0)],
        60,
    );
    assert_eq!(busy.labels[&labels("other", "zone-b", "to_backend")], 100);
    assert!(busy.retired.is_empty());
    // Ten minutes on: web moved the most, so it takes the place and db's series go.
    let rotated = read(
        vec![count("10.96.0.20:5432", "10.0.0.3:5432", 21, 0), count("10.96.0.10:80", "10.0.0.2:8080", 200, 0)],
        ROTATE_EVERY.as_secs(),
    );
    assert_eq!(rotated.retired, [labels("default/db:pg", "zone-b", "to_backend")]);
    let after = read(
        vec![count("10.96.0.20:5432", "10.0.0.3:5432", 25, 0), count("10.96.0.10:80", "10.0.0.2:8080", 250, 0)],
        ROTATE_EVERY.as_secs() + 10,
    );
    assert_eq!(
        after.labels,
        BTreeMap::from([
            (labels("default/web:http", "zone-b", "to_backend"), 50),
            (labels("other", "zone-b", "to_backend"), 4),
        ])
    );
}
