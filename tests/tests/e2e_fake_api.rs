//! The fake API server (`topology-kube/src/fake_api`, kept for the faults the real one cannot be
//! driven into) held to the real one (root): the same objects in both, the same list, pagination, field
//! selector, watch, compaction and too-new-resourceVersion requests sent to both, and the answers
//! compared once what must differ is set aside (resourceVersions, uids, tokens, timestamps). A
//! difference fails the test, so the fake cannot drift from the API server it stands in for.
//! `--test-threads=1`.
//!
//! Tier: cluster (root; the real kernel and control plane, one test at a time).

use std::time::Duration;

use futures::{AsyncBufReadExt as _, StreamExt as _};
use kube::Client;
use serde_json::{Value, json};
use topology_kube::fake_api::FakeApi;
use topology_tests::{
    kubernetes::{Binaries, Cluster, nodes::NodeSpec},
    require_root,
};

const NS: &str = "diff";

fn get(uri: &str) -> http::Request<Vec<u8>> {
    http::Request::get(uri).body(Vec::new()).expect("request")
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|item| match item["metadata"]["namespace"].as_str() {
            Some(namespace) => format!("{namespace}/{}", item["metadata"]["name"].as_str().unwrap_or_default()),
            None => item["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
        })
        .collect()
}

/// A list's answer, with what must differ set aside; its continue token and resourceVersion.
async fn list(client: &Client, uri: &str) -> (Value, Option<String>, String) {
    match client.request_text(get(uri)).await {
        Ok(text) => {
            let list: Value = serde_json::from_str(&text).expect("a list");
            let token = list["metadata"]["continue"].as_str().filter(|t| !t.is_empty()).map(str::to_owned);
            let version = list["metadata"]["resourceVersion"].as_str().unwrap_or_default().to_owned();
            let shape = json!({
                "code": 200, "names": names(&list), "continues": token.is_some(),
                "remainingItemCount": list["metadata"]["remainingItemCount"],
            });
            (shape, token, version)
        }
        Err(kube::Error::Api(status)) => {
            let causes: Vec<String> = status
                .details
                .iter()
                .flat_map(|details| details.causes.iter().map(|cause| cause.reason.clone()))
                .collect();
            let shape = json!({"code": status.code, "reason": status.reason, "causes": causes});
            (shape, None, String::new())
        }
        Err(other) => panic!("{uri}: {other}"),
    }
}

/// A watch's first `count` events other than bookmarks (or all until it ends or 10 s pass):
/// `[type, namespace/name]`, or `[ERROR, code, reason]`.
async fn watch(client: Client, uri: String, count: usize) -> Vec<Value> {
    let stream = client.request_stream(get(&uri)).await.unwrap_or_else(|e| panic!("{uri}: {e}"));
    let mut lines = stream.lines();
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while events.len() < count {
        let Ok(Some(Ok(line))) = tokio::time::timeout_at(deadline, lines.next()).await else { break };
        let event: Value = serde_json::from_str(&line).expect("a watch event");
        let object = &event["object"];
        match event["type"].as_str() {
            Some("BOOKMARK") => {}
            Some("ERROR") => events.push(json!(["ERROR", object["code"], object["reason"]])),
            Some(kind) => events.push(json!([kind, names(&json!({"items": [object]}))[0]])),
            None => panic!("{uri}: {line}"),
        }
    }
    events
}

/// The same objects in both: the real server's Services and Nodes, copied into the fake.
async fn mirror(real: &Client, fake: &FakeApi) {
    for uri in ["/api/v1/services", "/api/v1/nodes"] {
        let text = real.request_text(get(uri)).await.expect("list");
        let list: Value = serde_json::from_str(&text).expect("list");
        let kind = if uri.ends_with("services") { "Service" } else { "Node" };
        for mut item in list["items"].as_array().cloned().unwrap_or_default() {
            item["apiVersion"] = "v1".into();
            item["kind"] = kind.into();
            for field in ["resourceVersion", "uid", "creationTimestamp", "managedFields"] {
                item["metadata"].as_object_mut().expect("metadata").remove(field);
            }
            fake.apply(item);
        }
    }
}

fn service(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"ports": [{"name": "http", "port": 80}], "selector": {"app": name}},
    })
}

/// What each step answered, from both servers.
struct Comparison {
    steps: Vec<(String, Value, Value)>,
    since: std::time::Instant,
}

impl Comparison {
    fn record(&mut self, step: &str, real: Value, fake: Value) {
        eprintln!("{step} ({:.1} s):\n  real {real}\n  fake {fake}", self.since.elapsed().as_secs_f64());
        self.since = std::time::Instant::now();
        self.steps.push((step.to_owned(), real, fake));
    }

    fn differences(&self) -> Vec<String> {
        self.steps
            .iter()
            .filter(|(_, real, fake)| real != fake)
            .map(|(step, real, fake)| format!("{step}: the real API server answered {real}, the fake {fake}"))
            .collect()
    }
}

#[test]
fn the_fake_api_server_answers_as_the_real_one_does() {
    require_root!();
    let Some(binaries) = Binaries::or_skip(module_path!()) else { return };
    let mut cluster =
        Cluster::start(binaries, &[NodeSpec::new("node-a1", "zone-a"), NodeSpec::new("node-b1", "zone-b")]);
    cluster.namespace(NS);
    for name in ["a", "b", "c"] {
        cluster.apply(&service(name));
    }
    let real = cluster.admin();
    let (fake_api, fake_client) = cluster.api().block(async move {
        let fake = FakeApi::start().await;
        mirror(&real, &fake).await;
        let client = fake.client();
        (fake, client)
    });
    let both = |cluster: &Cluster, uri: &'static str| {
        let (real, fake) = (cluster.admin(), fake_client.clone());
        cluster.api().block(async move { (list(&real, uri).await, list(&fake, uri).await) })
    };
    let mut comparison = Comparison { steps: Vec::new(), since: std::time::Instant::now() };

    // Pagination: two pages of a paginated list, the second by its continue token.
    let ((real_first, real_token, _), (fake_first, fake_token, _)) = both(&cluster, "/api/v1/services?limit=2");
    comparison.record("a list of limit 2", real_first, fake_first);
    let (real, fake) = (cluster.admin(), fake_client.clone());
    let (real_second, fake_second) = cluster.api().block(async move {
        let next = |token: Option<String>| format!("/api/v1/services?limit=2&continue={}", token.unwrap_or_default());
        (list(&real, &next(real_token)).await.0, list(&fake, &next(fake_token)).await.0)
    });
    comparison.record("its second page", real_second, fake_second);
    // From the watch cache; field selectors.
    let ((real, ..), (fake, ..)) = both(&cluster, "/api/v1/services?resourceVersion=0&limit=2");
    comparison.record("a list at resourceVersion 0 with a limit", real, fake);
    let ((real, ..), (fake, ..)) = both(&cluster, "/api/v1/nodes?fieldSelector=metadata.name%3Dnode-a1");
    comparison.record("Nodes by metadata.name", real, fake);
    let ((real, ..), (fake, ..)) = both(&cluster, "/api/v1/services?fieldSelector=metadata.namespace%3Ddiff");
    comparison.record("Services by metadata.namespace", real, fake);

    // A watch from a list's resourceVersion sees exactly the changes after it; one from 0 begins
    // with every object as ADDED.
    let ((_, _, real_version), (_, _, fake_version)) = both(&cluster, "/api/v1/services");
    let (real, fake) = (cluster.admin(), fake_client.clone());
    let watch_uri =
        |version: &str| format!("/api/v1/services?watch=true&allowWatchBookmarks=true&resourceVersion={version}");
    let (real_watch, fake_watch) = (
        cluster.api().spawn(watch(real.clone(), watch_uri(&real_version), 2)),
        cluster.api().spawn(watch(fake.clone(), watch_uri(&fake_version), 2)),
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut changed = service("b");
    changed["metadata"]["annotations"] = json!({"changed": "yes"});
    cluster.apply(&changed);
    cluster.kubectl(&["-n", NS, "delete", "service", "c"]).expect("delete c");
    fake_api.apply(changed.clone());
    fake_api.delete(topology_kube::fake_api::Resource::Services, NS, "c");
    let (real_events, fake_events) =
        cluster.api().block(async move { (real_watch.await.expect("watch"), fake_watch.await.expect("watch")) });
    comparison.record("a watch from a list's resourceVersion", json!(real_events), json!(fake_events));
    let (real, fake) = (cluster.admin(), fake_client.clone());
    let (real_initial, fake_initial) = cluster.api().block(async move {
        let uri = "/api/v1/services?watch=true&resourceVersion=0".to_owned();
        (watch(real, uri.clone(), 3).await, watch(fake, uri, 3).await)
    });
    let sorted = |mut events: Vec<Value>| {
        events.sort_by_key(ToString::to_string);
        json!(events)
    };
    comparison.record("a watch from resourceVersion 0", sorted(real_initial), sorted(fake_initial));

    // Compaction: a continue token and a watch from before it both get 410. Kubernetes 1.35's
    // watch cache serves both from its own snapshots after an etcd compaction, so they expire
    // only once that cache is new — an API server restarted, as agents meet it; the fake's
    // compaction stands for both. Both revisions first move past everything handed out.
    let ((_, real_token, real_version), (_, fake_token, fake_version)) = both(&cluster, "/api/v1/services?limit=1");
    cluster.compact_etcd();
    cluster.restart(topology_tests::kubernetes::Component::ApiServer);
    fake_api.compact_past_everything();
    let (real, fake) = (cluster.admin(), fake_client.clone());
    let (real_expired, fake_expired) = cluster.api().block(async move {
        let next = |token: Option<String>| format!("/api/v1/services?limit=1&continue={}", token.unwrap_or_default());
        (list(&real, &next(real_token)).await.0, list(&fake, &next(fake_token)).await.0)
    });
    comparison.record("a continue token compacted away", real_expired, fake_expired);
    let (real, fake) = (cluster.admin(), fake_client.clone());
    let (real_gone, fake_gone) = cluster.api().block(async move {
        let uri = |version: &str| format!("/api/v1/services?watch=true&resourceVersion={version}");
        (watch(real, uri(&real_version), 1).await, watch(fake, uri(&fake_version), 1).await)
    });
    comparison.record("a watch from a compacted resourceVersion", json!(real_gone), json!(fake_gone));

    // A resourceVersion the cache has not reached: 504 after the cacher's wait.
    let ((real, ..), (fake, ..)) =
        both(&cluster, "/api/v1/services?resourceVersion=999999999&resourceVersionMatch=NotOlderThan");
    comparison.record("a resourceVersion from the future", real, fake);

    let differences = comparison.differences();
    assert!(differences.is_empty(), "the fake API server drifted from the real one:\n{}", differences.join("\n"));
    drop(fake_api);
}
