//! Names relayed to the upstream: answered from the cache of relayed answers when it can
//! ([`crate::relayed`]); identical questions in flight answered by one upstream query; asked of
//! the upstreams in turn within [`UPSTREAM_TIMEOUT`] over the shared sockets ([`pool`]), and over
//! kept TCP connections ([`tcp`]) when the reply is truncated; an expired answer served when every
//! upstream fails. A query with no reply within the retry time ([`retry`]: RFC 6298's, from the
//! round trips of replies, doubling) is sent again when it looks lost (RACK's test: the upstream
//! silent, or answering queries sent after it), the earlier sends still awaited, as resolvers do:
//! a datagram an upstream dropped (its socket full under load) costs a retry time, not the whole
//! timeout and a SERVFAIL; one in a busy upstream's queue is not asked twice. The queries at the
//! upstreams at once are held to a congestion window ([`window`]) that shrinks when they lose
//! queries.

mod flights;
pub mod pool;
mod retry;
pub mod tcp;
mod window;

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::{Duration, Instant},
};

pub use flights::Joined;
use flights::{Flights, Role};
use hickory_proto::{
    op::{Message, Query, ResponseCode},
    rr::RecordType,
};
use pool::SocketPool;
use retry::{Loss, Retry};
use tcp::TcpPool;
use tokio::sync::{Semaphore, watch};
use window::Window;

use super::{
    DnsMetrics,
    answer::{self, encode},
    glance::Glance,
    relay,
    relay_cache::{Asked, CacheSettings, Found, Key, RelayCache, wire},
    view::DnsView,
};

/// How long an upstream has to answer before the client gets SERVFAIL (or a stale answer).
pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// Relayed queries in flight; beyond, a query waits for a slot ([`QUEUE_WAIT`]).
pub const MAX_FORWARDS: usize = 1024;
/// Relayed queries in flight granted to every source whatever the others do: more than any
/// resolver asks at once (glibc asks two).
pub const FORWARDS_PER_SOURCE: usize = 64;
/// Slots no source may borrow beyond its own share: what a pod flooding unique names (1,100 in
/// half a second, in the review) leaves to every other pod of the node. One busy client alone
/// may still use the rest — the DNS bench's mix (b), 50,000 unique names a second from dnsperf's
/// one address, keeps hundreds in flight.
pub const FORWARDS_RESERVED: usize = MAX_FORWARDS / 4;
/// Relayed queries of one source that may wait for a slot (its share, the others' reserve and
/// what it borrowed all taken): four times its share. Beyond, SERVFAIL at once
/// (`source_overloaded`).
pub const QUEUED_PER_SOURCE: usize = 4 * FORWARDS_PER_SOURCE;
/// Relayed queries of all sources waiting for a slot at most.
pub const MAX_QUEUED: usize = MAX_FORWARDS;
/// How long a relayed query waits for a slot at most before its SERVFAIL (`source_overloaded`):
/// half the upstreams' time, so that with it a queued query is answered within a stub resolver's
/// first timeout (glibc's 5 s).
pub const QUEUE_WAIT: Duration = Duration::from_secs(1);
/// Sends of a relayed query to one upstream at most (the first and two retries).
pub const SENDS_PER_UPSTREAM: u32 = 3;
/// The SERVFAIL response code.
const SERVFAIL: u8 = 2;

/// A reply shared by the queries that waited for it (`None`: the upstreams failed).
type Shared = Option<Arc<[u8]>>;

/// What the cache holds for a relayed query.
#[derive(Debug)]
pub enum Lookup {
    /// The reply, sized for the client.
    Answered(Vec<u8>),
    /// A reply larger than the client takes ([`Upstream::cut`] cuts it).
    Oversized(Vec<u8>),
    /// Nothing fresh: ask the upstreams, keeping the answer under this key (`None`: not kept).
    Missed(Option<Key>),
}

/// The relaying half of the responder.
pub struct Upstream {
    view: watch::Receiver<Arc<DnsView>>,
    metrics: Arc<DnsMetrics>,
    forwards: Semaphore,
    cache: RelayCache,
    /// Questions asked of the upstream now, and who else waits for each.
    flights: Flights,
    pools: [SocketPool; 2],
    tcp: TcpPool,
    retry: Retry,
    window: Window,
}

impl Upstream {
    /// The cache of relayed answers, for the responder's tests.
    #[cfg(test)]
    pub(crate) fn relay_cache(&self) -> &RelayCache {
        &self.cache
    }

    /// Relays to the upstreams `view` names, keeping answers as `cache` says.
    pub fn new(view: watch::Receiver<Arc<DnsView>>, metrics: Arc<DnsMetrics>, cache: CacheSettings) -> Self {
        let cache = RelayCache::new(cache, Arc::clone(&metrics.cache));
        let window = Window::new(metrics.upstream_window.clone());
        Self {
            view,
            metrics,
            forwards: Semaphore::new(MAX_FORWARDS),
            cache,
            flights: Flights::default(),
            pools: [
                SocketPool::for_family_of(SocketAddr::from(([0, 0, 0, 0], 0))),
                SocketPool::for_family_of(SocketAddr::from(([0u16; 8], 0))),
            ],
            tcp: TcpPool::default(),
            retry: Retry::default(),
            window,
        }
    }

    /// The reply to `request` (its bytes `raw`) of the client `source`, within `limit` bytes:
    /// from the cache, or the upstreams, or stale, or SERVFAIL.
    pub async fn forward(self: &Arc<Self>, request: &Message, raw: &[u8], limit: u16, source: IpAddr) -> Vec<u8> {
        match self.cached(request, raw, limit) {
            Lookup::Answered(reply) => reply,
            Lookup::Oversized(reply) => self.cut(request, reply, limit),
            Lookup::Missed(key) => self.ask_for(key, request, raw, limit, source).await,
        }
    }

    /// What the cache holds for `request` (its bytes `raw`) and a client taking `limit` bytes;
    /// a fresh answer is served on the spot, without a task (a popular answer about to expire
    /// is fetched again in the background).
    pub fn cached(self: &Arc<Self>, request: &Message, raw: &[u8], limit: u16) -> Lookup {
        self.lookup(raw, Asked::of(request), request.queries.first().map(Query::query_type), limit)
    }

    /// [`Upstream::cached`] for a query read from its wire form alone.
    pub fn cached_raw(self: &Arc<Self>, raw: &[u8], glance: Glance, limit: u16) -> Lookup {
        self.lookup(raw, glance.asked, Some(glance.qtype.into()), limit)
    }

    fn lookup(self: &Arc<Self>, raw: &[u8], asked: Asked, qtype: Option<RecordType>, limit: u16) -> Lookup {
        let key = Key::of(raw, asked).filter(|_| self.cache.enabled());
        match key.as_ref().and_then(|key| self.fresh(key, raw)) {
            Some(reply) if reply.len() <= usize::from(limit) => {
                self.metrics.query(qtype, "cached");
                Lookup::Answered(reply)
            }
            Some(reply) => Lookup::Oversized(reply),
            None => Lookup::Missed(key),
        }
    }

    /// `reply`, kept for `request` but larger than the client takes: the header and question,
    /// flagged truncated.
    pub fn cut(&self, request: &Message, reply: Vec<u8>, limit: u16) -> Vec<u8> {
        self.finish(request, Some(reply), limit, "cached")
    }

    /// The reply to `request` (its bytes `raw`) of the client `source` that the cache did not
    /// hold (under `key`, when it may keep one; charged to `source`), within `limit` bytes: from
    /// the upstreams, or stale, or SERVFAIL.
    pub async fn ask_for(
        self: &Arc<Self>,
        key: Option<Key>,
        request: &Message,
        raw: &[u8],
        limit: u16,
        source: IpAddr,
    ) -> Vec<u8> {
        let (reply, outcome) = self.missed(key, request, raw, Some(source)).await;
        self.finish(request, reply, limit, outcome)
    }

    /// The fresh answer kept for `key`, for the request `raw`.
    fn fresh(self: &Arc<Self>, key: &Key, raw: &[u8]) -> Option<Vec<u8>> {
        let Found::Fresh { reply, refresh } = self.cache.get(key, raw, Instant::now()) else { return None };
        if refresh {
            let (this, key, raw) = (Arc::clone(self), key.clone(), raw.to_vec());
            tokio::spawn(async move { this.refresh(key, &raw).await });
        }
        Some(reply)
    }

    /// The whole reply to `request` (its bytes `raw`, its id) asked for `source`, and how it was
    /// found.
    async fn resolve(
        self: &Arc<Self>,
        request: &Message,
        raw: &[u8],
        source: IpAddr,
    ) -> (Option<Vec<u8>>, &'static str) {
        let key = Key::of(raw, Asked::of(request)).filter(|_| self.cache.enabled());
        if let Some(reply) = key.as_ref().and_then(|key| self.fresh(key, raw)) {
            return (Some(reply), "cached");
        }
        self.missed(key, request, raw, Some(source)).await
    }

    /// [`Upstream::resolve`] past the cache; what is kept is charged to `owner`.
    async fn missed(
        &self,
        key: Option<Key>,
        request: &Message,
        raw: &[u8],
        owner: Option<IpAddr>,
    ) -> (Option<Vec<u8>>, &'static str) {
        let Some(key) = key else {
            let reply = self.ask(request, raw, owner).await;
            let outcome = if reply.is_some() { "forwarded" } else { "upstream_failed" };
            return (reply, outcome);
        };
        let shared = self.shared(&key, request, raw, owner).await;
        self.settle(&key, raw, shared.as_deref())
    }

    /// The reply to the request `raw` for `key` from the one its flight brought (`None`: the
    /// upstreams failed), and how it was found.
    fn settle(&self, key: &Key, raw: &[u8], shared: Option<&[u8]>) -> (Option<Vec<u8>>, &'static str) {
        let reply = shared.and_then(|reply| {
            let mut reply = reply.to_vec();
            let end = wire::question_end(raw)?;
            wire::address_to(&mut reply, end, raw).then_some(reply)
        });
        // The upstream failed — no answer, or SERVFAIL (its own upstream unreachable): an
        // expired answer beats a failure (RFC 8767).
        let failed = reply.as_deref().is_none_or(|reply| reply.get(3).is_some_and(|rcode| rcode & 0x0F == SERVFAIL));
        if failed && let Some(stale) = self.cache.stale(key, raw, Instant::now()) {
            return (Some(stale), "stale");
        }
        match reply {
            Some(reply) => (Some(reply), "forwarded"),
            None => (None, "upstream_failed"),
        }
    }

    /// The upstream's reply to the question `key`, asked once however many wait for it (and kept
    /// charged to `owner`, whose query leads).
    async fn shared(&self, key: &Key, request: &Message, raw: &[u8], owner: Option<IpAddr>) -> Shared {
        let flight = match self.flights.enter(key) {
            Role::Wait(receiver) => {
                return tokio::time::timeout(UPSTREAM_TIMEOUT, receiver).await.ok().and_then(Result::ok).flatten();
            }
            Role::Lead(flight) => flight,
        };
        // The query leading: ask, keep, and hand the reply to those waiting. The flight ends
        // (those waiting get nothing) if this future is dropped halfway.
        let reply: Shared = self.ask(request, raw, owner).await.map(Arc::from);
        if let Some(reply) = &reply {
            self.cache.put(key.clone(), reply, Instant::now(), owner);
        }
        flight.land(&reply);
        reply
    }

    /// Waits, without a relay slot, for the reply to the question `key` if it is asked of the
    /// upstreams now (and not too many wait so already): the query sends nothing.
    pub fn join(&self, key: &Key) -> Option<Joined> {
        self.flights.join(key)
    }

    /// The reply to `request` (its bytes `raw`), a query for `key` that `joined` its flight,
    /// within `limit` bytes: as [`Upstream::ask_for`] gives it.
    pub async fn joined(&self, joined: Joined, key: &Key, request: &Message, raw: &[u8], limit: u16) -> Vec<u8> {
        let shared = joined.reply(UPSTREAM_TIMEOUT).await;
        let (reply, outcome) = self.settle(key, raw, shared.as_deref());
        self.finish(request, reply, limit, outcome)
    }

    /// Asks again, in the background, a popular answer about to expire.
    async fn refresh(&self, key: Key, raw: &[u8]) {
        let Ok(request) = Message::from_vec(raw) else { return self.cache.end_refresh(&key) };
        match self.ask(&request, raw, None).await {
            Some(reply) => {
                self.cache.put(key, &reply, Instant::now(), None);
            }
            None => self.cache.end_refresh(&key),
        }
    }

    /// Counts and sizes a reply to `request`; SERVFAIL when there is none.
    fn finish(&self, request: &Message, reply: Option<Vec<u8>>, limit: u16, outcome: &'static str) -> Vec<u8> {
        self.metrics.query(request.queries.first().map(Query::query_type), outcome);
        let Some(reply) = reply else {
            return encode(&answer::error(request, ResponseCode::ServFail), limit);
        };
        if reply.len() <= usize::from(limit) {
            return reply;
        }
        // Too large for the client: the header and question, flagged truncated.
        relay::incoming(request, request.metadata.id, &reply, limit)
            .unwrap_or_else(|_| encode(&answer::error(request, ResponseCode::ServFail), limit))
    }

    /// `response`, an ExternalName Service's CNAME to `target`, with the upstream's records of
    /// `target` added (none when it does not answer in time: the CNAME alone, as CoreDNS sends).
    pub async fn chase(
        self: &Arc<Self>,
        request: &Message,
        mut response: Message,
        target: hickory_proto::rr::Name,
        limit: u16,
        source: IpAddr,
    ) -> Vec<u8> {
        let qtype = request.queries.first().map(Query::query_type);
        if let Some(asked) = qtype {
            let mut lookup =
                Message::new(rand::random(), hickory_proto::op::MessageType::Query, hickory_proto::op::OpCode::Query);
            lookup.metadata.recursion_desired = true;
            lookup.add_query(Query::query(target, asked));
            let mut edns = hickory_proto::op::Edns::new();
            edns.set_max_payload(relay::MAX_UDP_REPLY);
            lookup.set_edns(edns);
            if let Ok(raw) = lookup.to_vec()
                && let (Some(reply), _) = self.resolve(&lookup, &raw, source).await
                && let Ok(reply) = Message::from_vec(&reply)
            {
                response.add_answers(reply.answers);
            }
        }
        self.metrics.query(qtype, "answer");
        encode(&response, limit)
    }

    /// Asks the upstreams `request` (its bytes `raw`), in turn within [`UPSTREAM_TIMEOUT`]: the
    /// first reply that answers it (its id the pool's), whole (over TCP when the UDP reply was
    /// truncated), for `source` (`None`: the responder's own refresh).
    async fn ask(&self, request: &Message, raw: &[u8], source: Option<IpAddr>) -> Option<Vec<u8>> {
        let Ok(_permit) = self.forwards.try_acquire() else {
            self.metrics.query(request.queries.first().map(Query::query_type), "overloaded");
            return None;
        };
        let upstreams = self.view.borrow().upstreams.clone();
        let started = Instant::now();
        let deadline = started + UPSTREAM_TIMEOUT;
        let first = if upstreams.is_empty() { 0 } else { rand::random::<u32>() as usize % upstreams.len() };
        for i in 0..upstreams.len() {
            let upstream = upstreams[(first + i) % upstreams.len()];
            let left = deadline.saturating_duration_since(Instant::now());
            // Each upstream gets its share of what is left, the last one all of it.
            let budget = left / u32::try_from(upstreams.len() - i).unwrap_or(1);
            if let Ok(Some(reply)) = tokio::time::timeout(budget, self.sends(upstream, request, raw, source)).await {
                self.metrics.upstream_seconds.observe(started.elapsed().as_secs_f64());
                return Some(reply);
            }
        }
        None
    }

    /// `request` (its bytes `raw`) of `source` asked of `upstream` once the window gives it a slot,
    /// sent again after each retry time without a reply when it looks lost, up to
    /// [`SENDS_PER_UPSTREAM`] sends; the first reply to any of them.
    async fn sends(
        &self,
        upstream: SocketAddr,
        request: &Message,
        raw: &[u8],
        source: Option<IpAddr>,
    ) -> Option<Vec<u8>> {
        use futures::StreamExt as _;
        // No slot within the upstreams' time, or every queue full: this upstream fails.
        let _slot = self.window.slot(source).await?;
        let started = Instant::now();
        let mut last_sent = started;
        let mut wait = self.retry.after();
        let mut sent = futures::stream::FuturesUnordered::new();
        sent.push(self.exchange(upstream, request, raw));
        let mut sends = 1;
        let timer = tokio::time::sleep(wait);
        tokio::pin!(timer);
        loop {
            tokio::select! {
                done = sent.next() => match done {
                    Some(Ok(reply)) => {
                        let round_trip = self.retry.answered(upstream, started, Instant::now());
                        self.metrics.upstream_round_trip.set(round_trip.as_secs_f64());
                        self.window.answered();
                        return Some(reply);
                    }
                    // A send that failed outright (no route, the socket closed): the others may
                    // still be answered.
                    Some(Err(_)) if !sent.is_empty() => {}
                    _ => return None,
                },
                () = &mut timer, if sends < SENDS_PER_UPSTREAM => {
                    let now = Instant::now();
                    // In the upstream's queue: waits another retry time, adding nothing to it.
                    if let Some(loss) = self.retry.lost(upstream, last_sent, wait, now) {
                        // Skipped while later queries were answered: the upstream's socket was
                        // full. Silence says nothing of it (a slow upstream, or a dead one).
                        if loss == Loss::Skipped {
                            self.window.lost(now, self.retry.round_trip());
                        }
                        self.metrics.upstream_retries.inc();
                        sent.push(self.exchange(upstream, request, raw));
                        sends += 1;
                        last_sent = now;
                        wait *= 2;
                    }
                    timer.as_mut().reset(tokio::time::Instant::from_std(now) + wait);
                }
            }
        }
    }

    /// One send of `request` (its bytes `raw`) to `upstream` and its reply, whole (over TCP when
    /// the UDP reply was truncated), under the client's id.
    async fn exchange(&self, upstream: SocketAddr, request: &Message, raw: &[u8]) -> std::io::Result<Vec<u8>> {
        let pool = &self.pools[usize::from(upstream.is_ipv6())];
        // The pool takes a datagram only as the reply to this very question: give it the
        // client's id back.
        let (mut reply, _) = pool.exchange(upstream, raw).await?;
        reply[..2].copy_from_slice(&request.metadata.id.to_be_bytes());
        if reply[2] & 0x02 != 0 {
            // Truncated: the whole answer over TCP.
            let id = rand::random();
            let reply = self.tcp.exchange(upstream, &relay::outgoing(raw, id)).await?;
            return relay::incoming(request, id, &reply, u16::MAX)
                .map_err(|why| std::io::Error::other(format!("not the reply to the relayed query: {why:?}")));
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests;
