//! Relayed queries in flight per source address: one client asking unique names as fast as it
//! may cannot hold the slots the other pods' lookups need, and what it asks beyond them waits,
//! within bounds, for a slot instead of failing at once. The responder admits the queries it
//! relays so, and the upstreams' congestion window hands out its slots so too, its size the
//! limit of borrowing ([`InFlight::set_borrowable`]).

use std::{
    collections::{HashMap, VecDeque},
    net::IpAddr,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::sync::oneshot;

/// Relayed queries (names the upstreams answer) in flight, per source address: each source is
/// always granted its share; beyond it, a source borrows only while the others' reserve stays
/// free. One busy client may use most of the slots while nobody else asks, and a flooding one can
/// never take the reserve the other pods' lookups need. A query that finds no slot waits in its
/// source's queue, bounded per source and in all, for a slot its source may take; as slots free,
/// the queues are served in turn (the freed slot's own source first, when it is owed its share).
#[derive(Debug)]
pub struct InFlight {
    share: usize,
    bounds: QueueBounds,
    counts: Mutex<Counts>,
}

/// How many queries may wait for a slot: of one source, and in all.
#[derive(Clone, Copy, Debug)]
pub struct QueueBounds {
    /// Of one source.
    pub per_source: usize,
    /// Of all sources together.
    pub total: usize,
}

#[derive(Debug)]
struct Counts {
    /// Sources may borrow while fewer than this are in flight in all.
    borrowable: usize,
    total: usize,
    by_source: HashMap<IpAddr, usize>,
    /// Each waiting query's channel, by source, oldest first; a query that gave up has closed it.
    waiting: HashMap<IpAddr, VecDeque<Sender>>,
    /// The sources with a queue, in the order they are served.
    turns: VecDeque<IpAddr>,
    queued: usize,
}

/// Where a waiting query's slot is sent.
type Sender = oneshot::Sender<Relaying>;

/// One relayed query of a source in flight; its slot is free again when dropped.
#[derive(Debug)]
pub struct Relaying {
    in_flight: Arc<InFlight>,
    source: IpAddr,
}

/// What [`InFlight::enter`] gave a query.
#[derive(Debug)]
pub enum Entry {
    /// A slot now.
    Now(Relaying),
    /// A place in its source's queue.
    Queued(oneshot::Receiver<Relaying>),
    /// Neither: its source's queue, or all of them, are full.
    Full,
}

impl Entry {
    /// Its slot, within `wait` when it is queued (`None`: full, or the wait ran out).
    pub async fn slot(self, wait: Duration) -> Option<Relaying> {
        match self {
            Self::Now(relaying) => Some(relaying),
            Self::Queued(receiver) => tokio::time::timeout(wait, receiver).await.ok()?.ok(),
            Self::Full => None,
        }
    }
}

impl InFlight {
    /// `share` queries in flight granted to every source, and more while fewer than
    /// `slots - reserve` are in flight in all; beyond that, queues within `bounds`.
    pub fn new(share: usize, slots: usize, reserve: usize, bounds: QueueBounds) -> Arc<Self> {
        let counts = Counts {
            borrowable: slots.saturating_sub(reserve),
            total: 0,
            by_source: HashMap::new(),
            waiting: HashMap::new(),
            turns: VecDeque::new(),
            queued: 0,
        };
        Arc::new(Self { share, bounds, counts: Mutex::new(counts) })
    }

    /// Lets sources borrow while fewer than `borrowable` are in flight in all from now on; the
    /// waiting queries this lets in are granted their slots, the queues in turn.
    pub fn set_borrowable(self: &Arc<Self>, borrowable: usize) {
        let granted: Vec<(Sender, Relaying)> = {
            let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
            counts.borrowable = borrowable;
            std::iter::from_fn(|| self.next_waiting(&mut counts, None)).collect()
        };
        // Handed over outside the lock, as when a slot frees.
        for (sender, relaying) in granted {
            let _ = sender.send(relaying);
        }
    }

    /// A slot for one more query of `source` if it may have one and none of its queries waits;
    /// else a place in its queue, if there is room.
    pub fn enter(self: &Arc<Self>, source: IpAddr) -> Entry {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        let queue_len = counts.live_queue(source);
        if queue_len == 0 && self.may_enter(&counts, source) {
            return Entry::Now(self.grant(&mut counts, source));
        }
        if queue_len >= self.bounds.per_source || counts.queued >= self.bounds.total {
            return Entry::Full;
        }
        let (sender, receiver) = oneshot::channel();
        let counts = &mut *counts;
        let queue = counts.waiting.entry(source).or_default();
        if queue.is_empty() {
            counts.turns.push_back(source);
        }
        queue.push_back(sender);
        counts.queued += 1;
        Entry::Queued(receiver)
    }

    fn may_enter(&self, counts: &Counts, source: IpAddr) -> bool {
        counts.by_source.get(&source).copied().unwrap_or(0) < self.share || counts.total < counts.borrowable
    }

    fn grant(self: &Arc<Self>, counts: &mut Counts, source: IpAddr) -> Relaying {
        *counts.by_source.entry(source).or_default() += 1;
        counts.total += 1;
        Relaying { in_flight: Arc::clone(self), source }
    }

    /// The next waiting query that may take a slot, granted: `freed`'s first (a slot of it was
    /// just released, so it may be owed its share), then the other sources' in turn.
    fn next_waiting(self: &Arc<Self>, counts: &mut Counts, freed: Option<IpAddr>) -> Option<(Sender, Relaying)> {
        if let Some(freed) = freed
            && counts.live_queue(freed) > 0
            && counts.by_source.get(&freed).copied().unwrap_or(0) < self.share
        {
            counts.turns.retain(|s| *s != freed);
            return Some(self.take_waiting(counts, freed));
        }
        for _ in 0..counts.turns.len() {
            let source = counts.turns.pop_front()?;
            if counts.live_queue(source) == 0 {
                continue;
            }
            if self.may_enter(counts, source) {
                return Some(self.take_waiting(counts, source));
            }
            counts.turns.push_back(source);
        }
        None
    }

    /// The oldest query of `source`'s queue (not in [`Counts::turns`]), granted; its source back
    /// in line if more of it wait.
    fn take_waiting(self: &Arc<Self>, counts: &mut Counts, source: IpAddr) -> (Sender, Relaying) {
        let queue = counts.waiting.get_mut(&source).expect("a live queue");
        let sender = queue.pop_front().expect("a live queue");
        if queue.is_empty() {
            counts.waiting.remove(&source);
        } else {
            counts.turns.push_back(source);
        }
        counts.queued -= 1;
        (sender, self.grant(counts, source))
    }

    /// Queries waiting for a slot now, those that gave up included.
    #[cfg(test)]
    pub fn queued(&self) -> usize {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).queued
    }

    /// Queries of `source` in flight now.
    #[cfg(test)]
    pub fn of(&self, source: IpAddr) -> usize {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner).by_source.get(&source).copied().unwrap_or(0)
    }
}

impl Counts {
    /// The queries of `source` still waiting, once those that gave up at its head are let go.
    fn live_queue(&mut self, source: IpAddr) -> usize {
        let Some(queue) = self.waiting.get_mut(&source) else { return 0 };
        while queue.front().is_some_and(oneshot::Sender::is_closed) {
            queue.pop_front();
            self.queued -= 1;
        }
        let len = queue.len();
        if len == 0 {
            self.waiting.remove(&source);
            self.turns.retain(|s| *s != source);
        }
        len
    }
}

impl Drop for Relaying {
    fn drop(&mut self) {
        let next = {
            let mut counts = self.in_flight.counts.lock().unwrap_or_else(PoisonError::into_inner);
            counts.total -= 1;
            // A source with nothing in flight takes no room: the table holds only the busy ones.
            if let Some(count) = counts.by_source.get_mut(&self.source) {
                *count -= 1;
                if *count == 0 {
                    counts.by_source.remove(&self.source);
                }
            }
            self.in_flight.next_waiting(&mut counts, Some(self.source))
        };
        // Handed over outside the lock: a query that gave up meanwhile drops its slot, which is
        // handed on from there.
        if let Some((sender, relaying)) = next {
            let _ = sender.send(relaying);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNBOUNDED: QueueBounds = QueueBounds { per_source: 0, total: 0 };

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    impl Entry {
        fn now(self) -> Option<Relaying> {
            match self {
                Self::Now(relaying) => Some(relaying),
                _ => None,
            }
        }

        fn queued(self) -> oneshot::Receiver<Relaying> {
            match self {
                Self::Queued(receiver) => receiver,
                other => panic!("not queued: {other:?}"),
            }
        }
    }

    #[test]
    fn a_source_borrows_beyond_its_share_only_while_the_reserve_is_free() {
        // 2 granted to each source; 10 slots, 4 of them kept in reserve for others.
        let in_flight = InFlight::new(2, 10, 4, UNBOUNDED);
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        let held: Vec<Relaying> = (0..20).filter_map(|_| in_flight.enter(a).now()).collect();
        assert_eq!(held.len(), 6, "alone, it borrows up to the reserve");
        let others: Vec<Relaying> =
            [b, b, b, c, c, c].into_iter().filter_map(|source| in_flight.enter(source).now()).collect();
        assert_eq!(others.len(), 4, "every other source its share, from the reserve");
        assert_eq!((in_flight.of(b), in_flight.of(c)), (2, 2));
        drop(held);
        assert_eq!(in_flight.of(a), 0);
        assert!(!in_flight.counts.lock().unwrap().by_source.contains_key(&a), "idle sources take no room");
        assert!(in_flight.enter(b).now().is_some(), "with the flood gone, b borrows again");
        drop(others);
        assert_eq!(in_flight.counts.lock().unwrap().total, 0);
    }

    #[test]
    fn a_sources_excess_waits_in_its_queue_and_the_queues_are_served_in_turn() {
        // 2 granted to each source; 10 slots, 4 in reserve; 3 waiting per source, 5 in all.
        let in_flight = InFlight::new(2, 10, 4, QueueBounds { per_source: 3, total: 5 });
        let (a, b, c, d) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"), ip("10.0.0.4"));
        let mut held_a: Vec<Relaying> = (0..6).map(|_| in_flight.enter(a).now().unwrap()).collect();
        let mut waiting_a: Vec<_> = (0..3).map(|_| in_flight.enter(a).queued()).collect();
        assert!(matches!(in_flight.enter(a), Entry::Full), "a's queue is full");
        let mut held_b: Vec<Relaying> = (0..2).map(|_| in_flight.enter(b).now().unwrap()).collect();
        let mut waiting_b = in_flight.enter(b).queued();
        let _held_c: Vec<Relaying> = (0..2).map(|_| in_flight.enter(c).now().unwrap()).collect();
        let mut waiting_c = in_flight.enter(c).queued();
        assert!(in_flight.enter(d).now().is_some(), "a source under its share never waits");
        assert!(matches!(in_flight.enter(a), Entry::Full));
        assert_eq!(in_flight.counts.lock().unwrap().queued, 5);

        // A slot of a borrower frees while 11 are in flight: nobody may borrow it.
        drop(held_a.pop());
        assert!(waiting_a[0].try_recv().is_err() && waiting_b.try_recv().is_err() && waiting_c.try_recv().is_err());
        // One of b's: b is owed its share, its waiting query takes the slot.
        drop(held_b.pop());
        let granted_b = waiting_b.try_recv().expect("b's query, granted");
        assert_eq!(in_flight.of(b), 2);
        // a's borrowed slots free: at its last, a is owed its share again and its oldest waiting
        // query takes the slot.
        drop(held_a.drain(..4));
        let _granted_a = waiting_a[0].try_recv().expect("a's first waiting query");
        assert_eq!(in_flight.counts.lock().unwrap().total, 6);
        // Borrowing is possible again when one more frees: the queues take turns, c's now.
        drop(granted_b);
        assert!(waiting_a[1].try_recv().is_err(), "b's freed slot went to c, whose turn it was");
        let _granted_c = waiting_c.try_recv().expect("c's query");
        drop(held_a.pop());
        let _granted = waiting_a[1].try_recv().expect("a, owed its share, next");
        assert_eq!(in_flight.counts.lock().unwrap().queued, 1);
        waiting_a.clear();
        assert!(matches!(in_flight.enter(a), Entry::Queued(_)), "the query that gave up left its place");
    }

    #[test]
    fn a_query_that_gave_up_takes_no_slot() {
        let in_flight = InFlight::new(1, 2, 0, QueueBounds { per_source: 4, total: 4 });
        let a = ip("10.0.0.1");
        let held: Vec<Relaying> = (0..2).map(|_| in_flight.enter(a).now().unwrap()).collect();
        let gave_up = in_flight.enter(a).queued();
        let mut waits = in_flight.enter(a).queued();
        drop(gave_up);
        drop(held);
        let granted = waits.try_recv().expect("the one still waiting, granted");
        assert_eq!(in_flight.counts.lock().unwrap().total, 1, "the one that gave up holds nothing");
        // A slot handed to a query that gives up at that instant is handed on, not lost.
        let (sender, receiver) = oneshot::channel();
        drop(receiver);
        assert!(sender.send(granted).is_err());
        let counts = in_flight.counts.lock().unwrap();
        assert_eq!((counts.total, counts.queued, counts.by_source.len(), counts.turns.len()), (0, 0, 0, 0));
    }

    #[test]
    fn a_changed_limit_lets_in_the_waiting_queries_in_turn_and_revokes_nothing() {
        let in_flight = InFlight::new(1, 4, 0, QueueBounds { per_source: 4, total: 8 });
        let (a, b) = (ip("10.0.0.1"), ip("10.0.0.2"));
        let _held: Vec<Relaying> = (0..4).map(|_| in_flight.enter(a).now().unwrap()).collect();
        let _b = in_flight.enter(b).now().expect("b's share");
        let mut waiting_a: Vec<_> = (0..2).map(|_| in_flight.enter(a).queued()).collect();
        let mut waiting_b = in_flight.enter(b).queued();
        in_flight.set_borrowable(2);
        assert_eq!(in_flight.counts.lock().unwrap().total, 5, "a smaller limit takes no slot back");
        assert!(waiting_a[0].try_recv().is_err() && waiting_b.try_recv().is_err());
        in_flight.set_borrowable(7);
        let (_first, _second) = (waiting_a[0].try_recv().unwrap(), waiting_b.try_recv().unwrap());
        assert!(waiting_a[1].try_recv().is_err(), "7 in flight: the limit");
    }

    #[tokio::test(start_paused = true)]
    async fn a_query_waits_its_bound_then_gets_nothing() {
        let in_flight = InFlight::new(1, 1, 0, QueueBounds { per_source: 1, total: 1 });
        let a = ip("10.0.0.1");
        let held = in_flight.enter(a).now().unwrap();
        assert!(in_flight.enter(a).slot(Duration::from_secs(1)).await.is_none(), "no slot within the wait");
        let waiting = in_flight.enter(a);
        let later = tokio::spawn(waiting.slot(Duration::from_secs(1)));
        tokio::time::sleep(Duration::from_millis(300)).await;
        drop(held);
        assert!(later.await.unwrap().is_some(), "granted when the slot freed");
    }
}
