//! How many relayed queries are at the upstreams at once: a congestion window, as TCP keeps one
//! (RFC 5681's additive increase and multiplicative decrease). It opens at [`MAX_FORWARDS`], so
//! it holds nothing back until an upstream loses a query; then it shrinks by [`DECREASE`], once a
//! round trip at most, down to [`Window::MIN`], and grows back by one query per window's worth of
//! replies. An upstream drops a query when its socket's receive buffer is full: past what it can
//! queue, more in flight only makes it drop more, and every drop costs it the retry's work again
//! (CoreDNS forwards an uncached name once for each copy). The DNS bench's unique names showed
//! it: CoreDNS's socket overflowed 17,545 times in 10 s with 768 queries in flight.
//!
//! Only a query the upstream skipped — it answered queries sent after it — shrinks the window: a
//! full socket drops some and serves the rest. Silence says nothing of a full socket (a slow
//! upstream holds every query; a dead one answers none), and a window shrunk by it would only
//! delay the queries of every pod behind those of the slow upstream.
//!
//! A query holds its slot from its first send to its reply, its retries included; one that finds
//! the window full waits for a slot within its time to answer. The slots are handed out as the
//! responder admits the queries it relays ([`InFlight`]): each source's first
//! [`Window::PER_SOURCE`] queries at the upstreams never wait, and as slots free, the sources'
//! waiting queries take them in turn. A pod flooding unique names has its excess wait in its own
//! queue; another pod's queries beyond its first four wait for the next slot, not behind the
//! flood. The responder's own queries (refreshes of answers about to expire) are one source.

use std::{
    net::{IpAddr, Ipv4Addr},
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use prometheus_client::metrics::gauge::Gauge;

use super::{MAX_FORWARDS, UPSTREAM_TIMEOUT};
use crate::in_flight::{Entry, InFlight, QueueBounds, Relaying};

/// The window after a loss, as a share of what it was: a gentler cut than TCP's (Reno halves,
/// CUBIC keeps 0.7); the DNS bench's unique names ran as fast with 0.7, and a smaller cut leaves
/// the upstream less idle after a burst of drops.
const DECREASE: f64 = 0.85;

/// The source the responder's own queries count as.
const RESPONDER: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

#[derive(Debug)]
struct Size {
    /// In queries; its whole part is the slots the sources may borrow.
    now: f64,
    /// When the window last shrank.
    decreased: Option<Instant>,
}

/// The queries the upstreams may hold at once.
#[derive(Debug)]
pub(super) struct Window {
    size: Mutex<Size>,
    slots: Arc<InFlight>,
    /// Its whole part, exported (`dns_upstream_window`).
    gauge: Gauge,
}

impl Window {
    /// An open window, its size kept in `gauge`.
    pub(super) fn new(gauge: Gauge) -> Self {
        // Every query the responder admits may wait here, and its refreshes besides.
        let bounds = QueueBounds { per_source: MAX_FORWARDS, total: 2 * MAX_FORWARDS };
        gauge.set(MAX_FORWARDS as i64);
        Self {
            size: Mutex::new(Size { now: Self::MAX, decreased: None }),
            slots: InFlight::new(Self::PER_SOURCE, MAX_FORWARDS, 0, bounds),
            gauge,
        }
    }

    /// Never smaller: 32 queries in flight carry 32,000 a second at a millisecond's round trip.
    pub(super) const MIN: f64 = 32.0;
    const MAX: f64 = MAX_FORWARDS as f64;

    /// Queries of each source at the upstreams that never wait for the window: more than a stub
    /// resolver asks at once (glibc asks two).
    pub(super) const PER_SOURCE: usize = 4;

    /// A slot for a query of `source` (`None`: the responder's own), at once when the queries in
    /// flight are fewer than the window or the source's fewer than [`Window::PER_SOURCE`], else
    /// in its source's turn (`None`: the queues are full, or no slot came within the upstreams'
    /// time).
    pub(super) async fn slot(&self, source: Option<IpAddr>) -> Option<Relaying> {
        self.enter(source).slot(UPSTREAM_TIMEOUT).await
    }

    fn enter(&self, source: Option<IpAddr>) -> Entry {
        self.slots.enter(source.unwrap_or(RESPONDER))
    }

    /// A reply came: the window grows by one for each window's worth of replies.
    pub(super) fn answered(&self) {
        self.resize(|size| (size.now + 1.0 / size.now).min(Self::MAX));
    }

    /// A query was lost at `now`: the window shrinks, unless it did within the last round trip
    /// (`round_trip`; the losses of one burst are one signal).
    pub(super) fn lost(&self, now: Instant, round_trip: Duration) {
        self.resize(|size| {
            if size.decreased.is_some_and(|at| now.saturating_duration_since(at) < round_trip) {
                return size.now;
            }
            size.decreased = Some(now);
            (size.now * DECREASE).max(Self::MIN)
        });
    }

    /// The window as `new` sets it; the slots follow when its whole part changes (under the
    /// lock, so that they follow in order).
    fn resize(&self, new: impl FnOnce(&mut Size) -> f64) {
        let mut size = self.size.lock().unwrap_or_else(PoisonError::into_inner);
        let before = size.now;
        size.now = new(&mut size);
        if size.now.floor() != before.floor() {
            self.slots.set_borrowable(size.now as usize);
            self.gauge.set(size.now as i64);
        }
    }

    /// Queries waiting for a slot now.
    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        self.slots.queued()
    }

    /// The window now, in queries.
    #[cfg(test)]
    pub(super) fn size(&self) -> f64 {
        self.size.lock().unwrap_or_else(PoisonError::into_inner).now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_open_until_a_loss_then_shrinks_once_a_round_trip_and_grows_back() {
        let window = Window::new(Gauge::default());
        assert_eq!(window.size(), MAX_FORWARDS as f64, "nothing held back before a loss");
        let (start, round_trip) = (Instant::now(), Duration::from_millis(10));
        window.lost(start, round_trip);
        assert_eq!(window.size(), MAX_FORWARDS as f64 * DECREASE);
        window.lost(start + Duration::from_millis(5), round_trip);
        assert_eq!(window.size(), MAX_FORWARDS as f64 * DECREASE, "the same burst's losses: one signal");
        window.lost(start + round_trip, round_trip);
        assert_eq!(window.size(), MAX_FORWARDS as f64 * DECREASE * DECREASE);
        for n in 2..100 {
            window.lost(start + round_trip * n, round_trip);
        }
        assert_eq!(window.size(), Window::MIN, "never below its floor");
        assert_eq!(window.gauge.get(), 32, "exported");
        // A window's worth of replies: one more query.
        for _ in 0..32 {
            window.answered();
        }
        assert!((window.size() - 33.0).abs() < 0.05, "{}", window.size());
        for _ in 0..1_000_000 {
            window.answered();
        }
        assert_eq!(window.size(), MAX_FORWARDS as f64, "never above the forwards allowed");
    }

    /// A window shrunk to its floor.
    fn shrunk() -> Window {
        let window = Window::new(Gauge::default());
        let start = Instant::now();
        for n in 0..100 {
            window.lost(start + Duration::from_secs(n), Duration::from_millis(1));
        }
        assert_eq!(window.size(), Window::MIN);
        window
    }

    fn granted(entry: Entry) -> Relaying {
        match entry {
            Entry::Now(slot) => slot,
            other => panic!("not granted: {other:?}"),
        }
    }

    fn queued(entry: Entry) -> tokio::sync::oneshot::Receiver<Relaying> {
        match entry {
            Entry::Queued(receiver) => receiver,
            other => panic!("not queued: {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_query_waits_for_a_slot_while_the_window_is_full() {
        let window = shrunk();
        let (pod, other): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let slots: Vec<Relaying> = (0..32).map(|_| granted(window.enter(Some(pod)))).collect();
        let waiting = window.slot(Some(pod));
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), waiting.as_mut()).await.is_err(),
            "32 in flight: the 33rd waits"
        );
        // Another pod's first queries, and the responder's own, do not wait behind the first pod's.
        let others: Vec<Relaying> = (0..Window::PER_SOURCE).map(|_| granted(window.enter(Some(other)))).collect();
        let own: Vec<Relaying> = (0..Window::PER_SOURCE).map(|_| granted(window.enter(None))).collect();
        let fifth = window.slot(Some(other));
        tokio::pin!(fifth);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), fifth.as_mut()).await.is_err(),
            "past its own, it waits"
        );
        drop((others, own));
        let fifth = tokio::time::timeout(Duration::from_secs(1), fifth).await.expect("its own share's slot, freed");
        assert_eq!((fifth.is_some(), window.slots.of(other)), (true, 1), "the rest given back");
        drop(slots);
        let slot = tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("a slot, once one is given back");
        assert!(slot.is_some());
    }

    #[test]
    fn the_waiting_sources_take_the_freed_slots_in_turn_and_the_grown_window_its_own() {
        let window = shrunk();
        let (flood, pod): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let mut flooding: Vec<Relaying> = (0..32).map(|_| granted(window.enter(Some(flood)))).collect();
        let mut flood_waits: Vec<_> = (0..6).map(|_| queued(window.enter(Some(flood)))).collect();
        let _pods: Vec<Relaying> = (0..Window::PER_SOURCE).map(|_| granted(window.enter(Some(pod)))).collect();
        let mut pod_waits: Vec<_> = (0..2).map(|_| queued(window.enter(Some(pod)))).collect();
        // 36 in flight: the first 4 slots given back leave 32, the window's; then each one freed
        // goes to the queue whose turn it is, the pod's waiting as long as the flood's one.
        let (mut order, mut kept) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            drop(flooding.pop());
            for (name, waits) in [("flood", &mut flood_waits), ("pod", &mut pod_waits)] {
                let slot = waits.iter_mut().enumerate().find_map(|(n, wait)| Some((n, wait.try_recv().ok()?)));
                if let Some((n, slot)) = slot {
                    order.push(format!("{name} {n}"));
                    kept.push(slot);
                }
            }
        }
        assert_eq!(order, ["flood 0", "pod 0", "flood 1", "pod 1", "flood 2", "flood 3"]);
        // The window grows by one after its worth of replies (32, then 33): one more query goes.
        for _ in 0..40 {
            window.answered();
        }
        let _grown = flood_waits[4].try_recv().expect("the grown window's slot, granted");
        assert!(flood_waits[5].try_recv().is_err(), "and only one");
    }
}
