//! A relayed question read from its wire form alone: a query (opcode QUERY) of one question outside
//! the cluster domain, with no records but at most one well-formed EDNS(0) OPT record. The whole
//! path relays such a query byte for byte, so the responder can answer it from the cache of relayed
//! answers without parsing it into a message. Anything else, or anything in doubt, takes the whole
//! path ([`crate::server::respond`]), which stays the reference: the fuzz target `dns_packet`
//! checks that every query glanced at is one the whole path relays, asked and sized the same.
//! Pure.

use hickory_proto::rr::Name;

use crate::{answer::EDNS_PAYLOAD, relay_cache::Asked};

const HEADER: usize = 12;
const TYPE_OPT: u16 = 41;
/// The longest name, in wire form (RFC 1035 §2.3.4).
const MAX_NAME: usize = 255;

/// What the responder needs of a relayed query to answer it from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Glance {
    /// The question's type.
    pub qtype: u16,
    /// How it asked (EDNS, DO).
    pub asked: Asked,
    /// The client's UDP size, as [`crate::answer::udp_limit`] reads it.
    pub udp_limit: u16,
}

/// The cluster domain in wire form, lowercase, with the root label.
#[derive(Clone, Debug)]
pub struct Domain(Box<[u8]>);

impl Domain {
    /// The wire form of `domain`.
    pub fn of(domain: &Name) -> Self {
        let mut wire = Vec::new();
        for label in domain.iter() {
            wire.push(u8::try_from(label.len()).unwrap_or(u8::MAX));
            wire.extend(label.iter().map(u8::to_ascii_lowercase));
        }
        wire.push(0);
        Self(wire.into())
    }
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

/// `query` as a relayed question, if it is one beyond doubt.
pub fn glance(query: &[u8], domain: &Domain) -> Option<Glance> {
    // QR clear and opcode QUERY; one question, no answer or authority records, at most an OPT.
    if query.len() < HEADER || query[2] & 0xF8 != 0 || query[4..10] != [0, 1, 0, 0, 0, 0] || query[10] != 0 {
        return None;
    }
    let additional = query[11];
    let (mut at, mut starts, mut labels) = (HEADER, [0usize; MAX_NAME / 2 + 1], 0);
    loop {
        let len = usize::from(*query.get(at)?);
        if len == 0 {
            break;
        }
        // No compression in a question, and labels of at most 63 bytes.
        if len > 63 || labels == starts.len() {
            return None;
        }
        starts[labels] = at;
        labels += 1;
        at += 1 + len;
    }
    let name_end = at + 1;
    if name_end - HEADER > MAX_NAME {
        return None;
    }
    let zone = &domain.0;
    if let Some(suffix) = name_end.checked_sub(zone.len()).filter(|s| *s >= HEADER)
        && starts[..labels].contains(&suffix)
        && query[suffix..name_end].eq_ignore_ascii_case(zone)
    {
        return None;
    }
    let qtype = u16_at(query, name_end)?;
    let end = name_end + 4;
    match additional {
        0 if end == query.len() => Some(Glance { qtype, asked: Asked::Plain, udp_limit: 512 }),
        1 => {
            // The OPT record: the root name, its type, the UDP size as its class, then extended
            // RCODE, version and flags as its TTL, and options.
            if *query.get(end)? != 0 || u16_at(query, end + 1)? != TYPE_OPT {
                return None;
            }
            let payload = u16_at(query, end + 3)?;
            let [rcode_high, version, flags, _] = *query.get(end + 5..end + 9)? else { return None };
            // Another EDNS version is answered BADVERS, by the whole path.
            if rcode_high != 0 || version != 0 {
                return None;
            }
            let rdata = end + 11;
            if rdata + usize::from(u16_at(query, end + 9)?) != query.len() || !plain_options(&query[rdata..]) {
                return None;
            }
            let asked = if flags & 0x80 != 0 { Asked::Dnssec } else { Asked::Edns };
            Some(Glance { qtype, asked, udp_limit: payload.clamp(512, EDNS_PAYLOAD) })
        }
        _ => None,
    }
}

/// Whether `options` is a whole sequence of EDNS options none of which the message parser reads
/// into a structure it might refuse (NSID, the DNSSEC algorithm lists, client subnet).
fn plain_options(mut options: &[u8]) -> bool {
    while !options.is_empty() {
        let (Some(code), Some(len)) = (u16_at(options, 0), u16_at(options, 2)) else { return false };
        let Some(rest) = options.get(4 + usize::from(len)..) else { return false };
        if (3..=8).contains(&code) {
            return false;
        }
        options = rest;
    }
    true
}

#[cfg(test)]
mod tests {
    use hickory_proto::{
        op::{Edns, Message, MessageType, OpCode, Query},
        rr::{RecordType, rdata::opt::EdnsOption},
    };

    use super::*;

    fn domain() -> Domain {
        Domain::of(&Name::from_ascii("cluster.local.").unwrap())
    }

    fn query(name: &str, edns: Option<(u16, bool)>) -> Vec<u8> {
        let mut message = Message::new(7, MessageType::Query, OpCode::Query);
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::AAAA));
        if let Some((payload, dnssec)) = edns {
            let mut edns = Edns::new();
            edns.set_max_payload(payload);
            edns.set_dnssec_ok(dnssec);
            message.set_edns(edns);
        }
        message.to_vec().unwrap()
    }

    #[test]
    fn names_outside_the_domain_are_read_with_how_they_asked() {
        let aaaa = u16::from(RecordType::AAAA);
        assert_eq!(
            glance(&query("example.com.", None), &domain()),
            Some(Glance { qtype: aaaa, asked: Asked::Plain, udp_limit: 512 })
        );
        assert_eq!(
            glance(&query("Example.COM.", Some((4096, false))), &domain()),
            Some(Glance { qtype: aaaa, asked: Asked::Edns, udp_limit: EDNS_PAYLOAD })
        );
        assert_eq!(
            glance(&query("example.com.", Some((700, true))), &domain()),
            Some(Glance { qtype: aaaa, asked: Asked::Dnssec, udp_limit: 700 })
        );
        // A name ending like the domain but not at a label's boundary is outside it.
        assert!(glance(&query("xcluster.local.", None), &domain()).is_some());
        assert!(glance(&query("cluster.local.example.", None), &domain()).is_some());
    }

    #[test]
    fn the_cluster_domain_and_anything_in_doubt_take_the_whole_path() {
        for name in
            ["cluster.local.", "web.default.svc.cluster.local.", "a.B.Cluster.Local.", "1-2-3-4.ns.pod.cluster.local."]
        {
            assert_eq!(glance(&query(name, None), &domain()), None, "{name}");
        }
        let plain = query("example.com.", None);
        let mut response = plain.clone();
        response[2] |= 0x80;
        let mut notify = plain.clone();
        notify[2] |= 4 << 3;
        let mut two = plain.clone();
        two[5] = 2;
        let mut trailing = plain.clone();
        trailing.push(0);
        let mut cut = plain.clone();
        cut.pop();
        let mut compressed = plain.clone();
        compressed[12] = 0xC0;
        for (what, bytes) in [
            ("a response", response),
            ("another opcode", notify),
            ("two questions", two),
            ("bytes after the question", trailing),
            ("a cut question", cut),
            ("a compressed name", compressed),
        ] {
            assert_eq!(glance(&bytes, &domain()), None, "{what}");
        }
        let mut version = query("example.com.", Some((1232, false)));
        let at = version.len() - 5;
        version[at] = 1;
        assert_eq!(glance(&version, &domain()), None, "EDNS version 1 is answered BADVERS");
    }

    /// Every byte of a few queries changed several ways, each cut short and extended: whatever
    /// the glance reads as relayed, the whole path relays, asked and sized the same.
    #[test]
    fn what_the_glance_reads_as_relayed_the_whole_path_relays_the_same_way() {
        use crate::{
            answer::{Zone, udp_limit},
            server::{Handled, respond},
            view::DnsView,
        };
        let (view, zone) = (DnsView::default(), Zone { domain: Name::from_ascii("cluster.local.").unwrap(), ttl: 5 });
        let check = |bytes: &[u8]| {
            let glanced = glance(bytes, &domain());
            let handled = respond(&view, &zone, bytes, false, &mut || 0.5);
            if let Some(glanced) = glanced {
                let Handled::Forward { request, .. } = handled else { panic!("{bytes:?}: glanced {glanced:?}") };
                assert_eq!(Asked::of(&request), glanced.asked, "{bytes:?}");
                assert_eq!(udp_limit(&request), glanced.udp_limit, "{bytes:?}");
                assert_eq!(u16::from(request.queries[0].query_type()), glanced.qtype, "{bytes:?}");
            }
            glanced.is_some()
        };
        let mut glanced = 0;
        for base in [
            query("example.com.", None),
            query("example.com.", Some((4096, true))),
            query("a.b.cluster.locaL.", Some((512, false))),
            query("svc.cluster.local.example.", None),
        ] {
            for at in 0..base.len() {
                for value in [0, 1, 0x20, 0x29, 0x3f, 0x40, 0x80, 0xc0, 0xff, base[at] ^ 0x20] {
                    let mut changed = base.clone();
                    changed[at] = value;
                    glanced += usize::from(check(&changed));
                }
                glanced += usize::from(check(&base[..at]));
            }
            let mut longer = base.clone();
            longer.extend([0, 0, 41, 2, 0, 0, 0, 0, 0, 0, 0]);
            check(&longer);
        }
        assert!(glanced > 200, "the changes keep many queries relayed: {glanced}");
    }

    #[test]
    fn options_the_parser_reads_take_the_whole_path_and_others_are_kept() {
        let with = |option: EdnsOption| {
            let mut message = Message::new(7, MessageType::Query, OpCode::Query);
            message.add_query(Query::query(Name::from_ascii("example.com.").unwrap(), RecordType::A));
            let mut edns = Edns::new();
            edns.options_mut().insert(option);
            message.set_edns(edns);
            message.to_vec().unwrap()
        };
        let cookie = with(EdnsOption::Unknown(10, vec![1, 2, 3, 4, 5, 6, 7, 8]));
        assert_eq!(glance(&cookie, &domain()).map(|g| g.asked), Some(Asked::Edns));
        let subnet = with(EdnsOption::Unknown(8, vec![0, 1, 24, 0, 192, 0, 2]));
        assert_eq!(glance(&subnet, &domain()), None);
        let mut broken = cookie.clone();
        let at = broken.len() - 9;
        broken[at] = 200;
        assert_eq!(glance(&broken, &domain()), None, "an option longer than the record");
    }
}
