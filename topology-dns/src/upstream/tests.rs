//! Relaying against an upstream in the test process: one upstream query for many identical
//! questions, answers from the cache, an expired answer served when the upstream fails, spoofed
//! datagrams ignored, a truncated reply fetched whole over TCP, on a kept connection.

use std::{
    net::{Ipv4Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{Name, RData, Record, RecordType, rdata::A},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, UdpSocket},
    sync::watch,
};

use super::*;

/// A stand-in upstream on loopback: answers every A query with `answers` records (TTL 60) after
/// `delay`, first sending spoofed datagrams (the right id, another question; the right id and
/// question bytes under a count of no questions) when `spoof`;
/// over UDP truncated (TC, no records) when `answers` is over 40; silent while `silent` is set.
struct StandIn {
    addr: SocketAddr,
    asked: Arc<AtomicUsize>,
    silent: Arc<AtomicBool>,
    servfail: Arc<AtomicBool>,
    /// TCP connections accepted.
    accepted: Arc<AtomicUsize>,
    /// Close each TCP connection after one answer.
    tcp_once: Arc<AtomicBool>,
}

fn answer(request: &Message, answers: usize) -> Message {
    let mut reply = Message::new(request.metadata.id, MessageType::Response, OpCode::Query);
    reply.add_queries(request.queries.iter().cloned());
    let name = request.queries[0].name().clone();
    for n in 0..answers {
        reply.add_answer(Record::from_rdata(name.clone(), 60, RData::A(A(Ipv4Addr::from(0x0a00_0000 + n as u32)))));
    }
    reply
}

async fn stand_in(answers: usize, delay: Duration, spoof: bool) -> StandIn {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let tcp = TcpListener::bind(addr).await.unwrap();
    let (asked, silent) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let servfail = Arc::new(AtomicBool::new(false));
    let (count, quiet, failing) = (Arc::clone(&asked), Arc::clone(&silent), Arc::clone(&servfail));
    tokio::spawn(async move {
        let socket = Arc::new(socket);
        let mut buffer = vec![0u8; 4096];
        loop {
            let (len, from) = socket.recv_from(&mut buffer).await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            if quiet.load(Ordering::SeqCst) {
                continue;
            }
            let request = Message::from_vec(&buffer[..len]).unwrap();
            let socket = Arc::clone(&socket);
            let failing = failing.load(Ordering::SeqCst);
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if spoof {
                    let mut other = request.clone();
                    other.queries[0] = Query::query(Name::from_ascii("evil.example.").unwrap(), RecordType::A);
                    socket.send_to(&answer(&other, 1).to_vec().unwrap(), from).await.unwrap();
                    // The right id and question bytes, but not one question: not a reply.
                    let mut headless = answer(&request, 1).to_vec().unwrap();
                    headless[4..6].copy_from_slice(&[0, 0]);
                    socket.send_to(&headless, from).await.unwrap();
                }
                let mut reply = answer(&request, if failing { 0 } else { answers });
                if failing {
                    reply.metadata.response_code = ResponseCode::ServFail;
                }
                if answers > 40 {
                    reply.answers.clear();
                    reply.metadata.truncation = true;
                }
                socket.send_to(&reply.to_vec().unwrap(), from).await.unwrap();
            });
        }
    });
    let (accepted, tcp_once) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicBool::new(false)));
    let (accepts, once) = (Arc::clone(&accepted), Arc::clone(&tcp_once));
    tokio::spawn(async move {
        loop {
            let (mut stream, _) = tcp.accept().await.unwrap();
            accepts.fetch_add(1, Ordering::SeqCst);
            let once = Arc::clone(&once);
            tokio::spawn(async move {
                // Queries one after another on the connection, until the client closes it.
                while let Ok(len) = stream.read_u16().await {
                    let mut query = vec![0u8; usize::from(len)];
                    stream.read_exact(&mut query).await.unwrap();
                    let reply = answer(&Message::from_vec(&query).unwrap(), answers).to_vec().unwrap();
                    stream.write_all(&u16::try_from(reply.len()).unwrap().to_be_bytes()).await.unwrap();
                    stream.write_all(&reply).await.unwrap();
                    if once.load(Ordering::SeqCst) {
                        break;
                    }
                }
            });
        }
    });
    StandIn { addr, asked, silent, servfail, accepted, tcp_once }
}

fn relay_to(upstream: SocketAddr, cache: CacheSettings) -> Arc<Upstream> {
    let (_sender, view) = watch::channel(Arc::new(DnsView::new(vec![upstream])));
    Arc::new(Upstream::new(view, Arc::new(DnsMetrics::default()), cache))
}

fn query(name: &str, id: u16) -> (Message, Vec<u8>) {
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.metadata.recursion_desired = true;
    message.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let raw = message.to_vec().unwrap();
    (message, raw)
}

async fn ask(upstream: &Arc<Upstream>, name: &str, id: u16) -> Message {
    let (request, raw) = query(name, id);
    Message::from_vec(&upstream.forward(&request, &raw, u16::MAX, [127, 0, 0, 1].into()).await).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identical_questions_in_flight_are_one_upstream_query_then_cached() {
    let stand_in = stand_in(1, Duration::from_millis(200), false).await;
    let relay = relay_to(stand_in.addr, CacheSettings::default());
    let asks = (0..50u16).map(|id| {
        let relay = Arc::clone(&relay);
        tokio::spawn(async move { ask(&relay, "popular.example.", id).await })
    });
    for (id, reply) in futures_join(asks).await.into_iter().enumerate() {
        assert_eq!((reply.metadata.id, reply.answers.len()), (id as u16, 1), "{reply:?}");
    }
    assert_eq!(stand_in.asked.load(Ordering::SeqCst), 1, "one upstream query for fifty questions");
    let round_trip = relay.metrics.upstream_round_trip.get();
    assert!((0.2..0.5).contains(&round_trip), "the upstream's 200 ms, exported: {round_trip}");
    let cached = ask(&relay, "Popular.Example.", 99).await;
    assert_eq!((cached.metadata.id, cached.answers.len()), (99, 1));
    assert_eq!(cached.queries[0].name().to_ascii(), "Popular.Example.");
    assert_eq!(stand_in.asked.load(Ordering::SeqCst), 1, "answered from the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_answer_is_served_stale_when_the_upstream_fails() {
    let stand_in = stand_in(1, Duration::ZERO, false).await;
    let relay = relay_to(stand_in.addr, CacheSettings { max_ttl: 1, ..CacheSettings::default() });
    assert_eq!(ask(&relay, "a.example.", 1).await.answers[0].ttl, 60);
    tokio::time::sleep(Duration::from_millis(1100)).await;
    stand_in.silent.store(true, Ordering::SeqCst);
    let stale = ask(&relay, "a.example.", 2).await;
    assert_eq!((stale.metadata.response_code, stale.answers.len()), (ResponseCode::NoError, 1));
    assert_eq!(stale.answers[0].ttl, 30, "RFC 8767");
    let never = ask(&relay, "never.example.", 3).await;
    assert_eq!(never.metadata.response_code, ResponseCode::ServFail, "nothing to serve stale");
    // An upstream answering SERVFAIL (its own upstream gone) has failed too.
    stand_in.silent.store(false, Ordering::SeqCst);
    stand_in.servfail.store(true, Ordering::SeqCst);
    let stale = ask(&relay, "a.example.", 4).await;
    assert_eq!((stale.metadata.response_code, stale.answers.len()), (ResponseCode::NoError, 1), "{stale:?}");
    assert_eq!(stale.answers[0].ttl, 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_in_flight_is_joined_without_a_slot_within_bounds() {
    // Answers 200 ms late: before the first retry.
    let stand_in = stand_in(1, Duration::from_millis(200), false).await;
    let relay = relay_to(stand_in.addr, CacheSettings::default());
    let (request, raw) = query("joined.example.", 1);
    let key = Key::of(&raw, Asked::Plain).unwrap();
    assert!(relay.join(&key).is_none(), "nothing in flight to join");
    let leader = {
        let relay = Arc::clone(&relay);
        tokio::spawn(async move { ask(&relay, "joined.example.", 2).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let joined: Vec<_> = std::iter::from_fn(|| relay.join(&key)).take(1_000).collect();
    assert_eq!(joined.len(), flights::JOINED_PER_QUESTION, "at most so many wait so for one question");
    let replies = joined.into_iter().map(|joined| relay.joined(joined, &key, &request, &raw, u16::MAX));
    for reply in futures::future::join_all(replies).await {
        let reply = Message::from_vec(&reply).unwrap();
        assert_eq!((reply.metadata.id, reply.answers.len()), (1, 1), "the leader's reply, under the joiner's id");
    }
    assert_eq!(leader.await.unwrap().answers.len(), 1);
    assert_eq!(stand_in.asked.load(Ordering::SeqCst), 1, "asked once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_popular_answer_just_expired_is_served_while_fetched_again() {
    // Every answer 200 ms late, kept 1 s.
    let stand_in = stand_in(1, Duration::from_millis(200), false).await;
    let relay = relay_to(stand_in.addr, CacheSettings { max_ttl: 1, ..CacheSettings::default() });
    for id in 1..=3 {
        ask(&relay, "popular.example.", id).await;
    }
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let asked = stand_in.asked.load(Ordering::SeqCst);
    let expired = ask(&relay, "popular.example.", 4).await;
    assert_eq!((expired.answers.len(), expired.answers[0].ttl), (1, 0), "the expired answer, for no one to keep");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(stand_in.asked.load(Ordering::SeqCst), asked + 1, "fetched again once, in the background");
    let refreshed = ask(&relay, "popular.example.", 5).await;
    assert_eq!(refreshed.answers[0].ttl, 1, "the fetched answer");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_query_the_upstream_dropped_is_sent_again_and_answered() {
    let stand_in = stand_in(1, Duration::ZERO, false).await;
    let relay = relay_to(stand_in.addr, CacheSettings::default());
    // The upstream drops the first send (its socket full), then answers.
    let answer = ask_dropping_its_first_send(&relay, &stand_in, "dropped.example.").await.await.unwrap();
    assert_eq!((answer.metadata.response_code, answer.answers.len()), (ResponseCode::NoError, 1), "{answer:?}");
    assert_eq!(stand_in.asked.load(Ordering::SeqCst), 2, "sent twice");
    assert_eq!(relay.metrics.upstream_retries.get(), 1);
    // A silent upstream is sent the query again within the timeout, never more than the sends
    // allowed, then the client gets SERVFAIL (nothing to serve stale).
    stand_in.silent.store(true, Ordering::SeqCst);
    let never = ask(&relay, "silent.example.", 2).await;
    assert_eq!(never.metadata.response_code, ResponseCode::ServFail);
    let sends = stand_in.asked.load(Ordering::SeqCst) - 2;
    assert!((2..=SENDS_PER_UPSTREAM as usize).contains(&sends), "{sends} sends");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_skipped_query_shrinks_the_window_not_a_slow_upstream() {
    // A slow upstream: every query answered after 600 ms, past the first retry time (250 ms).
    let slow = stand_in(1, Duration::from_millis(600), false).await;
    let relay = relay_to(slow.addr, CacheSettings::default());
    let asks = (0..20u16).map(|id| {
        let relay = Arc::clone(&relay);
        tokio::spawn(async move { ask(&relay, &format!("slow{id}.example."), id).await })
    });
    assert!(futures_join(asks).await.iter().all(|reply| reply.answers.len() == 1));
    assert_eq!(relay.window.size(), MAX_FORWARDS as f64, "silence is not a full socket");

    // An upstream that drops one query and answers one sent after it: the first was skipped.
    let dropping = stand_in(1, Duration::ZERO, false).await;
    let relay = relay_to(dropping.addr, CacheSettings::default());
    let skipped = ask_dropping_its_first_send(&relay, &dropping, "skipped.example.").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(ask(&relay, "later.example.", 2).await.answers.len(), 1);
    let skipped = skipped.await.unwrap();
    assert_eq!((skipped.metadata.response_code, skipped.answers.len()), (ResponseCode::NoError, 1), "{skipped:?}");
    assert_eq!(relay.metrics.upstream_retries.get(), 1);
    assert!(relay.window.size() < MAX_FORWARDS as f64, "a full socket: {}", relay.window.size());
    assert_eq!(relay.metrics.upstream_window.get(), relay.window.size() as i64, "exported");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flooding_pod_waits_for_the_shrunk_window_behind_itself_not_before_another() {
    // Every query answered after 50 ms; the window at its floor, 32 queries.
    let upstream = stand_in(1, Duration::from_millis(50), false).await;
    let relay = relay_to(upstream.addr, CacheSettings::default());
    let start = Instant::now();
    for n in 0..100 {
        relay.window.lost(start + Duration::from_secs(n), Duration::from_millis(1));
    }
    let done = Arc::new(Mutex::new(Vec::new()));
    let asks = |who: &'static str, source: [u8; 4], count: u16| {
        (0..count)
            .map(|n| {
                let (relay, done) = (Arc::clone(&relay), Arc::clone(&done));
                tokio::spawn(async move {
                    let (request, raw) = query(&format!("{who}{n}.example."), n);
                    let reply = relay.forward(&request, &raw, u16::MAX, source.into()).await;
                    done.lock().unwrap().push(who);
                    Message::from_vec(&reply).unwrap()
                })
            })
            .collect::<Vec<_>>()
    };
    let until = |queued: usize| {
        let relay = Arc::clone(&relay);
        async move {
            while relay.window.queued() < queued {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
    };
    // 128 unique names of the flood: 32 at the upstream, 96 waiting; then another pod's 8: its
    // first 4 at once, 4 waiting.
    let flood = asks("flood", [10, 0, 0, 1], 128);
    until(96).await;
    let pod = asks("pod", [10, 0, 0, 2], 8);
    until(100).await;
    let replies = futures_join(flood.into_iter().chain(pod)).await;
    assert!(replies.iter().all(|reply| reply.answers.len() == 1), "every query answered");
    let done = done.lock().unwrap();
    let pods_last = done.iter().rposition(|who| *who == "pod").unwrap();
    let flood_before = done[..pods_last].iter().filter(|who| **who == "flood").count();
    // The pod's waiting queries take the first slots to free that are theirs (of its share, or
    // in turn): it is done within the flood's second round trip (64 of the flood's answered).
    // First come, first served, they would wait for all 96 of the flood's.
    assert!(flood_before < 64, "the flood's {flood_before} answered before the pod's last: {done:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spoofed_datagram_is_ignored_and_a_truncated_reply_fetched_over_tcp() {
    let spoofing = stand_in(1, Duration::ZERO, true).await;
    let relay = relay_to(spoofing.addr, CacheSettings::default());
    let reply = ask(&relay, "a.example.", 7).await;
    assert_eq!(reply.queries[0].name().to_ascii(), "a.example.", "the reply to the question asked");
    assert_eq!(reply.answers.len(), 1);
    let large = stand_in(60, Duration::ZERO, false).await;
    let relay = relay_to(large.addr, CacheSettings::default());
    let reply = ask(&relay, "big.example.", 8).await;
    assert!(!reply.metadata.truncation);
    assert_eq!(reply.answers.len(), 60, "the whole answer, over TCP");
    let (request, raw) = query("big.example.", 9);
    let udp = relay.forward(&request, &raw, 512, [127, 0, 0, 1].into()).await;
    assert!(udp.len() <= 512);
    assert!(Message::from_vec(&udp).unwrap().metadata.truncation, "cut to the client's size, from the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_answers_reuse_a_kept_tcp_connection_and_survive_its_close() {
    let large = stand_in(60, Duration::ZERO, false).await;
    let relay = relay_to(large.addr, CacheSettings::default());
    for n in 0..5u16 {
        let reply = ask(&relay, &format!("big{n}.example."), n).await;
        assert_eq!((reply.metadata.id, reply.answers.len()), (n, 60), "{reply:?}");
    }
    assert_eq!(large.accepted.load(Ordering::SeqCst), 1, "five answers over one kept connection");
    // The upstream closes each connection after one answer: the kept one fails, a fresh one
    // answers, and no query fails.
    large.tcp_once.store(true, Ordering::SeqCst);
    for n in 5..8u16 {
        let reply = ask(&relay, &format!("big{n}.example."), n).await;
        assert_eq!((reply.metadata.id, reply.answers.len()), (n, 60), "{reply:?}");
    }
    // The kept one answers once more, then each answer needs a fresh connection: two more.
    assert_eq!(large.accepted.load(Ordering::SeqCst), 3);
}

/// Asks `name` in the background, `stand_in` dropping what it gets until the first send has
/// reached it; then it answers again.
async fn ask_dropping_its_first_send(
    relay: &Arc<Upstream>,
    stand_in: &StandIn,
    name: &'static str,
) -> tokio::task::JoinHandle<Message> {
    stand_in.silent.store(true, Ordering::SeqCst);
    let asking = tokio::spawn({
        let relay = Arc::clone(relay);
        async move { ask(&relay, name, 1).await }
    });
    while stand_in.asked.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    stand_in.silent.store(false, Ordering::SeqCst);
    asking
}

/// The tasks' results, every task spawned before any is awaited (`tasks` may be lazy).
async fn futures_join<T: Send + 'static>(tasks: impl Iterator<Item = tokio::task::JoinHandle<T>>) -> Vec<T> {
    let tasks: Vec<_> = tasks.collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}
