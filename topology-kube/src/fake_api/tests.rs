//! The fake against what the real API server does, one behaviour each.

use std::{
    net::{IpAddr, Ipv4Addr},
    time::{Duration, Instant},
};

use futures::{StreamExt as _, TryStreamExt as _};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams, VersionMatch, WatchEvent, WatchParams,
};
use serde_json::{Value, json};

use super::{FakeApi, Resource};
use crate::objects;

fn service(n: u32) -> Value {
    let ip = IpAddr::V4(Ipv4Addr::from(0x0a60_0000 + n));
    objects::service("fidelity", &format!("svc-{n}"), ip, 80, "TCP", "http")
}

fn services(api: &FakeApi) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Service"));
    Api::all_with(api.client(), &resource)
}

fn names(list: &kube::core::ObjectList<DynamicObject>) -> Vec<String> {
    list.items.iter().map(|o| o.metadata.name.clone().unwrap_or_default()).collect()
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> kube::core::Status {
    match result {
        Err(kube::Error::Api(status)) => *status,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

async fn world(count: u32) -> FakeApi {
    let api = FakeApi::start().await;
    (1..=count).for_each(|n| api.apply(service(n)));
    api
}

#[tokio::test]
async fn a_lists_pages_are_one_snapshot_at_its_first_pages_version() {
    let api = world(5).await;
    let first = services(&api).list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first), ["svc-1", "svc-2"]);
    let version = first.metadata.resource_version.clone().unwrap();
    // Changes after the first page: none of them show in the rest of the list.
    api.delete(Resource::Services, "fidelity", "svc-4");
    api.apply(service(6));
    api.apply(service(3));
    let token = first.metadata.continue_.clone().unwrap();
    let second = services(&api).list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap();
    assert_eq!(names(&second), ["svc-3", "svc-4"], "svc-4 as it was, deleted later");
    assert_eq!(second.metadata.resource_version.as_ref(), Some(&version));
    let old = second.items[0].metadata.resource_version.clone().unwrap();
    assert!(old.parse::<u64>().unwrap() <= version.parse().unwrap(), "svc-3 before its later change");
    let token = second.metadata.continue_.clone().unwrap();
    let third = services(&api).list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap();
    assert_eq!(names(&third), ["svc-5"], "svc-6 was made after the snapshot");
    assert!(third.metadata.continue_.is_none_or(|c| c.is_empty()));
    let now = services(&api).list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&now), ["svc-1", "svc-2", "svc-3", "svc-5", "svc-6"]);
}

#[tokio::test]
async fn a_continue_token_expires_once_its_version_is_compacted() {
    let api = world(5).await;
    let first = services(&api).list(&ListParams::default().limit(2)).await.unwrap();
    api.delete(Resource::Services, "fidelity", "svc-5");
    api.compact();
    let token = first.metadata.continue_.clone().unwrap();
    let status = api_error(services(&api).list(&ListParams::default().limit(2).continue_token(&token)).await);
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"), "{status:?}");
    assert!(status.message.contains("continue parameter is too old"), "{}", status.message);
    // The 410's own token continues from the latest state: an inconsistent list, as offered.
    let raw = reqwest_like_get(&api, &format!("/api/v1/services?limit=2&continue={token}")).await;
    let inconsistent = raw["metadata"]["continue"].as_str().unwrap().to_owned();
    let rest = services(&api).list(&ListParams::default().limit(10).continue_token(&inconsistent)).await.unwrap();
    assert_eq!(names(&rest), ["svc-3", "svc-4"], "from the latest state: svc-5 is gone");
}

/// A GET answered with any status, its body as JSON.
async fn reqwest_like_get(api: &FakeApi, path_and_query: &str) -> Value {
    let request = hyper::Request::get(path_and_query).body(Vec::new()).unwrap();
    let text = match api.client().request_text(request).await {
        Ok(text) => text,
        Err(kube::Error::Api(status)) => return serde_json::to_value(*status).unwrap(),
        Err(other) => panic!("{other}"),
    };
    serde_json::from_str(&text).unwrap()
}

#[tokio::test]
async fn lists_honour_resource_version_and_its_match() {
    let api = world(3).await;
    let before = services(&api).list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    api.delete(Resource::Services, "fidelity", "svc-1");
    // 0: any version, from the watch cache, whole: the limit is not honoured.
    // (kube's ListParams drops `resourceVersion=0` beside a limit, so the request is written out.)
    let any = reqwest_like_get(&api, "/api/v1/services?limit=1&resourceVersion=0").await;
    let listed: Vec<&str> =
        any["items"].as_array().unwrap().iter().map(|i| i["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(listed, ["svc-2", "svc-3"]);
    assert!(any["metadata"]["continue"].is_null());
    // Exact: the state then, paged.
    let exact = ListParams::default().at(&before).matching(VersionMatch::Exact);
    let then = services(&api).list(&exact.clone().limit(2)).await.unwrap();
    assert_eq!(names(&then), ["svc-1", "svc-2"]);
    assert_eq!(then.metadata.resource_version.as_ref(), Some(&before));
    // NotOlderThan: at least that version, the latest the cache has.
    let newer = services(&api).list(&ListParams::default().at(&before).matching(VersionMatch::NotOlderThan)).await;
    assert_eq!(names(&newer.unwrap()), ["svc-2", "svc-3"]);
    // Compacted: Exact is gone.
    api.compact();
    let status = api_error(services(&api).list(&exact).await);
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"), "{status:?}");
    // Options the API server refuses.
    let refused = reqwest_like_get(&api, "/api/v1/services?resourceVersion=0&resourceVersionMatch=Exact").await;
    assert_eq!(refused["code"], 422, "{refused}");
    let raw = reqwest_like_get(&api, "/api/v1/services?resourceVersion=5&continue=1~a~b").await;
    assert_eq!(raw["code"], 400, "{raw}");
}

#[tokio::test]
async fn a_lagging_watch_cache_answers_a_newer_version_with_504_after_3_seconds() {
    let api = world(2).await;
    api.lag_cache(Some(0));
    api.apply(service(3));
    let latest = services(&api).list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&latest), ["svc-1", "svc-2", "svc-3"], "a consistent list reads etcd");
    let version = latest.metadata.resource_version.unwrap();
    let cached = services(&api).list(&ListParams::default().at("0")).await.unwrap();
    assert_eq!(names(&cached), ["svc-1", "svc-2"], "the cache is behind");
    let asked = Instant::now();
    let params = ListParams::default().at(&version).matching(VersionMatch::NotOlderThan);
    let status = api_error(services(&api).list(&params).await);
    assert!(asked.elapsed() >= Duration::from_millis(2900), "{:?}", asked.elapsed());
    assert_eq!((status.code, status.reason.as_str()), (504, "Timeout"), "{status:?}");
    let cause = &status.details.unwrap().causes[0];
    assert_eq!(cause.reason, "ResourceVersionTooLarge");
    api.lag_cache(None);
    assert_eq!(names(&services(&api).list(&params).await.unwrap()), ["svc-1", "svc-2", "svc-3"]);
}

async fn first_events(api: &FakeApi, params: &WatchParams, version: &str, count: usize) -> Vec<(String, String)> {
    let stream = services(api).watch(params, version).await.unwrap();
    let events: Vec<_> = stream.take(count).try_collect().await.unwrap();
    events
        .into_iter()
        .map(|event| match event {
            WatchEvent::Added(o) => ("ADDED".to_owned(), o.metadata.name.unwrap()),
            WatchEvent::Modified(o) => ("MODIFIED".to_owned(), o.metadata.name.unwrap()),
            WatchEvent::Deleted(o) => ("DELETED".to_owned(), o.metadata.name.unwrap()),
            WatchEvent::Bookmark(b) => ("BOOKMARK".to_owned(), b.metadata.resource_version),
            WatchEvent::Error(status) => ("ERROR".to_owned(), status.code.to_string()),
        })
        .collect()
}

#[tokio::test]
async fn a_watch_from_no_version_or_zero_starts_with_the_state_as_added_events() {
    let api = world(3).await;
    api.apply(service(2));
    api.delete(Resource::Services, "fidelity", "svc-1");
    let added = |names: &[&str]| names.iter().map(|n| ("ADDED".to_owned(), (*n).to_owned())).collect::<Vec<_>>();
    for version in ["", "0"] {
        let events = first_events(&api, &WatchParams::default(), version, 2).await;
        assert_eq!(events, added(&["svc-2", "svc-3"]), "from {version:?}: the state, no history");
    }
    let from_one = first_events(&api, &WatchParams::default(), "1", 4).await;
    let kinds: Vec<&str> = from_one.iter().map(|(kind, _)| kind.as_str()).collect();
    assert_eq!(kinds, ["ADDED", "ADDED", "MODIFIED", "DELETED"], "from 1: the changes after it");
}

#[tokio::test]
async fn bookmarks_come_at_the_cadence_and_2_seconds_before_the_deadline() {
    let api = world(1).await;
    let version = services(&api).list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    // At the real cadence (a minute) a 5 s watch gets its one bookmark at 3 s, then ends at 5 s.
    let started = Instant::now();
    let mut stream = services(&api).watch(&WatchParams::default().timeout(5), &version).await.unwrap().boxed();
    let first = stream.try_next().await.unwrap();
    assert!(matches!(first, Some(WatchEvent::Bookmark(_))), "{first:?}");
    let at = started.elapsed();
    assert!(at >= Duration::from_millis(2900) && at < Duration::from_millis(3900), "bookmark at {at:?}");
    assert!(stream.try_next().await.unwrap().is_none(), "then the end");
    assert!(started.elapsed() >= Duration::from_millis(4900));
    // A cadence of 1 s: bookmarks at 1, 2 and 3 s (the last one 2 s before the deadline).
    api.set_bookmark_cadence(Duration::from_secs(1));
    let started = Instant::now();
    let stream = services(&api).watch(&WatchParams::default().timeout(5), &version).await.unwrap();
    let times: Vec<Duration> = stream.map(|_| started.elapsed()).collect().await;
    let seconds: Vec<u64> = times.iter().map(|t| (t.as_millis() as u64 + 500) / 1000).collect();
    assert_eq!(seconds, [1, 2, 3], "{times:?}");
}

#[tokio::test]
async fn a_hung_watch_sends_no_headers_and_an_error_event_ends_a_stream() {
    let api = world(1).await;
    api.hang_watch_opens(true);
    let (watched, params) = (services(&api), WatchParams::default());
    let opening = watched.watch(&params, "1");
    assert!(tokio::time::timeout(Duration::from_secs(2), opening).await.is_err(), "no headers came");
    api.hang_watch_opens(false);
    let mut stream = services(&api).watch(&WatchParams::default(), "1").await.unwrap().boxed();
    api.error_watches(500);
    let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap();
    assert!(matches!(&event, Some(WatchEvent::Error(status)) if status.code == 500), "{event:?}");
    assert!(stream.try_next().await.unwrap().is_none(), "the stream ends after its ERROR");
}

fn event(name: &str) -> Value {
    json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "shop"},
        "eventTime": "2026-11-27T06:00:00.000000Z", "type": "Warning",
        "reason": "InvalidObject", "action": "ProgramDatapath", "note": "a problem",
        "reportingController": "topology-agent", "reportingInstance": "node-a",
        "regarding": {"kind": "Service", "namespace": "shop", "name": "web"}})
}

#[tokio::test]
async fn events_are_validated_as_events_k8s_io_v1_does() {
    let api = FakeApi::start().await;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk("events.k8s.io", "v1", "Event"));
    let events: Api<DynamicObject> = Api::namespaced_with(api.client(), "shop", &resource);
    let create = |value: Value| {
        let events = events.clone();
        async move { events.create(&PostParams::default(), &serde_json::from_value(value).unwrap()).await }
    };
    create(event("web.1")).await.expect("a valid Event");
    assert_eq!(api_error(create(event("web.1")).await).code, 409, "the same name twice");
    let mut bad = event("web.2");
    bad["reportingInstance"] = "n".repeat(129).into();
    bad["note"] = "é".repeat(600).into();
    bad.as_object_mut().unwrap().remove("action");
    bad["type"] = "Error".into();
    let status = api_error(create(bad).await);
    assert_eq!(status.code, 422, "{status:?}");
    let fields: Vec<String> = status.details.unwrap().causes.iter().map(|c| c.field.clone()).collect();
    assert_eq!(fields, ["reportingInstance", "action", "note", "type"], "each refused field named");
    let mut elsewhere = event("web.3");
    elsewhere["metadata"]["namespace"] = "other".into();
    assert_eq!(api_error(create(elsewhere).await).code, 400, "a namespace not the request's");
    // A series update (merge patch) is accepted; changing what the Event is about is not.
    let patch = |value: Value| {
        let events = events.clone();
        async move {
            let params = kube::api::PatchParams::default();
            events.patch("web.1", &params, &kube::api::Patch::Merge(value)).await
        }
    };
    let series = json!({"series": {"count": 2, "lastObservedTime": "2026-11-27T06:01:00.000000Z"}});
    patch(series).await.expect("a series update");
    assert_eq!(api.events()[0]["series"]["count"], 2);
    assert_eq!(api_error(patch(json!({"reason": "Other"})).await).code, 422, "reason is immutable");
    assert_eq!(api_error(patch(json!({"series": {"count": 1}})).await).code, 422, "a series counts from 2");
}

#[tokio::test]
async fn metadata_is_served_as_partial_object_metadata() {
    let api = world(2).await;
    let listed = services(&api).list_metadata(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 2);
    let request = hyper::Request::get("/api/v1/services")
        .header(hyper::header::ACCEPT, "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1")
        .body(Vec::new())
        .unwrap();
    let raw: Value = serde_json::from_str(&api.client().request_text(request).await.unwrap()).unwrap();
    assert_eq!(raw["kind"], "PartialObjectMetadataList");
    assert_eq!(raw["items"][0]["kind"], "PartialObjectMetadata");
    assert_eq!(raw["items"][0]["metadata"]["name"], "svc-1");
    assert!(raw["items"][0].get("spec").is_none(), "metadata only: {raw}");
    let version = listed.metadata.resource_version.unwrap();
    let mut stream = services(&api).watch_metadata(&WatchParams::default(), &version).await.unwrap().boxed();
    api.apply(service(3));
    let event = tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap();
    let Some(WatchEvent::Added(object)) = event else { panic!("{event:?}") };
    assert_eq!(object.metadata.name.as_deref(), Some("svc-3"));
}

#[tokio::test]
async fn field_selectors_narrow_lists_pages_and_watches() {
    let api = world(5).await;
    let one = ListParams::default().fields("metadata.name=svc-3");
    assert_eq!(names(&services(&api).list(&one).await.unwrap()), ["svc-3"]);
    // A limit counts selected objects: the page is full of them, not of what was passed over.
    let others = ListParams::default().fields("metadata.namespace=fidelity,metadata.name!=svc-1").limit(2);
    let page = services(&api).list(&others).await.unwrap();
    assert_eq!(names(&page), ["svc-2", "svc-3"]);
    let refused = api_error(services(&api).list(&ListParams::default().fields("spec.clusterIP=10.96.0.1")).await);
    assert_eq!((refused.code, refused.message.as_str()), (400, "field label not supported: spec.clusterIP"));

    let version = page.metadata.resource_version.clone().unwrap();
    let params = WatchParams::default().fields("metadata.name=svc-3").timeout(5);
    let stream = services(&api).watch(&params, &version).await.unwrap();
    api.apply(service(2));
    api.apply(service(3));
    api.delete(Resource::Services, "fidelity", "svc-3");
    let seen: Vec<String> = stream
        .take(2)
        .map_ok(|event| match event {
            WatchEvent::Modified(o) => format!("MODIFIED {}", o.metadata.name.unwrap_or_default()),
            WatchEvent::Deleted(o) => format!("DELETED {}", o.metadata.name.unwrap_or_default()),
            other => format!("{other:?}"),
        })
        .try_collect()
        .await
        .unwrap();
    assert_eq!(seen, ["MODIFIED svc-3", "DELETED svc-3"], "svc-2's change is not in this watch");
}
