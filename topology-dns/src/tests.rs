//! Answers per mode, SRV, endpoint names, NXDOMAIN and NODATA, spillover shares, truncation and
//! malformed input, on the policy tests' reference topology.

use std::collections::BTreeMap;

use hickory_proto::{
    op::{Edns, Message, MessageType, OpCode, Query, ResponseCode},
    rr::{Name, RData, RecordType},
};
use topology_model::{ClusterState, Endpoint, Service};
use topology_policy::{
    plan::NodePlan,
    policy::spillover::ANNOTATION_SPILLOVER,
    testing::{EndpointExt, ServiceExt, endpoints, ep, service, slice, world},
};

use super::{
    DnsView,
    answer::{self, AnswerKind, Outcome, Zone},
    parse_domain,
    view::Records,
};

fn zone() -> Zone {
    Zone { domain: parse_domain("cluster.local").unwrap(), ttl: 5 }
}

fn headless(svc: Service) -> Service {
    let mut svc = svc;
    svc.cluster_ips.clear();
    svc.headless = true;
    svc
}

/// `world()` with headless `ns/db` (its endpoints named db-0..db-3) and ClusterIP `ns/web`.
fn cluster(db: Service) -> ClusterState {
    let mut state = world();
    let named: Vec<Endpoint> = endpoints(true)
        .into_iter()
        .enumerate()
        .map(|(i, mut e)| {
            e.set_extra(|extra| extra.hostname = Some(format!("db-{i}").into()));
            e
        })
        .collect();
    state.upsert_service(db);
    state.upsert_slice(slice("db-1", "db", 5432, named));
    state.upsert_service(service("web"));
    state.upsert_slice(slice("web-1", "web", 8080, vec![ep("10.0.9.1", "b1")]));
    state
}

fn query(name: &str, qtype: RecordType) -> Message {
    let mut message = Message::new(7, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    message
}

fn ask_with(view: &DnsView, name: &str, qtype: RecordType, draw: &mut dyn FnMut() -> f64) -> (Message, AnswerKind) {
    match answer::answer(view, &zone(), &query(name, qtype), draw) {
        Outcome::Answer(message, kind, _) => (message, kind),
        Outcome::Forward | Outcome::Chase(..) => panic!("{name} was forwarded or chased"),
    }
}

fn ask(view: &DnsView, name: &str, qtype: RecordType) -> (Message, AnswerKind) {
    ask_with(view, name, qtype, &mut || 0.5)
}

fn view(state: &ClusterState, node: &str) -> DnsView {
    DnsView::of_node(state, node, Vec::new()).unwrap()
}

/// The addresses of the answer section, sorted.
fn ips(message: &Message) -> Vec<String> {
    let mut out: Vec<String> = message
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0.to_string()),
            RData::AAAA(a) => Some(a.0.to_string()),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

const DB: &str = "db.ns.svc.cluster.local.";

#[test]
fn a_headless_service_answers_what_this_nodes_policy_chooses() {
    let rows: [(&str, Service, &str, &[&str]); 6] = [
        (
            "no mode: every ready endpoint",
            headless(service("db")),
            "a1",
            &["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.3.1"],
        ),
        (
            "PreferClose from zone a",
            headless(service("db")).distribution("PreferClose"),
            "a3",
            &["10.0.1.1", "10.0.1.2"],
        ),
        ("PreferClose from zone b", headless(service("db")).distribution("PreferClose"), "b1", &["10.0.2.1"]),
        ("PreferSameNode", headless(service("db")).distribution("PreferSameNode"), "a2", &["10.0.1.2"]),
        ("topology hints", headless(service("db")).mode("Auto"), "c1", &["10.0.3.1"]),
        ("internalTrafficPolicy Local", headless(service("db")).local(), "b1", &["10.0.2.1"]),
    ];
    for (name, svc, node, expect) in rows {
        let (message, kind) = ask(&view(&cluster(svc), node), DB, RecordType::A);
        assert_eq!(kind, AnswerKind::Records, "{name}");
        assert_eq!(ips(&message), expect.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>(), "{name}");
        assert!(message.metadata.authoritative && message.answers.iter().all(|r| r.ttl == 5), "{name}");
        assert_eq!(message.metadata.id, 7);
    }
}

#[test]
fn a_hard_requirement_nobody_meets_answers_as_coredns_does_for_no_endpoints() {
    // Topology keys without "*" and no endpoint on this node: no ready endpoint for this node,
    // which CoreDNS answers NXDOMAIN for a headless Service.
    let state = cluster(headless(service("db")).keys(&["kubernetes.io/hostname"]));
    let (message, kind) = ask(&view(&state, "a3"), DB, RecordType::A);
    assert_eq!((kind, message.metadata.response_code), (AnswerKind::NxDomain, ResponseCode::NXDomain));
    assert_eq!(message.authorities.first().map(|r| r.record_type()), Some(RecordType::SOA), "negative caching");
    let (message, _) = ask(&view(&state, "a1"), DB, RecordType::A);
    assert_eq!(ips(&message), ["10.0.1.1"]);
}

#[test]
fn names_that_exist_without_the_type_asked_are_nodata_and_unknown_ones_nxdomain() {
    let state = cluster(headless(service("db")));
    let view = view(&state, "a1");
    let rows = [
        (DB, RecordType::AAAA, AnswerKind::NoData),
        (DB, RecordType::MX, AnswerKind::NoData),
        ("web.ns.svc.cluster.local.", RecordType::AAAA, AnswerKind::NoData),
        ("ns.svc.cluster.local.", RecordType::A, AnswerKind::NoData),
        ("svc.cluster.local.", RecordType::A, AnswerKind::NoData),
        ("cluster.local.", RecordType::A, AnswerKind::NoData),
        ("cluster.local.", RecordType::SOA, AnswerKind::Records),
        ("nope.ns.svc.cluster.local.", RecordType::A, AnswerKind::NxDomain),
        ("db.other.svc.cluster.local.", RecordType::A, AnswerKind::NxDomain),
        ("other.svc.cluster.local.", RecordType::A, AnswerKind::NxDomain),
        ("db-9.db.ns.svc.cluster.local.", RecordType::A, AnswerKind::NxDomain),
        ("x.y.db.ns.svc.cluster.local.", RecordType::A, AnswerKind::NxDomain),
    ];
    for (name, qtype, expect) in rows {
        let (message, kind) = ask(&view, name, qtype);
        assert_eq!(kind, expect, "{name} {qtype}");
        let code = if expect == AnswerKind::NxDomain { ResponseCode::NXDomain } else { ResponseCode::NoError };
        assert_eq!(message.metadata.response_code, code, "{name} {qtype}");
        if expect != AnswerKind::Records {
            assert!(message.answers.is_empty() && message.authorities.len() == 1, "{name}: SOA only");
        }
    }
}

#[test]
fn cluster_ip_services_answer_their_cluster_ip_and_endpoint_names_their_pod() {
    let state = cluster(headless(service("db")).distribution("PreferClose"));
    let view = view(&state, "a1");
    let (message, _) = ask(&view, "WEB.NS.svc.Cluster.Local.", RecordType::A);
    assert_eq!(ips(&message), ["10.96.0.10"], "the ClusterIP, case-insensitively");
    // A name that picks one pod is not subject to topology: db-2 is in zone b.
    let (message, _) = ask(&view, "db-2.db.ns.svc.cluster.local.", RecordType::A);
    assert_eq!(ips(&message), ["10.0.2.1"]);
    let (message, _) = ask(&view, "10-0-9-1.web.ns.svc.cluster.local.", RecordType::A);
    assert_eq!(ips(&message), ["10.0.9.1"], "endpoints without a hostname are named by address");
}

#[test]
fn srv_targets_are_chosen_the_same_way() {
    let state = cluster(headless(service("db")).distribution("PreferClose"));
    let (message, kind) = ask(&view(&state, "b1"), "_http._tcp.db.ns.svc.cluster.local.", RecordType::SRV);
    assert_eq!(kind, AnswerKind::Records);
    let targets: Vec<(String, u16)> = message
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(srv) => Some((srv.target.to_ascii(), srv.port)),
            _ => None,
        })
        .collect();
    assert_eq!(targets, [("db-2.db.ns.svc.cluster.local.".to_owned(), 5432)]);
    assert!(
        message.additionals.iter().any(|r| matches!(&r.data, RData::A(a) if a.0.to_string() == "10.0.2.1")),
        "the target's address rides along"
    );
    let (message, _) = ask(&view(&state, "b1"), "_http._tcp.web.ns.svc.cluster.local.", RecordType::SRV);
    let srv = message.answers.iter().find_map(|r| if let RData::SRV(s) = &r.data { Some(s.clone()) } else { None });
    assert_eq!(srv.map(|s| (s.target.to_ascii(), s.port)), Some(("web.ns.svc.cluster.local.".into(), 80)));
    let (_, kind) = ask(&view(&state, "b1"), "_grpc._tcp.db.ns.svc.cluster.local.", RecordType::SRV);
    assert_eq!(kind, AnswerKind::NxDomain, "no such port");
}

#[test]
fn names_outside_the_cluster_domain_and_pod_names_are_forwarded() {
    let state = cluster(headless(service("db")));
    for name in ["example.com.", "10-0-0-1.ns.pod.cluster.local.", "1.0.0.10.in-addr.arpa."] {
        let outcome = answer::answer(&view(&state, "a1"), &zone(), &query(name, RecordType::A), &mut || 0.0);
        assert!(matches!(outcome, Outcome::Forward), "{name}");
    }
}

/// xorshift64*, as a uniform draw in [0, 1).
fn uniform(seed: u64) -> impl FnMut() -> f64 {
    let mut state = seed;
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[test]
fn under_spillover_answers_across_queries_follow_the_plans_weights() {
    let mut db = headless(service("db"));
    db.agent_annotations.insert(ANNOTATION_SPILLOVER.into(), "capacity".into());
    let state = cluster(db);
    // d1's zone has demand and no endpoint: the plan spreads its traffic with unequal weights.
    let view = view(&state, "d1");
    let Some(Records::Headless(db)) = view.service("ns", "db") else { panic!("db is headless") };
    let chosen = db.addresses.clone();
    assert!(chosen.weighted, "{:?}", chosen.reasons);
    let total: f64 = chosen.choices.iter().map(|c| c.weight).sum();
    let mut draw = uniform(0x9E37_79B9_7F4A_7C15);
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    let queries = 20_000;
    for _ in 0..queries {
        let (message, _) = ask_with(&view, DB, RecordType::A, &mut draw);
        assert_eq!(message.answers.len(), 1, "one address drawn per answer");
        *counts.entry(ips(&message)[0].clone()).or_default() += 1;
    }
    for choice in &chosen.choices {
        let share = f64::from(counts.get(&choice.address.to_string()).copied().unwrap_or(0)) / f64::from(queries);
        let expect = choice.weight / total;
        assert!((share - expect).abs() < 0.015, "{}: {share:.3} of answers, plan {expect:.3}", choice.address);
    }
}

#[test]
fn answers_too_big_for_udp_are_truncated_and_complete_over_tcp() {
    let mut state = world();
    state.upsert_service(headless(service("big")));
    let many: Vec<Endpoint> = (0..120).map(|i| ep(&format!("10.1.{}.{}", i / 200, i % 200 + 1), "a1")).collect();
    state.upsert_slice(slice("big-1", "big", 80, many));
    let view = view(&state, "a1");
    let request = query("big.ns.svc.cluster.local.", RecordType::A);
    let (message, _) = ask(&view, "big.ns.svc.cluster.local.", RecordType::A);
    assert_eq!(message.answers.len(), 120);
    let udp = Message::from_vec(&answer::encode(&message, answer::udp_limit(&request))).unwrap();
    assert!(udp.metadata.truncation && udp.answers.len() < 120, "{} answers in 512 bytes", udp.answers.len());
    let tcp = Message::from_vec(&answer::encode(&message, u16::MAX)).unwrap();
    assert!(!tcp.metadata.truncation && tcp.answers.len() == 120);
    // With EDNS the client's larger buffer is used, up to 1232 bytes.
    let mut edns_request = request.clone();
    let mut edns = Edns::new();
    edns.set_max_payload(4096);
    edns_request.set_edns(edns);
    assert_eq!(answer::udp_limit(&edns_request), answer::EDNS_PAYLOAD);
    match answer::answer(&view, &zone(), &edns_request, &mut || 0.0) {
        Outcome::Answer(message, ..) => assert_eq!(message.edns.map(|e| e.max_payload()), Some(answer::EDNS_PAYLOAD)),
        Outcome::Forward | Outcome::Chase(..) => panic!("forwarded"),
    }
    // An EDNS version we do not speak: BADVERS, its high bits in our OPT (version 0), as a
    // resolver reads it back.
    let mut future = Edns::new();
    future.set_version(1);
    edns_request.set_edns(future);
    let Outcome::Answer(message, ..) = answer::answer(&view, &zone(), &edns_request, &mut || 0.0) else {
        panic!("forwarded")
    };
    let read = Message::from_vec(&answer::encode(&message, 1232)).unwrap();
    // 16 (hickory names the shared code BADSIG when it reads it back).
    assert_eq!(u16::from(read.metadata.response_code), u16::from(ResponseCode::BADVERS));
    assert_eq!((read.answers.len(), read.edns.map(|e| e.version())), (0, Some(0)));
}

#[test]
fn an_ipv6_headless_service_answers_aaaa() {
    let mut state = world();
    state.upsert_service(headless(service("v6")).distribution("PreferClose"));
    state.upsert_slice(slice("v6-1", "v6", 80, vec![ep("fd00::1", "a1").zone("a"), ep("fd00::2", "b1")]));
    let (message, kind) = ask(&view(&state, "a2"), "v6.ns.svc.cluster.local.", RecordType::AAAA);
    assert_eq!((kind, ips(&message)), (AnswerKind::Records, vec!["fd00::1".to_owned()]));
    let (_, kind) = ask(&view(&state, "a2"), "v6.ns.svc.cluster.local.", RecordType::A);
    assert_eq!(kind, AnswerKind::NoData);
}

#[test]
fn the_view_is_updated_one_service_at_a_time() {
    let mut state = cluster(headless(service("db")));
    let this = state.node("a1").unwrap().clone();
    let mut plan = NodePlan::build(&state, "a1", None).unwrap();
    let mut view = DnsView::build(&state, &plan, Vec::new());
    let key = topology_model::ObjectKey::new("ns", "db");
    let mut update = |state: &ClusterState, view: &mut DnsView| {
        plan.update(state, &this, &key);
        view.update(state, &plan, &key)
    };
    assert!(!update(&state, &mut view), "nothing changed");
    state.upsert_slice(slice("db-1", "db", 5432, vec![ep("10.0.1.9", "a1"), ep("10.0.1.1", "a1").terminating()]));
    assert!(update(&state, &mut view));
    let (message, _) = ask(&view, DB, RecordType::A);
    assert_eq!(ips(&message), ["10.0.1.9"], "ready endpoints only: DNS has no terminating fallback");
    state.remove_service(&key);
    assert!(update(&state, &mut view));
    assert!(!view.has_namespace("other") && view.has_namespace("ns"));
    assert_eq!(ask(&view, DB, RecordType::A).1, AnswerKind::NxDomain);
    assert_eq!(view, DnsView::of_node(&state, "a1", Vec::new()).unwrap(), "incremental equals whole");
}

#[test]
fn the_default_upstream_is_kube_dns_endpoints_dialled_directly() {
    let mut state = world();
    let mut dns = service("kube-dns");
    dns.key = topology_model::ObjectKey::new("kube-system", "kube-dns");
    dns.ports[0] = topology_model::PortSpec { name: "dns".into(), port: 53, protocol: topology_model::Protocol::Udp };
    state.upsert_service(dns);
    let mut slice = slice("kube-dns-1", "kube-dns", 1053, vec![ep("10.0.5.1", "a1"), ep("10.0.5.2", "b1").unready()]);
    slice.key.namespace = "kube-system".into();
    slice.service = Some(topology_model::ObjectKey::new("kube-system", "kube-dns"));
    slice.ports[0].name = "dns".into();
    slice.ports[0].protocol = topology_model::Protocol::Udp;
    state.upsert_slice(slice);
    let view = DnsView::of_node(&state, "a1", Vec::new()).unwrap();
    assert_eq!(view.upstreams, ["10.0.5.1:1053".parse().unwrap()]);
    let configured = vec!["192.0.2.53:53".parse().unwrap()];
    assert_eq!(DnsView::of_node(&state, "a1", configured.clone()).unwrap().upstreams, configured);
}

#[test]
fn malformed_queries_get_formerr_or_nothing_and_never_a_panic() {
    let garbage: [&[u8]; 4] = [&[], &[1, 2, 3], &[0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0xff], &[0; 11]];
    for bytes in garbage {
        let _ = Message::from_vec(bytes);
    }
    let view = DnsView::default();
    let mut request = query(DB, RecordType::A);
    request.add_query(Query::query(Name::from_ascii("x.").unwrap(), RecordType::A));
    match answer::answer(&view, &zone(), &request, &mut || 0.0) {
        Outcome::Answer(message, kind, _) => {
            assert_eq!((kind, message.metadata.response_code), (AnswerKind::Refused, ResponseCode::FormErr));
        }
        Outcome::Forward | Outcome::Chase(..) => panic!("two questions forwarded"),
    }
}

#[test]
fn an_external_name_is_a_cname_completed_upstream_and_unowned_names_are_forwarded() {
    let mut state = world();
    let mut external = service("ext");
    external.cluster_ips.clear();
    external.external_name = Some("db.example.org".into());
    state.upsert_service(external);
    let view = view(&state, "a1");
    let name = "ext.ns.svc.cluster.local.";
    let Outcome::Chase(response, target) = answer::answer(&view, &zone(), &query(name, RecordType::A), &mut || 0.0)
    else {
        panic!("an ExternalName A query is a CNAME completed with the target's records")
    };
    assert_eq!(target, Name::from_ascii("db.example.org.").unwrap());
    assert_eq!(response.answers.len(), 1);
    assert_eq!(response.answers[0].data.to_string(), "db.example.org.");
    assert_eq!(response.metadata.response_code, ResponseCode::NoError);
    // Asked for the CNAME itself: nothing to chase.
    let (cname, kind) = ask(&view, name, RecordType::CNAME);
    assert_eq!((kind, cname.answers.len()), (AnswerKind::Records, 1));
    // It has no endpoints to name.
    assert_eq!(ask(&view, "x.ext.ns.svc.cluster.local.", RecordType::A).1, AnswerKind::NxDomain);
    // Names of the cluster domain outside svc and pod, which other plugins may serve, go to CoreDNS.
    for elsewhere in ["web.default.cluster.local.", "nodes.cluster.local."] {
        let outcome = answer::answer(&view, &zone(), &query(elsewhere, RecordType::A), &mut || 0.0);
        assert!(matches!(outcome, Outcome::Forward), "{elsewhere}: {outcome:?}");
    }
    assert_eq!(ask(&view, "nope.ns.svc.cluster.local.", RecordType::A).1, AnswerKind::NxDomain, "svc is ours alone");
}

#[test]
fn a_control_loop_that_stops_saying_the_view_is_current_stops_the_steering() {
    let current = super::ViewCurrent::default();
    let now = std::time::Instant::now();
    assert!(!current.get_at(now), "nothing said yet");
    current.set(true);
    assert!(current.get_at(now + std::time::Duration::from_secs(1)));
    assert!(!current.get_at(now + super::CURRENT_FOR + std::time::Duration::from_secs(1)), "a frozen loop");
    current.set(false);
    assert!(!current.get_at(now));
}
