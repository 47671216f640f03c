//! Conformance with the Kubernetes DNS-Based Service Discovery specification (schema 1.1.0) and
//! CoreDNS's `plugin/kubernetes`: its `TestServeDNS` (`commonDnsTestCases`, `dnsTestCases`) and
//! `TestServeDNSApex` (`kubeApexCases`) tables, ported row by row on the same cluster
//! (`APIConnServeTest`'s Services and endpoints, as EndpointSlices), from a node with no topology
//! asked of any of them, so the policy keeps every ready endpoint. Where this responder answers
//! differently on purpose, the row carries CoreDNS's answer too, and why.

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{Name, Record, RecordType},
};
use topology_model::yaml;

use super::{
    DnsView,
    answer::{self, AnswerKind, Outcome, Zone},
    parse_domain,
};

mod cases;
use cases::cases;

/// `APIConnServeTest`'s cluster (`svcIndex`, `epsIndex`), with this node `a`. `hdls1` gets the port
/// its endpoints have: this responder takes SRV ports from the Service, as the specification
/// words them ("each named port of the Service"), where CoreDNS takes them from the endpoints.
const CLUSTER: &str = include_str!("../../testdata/coredns.yaml");

const ZONE_SOA: &str = "cluster.local. 5 IN SOA ns.dns.cluster.local. hostmaster.cluster.local. 1 7200 1800 86400 5";

/// What a query gets.
pub(super) enum Expect {
    /// An answer: response code, answer and additional sections (sorted), and whether the
    /// authority section holds the zone's SOA.
    Answer { rcode: ResponseCode, answer: &'static [&'static str], extra: &'static [&'static str], soa: bool },
    /// Relayed to the upstream, which answers as CoreDNS does.
    Forward,
    /// This answer, completed with the upstream's records for the target.
    Chase { answer: &'static [&'static str], target: &'static str },
}

pub(super) struct Case {
    /// CoreDNS's comment on the row, or the specification's section.
    name: &'static str,
    qname: &'static str,
    qtype: RecordType,
    expect: Expect,
    /// CoreDNS's answer section where it differs, and why ours differs.
    coredns: Option<(&'static [&'static str], &'static str)>,
}

const fn ok(answer: &'static [&'static str], extra: &'static [&'static str]) -> Expect {
    Expect::Answer { rcode: ResponseCode::NoError, answer, extra, soa: false }
}

const NODATA: Expect = Expect::Answer { rcode: ResponseCode::NoError, answer: &[], extra: &[], soa: true };
const NXDOMAIN: Expect = Expect::Answer { rcode: ResponseCode::NXDomain, answer: &[], extra: &[], soa: true };

fn render(records: &[Record]) -> Vec<String> {
    let mut out: Vec<String> =
        records.iter().map(|r| format!("{} {} IN {} {}", r.name, r.ttl, r.record_type(), r.data)).collect();
    out.sort();
    out
}

fn sorted(records: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = records.iter().map(|r| (*r).to_owned()).collect();
    out.sort();
    out
}

fn ask(view: &DnsView, zone: &Zone, qname: &str, qtype: RecordType) -> Outcome {
    let mut message = Message::new(7, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(qname).unwrap(), qtype));
    answer::answer(view, zone, &message, &mut || 0.5)
}

#[test]
fn coredns_serve_dns_and_apex_tables() {
    let state = yaml::parse(CLUSTER, "coredns.yaml").unwrap();
    let view = DnsView::of_node(&state, "a", Vec::new()).unwrap();
    let zone = Zone { domain: parse_domain("cluster.local").unwrap(), ttl: 5 };
    let mut failed = Vec::new();
    for case in cases() {
        let got = ask(&view, &zone, case.qname, case.qtype);
        let what = format!("{} ({} {})", case.name, case.qname, case.qtype);
        let matches = match (&case.expect, &got) {
            (Expect::Answer { rcode, answer, extra, soa }, Outcome::Answer(message, kind, _)) => {
                let authority_soa = message.authorities.iter().any(|r| r.record_type() == RecordType::SOA);
                let ok = message.metadata.response_code == *rcode
                    && render(&message.answers) == sorted(answer)
                    && render(&message.additionals) == sorted(extra)
                    && authority_soa == *soa
                    && (message.metadata.authoritative || *rcode == ResponseCode::Refused);
                ok && (*kind == AnswerKind::Refused) == (*rcode == ResponseCode::Refused)
            }
            (Expect::Forward, Outcome::Forward) => true,
            (Expect::Chase { answer, target }, Outcome::Chase(message, chased)) => {
                render(&message.answers) == sorted(answer) && chased.to_ascii() == *target
            }
            _ => false,
        };
        if !matches {
            failed.push(format!("{what}: got {got:?}"));
        }
        if let (Some((theirs, why)), Expect::Answer { answer, .. }) = (case.coredns, &case.expect) {
            assert!(!why.is_empty(), "{what}: a difference needs its reason");
            assert_ne!(sorted(theirs), sorted(answer), "{what}: no difference with CoreDNS is left");
        }
    }
    assert!(failed.is_empty(), "{} rows differ:\n{}", failed.len(), failed.join("\n"));
}
