//! What crossing zones costs, per Service port, from the bytes the kernel counted (see
//! `controller::accounting`): the bytes kept in this node's zone, those that crossed, and those
//! that would have crossed under the default policy (every endpoint of the port's own set equally
//! likely: `plan::NodePlan::baseline_in_zone`), so what the routing saved is per Service and
//! measured against the same traffic. Rates are taken over the last hour (or since the agent
//! started): `topology-agent status --cost` prints them as dollars a day.

use std::{
    collections::{BTreeMap, VecDeque},
    sync::atomic::AtomicU64,
    time::{Duration, Instant},
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
};
use serde::{Deserialize, Serialize};

/// Bytes of one Service port since the agent started, both directions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceBytes {
    /// To and from backends in this node's zone.
    pub in_zone: u64,
    /// To and from backends in another zone.
    pub cross_zone: u64,
    /// What would have crossed zones under the default policy.
    pub baseline_cross_zone: f64,
}

impl ServiceBytes {
    fn add(&mut self, other: &Self) {
        self.in_zone += other.in_zone;
        self.cross_zone += other.cross_zone;
        self.baseline_cross_zone += other.baseline_cross_zone;
    }
}

/// How often a snapshot is kept for the rates, and how many.
const SNAPSHOT_EVERY: Duration = Duration::from_secs(300);
const SNAPSHOTS: usize = 13;

/// The totals per Service port, and snapshots of them for the rates.
#[derive(Debug, Default)]
pub struct CostBook {
    totals: BTreeMap<String, ServiceBytes>,
    snapshots: VecDeque<(Instant, BTreeMap<String, ServiceBytes>)>,
}

impl CostBook {
    /// Adds what each Service port gained at `now`.
    pub fn add(&mut self, gained: &BTreeMap<String, ServiceBytes>, now: Instant) {
        if self.snapshots.is_empty() {
            // The first reading: rates start here.
            self.snapshots.push_back((now, self.totals.clone()));
        }
        for (service, bytes) in gained {
            self.totals.entry(service.clone()).or_default().add(bytes);
        }
        if self.snapshots.back().is_some_and(|(at, _)| now.duration_since(*at) >= SNAPSHOT_EVERY) {
            self.snapshots.push_back((now, self.totals.clone()));
            while self.snapshots.len() > SNAPSHOTS {
                self.snapshots.pop_front();
            }
        }
    }

    /// The report at `now`: totals, and rates since the oldest snapshot kept.
    pub fn report(&self, now: Instant) -> CostReport {
        let (since, before) = self.snapshots.front().map_or((now, None), |(at, totals)| (*at, Some(totals)));
        let window = now.duration_since(since).as_secs_f64();
        let per_second = |now: f64, then: f64| if window > 0.0 { (now - then).max(0.0) / window } else { 0.0 };
        let services = self
            .totals
            .iter()
            .map(|(service, total)| {
                let then = before.and_then(|b| b.get(service)).copied().unwrap_or_default();
                CostRow {
                    service: service.clone(),
                    total: *total,
                    cross_zone_per_second: per_second(total.cross_zone as f64, then.cross_zone as f64),
                    baseline_cross_zone_per_second: per_second(total.baseline_cross_zone, then.baseline_cross_zone),
                }
            })
            .collect();
        CostReport { window_seconds: window, services }
    }
}

/// One Service port's bytes and rates.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CostRow {
    /// `namespace/name:port`, or `other`.
    pub service: String,
    /// Since the agent started.
    pub total: ServiceBytes,
    /// Bytes a second that crossed zones, over the window.
    pub cross_zone_per_second: f64,
    /// Bytes a second that would have crossed under the default policy, over the window.
    pub baseline_cross_zone_per_second: f64,
}

/// What `/debug/cost` answers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CostReport {
    /// The seconds the rates are taken over (up to an hour).
    pub window_seconds: f64,
    /// Every Service port that moved bytes, by name.
    pub services: Vec<CostRow>,
}

/// The table's last line: what a UDP port's bytes mean.
pub const UDP_NOTE: &str = "UDP ports count what their clients sent, delivered or not: an upper bound of what crossed \
                            (TCP's bytes are acknowledged ones; see docs/cost.md)\n";

const GB: f64 = 1e9;
const DAY: f64 = 86_400.0;

impl CostReport {
    /// The table `status --cost` prints, at `price` dollars per GB each way (a byte crossing
    /// zones is billed leaving one and entering the other: twice), the costliest Service first.
    pub fn table(&self, price: f64) -> String {
        use std::fmt::Write as _;
        let mut rows: Vec<&CostRow> = self.services.iter().collect();
        rows.sort_by(|a, b| b.cross_zone_per_second.total_cmp(&a.cross_zone_per_second));
        let day = |bytes_per_second: f64| bytes_per_second * DAY / GB * 2.0 * price;
        let mut out = format!(
            "cross-zone traffic at ${price}/GB each way, rates over the last {:.0} min\n{:<44} {:>12} {:>14} {:>10} {:>14}\n",
            self.window_seconds / 60.0,
            "SERVICE",
            "GB IN ZONE",
            "GB CROSS ZONE",
            "$ / DAY",
            "$ SAVED / DAY"
        );
        for row in rows {
            let saved = row.baseline_cross_zone_per_second - row.cross_zone_per_second;
            let _ = writeln!(
                out,
                "{:<44} {:>12.3} {:>14.3} {:>10.2} {:>14.2}",
                row.service,
                row.total.in_zone as f64 / GB,
                row.total.cross_zone as f64 / GB,
                day(row.cross_zone_per_second),
                day(saved),
            );
        }
        // UDP (`--byte-accounting all`) is counted where the socket accepts a datagram: what
        // the clients sent, delivered or not. TCP's counts are acknowledged bytes.
        out.push_str(UDP_NOTE);
        out
    }
}

/// Labels of the bytes of a Service port between this node's zone and a backend's.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct BytesLabels {
    /// `namespace/name:port`, or `other` beyond the series cap.
    pub service: String,
    /// This node's zone (empty without one).
    pub from_zone: String,
    /// The backend's zone (empty when it has none or is no longer known).
    pub to_zone: String,
    /// `to_backend` (sent by the clients) or `from_backend`.
    pub direction: &'static str,
}

/// Labels of a Service port.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabels {
    /// `namespace/name:port`, or `other` beyond the series cap.
    pub service: String,
}

topology_metrics::metrics! {
    /// The bytes counted and what they cost.
    pub struct ByteMetrics;
    exported {
        pub counted: Family<BytesLabels, Counter> = Default::default(),
            "bytes",
            "Bytes of the TCP connections the hooks rewrote, per Service port, this node's zone, the backend's zone \
             and direction (counted by the kernel: at each connection's end, and every 10 s while open)";
        pub cross_zone: Family<ServiceLabels, Counter> = Default::default(),
            "cross_zone_bytes",
            "Bytes of the TCP connections the hooks rewrote that crossed from this node's zone to another, both \
             directions, per Service port";
        pub cross_zone_baseline: Family<ServiceLabels, Counter<f64, AtomicU64>> = Default::default(),
            "cross_zone_bytes_baseline",
            "Bytes the same connections would have sent across zones under the default policy (every endpoint of \
             the port equally likely): the baseline minus cross_zone_bytes is what the routing saved";
    }
    nested {}
    own {
        /// The same bytes summed per Service port, with rates, for `/debug/cost`.
        pub cost: std::sync::Mutex<CostBook> = Default::default();
    }
}

impl ByteMetrics {
    /// Adds a reading of the bytes counted: per label set, and per Service port.
    pub fn add(
        &self,
        labels: &std::collections::BTreeMap<BytesLabels, u64>,
        services: &std::collections::BTreeMap<String, ServiceBytes>,
    ) {
        for (labels, bytes) in labels {
            self.counted.get_or_create(labels).inc_by(*bytes);
        }
        for (service, bytes) in services {
            let labels = ServiceLabels { service: service.clone() };
            self.cross_zone.get_or_create(&labels).inc_by(bytes.cross_zone);
            self.cross_zone_baseline.get_or_create(&labels).inc_by(bytes.baseline_cross_zone);
        }
        let mut cost = self.cost.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        cost.add(services, std::time::Instant::now());
    }

    /// Removes the byte series of ports that lost their place to busier ones (and their
    /// cross-zone series: a port's `to_zone` series name it).
    pub fn retire(&self, labels: &[BytesLabels]) {
        for series in labels {
            self.counted.remove(series);
            let service = ServiceLabels { service: series.service.clone() };
            self.cross_zone.remove(&service);
            self.cross_zone_baseline.remove(&service);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gained(in_zone: u64, cross_zone: u64, baseline: f64) -> BTreeMap<String, ServiceBytes> {
        BTreeMap::from([(
            "shop/api:http".to_owned(),
            ServiceBytes { in_zone, cross_zone, baseline_cross_zone: baseline },
        )])
    }

    #[test]
    fn rates_are_taken_over_the_window_and_saved_is_what_the_default_would_have_crossed_less() {
        let start = Instant::now();
        let mut book = CostBook::default();
        book.add(&gained(0, 0, 0.0), start);
        // 10 minutes: 9 GB kept in zone, 1 GB crossed; the default would have crossed 6.
        book.add(&gained(9_000_000_000, 1_000_000_000, 6e9), start + Duration::from_secs(600));
        let report = book.report(start + Duration::from_secs(600));
        assert_eq!(report.window_seconds, 600.0);
        let row = &report.services[0];
        assert_eq!((row.total.in_zone, row.total.cross_zone), (9_000_000_000, 1_000_000_000));
        assert!((row.cross_zone_per_second - 1e9 / 600.0).abs() < 1e-3);
        let table = report.table(0.01);
        // 1 GB per 10 min is 144 GB a day, $2.88 at $0.01 each way; the default would have cost
        // 6 times that.
        assert!(table.contains("2.88") && table.contains("14.40"), "{table}");
        assert!(table.ends_with(UDP_NOTE), "the table says what a UDP figure means: {table}");
    }

    #[test]
    fn only_the_last_hour_counts_for_the_rates() {
        let start = Instant::now();
        let mut book = CostBook::default();
        for minute in 0..=120u64 {
            // Crossing 1 GB a minute in the first hour, nothing after.
            let cross = if minute > 0 && minute <= 60 { 1_000_000_000 } else { 0 };
            book.add(&gained(0, cross, cross as f64), start + Duration::from_secs(60 * minute));
        }
        let report = book.report(start + Duration::from_secs(7200));
        assert!(report.window_seconds <= 3600.0 + 300.0, "{}", report.window_seconds);
        assert_eq!(report.services[0].cross_zone_per_second, 0.0);
        assert_eq!(report.services[0].total.cross_zone, 60_000_000_000);
    }
}
