//! The sockets: DNS over UDP and TCP on one address, answering from the latest view, relaying
//! other names to the upstream byte for byte. Bounded everywhere: in-flight forwards, TCP
//! connections, and queries per source address.

use std::{
    net::IpAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};

use hickory_proto::{
    op::{Message, MessageType, Query},
    rr::{Name, RecordType},
};
use tokio::{net::UdpSocket, sync::watch};
use tokio_util::sync::CancellationToken;
use topology_policy::desired::Locality;

pub use super::upstream::UPSTREAM_TIMEOUT;
use super::{
    DnsMetrics,
    answer::{self, Outcome, Zone, encode},
    cache::{AnswerCache, Cached},
    clients::{Admission, Clients, refused},
    glance::{Domain, glance},
    in_flight::{Entry, InFlight, QueueBounds},
    limit::SourceLimiter,
    relay,
    relay_cache::{CacheSettings, Key},
    upstream::{self, Joined, Lookup, Upstream},
    view::DnsView,
};
/// The shared state of both sockets.
pub struct Responder {
    zone: Zone,
    domain: Domain,
    view: watch::Receiver<Arc<DnsView>>,
    metrics: Arc<DnsMetrics>,
    upstream: Arc<Upstream>,
    limiter: Mutex<SourceLimiter>,
    unlimited: bool,
    /// Relayed queries in flight, per source.
    relaying: Arc<InFlight>,
    /// Who is answered.
    admission: Admission,
    /// Said in the log that a Node without pod CIDRs opens the responder to all.
    said_open: AtomicBool,
}

/// Whether to answer a query from a source.
enum Admit {
    /// Answer it.
    Yes,
    /// Send this instead (REFUSED: not one of this node's clients).
    Refuse(Vec<u8>),
    /// Neither answer nor reply (over the source's rate).
    Drop,
}

/// What to do with one datagram or TCP message.
pub enum Handled {
    /// Send these bytes back; the query type and outcome, and the localities answered, for the
    /// metrics.
    Reply { bytes: Vec<u8>, qtype: Option<RecordType>, outcome: &'static str, localities: Vec<Locality> },
    /// Relay `raw` to the upstream (the cache of relayed answers not asked yet).
    Forward { request: Message, raw: Vec<u8> },
    /// Ask the upstreams: the cache of relayed answers holds nothing fresh (under `key`, where it
    /// keeps the answer).
    Missed { request: Message, raw: Vec<u8>, key: Option<Key> },
    /// Complete an answer with the upstream's records.
    Chase(Box<Chase>),
    /// Not a query: no reply.
    Drop,
}

/// A relayed query admitted ([`Responder::relay_entry`]).
enum Admitted {
    /// To be relayed once it has its slot.
    Slot(Entry, Handled),
    /// Waiting for its question's flight, without a slot.
    Joined(JoinedQuery),
}

/// A query waiting for the reply to the same question asked of the upstreams by another.
struct JoinedQuery {
    joined: Joined,
    request: Message,
    raw: Vec<u8>,
    key: Key,
}

impl Handled {
    /// The client's query, where it is relayed.
    pub fn relayed(&self) -> Option<&Message> {
        match self {
            Self::Forward { request, .. } | Self::Missed { request, .. } => Some(request),
            Self::Chase(chase) => Some(&chase.request),
            Self::Reply { .. } | Self::Drop => None,
        }
    }
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
    /// A responder for `zone` reading `view`, limiting each source to `per_source_qps` (0: no
    /// limit), keeping relayed answers as `cache` says, answering whom `admission` admits.
    pub fn new(
        zone: Zone,
        view: watch::Receiver<Arc<DnsView>>,
        metrics: Arc<DnsMetrics>,
        per_source_qps: u32,
        cache: CacheSettings,
        admission: Admission,
    ) -> Self {
        let upstream = Arc::new(Upstream::new(view.clone(), Arc::clone(&metrics), cache));
        Self {
            domain: Domain::of(&zone.domain),
            zone,
            view,
            metrics,
            upstream,
            limiter: Mutex::new(SourceLimiter::new(per_source_qps)),
            unlimited: per_source_qps == 0,
            relaying: InFlight::new(
                upstream::FORWARDS_PER_SOURCE,
                upstream::MAX_FORWARDS,
                upstream::FORWARDS_RESERVED,
                QueueBounds { per_source: upstream::QUEUED_PER_SOURCE, total: upstream::MAX_QUEUED },
            ),
            admission,
            said_open: AtomicBool::new(false),
        }
    }

    /// Answers `bytes`, counting the outcome; `cache`: answers this socket already built. A
    /// relayed name is answered from the cache of relayed answers when it holds one, read from
    /// the query's wire form when that suffices ([`glance`]).
    fn handle(&self, bytes: &[u8], tcp: bool, cache: Option<&mut AnswerCache>) -> Handled {
        if let Some(glance) = glance(bytes, &self.domain) {
            let limit = if tcp { u16::MAX } else { glance.udp_limit.min(relay::MAX_UDP_REPLY) };
            match self.upstream.cached_raw(bytes, glance, limit) {
                Lookup::Answered(reply) => return cached_reply(reply, Some(glance.qtype.into())),
                // Read beyond doubt, so it parses (the fuzz target `dns_packet` holds it to that).
                lookup => {
                    if let Ok(request) = Message::from_vec(bytes) {
                        return self.relayed(request, bytes.to_vec(), lookup, limit);
                    }
                }
            }
        }
        match self.answer(bytes, tcp, cache) {
            Handled::Forward { request, raw } => {
                let limit = relay::limit(&request, tcp);
                let lookup = self.upstream.cached(&request, &raw, limit);
                self.relayed(request, raw, lookup, limit)
            }
            handled => handled,
        }
    }

    /// What the cache of relayed answers said for `request` (its bytes `raw`), as a reply within
    /// `limit` bytes or a question for the upstreams.
    fn relayed(&self, request: Message, raw: Vec<u8>, lookup: Lookup, limit: u16) -> Handled {
        let qtype = request.queries.first().map(Query::query_type);
        match lookup {
            Lookup::Answered(reply) => cached_reply(reply, qtype),
            Lookup::Oversized(reply) => cached_reply(self.upstream.cut(&request, reply, limit), qtype),
            Lookup::Missed(key) => Handled::Missed { request, raw, key },
        }
    }

    /// [`respond`] from the latest view, counting the outcome; `cache`: answers this socket
    /// already built.
    fn answer(&self, bytes: &[u8], tcp: bool, mut cache: Option<&mut AnswerCache>) -> Handled {
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

    /// Relays `request` (its bytes `raw`); the reply sized for the client.
    async fn forward(&self, request: &Message, raw: &[u8], tcp: bool, source: IpAddr) -> Vec<u8> {
        self.upstream.forward(request, raw, relay::limit(request, tcp), source).await
    }

    /// Completes an ExternalName's answer with the upstream's records of its target.
    async fn chase(&self, Chase { request, response, target }: Chase, tcp: bool, source: IpAddr) -> Vec<u8> {
        self.upstream.chase(&request, response, target, relay::limit(&request, tcp), source).await
    }

    /// How the relayed query `handled` of `source` goes on: joining its question's flight when
    /// it is asked of the upstreams now (it sends nothing, and needs no slot), else with a slot
    /// now or a place in its source's queue; `Err` with the SERVFAIL it gets at once when that
    /// queue is full, or with nothing when `handled` is not relayed.
    fn relay_entry(&self, source: IpAddr, handled: Handled, tcp: bool) -> Result<Admitted, Option<Vec<u8>>> {
        let handled = match handled {
            Handled::Missed { request, raw, key: Some(key) } => match self.upstream.join(&key) {
                Some(joined) => return Ok(Admitted::Joined(JoinedQuery { joined, request, raw, key })),
                None => Handled::Missed { request, raw, key: Some(key) },
            },
            handled => handled,
        };
        let request = handled.relayed().ok_or(None)?;
        match self.relaying.enter(source) {
            Entry::Full => Err(Some(self.overloaded(request, tcp))),
            entry @ Entry::Queued(_) => {
                self.metrics.relay_queued.inc();
                Ok(Admitted::Slot(entry, handled))
            }
            entry @ Entry::Now(_) => Ok(Admitted::Slot(entry, handled)),
        }
    }

    /// Relays what was `admitted`: once it has its slot, the reply, or SERVFAIL when the query
    /// waited [`upstream::QUEUE_WAIT`] in vain; joined to a flight, its reply.
    async fn relay(&self, admitted: Admitted, tcp: bool, source: IpAddr) -> Vec<u8> {
        let (entry, handled) = match admitted {
            Admitted::Slot(entry, handled) => (entry, handled),
            Admitted::Joined(query) => {
                let JoinedQuery { joined, request, raw, key } = query;
                return self.upstream.joined(joined, &key, &request, &raw, relay::limit(&request, tcp)).await;
            }
        };
        let waited = matches!(entry, Entry::Queued(_));
        let Some(_slot) = entry.slot(upstream::QUEUE_WAIT).await else {
            return handled.relayed().map(|request| self.overloaded(request, tcp)).unwrap_or_default();
        };
        match handled {
            Handled::Forward { request, raw } => self.forward(&request, &raw, tcp, source).await,
            Handled::Missed { request, raw, key } => {
                let limit = relay::limit(&request, tcp);
                // While it waited, the answer may have come for another asker (a cold start: a
                // popular name's askers queue behind its first): served from the cache, not
                // asked again.
                match waited.then(|| self.upstream.cached(&request, &raw, limit)) {
                    Some(Lookup::Answered(reply)) => reply,
                    Some(Lookup::Oversized(reply)) => self.upstream.cut(&request, reply, limit),
                    Some(Lookup::Missed(_)) | None => self.upstream.ask_for(key, &request, &raw, limit, source).await,
                }
            }
            Handled::Chase(chase) => self.chase(*chase, tcp, source).await,
            Handled::Reply { bytes, .. } => bytes,
            Handled::Drop => Vec::new(),
        }
    }

    /// The SERVFAIL a relayed query gets when its source has too much in flight and waiting
    /// (counted as `source_overloaded`).
    fn overloaded(&self, request: &Message, tcp: bool) -> Vec<u8> {
        self.metrics.query(request.queries.first().map(Query::query_type), "source_overloaded");
        let limit = if tcp { u16::MAX } else { answer::udp_limit(request) };
        encode(&answer::error(request, hickory_proto::op::ResponseCode::ServFail), limit)
    }

    /// Whether the query `bytes` of `source` is answered: within the source's rate, and from one
    /// of the clients the responder serves (others get REFUSED, within their rate too).
    fn admit(&self, source: IpAddr, bytes: &[u8]) -> Admit {
        let allowed = match self.admission.clients {
            Clients::Any => true,
            Clients::Node => {
                let view = self.view.borrow();
                let node = view.node();
                if node.pod_cidrs.is_empty()
                    && !node.addresses.is_empty()
                    && !self.said_open.swap(true, Ordering::Relaxed)
                {
                    tracing::warn!(
                        "--dns-clients node: this node's Node lists no spec.podCIDRs (its network plugin assigns pod \
                         addresses another way), so pods cannot be told from others; answering every source"
                    );
                }
                self.admission.allows(&view, source)
            }
        };
        if !self.unlimited && !self.limiter.lock().map(|mut l| l.admit(source, Instant::now())).unwrap_or(true) {
            self.metrics.query(None, "rate_limited");
            return Admit::Drop;
        }
        if allowed {
            return Admit::Yes;
        }
        self.metrics.query(None, "refused_client");
        refused(bytes).map_or(Admit::Drop, Admit::Refuse)
    }
}

/// A reply from the cache of relayed answers (counted there).
fn cached_reply(bytes: Vec<u8>, qtype: Option<RecordType>) -> Handled {
    Handled::Reply { bytes, qtype, outcome: "cached", localities: Vec::new() }
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
        match responder.admit(source.ip(), &buffer[..len]) {
            Admit::Yes => {}
            Admit::Refuse(reply) => {
                let _ = socket.send_to(&reply, source).await;
                continue;
            }
            Admit::Drop => continue,
        }
        let handled = match responder.handle(&buffer[..len], false, Some(&mut cache)) {
            Handled::Reply { bytes, .. } => {
                let _ = socket.send_to(&bytes, source).await;
                continue;
            }
            Handled::Drop => continue,
            relayed => relayed,
        };
        // Taken here, so that the tasks are bounded by the slots, the queues and the flights.
        let admitted = match responder.relay_entry(source.ip(), handled, false) {
            Ok(admitted) => admitted,
            Err(Some(refusal)) => {
                let _ = socket.send_to(&refusal, source).await;
                continue;
            }
            Err(None) => continue,
        };
        let (socket, responder) = (Arc::clone(&socket), Arc::clone(&responder));
        tokio::spawn(async move {
            let reply = responder.relay(admitted, false, source.ip()).await;
            let _ = socket.send_to(&reply, source).await;
        });
    }
}

mod tcp;

pub use tcp::serve_tcp;

#[cfg(test)]
mod tests;
