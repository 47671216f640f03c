//! The Kubernetes source and the controller against the in-process fake API server, programming
//! the real writer over in-memory maps in place of the kernel. No root needed.
//!
//! Tier: fake-api (no root; the in-process fake API server, in parallel).

use std::{
    collections::{BTreeSet, HashMap},
    net::IpAddr,
    sync::Arc,
    time::{Duration, Instant},
};

use serde_json::Value;
use tokio_util::sync::CancellationToken;
use topology_agent::{
    controller::{Controller, ControllerConfig, ControllerError, Health, recording::MemoryKernel},
    metrics::Metrics,
};
use topology_kube::{
    EventReceiver, EventSender, Object, SourceEvent,
    events::KubeEvents,
    fake_api::{FakeApi, Resource},
    objects::{self, EndpointSpec},
    reflector::STALL,
    watch::KubeSource,
};
use topology_policy::desired::DesiredState;

struct Harness {
    api: FakeApi,
    kernel: MemoryKernel,
    health: Arc<Health>,
    shutdown: CancellationToken,
    controller: Option<std::thread::JoinHandle<Result<MemoryKernel, ControllerError>>>,
    _source: KubeSource,
}

impl Harness {
    async fn start(api: FakeApi, node: &str) -> Self {
        let shutdown = CancellationToken::new();
        let client = api.client();
        let (events, receiver) = EventSender::channel();
        let source = KubeSource::start(&client, Some(node), &events, &shutdown);
        let kernel = MemoryKernel::default();
        let health = Arc::new(Health::default());
        let (sink, _) = KubeEvents::start(client, node);
        let controller = Controller::new(
            ControllerConfig::new(node),
            kernel.clone(),
            Arc::clone(&health),
            Arc::new(Metrics::default()),
            Box::new(sink),
        );
        let token = shutdown.clone();
        let controller = std::thread::spawn(move || controller.run(&receiver, &token));
        Self { api, kernel, health, shutdown, controller: Some(controller), _source: source }
    }

    /// Waits until the programmed state satisfies `check`, or fails with `what`.
    async fn wait_for(&self, what: &str, check: impl Fn(&DesiredState) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if check(&self.kernel.record().current) {
                return;
            }
            let finished = self.controller.as_ref().is_some_and(|c| c.is_finished());
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
        self.shutdown.cancel();
        if let Some(controller) = self.controller.take() {
            let _ = controller.join();
        }
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
async fn adds_updates_and_deletes_of_every_kind_reach_the_desired_state() {
    let harness = Harness::start(world().await, "node-a").await;
    let api = &harness.api;
    harness.wait_for("the initial state", |d| backends(d, "10.96.0.10") == set(&["10.1.0.1"])).await;

    // Service: add, update, delete.
    api.apply(objects::service("default", "api", ip("10.96.0.20"), 80, "TCP", "http"));
    harness.wait_for("a new Service without endpoints refuses", |d| backends(d, "10.96.0.20") == set(&[])).await;
    let mut web = objects::service("default", "web", ip("10.96.0.10"), 80, "TCP", "http");
    web["spec"]["trafficDistribution"] = Value::Null;
    api.apply(web);
    harness
        .wait_for("the Service update (no preference)", |d| backends(d, "10.96.0.10") == set(&["10.1.0.1", "10.1.0.2"]))
        .await;
    api.delete(Resource::Services, "default", "api");
    harness.wait_for("the Service deletion", |d| backends(d, "10.96.0.20").is_none()).await;

    // EndpointSlice: add, update, delete.
    let specs = [EndpointSpec::new(ip("10.2.0.1"), "node-b")];
    api.apply(objects::slice("default", "web-2", "web", "http", 8080, "TCP", &specs));
    harness
        .wait_for("the second slice", |d| backends(d, "10.96.0.10") == set(&["10.1.0.1", "10.1.0.2", "10.2.0.1"]))
        .await;
    api.apply(web_slice(&[("10.1.0.3", "node-a")]));
    harness.wait_for("the slice update", |d| backends(d, "10.96.0.10") == set(&["10.1.0.3", "10.2.0.1"])).await;
    api.delete(Resource::EndpointSlices, "default", "web-1");
    api.delete(Resource::EndpointSlices, "default", "web-2");
    harness.wait_for("no endpoints: refuse", |d| backends(d, "10.96.0.10") == set(&[])).await;

    // This Node: a topology key on zones, the endpoints' zones as the EndpointSlice controller
    // writes them; moving this node into zone-b makes node-b's endpoint close.
    let mut web = objects::service("default", "web", ip("10.96.0.10"), 80, "TCP", "http");
    objects::annotate(&mut web, "topology-agent.io/topology-keys", "topology.kubernetes.io/zone");
    api.apply(web);
    let mut on_b = EndpointSpec::new(ip("10.1.0.2"), "node-b");
    on_b.zone = Some("zone-b".into());
    api.apply(objects::slice("default", "web-1", "web", "http", 8080, "TCP", &[on_b]));
    harness.wait_for("the hard zone key refuses", |d| backends(d, "10.96.0.10") == set(&[])).await;
    api.apply(objects::node("node-a", "zone-b", None, "4"));
    harness.wait_for("this node's new zone", |d| backends(d, "10.96.0.10") == set(&["10.1.0.2"])).await;

    // Other Nodes, watched while a topology key names a label only Nodes carry: node-b labelled
    // into this node's rack makes its endpoint close, its deletion far again.
    let racked = |name: &str, rack: Option<&str>| {
        let mut node = objects::node(name, "zone-b", None, "4");
        if let Some(rack) = rack {
            node["metadata"]["labels"]["example.com/rack"] = rack.into();
        }
        node
    };
    api.apply(racked("node-a", Some("r1")));
    let mut web = objects::service("default", "web", ip("10.96.0.10"), 80, "TCP", "http");
    objects::annotate(&mut web, "topology-agent.io/topology-keys", "example.com/rack");
    api.apply(web);
    harness.wait_for("node-b in no rack", |d| backends(d, "10.96.0.10") == set(&[])).await;
    api.apply(racked("node-b", Some("r1")));
    harness.wait_for("node-b in this node's rack", |d| backends(d, "10.96.0.10") == set(&["10.1.0.2"])).await;
    api.apply(racked("node-c", Some("r1")));
    api.delete(Resource::Nodes, "", "node-b");
    harness.wait_for("the node deletion", |d| backends(d, "10.96.0.10") == set(&[])).await;
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

#[tokio::test(flavor = "multi_thread")]
async fn a_burst_of_1000_slice_updates_converges_to_the_final_state() {
    let harness = Harness::start(world().await, "node-a").await;
    harness.wait_for("the initial state", |d| backends(d, "10.96.0.10") == set(&["10.1.0.1"])).await;
    let before = harness.applies();
    for round in 0..1000u32 {
        let address = format!("10.3.{}.{}", round / 250, round % 250 + 1);
        harness.api.apply(web_slice(&[(address.as_str(), "node-a"), ("10.1.0.2", "node-b")]));
    }
    harness.wait_for("the last update of the burst", |d| backends(d, "10.96.0.10") == set(&["10.3.3.250"])).await;
    let applies = harness.applies() - before;
    eprintln!("1000 updates programmed in {applies} applies");
    assert!(applies <= 1000, "never more applies than updates");
}

#[tokio::test(flavor = "multi_thread")]
async fn unusable_objects_are_skipped_reported_and_block_nothing() {
    let harness = Harness::start(world().await, "node-a").await;
    let api = &harness.api;
    harness.wait_for("the initial state", |d| backends(d, "10.96.0.10") == set(&["10.1.0.1"])).await;

    // A slice with a bad address: skipped, its last good version stays.
    let mut bad = web_slice(&[("10.1.0.9", "node-a")]);
    bad["endpoints"][0]["addresses"][0] = "10.1.0.999".into();
    api.apply(bad);
    // An invalid topology-keys annotation on another Service: ignored as a whole, reported.
    let mut api_service = objects::service("default", "api", ip("10.96.0.20"), 80, "TCP", "http");
    objects::annotate(&mut api_service, "topology-agent.io/topology-keys", "*,kubernetes.io/hostname");
    api.apply(api_service);
    let specs = [EndpointSpec::new(ip("10.4.0.1"), "node-b")];
    api.apply(objects::slice("default", "api-1", "api", "http", 8080, "TCP", &specs));
    harness.wait_for("the other Service, unblocked", |d| backends(d, "10.96.0.20") == set(&["10.4.0.1"])).await;
    assert_eq!(backends(&harness.kernel.record().current, "10.96.0.10"), set(&["10.1.0.1"]), "last good slice kept");

    let deadline = Instant::now() + Duration::from_secs(10);
    let reasons = loop {
        let reasons: HashMap<String, String> = api
            .events()
            .iter()
            .map(|e| {
                (e["reason"].as_str().unwrap_or_default().to_owned(), e["note"].as_str().unwrap_or_default().to_owned())
            })
            .collect();
        if reasons.contains_key("InvalidObject") && reasons.contains_key("IgnoredConfiguration") {
            break reasons;
        }
        assert!(Instant::now() < deadline, "Events not published: {:?}", api.events());
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let invalid = &reasons["InvalidObject"];
    assert!(
        invalid.contains("EndpointSlice default/web-1") && invalid.contains("endpoints[0].addresses[0]"),
        "{invalid}"
    );
    let ignored = &reasons["IgnoredConfiguration"];
    assert!(ignored.contains("topology-keys ignored") && ignored.contains("\"*\" must be the last key"), "{ignored}");
    let event = api.events().into_iter().find(|e| e["reason"] == "InvalidObject").unwrap();
    assert_eq!(event["regarding"]["kind"], "Service");
    assert_eq!(event["regarding"]["name"], "web");
    assert_eq!(event["type"], "Warning");

    // Fixing the slice replaces the last good version.
    api.apply(web_slice(&[("10.1.0.7", "node-a")]));
    harness.wait_for("the fixed slice", |d| backends(d, "10.96.0.10") == set(&["10.1.0.7"])).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_node_stops_the_controller_with_a_clear_error() {
    let mut harness = Harness::start(world().await, "node-z").await;
    let controller = harness.controller.take().unwrap();
    let result = tokio::task::spawn_blocking(move || controller.join().unwrap()).await.unwrap();
    let Err(error) = result else { panic!("an unknown node must stop the controller") };
    assert!(error.to_string().contains("node \"node-z\" is not in the cluster"), "{error}");
    assert_eq!(harness.applies(), 0, "nothing was programmed");
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

/// Up to `count` events other than freshness within `within`, off the async runtime.
async fn received(receiver: EventReceiver, count: usize, within: Duration) -> (EventReceiver, Vec<SourceEvent>) {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + within;
        let mut events = Vec::new();
        while events.len() < count {
            match receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok((_, SourceEvent::Fresh { .. } | SourceEvent::Stale { .. } | SourceEvent::Census(_))) => {}
                Ok((_, event)) => events.push(event),
                Err(_) => break,
            }
        }
        (receiver, events)
    })
    .await
    .expect("receiver")
}

#[tokio::test(flavor = "multi_thread")]
async fn node_heartbeats_stop_at_the_watch_and_a_label_change_does_not() {
    let api = FakeApi::start().await;
    for n in 0..20 {
        api.apply(topology_tests::scale::node(n));
    }
    let (events, receiver) = EventSender::channel();
    let shutdown = CancellationToken::new();
    let source = KubeSource::start(&api.client(), None, &events, &shutdown);
    drop(events);
    // Each kind's initial list: its start, then its one page as the replacement.
    let (receiver, lists) = received(receiver, 6, Duration::from_secs(10)).await;
    let replaced = lists.iter().filter(|e| matches!(e, SourceEvent::Replace { .. })).count();
    assert_eq!(replaced, 3, "{lists:?}");
    assert!(lists.iter().all(|e| matches!(e, SourceEvent::Replace { .. } | SourceEvent::Listing(_))), "{lists:?}");
    // Every Node beats five times: a MODIFIED event each, with nothing the agent reads changed.
    let heartbeats = api.heartbeats(Duration::from_millis(200));
    let beats = api.modifications(Resource::Nodes);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(api.modifications(Resource::Nodes) >= beats + 80, "the heartbeats ran");
    drop(heartbeats);
    let mut relabelled = topology_tests::scale::node(7);
    relabelled["metadata"]["labels"]["topology.kubernetes.io/zone"] = "europe-west1-x".into();
    api.apply(relabelled);
    let (_, after) = received(receiver, 2, Duration::from_secs(2)).await;
    match after.as_slice() {
        [SourceEvent::Apply(Object::Node(node))] => {
            assert_eq!((node.name.as_str(), node.zone()), ("gke-prod-pool-00007", Some("europe-west1-x")));
        }
        other => panic!("only the label change reaches the controller: {other:?}"),
    }
    shutdown.cancel();
    source.join().await;
}
