//! Node status heartbeats, as kubelets without node leases send them: every Node's conditions get
//! a new `lastHeartbeatTime` once per period, spread evenly over it, each a MODIFIED watch event
//! carrying the whole Node.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use super::{FakeApi, Resource, store::Store};

/// How often the heartbeat task wakes; each wake updates the Nodes due by then.
const TICK: Duration = Duration::from_millis(2);

/// Heartbeats running until dropped.
pub struct Heartbeats {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Heartbeats {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeApi {
    /// Updates every Node's status once per `period` (inside a tokio runtime), until the returned
    /// guard is dropped. Nodes added later join the round.
    pub fn heartbeats(&self, period: Duration) -> Heartbeats {
        let (store, changes) = (Arc::clone(&self.store), self.changes.clone());
        let task = tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            // Heartbeats due so far: node `n` of `N` beats at period × (k + n / N).
            let mut beaten = 0u64;
            let mut ticks = tokio::time::interval(TICK);
            loop {
                ticks.tick().await;
                let version = beat_due(&store, started.elapsed(), period, &mut beaten);
                if let Some(version) = version {
                    changes.send_replace(version);
                }
            }
        });
        Heartbeats { task }
    }
}

/// Beats the Nodes due by `elapsed`; the last resourceVersion written, if any.
fn beat_due(store: &Mutex<Store>, elapsed: Duration, period: Duration, beaten: &mut u64) -> Option<u64> {
    let mut store = store.lock().expect("fake API store");
    let nodes = || {
        store
            .objects
            .range((Resource::Nodes, String::new(), String::new())..)
            .take_while(|(key, _)| key.0 == Resource::Nodes)
            .map(|(key, _)| key.clone())
    };
    let count = nodes().count() as u64;
    if count == 0 {
        return None;
    }
    let due = (elapsed.as_secs_f64() / period.as_secs_f64() * count as f64) as u64;
    // The Nodes due, in name order from where the last tick stopped, wrapping around.
    let start = (*beaten % count) as usize;
    let keys: Vec<_> = nodes().skip(start).chain(nodes()).take(due.saturating_sub(*beaten) as usize).collect();
    *beaten = due.max(*beaten);
    let now = rfc3339(SystemTime::now());
    let mut version = None;
    for key in keys {
        let Some(mut node) = store.objects.get(&key).map(|stored| stored.value.clone()) else { continue };
        if let Some(conditions) = node["status"]["conditions"].as_array_mut() {
            for condition in conditions {
                condition["lastHeartbeatTime"] = Value::from(now.as_str());
            }
        }
        version = Some(store.put(key, node));
    }
    version
}

/// `2026-11-26T01:02:03Z`, as the API server writes times.
pub fn rfc3339(at: SystemTime) -> String {
    let seconds = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, of_day) = ((seconds / 86_400) as i64, seconds % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era = (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 { shifted_month + 3 } else { shifted_month - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", of_day / 3600, of_day % 3600 / 60, of_day % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_as_the_api_writes_them() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400 + 3723)), "2000-02-29T01:02:03Z");
        assert_eq!(rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_651_200)), "2026-11-26T00:00:00Z");
    }
}
