//! What one tenant's Services cost every node, measured by a counting allocator: an annotation is
//! bounded before it is split or copied, its warnings stay small, and spillover over thousands of
//! made-up zones is declined instead of solved as a zones × zones matrix.

use std::{
    alloc::{GlobalAlloc, Layout, System},
    sync::atomic::{AtomicUsize, Ordering},
};

use serde_json::{Value, json};
use topology_model::{ObjectKey, yaml};
use topology_policy::plan::NodePlan;

/// The system allocator, counting the bytes live and the most live at once.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to the system allocator unchanged; only counters are added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as the caller promised for `layout`.
        let pointer = unsafe { System.alloc(layout) };
        if !pointer.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        pointer
    }

    unsafe fn dealloc(&self, pointer: *mut u8, layout: Layout) {
        // SAFETY: as the caller promised.
        unsafe { System.dealloc(pointer, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Bytes live now.
fn live() -> usize {
    LIVE.load(Ordering::Relaxed)
}

/// Runs `f`; the most bytes live at once during it, above what was live before.
fn peak_during<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let before = live();
    PEAK.store(before, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed) - before)
}

const MIB: usize = 1 << 20;

fn node(zone: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "node-a", "labels": {"topology.kubernetes.io/zone": zone}},
        "status": {"allocatable": {"cpu": "4"}, "conditions": [{"type": "Ready", "status": "True"}]}
    })
}

fn service(name: &str, ip: &str, annotations: Value, ports: usize) -> Value {
    let ports: Vec<Value> = (0..ports).map(|p| json!({"name": format!("p{p}"), "port": 1000 + p})).collect();
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": "tenant", "annotations": annotations},
        "spec": {"clusterIP": ip, "ports": ports}
    })
}

fn slice(service: &str, ports: usize, endpoints: Vec<Value>) -> Value {
    let ports: Vec<Value> = (0..ports).map(|p| json!({"name": format!("p{p}"), "port": 8000 + p})).collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-1"), "namespace": "tenant",
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "ports": ports, "endpoints": endpoints
    })
}

fn list(items: Vec<Value>) -> String {
    serde_json::to_string(&json!({"apiVersion": "v1", "kind": "List", "items": items})).unwrap()
}

#[test]
fn a_tenants_annotations_and_zones_cost_every_node_little() {
    // 40 Services each with a 250 KiB topology-keys annotation of 125,000 keys and 100 KiB spillover
    // and topology-mode values, 20 ports each: every value lands in every port's warnings.
    let keys = "a,".repeat(125_000);
    let junk = "x".repeat(100 << 10);
    let annotations = json!({
        "topology-agent.io/topology-keys": keys,
        "topology-agent.io/spillover": junk,
        "topology-agent.io/max-overload": junk,
        "service.kubernetes.io/topology-mode": junk,
        "topology-agent.io/not-read": junk,
    });
    let mut items = vec![node("zone-a")];
    for n in 0..40 {
        let name = format!("svc-{n}");
        items.push(service(&name, &format!("10.96.1.{n}"), annotations.clone(), 20));
        let endpoint = json!({"addresses": [format!("10.244.1.{n}")], "nodeName": "node-a", "zone": "zone-a"});
        items.push(slice(&name, 20, vec![endpoint]));
    }
    let text = list(items);
    let before = live();
    let state = yaml::parse(&text, "tenant.yaml").expect("the cluster parses");
    let kept = live() - before;
    drop(text);
    let before = live() - kept;
    assert!(kept < 2 * MIB, "the cluster state keeps {kept} bytes for 40 Services (their text was 14 MiB)");

    let (plan, peak) = peak_during(|| NodePlan::build(&state, "node-a", None).expect("a plan"));
    let retained = live().saturating_sub(before + kept);
    assert!(retained < 4 * MIB, "the plan keeps {retained} bytes");
    assert!(peak < 16 * MIB, "deciding took {peak} bytes at most");
    eprintln!("40 Services: state {kept} B, plan {retained} B, deciding's peak {peak} B");
    let decisions = plan.selections(&ObjectKey::new("tenant", "svc-0"));
    assert_eq!(decisions.len(), 20);
    for warning in decisions.iter().flat_map(|d| &d.selection.warnings) {
        assert!(warning.len() < 400, "a warning of {} bytes: {}…", warning.len(), &warning[..200]);
    }
    let warnings = &decisions[0].selection.warnings;
    assert!(warnings.iter().any(|w| w.contains("125001 keys; at most 16")), "{warnings:?}");
    drop((plan, state));

    // One Service with spillover over 6,000 zones, one endpoint each, in a slice the tenant wrote.
    let endpoints: Vec<Value> = (0..6000)
        .map(|n| json!({"addresses": [format!("10.245.{}.{}", n / 250, n % 250)], "zone": format!("zone-{n}")}))
        .collect();
    let text = list(vec![
        node("zone-0"),
        service("wide", "10.96.2.1", json!({"topology-agent.io/spillover": "capacity"}), 1),
        slice("wide", 1, endpoints),
    ]);
    let state = yaml::parse(&text, "zones.yaml").expect("the cluster parses");
    drop(text);
    let (plan, peak) = peak_during(|| NodePlan::build(&state, "node-a", None).expect("a plan"));
    assert!(peak < 32 * MIB, "spillover over 6,000 zones took {peak} bytes (a 6,000² matrix is 288 MB)");
    eprintln!("6,000 zones: deciding's peak {peak} B");
    let decision = &plan.selections(&ObjectKey::new("tenant", "wide"))[0];
    assert!(
        decision.selection.reason.contains("6000 zones in scope; spillover balances at most 128"),
        "{}",
        decision.selection.reason
    );
    assert_eq!(decision.selection.backends.len(), 6000, "declined, it balances every endpoint equally");
}
