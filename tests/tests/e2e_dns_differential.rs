//! Differential conformance with the real CoreDNS (root, the real control plane): the objects of
//! the responder's conformance fixture (`topology-dns/testdata/coredns.yaml`, CoreDNS's own
//! `plugin/kubernetes` test cluster) applied to the real API server — ClusterIPs allocated by it,
//! the fixture's own ones being outside this cluster's range — CoreDNS 1.14 behind `kube-dns` as
//! a cluster runs it, and the agent deployed on a node relaying to it. Every name and type the
//! fixture's rows ask is asked of both from a pod of that node; the answers (status, then every
//! record of the answer, authority and additional sections, sorted; SOA serials masked) must be
//! equal, or differ as `DIFFERENCES` says and why. A new difference, or a listed one that is gone,
//! fails the test; the table in `docs/dns.md` is generated from the run (`TOPOLOGY_UPDATE_DOCS=1`
//! rewrites it). `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::{collections::BTreeMap, net::SocketAddr, path::PathBuf, time::Duration};

use serde_json::Value;
use topology_tests::{
    dns::{Dig, dig, start_upstream},
    kubernetes::{Binaries, Cluster, coredns, coredns::Corefile, eventually, nodes::NodeSpec},
    require_root,
};

const FIXTURE: &str = include_str!("../../topology-dns/testdata/coredns.yaml");
/// The fixture's rows: the names and types asked are read from them.
const ROWS: &str = include_str!("../../topology-dns/src/conformance/cases.rs");
const NODE: &str = "node-a";

/// The fixture's objects the real API server refuses (CoreDNS's unit tests never admit theirs):
/// (object, the field it names).
const REFUSED: &[(&str, &str)] = &[("Service testns/unnamed", "spec.ports[0].name")];

/// Where the two answer differently on purpose: (name, type, why).
const DIFFERENCES: &[(&str, &str, &str)] = &[
    ("_http._tcp.hdls1.testns.svc.cluster.local.", "SRV", WEIGHTS),
    ("hdls6.testns.svc.cluster.local.", "SRV", WEIGHTS),
    ("_http._tcp.hdlsmixed.testns.svc.cluster.local.", "SRV", WEIGHTS),
];

/// Why SRV weights differ.
const WEIGHTS: &str =
    "SRV weights carry this node's plan (shares out of 10,000, RFC 2782); CoreDNS gives each record 100 / n";

/// Every (name, type) the fixture's rows ask, in order, once each.
fn queries() -> Vec<(String, String)> {
    const TYPES: [&str; 11] = ["A", "AAAA", "SRV", "TXT", "NS", "SOA", "CNAME", "PTR", "ANY", "HINFO", "MX"];
    let mut found: Vec<(String, String)> = Vec::new();
    let mut rest = ROWS;
    // A row's name literal (ends with the root's dot), then its type.
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('"') else { break };
        let literal = &after[..end];
        rest = &after[end + 1..];
        let next = rest.trim_start_matches([',', ' ', '\n']);
        let qtype: String = next.chars().take_while(char::is_ascii_alphanumeric).collect();
        if literal.ends_with('.') && !literal.contains(' ') && TYPES.contains(&qtype.as_str()) {
            let query = (literal.to_owned(), qtype);
            if !found.contains(&query) {
                found.push(query);
            }
        }
    }
    found
}

/// The fixture's objects as the real API server takes them: no Node (the harness registers its
/// own), no ClusterIPs (the server allocates them from its range), no `kube-dns` (the harness's
/// runs the real CoreDNS).
fn objects() -> Vec<Value> {
    let list: Value = serde_yaml::from_str(FIXTURE).expect("the fixture");
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter(|item| item["kind"] != "Node" && item["metadata"]["namespace"] != "kube-system")
        .map(|item| {
            let mut item = item.clone();
            if let Some(spec) = item.get_mut("spec").and_then(Value::as_object_mut)
                && spec.get("clusterIP").and_then(Value::as_str) != Some("None")
            {
                spec.remove("clusterIP");
                spec.remove("clusterIPs");
            }
            item
        })
        .collect()
}

/// An answer as compared: status and every record, sorted, the SOA serial masked (CoreDNS's is
/// the time of its last change, this responder's fixed).
fn normalized(answer: &Dig) -> String {
    let mut records: Vec<String> = answer
        .answers
        .iter()
        .map(|record| {
            let mut fields: Vec<&str> = record.split(' ').collect();
            if fields.get(3) == Some(&"SOA") && fields.len() > 6 {
                fields[6] = "SERIAL";
            }
            fields.join(" ")
        })
        .collect();
    records.sort();
    format!("{}: {}", answer.status, records.join("; "))
}

#[test]
fn every_name_of_the_fixture_answers_as_coredns_or_as_documented() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let queries = queries();
    assert!(queries.len() > 30, "the fixture's rows were not read: {queries:?}");
    let mut cluster = Cluster::start(binaries, &[NodeSpec::new(NODE, "za")]);
    let version = cluster.binaries().kubernetes_version();
    let (outside, _outside) = start_upstream(cluster.network(), false, None, None);
    cluster.reach_pods_from(&outside);
    let coredns = cluster.start_coredns(NODE, SocketAddr::from((outside.v4, 53)), Corefile::Compared);
    for namespace in ["testns", "unexposedns"] {
        cluster.namespace(namespace);
    }
    let mut refused = Vec::new();
    for object in objects() {
        if let Err(error) = cluster.api().try_apply(&object) {
            let what = topology_tests::kubernetes::describe(&object);
            let field = REFUSED.iter().find(|(name, _)| *name == what).map(|(_, field)| *field);
            assert!(field.is_some_and(|field| error.error.contains(field)), "{what} refused: {error}");
            refused.push(what);
        }
    }
    assert_eq!(refused.len(), REFUSED.len(), "refused: {refused:?}, listed: {REFUSED:?}");
    cluster.deploy();
    let ttl = format!("--dns-ttl={}", coredns::TTL);
    let agent = cluster.start_agent(NODE, &[&ttl]);
    let client = cluster.client_on(NODE);
    let ours = SocketAddr::from((agent.ip, 5353));
    let ask = |server: SocketAddr, name: &str, qtype: &str| {
        normalized(&dig(Some(&client.place.netns), server, name, qtype, &["+authority", "+additional", "+tries=3"]))
    };
    // Both have read every object: the last Service's name answers alike.
    eventually("both serving the fixture", Duration::from_secs(60), || {
        let name = "svc1.testns.svc.cluster.local.";
        let (theirs, mine) = (ask(coredns.address(), name, "A"), ask(ours, name, "A"));
        (theirs == mine && theirs.starts_with("NOERROR: svc1")).then_some(()).ok_or(format!("{theirs} / {mine}"))
    });

    let known: BTreeMap<(&str, &str), &str> =
        DIFFERENCES.iter().map(|&(name, qtype, why)| ((name, qtype), why)).collect();
    let mut rows = Vec::new();
    let mut failures = Vec::new();
    let mut same = 0;
    for (name, qtype) in &queries {
        let (theirs, mine) = (ask(coredns.address(), name, qtype), ask(ours, name, qtype));
        let why = known.get(&(name.as_str(), qtype.as_str()));
        match (theirs == mine, why) {
            (true, None) => same += 1,
            (true, Some(_)) => failures.push(format!("{name} {qtype}: listed as different, answered alike: {mine}")),
            (false, None) => failures.push(format!("{name} {qtype}: CoreDNS {theirs}\n    topology-agent {mine}")),
            (false, Some(why)) => rows.push(format!("| `{name}` {qtype} | {theirs} | {mine} | {why} |")),
        }
    }
    eprintln!("{same} of {} names answered alike by CoreDNS and the agent", queries.len());
    assert!(failures.is_empty(), "undocumented differences with CoreDNS:\n{}", failures.join("\n"));
    drop(coredns);
    check_table(&version, queries.len(), same, &rows);
}

/// Compares the rows with `docs/dns.md`'s table (or rewrites it when asked).
fn check_table(version: &str, asked: usize, same: usize, rows: &[String]) {
    const BEGIN: &str =
        "<!-- coredns-differential:begin (cargo test -p topology-tests --test e2e_dns_differential) -->\n";
    const END: &str = "<!-- coredns-differential:end -->";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/dns.md");
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let table = format!(
        "{BEGIN}CoreDNS 1.14 and the agent on {version}'s API server: {same} of the fixture's {asked} names and types \
         answered alike; the others:\n\n| asked | CoreDNS | the agent | why |\n|---|---|---|---|\n{}\n",
        rows.join("\n")
    );
    let (start, end) = match (doc.find(BEGIN), doc.find(END)) {
        (Some(start), Some(end)) if start < end => (start, end),
        _ => panic!("{} has no coredns-differential markers", path.display()),
    };
    if std::env::var_os("TOPOLOGY_UPDATE_DOCS").is_some() {
        std::fs::write(&path, format!("{}{table}{}", &doc[..start], &doc[end..]))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        return;
    }
    assert_eq!(&doc[start..end], table, "docs/dns.md's CoreDNS table changed: rerun with TOPOLOGY_UPDATE_DOCS=1");
}
