//! The Kubernetes source and the controller against the in-process fake API server, programming
//! the real writer over in-memory maps in place of the kernel, in the faults the real API server
//! cannot be driven into: a list held, a dropped connection or outage on demand, an object it
//! should have refused, a stalled watch, 429 and 403 answers, watches refused while lists work.
//! What the real one can show (every kind's changes, a burst, Events, an unknown node, Node
//! heartbeats) runs against it in `e2e_watch.rs` and `e2e_source.rs`. No root needed.
//!
//! Tier: fake-api (no root; the in-process fake API server, in parallel).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::Value;
use topology_agent::controller::{Health, recording::MemoryKernel};
use topology_kube::{
    fake_api::{FakeApi, Resource},
    objects::{self, EndpointSpec},
    reflector::STALL,
};
use topology_policy::desired::DesiredState;
use topology_tests::kubernetes::in_process::Watching;

struct Harness {
    api: FakeApi,
    kernel: MemoryKernel,
    health: Arc<Health>,
    watching: Watching,
}

impl Harness {
    async fn start(api: FakeApi, node: &str) -> Self {
        let watching = Watching::start(&api.client(), node);
        Self { kernel: watching.kernel.clone(), health: Arc::clone(&watching.health), api, watching }
    }

    /// Waits until the programmed state satisfies `check`, or fails with `what`.
    async fn wait_for(&self, what: &str, check: impl Fn(&DesiredState) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if check(&self.kernel.record().current) {
                return;
            }
            let finished = self.watching.controller.as_ref().is_some_and(|c| c.is_finished());
            assert!(!finished, "the controller stopped while waiting for {what}");
            assert!(Instant::now() < deadline, "timed out waiting for {what}: {:?}", self.kernel.record().current);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn wait_ready(&self, ready: bool) {
        // Past the longest backoff (30 s), which repeated failures reach and only two quiet
        // minutes reset.
        let deadline = Instant::now() + Duration::from_secs(45);
        while self.health.readiness().is_ok() != ready {
            assert!(Instant::now() < deadline, "readiness never became {ready}: {:?}", self.health.readiness());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn applies(&self) -> usize {
        self.kernel.record().applies()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        // The source's tasks end with the runtime.
        drop(self.watching.stop());
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Backend addresses programmed for a ClusterIP on port 80; `None` when it is not programmed.
fn backends(desired: &DesiredState, vip: &str) -> Option<BTreeSet<String>> {
    desired
        .services
        .iter()
        .find(|(port, _)| port.vip == ip(vip) && port.port == 80)
        .map(|(_, service)| service.backends.iter().map(|b| b.addr.to_string()).collect())
}

fn set(addresses: &[&str]) -> Option<BTreeSet<String>> {
    Some(addresses.iter().map(|a| (*a).to_owned()).collect())
}

/// Nodes a (zone-a, this node) and b (zone-b); Service web (PreferClose) with endpoints on both.
async fn world() -> FakeApi {
    let api = FakeApi::start().await;
    api.apply(objects::node("node-a", "zone-a", None, "4"));
    api.apply(objects::node("node-b", "zone-b", None, "4"));
    let mut web = objects::service("default", "web", ip("10.96.0.10"), 80, "TCP", "http");
    web["spec"]["trafficDistribution"] = "PreferClose".into();
    api.apply(web);
    api.apply(web_slice(&[("10.1.0.1", "node-a"), ("10.1.0.2", "node-b")]));
    api
}

fn web_slice(endpoints: &[(&str, &str)]) -> Value {
    let specs: Vec<EndpointSpec> = endpoints.iter().map(|(a, n)| EndpointSpec::new(ip(a), n)).collect();
    objects::slice("default", "web-1", "web", "http", 8080, "TCP", &specs)
}

#[tokio::test(flavor = "multi_thread")]
async fn nothing_is_programmed_before_all_three_lists_complete() {
    let api = world().await;
    api.hold(Resource::EndpointSlices);
    let harness = Harness::start(api, "node-a").await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(harness.applies(), 0, "programmed with Nodes and Services but no EndpointSlices");
    let readiness = harness.health.readiness().unwrap_err().to_string();
    assert!(readiness.contains("waiting for the initial list of EndpointSlice"), "{readiness}");

    harness.api.release(Resource::EndpointSlices);
    harness.wait_for("the first programming", |d| backends(d, "10.96.0.10") == set(&["10.1.0.1"])).await;
    harness.wait_ready(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn disconnects_outages_and_410_gone_converge() {
    let harness = Harness::start(world().await, "node-a").await;
    let api = &harness.api;
    harness.wait_for("the initial state", |d| backends(d, "10.96.0.10") == set(&["10.1.0.1"])).await;
    harness.wait_ready(true).await;

    // A dropped connection: the watch resumes from its resourceVersion and gets what it missed.
    api.abort_watches();
    api.apply(web_slice(&[("10.1.0.1", "node-a"), ("10.1.0.5", "node-a")]));
    harness
        .wait_for("the change made during the disconnect", |d| {
            backends(d, "10.96.0.10") == set(&["10.1.0.1", "10.1.0.5"])
        })
        .await;

    // An outage: the watchers cannot reconnect, the view is stale, the last good state stays.
    api.set_down(true);
    api.abort_watches();
    harness.wait_ready(false).await;
    let stale = harness.health.readiness().unwrap_err().to_string();
    assert!(stale.contains("view is stale") && stale.contains("watch"), "{stale}");
    api.set_down(false);
    api.apply(web_slice(&[("10.1.0.6", "node-a")]));
    harness.wait_for("the change made after the outage", |d| backends(d, "10.96.0.10") == set(&["10.1.0.6"])).await;
    harness.wait_ready(true).await;

    // History compacted: resuming gets 410 Gone, the watcher lists again and the state converges,
    // including a deletion it never saw as an event.
    let lists_before = api.lists(Resource::Services);
    api.apply(objects::service("default", "gone", ip("10.96.0.30"), 80, "TCP", "http"));
    harness.wait_for("the extra Service", |d| backends(d, "10.96.0.30").is_some()).await;
    api.set_down(true);
    api.abort_watches();
    harness.wait_ready(false).await;
    api.delete(Resource::Services, "default", "gone");
    api.compact();
    api.set_down(false);
    harness.wait_for("the relisted state without the deleted Service", |d| backends(d, "10.96.0.30").is_none()).await;
    assert!(api.lists(Resource::Services) > lists_before, "a 410 must make the watcher list again");
    assert_eq!(backends(&harness.kernel.record().current, "10.96.0.10"), set(&["10.1.0.6"]));
    harness.wait_ready(true).await;
}

/// An object the real API server would refuse (a skewed server, a mutating webhook's bug) cannot
/// be made there: this stays on the fake. Its ignored-annotation sibling runs on the real server
/// (`e2e_watch.rs`).
#[tokio::test(flavor = "multi_thread")]
async fn an_object_the_api_server_should_have_refused_is_skipped_reported_and_blocks_nothing() {
    let harness = Harness::start(world().await, "node-a").await;
    let api = &harness.api;
    harness.wait_for("the initial state", |d| backends(d, "10.96.0.10") == set(&["10.1.0.1"])).await;

    // A slice with a bad address: skipped, its last good version stays.
    let mut bad = web_slice(&[("10.1.0.9", "node-a")]);
    bad["endpoints"][0]["addresses"][0] = "10.1.0.999".into();
    api.apply(bad);
    // Another Service is not held up by it.
    api.apply(objects::service("default", "api", ip("10.96.0.20"), 80, "TCP", "http"));
    let specs = [EndpointSpec::new(ip("10.4.0.1"), "node-b")];
    api.apply(objects::slice("default", "api-1", "api", "http", 8080, "TCP", &specs));
    harness.wait_for("the other Service, unblocked", |d| backends(d, "10.96.0.20") == set(&["10.4.0.1"])).await;
    assert_eq!(backends(&harness.kernel.record().current, "10.96.0.10"), set(&["10.1.0.1"]), "last good slice kept");

    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        if let Some(event) = api.events().into_iter().find(|e| e["reason"] == "InvalidObject") {
            break event;
        }
        assert!(Instant::now() < deadline, "Events not published: {:?}", api.events());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let note = event["note"].as_str().unwrap_or_default();
    assert!(note.contains("EndpointSlice default/web-1") && note.contains("endpoints[0].addresses[0]"), "{note}");
    assert_eq!(event["regarding"]["kind"], "Service");
    assert_eq!(event["regarding"]["name"], "web");
    assert_eq!(event["type"], "Warning");

    // Fixing the slice replaces the last good version.
    api.apply(web_slice(&[("10.1.0.7", "node-a")]));
    harness.wait_for("the fixed slice", |d| backends(d, "10.96.0.10") == set(&["10.1.0.7"])).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_watch_is_stale_once_a_bookmark_is_late_and_fresh_again_once_it_resumes() {
    let harness = Harness::start(world().await, "node-a").await;
    harness.wait_ready(true).await;
    // At the real bookmark cadence a healthy, idle watch stays current: a bookmark a minute.
    let quiet = Instant::now() + STALL + Duration::from_secs(10);
    while Instant::now() < quiet {
        assert!(harness.health.readiness().is_ok(), "an idle watch was called stale between bookmarks");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Connections stay open and nothing comes: no event, no bookmark, no end.
    harness.api.stall(true);
    let stalled = Instant::now();
    let deadline = stalled + STALL + Duration::from_secs(10);
    let reason = loop {
        if let Err(reason) = harness.health.readiness() {
            break reason.to_string();
        }
        assert!(Instant::now() < deadline, "a stalled watch was not noticed within {:?}", deadline - stalled);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // Within STALL of the last bookmark, which came at most a cadence before the stall began.
    eprintln!("stall noticed after {:?}: {reason}", stalled.elapsed());
    assert!(reason.contains("view is stale"), "{reason}");
    harness.api.stall(false);
    harness.api.apply(web_slice(&[("10.1.0.9", "node-a")]));
    harness.wait_for("the change made after the stall", |d| backends(d, "10.96.0.10") == set(&["10.1.0.9"])).await;
    harness.wait_ready(true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_and_forbidden_are_named_in_readyz_and_retried_with_backoff() {
    let harness = Harness::start(world().await, "node-a").await;
    harness.wait_ready(true).await;
    let api = &harness.api;
    for (code, words) in [(429, "throttled by the API server (HTTP 429"), (403, "forbidden (HTTP 403)")] {
        api.fail_with(Some(code));
        api.abort_watches();
        harness.wait_ready(false).await;
        let before = api.requests();
        tokio::time::sleep(Duration::from_secs(6)).await;
        let reason = harness.health.readiness().unwrap_err().to_string();
        assert!(reason.contains(words), "{reason}");
        // Backing off (1, 2, 4 s ...): a handful of attempts per watch in 6 s, not a storm.
        let attempts = api.requests() - before;
        assert!(attempts <= 15, "{attempts} requests in 6 s while answered {code}");
        api.fail_with(None);
        harness.wait_ready(true).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_that_succeeds_does_not_make_a_failing_watch_fresh() {
    let harness = Harness::start(world().await, "node-a").await;
    harness.wait_ready(true).await;
    // Lists work, watches are refused (a ServiceAccount without `watch`, a broken proxy).
    let lists_before = harness.api.lists(Resource::Nodes);
    let requests_before = harness.api.requests();
    harness.api.fail_watches_with(Some(500));
    harness.api.abort_watches();
    harness.wait_ready(false).await;
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        let readiness = harness.health.readiness();
        assert!(readiness.is_err(), "the view was called current while its watches fail");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // A 5xx is transient: the watch is retried from its resourceVersion, nothing is listed again.
    assert_eq!(harness.api.lists(Resource::Nodes), lists_before, "no relist for a transient failure");
    // Three kinds' watches, each retried (refused watches are counted among all requests only).
    assert!(harness.api.requests() >= requests_before + 6, "the watches were retried");
    harness.api.fail_watches_with(None);
    harness.wait_ready(true).await;
}
