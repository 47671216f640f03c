//! What an agent that watches only its own Node decides is what one that watches every Node
//! decides, for every Service that does not read other Nodes' labels or their status: the other
//! Nodes' zones come with the EndpointSlices (the EndpointSlice controller writes each endpoint's
//! zone) and their regions with the census, as do the agents' shares of the Events. The Node watch's scope (`source/nodes.rs`) rests on it.

use topology_model::{
    ClusterState, Endpoint, Service,
    census::{Census, Counted},
};

use super::world::*;
use crate::policy::Selection;

/// The endpoints of `world()`'s four, and one on a node of zone d (region r2), each with the zone
/// the EndpointSlice controller writes from its Node.
fn endpoints_as_written(state: &ClusterState) -> Vec<Endpoint> {
    let mut all = endpoints(true);
    all.push(ep("10.0.4.1", "d1").for_zones(&["d"]));
    all.into_iter()
        .map(|endpoint| {
            let node = state.node(endpoint.node_name.as_deref().expect("node")).expect("a world node");
            match node.zone() {
                Some(zone) => endpoint.zone(zone),
                None => endpoint,
            }
        })
        .collect()
}

/// `full` as node `this`'s agent sees it when it watches its own Node alone.
fn seen_from(full: &ClusterState, this: &str) -> ClusterState {
    let mut seen = full.clone();
    let others: Vec<String> = full.nodes().map(|n| n.name.clone()).filter(|name| name != this).collect();
    for name in others {
        seen.remove_node(&name);
    }
    let counted = full.nodes().map(|n| Counted {
        name: n.name.clone(),
        zone: n.zone().map(str::to_owned),
        region: n.region().map(str::to_owned),
    });
    assert!(seen.set_census(Some(Census::new(counted))), "the census brings the regions");
    seen
}

fn summary(selection: &Selection) -> (String, bool, Vec<String>) {
    let backends =
        selection.backends.iter().map(|b| format!("{} {:.4} {:?}", b.address, b.weight, b.locality)).collect();
    (selection.reason.clone(), selection.reject, backends)
}

#[test]
fn an_agent_watching_its_own_node_decides_as_one_watching_all() {
    let services: Vec<Service> = vec![
        service("web"),
        service("web").mode("Auto"),
        service("web").distribution("PreferClose"),
        service("web").distribution("PreferSameZone"),
        service("web").distribution("PreferSameNode"),
        service("web").local(),
        service("web").keys(&["kubernetes.io/hostname", "topology.kubernetes.io/zone", "*"]),
        service("web").keys(&["topology.kubernetes.io/zone"]),
        service("web").keys(&["topology.kubernetes.io/region", "*"]),
        service("web").spec_keys(&["topology.kubernetes.io/region"]),
    ];
    for svc in services {
        assert!(!svc.reads_node_labels() && !svc.depends_on_demand(), "{svc:?}");
        let endpoints = endpoints_as_written(&world());
        let full = with(svc.clone(), endpoints);
        for this in ["a1", "a3", "b1", "c1", "d1", "nz", "empty-zone"] {
            let watched_all = summary(&decide(&full, this));
            let seen = seen_from(&full, this);
            assert_eq!(summary(&decide(&seen, this)), watched_all, "{svc:?} from {this}");
            assert_eq!(seen.rank(this), full.rank(this), "the same share of the Events");
        }
    }
}

#[test]
fn without_the_census_regions_would_be_lost() {
    // The test above fails without the census: region keys and localities need it.
    let full = with(service("web").keys(&["topology.kubernetes.io/region"]), endpoints_as_written(&world()));
    let mut seen = seen_from(&full, "a1");
    assert!(seen.set_census(None), "the regions go with the census");
    assert_ne!(summary(&decide(&seen, "a1")), summary(&decide(&full, "a1")));
}

#[test]
fn keys_on_other_labels_read_every_node() {
    assert!(service("web").keys(&["example.com/rack", "*"]).reads_node_labels());
    assert!(service("web").spec_keys(&["kubernetes.io/os"]).reads_node_labels());
    assert!(!service("web").keys(&[" topology.kubernetes.io/zone ", "*"]).reads_node_labels());
}
