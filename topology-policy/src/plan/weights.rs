//! The policy's decisions as the kernel's entries: one per ClusterIP and port, with weights scaled
//! to the integers the alias tables are built from.

use crate::{
    desired::{DesiredService, DesiredState, ServicePort, WeightedBackend},
    policy::PortSelection,
};

/// Scale of the largest weight of a set; relative precision of 10^-6 is far below what any
/// measurement of traffic shares can resolve.
const WEIGHT_SCALE: f64 = 1_000_000.0;

/// The desired state for `selections`.
pub fn desired_state(selections: &[PortSelection]) -> DesiredState {
    let mut desired = DesiredState::default();
    for selected in selections {
        let name = port_name(selected);
        let backends = integer_weights(selected);
        let options = selected.options;
        for vip in &selected.cluster_ips {
            let port = ServicePort { vip: *vip, port: selected.port.port, protocol: selected.port.protocol };
            desired.services.insert(port, DesiredService { name: name.clone(), backends: backends.clone(), options });
        }
    }
    desired
}

/// `namespace/name:port-name`, or `namespace/name:port` for an unnamed port.
pub fn port_name(selected: &PortSelection) -> String {
    if selected.port.name.is_empty() {
        format!("{}:{}", selected.service, selected.port.port)
    } else {
        format!("{}:{}", selected.service, selected.port.name)
    }
}

/// The backends the kernel gets for a selection: weights scaled so the largest is
/// [`WEIGHT_SCALE`], zero weights dropped.
pub fn integer_weights(selected: &PortSelection) -> Vec<WeightedBackend> {
    let max = selected.selection.backends.iter().map(|b| b.weight).fold(0.0_f64, f64::max);
    selected
        .selection
        .backends
        .iter()
        .filter(|b| b.weight > 0.0 && max > 0.0)
        .map(|b| WeightedBackend {
            addr: b.address,
            port: b.port,
            // Positive weights never round to zero: a chosen backend always gets some traffic.
            weight: ((b.weight / max) * WEIGHT_SCALE).round().max(1.0) as u32,
            locality: b.locality,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use topology_model::{Family, ObjectKey, PortSpec as SvcPort, Protocol};

    use super::*;
    use crate::{
        desired::Locality,
        policy::{Choice, PolicyKind, Selection},
    };

    fn selection(weights: &[f64]) -> PortSelection {
        PortSelection {
            service: ObjectKey::new("ns", "web"),
            port: SvcPort { name: "http".into(), port: 80, protocol: Protocol::Tcp },
            family: Family::V4,
            cluster_ips: vec!["10.96.0.10".parse().unwrap(), "10.96.0.11".parse().unwrap()],
            selection: Selection {
                policy: PolicyKind::Default,
                reason: String::new(),
                reject: weights.is_empty(),
                backends: weights
                    .iter()
                    .enumerate()
                    .map(|(i, &weight)| Choice {
                        address: format!("10.0.0.{i}").parse().unwrap(),
                        port: 8080,
                        node: None,
                        zone: None,
                        locality: Locality::Zone,
                        weight,
                    })
                    .collect(),
                warnings: vec![],
                spillover: None,
                feedback: None,
                baseline_in_zone: None,
            },
            options: crate::desired::PortOptions { affinity_timeout_s: Some(60), ..Default::default() },
        }
    }

    #[test]
    fn every_cluster_ip_gets_the_set_and_weights_scale_to_the_largest() {
        let desired = desired_state(&[selection(&[1.0, 0.5, 1e-9, 0.0])]);
        assert_eq!(desired.services.len(), 2);
        let service = desired.services.values().next().unwrap();
        assert_eq!(service.name, "ns/web:http");
        let weights: Vec<u32> = service.backends.iter().map(|b| b.weight).collect();
        assert_eq!(weights, vec![1_000_000, 500_000, 1], "zero weights are dropped, tiny ones kept");
        assert_eq!(service.options.affinity_timeout_s, Some(60), "the options go with every ClusterIP");
    }

    #[test]
    fn a_refusal_is_an_empty_set() {
        let desired = desired_state(&[selection(&[])]);
        assert!(desired.services.values().all(|s| s.backends.is_empty()));
    }
}
