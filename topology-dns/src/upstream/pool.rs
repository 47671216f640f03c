//! UDP sockets to the upstreams, shared by the queries in flight: a query goes out on one of a
//! few sockets under an id free on it, and a reader per socket hands each datagram to the query
//! it answers — the same source address, the same id, the same question — dropping the rest
//! (late, spoofed). A socket is replaced after some use and some time, so the source port keeps
//! changing (the kernel draws it at random): the port and the id together are the 32 bits a
//! spoofer must guess, as resolvers do since 2008.

use std::{
    collections::HashMap,
    net::{Ipv4Addr, Ipv6Addr, SocketAddr},
    sync::{
        Arc, Mutex, PoisonError, RwLock,
        atomic::{AtomicU32, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{net::UdpSocket, sync::oneshot};
use tokio_util::sync::CancellationToken;

use crate::relay_cache::wire;

/// Sockets per address family.
const SOCKETS: usize = 8;
/// A socket is replaced after this many queries...
const ROTATE_AFTER_USES: u32 = 2048;
/// ...or this long after it opened.
const ROTATE_AFTER: Duration = Duration::from_secs(30);
/// A replaced socket still reads replies this long (the queries it carries are answered or given
/// up by then).
const DRAIN: Duration = Duration::from_secs(3);

/// A query waiting for its reply.
struct Pending {
    upstream: SocketAddr,
    /// The question as asked.
    question: Box<[u8]>,
    reply: oneshot::Sender<Vec<u8>>,
}

/// One socket and the queries waiting on it.
struct Pooled {
    socket: UdpSocket,
    pending: Mutex<HashMap<u16, Pending, foldhash::fast::RandomState>>,
    uses: AtomicU32,
    opened: Instant,
    closing: CancellationToken,
}

impl Pooled {
    fn worn(&self) -> bool {
        self.uses.load(Ordering::Relaxed) >= ROTATE_AFTER_USES || self.opened.elapsed() >= ROTATE_AFTER
    }

    /// Hands each datagram to the query it answers until closed.
    async fn read(self: Arc<Self>) {
        let mut buffer = vec![0u8; 65_535];
        loop {
            let (len, from) = tokio::select! {
                () = self.closing.cancelled() => return,
                received = self.socket.recv_from(&mut buffer) => match received {
                    Ok(received) => received,
                    // ICMP errors and the like: the queries time out on their own.
                    Err(_) => continue,
                },
            };
            let datagram = &buffer[..len];
            // A response (QR) to one question: the only replies a relayed query gets.
            if len < 12 || datagram[2] & 0x80 == 0 || datagram[4..6] != [0, 1] {
                continue;
            }
            let id = u16::from_be_bytes([datagram[0], datagram[1]]);
            let mut pending = self.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let answers = pending.get(&id).is_some_and(|waiting| {
                waiting.upstream == from
                    && datagram
                        .get(12..12 + waiting.question.len())
                        .is_some_and(|question| wire::same_question(question, &waiting.question))
            });
            if answers && let Some(waiting) = pending.remove(&id) {
                // The query may have given up meanwhile.
                let _ = waiting.reply.send(datagram.to_vec());
            }
        }
    }
}

/// Removes a query's entry however it ends (answered, timed out, cancelled).
struct Registration<'a> {
    pooled: &'a Pooled,
    id: u16,
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        self.pooled.pending.lock().unwrap_or_else(PoisonError::into_inner).remove(&self.id);
    }
}

/// The sockets of one address family.
pub struct SocketPool {
    local: SocketAddr,
    slots: Vec<RwLock<Option<Arc<Pooled>>>>,
}

impl SocketPool {
    /// Sockets bound to the unspecified address of `upstream`'s family, opened on first use.
    pub fn for_family_of(upstream: SocketAddr) -> Self {
        let local = match upstream {
            SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
            SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
        };
        Self { local, slots: (0..SOCKETS).map(|_| RwLock::new(None)).collect() }
    }

    /// A socket of the pool, replacing a worn one (its reader drains, then stops).
    async fn socket(&self) -> std::io::Result<Arc<Pooled>> {
        let slot = &self.slots[rand::random::<u32>() as usize % self.slots.len()];
        if let Some(pooled) = slot.read().unwrap_or_else(PoisonError::into_inner).as_ref().filter(|p| !p.worn()) {
            return Ok(Arc::clone(pooled));
        }
        let fresh = Arc::new(Pooled {
            socket: UdpSocket::bind(self.local).await?,
            pending: Mutex::new(HashMap::default()),
            uses: AtomicU32::new(0),
            opened: Instant::now(),
            closing: CancellationToken::new(),
        });
        let mut slot = slot.write().unwrap_or_else(PoisonError::into_inner);
        // Another query may have replaced it meanwhile: use that one.
        if let Some(current) = slot.as_ref().filter(|p| !p.worn()) {
            return Ok(Arc::clone(current));
        }
        tokio::spawn(Arc::clone(&fresh).read());
        if let Some(old) = slot.replace(Arc::clone(&fresh)) {
            let closing = old.closing.clone();
            tokio::spawn(async move {
                tokio::time::sleep(DRAIN).await;
                closing.cancel();
            });
        }
        Ok(fresh)
    }

    /// Sends `query` (a DNS query of one question) to `upstream` under an id of the pool's and
    /// waits for its reply: a response from `upstream` to that id, of one question, the very
    /// question asked (names compared without case). The reply carries the pool's id.
    pub async fn exchange(&self, upstream: SocketAddr, query: &[u8]) -> std::io::Result<(Vec<u8>, u16)> {
        let question_end = wire::question_end(query).ok_or_else(|| std::io::Error::other("no question"))?;
        let question: Box<[u8]> = query[12..question_end].into();
        let pooled = self.socket().await?;
        pooled.uses.fetch_add(1, Ordering::Relaxed);
        let (sender, receiver) = oneshot::channel();
        let id = {
            let mut pending = pooled.pending.lock().unwrap_or_else(PoisonError::into_inner);
            let mut id = rand::random::<u16>();
            // At most a few hundred queries wait on one socket: a free id is found at once.
            while pending.contains_key(&id) {
                id = rand::random();
            }
            pending.insert(id, Pending { upstream, question, reply: sender });
            id
        };
        let _registration = Registration { pooled: &pooled, id };
        let mut outgoing = query.to_vec();
        outgoing[..2].copy_from_slice(&id.to_be_bytes());
        pooled.socket.send_to(&outgoing, upstream).await?;
        let reply = receiver.await.map_err(|_| std::io::Error::other("the socket closed"))?;
        Ok((reply, id))
    }
}
