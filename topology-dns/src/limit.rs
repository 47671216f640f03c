//! Queries per source address: a token bucket each, in a table of bounded size, so one noisy
//! client cannot take the responder (or the node's CPU) from the others. When the table is full of
//! recently active sources, a new source shares one overflow bucket with every other untracked
//! source: a flood from many (spoofed) addresses gets one source's rate, and resets nobody's.

use std::{collections::HashMap, net::IpAddr, time::Instant};

/// Sources tracked at most; when full, idle ones are forgotten first.
const MAX_SOURCES: usize = 16_384;
/// How often, at most, a full table is swept for idle sources (a sweep walks all of it).
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

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
    /// Shared by the sources a full table cannot track.
    overflow: Bucket,
    /// When a full table was last swept.
    swept: Option<Instant>,
}

impl SourceLimiter {
    /// A limiter of `rate` queries per second per source; 0 admits everything.
    pub fn new(rate: u32) -> Self {
        let now = Instant::now();
        Self {
            rate: f64::from(rate),
            buckets: HashMap::new(),
            overflow: Bucket { tokens: f64::from(rate), last: now },
            swept: None,
        }
    }

    /// Whether a query from `source` at `now` is admitted.
    pub fn admit(&mut self, source: IpAddr, now: Instant) -> bool {
        if self.rate <= 0.0 {
            return true;
        }
        let rate = self.rate;
        if self.buckets.len() >= MAX_SOURCES && !self.buckets.contains_key(&source) {
            if self.swept.is_none_or(|at| now.saturating_duration_since(at) >= SWEEP_EVERY) {
                self.swept = Some(now);
                // A bucket idle long enough to be full again carries no state worth keeping.
                self.buckets.retain(|_, b| now.saturating_duration_since(b.last).as_secs_f64() * rate < rate);
            }
            if self.buckets.len() >= MAX_SOURCES {
                return take(&mut self.overflow, rate, now);
            }
        }
        let bucket = self.buckets.entry(source).or_insert(Bucket { tokens: rate, last: now });
        take(bucket, rate, now)
    }
}

/// Refills `bucket` at `rate` up to `rate` tokens, then takes one if it can.
fn take(bucket: &mut Bucket, rate: f64, now: Instant) -> bool {
    {
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
    fn the_table_stays_bounded_and_a_flood_of_sources_shares_one_rate() {
        let mut limiter = SourceLimiter::new(10);
        let now = Instant::now();
        let noisy: IpAddr = "192.0.2.1".parse().unwrap();
        assert_eq!((0..20).filter(|_| limiter.admit(noisy, now)).count(), 10, "its burst, spent");
        // 16,383 more sources fill the table; then 100,000 more (spoofed) share one bucket.
        let spoofed = (1..).map(|i: u32| IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
        let admitted = spoofed.take(MAX_SOURCES - 1 + 100_000).filter(|source| limiter.admit(*source, now)).count();
        assert!(limiter.buckets.len() <= MAX_SOURCES);
        assert_eq!(admitted, MAX_SOURCES - 1 + 10, "each tracked source its query, the untracked rest one burst");
        assert!(!limiter.admit(noisy, now), "the flood reset nobody's bucket");
    }
}
