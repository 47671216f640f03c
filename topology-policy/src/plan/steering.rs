//! The DNS steering rule, a rule of the node plan: on this node, the cluster DNS Service's port 53
//! (UDP and TCP) goes to the node-local responder instead of where the policy would send it. The
//! agent's DNS module keeps the responder and the heartbeat that lets the kernel apply the rule.

use std::net::SocketAddr;

use topology_model::{Family, ObjectKey, Protocol};

use crate::{
    desired::Locality,
    policy::{Choice, PolicyKind, PortSelection},
};

/// The DNS port.
const DNS_PORT: u16 = 53;

/// The per-node rule: this Service's port 53 goes to this responder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steering {
    /// The cluster DNS Service.
    pub service: ObjectKey,
    /// The responder's address (`--dns-listen`).
    pub responder: SocketAddr,
}

impl Steering {
    /// Replaces this node's choice for the steered Service's port 53 (UDP and TCP, in the
    /// responder's family) with the responder; every other selection is left as the policy made it.
    pub fn apply(&self, node: &str, selections: &mut [PortSelection]) {
        let family = Family::of(&self.responder.ip());
        for steered in selections.iter_mut().filter(|s| {
            s.service == self.service
                && s.port.port == DNS_PORT
                && matches!(s.port.protocol, Protocol::Udp | Protocol::Tcp)
                && s.family == family
        }) {
            let selection = &mut steered.selection;
            selection.reason = format!(
                "steered to this node's DNS responder at {} while it answers; else to the ClusterIP untouched \
                 (kube-proxy, CoreDNS), where this node's policy would send: {}",
                self.responder, selection.reason
            );
            selection.policy = PolicyKind::LocalDns;
            selection.reject = false;
            selection.spillover = None;
            selection.backends = vec![Choice {
                address: self.responder.ip(),
                port: self.responder.port(),
                node: Some(node.into()),
                zone: None,
                locality: Locality::Node,
                weight: 1.0,
            }];
            steered.options.local_dns = true;
            // A client keeps no backend: there is one, and it may be passed by at any moment.
            steered.options.affinity_timeout_s = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use topology_model::PortSpec;

    use super::*;
    use crate::{
        desired::PortOptions,
        policy::{PortSelection, Selection},
    };

    /// The cluster DNS, as the agent steers it by default.
    const DEFAULT_SERVICE: (&str, &str) = ("kube-system", "kube-dns");

    fn selection(name: &str, port: u16, protocol: Protocol, family: Family) -> PortSelection {
        PortSelection {
            service: ObjectKey::new("kube-system", name),
            port: PortSpec { name: String::new(), port, protocol },
            family,
            cluster_ips: vec![],
            selection: Selection {
                policy: PolicyKind::Default,
                reason: "all 2 ready endpoints".into(),
                reject: false,
                backends: vec![],
                warnings: vec![],
                spillover: None,
                feedback: None,
                baseline_in_zone: None,
            },
            options: PortOptions { affinity_timeout_s: Some(10), ..PortOptions::default() },
        }
    }

    #[test]
    fn only_port_53_of_the_dns_service_in_the_responders_family_is_steered() {
        let steering = Steering {
            service: ObjectKey::new(DEFAULT_SERVICE.0, DEFAULT_SERVICE.1),
            responder: "10.0.0.5:53".parse().unwrap(),
        };
        let mut selections = vec![
            selection("kube-dns", 53, Protocol::Udp, Family::V4),
            selection("kube-dns", 53, Protocol::Tcp, Family::V4),
            selection("kube-dns", 9153, Protocol::Tcp, Family::V4),
            selection("kube-dns", 53, Protocol::Udp, Family::V6),
            selection("kube-dns", 53, Protocol::Sctp, Family::V4),
            selection("other-dns", 53, Protocol::Udp, Family::V4),
        ];
        steering.apply("node-a", &mut selections);
        let steered: Vec<bool> = selections.iter().map(|s| s.options.local_dns).collect();
        assert_eq!(steered, [true, true, false, false, false, false]);
        let udp = &selections[0];
        assert_eq!(udp.selection.policy, PolicyKind::LocalDns);
        assert_eq!(udp.selection.backends.len(), 1);
        assert_eq!(
            (udp.selection.backends[0].address, udp.selection.backends[0].port),
            ("10.0.0.5".parse().unwrap(), 53)
        );
        assert_eq!(udp.selection.backends[0].locality, Locality::Node);
        assert_eq!(udp.options.affinity_timeout_s, None);
        assert!(udp.selection.reason.starts_with("steered to this node's DNS responder at 10.0.0.5:53"));
        assert!(udp.selection.reason.ends_with("all 2 ready endpoints"), "{}", udp.selection.reason);
        assert_eq!(selections[2].selection.policy, PolicyKind::Default);
    }
}
