//! When a relayed query is sent again. The retry time is RFC 6298's retransmission timeout — the
//! smoothed round trip plus four times its variation — within [`Retry::MIN`]..[`Retry::MAX`],
//! doubling at each send; [`Retry::FIRST`] before any reply. A round trip is timed from the first
//! send, whichever send the reply answers: Karn's rule (time only what was sent once) would never
//! see the replies slower than the retry time and keep the estimate short of a queue; timed this
//! way it errs long.
//!
//! When the retry time runs out, the query is sent again only if it looks lost, as RACK (RFC
//! 8985) tells a lost segment from a late one: the upstream has said nothing for a retry time
//! ([`Loss::Silent`]: lost, or the upstream gone), or it has answered a query sent after this one
//! (beyond a reordering window of a quarter round trip), so it skipped this one
//! ([`Loss::Skipped`]: its socket was full, the congestion window's signal). An upstream answering
//! only what was sent before it is working through a queue this query is in: sending it again
//! would double the work of an upstream that is already behind (CoreDNS forwards both copies of
//! an uncached name), and it waits another retry time instead.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

/// Upstreams remembered at most; past it, those silent for a minute are forgotten.
const REMEMBERED: usize = 64;
/// How long an upstream's last reply is remembered once past [`REMEMBERED`].
const FORGET_AFTER: Duration = Duration::from_secs(60);

/// What an upstream last did.
#[derive(Clone, Copy, Debug)]
struct Heard {
    /// When its latest reply came.
    at: Instant,
    /// The first send of the latest-sent query it answered.
    sent: Instant,
}

#[derive(Debug, Default)]
struct State {
    /// The smoothed round trip and its mean deviation, microseconds (0, 0: none measured yet).
    estimate: (u64, u64),
    heard: HashMap<SocketAddr, Heard, foldhash::fast::RandomState>,
}

/// Why a query looks lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Loss {
    /// The upstream has said nothing for a retry time.
    Silent,
    /// The upstream answered a query sent after it.
    Skipped,
}

/// The retry time and what each upstream answered last, shared by the queries in flight.
#[derive(Debug, Default)]
pub(super) struct Retry {
    state: Mutex<State>,
}

impl Retry {
    pub(super) const FIRST: Duration = Duration::from_millis(250);
    pub(super) const MIN: Duration = Duration::from_millis(50);
    pub(super) const MAX: Duration = Duration::from_secs(1);

    /// How long to wait for a reply before the first retry.
    pub(super) fn after(&self) -> Duration {
        match self.lock().estimate {
            (0, _) => Self::FIRST,
            (smoothed, deviation) => Duration::from_micros(smoothed + 4 * deviation).clamp(Self::MIN, Self::MAX),
        }
    }

    /// The smoothed round trip (zero before any reply).
    pub(super) fn round_trip(&self) -> Duration {
        Duration::from_micros(self.lock().estimate.0)
    }

    /// `upstream` answered, at `now`, a query first sent at `sent`: a round trip (RFC 6298's
    /// gains, 1/8 and 1/4), and what it answered last. The smoothed round trip after it.
    pub(super) fn answered(&self, upstream: SocketAddr, sent: Instant, now: Instant) -> Duration {
        let rtt = now.saturating_duration_since(sent);
        let sample = u64::try_from(rtt.as_micros()).unwrap_or(u64::MAX / 8).max(1);
        let mut state = self.lock();
        state.estimate = match state.estimate {
            (0, _) => (sample, sample / 2),
            (smoothed, deviation) => {
                (smoothed - smoothed / 8 + sample / 8, deviation - deviation / 4 + smoothed.abs_diff(sample) / 4)
            }
        };
        if state.heard.len() >= REMEMBERED && !state.heard.contains_key(&upstream) {
            state.heard.retain(|_, heard| now.saturating_duration_since(heard.at) < FORGET_AFTER);
        }
        let heard = state.heard.entry(upstream).or_insert(Heard { at: now, sent });
        heard.at = heard.at.max(now);
        heard.sent = heard.sent.max(sent);
        Duration::from_micros(state.estimate.0)
    }

    /// Whether a query last sent to `upstream` at `sent`, waiting `wait` and unanswered at `now`,
    /// looks lost, and why (see the module's comment); `None`: it is in the upstream's queue.
    pub(super) fn lost(&self, upstream: SocketAddr, sent: Instant, wait: Duration, now: Instant) -> Option<Loss> {
        let state = self.lock();
        let Some(heard) = state.heard.get(&upstream) else { return Some(Loss::Silent) };
        let reordering = Duration::from_micros(state.estimate.0 / 4);
        if heard.sent > sent + reordering {
            Some(Loss::Skipped)
        } else if now.saturating_duration_since(heard.at) >= wait {
            Some(Loss::Silent)
        } else {
            None
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UPSTREAM: SocketAddr = SocketAddr::V4(std::net::SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, 53));

    #[test]
    fn the_retry_time_follows_the_round_trips_and_their_variation_within_bounds() {
        let retry = Retry::default();
        assert_eq!(retry.after(), Retry::FIRST, "nothing measured yet");
        let answered = |rtt: Duration| {
            let now = Instant::now();
            retry.answered(UPSTREAM, now.checked_sub(rtt).unwrap(), now)
        };
        assert_eq!(answered(Duration::from_millis(30)), Duration::from_millis(30), "the first sample");
        assert_eq!(answered(Duration::from_millis(110)), Duration::from_millis(40), "an eighth of the next");
        // Smoothed 40 ms, its variation 15 ms less a quarter plus a quarter of 80: 31.25 ms.
        let first = retry.after();
        assert!(first.abs_diff(Duration::from_micros(40_000 + 4 * 31_250)) < Duration::from_millis(1), "{first:?}");
        for _ in 0..200 {
            answered(Duration::from_micros(100));
        }
        assert_eq!(retry.after(), Retry::MIN, "a fast, steady upstream is not asked again at once");
        // A queue: replies alternating 10 ms and 200 ms wait longer than their mean's four times.
        for n in 0..200 {
            answered(Duration::from_millis(if n % 2 == 0 { 10 } else { 200 }));
        }
        assert!(retry.after() > Duration::from_millis(400), "{:?}", retry.after());
        for _ in 0..200 {
            answered(Duration::from_secs(5));
        }
        assert_eq!(retry.after(), Retry::MAX);
    }

    #[test]
    fn a_query_is_lost_when_the_upstream_is_silent_or_answered_a_later_one() {
        let retry = Retry::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let wait = Duration::from_millis(100);
        assert_eq!(retry.lost(UPSTREAM, at(0), wait, at(100)), Some(Loss::Silent), "nothing ever heard");
        // Queries sent at 0..=10 ms; the upstream has answered the one sent at 8 ms, in 20 ms.
        retry.answered(UPSTREAM, at(8), at(28));
        // Sent at 10 ms: the upstream works through a queue that holds it.
        assert_eq!(retry.lost(UPSTREAM, at(10), wait, at(110)), None, "queued behind what it answers");
        // ...and is silent for a whole retry time since: lost, or the upstream gone.
        assert_eq!(retry.lost(UPSTREAM, at(10), wait, at(128)), Some(Loss::Silent));
        // Sent at 0 ms; the one sent at 8 ms was answered: skipped, past the reordering window
        // (a quarter of the 20 ms round trip).
        assert_eq!(retry.lost(UPSTREAM, at(0), wait, at(100)), Some(Loss::Skipped), "a later query answered");
        assert_eq!(retry.lost(UPSTREAM, at(4), wait, at(100)), None, "within the reordering window");
        // Another upstream has its own.
        let other = SocketAddr::from(([127, 0, 0, 2], 53));
        assert_eq!(retry.lost(other, at(10), wait, at(110)), Some(Loss::Silent));
    }

    #[test]
    fn upstreams_long_silent_are_forgotten_past_the_bound() {
        let retry = Retry::default();
        let start = Instant::now();
        for port in 0..REMEMBERED as u16 {
            retry.answered(SocketAddr::from(([10, 0, 0, 1], port)), start, start);
        }
        let later = start + FORGET_AFTER;
        retry.answered(UPSTREAM, later, later);
        assert_eq!(retry.lock().heard.len(), 1, "the silent ones forgotten");
    }
}
