//! Joining Services to EndpointSlices: families, port names, duplicates.

use topology_model::{Family, ObjectKey, PortSpec, Protocol, SlicePort};

use super::world::*;

#[test]
fn dual_stack_services_get_one_selection_per_family() {
    let mut state = world();
    let mut svc = service("web");
    svc.cluster_ips = vec!["10.96.0.10".parse().unwrap(), "fd00:96::10".parse().unwrap()];
    state.upsert_service(svc);
    state.upsert_slice(slice("web-v4", "web", 8080, vec![ep("10.0.1.1", "a1")]));
    state.upsert_slice(slice("web-v6", "web", 8080, vec![ep("fd00:1::1", "b1"), ep("fd00:1::2", "c1")]));
    let all = decide_all(&state, "a1");
    assert_eq!(all.len(), 2);
    let (v4, v6) = (&all[0], &all[1]);
    assert_eq!((v4.family, v6.family), (Family::V4, Family::V6));
    assert_eq!(v4.cluster_ips, vec!["10.96.0.10".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(v6.cluster_ips, vec!["fd00:96::10".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(chosen(&v4.selection), addrs(&["10.0.1.1"]));
    assert_eq!(chosen(&v6.selection), addrs(&["fd00:1::1", "fd00:1::2"]));
}

#[test]
fn a_single_stack_service_ignores_slices_of_the_other_family() {
    let mut state = with(service("web"), vec![ep("10.0.1.1", "a1")]);
    state.upsert_slice(slice("web-v6", "web", 8080, vec![ep("fd00:1::1", "a1")]));
    assert_eq!(chosen(&decide(&state, "a1")), addrs(&["10.0.1.1"]));
}

#[test]
fn named_target_ports_may_differ_between_slices() {
    let mut state = with(service("web"), vec![ep("10.0.1.1", "a1")]);
    state.upsert_slice(slice("web-2", "web", 9090, vec![ep("10.0.2.1", "b1")]));
    let selection = decide(&state, "a1");
    let ports: Vec<(String, u16)> = selection.backends.iter().map(|b| (b.address.to_string(), b.port)).collect();
    assert_eq!(ports, vec![("10.0.1.1".into(), 8080), ("10.0.2.1".into(), 9090)]);
}

#[test]
fn ports_match_by_name_and_protocol() {
    let mut state = world();
    let mut svc = service("dns");
    svc.ports = vec![
        PortSpec { name: "dns".into(), port: 53, protocol: Protocol::Udp },
        PortSpec { name: "dns-tcp".into(), port: 53, protocol: Protocol::Tcp },
        PortSpec { name: "metrics".into(), port: 9153, protocol: Protocol::Tcp },
    ];
    state.upsert_service(svc);
    let mut s = slice("dns-1", "dns", 53, vec![ep("10.0.1.1", "a1")]);
    s.ports = vec![
        SlicePort { name: "dns".into(), port: 5353, protocol: Protocol::Udp },
        SlicePort { name: "dns-tcp".into(), port: 5353, protocol: Protocol::Tcp },
        // Same name, wrong protocol: not the Service's "metrics".
        SlicePort { name: "metrics".into(), port: 9153, protocol: Protocol::Udp },
    ];
    state.upsert_slice(s);
    let all = decide_all(&state, "a1");
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].selection.backends[0].port, 5353);
    assert_eq!(all[1].selection.backends[0].port, 5353);
    let metrics = &all[2].selection;
    assert!(metrics.reject, "{metrics:?}");
    assert_eq!(metrics.warnings.len(), 1);
    assert!(
        metrics.warnings[0].contains("no EndpointSlice port named \"metrics\" with protocol TCP"),
        "{:?}",
        metrics.warnings
    );
}

#[test]
fn an_endpoint_in_several_slices_counts_once_with_its_best_conditions() {
    let mut state = with(service("web"), vec![ep("10.0.1.1", "a1").unready(), ep("10.0.2.1", "b1")]);
    state.upsert_slice(slice("web-0", "web", 8080, vec![ep("10.0.2.1", "b1").terminating()]));
    state.upsert_slice(slice("web-2", "web", 8080, vec![ep("10.0.1.1", "a1"), ep("10.0.2.1", "b1")]));
    let selection = decide(&state, "a1");
    assert_eq!(chosen(&selection), addrs(&["10.0.1.1", "10.0.2.1"]), "ready in one slice is ready");
    assert_eq!(selection.backends.len(), 2, "no duplicates");
}

#[test]
fn endpoints_without_node_name_are_routable_but_never_local() {
    let state = with(service("web"), vec![ep("10.0.9.1", ""), ep("10.0.9.2", "").zone("a")]);
    let selection = decide(&state, "a1");
    assert_eq!(chosen(&selection), addrs(&["10.0.9.1", "10.0.9.2"]));
    let local = decide(&with(service("web").local(), vec![ep("10.0.9.1", "")]), "a1");
    assert!(local.reject);
}

#[test]
fn slices_of_other_services_and_namespaces_are_not_joined() {
    let mut state = with(service("web"), vec![ep("10.0.1.1", "a1")]);
    state.upsert_slice(slice("api-1", "api", 8080, vec![ep("10.0.7.1", "a1")]));
    let mut foreign = slice("web-x", "web", 8080, vec![ep("10.0.8.1", "a1")]);
    foreign.key = ObjectKey::new("other", "web-x");
    foreign.service = Some(ObjectKey::new("other", "web"));
    state.upsert_slice(foreign);
    assert_eq!(chosen(&decide(&state, "a1")), addrs(&["10.0.1.1"]));
}

#[test]
fn services_without_cluster_ip_are_not_routed() {
    let mut svc = service("headless");
    svc.cluster_ips.clear();
    let state = with(svc, vec![ep("10.0.1.1", "a1")]);
    assert!(decide_all(&state, "a1").is_empty());
}

#[test]
fn an_unknown_node_is_an_error() {
    let state = world();
    let error = crate::policy::compute(&state, "nowhere").unwrap_err();
    assert!(error.to_string().contains("\"nowhere\" is not in the cluster"), "{error}");
}

#[test]
fn decisions_share_the_states_node_and_zone_names() {
    // At 150,000 endpoints a name per decided backend was 5 MB of copies.
    let state = with(service("web"), vec![ep("10.0.1.1", "b1"), ep("10.0.1.2", "ghost").zone("z")]);
    let selection = decide(&state, "a1");
    let shared = |text| std::sync::Arc::clone(state.shared(text).expect("shared"));
    let known = selection.backends.iter().find(|b| b.address.to_string() == "10.0.1.1").expect("b1's endpoint");
    assert!(std::sync::Arc::ptr_eq(known.node.as_ref().expect("node"), &shared("b1")));
    assert!(std::sync::Arc::ptr_eq(known.zone.as_ref().expect("the Node's zone"), &shared("b")));
    let ghost = selection.backends.iter().find(|b| b.address.to_string() == "10.0.1.2").expect("ghost's endpoint");
    assert!(std::sync::Arc::ptr_eq(ghost.zone.as_ref().expect("the endpoint's zone"), &shared("z")));
}
