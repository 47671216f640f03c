//! Queries per source address: a token bucket each, in a table of bounded size, so one noisy
//! client cannot take the responder (or the node's CPU) from the others.

use std::{collections::HashMap, net::IpAddr, time::Instant};

/// Sources tracked at most; when full, idle ones are forgotten first.
const MAX_SOURCES: usize = 16_384;

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
}

/// Admits at most `rate` queries per second per source, with bursts of up to `rate`.
#[derive(Debug)]
pub struct SourceLimiter {
    rate: f64,
    buckets: HashMap<IpAddr, Bucket>,
}

impl SourceLimiter {
    /// A limiter of `rate` queries per second per source; 0 admits everything.
    pub fn new(rate: u32) -> Self {
        Self { rate: f64::from(rate), buckets: HashMap::new() }
    }

    /// Whether a query from `source` at `now` is admitted.
    pub fn admit(&mut self, source: IpAddr, now: Instant) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        if self.buckets.len() >= MAX_SOURCES && !self.buckets.contains_key(&source) {
            let rate = self.rate;
            // A bucket idle long enough to be full again carries no state worth keeping.
            self.buckets.retain(|_, b| now.saturating_duration_since(b.last).as_secs_f64() * rate < rate);
            if self.buckets.len() >= MAX_SOURCES {
                self.buckets.clear();
            }
        }
        let rate = self.rate;
        let bucket = self.buckets.entry(source).or_insert(Bucket { tokens: rate, last: now });
        let elapsed = now.saturating_duration_since(bucket.last).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * rate).min(rate);
        bucket.last = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_source_gets_its_rate_and_others_are_unaffected() {
        let mut limiter = SourceLimiter::new(100);
        let start = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let admitted = (0..1000).filter(|_| limiter.admit(a, start)).count();
        assert_eq!(admitted, 100, "one burst");
        assert!(limiter.admit(b, start), "another source has its own bucket");
        assert!(!limiter.admit(a, start + Duration::from_millis(5)), "half a token");
        assert!(limiter.admit(a, start + Duration::from_millis(20)), "refilled");
        let mut unlimited = SourceLimiter::new(0);
        assert!((0..10_000).all(|_| unlimited.admit(a, start)));
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut limiter = SourceLimiter::new(10);
        let now = Instant::now();
        for i in 0..(MAX_SOURCES as u32 + 100) {
            limiter.admit(IpAddr::from(i.to_be_bytes()), now);
        }
        assert!(limiter.buckets.len() <= MAX_SOURCES);
    }
}
