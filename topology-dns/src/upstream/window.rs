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
//! the window full waits for a slot within its time to answer. Each source's first
//! [`Window::PER_SOURCE`] queries at the upstreams never wait: one pod's queries waiting for the
//! window do not delay another pod's.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use tokio::sync::Notify;

use super::MAX_FORWARDS;

/// The window after a loss, as a share of what it was: a gentler cut than TCP's (Reno halves,
/// CUBIC keeps 0.7); the DNS bench's unique names ran as fast with 0.7, and a smaller cut leaves
/// the upstream less idle after a burst of drops.
const DECREASE: f64 = 0.85;

#[derive(Debug)]
struct State {
    size: f64,
    in_flight: usize,
    /// Queries at the upstreams by source (those of none, the responder's own, not counted).
    by_source: HashMap<IpAddr, usize, foldhash::fast::RandomState>,
    /// When the window last shrank.
    decreased: Option<Instant>,
}

/// The queries the upstreams may hold at once.
#[derive(Debug)]
pub(super) struct Window {
    state: Mutex<State>,
    freed: Notify,
}

/// A query's place in the window (its source's), given back when dropped.
pub(super) struct Slot<'a>(&'a Window, Option<IpAddr>);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let mut state = self.0.lock();
        state.in_flight -= 1;
        if let Some(source) = self.1
            && let Some(count) = state.by_source.get_mut(&source)
        {
            *count -= 1;
            if *count == 0 {
                state.by_source.remove(&source);
            }
        }
        drop(state);
        self.0.freed.notify_one();
    }
}

impl Default for Window {
    fn default() -> Self {
        let state = State { size: Self::MAX, in_flight: 0, by_source: HashMap::default(), decreased: None };
        Self { state: Mutex::new(state), freed: Notify::new() }
    }
}

impl Window {
    /// Never smaller: 32 queries in flight carry 32,000 a second at a millisecond's round trip.
    pub(super) const MIN: f64 = 32.0;
    const MAX: f64 = MAX_FORWARDS as f64;

    /// Queries of each source at the upstreams that never wait for the window: more than a stub
    /// resolver asks at once (glibc asks two).
    pub(super) const PER_SOURCE: usize = 4;

    /// A slot for a query of `source` (`None`: the responder's own), once the queries in flight
    /// are fewer than the window or the source's are fewer than [`Window::PER_SOURCE`].
    pub(super) async fn slot(&self, source: Option<IpAddr>) -> Slot<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            {
                let mut state = self.lock();
                let own = source.map_or(Self::PER_SOURCE, |source| state.by_source.get(&source).copied().unwrap_or(0));
                if (state.in_flight as f64) < state.size || own < Self::PER_SOURCE {
                    state.in_flight += 1;
                    if let Some(source) = source {
                        *state.by_source.entry(source).or_default() += 1;
                    }
                    return Slot(self, source);
                }
            }
            freed.await;
        }
    }

    /// A reply came: the window grows by one for each window's worth of replies.
    pub(super) fn answered(&self) {
        let mut state = self.lock();
        state.size = (state.size + 1.0 / state.size).min(Self::MAX);
        drop(state);
        self.freed.notify_one();
    }

    /// A query was lost at `now`: the window shrinks, unless it did within the last round trip
    /// (`round_trip`; the losses of one burst are one signal).
    pub(super) fn lost(&self, now: Instant, round_trip: Duration) {
        let mut state = self.lock();
        if state.decreased.is_none_or(|at| now.saturating_duration_since(at) >= round_trip) {
            state.size = (state.size * DECREASE).max(Self::MIN);
            state.decreased = Some(now);
        }
    }

    /// The window now, in queries.
    #[cfg(test)]
    pub(super) fn size(&self) -> f64 {
        self.lock().size
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_is_open_until_a_loss_then_shrinks_once_a_round_trip_and_grows_back() {
        let window = Window::default();
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

    #[tokio::test]
    async fn a_query_waits_for_a_slot_while_the_window_is_full() {
        let window = Window::default();
        let start = Instant::now();
        for n in 0..100 {
            window.lost(start + Duration::from_secs(n), Duration::from_millis(1));
        }
        let (pod, other): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let slots: Vec<Slot<'_>> = futures::future::join_all((0..32).map(|_| window.slot(Some(pod)))).await;
        let waiting = window.slot(Some(pod));
        tokio::pin!(waiting);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), waiting.as_mut()).await.is_err(),
            "32 in flight: the 33rd waits"
        );
        let refresh = window.slot(None);
        tokio::pin!(refresh);
        assert!(tokio::time::timeout(Duration::from_millis(50), refresh.as_mut()).await.is_err(), "so does a refresh");
        // Another pod's first queries do not wait behind the first pod's.
        let others: Vec<Slot<'_>> =
            futures::future::join_all((0..Window::PER_SOURCE).map(|_| window.slot(Some(other)))).await;
        let fifth = window.slot(Some(other));
        tokio::pin!(fifth);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), fifth.as_mut()).await.is_err(),
            "past its own, it waits"
        );
        drop(others);
        assert_eq!(window.lock().by_source.len(), 1, "a source with nothing in flight is forgotten");
        drop(slots);
        tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("a slot, once one is given back");
    }
}
