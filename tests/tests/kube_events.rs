//! The agent's Events against the in-process fake API server, which validates them as
//! `events.k8s.io/v1` does: what a real cluster would refuse is refused here too. No root needed.
//!
//! Tier: fake-api (no root; the in-process fake API server, in parallel).

use std::time::{Duration, Instant};

use topology_kube::{
    events::{KubeEvents, Problem, ProblemSink as _},
    fake_api::FakeApi,
};
use topology_model::ObjectKey;

async fn published(api: &FakeApi, count: usize) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.events().len() < count {
        assert!(Instant::now() < deadline, "Events not accepted: {:?}", api.events());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    api.events()
}

#[tokio::test(flavor = "multi_thread")]
async fn events_are_accepted_from_a_node_with_the_longest_name_and_repeats_become_a_series() {
    let api = FakeApi::start().await;
    // A node name may be 253 characters; `reportingInstance` at most 128.
    let node = format!("{}.example.internal", "n".repeat(230));
    let (sink, _task) = KubeEvents::start(api.client(), &node);
    let problem = Problem {
        service: ObjectKey::new("shop", "web"),
        reason: "InvalidObject",
        message: format!("spec.ports[0].port: {}", "é".repeat(900)),
    };
    sink.publish(&problem);
    let events = published(&api, 1).await;
    let event = &events[0];
    assert_eq!(event["regarding"]["name"], "web");
    assert!(node.starts_with(event["reportingInstance"].as_str().unwrap()));
    assert!(event["note"].as_str().unwrap().len() <= 1024);
    // The same problem again: the recorder patches the Event's series, which must validate too.
    sink.publish(&problem);
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.events()[0]["series"]["count"] != 2 {
        assert!(Instant::now() < deadline, "no series: {:?}", api.events());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(api.events().len(), 1, "one Event, counted");
}
