//! The responder's metrics: its queries by type and outcome, the endpoints it answered by
//! locality, and the relay's upstream time, round trip, retries, queue and congestion window.

use std::{
    collections::HashMap,
    sync::{Arc, RwLock, atomic::AtomicU64},
};

use hickory_proto::rr::RecordType;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
};
use topology_policy::desired::Locality;

use crate::relay_cache;

/// Labels of a query.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    /// Query type (`A`, `AAAA`, `SRV`, …).
    pub r#type: String,
    /// `answer`, `nodata`, `nxdomain`, `forwarded`, `upstream_failed`, `overloaded`,
    /// `rate_limited`, `malformed`, `error`.
    pub outcome: String,
}

/// Labels of an answered endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LocalityLabels {
    /// `node`, `zone`, `region`, `other`.
    pub locality: String,
}

topology_metrics::metrics! {
    /// The responder's metrics. Counting a query costs no allocation once its type and outcome
    /// have been seen: the hot path keeps the counters it has used.
    pub struct DnsMetrics;
    exported {
        pub(crate) queries: Family<QueryLabels, Counter> = Family::default(),
            "dns_queries",
            "DNS queries, by type and outcome";
        answers: Family<LocalityLabels, Counter> = Family::default(),
            "dns_answered_endpoints",
            "Headless-Service endpoints in DNS answers, by locality relative to this node";
        // 100 us .. ~3 s.
        pub upstream_seconds: Histogram =
            Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(1e-4, 2.0, 15)),
            "dns_upstream_seconds",
            "Time for the upstreams to answer a relayed query, a wait for the congestion window included";
        pub relay_queued: Counter = Counter::default(),
            "dns_relay_queued",
            "Relayed queries that waited for a slot, their source's share, what it may borrow and the others' reserve \
             all in flight (what waits in vain gets SERVFAIL, outcome source_overloaded)";
        pub upstream_retries: Counter = Counter::default(),
            "dns_upstream_retries",
            "Relayed queries sent again to an upstream that had not answered within the retry time";
        pub upstream_window: Gauge = Gauge::default(),
            "dns_upstream_window",
            "Relayed queries the upstreams may hold at once, the congestion window: 1024 until an upstream drops \
             queries (its socket full), then lower";
        pub upstream_round_trip: Gauge<f64, AtomicU64> = Gauge::default(),
            "dns_upstream_round_trip_seconds",
            "The upstreams' smoothed round trip (RFC 6298's), from a relayed query's first send to its reply, \
             without its wait for the congestion window: the window over it is the rate they are asked at most";
    }
    nested {
        /// The cache of relayed answers.
        pub cache: Arc<relay_cache::CacheMetrics> = Arc::default();
    }
    own {
        /// The counters of `queries` by query type (`None`: unreadable) and outcome.
        seen: RwLock<HashMap<(Option<RecordType>, &'static str), Counter>> = RwLock::default();
        /// The counters of `answers`, by locality class.
        by_locality: [Counter; Locality::ALL.len()] =
            Locality::ALL.map(|l| answers.get_or_create(&LocalityLabels { locality: l.as_str().into() }).clone());
    }
}

impl DnsMetrics {
    pub(crate) fn query(&self, r#type: Option<RecordType>, outcome: &'static str) {
        let key = (r#type, outcome);
        if let Some(counter) = self.seen.read().ok().and_then(|seen| seen.get(&key).cloned()) {
            counter.inc();
            return;
        }
        let name = r#type.map_or_else(|| "unknown".to_owned(), |t| t.to_string());
        let counter = self.queries.get_or_create(&QueryLabels { r#type: name, outcome: outcome.into() }).clone();
        counter.inc();
        if let Ok(mut seen) = self.seen.write() {
            seen.insert(key, counter);
        }
    }

    pub(crate) fn answered(&self, locality: Locality) {
        self.by_locality[usize::from(locality.class())].inc();
    }
}
