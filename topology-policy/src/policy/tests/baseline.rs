//! The baseline savings are counted against: what the default policy (every usable endpoint
//! equally) would keep in this node's zone, whatever mode decided.

use topology_model::{Endpoint, Service};

use super::world::*;

/// Case, Service, endpoints, node decided for, expected baseline.
type Row = (&'static str, Service, Vec<Endpoint>, &'static str, Option<f64>);

#[test]
fn the_baseline_is_the_default_policys_in_zone_share_in_every_mode() {
    let svc = || service("web");
    let draining = || endpoints(true).into_iter().map(EndpointExt::terminating).collect::<Vec<Endpoint>>();
    let one_unready = || {
        let mut all = endpoints(true);
        all[1] = all[1].clone().unready();
        all
    };
    let rows: Vec<Row> = vec![
        ("default, zone a: 2 of 4", svc(), endpoints(false), "a1", Some(0.5)),
        (
            "PreferClose changes the choice, not the baseline",
            svc().distribution("PreferClose"),
            endpoints(true),
            "a3",
            Some(0.5),
        ),
        ("zone b: 1 of 4", svc().mode("Auto"), endpoints(true), "b1", Some(0.25)),
        ("zone d: none of 4", svc(), endpoints(false), "d1", Some(0.0)),
        ("no zone label: only this node's own", svc(), endpoints(false), "nz", Some(0.0)),
        ("unready endpoints are not usable: 1 of 3", svc().local(), one_unready(), "a1", Some(1.0 / 3.0)),
        (
            "the terminating fallback is what default uses",
            svc().keys(&["kubernetes.io/hostname"]),
            draining(),
            "a1",
            Some(0.5),
        ),
        ("no usable endpoint: no baseline", svc(), vec![], "a1", None),
    ];
    for (name, service, endpoints, node, expect) in rows {
        let selection = decide(&with(service, endpoints), node);
        assert_eq!(selection.baseline_in_zone, expect, "{name}");
    }
}
