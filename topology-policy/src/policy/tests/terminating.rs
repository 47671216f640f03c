//! The serving-and-terminating fallback in every mode: no preference (kube-proxy's rule, a best
//! effort not to drop connections), only a hard scope the Service wrote.

use topology_model::{Endpoint, Service};

use super::world::*;
use crate::policy::{PolicyKind, spillover::ANNOTATION_SPILLOVER};

const ALL: &[&str] = &["10.0.1.1", "10.0.1.2", "10.0.2.1", "10.0.3.1"];
const ZONE_A: &[&str] = &["10.0.1.1", "10.0.1.2"];
const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

/// `world()`'s four endpoints, hinted for their own zone and node, all terminating; and one more
/// in zone a that is neither ready nor serving.
fn draining() -> Vec<Endpoint> {
    let mut all: Vec<Endpoint> = endpoints(true).into_iter().map(EndpointExt::terminating).collect();
    all.push(ep("10.0.1.9", "a1").unready().for_zones(&["a"]));
    all
}

fn spilling(svc: Service) -> Service {
    let mut svc = svc;
    svc.agent_annotations.insert(ANNOTATION_SPILLOVER.into(), "capacity".into());
    svc
}

#[test]
fn the_terminating_fallback_takes_no_preference() {
    let svc = || service("web");
    let rows: Vec<(&str, Service, &str, &[&str], PolicyKind)> = vec![
        ("topology-mode Auto", svc().mode("Auto"), "a1", ALL, PolicyKind::TopologyAwareHints),
        ("PreferClose", svc().distribution("PreferClose"), "a1", ALL, PolicyKind::PreferClose),
        ("PreferSameZone", svc().distribution("PreferSameZone"), "a1", ALL, PolicyKind::PreferSameZone),
        ("PreferSameNode", svc().distribution("PreferSameNode"), "a1", ALL, PolicyKind::PreferSameNode),
        ("spillover", spilling(svc()), "a1", ALL, PolicyKind::Spillover),
        ("spillover within a hard zone scope", spilling(svc().keys(&[ZONE])), "a2", ZONE_A, PolicyKind::Spillover),
        ("soft topology keys", svc().keys(&[HOST, ZONE, "*"]), "a1", ALL, PolicyKind::TopologyKeys),
        ("hard topology keys: their whole scope", svc().keys(&[HOST, ZONE]), "a1", ZONE_A, PolicyKind::TopologyKeys),
        ("hard hostname key, none on this node", svc().keys(&[HOST]), "a3", &[], PolicyKind::TopologyKeys),
        ("internalTrafficPolicy Local", svc().local(), "a1", &["10.0.1.1"], PolicyKind::Local),
        ("no mode", svc(), "c1", ALL, PolicyKind::Default),
    ];
    for (name, service, node, expect, policy) in rows {
        let selection = decide(&with(service, draining()), node);
        assert_eq!(chosen(&selection), addrs(expect), "{name}: {}", selection.reason);
        assert_eq!(selection.reject, expect.is_empty(), "{name}: {}", selection.reason);
        assert_eq!(selection.policy, policy, "{name}");
        assert!(selection.backends.iter().all(|b| b.weight == 1.0), "{name}: equal weights");
        assert!(selection.reason.contains("serving-and-terminating"), "{name}: {}", selection.reason);
    }
}

#[test]
fn one_ready_endpoint_anywhere_wins_over_terminating_ones_here() {
    let mut endpoints = draining();
    // 10.0.2.1, in zone b and hinted for b, is ready again.
    (endpoints[2].ready, endpoints[2].terminating) = (true, false);
    for service in [service("web").mode("Auto"), service("web").distribution("PreferClose")] {
        let selection = decide(&with(service, endpoints.clone()), "a1");
        assert_eq!(chosen(&selection), addrs(&["10.0.2.1"]), "{}", selection.reason);
    }
}
