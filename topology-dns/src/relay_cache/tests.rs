//! The cache of relayed answers: freshness, counting down, negative answers, serve-stale,
//! refresh before expiry, its bound, and each client's share of it.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{
        Name, RData, Record, RecordType,
        rdata::{A, SOA},
    },
};

use super::*;

fn request(name: &str, id: u16) -> Vec<u8> {
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    message.to_vec().unwrap()
}

fn reply(name: &str, ttl: u32, rcode: ResponseCode) -> Vec<u8> {
    let owner = Name::from_ascii(name).unwrap();
    let mut message = Message::new(77, MessageType::Response, OpCode::Query);
    message.add_query(Query::query(owner.clone(), RecordType::A));
    message.metadata.response_code = rcode;
    if rcode == ResponseCode::NoError {
        message.add_answer(Record::from_rdata(owner, ttl, RData::A(A(Ipv4Addr::new(192, 0, 2, 1)))));
    } else {
        let zone = Name::from_ascii("example.").unwrap();
        let soa = SOA::new(zone.clone(), zone.clone(), 1, 2, 3, 4, ttl);
        message.add_authority(Record::from_rdata(zone, 3600, RData::SOA(soa)));
    }
    message.to_vec().unwrap()
}

fn key(name: &str) -> Key {
    Key::of(&request(name, 1), Asked::Plain).unwrap()
}

fn ttl_of(reply: &[u8]) -> u32 {
    let message = Message::from_vec(reply).unwrap();
    message.answers.first().or(message.authorities.first()).unwrap().ttl
}

fn fresh(found: Found) -> (Vec<u8>, bool) {
    match found {
        Found::Fresh { reply, refresh } => (reply, refresh),
        Found::Miss => panic!("a miss"),
    }
}

#[test]
fn an_answer_is_served_with_its_ttl_counted_down_until_it_expires() {
    let cache = RelayCache::new(CacheSettings::default(), Arc::default());
    let start = Instant::now();
    assert_eq!(cache.get(&key("a.example."), &request("a.example.", 5), start), Found::Miss);
    assert!(cache.put(key("a.example."), &reply("a.example.", 60, ResponseCode::NoError), start, None));
    let (served, _) = fresh(cache.get(&key("A.Example."), &request("A.Example.", 5), start + Duration::from_secs(20)));
    let message = Message::from_vec(&served).unwrap();
    assert_eq!((message.metadata.id, ttl_of(&served)), (5, 40));
    assert_eq!(message.queries[0].name().to_ascii(), "A.Example.", "the client's case");
    assert_eq!(cache.get(&key("a.example."), &request("a.example.", 5), start + Duration::from_secs(60)), Found::Miss);
}

#[test]
fn ttls_are_capped_and_negative_answers_kept_by_their_soa() {
    let settings = CacheSettings { max_ttl: 30, max_negative_ttl: 10, ..CacheSettings::default() };
    let cache = RelayCache::new(settings, Arc::default());
    let start = Instant::now();
    cache.put(key("long.example."), &reply("long.example.", 86_400, ResponseCode::NoError), start, None);
    let (served, _) = fresh(cache.get(&key("long.example."), &request("long.example.", 1), start));
    assert_eq!(ttl_of(&served), 30, "capped");
    assert!(cache.put(key("nx.example."), &reply("nx.example.", 300, ResponseCode::NXDomain), start, None));
    let at = start + Duration::from_secs(9);
    let (served, _) = fresh(cache.get(&key("nx.example."), &request("nx.example.", 1), at));
    assert_eq!(Message::from_vec(&served).unwrap().metadata.response_code, ResponseCode::NXDomain);
    assert_eq!(
        cache.get(&key("nx.example."), &request("nx.example.", 1), start + Duration::from_secs(10)),
        Found::Miss
    );
    assert!(!cache.put(key("fail.example."), &reply("fail.example.", 300, ResponseCode::ServFail), start, None));
}

#[test]
fn an_expired_answer_is_served_stale_only_within_the_window() {
    let settings = CacheSettings { stale_for: Duration::from_secs(100), ..CacheSettings::default() };
    let cache = RelayCache::new(settings, Arc::default());
    let start = Instant::now();
    cache.put(key("a.example."), &reply("a.example.", 10, ResponseCode::NoError), start, None);
    let stale = cache.stale(&key("a.example."), &request("a.example.", 3), start + Duration::from_secs(50)).unwrap();
    assert_eq!((Message::from_vec(&stale).unwrap().metadata.id, ttl_of(&stale)), (3, 30), "RFC 8767's 30 s");
    assert_eq!(cache.stale(&key("a.example."), &request("a.example.", 3), start + Duration::from_secs(111)), None);
}

#[test]
fn a_popular_answer_is_refreshed_once_in_its_last_tenth() {
    let cache = RelayCache::new(CacheSettings::default(), Arc::default());
    let start = Instant::now();
    cache.put(key("a.example."), &reply("a.example.", 100, ResponseCode::NoError), start, None);
    let ask =
        |secs| fresh(cache.get(&key("a.example."), &request("a.example.", 1), start + Duration::from_secs(secs))).1;
    assert!(!ask(10), "early");
    assert!(!ask(50));
    assert!(ask(91), "popular and in its last tenth");
    assert!(!ask(92), "one refresh at a time");
    cache.end_refresh(&key("a.example."));
    assert!(ask(93), "a failed refresh may be tried again");
    cache.put(
        key("a.example."),
        &reply("a.example.", 100, ResponseCode::NoError),
        start + Duration::from_secs(94),
        None,
    );
    assert!(!ask(95), "the refreshed entry is fresh again");
}

#[test]
fn a_short_ttl_is_refreshed_in_its_last_tenth_too() {
    let cache = RelayCache::new(CacheSettings::default(), Arc::default());
    let start = Instant::now();
    // What CoreDNS's own cache hands back of an answer near its end: a TTL of 3 s.
    cache.put(key("a.example."), &reply("a.example.", 3, ResponseCode::NoError), start, None);
    let ask = |ms| fresh(cache.get(&key("a.example."), &request("a.example.", 1), start + Duration::from_millis(ms)));
    assert!(!ask(100).1);
    assert!(!ask(2_600).1, "popular, not yet in its last 300 ms");
    let (served, refresh) = ask(2_750);
    assert!(refresh, "in its last tenth");
    assert_eq!(ttl_of(&served), 1, "counted down by whole seconds");
}

#[test]
fn a_popular_answer_just_expired_is_served_with_ttl_0_while_fetched_again() {
    let metrics = Arc::new(CacheMetrics::default());
    let cache = RelayCache::new(CacheSettings::default(), Arc::clone(&metrics));
    let start = Instant::now();
    let at = |ms| start + Duration::from_millis(ms);
    let get = |name: &str, ms| cache.get(&key(name), &request(name, 1), at(ms));
    cache.put(key("popular.example."), &reply("popular.example.", 2, ResponseCode::NoError), start, None);
    cache.put(key("once.example."), &reply("once.example.", 2, ResponseCode::NoError), start, None);
    fresh(get("popular.example.", 100));
    fresh(get("popular.example.", 200));
    fresh(get("once.example.", 100));
    let (served, refresh) = fresh(get("popular.example.", 2_100));
    assert_eq!((ttl_of(&served), refresh), (0, true), "expired, served for no one to keep, fetched again");
    let (_, refresh) = fresh(get("popular.example.", 2_500));
    assert!(!refresh, "one fetch at a time");
    assert_eq!(get("popular.example.", 3_000), Found::Miss, "a second past expiry: the upstream's to answer");
    assert_eq!(get("once.example.", 2_100), Found::Miss, "asked once: not popular, not served expired");
    assert_eq!(metrics.expired_served.get(), 2);
    // The refresh lands (what CoreDNS's cache had left: 1 s): fresh again.
    cache.put(key("popular.example."), &reply("popular.example.", 1, ResponseCode::NoError), at(2_600), None);
    assert_eq!(ttl_of(&fresh(get("popular.example.", 2_700)).0), 1);
}

#[test]
fn the_cache_stays_within_its_bytes_and_keeps_what_is_used() {
    let settings = CacheSettings { max_bytes: SHARDS * 2048, ..CacheSettings::default() };
    let cache = RelayCache::new(settings, Arc::default());
    let start = Instant::now();
    let used = "used.example.";
    cache.put(key(used), &reply(used, 300, ResponseCode::NoError), start, None);
    for n in 0..20_000 {
        let name = format!("n{n}.example.");
        cache.put(key(&name), &reply(&name, 300, ResponseCode::NoError), start, None);
        if n % 8 == 0 {
            let _ = cache.get(&key(used), &request(used, 1), start);
        }
    }
    let total: usize = cache.shards.iter().map(|s| s.lock().unwrap().bytes).sum();
    assert!(total <= settings.max_bytes, "{total} bytes");
    assert!(cache.len() < 20_000 && !cache.is_empty());
    assert!(matches!(cache.get(&key(used), &request(used, 1), start), Found::Fresh { .. }), "a second chance");
}

/// A query for `name` of the type numbered `qtype`, its CD bit as given.
fn typed_request(name: &str, qtype: u16, checking_disabled: bool) -> Vec<u8> {
    let mut message = Message::new(1, MessageType::Query, OpCode::Query);
    message.metadata.checking_disabled = checking_disabled;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::from(qtype)));
    message.to_vec().unwrap()
}

#[test]
fn keys_fold_the_names_case_never_the_type_or_class() {
    // HTTPS is type 65 (0x0041) and TYPE97 0x0061: folding the type's bytes made them one entry,
    // so a pod asking TYPE97 decided what every pod got for HTTPS.
    let https = Key::of(&typed_request("a.example.", 65, false), Asked::Plain);
    let type97 = Key::of(&typed_request("a.example.", 97, false), Asked::Plain);
    assert!(https.is_some() && https != type97);
    assert_eq!(https, Key::of(&typed_request("A.Example.", 65, false), Asked::Plain), "names fold");
    // The class, likewise: CH (3) against a class whose low byte folds onto it would be one key.
    let mut class_a = typed_request("a.example.", 1, false);
    let mut class_b = class_a.clone();
    let at = class_a.len() - 1;
    (class_a[at], class_b[at]) = (0x43, 0x63);
    assert_ne!(Key::of(&class_a, Asked::Plain), Key::of(&class_b, Asked::Plain));
}

#[test]
fn keys_tell_checking_disabled_apart() {
    // An answer fetched with CD=1 is unvalidated: never the answer for a client asking with CD=0.
    let validated = Key::of(&typed_request("a.example.", 1, false), Asked::Dnssec);
    let unvalidated = Key::of(&typed_request("a.example.", 1, true), Asked::Dnssec);
    assert!(validated.is_some() && validated != unvalidated);
}

#[test]
fn a_reply_is_to_the_same_question_only_with_the_same_type_and_class() {
    let question = |request: &[u8]| request[12..].to_vec();
    let https = question(&typed_request("a.example.", 65, false));
    assert!(wire::same_question(&https, &question(&typed_request("A.EXAMPLE.", 65, false))));
    assert!(!wire::same_question(&https, &question(&typed_request("a.example.", 97, false))));
    assert!(!wire::same_question(&https, &question(&typed_request("b.example.", 65, false))));
    assert!(!wire::same_question(&https[..3], &https[..3]), "too short to be a question");
}

#[test]
fn keys_are_one_question_and_tell_edns_and_dnssec_apart() {
    assert_eq!(Key::of(&request("a.example.", 1), Asked::Plain), Key::of(&request("A.EXAMPLE.", 9), Asked::Plain));
    let asked = [Asked::Plain, Asked::Edns, Asked::Dnssec].map(|asked| Key::of(&request("a.example.", 1), asked));
    assert!(asked[0] != asked[1] && asked[1] != asked[2] && asked[0] != asked[2], "no OPT to a query without one");
    assert_eq!(Key::of(&reply("a.example.", 5, ResponseCode::NoError), Asked::Plain), None, "a response");
    assert_eq!(Key::of(&[0; 11], Asked::Plain), None);
}

#[test]
fn one_client_keeps_at_most_its_share_and_evicts_no_more_of_the_others() {
    let settings = CacheSettings { max_bytes: SHARDS * 4096, ..CacheSettings::default() };
    let cache = RelayCache::new(settings, Arc::default());
    let start = Instant::now();
    let (pod, flooder): (IpAddr, IpAddr) = ([10, 244, 1, 5].into(), [10, 244, 1, 6].into());
    let popular: Vec<String> = (0..60).map(|n| format!("popular{n}.example.")).collect();
    for name in &popular {
        assert!(cache.put(key(name), &reply(name, 300, ResponseCode::NoError), start, Some(pod)));
    }
    let kept_before =
        popular.iter().filter(|n| matches!(cache.get(&key(n), &request(n, 1), start), Found::Fresh { .. })).count();
    // Asked again between the flood's names, as a node's pods keep asking popular names.
    for n in 0..20_000 {
        let name = format!("unique{n}.example.");
        cache.put(key(&name), &reply(&name, 300, ResponseCode::NoError), start, Some(flooder));
        assert!(cache.owned_by(flooder) <= settings.max_bytes / SOURCE_SHARE, "{n}: over its share");
    }
    assert!(cache.owned_by(flooder) > settings.max_bytes / SOURCE_SHARE / 2, "a client gets its share");
    let kept_after =
        popular.iter().filter(|n| matches!(cache.get(&key(n), &request(n, 1), start), Found::Fresh { .. })).count();
    // The flood's share is 1/8 of the cache: most of the popular answers stay.
    assert!(kept_after * 4 >= kept_before * 3, "{kept_after} of {kept_before} popular answers left");
    // A refresh (the responder's own lookup) stays charged to the entry's client.
    let before = cache.owned_by(pod);
    assert!(cache.put(key(&popular[0]), &reply(&popular[0], 300, ResponseCode::NoError), start, None));
    assert_eq!(cache.owned_by(pod), before, "replaced by an answer of the same size, charged to the same client");
    // What the others keep is charged to them, and a forgotten entry is uncharged.
    let total: usize = cache.shards.iter().map(|s| s.lock().unwrap().bytes).sum();
    assert_eq!(total, cache.owned_by(pod) + cache.owned_by(flooder), "every byte is charged to its client");
}

#[test]
fn a_client_over_its_share_keeps_what_it_asks_now_and_its_popular_answers() {
    // A share of some 1,700 answers, 50 in each shard.
    let settings = CacheSettings { max_bytes: SHARDS * 65_536, ..CacheSettings::default() };
    let metrics = Arc::new(CacheMetrics::default());
    let cache = RelayCache::new(settings, Arc::clone(&metrics));
    let start = Instant::now();
    let (pod, other): (IpAddr, IpAddr) = ([10, 244, 1, 5].into(), [10, 244, 1, 6].into());
    let kept = |name: &String, at| matches!(cache.get(&key(name), &request(name, 1), at), Found::Fresh { .. });
    let others: Vec<String> = (0..40).map(|n| format!("other{n}.example.")).collect();
    let popular: Vec<String> = (0..20).map(|n| format!("popular{n}.example.")).collect();
    for name in others.iter().map(|name| (name, other)).chain(popular.iter().map(|name| (name, pod))) {
        assert!(cache.put(key(name.0), &reply(name.0, 300, ResponseCode::NoError), start, Some(name.1)));
    }
    // The pod asks twice its share of names once each, and its popular names all along.
    for n in 0..3_500 {
        let name = format!("once{n}.example.");
        assert!(cache.put(key(&name), &reply(&name, 300, ResponseCode::NoError), start, Some(pod)), "{name}");
        assert!(cache.owned_by(pod) <= settings.max_bytes / SOURCE_SHARE, "{n}: over its share");
        if n % 50 == 0 {
            assert!(popular.iter().all(|name| kept(name, start)), "{n}: its popular answers stay");
        }
    }
    assert!(metrics.evictions.get() >= 1_500, "its own unused answers made the room");
    assert!(others.iter().all(|name| kept(name, start)), "none of the others' answers went");
    // Later, what it asked once expired: what it asks now takes its place.
    let later = start + Duration::from_secs(400);
    for n in 0..50 {
        let name = format!("now{n}.example.");
        assert!(cache.put(key(&name), &reply(&name, 300, ResponseCode::NoError), later, Some(pod)), "{name}");
        assert!(kept(&name, later));
    }
}
