//! What a relayed query and its reply must be. A query goes to the upstream under an id of the
//! responder's own (never the client's, which a spoofer could predict), and a reply is taken only
//! when it answers that id and the very question asked; it goes back under the client's id,
//! within the client's UDP size, cut with TC set (the client retries over TCP) when it is larger.
//! Pure, so the fuzz target `relay` drives it with any bytes.

use hickory_proto::op::{Message, MessageType, Query};

use super::answer::{self, encode};

/// The most a relayed UDP reply may be, whatever the client offers: the DNS flag day's 1,232 bytes
/// (no fragmentation, and a spoofed source gets at most this much for a query).
pub const MAX_UDP_REPLY: u16 = 1232;

/// `raw`, the client's query, with `id` in place of its id.
pub fn outgoing(raw: &[u8], id: u16) -> Vec<u8> {
    let mut query = raw.to_vec();
    if query.len() >= 2 {
        query[..2].copy_from_slice(&id.to_be_bytes());
    }
    query
}

/// Why an upstream's datagram is not the reply to a relayed query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotTheReply {
    /// Another id, or not a response: not for this query (late, or spoofed).
    Stranger,
    /// The id matches but the question does not: spoofed, or a broken upstream.
    OtherQuestion,
    /// Not a DNS message.
    Malformed,
}

/// The reply to send the client for `request` (its id restored), from `reply`, the upstream's
/// answer to the query relayed under `id`; at most `limit` bytes.
pub fn incoming(request: &Message, id: u16, reply: &[u8], limit: u16) -> Result<Vec<u8>, NotTheReply> {
    if reply.len() < 12 || u16::from_be_bytes([reply[0], reply[1]]) != id || reply[2] & 0x80 == 0 {
        return Err(NotTheReply::Stranger);
    }
    let mut message = Message::from_vec(reply).map_err(|_| NotTheReply::Malformed)?;
    if message.metadata.message_type != MessageType::Response || !same_questions(&request.queries, &message.queries) {
        return Err(NotTheReply::OtherQuestion);
    }
    message.metadata.id = request.metadata.id;
    if reply.len() <= usize::from(limit) {
        let mut bytes = reply.to_vec();
        bytes[..2].copy_from_slice(&request.metadata.id.to_be_bytes());
        return Ok(bytes);
    }
    // Too large for the client: the header and question, flagged truncated.
    message.answers.clear();
    message.authorities.clear();
    message.additionals.clear();
    message.signature = None;
    message.metadata.truncation = true;
    Ok(encode(&message, limit))
}

/// The size a relayed reply to `request` may have: the client's over TCP, else its UDP size, at
/// most [`MAX_UDP_REPLY`].
pub fn limit(request: &Message, tcp: bool) -> u16 {
    if tcp { u16::MAX } else { answer::udp_limit(request).min(MAX_UDP_REPLY) }
}

/// The same questions, names compared as DNS does (without case).
fn same_questions(asked: &[Query], answered: &[Query]) -> bool {
    asked.len() == answered.len()
        && asked.iter().zip(answered).all(|(a, b)| {
            a.query_type() == b.query_type()
                && a.query_class() == b.query_class()
                && a.name().to_lowercase() == b.name().to_lowercase()
        })
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use hickory_proto::{
        op::{Edns, OpCode},
        rr::{Name, RData, Record, RecordType, rdata::A},
    };

    use super::*;

    fn query(name: &str, id: u16, payload: Option<u16>) -> Message {
        let mut message = Message::new(id, MessageType::Query, OpCode::Query);
        message.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        if let Some(payload) = payload {
            let mut edns = Edns::new();
            edns.set_max_payload(payload);
            message.edns = Some(edns);
        }
        message
    }

    fn reply_to(request: &Message, id: u16, answers: usize) -> Vec<u8> {
        let mut reply = request.clone();
        reply.metadata.id = id;
        reply.metadata.message_type = MessageType::Response;
        let name = request.queries[0].name().clone();
        for n in 0..answers {
            let address = Ipv4Addr::from(0x0a00_0000 + n as u32);
            reply.add_answer(Record::from_rdata(name.clone(), 5, RData::A(A(address))));
        }
        reply.to_vec().unwrap()
    }

    #[test]
    fn the_upstream_sees_our_id_and_the_client_gets_its_own_back() {
        let request = query("example.com.", 0x1111, None);
        let raw = request.to_vec().unwrap();
        let relayed = outgoing(&raw, 0x2222);
        assert_eq!(&relayed[..2], &[0x22, 0x22]);
        assert_eq!(&relayed[2..], &raw[2..]);
        let back = incoming(&request, 0x2222, &reply_to(&request, 0x2222, 1), limit(&request, false)).unwrap();
        let back = Message::from_vec(&back).unwrap();
        assert_eq!((back.metadata.id, back.answers.len()), (0x1111, 1));
    }

    #[test]
    fn a_reply_to_another_id_or_question_is_not_taken() {
        let request = query("example.com.", 1, None);
        let limit = limit(&request, false);
        assert_eq!(incoming(&request, 7, &reply_to(&request, 8, 1), limit), Err(NotTheReply::Stranger));
        assert_eq!(incoming(&request, 7, &request.to_vec().unwrap(), limit), Err(NotTheReply::Stranger));
        let other = query("evil.example.", 1, None);
        assert_eq!(incoming(&request, 7, &reply_to(&other, 7, 1), limit), Err(NotTheReply::OtherQuestion));
        assert_eq!(incoming(&request, 7, &[0, 7, 0x80], limit), Err(NotTheReply::Stranger));
        let shouting = query("EXAMPLE.com.", 1, None);
        assert!(incoming(&request, 7, &reply_to(&shouting, 7, 1), limit).is_ok(), "names compare without case");
    }

    #[test]
    fn a_large_reply_is_cut_to_the_clients_size_with_tc() {
        // A client offering 4,096 bytes gets at most 1,232 over UDP; one without EDNS 512.
        for (payload, expected) in [(Some(4096), MAX_UDP_REPLY), (None, 512)] {
            let request = query("big.example.", 1, payload);
            let limit = limit(&request, false);
            assert_eq!(limit, expected);
            let reply = reply_to(&request, 9, 200);
            assert!(reply.len() > 3000);
            let cut = incoming(&request, 9, &reply, limit).unwrap();
            assert!(cut.len() <= usize::from(limit), "{} bytes", cut.len());
            let cut = Message::from_vec(&cut).unwrap();
            assert!(cut.metadata.truncation && cut.answers.is_empty(), "{cut:?}");
            assert_eq!((cut.metadata.id, cut.queries.len()), (1, 1));
        }
        // Over TCP it goes whole.
        let request = query("big.example.", 1, None);
        let reply = reply_to(&request, 9, 200);
        assert_eq!(incoming(&request, 9, &reply, limit(&request, true)).unwrap().len(), reply.len());
    }
}
