//! The packet path without sockets, and the responder's own rules.

use hickory_proto::op::OpCode;
use topology_model::yaml;

use super::*;
use crate::parse_domain;

fn responder() -> Responder {
    let state = yaml::parse(crate::fuzzing::CLUSTER, "dns.yaml").unwrap();
    let view = DnsView::of_node(&state, "a", Vec::new()).unwrap();
    let (_sender, receiver) = watch::channel(Arc::new(view));
    let zone = Zone { domain: parse_domain("cluster.local").unwrap(), ttl: 5 };
    Responder::new(
        zone,
        receiver,
        Arc::new(DnsMetrics::default()),
        0,
        CacheSettings::default(),
        Admission { clients: Clients::Any, own: [127, 0, 0, 1].into() },
    )
}

fn query(name: &str, id: u16) -> Vec<u8> {
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.add_query(Query::query(hickory_proto::rr::Name::from_ascii(name).unwrap(), RecordType::A));
    message.to_vec().unwrap()
}

fn answered(handled: Handled) -> (u16, Vec<String>) {
    let Handled::Reply { bytes, .. } = handled else { panic!("no reply") };
    let reply = Message::from_vec(&bytes).unwrap();
    (reply.metadata.id, reply.answers.iter().map(|r| r.data.to_string()).collect())
}

#[test]
fn kept_answers_are_the_answers_and_weighted_ones_are_drawn_every_time() {
    let responder = responder();
    let mut cache = AnswerCache::default();
    let first = answered(responder.handle(&query("db.default.svc.cluster.local.", 1), false, Some(&mut cache)));
    let again = answered(responder.handle(&query("db.default.svc.cluster.local.", 2), false, Some(&mut cache)));
    assert_eq!((first.0, again.0), (1, 2), "each reply carries its query's id");
    assert_eq!(first.1, again.1);
    let fresh = answered(responder.handle(&query("db.default.svc.cluster.local.", 3), false, None));
    assert_eq!(fresh.1, first.1, "the kept answer is the one built anew");
    // Spillover: one address per answer, drawn by weight, never kept.
    let mut seen = std::collections::BTreeSet::new();
    for id in 0..200 {
        let (_, addresses) =
            answered(responder.handle(&query("spill.default.svc.cluster.local.", id), false, Some(&mut cache)));
        assert_eq!(addresses.len(), 1);
        seen.extend(addresses);
    }
    assert!(seen.len() > 1, "answers are drawn anew: {seen:?}");
    let counted = responder
        .metrics
        .queries
        .get_or_create(&super::super::QueryLabels { r#type: "A".into(), outcome: "answer".into() });
    assert_eq!(counted.get(), 203, "kept answers are counted too");
}

#[tokio::test]
async fn a_query_that_waited_for_a_slot_is_answered_from_what_came_meanwhile() {
    use crate::{
        in_flight::{InFlight, QueueBounds},
        relay_cache::{Asked, Key},
    };
    // No upstream: an answer can only come from the cache.
    let responder = responder();
    let raw = query("popular.example.", 7);
    let request = Message::from_vec(&raw).unwrap();
    let key = Key::of(&raw, Asked::of(&request));
    let slots = InFlight::new(1, 1, 0, QueueBounds { per_source: 1, total: 1 });
    let source = IpAddr::from([10, 0, 0, 1]);
    let Entry::Now(first) = slots.enter(source) else { panic!("the first query gets the slot") };
    let queued = slots.enter(source);
    assert!(matches!(queued, Entry::Queued(_)));
    // Meanwhile the first asker's answer comes and is kept.
    let mut answer = Message::new(7, MessageType::Response, OpCode::Query);
    answer.add_query(request.queries[0].clone());
    let owner = request.queries[0].name().clone();
    answer.add_answer(hickory_proto::rr::Record::from_rdata(
        owner,
        60,
        hickory_proto::rr::RData::A(hickory_proto::rr::rdata::A::new(192, 0, 2, 1)),
    ));
    let kept =
        responder.upstream.relay_cache().put(key.clone().unwrap(), &answer.to_vec().unwrap(), Instant::now(), None);
    assert!(kept);
    drop(first);
    let reply = responder.relay(Admitted::Slot(queued, Handled::Missed { request, raw, key }), false, source).await;
    let reply = Message::from_vec(&reply).unwrap();
    assert_eq!(
        (reply.metadata.id, reply.metadata.response_code, reply.answers.len()),
        (7, hickory_proto::op::ResponseCode::NoError, 1)
    );
    // Not the upstream's failure served stale (RFC 8767's 30 s): the fresh answer.
    assert_eq!(reply.answers[0].ttl, 60);
}
