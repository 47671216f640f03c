//! The Kubernetes source's lists against the in-process fake API server, where a list can be held
//! between its pages while its snapshot is compacted away: a list whose continue token expired
//! starts over at once as one request. (Pages and whole relists on the real API server:
//! `e2e_source.rs`.) No root needed.
//!
//! Tier: fake-api (no root; the in-process fake API server, in parallel).

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use tokio_util::sync::CancellationToken;
use topology_kube::{
    EventReceiver, EventSender, SourceEvent,
    fake_api::{FakeApi, Resource},
    objects,
    watch::KubeSource,
};
use topology_model::Kind;

/// More than two pages of 500.
const SERVICES: usize = 1_200;

fn service(index: usize) -> serde_json::Value {
    let vip = IpAddr::V4(Ipv4Addr::new(10, 96, (index / 250) as u8, (index % 250) as u8 + 1));
    objects::service("default", &format!("svc-{index:04}"), vip, 80, "TCP", "http")
}

/// The Service events (not freshness or staleness) until `replaced` Service replacements came.
async fn service_events(receiver: EventReceiver, replaced: usize) -> (EventReceiver, Vec<SourceEvent>) {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut events = Vec::new();
        let mut seen = 0;
        while seen < replaced {
            let left = deadline.saturating_duration_since(Instant::now());
            let (_, event) = receiver.recv_timeout(left).unwrap_or_else(|_| panic!("only {events:?}"));
            let kind = match &event {
                SourceEvent::Listing(kind) | SourceEvent::ListPage { kind, .. } => *kind,
                SourceEvent::Replace { kind, .. } => {
                    seen += usize::from(*kind == Kind::Service);
                    *kind
                }
                SourceEvent::Apply(object) => object.id().kind(),
                SourceEvent::Stale { source, .. } if source.starts_with("Service") => Kind::Service,
                _ => continue,
            };
            if kind == Kind::Service {
                events.push(event);
            }
        }
        (receiver, events)
    })
    .await
    .expect("receiver")
}

/// What a list event is: its shape and how many objects it carries.
fn shape(event: &SourceEvent) -> (&'static str, usize) {
    match event {
        SourceEvent::Listing(_) => ("listing", 0),
        SourceEvent::ListPage { objects, .. } => ("page", objects.len()),
        SourceEvent::Replace { objects, .. } => ("replace", objects.len()),
        SourceEvent::Stale { .. } => ("stale", 0),
        _ => ("other", 0),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_list_whose_continue_token_expired_starts_over_whole_at_once() {
    let api = FakeApi::start().await;
    api.apply(objects::node("node-a", "zone-a", None, "4"));
    for index in 0..SERVICES {
        api.apply(service(index));
    }
    // The first page is read; the second waits while the snapshot is compacted away (a list
    // slower than etcd's compaction interval), and one Service of the first page goes.
    api.hold_continues(Resource::Services);
    let (events, receiver) = EventSender::channel();
    let shutdown = CancellationToken::new();
    let source = KubeSource::start(&api.client(), Some("node-a"), &events, &shutdown);
    drop(events);
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.lists(Resource::Services) == 0 {
        assert!(Instant::now() < deadline, "the list did not begin");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    api.delete(Resource::Services, "default", "svc-0001");
    api.compact();
    let asked = Instant::now();
    api.release(Resource::Services);
    let (_, initial) = service_events(receiver, 1).await;
    let shapes: Vec<_> = initial.iter().map(shape).collect();
    // The first page was still decoding while the second was asked for: void, it is never sent.
    // The restart begins a new listing (dropping any page sent), so a Service deleted meanwhile
    // cannot survive it, and ends it whole.
    assert_eq!(shapes, [("listing", 0), ("listing", 0), ("replace", SERVICES - 1)]);
    assert!(!shapes.contains(&("stale", 0)), "an expired token is no failure of the view");
    assert!(asked.elapsed() < Duration::from_secs(1), "started over at once, not after a backoff");
    assert_eq!(api.lists(Resource::Services), 2, "the first list and the one that replaced it");
    shutdown.cancel();
    source.join().await;
}
