//! One query in, one answer out (or "forward it"): the records of the cluster domain as CoreDNS
//! serves them, with headless Services answered by this node's policy. Pure: the caller passes
//! the view and the randomness.

use std::net::IpAddr;

use hickory_proto::{
    op::{Edns, Message, MessageType, OpCode, Query, ResponseCode},
    rr::{
        DNSClass, Name, RData, Record, RecordType,
        rdata::{A, AAAA, CNAME, NS, SOA, SRV, TXT},
    },
    serialize::binary::{BinEncodable, BinEncoder},
};
use topology_model::Protocol;
use topology_policy::desired::Locality;

use super::{
    names::ClusterName,
    view::{Chosen, DnsView, NamedChoice, NamedPort, Records, UPSTREAM_SERVICE},
};

/// The largest UDP answer offered over EDNS (the DNS flag day 2020 value).
pub const EDNS_PAYLOAD: u16 = 1232;

/// The Kubernetes DNS schema version this responder answers (`dns-version.<domain>` TXT).
pub const SCHEMA_VERSION: &str = "1.1.0";
/// TTL of the schema version record (the specification's and CoreDNS's).
const SCHEMA_TTL: u32 = 28_800;
/// How many CNAMEs within the zone an answer follows (ExternalName Services naming each other).
const MAX_CNAMES: usize = 8;

/// The zone the responder is authoritative for.
#[derive(Clone, Debug)]
pub struct Zone {
    /// The cluster domain, fully qualified (`cluster.local.`).
    pub domain: Name,
    /// TTL of every record it answers.
    pub ttl: u32,
}

/// What to do with a query.
#[derive(Debug)]
pub enum Outcome {
    /// Send this answer; `localities` of the headless endpoints it holds.
    Answer(Message, AnswerKind, Vec<Locality>),
    /// Not ours: relay to the upstream unchanged.
    Forward,
    /// This answer (a CNAME to `target`, an ExternalName Service's), completed with the
    /// upstream's records for `target`, as CoreDNS does: a stub resolver does not chase a CNAME.
    Chase(Message, Name),
}

/// What an answer was, for the metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AnswerKind {
    /// Records.
    Records,
    /// The name exists, not with this type.
    NoData,
    /// No such name.
    NxDomain,
    /// A malformed or unsupported query.
    Refused,
}

impl AnswerKind {
    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Records => "answer",
            Self::NoData => "nodata",
            Self::NxDomain => "nxdomain",
            Self::Refused => "error",
        }
    }
}

/// Decides `request` from the view. `draw` returns a uniform value in [0, 1).
pub fn answer(view: &DnsView, zone: &Zone, request: &Message, draw: &mut dyn FnMut() -> f64) -> Outcome {
    if request.metadata.op_code != OpCode::Query {
        return Outcome::Answer(error(request, ResponseCode::NotImp), AnswerKind::Refused, Vec::new());
    }
    let [query] = request.queries.as_slice() else {
        return Outcome::Answer(error(request, ResponseCode::FormErr), AnswerKind::Refused, Vec::new());
    };
    if request.edns.as_ref().is_some_and(|edns| edns.version() > 0) {
        // RFC 6891: an EDNS version we do not speak is BADVERS, with our version (0) in the OPT.
        return Outcome::Answer(error(request, ResponseCode::BADVERS), AnswerKind::Refused, Vec::new());
    }
    let lookup = ClusterName::parse(query.name(), &zone.domain);
    if matches!(lookup, ClusterName::Outside | ClusterName::Pod | ClusterName::Elsewhere) {
        return Outcome::Forward;
    }
    if matches!(query.query_type(), RecordType::AXFR | RecordType::IXFR) {
        // No zone transfers of the cluster domain, as CoreDNS without `transfer`.
        return Outcome::Answer(error(request, ResponseCode::Refused), AnswerKind::Refused, Vec::new());
    }
    let mut response = reply(request);
    response.metadata.authoritative = true;
    if owned_upstream(view, &lookup) {
        return Outcome::Forward;
    }
    let mut builder = Builder { zone, query, response: &mut response, localities: Vec::new(), chase: None };
    let mut kind = builder.resolve(view, &lookup, draw);
    // An ExternalName naming a name in the cluster domain is answered here, as CoreDNS does: the
    // upstream would only ask us again.
    let mut followed = 0;
    while let Some(target) = builder.chase.take_if(|target| zone.domain.zone_of(target)) {
        let inner = ClusterName::parse(&target, &zone.domain);
        followed += 1;
        if followed > MAX_CNAMES
            || matches!(inner, ClusterName::Outside | ClusterName::Pod | ClusterName::Elsewhere)
            || owned_upstream(view, &inner)
        {
            builder.chase = Some(target);
            break;
        }
        let chased = Query::query(target, query.query_type());
        let mut inner_builder =
            Builder { zone, query: &chased, response: builder.response, localities: Vec::new(), chase: None };
        // The response code is the chain's last name's (RFC 6604), the CNAME stays in the answer.
        kind = inner_builder.resolve(view, &inner, draw);
        let (localities, chase) = (inner_builder.localities, inner_builder.chase);
        builder.localities.extend(localities);
        builder.chase = chase;
    }
    let localities = std::mem::take(&mut builder.localities);
    match builder.chase.take() {
        Some(target) => Outcome::Chase(response, target),
        None => Outcome::Answer(response, kind, localities),
    }
}

/// Whether `lookup` names a Service annotated to be answered by the cluster DNS.
fn owned_upstream(view: &DnsView, lookup: &ClusterName) -> bool {
    match lookup {
        ClusterName::Service { namespace, name }
        | ClusterName::Endpoint { namespace, name, .. }
        | ClusterName::Srv { namespace, name, .. } => matches!(view.service(namespace, name), Some(Records::Upstream)),
        _ => false,
    }
}

/// An error reply to a query we could parse.
pub fn error(request: &Message, code: ResponseCode) -> Message {
    let mut response = reply(request);
    response.metadata.response_code = code;
    response
}

/// A reply skeleton: same id, opcode, question, RD; EDNS when asked.
fn reply(request: &Message) -> Message {
    let mut response = Message::new(request.metadata.id, MessageType::Response, request.metadata.op_code);
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_queries(request.queries.iter().cloned());
    if let Some(edns) = &request.edns {
        let mut ours = Edns::new();
        ours.set_max_payload(EDNS_PAYLOAD.min(edns.max_payload().max(512)));
        ours.set_dnssec_ok(false);
        response.set_edns(ours);
    }
    response
}

/// The UDP size limit for the answer to `request`.
pub fn udp_limit(request: &Message) -> u16 {
    request.edns.as_ref().map_or(512, |edns| edns.max_payload().clamp(512, EDNS_PAYLOAD))
}

struct Builder<'a> {
    zone: &'a Zone,
    query: &'a Query,
    response: &'a mut Message,
    localities: Vec<Locality>,
    /// The CNAME target whose records complete the answer.
    chase: Option<Name>,
}

impl Builder<'_> {
    fn resolve(&mut self, view: &DnsView, lookup: &ClusterName, draw: &mut dyn FnMut() -> f64) -> AnswerKind {
        let qtype = self.query.query_type();
        let name = self.query.name().clone();
        let answers: Option<Vec<Record>> = match lookup {
            ClusterName::Apex => Some(match qtype {
                RecordType::SOA => vec![self.soa()],
                RecordType::NS => self.ns(view),
                _ => Vec::new(),
            }),
            ClusterName::DnsVersion => Some(if qtype == RecordType::TXT {
                let mut record = self.record(&name, RData::TXT(TXT::new(vec![SCHEMA_VERSION.to_owned()])));
                record.ttl = SCHEMA_TTL;
                vec![record]
            } else {
                Vec::new()
            }),
            ClusterName::SvcZone => Some(Vec::new()),
            ClusterName::Namespace { namespace } => view.has_namespace(namespace).then(Vec::new),
            ClusterName::Service { namespace, name: service } => match view.service(namespace, service) {
                None => None,
                Some(Records::ExternalName { target }) => {
                    let Ok(target) = Name::from_ascii(format!("{target}.")) else { return self.nxdomain() };
                    if !matches!(qtype, RecordType::CNAME | RecordType::ANY) {
                        self.chase = Some(target.clone());
                    }
                    Some(vec![self.record(&name, RData::CNAME(CNAME(target)))])
                }
                Some(Records::ClusterIp { ips, ports, .. }) => Some(match qtype {
                    RecordType::SRV => self.srv_cluster_ip(&name, ips, ports, None),
                    _ => self.addresses(&name, qtype, ips.iter().copied()),
                }),
                Some(Records::Upstream) => None,
                Some(Records::Headless(h)) if h.addresses.choices.is_empty() => None,
                Some(Records::Headless(h)) => Some(match qtype {
                    RecordType::SRV => {
                        let mut all = Vec::new();
                        for (_, chosen) in &h.ports {
                            all.extend(self.srv_headless(&name, chosen, namespace, service));
                        }
                        all
                    }
                    _ => {
                        let picked = pick(&h.addresses, draw);
                        let records = self.addresses(&name, qtype, picked.iter().map(|c| c.address));
                        if !records.is_empty() {
                            self.localities.extend(picked.iter().map(|c| c.locality));
                        }
                        records
                    }
                }),
            },
            ClusterName::Endpoint { namespace, name: service, host } => view
                .service(namespace, service)
                .and_then(|records| records.hosts().get(host))
                .map(|ips| self.addresses(&name, qtype, ips.iter().copied())),
            ClusterName::Srv { namespace, name: service, port, protocol } => match view.service(namespace, service) {
                Some(Records::ClusterIp { ips, ports, .. }) => {
                    let records = self.srv_cluster_ip(&name, ips, ports, Some((port, protocol)));
                    (!records.is_empty())
                        .then_some(records)
                        .map(|r| if qtype == RecordType::SRV { r } else { Vec::new() })
                }
                Some(Records::ExternalName { .. } | Records::Upstream) => None,
                Some(Records::Headless(h)) => {
                    let found = h.ports.iter().find(|(p, _)| p.name == *port && proto_name(p.protocol) == protocol);
                    match found {
                        Some((_, chosen)) if !chosen.choices.is_empty() => Some(if qtype == RecordType::SRV {
                            self.srv_headless(&name, chosen, namespace, service)
                        } else {
                            Vec::new()
                        }),
                        _ => None,
                    }
                }
                None => None,
            },
            ClusterName::Unknown => None,
            ClusterName::Outside | ClusterName::Pod | ClusterName::Elsewhere => None,
        };
        let Some(answers) = answers else {
            return self.nxdomain();
        };
        if answers.is_empty() {
            self.response.add_authority(self.soa());
            return AnswerKind::NoData;
        }
        self.response.add_answers(answers);
        AnswerKind::Records
    }

    fn nxdomain(&mut self) -> AnswerKind {
        self.response.metadata.response_code = ResponseCode::NXDomain;
        self.response.add_authority(self.soa());
        AnswerKind::NxDomain
    }

    fn record(&self, name: &Name, rdata: RData) -> Record {
        let mut record = Record::from_rdata(name.clone(), self.zone.ttl, rdata);
        record.dns_class = DNSClass::IN;
        record
    }

    /// A or AAAA of `ips` as the query type asks (ANY: both), each address once; none for other
    /// types.
    fn addresses(&self, name: &Name, qtype: RecordType, ips: impl Iterator<Item = IpAddr>) -> Vec<Record> {
        let mut seen: Vec<IpAddr> = Vec::new();
        ips.filter(|ip| {
            let new = !seen.contains(ip);
            seen.push(*ip);
            new
        })
        .filter_map(|ip| match (ip, qtype) {
            (IpAddr::V4(v4), RecordType::A | RecordType::ANY) => Some(self.record(name, RData::A(A(v4)))),
            (IpAddr::V6(v6), RecordType::AAAA | RecordType::ANY) => Some(self.record(name, RData::AAAA(AAAA(v6)))),
            _ => None,
        })
        .collect()
    }

    fn srv_cluster_ip(
        &mut self,
        name: &Name,
        ips: &[IpAddr],
        ports: &[NamedPort],
        only: Option<(&String, &String)>,
    ) -> Vec<Record> {
        let target = self.trim_to_service(name, only.is_some());
        let mut out = Vec::new();
        for port in ports {
            if only.is_some_and(|(p, proto)| port.name != *p || proto_name(port.protocol) != proto) {
                continue;
            }
            out.push(self.record(name, RData::SRV(SRV::new(0, 100, port.port, target.clone()))));
        }
        if !out.is_empty() {
            let additional = self.addresses(&target, RecordType::ANY, ips.iter().copied());
            self.response.add_additionals(additional);
        }
        out
    }

    fn srv_headless(&mut self, name: &Name, chosen: &Chosen, ns: &str, svc: &str) -> Vec<Record> {
        let total: f64 = chosen.choices.iter().map(|c| c.weight).sum();
        // One SRV per (target, port) (RFC 2181 §5: no duplicate records in a set): endpoints
        // sharing a hostname are one target, whose weight is theirs together and whose addresses
        // all go in the additional section.
        let mut targets: Vec<(&str, u16, f64, Vec<&NamedChoice>)> = Vec::new();
        for choice in &chosen.choices {
            match targets.iter_mut().find(|(label, port, ..)| *label == choice.label && *port == choice.port) {
                Some((_, _, weight, members)) => {
                    *weight += choice.weight;
                    members.push(choice);
                }
                None => targets.push((&choice.label, choice.port, choice.weight, vec![choice])),
            }
        }
        let mut out = Vec::new();
        for (label, port, weight, members) in targets {
            let Ok(target) =
                Name::from_ascii(format!("{label}.{svc}.{ns}.svc.")).and_then(|n| n.append_domain(&self.zone.domain))
            else {
                continue;
            };
            // SRV weights carry the plan's weights (RFC 2782): equal modes give equal weights.
            let weight = if total > 0.0 { ((weight / total) * 10_000.0).round().max(1.0) as u16 } else { 1 };
            self.localities.extend(members.iter().map(|c| c.locality));
            out.push(self.record(name, RData::SRV(SRV::new(0, weight, port, target.clone()))));
            let additional = self.addresses(&target, RecordType::ANY, members.iter().map(|c| c.address));
            for record in additional {
                if !self.response.additionals.contains(&record) {
                    self.response.add_additional(record);
                }
            }
        }
        out
    }

    /// The zone's name server: the cluster DNS Service by its own name with its ClusterIPs,
    /// what pods reach (CoreDNS in a cluster names the Service that fronts it the same way);
    /// `ns.dns.<domain>`, the SOA's MNAME, without that Service.
    fn ns(&mut self, view: &DnsView) -> Vec<Record> {
        let (namespace, service) = UPSTREAM_SERVICE;
        let fronting =
            Name::from_ascii(format!("{service}.{namespace}.svc.")).and_then(|n| n.append_domain(&self.zone.domain));
        let server = match (view.service(namespace, service), fronting) {
            (Some(Records::ClusterIp { ips, .. }), Ok(server)) => {
                let additional = self.addresses(&server, RecordType::ANY, ips.iter().copied());
                self.response.add_additionals(additional);
                server
            }
            _ => self.name_server(),
        };
        vec![self.record(&self.zone.domain, RData::NS(NS(server)))]
    }

    fn name_server(&self) -> Name {
        let domain = &self.zone.domain;
        Name::from_ascii("ns.dns.").and_then(|n| n.append_domain(domain)).unwrap_or_else(|_| domain.clone())
    }

    /// `<svc>.<ns>.svc.<domain>` from a query name (dropping `_port._proto.` when `srv_form`).
    fn trim_to_service(&self, name: &Name, srv_form: bool) -> Name {
        if srv_form { name.trim_to(name.num_labels() as usize - 2) } else { name.clone() }
    }

    fn soa(&self) -> Record {
        let domain = &self.zone.domain;
        let mname = self.name_server();
        let rname =
            Name::from_ascii("hostmaster.").and_then(|n| n.append_domain(domain)).unwrap_or_else(|_| domain.clone());
        let soa = SOA::new(mname, rname, 1, 7200, 1800, 86400, self.zone.ttl);
        self.record(domain, RData::SOA(soa))
    }
}

/// The label SRV uses for a protocol.
fn proto_name(protocol: Protocol) -> &'static str {
    match protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    }
}

/// The addresses one answer holds: all chosen ones when their weights are equal, else one drawn
/// by weight (clients re-sort address lists, so only the set, not the order, can carry weights).
pub fn pick<'a>(chosen: &'a Chosen, draw: &mut dyn FnMut() -> f64) -> Vec<&'a NamedChoice> {
    if !chosen.weighted {
        return chosen.choices.iter().collect();
    }
    let total: f64 = chosen.choices.iter().map(|c| c.weight).sum();
    let mut at = draw() * total;
    for choice in &chosen.choices {
        if at < choice.weight {
            return vec![choice];
        }
        at -= choice.weight;
    }
    chosen.choices.last().into_iter().collect()
}

/// Encodes `message` within `limit` bytes; what does not fit is cut and flagged (TC), so the
/// client retries over TCP.
pub fn encode(message: &Message, limit: u16) -> Vec<u8> {
    let mut buffer = Vec::with_capacity(512);
    let mut encoder = BinEncoder::new(&mut buffer);
    encoder.set_max_size(limit);
    if message.emit(&mut encoder).is_ok() {
        return buffer;
    }
    let mut failed = Message::new(message.metadata.id, MessageType::Response, message.metadata.op_code);
    failed.metadata.response_code = ResponseCode::ServFail;
    failed.to_vec().unwrap_or_default()
}
