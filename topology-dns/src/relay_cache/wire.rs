//! Just enough of the DNS wire format to keep an upstream's reply and serve it again: where each
//! record's TTL sits (so a served copy counts down), how long the answer may be kept (RFC 2308
//! for negative answers), and the header bits a served copy takes from the client. Bounds are
//! checked everywhere; anything it cannot read is not kept. Pure.

/// Header length.
const HEADER: usize = 12;
/// The OPT pseudo-record: its "TTL" is the extended RCODE and flags, never counted down.
const TYPE_OPT: u16 = 41;
const TYPE_SOA: u16 = 6;
const RCODE_NOERROR: u8 = 0;
const RCODE_NXDOMAIN: u8 = 3;

/// What a reply holds, as the cache needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Offsets of the TTL of every record but OPT.
    pub ttl_offsets: Vec<u16>,
    /// The end of the question section.
    pub question_end: usize,
    /// How long the reply may be kept, seconds: the least TTL of the answer section; for a
    /// negative reply (NXDOMAIN, or no answer), the SOA's TTL or MINIMUM, whichever is less
    /// (RFC 2308 §5). `None`: not to be kept (an error, truncated, no SOA to bound a negative).
    pub keep_for: Option<u32>,
    /// A negative reply.
    pub negative: bool,
}

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The offset after the (possibly compressed) name at `at`.
fn skip_name(bytes: &[u8], mut at: usize) -> Option<usize> {
    // A name has at most 127 labels; more is a malformed or hostile message.
    for _ in 0..128 {
        let len = *bytes.get(at)?;
        match len & 0xC0 {
            0x00 if len == 0 => return Some(at + 1),
            0x00 => at += 1 + usize::from(len),
            0xC0 => return bytes.get(at + 1).map(|_| at + 2),
            _ => return None,
        }
    }
    None
}

/// The CD (checking disabled) bit of a header's fourth byte.
pub const CHECKING_DISABLED: u8 = 0x10;

/// Whether two questions in wire form (an uncompressed name, then type and class) are one
/// question: names compared without case (RFC 4343), type and class byte for byte.
pub fn same_question(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() || a.len() < 5 {
        return false;
    }
    let name = a.len() - 4;
    a[..name].eq_ignore_ascii_case(&b[..name]) && a[name..] == b[name..]
}

/// The end of the question section of `message`, a message of one question.
pub fn question_end(message: &[u8]) -> Option<usize> {
    if message.len() < HEADER || u16_at(message, 4)? != 1 {
        return None;
    }
    let end = skip_name(message, HEADER)? + 4;
    (end <= message.len()).then_some(end)
}

/// Reads the layout of `reply`, an upstream's reply to one question.
pub fn layout(reply: &[u8]) -> Option<Layout> {
    if reply.len() < HEADER || reply.len() > usize::from(u16::MAX) {
        return None;
    }
    let (flags, rcode) = (reply[2], reply[3] & 0x0F);
    let truncated = flags & 0x02 != 0;
    let counts = [u16_at(reply, 4)?, u16_at(reply, 6)?, u16_at(reply, 8)?, u16_at(reply, 10)?];
    if counts[0] != 1 {
        return None;
    }
    let question_end = skip_name(reply, HEADER)? + 4;
    if question_end > reply.len() {
        return None;
    }
    let mut at = question_end;
    let mut ttl_offsets = Vec::new();
    let (mut least_answer, mut soa_bound) = (None::<u32>, None::<u32>);
    for (section, &count) in counts.iter().enumerate().skip(1) {
        for _ in 0..count {
            at = skip_name(reply, at)?;
            let rtype = u16_at(reply, at)?;
            let ttl = u32_at(reply, at + 4)?;
            let rdlength = usize::from(u16_at(reply, at + 8)?);
            let rdata = at + 10;
            let end = rdata.checked_add(rdlength).filter(|end| *end <= reply.len())?;
            if rtype != TYPE_OPT {
                ttl_offsets.push(u16::try_from(at + 4).ok()?);
            }
            if section == 1 {
                least_answer = Some(least_answer.map_or(ttl, |least: u32| least.min(ttl)));
            } else if section == 2 && rtype == TYPE_SOA && rdlength >= 20 {
                let minimum = u32_at(reply, end - 4)?;
                soa_bound = Some(ttl.min(minimum));
            }
            at = end;
        }
    }
    let negative = rcode == RCODE_NXDOMAIN || (rcode == RCODE_NOERROR && counts[1] == 0);
    let keep_for = match (truncated, rcode, negative) {
        (true, ..) => None,
        (false, RCODE_NOERROR | RCODE_NXDOMAIN, true) => soa_bound,
        (false, RCODE_NOERROR, false) => least_answer,
        _ => None,
    };
    Some(Layout { ttl_offsets, question_end, keep_for: keep_for.filter(|ttl| *ttl > 0), negative })
}

/// Writes `ttl(original)` over each record's TTL.
pub fn set_ttls(bytes: &mut [u8], offsets: &[u16], ttl: impl Fn(u32) -> u32) {
    for &offset in offsets {
        let at = usize::from(offset);
        if let Some(field) = bytes.get_mut(at..at + 4) {
            let original = u32::from_be_bytes([field[0], field[1], field[2], field[3]]);
            field.copy_from_slice(&ttl(original).to_be_bytes());
        }
    }
}

/// Makes a kept reply the reply to `request`: its id, its RD bit, and its question as the client
/// wrote it (the same name in another case: a resolver using 0x20 checks the case it sent).
/// `false` when the question is not the same length (not the same question).
pub fn address_to(reply: &mut [u8], question_end: usize, request: &[u8]) -> bool {
    let (Some(asked), Some(kept)) = (request.get(HEADER..question_end), reply.get(HEADER..question_end)) else {
        return false;
    };
    if !asked.eq_ignore_ascii_case(kept) || request.len() < HEADER {
        return false;
    }
    reply[..2].copy_from_slice(&request[..2]);
    reply[2] = (reply[2] & !0x01) | (request[2] & 0x01);
    reply[HEADER..question_end].copy_from_slice(asked);
    true
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use hickory_proto::{
        op::{Message, MessageType, OpCode, Query, ResponseCode},
        rr::{
            Name, RData, Record, RecordType,
            rdata::{A, SOA},
        },
    };

    use super::*;

    fn reply(name: &str, rcode: ResponseCode, answers: &[u32], soa: Option<(u32, u32)>) -> Vec<u8> {
        let owner = Name::from_ascii(name).unwrap();
        let mut message = Message::new(9, MessageType::Response, OpCode::Query);
        message.add_query(Query::query(owner.clone(), RecordType::A));
        message.metadata.response_code = rcode;
        for (n, ttl) in answers.iter().enumerate() {
            message.add_answer(Record::from_rdata(owner.clone(), *ttl, RData::A(A(Ipv4Addr::new(10, 0, 0, n as u8)))));
        }
        if let Some((ttl, minimum)) = soa {
            let zone = Name::from_ascii("example.").unwrap();
            let soa = SOA::new(zone.clone(), zone.clone(), 1, 2, 3, 4, minimum);
            message.add_authority(Record::from_rdata(zone, ttl, RData::SOA(soa)));
        }
        message.to_vec().unwrap()
    }

    #[test]
    fn positive_answers_keep_for_their_least_ttl() {
        let bytes = reply("a.example.", ResponseCode::NoError, &[300, 60, 120], None);
        let layout = layout(&bytes).unwrap();
        assert_eq!((layout.keep_for, layout.negative, layout.ttl_offsets.len()), (Some(60), false, 3));
    }

    #[test]
    fn negative_answers_keep_for_the_soa_bound_and_never_without_one() {
        let nx = layout(&reply("a.example.", ResponseCode::NXDomain, &[], Some((3600, 30)))).unwrap();
        assert_eq!((nx.keep_for, nx.negative), (Some(30), true), "MINIMUM below the SOA's TTL");
        let nodata = layout(&reply("a.example.", ResponseCode::NoError, &[], Some((10, 900)))).unwrap();
        assert_eq!((nodata.keep_for, nodata.negative), (Some(10), true), "the SOA's TTL below MINIMUM");
        let bare = layout(&reply("a.example.", ResponseCode::NXDomain, &[], None)).unwrap();
        assert_eq!(bare.keep_for, None, "RFC 2308 §5: no SOA, not kept");
        assert_eq!(layout(&reply("a.example.", ResponseCode::ServFail, &[], None)).unwrap().keep_for, None);
        assert_eq!(layout(&reply("a.example.", ResponseCode::NoError, &[0], None)).unwrap().keep_for, None);
    }

    #[test]
    fn ttls_count_down_and_the_client_gets_its_id_and_case() {
        let mut bytes = reply("a.example.", ResponseCode::NoError, &[300, 60], None);
        let layout = layout(&bytes).unwrap();
        set_ttls(&mut bytes, &layout.ttl_offsets, |ttl| ttl - 50);
        let mut request = Message::new(0x4242, MessageType::Query, OpCode::Query);
        request.metadata.recursion_desired = true;
        request.add_query(Query::query(Name::from_ascii("A.eXample.").unwrap(), RecordType::A));
        let request = request.to_vec().unwrap();
        assert!(address_to(&mut bytes, layout.question_end, &request));
        let served = Message::from_vec(&bytes).unwrap();
        assert_eq!(served.metadata.id, 0x4242);
        assert!(served.metadata.recursion_desired);
        assert_eq!(served.queries[0].name().to_ascii(), "A.eXample.");
        assert_eq!(served.answers.iter().map(|r| r.ttl).collect::<Vec<_>>(), [250, 10]);
        let mut other = Message::new(1, MessageType::Query, OpCode::Query);
        other.add_query(Query::query(Name::from_ascii("b.example.").unwrap(), RecordType::A));
        assert!(!address_to(&mut bytes, layout.question_end, &other.to_vec().unwrap()));
    }

    #[test]
    fn what_cannot_be_read_is_not_kept() {
        let bytes = reply("a.example.", ResponseCode::NoError, &[300], None);
        for cut in 0..bytes.len() {
            // A prefix either reads as a shorter message or not at all; never a panic.
            let _ = layout(&bytes[..cut]);
        }
        let mut reserved = bytes.clone();
        reserved[12] = 0x40;
        assert_eq!(layout(&reserved), None, "a reserved label type");
        let mut long = bytes;
        long[12] = 63;
        assert_eq!(layout(&long), None, "a label past the end");
    }
}
