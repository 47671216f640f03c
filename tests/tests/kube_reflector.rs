//! The reflector's rules for a fleet, against the in-process fake API server (no root): a
//! transient failure (a reset, a 503, an in-stream 500, a watch whose response never begins)
//! resumes the watch without listing, only 410 Gone lists again, a lagging watch cache's 504 turns
//! a relist consistent, a 429's Retry-After is honoured, and many agents failing together retry
//! spread out, not in lockstep.
//!
//! Tier: fake-api (no root; the in-process fake API server, in parallel).

use std::{
    collections::BTreeSet,
    net::IpAddr,
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;
use topology_kube::{
    EventReceiver, EventSender, SourceEvent,
    fake_api::{FakeApi, Resource},
    objects::{self, EndpointSpec},
    reflector::WATCH_OPEN,
    watch::KubeSource,
};

const KINDS: [Resource; 3] = [Resource::Nodes, Resource::Services, Resource::EndpointSlices];

fn ip(text: &str) -> IpAddr {
    text.parse().expect("IP")
}

async fn world() -> FakeApi {
    let api = FakeApi::start().await;
    api.apply(objects::node("node-a", "zone-a", None, "4"));
    api.apply(objects::service("default", "web", ip("10.96.0.10"), 80, "TCP", "http"));
    let endpoints = [EndpointSpec::new(ip("10.1.0.1"), "node-a")];
    api.apply(objects::slice("default", "web-1", "web", "http", 8080, "TCP", &endpoints));
    api
}

/// `count` agents' watchers against `api`; each keeps its receiver (and so runs) while held.
fn agents(api: &FakeApi, count: usize, shutdown: &CancellationToken) -> Vec<(KubeSource, EventReceiver)> {
    (0..count)
        .map(|_| {
            let (events, receiver) = EventSender::channel();
            (KubeSource::start(&api.client(), Some("node-a"), &events, shutdown), receiver)
        })
        .collect()
}

/// Lists of each kind an agent makes when it starts: the Nodes' are a census of them and a list of
/// its own Node.
const FIRST_LISTS: [usize; 3] = [2, 1, 1];

fn lists(api: &FakeApi) -> [usize; 3] {
    KINDS.map(|kind| api.lists(kind))
}

fn watches(api: &FakeApi) -> usize {
    KINDS.iter().map(|kind| api.watches(*kind)).sum()
}

async fn until(what: &str, within: Duration, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transient_failure_resumes_the_watch_and_only_410_lists_again() {
    let api = world().await;
    let shutdown = CancellationToken::new();
    let _agents = agents(&api, 1, &shutdown);
    until("the first lists and watches", Duration::from_secs(10), || lists(&api) == FIRST_LISTS && watches(&api) >= 3)
        .await;
    // Rounds of 5 to 10 minutes, drawn for each watch as client-go's reflector draws them: a
    // fleet's watches do not come back in step.
    let rounds: Vec<u64> = api.watch_timeouts().into_iter().map(|t| t.expect("timeoutSeconds")).collect();
    assert!(rounds.iter().all(|t| (300..600).contains(t)), "{rounds:?}");
    assert!(rounds.windows(2).any(|pair| pair[0] != pair[1]), "drawn, not fixed: {rounds:?}");

    // A reset connection, then a 503 outage: each kind resumes its watch, nothing is listed.
    let before = watches(&api);
    api.abort_watches();
    until("the watches resumed", Duration::from_secs(10), || watches(&api) >= before + 3).await;
    api.set_down(true);
    api.abort_watches();
    tokio::time::sleep(Duration::from_secs(3)).await;
    api.set_down(false);
    let before = watches(&api);
    until("the watches back", Duration::from_secs(45), || watches(&api) >= before + 3).await;
    assert_eq!(lists(&api), FIRST_LISTS, "no relist for a reset or a 503");

    // What the watches resumed from was compacted away: 410 Gone, then a list of each kind.
    api.set_down(true);
    api.abort_watches();
    api.apply(objects::service("default", "late", ip("10.96.0.11"), 80, "TCP", "http"));
    api.compact();
    api.set_down(false);
    until("a relist after 410", Duration::from_secs(45), || lists(&api)[1] == 2).await;
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_watch_waits_what_retry_after_asks() {
    let api = world().await;
    let shutdown = CancellationToken::new();
    let _agents = agents(&api, 1, &shutdown);
    until("the first watches", Duration::from_secs(10), || watches(&api) >= 3).await;
    api.set_retry_after(5);
    api.fail_watches_with(Some(429));
    let started = Instant::now();
    api.abort_watches();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let asked = api.request_times().into_iter().filter(|at| *at > started).count();
    // Per kind: the attempt the abort caused, then one 5 s later at the earliest.
    assert!(asked <= 6, "{asked} requests in 8 s while every watch was told to retry after 5 s");
    assert_eq!(lists(&api), FIRST_LISTS, "a 429 is transient: no relist");
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn many_agents_failing_together_retry_spread_out() {
    let api = world().await;
    let shutdown = CancellationToken::new();
    let _agents = agents(&api, 20, &shutdown);
    until("every agent listed and watching", Duration::from_secs(30), || watches(&api) >= 60).await;
    // The API server goes away for 8 s under every agent at the same moment.
    api.set_down(true);
    let started = Instant::now();
    api.abort_watches();
    tokio::time::sleep(Duration::from_secs(8)).await;
    api.set_down(false);
    let retries: Vec<Duration> =
        api.request_times().into_iter().filter(|at| *at > started).map(|at| at - started).collect();
    // 60 watchers in lockstep would retry at 1, 3 and 7 s: a few instants. Drawn below their
    // backoff, they cover the outage.
    let instants: BTreeSet<u128> = retries.iter().map(|at| at.as_millis() / 100).collect();
    assert!(
        instants.len() >= 20,
        "{} retries fell in only {} tenths of a second of 80: {:?}",
        retries.len(),
        instants.len(),
        instants
    );
    shutdown.cancel();
}

/// The reasons of the staleness events `receiver` gets within `within`.
async fn stale_reasons(receiver: EventReceiver, within: Duration) -> (EventReceiver, Vec<String>) {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + within;
        let mut reasons = Vec::new();
        while let Ok((_, event)) = receiver.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if let SourceEvent::Stale { reason, .. } = event {
                reasons.push(reason);
            }
        }
        (receiver, reasons)
    })
    .await
    .expect("receiver")
}

/// One agent's watchers against `api`, once they listed and watch; its receiver.
async fn one_agent(api: &FakeApi) -> (CancellationToken, KubeSource, EventReceiver) {
    let shutdown = CancellationToken::new();
    let (source, receiver) = agents(api, 1, &shutdown).pop().expect("an agent");
    until("the first lists and watches", Duration::from_secs(10), || lists(api) == FIRST_LISTS && watches(api) >= 3)
        .await;
    (shutdown, source, receiver)
}

/// `receiver` once every kind's view was called current again, within `within`.
async fn fresh(receiver: EventReceiver, within: Duration) -> EventReceiver {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + within;
        let mut sources = BTreeSet::new();
        while sources.len() < KINDS.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            let (_, event) = receiver.recv_timeout(left).unwrap_or_else(|_| panic!("fresh only: {sources:?}"));
            if let SourceEvent::Fresh { source } = event {
                sources.insert(source);
            }
        }
        receiver
    })
    .await
    .expect("receiver")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_that_never_opens_or_ends_in_an_error_event_is_resumed() {
    let api = world().await;
    let (shutdown, source, receiver) = one_agent(&api).await;
    // A hung server or proxy: watches are taken and never answered, not even with headers.
    api.hang_watch_opens(true);
    api.abort_watches();
    let (receiver, reasons) = stale_reasons(receiver, WATCH_OPEN + Duration::from_secs(3)).await;
    let hung = format!("a watch did not open within {} s", WATCH_OPEN.as_secs());
    assert!(reasons.contains(&hung), "{reasons:?}");
    api.hang_watch_opens(false);
    // The server ends each watch with an in-stream ERROR (its watch of etcd failed): a 500 is
    // transient, so the watches resume; a 410 lists again.
    let receiver = fresh(receiver, Duration::from_secs(30)).await;
    let before = watches(&api);
    api.error_watches(500);
    until("the watches resumed after the ERROR", Duration::from_secs(45), || watches(&api) >= before + 3).await;
    assert_eq!(lists(&api), FIRST_LISTS, "no relist for a hung open or an in-stream 500");
    let (receiver, reasons) = stale_reasons(receiver, Duration::from_millis(200)).await;
    assert!(reasons.iter().any(|r| r.contains("HTTP 500 InternalError")), "{reasons:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    api.error_watches(410);
    until("a relist after an in-stream 410", Duration::from_secs(45), || lists(&api) == FIRST_LISTS.map(|n| n + 1))
        .await;
    drop((source, receiver));
    shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_relist_the_lagging_watch_cache_cannot_serve_is_made_consistent() {
    let api = world().await;
    let (shutdown, source, receiver) = one_agent(&api).await;
    for n in 0..5u8 {
        api.apply(objects::service("default", &format!("more-{n}"), ip(&format!("10.96.1.{n}")), 80, "TCP", "http"));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // The agent is at the latest version; the replica it reaches next lags five changes behind.
    // A refusal that is not transient (403) relists from the cache at the agent's version: 504
    // after 3 s, and the next relist is a consistent one, which the replica serves from etcd.
    api.lag_cache(Some(5));
    api.fail_watches_with(Some(403));
    api.abort_watches();
    until("a consistent relist despite the lagging cache", Duration::from_secs(30), || lists(&api)[1] >= 2).await;
    let (receiver, reasons) = stale_reasons(receiver, Duration::from_millis(200)).await;
    assert!(reasons.iter().any(|r| r.contains("HTTP 504 Timeout: Too large resource version")), "{reasons:?}");
    api.fail_watches_with(None);
    api.lag_cache(None);
    drop((source, receiver));
    shutdown.cancel();
}
