//! The sockets: DNS over UDP and TCP on one address, answering from the latest view, relaying
//! other names to the upstream byte for byte. Bounded everywhere: in-flight forwards, TCP
//! connections, and queries per source address.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use hickory_proto::{
    op::{Edns, Message, MessageType, OpCode, Query, ResponseCode},
    rr::{Name, RecordType},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream, UdpSocket},
    sync::{Semaphore, watch},
};
use tokio_util::sync::CancellationToken;

use super::{
    DnsMetrics,
    answer::{self, Outcome, Zone, encode},
    cache::{AnswerCache, Cached},
    limit::SourceLimiter,
    relay,
    view::DnsView,
};
use crate::{
    connections::{Limits, Pool},
    desired::Locality,
};

/// How long an upstream has to answer before the client gets SERVFAIL.
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// Forwarded queries in flight; beyond, SERVFAIL at once.
const MAX_FORWARDS: usize = 1024;
/// TCP connections open, in all and per client address; beyond, a new one replaces the oldest idle
/// connection of its bound, or is closed at once. One pod cannot hold them all.
const TCP_LIMITS: Limits = Limits { total: 256, per_source: 16 };
/// A TCP connection idle this long is closed.
const TCP_IDLE: Duration = Duration::from_secs(10);
/// A TCP connection is closed this long after it opened, busy or not (RFC 7766 lets a server
/// close one under pressure; a client that queries every few seconds keeps none forever).
const TCP_LIFETIME: Duration = Duration::from_secs(60);

/// The shared state of both sockets.
pub struct Responder {
    zone: Zone,
    view: watch::Receiver<Arc<DnsView>>,
    metrics: Arc<DnsMetrics>,
    forwards: Arc<Semaphore>,
    limiter: Mutex<SourceLimiter>,
    unlimited: bool,
}

/// What to do with one datagram or TCP message.
pub enum Handled {
    /// Send these bytes back; the query type and outcome, and the localities answered, for the
    /// metrics.
    Reply { bytes: Vec<u8>, qtype: Option<RecordType>, outcome: &'static str, localities: Vec<Locality> },
    /// Relay `raw` to the upstream.
    Forward { request: Message, raw: Vec<u8> },
    /// Complete an answer with the upstream's records.
    Chase(Box<Chase>),
    /// Not a query: no reply.
    Drop,
}

/// An answer to complete: `response` (a CNAME to `target`) to `request`.
pub struct Chase {
    /// The client's query.
    pub request: Message,
    /// The answer so far.
    pub response: Message,
    /// Whose records complete it.
    pub target: Name,
}

/// The whole packet path but the sockets: parse, answer, encode (over TCP when `tcp`, else
/// within the client's UDP size). Never panics on any input.
pub fn respond(view: &DnsView, zone: &Zone, bytes: &[u8], tcp: bool, draw: &mut dyn FnMut() -> f64) -> Handled {
    let request = match Message::from_vec(bytes) {
        Ok(request) => request,
        Err(_) => {
            return formerr(bytes).map_or(Handled::Drop, |bytes| Handled::Reply {
                bytes,
                qtype: None,
                outcome: "malformed",
                localities: Vec::new(),
            });
        }
    };
    if request.metadata.message_type != MessageType::Query {
        return Handled::Drop;
    }
    let limit = if tcp { u16::MAX } else { answer::udp_limit(&request) };
    let qtype = request.queries.first().map(Query::query_type);
    match answer::answer(view, zone, &request, draw) {
        Outcome::Answer(response, kind, localities) => {
            Handled::Reply { bytes: encode(&response, limit), qtype, outcome: kind.as_str(), localities }
        }
        Outcome::Forward => Handled::Forward { request, raw: bytes.to_vec() },
        Outcome::Chase(response, target) => Handled::Chase(Box::new(Chase { request, response, target })),
    }
}

impl Responder {
    /// A responder for `zone` reading `view`, limiting each source to `per_source_qps` (0: no limit).
    pub fn new(zone: Zone, view: watch::Receiver<Arc<DnsView>>, metrics: Arc<DnsMetrics>, per_source_qps: u32) -> Self {
        Self {
            zone,
            view,
            metrics,
            forwards: Arc::new(Semaphore::new(MAX_FORWARDS)),
            limiter: Mutex::new(SourceLimiter::new(per_source_qps)),
            unlimited: per_source_qps == 0,
        }
    }

    /// Answers `bytes`, counting the outcome; `cache`: answers this socket already built.
    fn handle(&self, bytes: &[u8], tcp: bool, mut cache: Option<&mut AnswerCache>) -> Handled {
        let view = Arc::clone(&self.view.borrow());
        if let Some(cache) = cache.as_deref_mut()
            && let Some((reply, hit)) = cache.get(&view, bytes)
        {
            self.count(hit.qtype, hit.outcome, &hit.localities);
            return Handled::Reply {
                bytes: reply,
                qtype: hit.qtype,
                outcome: hit.outcome,
                localities: hit.localities.to_vec(),
            };
        }
        let mut drawn = false;
        let mut draw = || {
            drawn = true;
            rand::random::<f64>()
        };
        let handled = respond(&view, &self.zone, bytes, tcp, &mut draw);
        if let Handled::Reply { bytes: reply, qtype, outcome, localities } = &handled {
            self.count(*qtype, outcome, localities);
            // An answer drawn by weight is drawn anew for every query.
            if let Some(cache) = cache
                && !drawn
            {
                let kept = Cached {
                    bytes: reply.as_slice().into(),
                    qtype: *qtype,
                    outcome,
                    localities: localities.as_slice().into(),
                };
                cache.put(bytes, kept);
            }
        }
        handled
    }

    fn count(&self, qtype: Option<RecordType>, outcome: &'static str, localities: &[Locality]) {
        self.metrics.query(qtype, outcome);
        for locality in localities {
            self.metrics.answered(*locality);
        }
    }

    /// Relays `raw` to the upstreams, in turn, within [`UPSTREAM_TIMEOUT`]; the reply (checked and
    /// sized by [`relay`]) or SERVFAIL.
    async fn forward(&self, request: &Message, raw: &[u8], tcp: bool) -> Vec<u8> {
        let limit = relay::limit(request, tcp);
        let qtype = request.queries.first().map(Query::query_type);
        let Ok(_permit) = self.forwards.try_acquire() else {
            self.metrics.query(qtype, "overloaded");
            return encode(&answer::error(request, ResponseCode::ServFail), limit);
        };
        match self.ask_upstreams(request, raw, tcp, limit).await {
            Some(reply) => {
                self.metrics.query(qtype, "forwarded");
                reply
            }
            None => {
                self.metrics.query(qtype, "upstream_failed");
                encode(&answer::error(request, ResponseCode::ServFail), limit)
            }
        }
    }

    /// `response`, an ExternalName Service's CNAME to `target`, with the upstream's records of
    /// `target` added (none when it does not answer in time: the CNAME alone, as CoreDNS sends).
    async fn chase(&self, Chase { request, mut response, target }: Chase, tcp: bool) -> Vec<u8> {
        let request = &request;
        let qtype = request.queries.first().map(Query::query_type);
        let limit = relay::limit(request, tcp);
        if let (Some(asked), Ok(_permit)) = (qtype, self.forwards.try_acquire()) {
            let mut lookup = Message::new(0, MessageType::Query, OpCode::Query);
            lookup.metadata.recursion_desired = true;
            lookup.add_query(Query::query(target, asked));
            let mut edns = Edns::new();
            edns.set_max_payload(relay::MAX_UDP_REPLY);
            lookup.set_edns(edns);
            if let Ok(raw) = lookup.to_vec()
                && let Some(reply) = self.ask_upstreams(&lookup, &raw, tcp, u16::MAX).await
                && let Ok(reply) = Message::from_vec(&reply)
            {
                response.add_answers(reply.answers);
            }
        }
        self.metrics.query(qtype, "answer");
        encode(&response, limit)
    }

    /// Asks the upstreams `request` (its bytes `raw`), each under an id of our own, in turn within
    /// [`UPSTREAM_TIMEOUT`]; the first reply, checked and within `limit`.
    async fn ask_upstreams(&self, request: &Message, raw: &[u8], tcp: bool, limit: u16) -> Option<Vec<u8>> {
        let upstreams = self.view.borrow().upstreams.clone();
        let started = Instant::now();
        let deadline = started + UPSTREAM_TIMEOUT;
        let first = if upstreams.is_empty() { 0 } else { rand::random::<u32>() as usize % upstreams.len() };
        for i in 0..upstreams.len() {
            let upstream = upstreams[(first + i) % upstreams.len()];
            let left = deadline.saturating_duration_since(Instant::now());
            // Each upstream gets its share of what is left, the last one all of it.
            let budget = left / u32::try_from(upstreams.len() - i).unwrap_or(1);
            // An id of our own for each attempt: a spoofer cannot take it from the client.
            let id: u16 = rand::random();
            let query = relay::outgoing(raw, id);
            let exchange = async {
                if tcp {
                    exchange_tcp(upstream, &query, request, id).await
                } else {
                    exchange_udp(upstream, &query, request, id, limit).await
                }
            };
            if let Ok(Ok(reply)) = tokio::time::timeout(budget, exchange).await {
                self.metrics.upstream_seconds.observe(started.elapsed().as_secs_f64());
                return Some(reply);
            }
        }
        None
    }

    fn admit(&self, source: IpAddr) -> bool {
        if self.unlimited {
            return true;
        }
        let admitted = self.limiter.lock().map(|mut l| l.admit(source, Instant::now())).unwrap_or(true);
        if !admitted {
            self.metrics.query(None, "rate_limited");
        }
        admitted
    }
}

/// FORMERR for a message whose header is readable and is a query; nothing otherwise.
fn formerr(bytes: &[u8]) -> Option<Vec<u8>> {
    if bytes.len() < 12 || bytes[2] & 0x80 != 0 {
        return None;
    }
    let mut reply = bytes[..12].to_vec();
    reply[2] = (reply[2] & 0x79) | 0x80; // QR=1, keep opcode and RD, clear AA and TC
    reply[3] = 0x01; // RCODE FORMERR
    reply[4..12].fill(0); // no sections
    Some(reply)
}

/// Relays `query` (the client's, under `id`) over a fresh socket, a new random source port per
/// query as resolvers do against spoofed answers; the first datagram that is the reply to it
/// ([`relay::incoming`]), within `limit` bytes.
async fn exchange_udp(
    upstream: SocketAddr,
    query: &[u8],
    request: &Message,
    id: u16,
    limit: u16,
) -> std::io::Result<Vec<u8>> {
    let local: SocketAddr = match upstream {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = UdpSocket::bind(local).await?;
    socket.connect(upstream).await?;
    socket.send(query).await?;
    let mut buffer = vec![0u8; 65_535];
    loop {
        let len = socket.recv(&mut buffer).await?;
        // Anything but the reply to this query is ignored.
        if let Ok(reply) = relay::incoming(request, id, &buffer[..len], limit) {
            return Ok(reply);
        }
    }
}

/// Relays `query` (under `id`) over a fresh TCP connection; the reply, checked.
async fn exchange_tcp(upstream: SocketAddr, query: &[u8], request: &Message, id: u16) -> std::io::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(upstream).await?;
    let len = u16::try_from(query.len()).map_err(|_| std::io::Error::other("query over 65535 bytes"))?;
    stream.write_all(&len.to_be_bytes()).await?;
    stream.write_all(query).await?;
    let reply = read_framed(&mut stream).await?;
    relay::incoming(request, id, &reply, u16::MAX)
        .map_err(|why| std::io::Error::other(format!("not the reply to the relayed query: {why:?}")))
}

async fn read_framed(stream: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let len = stream.read_u16().await?;
    let mut message = vec![0u8; usize::from(len)];
    stream.read_exact(&mut message).await?;
    Ok(message)
}

/// Serves UDP on `socket` until `shutdown`.
pub async fn serve_udp(socket: Arc<UdpSocket>, responder: Arc<Responder>, shutdown: CancellationToken) {
    let mut buffer = vec![0u8; 65_535];
    let mut cache = AnswerCache::default();
    loop {
        let (len, source) = tokio::select! {
            () = shutdown.cancelled() => return,
            received = socket.recv_from(&mut buffer) => match received {
                Ok(received) => received,
                Err(error) => {
                    tracing::debug!(%error, "DNS UDP receive");
                    continue;
                }
            },
        };
        if !responder.admit(source.ip()) {
            continue;
        }
        match responder.handle(&buffer[..len], false, Some(&mut cache)) {
            Handled::Reply { bytes, .. } => {
                let _ = socket.send_to(&bytes, source).await;
            }
            Handled::Forward { request, raw } => {
                let (socket, responder) = (Arc::clone(&socket), Arc::clone(&responder));
                tokio::spawn(async move {
                    let reply = responder.forward(&request, &raw, false).await;
                    let _ = socket.send_to(&reply, source).await;
                });
            }
            Handled::Chase(chase) => {
                let (socket, responder) = (Arc::clone(&socket), Arc::clone(&responder));
                tokio::spawn(async move {
                    let reply = responder.chase(*chase, false).await;
                    let _ = socket.send_to(&reply, source).await;
                });
            }
            Handled::Drop => {}
        }
    }
}

/// Serves TCP on `listener` until `shutdown`.
pub async fn serve_tcp(listener: TcpListener, responder: Arc<Responder>, shutdown: CancellationToken) {
    let connections = Arc::new(Pool::new(TCP_LIMITS));
    loop {
        let (stream, source) = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    tracing::debug!(%error, "DNS TCP accept");
                    continue;
                }
            },
        };
        if !connections.make_room(source.ip()) {
            responder.metrics.query(None, "overloaded");
            continue;
        }
        let busy = Arc::new(AtomicBool::new(false));
        let (responder, shutdown, working) = (Arc::clone(&responder), shutdown.clone(), Arc::clone(&busy));
        connections.spawn(source.ip(), busy, async move {
            tokio::select! {
                () = shutdown.cancelled() => {}
                _ = tokio::time::timeout(TCP_LIFETIME, connection(stream, source.ip(), &responder, &working)) => {}
            }
        });
    }
}

/// Answers the messages of one connection; `busy` is set while one is being answered.
async fn connection(mut stream: TcpStream, source: IpAddr, responder: &Responder, busy: &AtomicBool) {
    loop {
        let Ok(Ok(bytes)) = tokio::time::timeout(TCP_IDLE, read_framed(&mut stream)).await else { return };
        if !responder.admit(source) {
            return;
        }
        busy.store(true, Ordering::Relaxed);
        let reply = match responder.handle(&bytes, true, None) {
            Handled::Reply { bytes, .. } => bytes,
            Handled::Forward { request, raw } => responder.forward(&request, &raw, true).await,
            Handled::Chase(chase) => responder.chase(*chase, true).await,
            Handled::Drop => return,
        };
        let Ok(len) = u16::try_from(reply.len()) else { return };
        if stream.write_all(&len.to_be_bytes()).await.is_err() || stream.write_all(&reply).await.is_err() {
            return;
        }
        busy.store(false, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use hickory_proto::op::OpCode;

    use super::*;
    use crate::{cluster::yaml, parse_domain};

    fn responder() -> Responder {
        let state = yaml::parse(crate::fuzzing::CLUSTER, "dns.yaml").unwrap();
        let view = DnsView::of_node(&state, "a", Vec::new()).unwrap();
        let (_sender, receiver) = watch::channel(Arc::new(view));
        let zone = Zone { domain: parse_domain("cluster.local").unwrap(), ttl: 5 };
        Responder::new(zone, receiver, Arc::new(DnsMetrics::default()), 0)
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
}
